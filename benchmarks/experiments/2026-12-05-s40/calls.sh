#!/usr/bin/env bash
# GPU calls of the fortieth session, run from the repository root on the lent GPU with .whl/
# carried; results into $OUT.
#   rest (~300 s): the GPU tests the thirty-ninth/fortieth sessions' whole check left unrun
#      (cut by its limit after 261 of 272: rest.txt here), then where int2-aged's B=1 32k time goes:
#      ncu's per-instruction stall samples (SourceCounters, lineinfo) of int2-aged and INT2 at
#      B=1 32/8 32k, summed by stall reason and by 1 KB of code (source_rows.py). The
#      counters' run (ncu-aged.sh) showed equal instructions and DRAM bytes, 1.5x the SM
#      cycles, and "no instruction" stalls 3.99 a issue against 0.22: instruction fetch.
set -u
source benchmarks/experiments/device-site.sh  # site, R
export PYTHONPATH="$site:$PWD"
here=benchmarks/experiments/2026-12-05-s40
metrics=gpu__time_duration.sum,sm__cycles_active.avg,sm__cycles_active.max,smsp__inst_executed.sum,dram__bytes_read.sum,launch__registers_per_thread,launch__grid_size,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio
counters() {  # counters NAME SHAPE CACHE "DTYPE[|VARIANT]": ncu's counters of every decode launch of
    # profile_decode's three runs (read the last run's) into $R/ncu-NAME.csv, and their rows
    local name=$1 shape=$2 cache=$3 v=$4 dtype variant=()
    dtype=${v%%|*}; [ "$v" != "$dtype" ] && variant=(--variant "${v#*|}")
    timeout 60 ncu --clock-control none --cache-control "$cache" \
        -k regex:"^(kernel|one_launch_kernel|pool_kernel|merge_kernel|fused_merge_kernel)" --metrics $metrics \
        --csv --page raw python3 -m benchmarks.profile_decode "$dtype" "$shape" "${variant[@]}" \
        > "$R/ncu-$name.csv" 2> "$R/ncu-$name.err"
    echo "== $name rc $?"; python3 benchmarks/experiments/ncu_rows.py "$R/ncu-$name.csv"
}
case "${1:-}" in
rest)
    mapfile -t rest < $here/rest.txt
    timeout 200 python3 -m pytest -m gpu -q -rs -p no:cacheprovider -n 6 "${rest[@]}" > "$R/rest-tests.log" 2>&1
    echo "rest tests rc $?"; tail -2 "$R/rest-tests.log"; grep -E "^(FAILED|ERROR)" "$R/rest-tests.log" | head
    for dtype in int2-aged int2; do
        timeout 90 ncu --clock-control none -k regex:"^(kernel|one_launch_kernel|pool_kernel)" --launch-skip 2 \
            --launch-count 1 --section WarpStateStats --section SourceCounters --import-source yes \
            -f -o /tmp/src-$dtype python3 -m benchmarks.profile_decode --lineinfo $dtype 5 > "$R/src-$dtype.log" 2>&1
        echo "$dtype rc $?"
        ncu -i /tmp/src-$dtype.ncu-rep --page source --csv --print-source sass > /tmp/src-$dtype.csv 2>> "$R/src-$dtype.log"
        gzip -c /tmp/src-$dtype.csv > "$R/src-$dtype.csv.gz"
        python3 $here/source_rows.py /tmp/src-$dtype.csv | tee "$R/src-$dtype.txt"
    done
    ;;
fetch)  # (~450 s, its own call; prepared, not run) issue 19: is int2-aged's instruction fetch the one launch's
    # code (three items inlined, 165 KB) or ncu's cache flush? Counters and warp states of
    # INT2 and int2-aged at B=1 32/8 32k as "one" (the default there), "last pool merges" and
    # "merge launch" (a kernel per pool, each about a plain kernel's size), with ncu's default
    # cache flush and without (--cache-control none: code warm in L2 as in a timed loop);
    # then bench_decode's times of the same variants, one after the other. Every launch of
    # the three runs is profiled: read the last run's (one kernel, or a kernel per pool)
    for cache in all none; do
        for v in "int2" "int2-aged" "int2-aged|last pool merges" "int2-aged|merge launch"; do
            counters "$cache-${v//[ |]/_}" 5 $cache "$v"
        done
    done
    OUT=$R timeout 90 python3 -m benchmarks.bench_decode --shapes "1,32,8,32768;1,32,8,131072" --dtypes int2,int2-aged \
        --variants --variant-names "default,last pool merges,merge launch" --flex none --no-peers --queued --name fetch \
        > "$R/fetch.log" 2>&1
    echo "== fetch (rc $?)"; grep -E "^hexcore" "$R/fetch.log" | cut -d'|' -f1-7
    ;;
fetch64)  # (~250 s; prepared, not run) issue 19 at B=64 x 32/8 4k (shape 1), where int2-aged
    # is about 35% over INT2: the same counters for INT2, int2-aged (its default there) and
    # "packed", ncu's cache flush on; the last run's launches are the ones to read
    for v in "int2" "int4" "int2-aged" "int2-aged|packed" "int4-aged"; do
        counters "b64-${v//[ |]/_}" 1 all "$v"
    done
    ;;
check-tests)  # (~450 s on an H100 at -n 12, its own call) the GPU tests alone; the outcomes file
    # names every test that finished, so a cut run's rest can be run by id (as `rest` did)
    OUT=/tmp/check/tests HEXCORE_GPU_CHECK=tests timeout 570 scripts/gpu-check -n 12 > "$R/tests-stage.log" 2>&1
    echo "tests rc $?"; tail -2 "$R/tests-stage.log"; grep -E "^FAILED" "$R/tests-stage.log" | head
    cp /tmp/check/tests/gpu-tests-outcomes.txt "$R/" 2>/dev/null
    ;;
check-sanitizers)  # (~200 s) the four compute-sanitizer tools over benchmarks.sanitize, side by side
    OUT=/tmp/check/san HEXCORE_GPU_CHECK=sanitize timeout 500 scripts/gpu-check > "$R/sanitize-stage.log" 2>&1
    echo "sanitizers rc $?"; grep -E "exit" "$R/sanitize-stage.log"
    for f in /tmp/check/san/sanitize-*.log; do echo "== $f"; tail -n 40 "$f"; done > "$R/sanitize-tails.log"
    ;;
*)
    echo "usage: $0 rest|fetch|fetch64|check-tests|check-sanitizers" >&2; exit 2
    ;;
esac
