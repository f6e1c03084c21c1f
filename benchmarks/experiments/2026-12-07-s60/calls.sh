#!/usr/bin/env bash
# GPU calls of the sixtieth session, run from the repository root on the lent GPU with .whl/
# carried; results into $OUT:
#   single (limit 600 s, any GPU; issue 17; it ran with 80 s steps, which timed out after part
#      of their rows: 150 s now): whether the slice protocol with one item a
#      CTA, no item loop and the grid kernel's own item code (single.diff: persistent_item
#      "single") keeps the grid decode's time where the slice grid holds every item
#      (ctas_per_sm=16, eager_first=0: each CTA's budget check a compare-and-swap round trip
#      before its item), against the default plan and the wide one-launch kernel (no check),
#      at 128 x 32/8 2k and 64 x 32/32 4k, INT4/INT2, two rounds. It ran (15:54-15:59 UTC) on the
#      working tree with single.diff applied; on a clean tree, use boundaries (its diff holds
#      single.diff's kernel).
#   boundaries (~480 s, limit 560 s, any GPU; issue 17): the single kernel's two round trips
#      around its item timed apart (boundaries.diff, on a copy): "single" (the CAS awaited
#      before the item, the acquire-release count of CTAs out after it), "single-eager" (the
#      CAS not awaited: a FIRST slice's begin as an eager slice's, no budget check),
#      "single-relaxed" (the count of CTAs out relaxed) and both, against the default plan
#      and the wide one-launch kernel, at 128 x 32/8 2k (the shape that misses), two rounds.
set -u
source benchmarks/experiments/device-site.sh  # site, R, patched_copy
here=benchmarks/experiments/2026-12-07-s60
rows() { no_yield_rows "$1"; }  # (device-site.sh)
bench() {  # bench NAME LIMIT ARGS...: bench_persistent at the two shapes into $R/NAME.log
    local name=$1 limit=$2
    shift 2
    PYTHONPATH="$site:$PWD" timeout "$limit" python3 -m benchmarks.bench_persistent \
        --shapes "${SHAPES:-128,32,8,2048;64,32,32,4096}" --dtypes int4,int2 --skip-latency --queued "$@" > "$R/$name.log" 2>&1
    echo "== $name rc $?"
}
case "${1:-}" in
single)
    for round in 1 2; do
        bench base-$round 150 --skip-yields --items inline \
            --variants "default;ctas_per_sm=16:eager_first=1:split_blocks=128"
        rows "$R/base-$round.log"
        bench single-$round 150 --skip-yields --items single --variants "ctas_per_sm=16:eager_first=0:split_blocks=128"
        rows "$R/single-$round.log"
    done
    ;;
boundaries)
    patched_copy /tmp/bounds "$PWD/$here/boundaries.diff" || exit 1
    cd /tmp/bounds
    export SHAPES="128,32,8,2048"
    for round in 1 2; do
        bench base-$round 150 --skip-yields --items inline \
            --variants "default;ctas_per_sm=16:eager_first=1:split_blocks=128"
        rows "$R/base-$round.log"
        bench bounds-$round 200 --skip-yields --items single,single-eager,single-relaxed,single-eager-relaxed \
            --variants "ctas_per_sm=16:eager_first=0:split_blocks=128"
        rows "$R/bounds-$round.log"
    done
    ;;
*) echo "usage: $0 single|boundaries" >&2; exit 2 ;;
esac
