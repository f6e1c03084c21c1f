#!/usr/bin/env bash
# GPU calls owed after the fifty-ninth session, run from the repository root on the lent GPU
# with .whl/ carried; results into $OUT (see NEXT.md for the order):
#   wide (~200 s, limit 300 s, any GPU; issue 17): where the slice protocol's extra time at the shapes
#      whose items outnumber the resident CTAs goes. bench_persistent's no-yield rows at
#      128 x 32/8 2k and 64 x 32/32 4k, INT4 and INT2, three option sets of the persistent
#      plan: its default (a slice grid of the resident CTAs, dynamic takes after each CTA's
#      static item), and with ctas_per_sm=16 (past the occupancy: the slice grid holds every
#      item, so the hardware schedules the CTAs, no dynamic take) once as the one-launch
#      kernel (eager_first=1: the grid kernel's code and records, no budget check) and once
#      as the slice kernel (eager_first=0: each CTA checks the budget before its static
#      item, a compare-and-swap round trip). split_blocks=128 keeps one split a sequence,
#      the grid decode's count at both shapes.
#   source (~250 s, limit 330 s, any GPU; issue 17): Nsight Compute's source page of the grid decode and
#      the no-yield slice at 128 x 32/8 2k, INT4 and INT2 (benchmarks.profile_persistent),
#      summarised by benchmarks.ncu_source (before the hot loop, in it, after it).
#   rows3 (~300 s, limit 420 s, any GPU; issue 17): the same two shapes' no-yield rows (INT4,
#      INT2) on this tree, on open-take.diff (a normal slice's dynamic take issues the
#      cursor's atomic before the clock read and the start/base reads, all in flight
#      together, where main waits for each in turn; an item so taken past the budget is owed) and on take-ahead.diff (the
#      same, with the atomic issued at the start of the item before, awaited after it), two
#      rounds alternating.
#   ptests2 (~300 s, limit 450 s, any GPU): the persistent GPU tests on both copies at once.
#   san-ahead (~250 s, limit 360 s, any GPU): the four sanitizers over benchmarks.sanitize
#      --dtypes int4,int2 --no-tiered on the take-ahead copy.
set -u
source benchmarks/experiments/device-site.sh  # site, R, patched_copy
here=benchmarks/experiments/2026-12-07-s59
rows() { no_yield_rows "$1"; }  # (device-site.sh)
copies() { patched_copy /tmp/open "$PWD/$here/open-take.diff" && patched_copy /tmp/ahead "$PWD/$here/take-ahead.diff"; }
case "${1:-}" in
wide)
    PYTHONPATH="$site:$PWD" timeout 240 python3 -m benchmarks.bench_persistent \
        --shapes "128,32,8,2048;64,32,32,4096" --dtypes int4,int2 --skip-latency --skip-yields --queued \
        --variants "default;ctas_per_sm=16:eager_first=1:split_blocks=128;ctas_per_sm=16:eager_first=0:split_blocks=128" \
        > "$R/wide.log" 2>&1
    echo "== wide rc $?"
    rows "$R/wide.log"
    ;;
source)
    for dt in int4 int2; do
        PYTHONPATH="$site:$PWD" timeout 120 ncu --profile-from-start off --clock-control none \
            --section SourceCounters --section WarpStateStats --section Occupancy --import-source no \
            -f -o /tmp/w-$dt python3 -m benchmarks.profile_persistent $dt 128,32,8,2048 > "$R/w-$dt.log" 2>&1
        echo "== source $dt rc $?"
        ncu -i /tmp/w-$dt.ncu-rep --page source --csv --print-source sass 2>&1 | gzip > "$R/w-$dt.csv.gz"
        ncu -i /tmp/w-$dt.ncu-rep --page details --csv > "$R/w-$dt-details.csv" 2>&1
        python3 -m benchmarks.ncu_source "$R/w-$dt.csv.gz"
    done
    ;;
rows3)
    copies || exit 1
    for round in 1 2; do
        for t in main open ahead; do
            tree=$PWD; [ "$t" = main ] || tree=/tmp/$t
            (cd "$tree" && PYTHONPATH="$site:$tree" timeout 100 python3 -m benchmarks.bench_persistent \
                --shapes "128,32,8,2048;64,32,32,4096" --dtypes int4,int2 --skip-latency --skip-yields --queued \
                > "$R/$t-$round.log" 2>&1)
            echo "== $t-$round rc $?"
            rows "$R/$t-$round.log"
        done
    done
    ;;
ptests2)
    copies || exit 1
    for t in open ahead; do
        (cd "/tmp/$t" && PYTHONPATH="$site:/tmp/$t" timeout 400 python3 -m pytest -m gpu -q -p no:cacheprovider -n 6 \
            tests/cuda/attention/test_persistent.py > "$R/$t-tests.log" 2>&1; echo "$t tests rc $?" >> "$R/$t-tests.log") &
    done
    wait
    for t in open ahead; do tail -n 2 "$R/$t-tests.log"; grep -E "^(FAILED|ERROR)" "$R/$t-tests.log" | head; done
    ;;
san-ahead)
    copies || exit 1
    (cd /tmp/ahead && OUT=$R/san HEXCORE_GPU_CHECK=sanitize HEXCORE_SANITIZERS="memcheck racecheck initcheck synccheck" \
        HEXCORE_SANITIZE_ARGS="--dtypes int4,int2 --no-tiered" PYTHONPATH="$site:/tmp/ahead" timeout 330 scripts/gpu-check \
        > "$R/san-stage.log" 2>&1)
    echo "rc $?"; grep -hE "ERROR SUMMARY|RACECHECK SUMMARY|exit|complete" "$R"/san/*.log "$R/san-stage.log" | head -16
    ;;
*) echo "usage: $0 wide|source|rows3|ptests2|san-ahead" >&2; exit 2 ;;
esac
