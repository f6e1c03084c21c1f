#!/usr/bin/env bash
# GPU calls of the thirty-seventh session, run from the repository root on the lent GPU with
# .whl/ carried, each argument one call; results into $OUT.
#   new (~400 s): the GPU tests of what this session changed (whole layers checked in turn
#      inside the decode: tests/test_fault.py, the head-digest record of one layer, the step
#      graphs, the Engine), then issue 14's figure: bench_fault's graph rows (B=64 x 32/8 4k,
#      32 layers; FP16, INT4, INT2): plain, the separate check of a 1-in-16 sample, and 2 and 1
#      whole layers a step checked inside the decode;
#   check: the whole GPU check (2026-12-05-split-policy/calls.sh check).
set -u
case "${1:-}" in
new)
    source benchmarks/experiments/device-site.sh  # site, R
    export PYTHONPATH="$site:$PWD"
    timeout 300 python3 -m pytest -m gpu -q -rs -p no:cacheprovider -n 6 tests/test_fault.py \
        tests/cuda/test_head_digest.py tests/cuda/steps tests/test_engine.py > "$R/tests.log" 2>&1
    echo "tests rc $?"; tail -2 "$R/tests.log"; grep -E "^(FAILED|ERROR)" "$R/tests.log" | head
    OUT=$R timeout 280 python3 -c "
from benchmarks.bench_fault import graph_rows
from benchmarks.gpu_common import save
rows = graph_rows(every=(16,))
for r in rows:
    print(r['op'], '| off %.1f us | on %.1f us | overhead %.2f%% | false alarms %d | %s' % (
        r['off_us'], r['on_us'], 100 * r['overhead'], r['false_alarms'], r['items']))
save('fault_graph', rows)" > "$R/fault_graph.log" 2>&1
    echo "bench rc $?"; grep -vE "Warning|warn" "$R/fault_graph.log" | tail -12
    ;;
check)
    bash benchmarks/experiments/2026-12-05-split-policy/calls.sh check
    ;;
*)
    echo "usage: $0 new|check" >&2; exit 2
    ;;
esac
