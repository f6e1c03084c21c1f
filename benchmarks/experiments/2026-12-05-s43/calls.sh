#!/usr/bin/env bash
# GPU calls of the forty-third session, run from the repository root on the lent GPU with
# .whl/ carried; results into $OUT.
#   hi (~520 s, issue 14): the head digest's right shifts as multiply-highs by constants
#      hidden in shuffles (integrity.head_shifts_opaque): the same value, but IMAD.HI on the
#      multiply-add pipe where SHF took the integer pipe, which the CPU's SASS count says
#      binds a checked pass (INT4 D128 BS32 G4: 568 integer-pipe instructions, 1,136 of its
#      cycles, against 1,077 issue slots; after, 454 of 1,081). First the GPU tests it
#      touches, then pipe_probe.py (the mixer's throughput by how its shifts are made,
#      and each pipe's rate), then bench_fault's graph rows (B=64 x 32/8 4k, 32 layers: plain, separate
#      1-in-16, 2 and 1 whole layers a step), before (hi-before.diff: the shifts, HEAD's
#      kernels; its own copy, /tmp/before-s43) and after: every dtype, then INT4 again in the
#      other order. Step limits 150 + 60 + 2 x 110 + 2 x 60 = 550 s, within the call's 600.
#   check (~330 s; step limits 460 s), check-min (~120 s): see their cases below.
#   table (~280 s, issue 12): the decode table on this tree, SDPA and paged FlexAttention
#      beside it (not timed as a whole since the twenty-seventh session).
set -u
here=benchmarks/experiments/2026-12-05-s43
rows() {  # rows WHICH LIMIT NAME [bench_fault options]: the graph rows of the tree before or after
    local which=$1 limit=$2 name=$3 d=$PWD; shift 3
    [ "$which" = before ] && d=/tmp/before-s43
    (cd "$d" && OUT=$R PYTHONPATH="$site:$d" timeout "$limit" python3 -m benchmarks.bench_fault --graph \
        --every 16 --name "$name" "$@" > "$R/$name.log" 2>&1
        echo "$name rc $?"; grep -E "^graph" "$R/$name.log")
}
source benchmarks/experiments/device-site.sh  # site, R
export PYTHONPATH="$site:$PWD"
case "${1:-}" in
hi)
    timeout 150 python3 -m pytest -m gpu -q -rs -p no:cacheprovider -n 6 tests/test_fault.py \
        tests/cuda/test_head_digest.py tests/cuda/test_device.py tests/cuda/test_integrity.py \
        tests/cuda/attention/test_decode.py -k "layers or head or u32 or verify or integrity or term" \
        > "$R/tests.log" 2>&1
    echo "tests rc $?"; tail -2 "$R/tests.log"; grep -E "^(FAILED|ERROR)" "$R/tests.log" | head
    timeout 60 python3 $here/pipe_probe.py > "$R/pipe_probe.log" 2>&1; echo "probe rc $?"; cat "$R/pipe_probe.log"
    patched_copy /tmp/before-s43 "$PWD/$here/hi-before.diff" || exit 1
    rows before 110 fault_graph_before; rows after 110 fault_graph_after
    rows after 60 fault_graph_after_int4 --dtypes int4; rows before 60 fault_graph_before_int4 --dtypes int4
    ;;
check)  # (~330 s) ahead_probe.py (which form of the key-ahead test kernel this NVVM
    # miscompiles), the integrity and head-digest GPU tests (the key-ahead test rewritten to a
    # 1-D output), then the four compute-sanitizer tools over all of benchmarks.sanitize
    timeout 60 python3 $here/ahead_probe.py > "$R/ahead_probe.log" 2>&1; echo "probe rc $?"
    grep -E "right|NVVM" "$R/ahead_probe.log"
    timeout 100 python3 -m pytest -m gpu -q -rs -p no:cacheprovider -n 4 tests/cuda/test_integrity.py \
        tests/cuda/test_head_digest.py tests/cuda/test_device.py > "$R/tests.log" 2>&1
    echo "tests rc $?"; tail -1 "$R/tests.log"; grep -E "^(FAILED|ERROR)" "$R/tests.log" | head
    OUT=/tmp/check/san HEXCORE_GPU_CHECK=sanitize timeout 300 scripts/gpu-check > "$R/sanitize-stage.log" 2>&1
    echo "sanitizers rc $?"; grep -E "exit" "$R/sanitize-stage.log"
    for f in /tmp/check/san/sanitize-*.log; do echo "== $f"; tail -n 40 "$f"; done > "$R/sanitize-tails.log"
    ;;
check-min)  # (~120 s) check's first two steps alone: the probe and the GPU tests
    timeout 50 python3 $here/ahead_probe.py > "$R/ahead_probe.log" 2>&1; echo "probe rc $?"
    grep -E "right|NVVM" "$R/ahead_probe.log"
    timeout 90 python3 -m pytest -m gpu -q -rs -p no:cacheprovider -n 4 tests/cuda/test_integrity.py \
        tests/cuda/test_head_digest.py tests/cuda/test_device.py > "$R/tests.log" 2>&1
    echo "tests rc $?"; tail -1 "$R/tests.log"; grep -E "^(FAILED|ERROR)" "$R/tests.log" | head
    ;;
table)
    shapes="64,32,32,4096;64,32,8,4096;128,32,8,2048;16,32,8,16384;32,64,8,4096;1,32,8,32768;1,32,8,131072"
    OUT=$R timeout 280 python3 -m benchmarks.bench_decode --shapes "$shapes" --flex 2 --queued --name table43 \
        > "$R/table.log" 2>&1
    echo "== table (rc $?)"; grep -E "^hexcore|^torch|^flex" "$R/table.log" | cut -d'|' -f1-7,10,14-18
    ;;
*)
    echo "usage: $0 hi|check|check-min|table" >&2; exit 2
    ;;
esac
