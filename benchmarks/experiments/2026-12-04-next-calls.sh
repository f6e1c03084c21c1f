#!/usr/bin/env bash
# The GPU calls prepared on 2026-12-04 (twenty-fifth session) for the three experiments beside
# this file, cluster-merge/, merge-chunk-128/ and early-loads/: run from the repository root on
# the lent H200 with .whl/ carried, each argument as one call:
#   check        ~400 s: cluster-merge's and merge-chunk-128's GPU tests beside memcheck and
#                racecheck of the cluster patch
#   bench        ~450 s: the cluster merge as a variant; merge-chunk-128 against main
#   check-early  ~400 s: early-loads' GPU tests (attention, device, steps) beside memcheck
#                and racecheck
#   bench-early  ~400 s: early-loads against main, alternating
# Each patch runs in its own copy of the tree under /tmp; results go to $OUT.
set -u
source benchmarks/experiments/device-site.sh  # site, R
for name in cluster-merge merge-chunk-128 early-loads; do
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
check-early)
    for tool in memcheck racecheck; do
        (in_copy early-loads timeout 400 compute-sanitizer --tool $tool --error-exitcode 1 python3 -m benchmarks.sanitize \
            > "$R/early-$tool.log" 2>&1; echo "$tool rc $?" >> "$R/early-$tool.log") &
    done
    in_copy early-loads timeout 380 python3 -m pytest -m gpu -q -rs -p no:cacheprovider -n 6 tests/cuda/attention \
        tests/cuda/test_device.py tests/cuda/steps > "$R/early-tests.log" 2>&1
    echo "early tests rc $?"; tail -2 "$R/early-tests.log"
    wait
    tail -n 3 "$R"/early-memcheck.log "$R"/early-racecheck.log
    ;;
bench-early)
    shapes="1,32,8,1024;1,32,8,32768;1,32,8,131072;16,32,8,16384;32,64,8,4096;128,32,8,2048"
    for i in 1 2; do
        for copy in main early-loads; do
            OUT=$R in_copy $copy timeout 100 python3 -m benchmarks.bench_decode --shapes "$shapes" --flex none \
                --no-peers --queued --name "early-$copy$i" > "$R/early-$copy$i.log" 2>&1
        done
    done
    for f in "$R"/early-main1.log "$R"/early-early-loads1.log "$R"/early-main2.log "$R"/early-early-loads2.log; do
        echo "== $f"; grep -E "^hexcore" "$f" | cut -d'|' -f1,2,3,5,6
    done
    ;;
*)
    echo "usage: $0 check|bench|check-early|bench-early" >&2; exit 2
    ;;
esac
