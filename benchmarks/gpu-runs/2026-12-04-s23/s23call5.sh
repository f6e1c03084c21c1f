# s23 call 5 (main with bench_persistent --queued): the persistent kernel's no-yield ratios timed
# on the device alone (calls enqueued ahead of the GPU)
source .gpurun/env.sh
rm -rf $R/*; git log --oneline -1 > $R/head.txt
timeout 330 python3 -m benchmarks.bench_persistent --shapes quick --skip-latency --skip-yields --queued > $R/persistq.jsonl 2> $R/persistq.err
echo "rc $?"; cp $R/* $OUT/
python3 - <<'PY'
import json
for l in open("/tmp/r/persistq.jsonl"):
    r = json.loads(l)
    if r.get("row") == "no_yield":
        print(r["dtype"], r["B"], r["Hq"], r["Hkv"], r["ctx"], r["queued"], "paged %.5f pers %.5f ratio %.3f" % (r["paged_ms"], r["persistent_ms"], r["ratio"]))
PY
