#!/usr/bin/env bash
# Thirty-third session's GPU call, for the next session (~520 s; no machine was lent): formats
# by age in one launch (DecodeOptions(tiered_merge="one"), tiered_kernels.one_launch_kernel)
# against the default ("last" where the step is short, else a merge launch) and "last" / a
# merge launch explicitly, at the thirtieth/thirty-first sessions' rows, with plain INT4/INT2
# in the same run. Its correctness on the GPU (test_tiered's GPU tests with "one", the
# sanitizers over benchmarks.sanitize's "one" rows) is in the whole GPU check, which runs first.
set -u
source benchmarks/experiments/device-site.sh  # site, R
export PYTHONPATH="$site:$PWD"
shapes="1,32,8,32768;2,32,8,8192;8,32,8,4096;1,32,8,131072;32,32,8,4096;16,32,8,16384;64,32,8,4096;32,32,8,1024"
OUT=$R timeout 420 python3 -m benchmarks.bench_decode --shapes "$shapes" --dtypes int4-aged,int2-aged \
    --variants --variant-names "default,one launch,one launch cap 128,last pool merges,merge launch" \
    --flex none --no-peers --queued --name aged > /tmp/aged.log 2>&1
echo "aged rc $?"; grep timed /tmp/aged.log
OUT=$R timeout 90 python3 -m benchmarks.bench_decode --shapes "1,32,8,32768;8,32,8,4096;32,32,8,4096" \
    --dtypes int4,int2 --flex none --no-peers --queued --name plain > /tmp/plain.log 2>&1
echo "plain rc $?"; grep timed /tmp/plain.log
