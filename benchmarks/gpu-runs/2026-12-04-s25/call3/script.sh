# s25 call 3: persistent slices as dependent launches: bench_persistent main vs patch, the patch's persistent GPU tests, then the merge shares
source .gpurun/env.sh
rm -rf $R/*; git log --oneline -1 > $R/head.txt
rm -rf /tmp/q; cp -r . /tmp/q; (cd /tmp/q && git apply benchmarks/experiments/2026-12-04-persistent-pdl/persistent-pdl.diff && git status --short > $R/patched-status.txt)
OUT=$R timeout 110 python3 -m benchmarks.bench_persistent --shapes quick --skip-latency --skip-yields --queued > $R/pmain.log 2>&1; echo "pmain rc $?"
(cd /tmp/q && OUT=$R/q PYTHONPATH=/tmp/hexcore-site:/tmp/q timeout 110 python3 -m benchmarks.bench_persistent --shapes quick --skip-latency --skip-yields --queued > $R/ppatch.log 2>&1; echo "ppatch rc $?")
(cd /tmp/q && PYTHONPATH=/tmp/hexcore-site:/tmp/q timeout 120 python3 -m pytest -m gpu -q -p no:cacheprovider tests/cuda/attention/test_persistent.py > $R/ptests.log 2>&1); tail -1 $R/ptests.log
OUT=$R timeout 170 python3 -m benchmarks.bench_decode --shapes "32,64,8,4096;16,32,8,16384;128,32,8,2048;1,32,8,32768;1,32,8,131072" --dtypes fp16,fp16-nomerge,int4,int4-nomerge,int2,int2-nomerge --queued --no-peers --flex none --name merge > $R/merge.log 2>&1; echo "merge rc $?"
cp -r $R/* $OUT/ 2>/dev/null
grep -iE "no_yield|ratio|^shape|B=" $R/pmain.log | head -20; echo ==; grep -iE "no_yield|ratio|^shape|B=" $R/ppatch.log | head -20
grep -E "^hexcore" $R/merge.log | cut -d'|' -f1-2,5-6
