#!/usr/bin/env bash
# GPU calls of the thirty-ninth session, run from the repository root on the lent GPU with
# .whl/ carried; results into $OUT (as run, an inline python -c snippet printed the graph
# rows; `bench_fault --graph --every --name` now prints the same lines, and device-site.sh
# writes gpu.txt). The verify variant of a layer now takes the plain layer's launch (cap,
# split count, cluster merge, programmatic dependent launch):
#   bench (~330 s): the GPU tests it touches (the layered graph's bit-identity, which failed
#      in the thirty-eighth session; the head digests; the decode's dependent launches and
#      verify variant), racecheck and memcheck over the verify variant's runs
#      (benchmarks.sanitize --verify: eager, then a plan of dependent launches merging in
#      clusters), then bench_fault's graph rows as in the thirty-eighth session
#      (B=64 x 32/8 4k, 32 layers; plain, separate 1-in-16, 2 and 1 whole layers a step).
set -u
case "${1:-}" in
bench)
    source benchmarks/experiments/device-site.sh  # site, R
    export PYTHONPATH="$site:$PWD"
    timeout 170 python3 -m pytest -q -rs -p no:cacheprovider -n 6 tests/test_fault.py \
        tests/cuda/test_head_digest.py tests/cuda/attention/test_decode.py \
        -k "layers or head_digest or verify or dependent" > "$R/tests.log" 2>&1
    echo "tests rc $?"; tail -2 "$R/tests.log"; grep -E "^(FAILED|ERROR)" "$R/tests.log" | head
    for tool in racecheck memcheck; do
        timeout 60 compute-sanitizer --tool "$tool" python3 -m benchmarks.sanitize --verify \
            > "$R/sanitize-$tool.log" 2>&1
        echo "$tool rc $?"; tail -3 "$R/sanitize-$tool.log"
    done
    OUT=$R timeout 250 python3 -m benchmarks.bench_fault --graph --every 16 > "$R/fault_graph.log" 2>&1
    echo "bench rc $?"; grep -vE "Warning|warn" "$R/fault_graph.log" | tail -12
    ;;
mixer)  # (~330 s) the head digest's mixer in 32-bit instructions: the GPU tests of the digests,
    # the layered graph and the u32 helpers, then the graph rows with the mixer as it was
    # (mixer-before.diff: numba's 64-bit arithmetic) and as it is now, one after the other
    # (the diff applies to the tree of that call; device.py's docstring changed after it)
    source benchmarks/experiments/device-site.sh  # site, R
    export PYTHONPATH="$site:$PWD"
    timeout 150 python3 -m pytest -q -rs -p no:cacheprovider -n 6 tests/test_fault.py \
        tests/cuda/test_head_digest.py tests/cuda/test_device.py tests/cuda/test_integrity.py \
        -k "layers or head_digest or u32 or gpu" > "$R/tests.log" 2>&1
    echo "tests rc $?"; tail -2 "$R/tests.log"; grep -E "^(FAILED|ERROR)" "$R/tests.log" | head
    patched_copy /tmp/before "$PWD/benchmarks/experiments/2026-12-05-s39/mixer-before.diff" || exit 1
    for which in before after; do
        d=$PWD; [ $which = before ] && d=/tmp/before
        (cd $d && OUT=$R PYTHONPATH="$site:$d" timeout 130 python3 -m benchmarks.bench_fault --graph \
            --every 16 --name fault_graph_$which > "$R/$which.log" 2>&1; echo "$which rc $?"
            grep -E "^graph" "$R/$which.log")
    done
    ;;
fp16)  # (~250 s; prepared, not run) issue 14: FP16's checked layer hashing the rows from the
    # registers its k-steps loaded (fp16-in-loop.diff) instead of re-reading them after the
    # loop: the GPU tests of the patched copy, then FP16's graph rows as it is and patched
    source benchmarks/experiments/device-site.sh  # site, R
    export PYTHONPATH="$site:$PWD"
    patched_copy /tmp/fp16 "$PWD/benchmarks/experiments/2026-12-05-s39/fp16-in-loop.diff" || exit 1
    (cd /tmp/fp16 && PYTHONPATH="$site:/tmp/fp16" timeout 120 python3 -m pytest -q -p no:cacheprovider -n 6 \
        tests/test_fault.py tests/cuda/test_head_digest.py -k "layers or head_digest" > "$R/tests.log" 2>&1)
    echo "tests rc $?"; tail -2 "$R/tests.log"; grep -E "^(FAILED|ERROR)" "$R/tests.log" | head
    for which in main patched; do
        d=$PWD; [ $which = patched ] && d=/tmp/fp16
        (cd $d && OUT=$R PYTHONPATH="$site:$d" timeout 90 python3 -m benchmarks.bench_fault --graph --every 16 \
            --dtypes fp16 --name fault_graph_$which > "$R/$which.log" 2>&1; echo "$which rc $?"
            grep -E "^graph" "$R/$which.log")
    done
    ;;
*)
    echo "usage: $0 bench|mixer|fp16" >&2; exit 2
    ;;
esac
