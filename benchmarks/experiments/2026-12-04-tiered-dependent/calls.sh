#!/usr/bin/env bash
# The GPU calls of the tiered dependent launches (README beside this file), run from the
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
[ -d /tmp/tiered-dep ] || { cp -r . /tmp/tiered-dep && (cd /tmp/tiered-dep && git apply benchmarks/experiments/2026-12-04-tiered-dependent/tiered-dependent.diff); }
in_patch() { (cd /tmp/tiered-dep && PYTHONPATH="$site:/tmp/tiered-dep" "$@"); }
case "${1:-}" in
check)
    for tool in memcheck racecheck; do
        (in_patch timeout 280 compute-sanitizer --tool $tool --error-exitcode 1 python3 -m benchmarks.sanitize \
            > "$R/$tool.log" 2>&1; echo "$tool rc $?" >> "$R/$tool.log") &
    done
    in_patch timeout 240 python3 -m pytest -m gpu -q -rs -p no:cacheprovider -n 4 tests/cuda/attention/test_tiered.py \
        tests/test_engine.py tests/cuda/steps > "$R/tests.log" 2>&1
    echo "tests rc $?"; tail -2 "$R/tests.log"; grep -E "^FAILED" "$R/tests.log" | head
    wait
    tail -n 3 "$R"/memcheck.log "$R"/racecheck.log
    ;;
bench)
    for i in 1 2; do
        OUT=$R in_patch timeout 90 python3 -m benchmarks.bench_decode --shapes quick --dtypes int4-aged,int2-aged \
            --variants --variant-names "default,plain launch" --flex none --no-peers --queued --name tiered$i \
            > "$R/tiered$i.log" 2>&1
    done
    for i in 1 2; do echo "== tiered$i"; grep -E "^hexcore" "$R/tiered$i.log" | cut -d'|' -f1-7; done
    ;;
*)
    echo "usage: $0 check|bench" >&2; exit 2
    ;;
esac
