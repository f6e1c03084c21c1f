#!/usr/bin/env bash
# GPU calls for the split policy that prices each SM's load (twenty-eighth session), run from
# the repository root on the lent H200 with .whl/ carried; results go straight to $OUT.
#   sweep (~200 s): the default at every shape whose split counts the twenty-eighth session
#      timed (B = 1-16, 4-32 KV heads, 1k-128k) and the issue-12 table's shapes, to read
#      against those timings (same kernels: only the split count and the merge differ);
#   verify (~400 s): after the refit (clusters of 3-8 INT4/INT2 CTAs on 3/4 of the SMs), the
#      default at the shapes whose split count the refit changed or never timed, then the GPU
#      tests of the decode (plans, clusters, the split policy's GPU branches) and graph steps;
#   error (~60 s; the twenty-ninth session's call 2): long_error.py, the B=1 x 2 KV heads
#      128k decode's error at 128, 64 and 16 splits on the same seeds (the verify call's INT2
#      failure: 2.14e-3 > 2e-3).
set -u
source benchmarks/experiments/device-site.sh  # site, R
export PYTHONPATH="$site:$PWD"
small="1,32,8,1024;1,32,8,2048;1,32,8,4096;1,32,8,8192;1,32,8,16384;1,32,8,32768;1,32,8,131072;2,32,8,1024"
small="$small;2,32,8,2048;2,32,8,4096;2,32,8,8192;2,32,8,16384;2,32,8,32768"
wider="4,32,8,1024;4,32,8,2048;4,32,8,4096;4,32,8,16384;8,32,8,1024;8,32,8,4096;8,32,8,65536;16,32,4,1024"
wider="$wider;1,32,4,2048;1,32,4,8192;4,32,4,2048;4,32,4,8192;2,32,32,1024"
table="64,32,32,4096;64,32,8,4096;128,32,8,2048;16,32,8,16384;32,64,8,4096"
case "${1:-}" in
sweep)
    OUT=$R timeout 400 python3 -m benchmarks.bench_decode --shapes "$small;$wider;$table" --flex none --no-peers \
        --queued --name costs > "$R/costs.log" 2>&1
    echo "== costs (rc $?)"; grep -E "^hexcore" "$R/costs.log" | cut -d'|' -f1-7,14-18
    ;;
verify)
    changed="2,32,8,1024;2,32,8,2048;2,32,8,4096;2,32,8,8192;4,32,4,2048;4,32,4,8192;4,32,8,1024;4,32,8,2048"
    changed="$changed;4,32,8,4096;1,32,4,8192;8,32,8,1024;16,32,4,1024;2,32,32,1024"
    OUT=$R timeout 200 python3 -m benchmarks.bench_decode --shapes "$changed" --flex none --no-peers --queued \
        --name refit > "$R/refit.log" 2>&1
    echo "== refit (rc $?)"; grep -E "^hexcore" "$R/refit.log" | cut -d'|' -f1-7,14-18
    timeout 300 python3 -m pytest -m gpu -q -rs -p no:cacheprovider -n 8 tests/cuda/attention/test_decode.py \
        tests/cuda/steps/test_graph.py > "$R/tests.log" 2>&1
    echo "tests rc $?"; tail -2 "$R/tests.log"; grep -E "^FAILED" "$R/tests.log" | head
    timeout 60 python3 -m pytest -q -p no:cacheprovider \
        "tests/cuda/attention/test_decode.py::test_a_prepared_launch_prices_clusters_only_where_it_can_merge_in_them" > "$R/rule.log" 2>&1
    echo "cluster_rule on the GPU rc $?"; tail -1 "$R/rule.log"
    ;;
error)  # (~120 s) the 128k error at three split counts, and the two tests the verify call failed
    timeout 200 python3 benchmarks/experiments/2026-12-04-split-costs/long_error.py > "$R/error.log" 2>&1
    echo "error rc $?"; cat "$R/error.log" | tail -12
    ;;
*)
    echo "usage: $0 sweep|verify|error" >&2; exit 2
    ;;
esac
