#!/usr/bin/env bash
# GPU calls of the sixty-first session, run from the repository root on the lent GPU with .whl/
# carried; results into $OUT (the order: NEXT.md of the sixtieth session, step 0):
#   check (~350 s, any GPU): the four sanitizers over benchmarks.sanitize --dtypes fp16,int4
#      --no-tiered (296a161's close_slice edit) beside the persistent GPU tests (-n 4, which
#      include test_a_wide_one_launch_call_gpu), limit 560 s. Correctness only: no timing here.
#   rows-all: ../2026-12-07-s58/calls.sh rows-all alone on the machine (the no-yield rows at
#      every decode shape with the wide one-launch default).
#   san-int2: ../2026-12-07-s58/calls.sh san-int2.
# Built after those runs, for the next GPU (not run yet):
#   timeline (~150 s, an H200 preferred; issue 12): benchmarks.item_timeline at B=1 1k, 32k and
#      128k, every dtype: each decode split into the time outside its CTAs, the ramp, the
#      items and each row's tail (the merge), from the one-launch call's per-item clock
#      readings; limit 300 s.
#   san-new (~150 s, any GPU): the four sanitizers over benchmarks.sanitize --new (prefill,
#      checksums, the persistent decode with the new wide call past the resident CTAs), all
#      three dtypes; limit 400 s.
set -u
source benchmarks/experiments/device-site.sh  # site, R
case "${1:-}" in
check)
    (OUT=$R/san HEXCORE_GPU_CHECK=sanitize HEXCORE_SANITIZERS="memcheck racecheck initcheck synccheck" \
        HEXCORE_SANITIZE_ARGS="--dtypes fp16,int4 --no-tiered" timeout 520 scripts/gpu-check \
        > "$R/san-stage.log" 2>&1; echo "sanitize rc $?" >> "$R/san-stage.log") &
    PYTHONPATH="$site:$PWD" timeout 400 python3 -m pytest -m gpu -q -p no:cacheprovider -n 4 -rf \
        --durations=10 tests/cuda/attention/test_persistent.py > "$R/ptests.log" 2>&1
    echo "ptests rc $?"; grep -vi "warn" "$R/ptests.log" | tail -16
    wait
    tail -1 "$R/san-stage.log"; grep -hE "ERROR SUMMARY|RACECHECK SUMMARY|exit|complete" "$R"/san/*.log "$R/san-stage.log" | head -12
    ;;
timeline)
    PYTHONPATH="$site:$PWD" timeout 300 python3 -m benchmarks.item_timeline \
        --shapes "1,32,8,1024;1,32,8,32768;1,32,8,131072" --dtypes fp16,int4,int2 --calls 20 > "$R/timeline.log" 2>&1
    echo "timeline rc $?"; cat "$R/timeline.log" | cut -c1-400
    ;;
san-new)
    OUT=$R/san HEXCORE_GPU_CHECK=sanitize HEXCORE_SANITIZERS="memcheck racecheck initcheck synccheck" \
        HEXCORE_SANITIZE_ARGS="--new --no-tiered" timeout 400 scripts/gpu-check > "$R/san-stage.log" 2>&1
    echo "san-new rc $?"; grep -hE "ERROR SUMMARY|RACECHECK SUMMARY|exit|complete" "$R"/san/*.log "$R/san-stage.log" | head -12
    ;;
*) echo "usage: $0 check|timeline|san-new" >&2; exit 2 ;;
esac
