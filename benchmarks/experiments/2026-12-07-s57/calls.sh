#!/usr/bin/env bash
# GPU calls of the fifty-seventh session, run from the repository root on the lent GPU with
# .whl/ carried; results into $OUT. oneshot-kernel.diff gives the one-launch call (issue 17) a
# kernel of its own (persistent.oneshot_kernel: the grid kernel's item and grid, no slice loop);
# this tree has it applied (uncommitted while unchecked, landed once checked):
#   oneshot (~500 s, any GPU): the persistent GPU tests on this tree, then bench_persistent's
#      no-yield rows (FP16, INT4, INT2, queued) at B=1 32k, B=1 128k and 64 x 32/8 4k, the tree
#      before the diff ("before", a copy with it reversed) against this one ("kernel"), two
#      rounds alternating (one round where ROUNDS=1).
#   table (~390 s, an H200 only): the forty-fourth session's rows-table (two checked layers a
#      step, then issue 12's decode table with SDPA and paged FlexAttention beside it).
set -u
source benchmarks/experiments/device-site.sh  # site, R, persistent_rows
here=benchmarks/experiments/2026-12-07-s57
case "${1:-}" in
oneshot)
    (PYTHONPATH="$site:$PWD" timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 \
        tests/cuda/attention/test_persistent.py > "$R/oneshot-tests.log" 2>&1)
    echo "tests rc $?"; tail -n 2 "$R/oneshot-tests.log"; grep -E "^(FAILED|ERROR)" "$R/oneshot-tests.log" | head
    [ -d /tmp/before ] || { cp -r . /tmp/before && (cd /tmp/before && git apply -R "$PWD/$here/oneshot-kernel.diff"); } \
        || { echo "oneshot-kernel.diff does not reverse"; rm -rf /tmp/before; exit 1; }
    shapes="1,32,8,32768;1,32,8,131072;64,32,8,4096"
    for round in $(seq 1 "${ROUNDS:-2}"); do
        persistent_rows "before-$round" /tmp/before "$shapes"
        persistent_rows "kernel-$round" "$PWD" "$shapes"
    done
    ;;
table)
    if grep -q H200 "$R/gpu.txt"; then bash benchmarks/experiments/2026-12-06-s44/calls.sh rows-table
    else echo "not an H200: nothing run"; fi
    ;;
*) echo "usage: $0 oneshot|table" >&2; exit 2 ;;
esac
