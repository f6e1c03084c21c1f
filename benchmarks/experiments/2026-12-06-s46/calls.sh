#!/usr/bin/env bash
# GPU calls of the forty-sixth session, run from the repository root on the lent GPU with
# .whl/ carried; results into $OUT. No kernel machine code changed since the forty-second
# session (ed2710e). What is owed is ../2026-12-06-s45/NEXT.md; this script picks by the GPU
# that came, since no H200 came in the forty-first to forty-fifth sessions:
#   first: on an H200, the s44 folder's rows-table (issue 14's two checked layers a step,
#      then issue 12's table); on anything else, initcheck and synccheck over FP16's part
#      of benchmarks.sanitize (NEXT.md item 2, part 1).
#   san PART (~550 s at most): initcheck and synccheck side by side over one part of
#      benchmarks.sanitize: fp16 ("--dtypes fp16 --no-tiered"), int4 ("--dtypes int4
#      --no-tiered") or int2 ("--dtypes int2", with the format by age).
#   probe (~250 s): issue 19, int2-aged's one launch at B=1 32/8 32k with its young slots and
#      without, and the INT2 pool's own kernel (one_probe.py): ncu's counters, then times.
set -u
source benchmarks/experiments/device-site.sh  # site, R
san() {  # san PART: initcheck and synccheck over one part of benchmarks.sanitize
    local args="--dtypes $1 --no-tiered"
    [ "$1" = int2 ] && args="--dtypes int2"
    local t0=$SECONDS
    OUT=/tmp/check/san-$1 HEXCORE_GPU_CHECK=sanitize HEXCORE_SANITIZERS="initcheck synccheck" \
        HEXCORE_SANITIZE_ARGS="$args" timeout 550 scripts/gpu-check > "$R/sanitize-$1-stage.log" 2>&1
    echo "sanitize $1 rc $? in $((SECONDS - t0)) s"; grep -E "exit|rc " "$R/sanitize-$1-stage.log" | tail -4
    for f in /tmp/check/san-$1/sanitize-*.log; do echo "== $f"; grep -v -i "performance" "$f" | tail -n 30; done \
        > "$R/sanitize-$1-tails.log"
    grep -E "ERROR SUMMARY|==" "$R/sanitize-$1-tails.log" | tail -6
}
probe() {  # issue 19: one_probe.py's ncu counters (code warm: no cache flush) and its times
    local here=benchmarks/experiments/2026-12-06-s46
    local metrics=smsp__average_warps_issue_stalled_imc_miss_per_issue_active.ratio,smsp__average_warps_issue_stalled_branch_resolving_per_issue_active.ratio,gpu__time_duration.sum,sm__cycles_active.avg,sm__cycles_active.max,smsp__inst_executed.sum,dram__bytes_read.sum,launch__registers_per_thread,launch__grid_size,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio
    PYTHONPATH="$site:$PWD" timeout 240 ncu --clock-control none --cache-control none -k regex:kernel --metrics $metrics \
        --csv --page raw python3 $here/one_probe.py --ncu > "$R/ncu-probe.csv" 2> "$R/ncu-probe.err"
    echo "== ncu probe rc $? (the last 21 rows: as built, INT2 slots only, INT2 pool kernel, two and three INT2 items, one item capped and uncapped; three each)"
    python3 benchmarks/experiments/ncu_rows.py "$R/ncu-probe.csv" | tail -n 21
    PYTHONPATH="$site:$PWD" timeout 150 python3 $here/one_probe.py > "$R/probe-times.log" 2>&1
    echo "== times rc $?"; cat "$R/probe-times.log" | grep -v -i warn | tail -n 10
}
case "${1:-}" in
probe)
    probe
    ;;
first)
    if grep -q H200 "$R/gpu.txt"; then bash benchmarks/experiments/2026-12-06-s44/calls.sh rows-table
    else san fp16; fi
    ;;
san)
    san "$2"
    ;;
*)
    echo "usage: $0 first|san fp16|int4|int2|probe" >&2; exit 2
    ;;
esac
