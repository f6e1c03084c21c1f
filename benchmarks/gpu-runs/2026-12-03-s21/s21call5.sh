# s21 call 5 (tree: 6d086e8 + acq_rel handshake + register_cap policy): GPU decode tests, then
# the new default against the 128 cap where the policy now drops the cap
source .gpurun/env.sh
timeout 110 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider tests/cuda/attention/test_decode.py > $R/tests.log 2>&1
echo "tests: $(tail -1 $R/tests.log)"; grep FAILED $R/tests.log | head -5
tar czf $OUT/call5.tgz -C $R .
OUT=$R timeout 100 python3 -m benchmarks.bench_decode --shapes "16,32,8,16384;32,64,8,4096;1,32,8,32768;1,32,8,131072" --variants --variant-names "default,cap 128" --flex none --no-peers --name policy > $R/policy.log 2>&1
tar czf $OUT/call5.tgz -C $R .
grep "^hexcore" $R/policy.log | cut -d'|' -f1-2,5-6,8,11-14
