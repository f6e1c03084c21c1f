#!/usr/bin/env bash
# Thirty-fifth session, for the next (~200 s): issue 19, why int2-aged at B=1 32/8 32k (one
# launch, 20.1 us) stays 26% above plain INT2 (15.9 us) though its floor is 1% higher
# (5.23 / 5.16 us), and int4-aged (18.3) 3% above INT4 (17.7). ncu of the third run of each
# (profile_decode: the store is built first, so only the decode kernels are matched), plain
# kinds as controls: time, SM cycles (average against the busiest SM: the critical path),
# instructions, DRAM bytes, registers, grid, occupancy, warp stalls.
set -u
source benchmarks/experiments/device-site.sh  # site, R
export PYTHONPATH="$site:$PWD"
metrics=gpu__time_duration.sum,sm__cycles_active.avg,sm__cycles_active.max,smsp__inst_executed.sum,dram__bytes_read.sum,launch__registers_per_thread,launch__grid_size,launch__occupancy_limit_registers,sm__warps_active.avg.pct_of_peak_sustained_active
for dtype in int2-aged int2 int4-aged int4; do
    timeout 60 ncu --clock-control none -k regex:"^(kernel|one_launch_kernel|pool_kernel)" --launch-skip 2 \
        --launch-count 1 --metrics $metrics --section WarpStateStats --csv --page raw \
        python3 -m benchmarks.profile_decode $dtype 5 > "$R/ncu-$dtype.csv" 2> "$R/ncu-$dtype.err"
    echo "$dtype rc $?"
    python3 benchmarks/experiments/ncu_rows.py "$R/ncu-$dtype.csv"
done
