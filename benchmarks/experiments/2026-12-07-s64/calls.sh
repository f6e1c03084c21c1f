#!/usr/bin/env bash
# GPU calls of the sixty-fourth session (issue 12), run from the repository root on the lent GPU
# with .whl/ carried; results into $OUT. TREE=merge3 runs a call on a copy of this tree with
# ../2026-12-07-s63/merge3.diff applied (made once per machine); otherwise on this tree.
#   san-all (~300 s?, any GPU): memcheck, racecheck, initcheck and synccheck over every part of
#      benchmarks.sanitize at once: four scripts/gpu-check sanitize stages side by side
#      (--dtypes fp16,int4 --no-tiered; --dtypes int2 --no-tiered; --tiered; --new --no-tiered),
#      sixteen tool processes; each part's limit 520 s, the call's 560 s. Alone, the parts took
#      172 s, about 145 s, 147 s and (never finished) before.
#   stage (~420 s, any GPU): the whole GPU test stage (scripts/gpu-check tests, -n 12), limit 560 s.
#   table (~390 s, an H200 only): issue 12's table (../2026-12-06-s44/calls.sh rows-table).
#   ncu-splits (~150 s, any GPU): Nsight Compute's speed of light, occupancy, launch, scheduler,
#      warp-state and memory sections of the INT2 B=1 32/8 32k grid decode at the policy's 32
#      splits, at 49 ("split 21 blocks") and at 64 capped at 128 registers: why more splits lose.
#   src-splits (~300 s?, any GPU; built after the ncu-splits run, not run yet): the same three
#      launches under ncu's source page (SourceCounters, WarpStateStats), each summarised by
#      benchmarks.ncu_source (warp instructions and stall samples before the hot loop, in it and
#      after it): where the 0.8-1.4 M warp instructions that 49 and 64 splits add are spent.
#   probe-tail (~350 s?, any GPU; not run yet): benchmarks.item_timeline at B=1 32k and 128k,
#      INT4 and INT2, on this tree and on two timing-only copies, alternating, two rounds:
#      probe-nomerge.diff (the last CTA counts but skips the merge) and probe-nocount.diff (no
#      count and no merge: every CTA ends after its partial). Their outputs are wrong; only
#      their clocks are read. main's row tail against nomerge's is the merge's; the count runs
#      in every CTA before its end clock, so it cancels out of the tails: its cost is nomerge's
#      item_p50, span and paged against nocount's. Check that splits and items match across
#      the trees (a probe's registers could change the split policy's choice); limit 500 s.
#   merge-reserve (~200 s?, any GPU; not run yet): merge-reserve.diff (kernel.MERGE_RESERVE
#      released: BESIDE_RING 2,532 -> 420 bytes, which gives the verify kernel's weight table
#      to INT4 D=128 block 32 value groups of 16, 48,132 bytes of static shared memory under
#      ptxas 13.5 on the CPU): on a copy, the head-digest and graph-verify GPU tests beside
#      the four sanitizers over that layout's verify test; limit 300 s.
set -u
source benchmarks/experiments/device-site.sh  # site, R, patched_copy
if [ "${TREE:-main}" = merge3 ]; then
    patched_copy /tmp/merge3 "$PWD/benchmarks/experiments/2026-12-07-s63/merge3.diff" || exit 1
    cd /tmp/merge3
