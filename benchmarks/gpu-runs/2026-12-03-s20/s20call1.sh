source .gpurun/env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $R/smi.txt 2>&1
timeout 60 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_common.py > $R/hash.log 2>&1
echo "hash: $(tail -1 $R/hash.log)"
(cd .gpurun/keys && PYTHONPATH=$site:$PWD timeout 200 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider tests/cuda/attention/test_mma.py tests/cuda/attention/test_decode.py tests/cuda/attention/test_persistent.py tests/test_gpu_common.py "tests/test_engine.py::test_a_format_by_age_on_gpu" "tests/test_fault.py::test_graph_verification_in_captured_graphs_gpu" tests/test_host_step.py > $R/keys-tests.log 2>&1
 echo "keys tests: $(tail -1 $R/keys-tests.log)"
 PYTHONPATH=$site:$PWD timeout 80 python3 -m benchmarks.bench_decode --shapes all --dtypes int2,int4 --flex none --no-peers --name keys > $R/bench-keys.log 2>&1)
timeout 170 python3 -m benchmarks.bench_decode --shapes all --flex 2 --name table > $R/table.log 2>&1
tar czf $OUT/call1.tgz -C $R .
grep -E "FAILED|Error" $R/keys-tests.log | head -5; tail -n 30 $R/table.log | cut -c1-200; tail -n 16 $R/bench-keys.log | cut -c1-200
