# s22 call 1 (tree: main 984b184): the landed register policy against both fixed caps at every
# shape (FP16 uncapped never timed), and the persistent kernel at its default cap and uncapped
source .gpurun/env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/smi.txt 2>&1
OUT=$R timeout 240 python3 -m benchmarks.bench_decode --shapes all --variants --variant-names "default,cap 128,no register cap" --flex none --no-peers --name policy3 > $R/policy3.log 2>&1
tar czf $OUT/call1.tgz -C $R .
grep "^hexcore" $R/policy3.log | cut -d'|' -f1-2,5-6,8,11-14
timeout 200 python3 -m benchmarks.bench_persistent --shapes quick --skip-latency --skip-yields --registers default,255 > $R/persist.jsonl 2> $R/persist.err
tar czf $OUT/call1.tgz -C $R .
python3 - <<'PY'
import json
for l in open("/tmp/r/persist.jsonl"):
    r = json.loads(l)
    if r.get("row") == "no_yield":
        print(r["dtype"], r["B"], r["Hq"], r["Hkv"], r["ctx"], r["registers"], "paged %.5f pers %.5f ratio %.3f" % (r["paged_ms"], r["persistent_ms"], r["ratio"]))
PY
tail -3 $R/persist.err
