source .gpurun/env.sh
cd .gpurun/keys
OUT=$R/san HEXCORE_GPU_CHECK=sanitize timeout 420 scripts/gpu-check > $R/san.log 2>&1 &
san=$!
OUT=$R/tests HEXCORE_GPU_CHECK=tests timeout 430 scripts/gpu-check -n 8 -p no:cacheprovider > $R/tests.log 2>&1
wait $san
PYTHONPATH=$site:$PWD timeout 60 python3 -m pytest -q -m gpu -p no:cacheprovider tests/cuda/attention/test_decode.py -k large_values > $R/large.log 2>&1
tar czf $OUT/call2.tgz -C $R .
tail -3 $R/tests.log; grep -E "FAILED" $R/tests.log | head; cat $R/san.log | tail -6; tail -1 $R/large.log
