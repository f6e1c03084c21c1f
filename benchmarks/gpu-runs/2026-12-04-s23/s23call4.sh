# s23 call 4 (tree: main da0b063 + time_gpu's queue_ns / bench_decode --queued): the decode
# table timed with the calls enqueued ahead of the GPU against the usual timing, same call;
# B=1 with the fused merge's share (-nomerge rows) both ways
source .gpurun/env.sh
rm -rf $R/*; git log --oneline -1 > $R/head.txt; git status --short >> $R/head.txt
B1="1,32,8,1024;1,32,8,32768;1,32,8,131072"
D1=fp16,int4,int2,fp16-nomerge,int4-nomerge,int2-nomerge
OUT=$R timeout 150 python3 -m benchmarks.bench_decode --shapes all --flex none --queued --name allq > $R/allq.log 2>&1
OUT=$R timeout 150 python3 -m benchmarks.bench_decode --shapes all --flex none --name all > $R/all.log 2>&1
OUT=$R timeout 100 python3 -m benchmarks.bench_decode --shapes "$B1" --dtypes $D1 --flex none --queued --name b1q > $R/b1q.log 2>&1
OUT=$R timeout 100 python3 -m benchmarks.bench_decode --shapes "$B1" --dtypes $D1 --flex none --name b1 > $R/b1.log 2>&1
cp $R/* $OUT/ 2>/dev/null
for f in allq all b1q b1; do echo "== $f"; grep -E "^(hexcore|torch)" $R/$f.log | cut -d'|' -f1-2,5-6,8; done
