#!/usr/bin/env bash
# GPU calls owed after the fiftieth session (NEXT.md), run from the repository root on the lent
# GPU with .whl/ carried; results into $OUT. Modes:
#   cap (~400 s, any GPU): slice-cap.diff (the persistent slice kernel, where its grid launch is
#      uncapped, capped at the registers that keep the grid kernel's CTAs per SM, issue 17):
#      the persistent GPU tests on a copy with it, then bench_persistent's no-yield rows, main
#      against the copy, FP16, INT4 and INT2 at B=1 32k, B=1 128k and B=2 128k, two rounds
#      alternating.
#   h200 (~400 s, an H200 only): the forty-eighth session's h200 mode (INT2's source page and
#      stalls, two checked layers a step and issue 12's table with its peers); on an H100
#      nothing. (Its next-h200 also timed the value-field change before and after; that diff
#      no longer reverses on main.)
set -u
source benchmarks/experiments/device-site.sh  # site, R, persistent_ab
here=benchmarks/experiments/2026-12-06-s50
shapes="1,32,8,32768;1,32,8,131072;2,32,8,131072"
case "${1:-}" in
cap)
    persistent_ab cap "$PWD/$here/slice-cap.diff" "$shapes"
    ;;
h200)
    bash benchmarks/experiments/2026-12-06-s48/calls.sh h200
    ;;
*)
    echo "usage: $0 cap|h200" >&2; exit 2
    ;;
esac
