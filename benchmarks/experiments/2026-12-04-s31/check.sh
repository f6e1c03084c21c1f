#!/usr/bin/env bash
# Thirty-first session, call 4 (~300 s), from the repository root on the lent H200 with .whl/
# carried: the persistent slice kernel now uncapped wherever every item fits one wave of it
# (FP16 at B=1 too) and the format by age's default rule with an item limit. The four
# sanitizers over benchmarks.sanitize (its persistent runs are small: the uncapped FP16 slice
# kernel) beside the persistent, tiered and graph-step GPU tests, then bench_persistent FP16.
set -u
source benchmarks/experiments/device-site.sh  # site, R
export PYTHONPATH="$site:$PWD"
OUT=/tmp/check/san HEXCORE_GPU_CHECK=sanitize scripts/gpu-check > "$R/sanitize-stage.log" 2>&1 &
sanitizers=$!
OUT=/tmp/check/tests HEXCORE_GPU_CHECK=tests timeout 300 scripts/gpu-check -n 8 -k "persistent or tiered or graph" \
    > "$R/tests-stage.log" 2>&1
echo "tests rc $?"; tail -2 "$R/tests-stage.log"; grep -E "^FAILED" "$R/tests-stage.log" | head
wait "$sanitizers"; echo "sanitizers rc $?"; grep -E "exit" "$R/sanitize-stage.log"
OUT=$R timeout 150 python3 -m benchmarks.bench_persistent --shapes quick --dtypes fp16 --skip-latency --skip-yields \
    --queued > "$R/persistent-fp16.log" 2>&1
echo "persistent rc $?"; grep -E '"no_yield"' "$R/persistent-fp16.log" | cut -c1-240
