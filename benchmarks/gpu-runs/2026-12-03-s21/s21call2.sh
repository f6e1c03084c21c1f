# s21 call 2 (tree: 6d086e8 + the acq_rel merge handshake): sanitizers, then the persistent
# kernel's no-yield ratios, the merge's share at B=1 and the in-graph verification's cost
source .gpurun/env.sh
echo "tree: 6d086e8 + acq_rel merge handshake" > $R/head.txt
OUT=$R/san HEXCORE_GPU_CHECK=sanitize timeout 200 scripts/gpu-check > $R/san.log 2>&1
echo "san: $(tail -5 $R/san.log | tr '\n' ' ')"
tar czf $OUT/call2.tgz -C $R .
OUT=$R timeout 130 python3 -m benchmarks.bench_persistent --shapes quick --skip-latency --skip-yields > $R/persistent.log 2>&1
tar czf $OUT/call2.tgz -C $R .
OUT=$R timeout 90 python3 -m benchmarks.bench_decode --shapes b1 --dtypes fp16,fp16-nomerge,int4,int4-nomerge,int2,int2-nomerge --no-peers --flex none --name merge > $R/merge.log 2>&1
tar czf $OUT/call2.tgz -C $R .
OUT=$R timeout 120 python3 -m benchmarks.bench_fault --graph > $R/fault-graph.log 2>&1
tar czf $OUT/call2.tgz -C $R .
grep no_yield $R/persistent.log | cut -c1-200; grep "^hexcore" $R/merge.log | cut -d'|' -f1-2,5-6; tail -12 $R/fault-graph.log | cut -c1-160
