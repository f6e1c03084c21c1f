#!/usr/bin/env bash
# GPU calls owed after the fifty-eighth session, run from the repository root on the lent GPU
# with .whl/ carried; results into $OUT (see NEXT.md for the order):
#   san-int2 (~200 s, any GPU): memcheck, racecheck, initcheck and synccheck at once over
#      benchmarks.sanitize --dtypes int2 --no-tiered, limit 320 s (this session's run under a
#      150 s limit was cut: the DecodeOptions(eager_first=False) case made the part longer).
#   rows-all (~300 s, any GPU; issue 17): bench_persistent's no-yield rows at every shape of
#      the decode benchmark (issue 12's seven: --shapes all), FP16, INT4, INT2, queued, limit
#      450 s. The one-launch rounds covered three of them; 64 x 32/32 4k, 128 x 32/8 2k, 16 x
#      32/8 16k and 32 x 64/8 4k have not been timed against the grid decode on this code.
#   h200 (~420 s, an H200 only; elsewhere it prints the GPU and stops): issue 12's table with
#      SDPA and paged FlexAttention and issue 14's two checked layers a step (the forty-fourth
#      session's rows-table), then the no-yield persistent rows of issue 17 at B=1 32k, B=1
#      128k and 64 x 32/8 4k, one round.
set -u
source benchmarks/experiments/device-site.sh  # site, R, persistent_rows
case "${1:-}" in
san-int2)
    OUT=$R/san HEXCORE_GPU_CHECK=sanitize HEXCORE_SANITIZERS="memcheck racecheck initcheck synccheck" \
        HEXCORE_SANITIZE_ARGS="--dtypes int2 --no-tiered" timeout 320 scripts/gpu-check > "$R/san-stage.log" 2>&1
    echo "rc $?"; grep -hE "ERROR SUMMARY|RACECHECK SUMMARY|exit|complete" "$R"/san/*.log "$R/san-stage.log" | head -12
    ;;
rows-all)
    OUT=$R PYTHONPATH="$site:$PWD" timeout 450 python3 -m benchmarks.bench_persistent --shapes all \
        --dtypes fp16,int4,int2 --skip-latency --skip-yields --queued > "$R/rows-all.log" 2>&1
    echo "== rows-all rc $?"; grep -E "no_yield" "$R/rows-all.log" | cut -c1-240
    ;;
h200)
    if ! grep -q H200 "$R/gpu.txt"; then echo "not an H200: nothing run"; exit 0; fi
    bash benchmarks/experiments/2026-12-06-s44/calls.sh rows-table
    persistent_rows "h200" "$PWD" "1,32,8,32768;1,32,8,131072;64,32,8,4096"
    ;;
*) echo "usage: $0 rows-all|san-int2|h200" >&2; exit 2 ;;
esac
