#!/usr/bin/env bash
# Two GPU calls prepared in the twenty-sixth session, run from the repository root on the
# lent H200 with .whl/ carried, each argument one call: results go straight to $OUT (a call
# cut by its limit still returns what finished).
#   table (~330 s): issue 12's table and B=1 1k/4k on this tree with the SDPA peer (the twenty-sixth
#      session's landed tree was never timed as one: its run was cut at 125 s), then the same
#      shapes on abb6305 (before that session) without peers;
#   edge (~400 s): the cluster rule's edge: default, "cluster merge" (forced) and "no cluster merge" at
#      B = 1-8 x 32/8 1k and B = 32 x 32/8 4k (2-8 splits filling 0.08 to 0.97 of a wave by
#      the wave policy's own model), each cluster row with the driver's
#      cuOccupancyMaxActiveClusters (`max_clusters` column) beside its grid and ctas_per_sm;
#      then `bench_splits --cluster-merge both` at B=1 1k/2k/4k: time against the split
#      count with each item's 2-8 splits merged in a cluster and in the workspace, the data a
#      split policy that knows the cluster merge's cost needs.
set -u
source benchmarks/experiments/device-site.sh  # site, R
export PYTHONPATH="$site:$PWD"
case "${1:-}" in
table)
    rm -rf /tmp/old; mkdir -p /tmp/old; git archive abb6305 | tar -x -C /tmp/old
    shapes="64,32,32,4096;64,32,8,4096;128,32,8,2048;16,32,8,16384;32,64,8,4096;1,32,8,32768;1,32,8,131072;1,32,8,1024;1,32,8,4096"
    OUT=$R timeout 200 python3 -m benchmarks.bench_decode --shapes "$shapes" --flex none --queued --name new > "$R/new.log" 2>&1
    (cd /tmp/old && OUT=$R PYTHONPATH="$site:/tmp/old" timeout 120 python3 -m benchmarks.bench_decode --shapes "$shapes" \
        --flex none --no-peers --queued --name old > "$R/old.log" 2>&1)
    for f in new old; do echo "== $f"; grep -E "^hexcore|^torch" "$R/$f.log" | cut -d'|' -f1-7,10,14-18; done
    ;;
edge)
    OUT=$R timeout 200 python3 -m benchmarks.bench_decode --shapes "1,32,8,1024;2,32,8,1024;3,32,8,1024;4,32,8,1024;6,32,8,1024;8,32,8,1024;32,32,8,4096" \
        --variants --variant-names "default,cluster merge,no cluster merge" --flex none --no-peers --queued --name edge > "$R/edge.log" 2>&1
    echo "== edge"; grep -E "^hexcore" "$R/edge.log" | cut -d'|' -f1-7,14-18
    OUT=$R timeout 190 python3 -m benchmarks.bench_splits --shapes 1x32x8x1024,1x32x8x2048,1x32x8x4096 --ctas 1,2,4 \
        --cluster-merge both > "$R/splits.log" 2>&1
    grep -E "splits of|split_merge_cost|too few" "$R/splits.log"
    ;;
*)
    echo "usage: $0 table|edge" >&2; exit 2
    ;;
esac
