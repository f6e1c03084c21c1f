#!/usr/bin/env bash
# Thirty-second session, call 5 (~400 s; not run, no machine lent): FP16 unsplit and uncapped
# (the rule takes it for items of at most 128 blocks: FP16_UNSPLIT_MAX_BLOCKS) against the
# default at shapes not yet timed (the review's: B=32 1k inside the limit, the rest past it,
# where the capped kernel would split in two or more), formats by age with
# their FP16 pool now uncapped at B=1 (working tree against fp16-capped.diff, main's rule),
# then memcheck and racecheck over benchmarks.sanitize (with its new 128-register rows).
set -u
source benchmarks/experiments/device-site.sh  # site, R
export PYTHONPATH="$site:$PWD"
here=$PWD
OUT=$R timeout 150 python3 -m benchmarks.bench_decode --shapes "48,32,8,8192;32,32,8,32768;8,32,32,32768;32,32,8,1024" \
    --dtypes fp16 --variants --variant-names "default,cap 128,unsplit uncapped" --flex none --no-peers --queued --name fp16 \
    > /tmp/fp16.log 2>&1
echo "fp16 rc $?"; grep timed /tmp/fp16.log
patched_copy /tmp/capped "$here/benchmarks/experiments/2026-12-04-s32/fp16-capped.diff"
for side in new old; do
    dir=$here; [ $side = old ] && dir=/tmp/capped
    (cd $dir && OUT=$R PYTHONPATH="$site:$dir" timeout 60 python3 -m benchmarks.bench_decode \
        --shapes "1,32,8,32768;8,32,8,4096" --dtypes int4-aged --flex none --no-peers --queued --name aged$side \
        > /tmp/aged$side.log 2>&1)
    echo "aged$side rc $?"; grep timed /tmp/aged$side.log
done
for tool in memcheck racecheck; do
    timeout 200 compute-sanitizer --tool $tool --error-exitcode 1 python3 -m benchmarks.sanitize > "$R/$tool.log" 2>&1 &
done
wait
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Error" "$R"/memcheck.log "$R"/racecheck.log | tail -6
