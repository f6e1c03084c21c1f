#!/usr/bin/env bash
# Thirty-fifth session (~400 s): formats by age run their pools in one launch by default
# where a step has few items (DecodeOptions.tiered_mode, TIERED_ONE_MAX_ITEMS). The GPU tests
# whose formats by age now take that path by default (tiered decode, graphs, the Engine,
# fault tolerance, transformers), then the new default at the one-launch call's eight rows,
# with plain INT4/INT2 at three of them, in the same process order as that call.
set -u
source benchmarks/experiments/device-site.sh  # site, R
export PYTHONPATH="$site:$PWD"
timeout 200 python3 -m pytest -m gpu -q -rs -p no:cacheprovider -n 8 tests/cuda/attention/test_tiered.py \
    tests/cuda/steps/test_graph.py tests/test_engine.py tests/test_fault.py tests/integrations/test_transformers.py \
    > "$R/tests.log" 2>&1
echo "tests rc $?"; tail -2 "$R/tests.log"; grep -E "^FAILED" "$R/tests.log" | head
shapes="1,32,8,32768;2,32,8,8192;8,32,8,4096;1,32,8,131072;32,32,8,4096;16,32,8,16384;64,32,8,4096;32,32,8,1024"
OUT=$R timeout 130 python3 -m benchmarks.bench_decode --shapes "$shapes" --dtypes int4-aged,int2-aged \
    --flex none --no-peers --queued --name aged > /tmp/aged.log 2>&1
echo "aged rc $?"; grep timed /tmp/aged.log
OUT=$R timeout 60 python3 -m benchmarks.bench_decode --shapes "1,32,8,32768;8,32,8,4096;32,32,8,4096" \
    --dtypes int4,int2 --flex none --no-peers --queued --name plain > /tmp/plain.log 2>&1
echo "plain rc $?"; grep timed /tmp/plain.log
