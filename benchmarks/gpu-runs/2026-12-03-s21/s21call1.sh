# s21 call 1: the merge handshake (acq_rel atomic by one thread, no threadfence) against main,
# a split sweep and the register cap on the new tree
source .gpurun/env.sh
B=.gpurun/base
echo "tree: 6d086e8 + acq_rel merge handshake (uncommitted); base: 6d086e8" > $R/head.txt
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/smi.txt 2>&1
timeout 200 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider tests/cuda/attention/test_decode.py tests/cuda/attention/test_persistent.py > $R/tests.log 2>&1
echo "tests: $(tail -1 $R/tests.log)"; grep FAILED $R/tests.log | head -5
S="16,32,8,16384;32,64,8,4096;1,32,8,32768;1,32,8,131072"
for run in 1 2; do
 (cd $B && OUT=$R PYTHONPATH=$site:$PWD timeout 80 python3 -m benchmarks.bench_decode --shapes "$S" --flex none --no-peers --name base$run > $R/ab-base$run.log 2>&1)
 OUT=$R timeout 80 python3 -m benchmarks.bench_decode --shapes "$S" --flex none --no-peers --name fence$run > $R/ab-fence$run.log 2>&1
 tar czf $OUT/call1.tgz -C $R .
done
OUT=$R timeout 100 python3 -m benchmarks.bench_decode --shapes all --dtypes int2,int4 --variants --variant-names "default,no register cap" --flex none --no-peers --name regcap > $R/regcap.log 2>&1
tar czf $OUT/call1.tgz -C $R .
OUT=$R timeout 200 python3 -m benchmarks.bench_splits --shapes 32x64x8x4096,128x32x8x2048,16x32x8x16384,1x32x8x32768,1x32x8x131072 --ctas 1,2,4,8 > $R/splits.log 2>&1
tar czf $OUT/call1.tgz -C $R .
for f in $R/ab-*.log $R/regcap.log; do echo "== $f"; grep "^hexcore" $f | cut -d'|' -f1-2,5-6,8 ; done
grep -E "split_merge_cost|Error|error" $R/splits.log | cut -c1-300
