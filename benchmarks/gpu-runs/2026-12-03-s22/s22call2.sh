# s22 call 2 (tree .gpurun/cur: main 984b184 + the slice kernel at its grid launch's register cap):
# the whole GPU test suite, then the persistent kernel's no-yield ratio at the quick shapes
source .gpurun/env.sh
cd .gpurun/cur
export PYTHONPATH=$site
mkdir -p $R/check
OUT=$R/check HEXCORE_GPU_CHECK=tests timeout 440 scripts/gpu-check -n 8 -p no:cacheprovider > $R/check.log 2>&1
echo "check rc $?"; tail -2 $R/check.log; grep -E "^FAILED|^ERROR" $R/check.log | head
tar czf $OUT/call2.tgz -C $R .
timeout 100 python3 -m benchmarks.bench_persistent --shapes quick --skip-latency --skip-yields > $R/persist.jsonl 2> $R/persist.err
tar czf $OUT/call2.tgz -C $R .
python3 - <<'PY'
import json
for l in open("/tmp/r/persist.jsonl"):
    r = json.loads(l)
    if r.get("row") == "no_yield":
        print(r["dtype"], r["B"], r["Hq"], r["Hkv"], r["ctx"], r["registers"], "paged %.5f pers %.5f ratio %.3f" % (r["paged_ms"], r["persistent_ms"], r["ratio"]))
PY
tail -2 $R/persist.err
