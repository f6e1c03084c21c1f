#!/usr/bin/env bash
# GPU calls of the fifty-fourth session, run from the repository root on the lent GPU with
# .whl/ carried; results into $OUT. Modes 1, 2 and 3 choose their work by the GPU they land
# on, so back-to-back calls need no decision between them (a machine idle for 30 s is given
# back):
#   1: on an H200, s50 "h200" (~400 s: INT2's source page and stalls, issue 12's table with its
#      peers, two checked layers a step); on an H100, s51 "tests" (~470 s: every gpu-marked test
#      on this tree, the one-launch call included once oneshot.diff is landed).
#   2: on an H200, s51 "tests"; on an H100, "oneshot".
#   3: on an H200, "oneshot"; on an H100, s51 "sanitize" (~450 s: the four sanitizers over all
#      of benchmarks.sanitize, whose persistent part runs one-launch calls once oneshot.diff
#      is landed).
#   oneshot (~300 s, ~500-550 s with the tests; any GPU; issue 17): bench_persistent's
#      no-yield rows (FP16, INT4, INT2, queued) at B=1 32k and B=1 128k, where the slice grid
#      may hold every item (the rows' one_launch says), and at 64 x 32/8 4k, where it does not
#      (the same path as before: a control), with the one-launch call against without it,
#      two rounds alternating. Where this tree has it (landed), the copy without it is made
#      by before-oneshot.diff (the reverse of oneshot.diff's hunks in
#      hexcore/cuda/attention/persistent.py and benchmarks/bench_persistent.py); where not,
#      the copy with it by oneshot.diff, and the copy's persistent GPU tests run first.
set -u
here=benchmarks/experiments/2026-12-06-s54
s51=benchmarks/experiments/2026-12-06-s51/calls.sh
h200() { nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; }
case "${1:-}" in
1) if h200; then bash benchmarks/experiments/2026-12-06-s50/calls.sh h200; else bash $s51 tests; fi ;;
2) if h200; then bash $s51 tests; else bash $0 oneshot; fi ;;
3) if h200; then bash $0 oneshot; else bash $s51 sanitize; fi ;;
oneshot)
    source benchmarks/experiments/device-site.sh  # site, R, patched_copy, persistent_rows
    shapes="1,32,8,32768;1,32,8,131072;64,32,8,4096"
    if grep -q ONESHOT hexcore/cuda/attention/persistent.py; then  # landed: the copy is before it
        patched_copy /tmp/before "$PWD/$here/before-oneshot.diff" || exit 1
        before=/tmp/before after=$PWD
    else  # not landed: the copy has it; its persistent GPU tests first
        patched_copy /tmp/oneshot "$PWD/$here/oneshot.diff" || exit 1
        (cd /tmp/oneshot && PYTHONPATH="$site:/tmp/oneshot" timeout 250 python3 -m pytest -m gpu -q \
            -p no:cacheprovider -n 8 tests/cuda/attention/test_persistent.py > "$R/oneshot-tests.log" 2>&1)
        echo "oneshot tests rc $?"; tail -n 2 "$R/oneshot-tests.log"; grep -E "^(FAILED|ERROR)" "$R/oneshot-tests.log" | head
        before=$PWD after=/tmp/oneshot
    fi
    for round in 1 2; do
        persistent_rows "before-$round" "$before" "$shapes"
        persistent_rows "oneshot-$round" "$after" "$shapes"
    done
    ;;
*) echo "usage: $0 1|2|3|oneshot" >&2; exit 2 ;;
esac
