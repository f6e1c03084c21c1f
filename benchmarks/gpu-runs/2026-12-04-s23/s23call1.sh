# s23 call 1 (tree: main 31b8396 + simulator-only test changes): the four sanitizers on the slice
# kernel at its grid launch's cap, then the persistent kernel's no-yield ratio at all quick rows
source .gpurun/env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/smi.txt 2>&1
mkdir -p $R/san
OUT=$R/san HEXCORE_GPU_CHECK=sanitize timeout 290 scripts/gpu-check > $R/san.log 2>&1
echo "sanitize rc $?"; tail -5 $R/san.log
tar czf $OUT/call1.tgz -C $R .
timeout 280 python3 -m benchmarks.bench_persistent --shapes quick --skip-latency --skip-yields > $R/persist.jsonl 2> $R/persist.err
echo "persist rc $?"
tar czf $OUT/call1.tgz -C $R .
python3 - <<'PY'
import json
for l in open("/tmp/r/persist.jsonl"):
    r = json.loads(l)
    if r.get("row") == "no_yield":
        print(r["dtype"], r["B"], r["Hq"], r["Hkv"], r["ctx"], r["registers"], "paged %.5f pers %.5f ratio %.3f" % (r["paged_ms"], r["persistent_ms"], r["ratio"]))
PY
tail -2 $R/persist.err
