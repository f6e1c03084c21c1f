#!/usr/bin/env bash
# The GPU calls of the two-level cluster merge (README beside this file), run from the
# repository root on the lent H200 with .whl/ carried, each argument one call; the patch is
# applied to a copy of the tree under /tmp; results go straight to $OUT.
set -u
site=/tmp/hexcore-site
mkdir -p "$site"
[ -f "$site/.ok" ] || { python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" .whl/*.whl && touch "$site/.ok"; }
export NUMBA_ENABLE_CUDASIM=0 PYTHONUNBUFFERED=1
R=${OUT:-/tmp/r}
mkdir -p "$R"
git log --oneline -1 > "$R/head.txt"
[ -d /tmp/two-level ] || { cp -r . /tmp/two-level && (cd /tmp/two-level && git apply benchmarks/experiments/2026-12-04-two-level-cluster/two-level-cluster.diff); }
in_patch() { (cd /tmp/two-level && PYTHONPATH="$site:/tmp/two-level" "$@"); }
case "${1:-}" in
check)
    for tool in memcheck racecheck; do
        (in_patch timeout 330 compute-sanitizer --tool $tool --error-exitcode 1 python3 -m benchmarks.sanitize \
            > "$R/$tool.log" 2>&1; echo "$tool rc $?" >> "$R/$tool.log") &
    done
    in_patch timeout 300 python3 -m pytest -m gpu -q -rs -p no:cacheprovider -n 4 tests/cuda/attention/test_decode.py \
        tests/cuda/steps/test_graph.py > "$R/tests.log" 2>&1
    echo "tests rc $?"; tail -2 "$R/tests.log"; grep -E "^FAILED" "$R/tests.log" | head
    wait
    tail -n 3 "$R"/memcheck.log "$R"/racecheck.log
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
