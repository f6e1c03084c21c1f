#!/usr/bin/env bash
# The GPU calls of the two-level cluster merge (README beside this file), run from the
# repository root on the lent H200 with .whl/ carried, each argument one call; the patch is
# applied to a copy of the tree under /tmp; results go straight to $OUT.
set -u
source benchmarks/experiments/device-site.sh  # site, R
patched_copy /tmp/two-level benchmarks/experiments/2026-12-04-two-level-cluster/two-level-cluster.diff
in_patch() { (cd /tmp/two-level && PYTHONPATH="$site:/tmp/two-level" "$@"); }
case "${1:-}" in
check)
    tests_beside_sanitizers /tmp/two-level 300 tests/cuda/attention/test_decode.py tests/cuda/steps/test_graph.py
    ;;
bench)
    shapes="1,32,8,1024;1,32,8,4096;1,32,8,32768;1,32,8,131072;16,32,8,16384"
    for i in 1 2; do
        OUT=$R in_patch timeout 140 python3 -m benchmarks.bench_decode --shapes "$shapes" --variants \
            --variant-names "default,cluster merge,no cluster merge" --flex none --no-peers --queued --name two$i \
            > "$R/two$i.log" 2>&1
    done
    for i in 1 2; do echo "== two$i"; grep -E "^hexcore" "$R/two$i.log" | cut -d'|' -f1-7,14-18; done
    ;;
*)
    echo "usage: $0 check|bench" >&2; exit 2
    ;;
esac
