#!/usr/bin/env bash
# Thirty-second session, call 1 (~500 s), from the repository root on the lent H200 with .whl/
# carried. Issue 17: the persistent decode at B=1 against the plan with and without its cluster
# merge (does the cluster merge the persistent decode cannot use explain INT4/INT2's 1.13-1.15?).
# Issue 12: FP16 at B=1 uncapped at one wave (fp16-one-wave.diff, in a patched copy) against the
# default (capped) and "no register cap" (uncapped, the capped policy's split count). Issue 19:
# the capped "last" (the second-wave reading). Then the persistent GPU tests with the new
# max_registers=128 parametrisation (the capped slice kernel against the reference).
set -u
source benchmarks/experiments/device-site.sh  # site, R
export PYTHONPATH="$site:$PWD"
here=$PWD
timeout 100 python3 -m benchmarks.bench_persistent --shapes "1,32,8,32768" --dtypes fp16,int4,int2 --skip-latency \
    --skip-yields --queued --unclustered > "$R/persistent-unclustered.log" 2>&1
echo "persistent rc $?"; grep -E '"no_yield"' "$R/persistent-unclustered.log" | cut -c1-330
shapes="1,32,8,32768;1,32,8,131072;2,32,8,16384;8,32,8,8192;32,64,8,4096"
OUT=$R timeout 130 python3 -m benchmarks.bench_decode --shapes "$shapes" --dtypes fp16 --variants \
    --variant-names "default,no register cap" --flex none --no-peers --queued --name fp16main > "$R/fp16main.log" 2>&1
echo "fp16main rc $?"; grep timed "$R/fp16main.log"
patched_copy /tmp/onewave "$here/benchmarks/experiments/2026-12-04-s32/fp16-one-wave.diff"
(cd /tmp/onewave && OUT=$R PYTHONPATH="$site:/tmp/onewave" timeout 90 python3 -m benchmarks.bench_decode \
    --shapes "$shapes" --dtypes fp16 --flex none --no-peers --queued --name fp16onewave > "$R/fp16onewave.log" 2>&1)
echo "fp16onewave rc $?"; grep timed "$R/fp16onewave.log"
OUT=$R timeout 110 python3 -m benchmarks.bench_decode --shapes "32,32,8,4096;32,32,8,1024" --dtypes int4-aged \
    --variants --variant-names "merge launch,cap 128,last pool merges,last pool merges cap 128" --flex none \
    --no-peers --queued --name lastcap > "$R/lastcap.log" 2>&1
echo "lastcap rc $?"; grep timed "$R/lastcap.log"
timeout 120 python3 -m pytest -m gpu -q -rs -p no:cacheprovider -n 8 tests/cuda/attention/test_persistent.py \
    > "$R/persistent-tests.log" 2>&1
echo "tests rc $?"; tail -2 "$R/persistent-tests.log"; grep -E "^FAILED" "$R/persistent-tests.log" | head