fi
echo "tree ${TREE:-main}: $(git log --oneline -1) $(git status --short | head -3 | tr '\n' ' ')" | tee -a "$R/head.txt"
san_part() {  # san_part NAME ARGS: the four tools over benchmarks.sanitize ARGS into $R/NAME
    OUT=$R/$1 HEXCORE_GPU_CHECK=sanitize HEXCORE_SANITIZERS="memcheck racecheck initcheck synccheck" \
        HEXCORE_SANITIZE_ARGS="$2" timeout "${SAN_LIMIT:-520}" scripts/gpu-check > "$R/$1-stage.log" 2>&1
    echo "== $1 ($2) rc $? after $SECONDS s" >> "$R/$1-stage.log"
}
case "${1:-}" in
san-all)
    san_part fp16-int4 "--dtypes fp16,int4 --no-tiered" &
    san_part int2 "--dtypes int2 --no-tiered" &
    san_part tiered "--tiered" &
    san_part new "--new --no-tiered" &
    wait
    for part in fp16-int4 int2 tiered new; do
        tail -n 1 "$R/$part-stage.log"
        grep -hE "ERROR SUMMARY|RACECHECK SUMMARY|\(exit" "$R/$part"/*.log "$R/$part-stage.log" | sort -u | head -8
    done
    ;;
stage)
    OUT=$R/tests HEXCORE_GPU_CHECK=tests timeout 560 scripts/gpu-check -n 12 > "$R/tests-stage.log" 2>&1
    echo "tests rc $? after $SECONDS s"; tail -n 2 "$R/tests-stage.log"
    grep -E "^(FAILED|ERROR)" "$R/tests-stage.log" | head -20
    ;;
table)
    if grep -q H200 "$R/gpu.txt"; then bash benchmarks/experiments/2026-12-06-s44/calls.sh rows-table
    else echo "not an H200: nothing run"; fi
    ;;
ncu-splits)
    for variant in "" "split 21 blocks" "split 16 blocks cap 128"; do
        name=int2-${variant// /-}; name=${name%-}
        PYTHONPATH="$site:$PWD" timeout 80 ncu --clock-control none --kernel-name-base demangled \
            -k regex:decode_kernel --launch-skip 2 --launch-count 1 --section SpeedOfLight --section Occupancy \
            --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
            --section SchedulerStats -f -o /tmp/$name python3 -m benchmarks.profile_decode int2 5 \
            ${variant:+--variant "$variant"} > "$R/$name.log" 2>&1
        echo "== $name rc $?"; grep profiled "$R/$name.log"
        ncu -i /tmp/$name.ncu-rep --page details --csv > "$R/$name.csv" 2>&1
        grep -E '"(Duration|Achieved Occupancy|Achieved Active Warps Per SM|Registers Per Thread|Grid Size|Block Size|DRAM Throughput|Memory Throughput|L2 Hit Rate|Issued Warp Per Scheduler|No Eligible|Warp Cycles Per Issued Instruction|Waves Per SM|Theoretical Occupancy|Local Memory Spilling Requests)"' \
            "$R/$name.csv" | awk -F'","' '{print $(NF-2)" ("$(NF-1)"): "$NF}' | tr -d '"' | head -20
    done
    ;;
src-splits)
    for variant in "" "split 21 blocks" "split 16 blocks cap 128"; do
        name=src-int2-${variant// /-}; name=${name%-}
        PYTHONPATH="$site:$PWD" timeout 150 ncu --clock-control none --kernel-name-base demangled \
            -k regex:decode_kernel --launch-skip 2 --launch-count 1 --section SourceCounters \
            --section WarpStateStats --import-source no -f -o /tmp/$name python3 -m benchmarks.profile_decode int2 5 \
            ${variant:+--variant "$variant"} > "$R/$name.log" 2>&1
        echo "== $name rc $?"
        timeout 30 ncu -i /tmp/$name.ncu-rep --page source --csv --print-source sass 2>&1 | gzip > "$R/$name.csv.gz"
        timeout 30 python3 -m benchmarks.ncu_source "$R/$name.csv.gz"
    done
    ;;
probe-tail)
    [ "${TREE:-main}" = main ] || { echo "probe-tail: runs on this tree only (TREE unset)" >&2; exit 2; }
    here=$PWD/benchmarks/experiments/2026-12-07-s64
    patched_copy /tmp/nomerge "$here/probe-nomerge.diff" || exit 1
    patched_copy /tmp/nocount "$here/probe-nocount.diff" || exit 1
    for round in 1 2; do  # the trees alternating, twice
        for tree in "$PWD" /tmp/nomerge /tmp/nocount; do
            name=$(basename "$tree"); [ "$tree" = "$PWD" ] && name=main
            (cd "$tree" && PYTHONPATH="$site:$tree" timeout 80 python3 -m benchmarks.item_timeline \
                --shapes "1,32,8,32768;1,32,8,131072" --dtypes int4,int2 --calls 20 > "$R/tail-$name-$round.log" 2>&1)
            echo "== $name round $round rc $?"; grep '^{' "$R/tail-$name-$round.log" | python3 -c '
import json, sys
keys = ("splits", "items", "paged", "span", "item_p50", "item_max", "tail_p50", "critical_tail")
for line in sys.stdin:
    r = json.loads(line)
    print(r["dtype"], r["ctx"], *(f"{k} {r[k]}" for k in keys))'
        done
    done
    ;;
merge-reserve)
    patched_copy /tmp/reserve "$PWD/benchmarks/experiments/2026-12-07-s64/merge-reserve.diff" || exit 1
    cd /tmp/reserve
    for tool in racecheck memcheck synccheck initcheck; do  # the one layout whose kernel changes
        (PYTHONPATH="$site:$PWD" timeout 240 compute-sanitizer --tool $tool --error-exitcode 1 python3 -m pytest \
            -m gpu -q -p no:cacheprovider tests/cuda/test_head_digest.py -k "int4-32-128-16" \
            > "$R/reserve-$tool.log" 2>&1; echo "$tool rc $?" >> "$R/reserve-$tool.log") &
    done
    PYTHONPATH="$site:$PWD" timeout 240 python3 -m pytest -m gpu -q -p no:cacheprovider -n 4 \
        tests/cuda/test_head_digest.py tests/cuda/steps/test_graph_verify.py > "$R/reserve-tests.log" 2>&1
    echo "tests rc $?"; tail -n 2 "$R/reserve-tests.log"; grep -E "^(FAILED|ERROR)" "$R/reserve-tests.log" | head
    wait
    for f in "$R"/reserve-*check.log; do echo "== $f"; tail -n 3 "$f"; done
    ;;
*) echo "usage: [TREE=merge3] $0 san-all|stage|table|ncu-splits|src-splits|probe-tail|merge-reserve" >&2; exit 2 ;;
esac
