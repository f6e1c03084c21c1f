# s25 call 2: the trigger before the fused merge: bench main vs patch alternating, twice each, then the patch's dependent tests
source .gpurun/env.sh
rm -rf $R/*; git log --oneline -1 > $R/head.txt
rm -rf /tmp/t; cp -r . /tmp/t; (cd /tmp/t && git apply benchmarks/experiments/2026-12-04-trigger-before-merge/trigger-before-merge.diff && git status --short > $R/patched-status.txt)
S="1,32,8,1024;1,32,8,32768;1,32,8,131072;32,64,8,4096;16,32,8,16384"
for i in 1 2; do
  OUT=$R timeout 120 python3 -m benchmarks.bench_decode --shapes "$S" --flex none --no-peers --queued --name main$i > $R/main$i.log 2>&1
  (cd /tmp/t && OUT=$R PYTHONPATH=/tmp/hexcore-site:/tmp/t timeout 120 python3 -m benchmarks.bench_decode --shapes "$S" --flex none --no-peers --queued --name patch$i > $R/patch$i.log 2>&1)
done
(cd /tmp/t && PYTHONPATH=/tmp/hexcore-site:/tmp/t timeout 100 python3 -m pytest -m gpu -q -p no:cacheprovider tests/cuda/attention/test_decode.py tests/cuda/steps/test_graph.py -k dependent > $R/patched-tests.log 2>&1); tail -2 $R/patched-tests.log
cp -r $R/* $OUT/ 2>/dev/null
for f in main1 patch1 main2 patch2; do echo "== $f"; grep -E "^(hexcore|torch)" $R/$f.log | cut -d'|' -f1-2,5-8; done
