#!/usr/bin/env bash
# GPU calls of the fifty-second session, run from the repository root on the lent GPU with .whl/
# carried; results into $OUT. What was owed is ../2026-12-06-s51/NEXT.md. Three calls back to
# back, each choosing by the GPU it lands on, so no decision waits between calls (a machine idle
# for 30 s is given back):
#   1 (~330 s): s51 "tests": every gpu-marked test on this tree.
#   2: on an H200, s50 "h200" (~400 s: INT2's source page and stalls, issue 12's table with its
#      peers, two checked layers a step); on an H100, s51 "sanitize" (~390 s).
#   3: on an H200, s51 "sanitize"; on an H100, s51 "cap2" (~530 s, issue 17).
#   b1-source (~120 s, any GPU; issue 17): where the persistent slice's extra time at B=1 32k
#      goes, INT4 and INT2: Nsight Compute's source page (per SASS instruction: executions
#      and warp-state samples) of the grid decode and the no-yield slice, one launch each
#      (benchmarks.profile_persistent), summarised by benchmarks.ncu_source (before the hot
#      loop, in it, after it).
#   table (~500 s, any GPU; issue 14): weight-table.diff (the tensor digest's weights of
#      one-chunk blocks from a table in shared memory): on a copy with it, the head digest's,
#      the mma's and fault tolerance's GPU tests, racecheck and synccheck of
#      benchmarks.sanitize for INT4 and INT2 (the table's fill, barrier and reads), then
#      bench_fault's two and one checked layers a step, main against the copy, two rounds.
#   smem (~30 s, any GPU): smem_probe.py, what the GPU compiled for INT2 at D=128, block 32,
#      value groups of 64, 32 and 16 (NEXT.md item 5).
set -u
s51=benchmarks/experiments/2026-12-06-s51/calls.sh
h200() { nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; }
case "${1:-}" in
1) bash $s51 tests ;;
2) if h200; then bash benchmarks/experiments/2026-12-06-s50/calls.sh h200; else bash $s51 sanitize; fi ;;
3) if h200; then bash $s51 sanitize; else bash $s51 cap2; fi ;;
b1-source)
    source benchmarks/experiments/device-site.sh  # site, R
    for dt in int4 int2; do
        PYTHONPATH="$site:$PWD" timeout 150 ncu --profile-from-start off --clock-control none \
            --section SourceCounters --section WarpStateStats --import-source no -f -o /tmp/b1-$dt \
            python3 -m benchmarks.profile_persistent $dt 1,32,8,32768 > "$R/b1-$dt.log" 2>&1
        echo "== b1 source $dt rc $?"
        ncu -i /tmp/b1-$dt.ncu-rep --page source --csv --print-source sass 2>&1 | gzip > "$R/b1-$dt.csv.gz"
        python3 -m benchmarks.ncu_source "$R/b1-$dt.csv.gz"
    done
    ;;
table)
    source benchmarks/experiments/device-site.sh  # site, R, patched_copy
    here=benchmarks/experiments/2026-12-06-s52
    patched_copy /tmp/table "$PWD/$here/weight-table.diff" || exit 1
    for tool in racecheck synccheck; do  # beside the tests
        (cd /tmp/table && PYTHONPATH="$site:/tmp/table" timeout 280 compute-sanitizer --tool $tool --error-exitcode 1 \
            python3 -m benchmarks.sanitize --dtypes int4,int2 --no-tiered > "$R/table-$tool.log" 2>&1
            echo "$tool rc $?" >> "$R/table-$tool.log") &
    done
    (cd /tmp/table && PYTHONPATH="$site:/tmp/table" timeout 220 python3 -m pytest -m gpu -q -rs -p no:cacheprovider \
        -n 4 tests/cuda/test_head_digest.py tests/cuda/test_mma.py tests/test_fault.py \
        "tests/cuda/attention/test_decode.py::test_dependent_launch_reads_what_the_kernel_before_it_wrote_gpu" \
        > "$R/table-tests.log" 2>&1)
    echo "table tests rc $?"; tail -n 2 "$R/table-tests.log"; grep -E "^(FAILED|ERROR)" "$R/table-tests.log" | head
    wait
    tail -n 2 "$R/table-racecheck.log" "$R/table-synccheck.log"
    for round in 1 2; do
        for tree in "$PWD" /tmp/table; do
            name=rows-$(basename "$tree")-$round
            (cd "$tree" && OUT=$R PYTHONPATH="$site:$tree" timeout 100 python3 -m benchmarks.bench_fault --graph \
                --every 16 --dtypes int4,int2 --name "$name" > "$R/$name.log" 2>&1)
            echo "== $name rc $?"; grep -E "^graph step \+ [12] whole" "$R/$name.log" | cut -d'|' -f1-4
        done
    done
    ;;
smem)
    source benchmarks/experiments/device-site.sh  # site, R
    PYTHONPATH="$site:$PWD" timeout 120 python3 benchmarks/experiments/2026-12-06-s52/smem_probe.py 2>&1 \
        | grep -v Warning | tee "$R/smem.log"
    ;;
*) echo "usage: $0 1|2|3|b1-source|table|smem" >&2; exit 2 ;;
esac
