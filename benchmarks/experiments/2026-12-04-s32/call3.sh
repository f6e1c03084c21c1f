#!/usr/bin/env bash
# Thirty-second session, call 3 (~250 s): issue 17, why the persistent slice at B=1 32/8 32k
# INT4/INT2 takes 2.2-2.6 us more than the grid decode (the plan's cluster merge is not it:
# call 2). ncu of one plan run and one no-yield slice per dtype, FP16 (gap 0.1 us) as control.
set -u
source benchmarks/experiments/device-site.sh  # site, R
export PYTHONPATH="$site:$PWD"
metrics=gpu__time_duration.sum,sm__cycles_active.avg,sm__cycles_active.max,smsp__inst_executed.sum,dram__bytes_read.sum,launch__registers_per_thread,launch__grid_size,launch__occupancy_limit_registers,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__cycles_active.avg
for dtype in int4 int2 fp16; do
    timeout 150 ncu --profile-from-start off --clock-control none --metrics $metrics \
        --section WarpStateStats --section SchedulerStats --csv --page raw \
        python3 -m benchmarks.profile_persistent $dtype 1,32,8,32768 > "$R/ncu-$dtype.csv" 2> "$R/ncu-$dtype.err"
    echo "$dtype rc $?"
    python3 benchmarks/experiments/ncu_rows.py "$R/ncu-$dtype.csv"
done
# Issue 12: FP16 uncapped at one wave (fp16-one-wave.diff) against main, alternating, at every
# shape with at most 396 items (where the rule would apply) plus B=1 MHA
shapes="1,32,8,32768;1,32,8,131072;2,32,8,16384;4,32,8,8192;8,32,8,8192;16,32,8,16384;32,32,8,4096;1,32,32,32768"
here=$PWD
patched_copy /tmp/onewave "$here/benchmarks/experiments/2026-12-04-s32/fp16-one-wave.diff"
for round in 1 2; do
    for side in main onewave; do
        dir=$here; [ $side = onewave ] && dir=/tmp/onewave
        (cd $dir && OUT=$R PYTHONPATH="$site:$dir" timeout 100 python3 -m benchmarks.bench_decode --shapes "$shapes" \
            --dtypes fp16 --flex none --no-peers --queued --name "$side$round" > "$R/$side$round.log" 2>&1)
        echo "$side$round rc $?"; grep timed "$R/$side$round.log"
    done
done
