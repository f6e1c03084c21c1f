#!/usr/bin/env bash
# GPU calls of the sixty-fifth session (issue 12), run from the repository root on the lent GPU
# with .whl/ carried; results into $OUT.
#   first (run on an H100 as call 1): on an H200, issue 12's decode table then merge-reserve
#      (../2026-12-07-s64/calls.sh); on any other GPU, src-splits. Calls 2 and 3 were
#      ../2026-12-07-s64/calls.sh probe-tail and merge-reserve.
#   table (limit ~300, an H200 only): issue 12's decode table (bench_decode, the issue's seven
#      shapes with torch SDPA and paged FlexAttention beside it; the step's limit 280 s).
#   ab (limit ~560, not run: no machine was lent after call 3): this tree against a copy with
#      epilogue.diff (the decode item's epilogue in 16-byte shared and global stores, one
#      round of 4-channel runs a thread; 8-byte float16 stores of out), each in its own process,
#      alternating: main, epilogue, main, epilogue, one round of ab_rows.py each (five of issue
#      12's shapes, every dtype), the same flags for both; then torch SDPA on the same shapes
#      if time is left.
#   check-tests (limit ~480, not run): the copy's decode GPU tests alone (-n 14).
#   check-san (limit ~480, not run): memcheck and racecheck of benchmarks.sanitize's fp16+int4,
#      int2 and tiered parts on the copy, side by side.
set -u
s64=benchmarks/experiments/2026-12-07-s64
here=$PWD/benchmarks/experiments/2026-12-08-s65
source benchmarks/experiments/device-site.sh  # site, R, patched_copy
shapes="64,32,32,4096;64,32,8,4096;128,32,8,2048;16,32,8,16384;32,64,8,4096;1,32,8,32768;1,32,8,131072"
table() {
    OUT=$R PYTHONPATH="$site:$PWD" timeout 280 python3 -m benchmarks.bench_decode --shapes "$shapes" --flex 2 \
        --queued --name table65 > "$R/table.log" 2>&1
    echo "== table (rc $?)"; grep -E "^hexcore|^torch|^flex" "$R/table.log" | cut -d'|' -f1-7,10,14-18
}
case "${1:-}" in
first)
    if grep -q H200 "$R/gpu.txt"; then table; OUT=$R bash $s64/calls.sh merge-reserve
    else OUT=$R bash $s64/calls.sh src-splits; fi
    ;;
table)
    if grep -q H200 "$R/gpu.txt"; then table; else echo "not an H200: nothing run"; fi
    ;;
ab)
    patched_copy /tmp/epilogue "$here/epilogue.diff" || exit 1
    ab_tree() {  # ab_tree TREE NAME [--peers]: one round in its own process
        (cd "$1" && OUT=$R PYTHONPATH="$site:$1" timeout 120 python3 "$here/ab_rows.py" --rounds 1 --name "$2" \
            ${3:-} > "$R/ab-$2.log" 2>&1)
        echo "== $2 rc $? after $SECONDS s"
    }
    ab_tree "$PWD" main-1; ab_tree /tmp/epilogue epilogue-1
    ab_tree "$PWD" main-2; ab_tree /tmp/epilogue epilogue-2
    python3 benchmarks/experiments/2026-12-07-s62/ab_table.py "$R"
    [ "$SECONDS" -lt 420 ] && ab_tree "$PWD" sdpa --peers && grep SDPA "$R/ab-sdpa.log"
    ;;
check-tests)
    patched_copy /tmp/epilogue "$here/epilogue.diff" || exit 1
    cd /tmp/epilogue
    PYTHONPATH="$site:$PWD" timeout 460 python3 -m pytest -m gpu -q -rs -p no:cacheprovider -n 14 \
        tests/cuda/attention/test_decode.py tests/cuda/attention/test_decode_bounds.py \
        tests/cuda/attention/test_persistent.py tests/cuda/attention/test_tiered.py tests/cuda/steps \
        tests/cuda/test_head_digest.py tests/cuda/test_device.py tests/cuda/test_torch.py > "$R/tests.log" 2>&1
    echo "tests rc $? after $SECONDS s"; grep -E "passed|failed" "$R/tests.log" | tail -n 1
    grep -E "^(FAILED|ERROR)" "$R/tests.log" | head
    ;;
check-san)
    patched_copy /tmp/epilogue "$here/epilogue.diff" || exit 1
    cd /tmp/epilogue
    for part in "fp16-int4:--dtypes fp16,int4 --no-tiered" "int2:--dtypes int2 --no-tiered" "tiered:--tiered"; do
        for tool in memcheck racecheck; do
            (PYTHONPATH="$site:$PWD" timeout 450 compute-sanitizer --tool $tool --error-exitcode 1 \
                python3 -m benchmarks.sanitize ${part#*:} > "$R/$tool-${part%%:*}.log" 2>&1
                echo "$tool ${part%%:*} rc $? after $SECONDS s" >> "$R/$tool-${part%%:*}.log") &
        done
    done
    wait
    for f in "$R"/memcheck-*.log "$R"/racecheck-*.log; do tail -n 1 "$f"; grep -hE "ERROR SUMMARY|RACECHECK SUMMARY" "$f" | sort -u; done
    ;;
*) echo "usage: $0 first|table|ab|check-tests|check-san" >&2; exit 2 ;;
esac
