#!/usr/bin/env bash
# GPU calls owed after the forty-ninth session (NEXT.md), run from the repository root on the lent
# GPU with .whl/ carried; results into $OUT. Modes:
#   eager (~450 s, any GPU): eager-first.diff (a persistent call's first slice runs its static
#      items without waiting for the begin's compare-and-swap, issue 17): the persistent and
#      option GPU tests on a copy with it, then bench_persistent's no-yield rows, main against
#      the copy, FP16, INT4 and INT2 at B=1 32k and 128k and 64 x 32/8 4k, two rounds alternating.
#   h200 (~500 s, an H200 only): the forty-eighth session's next-h200 (the value-field change
#      before and after, INT2's source page and stalls, two checked layers a step and issue
#      12's table); on an H100 nothing.
set -u
source benchmarks/experiments/device-site.sh  # site, R, persistent_ab
here=benchmarks/experiments/2026-12-06-s49
case "${1:-}" in
eager)
    persistent_ab eager "$PWD/$here/eager-first.diff" "1,32,8,32768;1,32,8,131072;64,32,8,4096"
    ;;
h200)
    bash benchmarks/experiments/2026-12-06-s48/calls.sh next-h200
    ;;
*)
    echo "usage: $0 eager|h200" >&2; exit 2
    ;;
esac
