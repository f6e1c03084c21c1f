#!/usr/bin/env bash
# Thirty-second session, call 4 (~400 s): the FP16 grid decode uncapped where its one wave keeps
# the capped split count or needs no split (launcher._choose_kernel). The issue-12 FP16 rows it
# changes and the persistent decode's FP16 B=1 ratio against it, then the decode, step and
# engine GPU tests beside memcheck and racecheck over benchmarks.sanitize (its small FP16
# decodes now take the uncapped kernel).
set -u
source benchmarks/experiments/device-site.sh  # site, R
export PYTHONPATH="$site:$PWD"
OUT=$R timeout 80 python3 -m benchmarks.bench_decode --shapes "32,64,8,4096;1,32,8,32768;1,32,8,131072;4,32,8,8192" \
    --dtypes fp16 --flex none --no-peers --queued --name fp16 > "$R/fp16.log" 2>&1
echo "fp16 rc $?"; grep timed "$R/fp16.log"
timeout 60 python3 -m benchmarks.bench_persistent --shapes "1,32,8,32768" --dtypes fp16 --skip-latency --skip-yields \
    --queued > "$R/persistent.log" 2>&1
echo "persistent rc $?"; grep no_yield "$R/persistent.log" | cut -c1-300
tests_beside_sanitizers "$PWD" 300 tests/cuda/attention/test_decode.py tests/cuda/steps tests/test_engine.py
