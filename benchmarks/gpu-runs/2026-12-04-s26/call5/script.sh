# s26 call B: issue 12's table (+ B=1 1k/4k) on main (d44430e) with SDPA peers, the same
# shapes on abb6305 (before this session) without peers (the cluster rule's edge was cut: no device time)
source .gpurun/env.sh; R=$OUT  # results straight into $OUT: a call cut by the budget still returns them
git log --oneline -1 > $R/head.txt
rm -rf /tmp/old; mkdir -p /tmp/old; git archive abb6305 | tar -x -C /tmp/old
shapes="64,32,32,4096;64,32,8,4096;128,32,8,2048;16,32,8,16384;32,64,8,4096;1,32,8,32768;1,32,8,131072;1,32,8,1024;1,32,8,4096"
OUT=$R timeout 125 python3 -m benchmarks.bench_decode --shapes "$shapes" --flex none --queued --name new > $R/new.log 2>&1
(cd /tmp/old && OUT=$R PYTHONPATH=/tmp/hexcore-site:/tmp/old timeout 105 python3 -m benchmarks.bench_decode --shapes "$shapes" --flex none --no-peers --queued --name old > $R/old.log 2>&1)
for f in new old; do echo "== $f"; grep -E "^hexcore|^torch|^sdpa" $R/$f.log | cut -d'|' -f1-7,10,14-16; done
