#!/usr/bin/env bash
# The GPU calls of the tiered dependent launches (README beside this file), run from the
# repository root on the lent H200 with .whl/ carried, each argument one call; the patch is
# applied to a copy of the tree under /tmp; results go straight to $OUT.
set -u
source benchmarks/experiments/device-site.sh  # site, R
patched_copy /tmp/tiered-dep benchmarks/experiments/2026-12-04-tiered-dependent/tiered-dependent.diff
in_patch() { (cd /tmp/tiered-dep && PYTHONPATH="$site:/tmp/tiered-dep" "$@"); }
case "${1:-}" in
check)
    tests_beside_sanitizers /tmp/tiered-dep 240 tests/cuda/attention/test_tiered.py tests/test_engine.py tests/cuda/steps
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
