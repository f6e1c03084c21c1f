source .gpurun/env.sh
K=.gpurun/keys
(cd $K && PYTHONPATH=$site:$PWD timeout 60 python3 -m pytest -q -m gpu -p no:cacheprovider tests/cuda/attention/test_mma.py > $R/mma.log 2>&1)
echo "mma: $(tail -1 $R/mma.log)"
(cd $K && PYTHONPATH=$site:$PWD timeout 60 python3 -m pytest -q -p no:cacheprovider tests/cuda/attention/test_decode.py -k large_values > $R/large.log 2>&1)
echo "large: $(tail -1 $R/large.log)"
for run in 2; do
 (cd $K && PYTHONPATH=$site:$PWD timeout 60 python3 -m benchmarks.bench_decode --shapes all --dtypes int2,int4 --flex none --no-peers --name keys$run > $R/bench-keys$run.log 2>&1)
 timeout 60 python3 -m benchmarks.bench_decode --shapes all --dtypes int2,int4 --flex none --no-peers --name main$run > $R/bench-main$run.log 2>&1
done
tar czf $OUT/call3.tgz -C $R .
(cd $K && PYTHONPATH=$site:$PWD timeout 100 python3 -m benchmarks.bench_persistent --shapes quick --skip-latency --skip-yields > $R/persistent-keys.log 2>&1; tar czf $OUT/call3.tgz -C $R .
 PYTHONPATH=$site:$PWD timeout 70 python3 -m benchmarks.bench_decode --shapes b1 --dtypes fp16,fp16-nomerge,int4,int4-nomerge,int2,int2-nomerge --no-peers --flex none --name merge > $R/merge.log 2>&1; cp $OUT/decode_merge.json $R/; tar czf $OUT/call3.tgz -C $R .
 PYTHONPATH=$site:$PWD timeout 90 python3 -m benchmarks.bench_fault --graph > $R/fault-graph.log 2>&1)
mv $OUT/*.json $R/ 2>/dev/null
tar czf $OUT/call3.tgz -C $R .
grep no_yield $R/persistent-keys.log | cut -c1-260; tail -8 $R/merge.log | cut -c1-200; tail -12 $R/fault-graph.log | cut -c1-200
for f in $R/bench-keys2.log $R/bench-main2.log ; do echo $f; tail -14 $f | cut -d'|' -f1-7; done
