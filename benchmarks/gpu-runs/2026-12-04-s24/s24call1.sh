# s24 call 1: programmatic dependent launch (DecodeOptions.dependent_launch) checked and timed;
# the fused merge's share at the B>=16 split shapes; 32x64/8 with splits for 2-3 CTAs per SM
source .gpurun/env.sh
rm -rf $R/*; git log --oneline -1 > $R/head.txt; git status --short >> $R/head.txt
ALL="64,32,32,4096;64,32,8,4096;128,32,8,2048;16,32,8,16384;32,64,8,4096;1,32,8,32768;1,32,8,131072;1,32,8,1024"
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt 2>&1
timeout 150 python3 -m pytest -q -x -p no:cacheprovider tests/cuda/attention/test_decode.py -k "dependent or decode_plan" > $R/tests.log 2>&1
tail -3 $R/tests.log
OUT=$R timeout 200 python3 -m benchmarks.bench_decode --shapes "$ALL" --variants --variant-names "default,dependent launch" --flex none --queued --name pdl > $R/pdl.log 2>&1
OUT=$R timeout 100 python3 -m benchmarks.bench_decode --shapes "32,64,8,4096;16,32,8,16384;128,32,8,2048" --dtypes fp16,fp16-nomerge,int4,int4-nomerge,int2,int2-nomerge --no-peers --flex none --queued --name nomerge > $R/nomerge.log 2>&1
OUT=$R timeout 80 python3 -m benchmarks.bench_decode --shapes "32,64,8,4096" --variants --variant-names "default,ctas 2,ctas 3" --no-peers --flex none --queued --name ctas > $R/ctas.log 2>&1
cp $R/* $OUT/ 2>/dev/null
for f in pdl nomerge ctas; do echo "== $f"; grep -E "^(hexcore|torch)" $R/$f.log | cut -c1-150; tail -2 $R/$f.log; done
