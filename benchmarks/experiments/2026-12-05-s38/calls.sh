#!/usr/bin/env bash
# GPU calls of the thirty-eighth session, run from the repository root on the lent GPU with
# .whl/ carried, each argument one call; results into $OUT. The thirty-seventh session's
# two owed calls (2026-12-05-s37/calls.sh), regrouped so that the whole check carries the
# GPU tests of every changed module and the first call is mostly issue 14's figure:
#   bench (~350 s): the GPU tests of whole layers checked in turn (tests/test_fault.py -k
#      layers, the head-digest record of one layer), then bench_fault's graph rows (B=64 x
#      32/8 4k, 32 layers; FP16, INT4, INT2): plain, the separate check of a 1-in-16 sample,
#      and 2 and 1 whole layers a step checked inside the decode (target: under 3% at 2);
#   check (~560 s): the whole GPU check (tests -n 8 beside the four sanitizers).
set -u
case "${1:-}" in
bench)
    source benchmarks/experiments/device-site.sh  # site, R
    export PYTHONPATH="$site:$PWD"
    nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader > "$R/gpu.txt"
    cat "$R/gpu.txt"
    timeout 200 python3 -m pytest -q -rs -p no:cacheprovider -n 6 tests/test_fault.py \
        tests/cuda/test_head_digest.py -k "layers or head_digest" > "$R/tests.log" 2>&1
    echo "tests rc $?"; tail -2 "$R/tests.log"; grep -E "^(FAILED|ERROR)" "$R/tests.log" | head
    OUT=$R timeout 330 python3 -c "
from benchmarks.bench_fault import graph_rows
from benchmarks.gpu_common import save
rows = graph_rows(every=(16,))
for r in rows:
    print(r['op'], '| off %.1f us | on %.1f us | overhead %.2f%% | false alarms %d | %s' % (
        r['off_us'], r['on_us'], 100 * r['overhead'], r['false_alarms'], r['items']), flush=True)
save('fault_graph', rows)" > "$R/fault_graph.log" 2>&1
    echo "bench rc $?"; grep -vE "Warning|warn" "$R/fault_graph.log" | tail -12
    ;;
check)
    bash benchmarks/experiments/2026-12-05-split-policy/calls.sh check
    ;;
*)
    echo "usage: $0 bench|check" >&2; exit 2
    ;;
esac
