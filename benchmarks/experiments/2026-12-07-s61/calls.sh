#!/usr/bin/env bash
# GPU calls of the sixty-first session, run from the repository root on the lent GPU with .whl/
# carried; results into $OUT (the order: NEXT.md of the sixtieth session, step 0):
#   check (~350 s, any GPU): the four sanitizers over benchmarks.sanitize --dtypes fp16,int4
#      --no-tiered (296a161's close_slice edit) beside the persistent GPU tests (-n 4, which
#      include test_a_wide_one_launch_call_gpu), limit 560 s. Correctness only: no timing here.
#   rows-all: ../2026-12-07-s58/calls.sh rows-all alone on the machine (the no-yield rows at
#      every decode shape with the wide one-launch default).
#   san-int2: ../2026-12-07-s58/calls.sh san-int2.
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
*) echo "usage: $0 check" >&2; exit 2 ;;
esac
