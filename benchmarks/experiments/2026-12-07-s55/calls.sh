#!/usr/bin/env bash
# GPU calls of the fifty-fifth session, run from the repository root on the lent GPU with
# .whl/ carried; results into $OUT. The one-launch call (issue 17, ../2026-12-06-s54/oneshot.diff)
# is timed first and tested with the whole GPU check second, so the two calls follow each other
# with no decision between them (a machine idle for 30 s is given back):
#   bench (~300 s, any GPU): bench_persistent's no-yield rows (FP16, INT4, INT2, queued) at B=1
#      32k, B=1 128k and 64 x 32/8 4k (a control: a grid smaller than its items, the path as
#      before), without the one-launch call and with it, two rounds alternating (s54 `oneshot`
#      without its persistent tests, which `tests` runs with every other GPU test).
#   tests (~470 s, any GPU): scripts/gpu-check's tests (every gpu-marked test, -n 12) on a copy of
#      this tree with oneshot.diff applied (this tree itself once the diff is landed).
#   h200 (~400 s, an H200 only): s50 `h200` (issue 12's table with its peers, INT2's source page
#      and stalls, two checked layers a step); on an H100, s51 `sanitize` (four sanitizers).
set -u
source benchmarks/experiments/device-site.sh  # site, R, patched_copy, persistent_rows
s54=benchmarks/experiments/2026-12-06-s54
oneshot_tree() {  # the tree with the one-launch call: this one once landed, else a patched copy
    if grep -q ONESHOT hexcore/cuda/attention/persistent.py; then echo "$PWD"
    else patched_copy /tmp/oneshot "$PWD/$s54/oneshot.diff" && echo /tmp/oneshot; fi
}
case "${1:-}" in
bench)
    after=$(oneshot_tree) || exit 1
    before=$PWD
    if [ "$after" = "$PWD" ]; then patched_copy /tmp/before "$PWD/$s54/before-oneshot.diff" || exit 1; before=/tmp/before; fi
    shapes="1,32,8,32768;1,32,8,131072;64,32,8,4096"
    for round in 1 2; do
        persistent_rows "before-$round" "$before" "$shapes"
        persistent_rows "oneshot-$round" "$after" "$shapes"
    done
    ;;
tests)
    tree=$(oneshot_tree) || exit 1
    (cd "$tree" && OUT=$R/tests HEXCORE_GPU_CHECK=tests timeout 560 scripts/gpu-check -n 12 > "$R/tests-stage.log" 2>&1)
    echo "tests rc $? on $tree"; tail -n 2 "$R/tests-stage.log"; grep -E "^(FAILED|ERROR)" "$R/tests-stage.log" | head -20
    ;;
h200)
    if grep -q H200 "$R/gpu.txt"; then bash benchmarks/experiments/2026-12-06-s50/calls.sh h200
    else bash benchmarks/experiments/2026-12-06-s51/calls.sh sanitize; fi
    ;;
*) echo "usage: $0 bench|tests|h200" >&2; exit 2 ;;
esac
