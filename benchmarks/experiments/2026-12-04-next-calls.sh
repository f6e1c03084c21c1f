#!/usr/bin/env bash
# The GPU calls prepared on 2026-12-04 (twenty-fifth session) for the two experiments beside
# this file, cluster-merge/ and merge-chunk-128/: run from the repository root on the lent
# H200 with .whl/ carried, `bash benchmarks/experiments/2026-12-04-next-calls.sh check` as one
# call (~400 s: the patches' GPU tests beside memcheck and racecheck) and `... bench` as the
# next (~450 s: both patches against main, alternating). Each patch runs in its own copy of
# the tree under /tmp; results go to $OUT.
set -u
site=/tmp/hexcore-site
mkdir -p "$site"
[ -f "$site/.ok" ] || { python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" .whl/*.whl && touch "$site/.ok"; }
export NUMBA_ENABLE_CUDASIM=0 PYTHONUNBUFFERED=1
R=${OUT:-/tmp/r}
mkdir -p "$R"
git log --oneline -1 > "$R/head.txt"
for name in cluster-merge merge-chunk-128; do
    [ -d "/tmp/$name" ] && continue
    cp -r . "/tmp/$name" && (cd "/tmp/$name" && git apply "benchmarks/experiments/2026-12-04-$name/$name.diff")
done
in_copy() {  # in_copy NAME COMMAND...: run COMMAND in the patched copy NAME (or "main": this tree)
    local dir=$PWD
    [ "$1" = main ] || dir=/tmp/$1
    shift
    (cd "$dir" && PYTHONPATH="$site:$dir" "$@")
}
case "${1:-}" in
check)
    for tool in memcheck racecheck; do
        (in_copy cluster-merge timeout 400 compute-sanitizer --tool $tool --error-exitcode 1 python3 -m benchmarks.sanitize \
            > "$R/cluster-$tool.log" 2>&1; echo "$tool rc $?" >> "$R/cluster-$tool.log") &
    done
    in_copy cluster-merge timeout 300 python3 -m pytest -m gpu -q -rs -p no:cacheprovider -n 4 \
        tests/cuda/attention/test_decode.py tests/cuda/steps/test_graph.py > "$R/cluster-tests.log" 2>&1
    echo "cluster tests rc $?"; tail -2 "$R/cluster-tests.log"
    in_copy merge-chunk-128 timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider -n 4 \
        tests/cuda/attention/test_decode.py -k "merge or reference" > "$R/chunk-tests.log" 2>&1
    echo "chunk tests rc $?"; tail -1 "$R/chunk-tests.log"
    wait
    tail -n 3 "$R"/cluster-memcheck.log "$R"/cluster-racecheck.log
    ;;
bench)
    shapes="32,64,8,4096;16,32,8,16384;1,32,8,1024;1,32,8,4096;64,32,8,4096;64,32,32,4096"
    for i in 1 2; do  # the cluster merge as a variant: default and cluster rows in the same run
        OUT=$R in_copy cluster-merge timeout 170 python3 -m benchmarks.bench_decode --shapes "$shapes" --variants \
            --variant-names "default,cluster merge" --flex none --no-peers --queued --name cluster$i > "$R/cluster$i.log" 2>&1
    done
    for i in 1 2; do  # one merge round up to 128 splits: main and the patch alternating
        for copy in main merge-chunk-128; do
            OUT=$R in_copy $copy timeout 60 python3 -m benchmarks.bench_decode --shapes "1,32,8,131072;1,32,8,32768" \
                --flex none --no-peers --queued --name "$copy$i" > "$R/$copy$i.log" 2>&1
        done
    done
    for f in "$R"/cluster1.log "$R"/cluster2.log "$R"/main1.log "$R"/merge-chunk-1281.log "$R"/main2.log "$R"/merge-chunk-1282.log; do
        echo "== $f"; grep -E "^hexcore" "$f" | cut -d'|' -f1,2,3,5,6
    done
    ;;
*)
    echo "usage: $0 check|bench" >&2; exit 2
    ;;
esac
