#!/usr/bin/env bash
# GPU calls of the fifty-seventh session, run from the repository root on the lent GPU with
# .whl/ carried; results into $OUT. oneshot-kernel.diff gives the one-launch call (issue 17) a
# kernel of its own (persistent.oneshot_kernel: the grid kernel's item and grid, no slice loop);
# this tree has it applied (uncommitted while unchecked, landed once checked):
#   oneshot (~500 s, any GPU): the persistent GPU tests on this tree, then bench_persistent's
#      no-yield rows (FP16, INT4, INT2, queued) at B=1 32k, B=1 128k and 64 x 32/8 4k, the tree
#      before the kernel ("before", a copy with before-oneshot-kernel.diff applied: 889ad4a's
#      persistent.py; at 08:01 it was this tree with oneshot-kernel.diff reversed) against this
#      one ("kernel"), two rounds alternating (one round where ROUNDS=1).
#   sanitize (~300 s, any GPU): memcheck, racecheck, initcheck and synccheck at once over
#      benchmarks.sanitize --dtypes fp16,int4 --no-tiered (the new kernel's INT2 part was clean
#      at 08:13: san-int2), limit 540 s.
#   ptests (~220 s, any GPU): the persistent GPU tests only (-n 12), as at 08:10.
#   san-int2 (~145 s, any GPU): the four sanitizers over --dtypes int2 --no-tiered, as at 08:13.
#   tests (~460 s, any GPU): every gpu-marked test (scripts/gpu-check -n 12), limit 560 s.
#   ncu (~120 s, any GPU): the fifty-second session's b1-source on this tree: Nsight Compute's
#      source page of the grid decode and the one-launch call (profile_persistent: one
#      DecodePlan.run, then one enqueue(0, 1), which at B=1 32k is oneshot_kernel), INT4 and
#      INT2 at B=1 32k, summarised by benchmarks.ncu_source: where INT2's 0.58 us goes.
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
    patched_copy /tmp/before "$PWD/$here/before-oneshot-kernel.diff" || exit 1
    shapes="1,32,8,32768;1,32,8,131072;64,32,8,4096"
    for round in $(seq 1 "${ROUNDS:-2}"); do
        persistent_rows "before-$round" /tmp/before "$shapes"
        persistent_rows "kernel-$round" "$PWD" "$shapes"
    done
    ;;
sanitize)
    OUT=$R/san HEXCORE_GPU_CHECK=sanitize HEXCORE_SANITIZERS="memcheck racecheck initcheck synccheck" \
        HEXCORE_SANITIZE_ARGS="--dtypes fp16,int4 --no-tiered" timeout 540 scripts/gpu-check > "$R/san-stage.log" 2>&1
    echo "sanitize rc $?"; grep -hE "ERROR SUMMARY|RACECHECK SUMMARY|exit|complete" "$R"/san/*.log "$R/san-stage.log" | head -12
    ;;
ptests)
    PYTHONPATH="$site:$PWD" timeout 330 python3 -m pytest -m gpu -q -p no:cacheprovider -n 12 -rf --durations=15 \
        tests/cuda/attention/test_persistent.py > "$R/tests2.log" 2>&1
    echo "rc $?"; grep -vi "warn" "$R/tests2.log" | tail -25
    ;;
san-int2)
    OUT=$R/san HEXCORE_GPU_CHECK=sanitize HEXCORE_SANITIZERS="memcheck racecheck initcheck synccheck" \
        HEXCORE_SANITIZE_ARGS="--dtypes int2 --no-tiered" timeout 150 scripts/gpu-check > "$R/san-stage.log" 2>&1
    echo "rc $?"; grep -hE "ERROR SUMMARY|RACECHECK SUMMARY|exit|complete" "$R"/san/*.log "$R/san-stage.log" | head -12
    ;;
tests)
    OUT=$R/tests HEXCORE_GPU_CHECK=tests timeout 560 scripts/gpu-check -n 12 > "$R/tests-stage.log" 2>&1
    echo "tests rc $?"; tail -n 2 "$R/tests-stage.log"; grep -E "^(FAILED|ERROR)" "$R/tests-stage.log" | head -20
    ;;
ncu)
    bash benchmarks/experiments/2026-12-06-s52/calls.sh b1-source
    ;;
table)
    if grep -q H200 "$R/gpu.txt"; then bash benchmarks/experiments/2026-12-06-s44/calls.sh rows-table
    else echo "not an H200: nothing run"; fi
    ;;
*) echo "usage: $0 oneshot|sanitize|ptests|san-int2|tests|ncu|table" >&2; exit 2 ;;
esac
