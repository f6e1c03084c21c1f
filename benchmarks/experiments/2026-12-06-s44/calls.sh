#!/usr/bin/env bash
# GPU calls of the forty-fourth session, run from the repository root on the lent GPU with
# .whl/ carried; results into $OUT. No kernel machine code changed since the forty-second
# session (ed2710e); these are the checks and timings owed by the forty-third
# (../2026-12-05-s43/NEXT.md), regrouped so that each call fits its 600 s:
#   probe-san (~420 s; step limits 50 + 300 + 110): ahead_probe.py on this GPU's NVVM, the four
#      compute-sanitizer tools over all of benchmarks.sanitize, then one round of
#      bench_fault's graph rows (B=64 x 32/8 4k, 32 layers; plain, separate 1-in-16, 2 and
#      1 whole layers a step; every dtype; issue 14's 3% target is set at 2 layers a step).
#      On an H100 the four tools did not finish within 300 s (call 1): give them a call of
#      their own, two tools at a time (NEXT.md).
#   tests (~450 s; limit 540): every GPU test (scripts/gpu-check's tests stage, -n 12); the
#      outcomes file names every test that finished.
#   rows-table (~390 s; limits 110 + 280): a second round of the graph rows, then the decode
#      table with SDPA and paged FlexAttention beside it (issue 12; not timed as a whole since
#      the twenty-seventh session).
set -u
s43=benchmarks/experiments/2026-12-05-s43
source benchmarks/experiments/device-site.sh  # site, R
export PYTHONPATH="$site:$PWD"
rows() {  # rows LIMIT NAME: bench_fault's graph rows, every dtype
    OUT=$R timeout "$1" python3 -m benchmarks.bench_fault --graph --every 16 --name "$2" > "$R/$2.log" 2>&1
    echo "$2 rc $?"; grep -E "^graph" "$R/$2.log"
}
case "${1:-}" in
probe-san)
    timeout 50 python3 $s43/ahead_probe.py > "$R/ahead_probe.log" 2>&1; echo "probe rc $?"
    grep -E "right|wrong|NVVM" "$R/ahead_probe.log"
    OUT=/tmp/check/san HEXCORE_GPU_CHECK=sanitize timeout 300 scripts/gpu-check > "$R/sanitize-stage.log" 2>&1
    echo "sanitizers rc $?"; grep -E "exit" "$R/sanitize-stage.log"
    for f in /tmp/check/san/sanitize-*.log; do echo "== $f"; tail -n 40 "$f"; done > "$R/sanitize-tails.log"
    rows 110 fault_graph_1
    ;;
tests)
    OUT=/tmp/check/tests HEXCORE_GPU_CHECK=tests timeout 540 scripts/gpu-check -n 12 > "$R/tests-stage.log" 2>&1
    echo "tests rc $?"; tail -2 "$R/tests-stage.log"; grep -E "^(FAILED|ERROR)" "$R/tests-stage.log" | head
    cp /tmp/check/tests/gpu-tests-outcomes.txt "$R/" 2>/dev/null
    ;;
rows-table)
    rows 110 fault_graph_2
    shapes="64,32,32,4096;64,32,8,4096;128,32,8,2048;16,32,8,16384;32,64,8,4096;1,32,8,32768;1,32,8,131072"
    OUT=$R timeout 280 python3 -m benchmarks.bench_decode --shapes "$shapes" --flex 2 --queued --name table44 \
        > "$R/table.log" 2>&1
    echo "== table (rc $?)"; grep -E "^hexcore|^torch|^flex" "$R/table.log" | cut -d'|' -f1-7,10,14-18
    ;;
*)
    echo "usage: $0 probe-san|tests|rows-table" >&2; exit 2
    ;;
esac
