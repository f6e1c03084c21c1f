source .gpurun/env.sh
cd .gpurun/keys
export PYTHONPATH=$site:$PWD
timeout 110 python3 -m pytest -q -m gpu -n 6 -p no:cacheprovider tests/test_gpu_common.py "tests/test_engine.py::test_a_format_by_age_on_gpu" "tests/test_fault.py::test_graph_verification_in_captured_graphs_gpu" tests/test_host_step.py "tests/cuda/attention/test_persistent.py::test_every_launch_ends_within_budget_plus_one_item_gpu" > $R/tests.log 2>&1
timeout 70 python3 -m benchmarks.bench_decode --shapes all --dtypes int2,int4 --flex none --no-peers --name keys > $R/bench-keys.log 2>&1
cd ../..
export PYTHONPATH=$site:$PWD
timeout 100 python3 -m benchmarks.bench_decode --shapes all --flex none --name table > $R/table.log 2>&1
tar czf $OUT/call5.tgz -C $R .
tail -3 $R/tests.log; grep -E "^hexcore|^torch" $R/bench-keys.log $R/table.log | cut -d'|' -f1-10
