#!/usr/bin/env bash
# GPU calls of the forty-eighth session, run from the repository root on the lent GPU with
# .whl/ carried; results into $OUT. What was owed is ../2026-12-06-s47/NEXT.md. Modes:
#   check: the GPU tests of the kernels value-fields.diff touches, then ab value-fields: the
#      kernels before it (this tree with value-fields.diff reversed, logs "base") against this
#      tree (logs named by the tree's folder, "main" on the lent machine), INT4 and INT2 at six
#      GQA shapes, two rounds alternating.
#   san-ncu: memcheck and racecheck over all of benchmarks.sanitize, then ncu's instruction
#      counts of INT2 and INT4 at 64 x 32/8 4k, before value-fields.diff ("base") and with it.
#   next-h200: on an H200 only, NEXT.md items 1-3 (ab value-fields, INT2's source page and
#      stalls, the s44 rows-table).
#   stats-ones: stats-ones.diff's GPU tests, then main against it (INT4, INT2, six shapes).
#   h200: on an H200 only, s47 NEXT.md items 1 and 2.
#   first: on an H200, s47's next-h200 (INT2's source page and stalls, the int2-aged probe's
#      source pages, two checked layers a step); on an H100, s47's probe-source only.
set -u
source benchmarks/experiments/device-site.sh  # site, R
s47=benchmarks/experiments/2026-12-06-s47/calls.sh
here=benchmarks/experiments/2026-12-06-s48
alternate() {  # alternate NAME BEFORE AFTER: bench_decode INT4 and INT2 at six GQA shapes in the
    # trees BEFORE and AFTER, two rounds alternating; logs NAME-<tree's folder>-<round>
    local shapes="64,32,8,4096;128,32,8,2048;16,32,8,16384;32,64,8,4096;1,32,8,32768;1,32,8,131072" tree round
    for round in 1 2; do
        for tree in "$2" "$3"; do
            local name="$1-$(basename "$tree")-$round"
            (cd "$tree" && OUT=$R PYTHONPATH="$site:$tree" timeout 150 python3 -m benchmarks.bench_decode \
                --shapes "$shapes" --dtypes int4,int2 --no-peers --flex none --queued --name "$name" > "$R/$name.log" 2>&1)
            echo "== $name rc $?"; grep -E "^hexcore" "$R/$name.log" | cut -d'|' -f1-6
        done
    done
}
ab() {  # ab NAME: this tree with NAME.diff reversed ("base") against this tree
    [ -d /tmp/base ] || { cp -r . /tmp/base && (cd /tmp/base && git apply -R "$PWD/$here/$1.diff"); } || {
        echo "ab: $1.diff does not reverse"; rm -rf /tmp/base; return 1; }
    alternate "$1" /tmp/base "$PWD"
}
patched() {  # patched NAME: this tree ("main") against it with NAME.diff applied
    patched_copy "/tmp/$1" "$PWD/$here/$1.diff" || return 1
    alternate "$1" "$PWD" "/tmp/$1"
}
case "${1:-}" in
stats-ones)  # stats-ones.diff (no lane tests or zeros for the stats mma's operands): its GPU
    # tests (decode, tiered, persistent, the head digest's verify decode), then timed against main
    patched_copy /tmp/stats-ones "$PWD/$here/stats-ones.diff" || exit 1
    (cd /tmp/stats-ones && PYTHONPATH="$site:/tmp/stats-ones" timeout 280 python3 -m pytest -m gpu -q -p no:cacheprovider \
        -n 12 tests/cuda/attention/test_decode.py tests/cuda/attention/test_tiered.py \
        tests/cuda/attention/test_persistent.py tests/cuda/test_head_digest.py > "$R/stats-ones-tests.log" 2>&1)
    echo "stats-ones tests rc $?"; tail -n 2 "$R/stats-ones-tests.log"; grep -E "^(FAILED|ERROR)" "$R/stats-ones-tests.log" | head
    patched stats-ones
    ;;
first)
    if grep -q H200 "$R/gpu.txt"; then bash $s47 next-h200; else bash $s47 probe-source; fi
    ;;
next-h200)  # on an H200 only (~500 s): ab value-fields, INT2's source
    # page and stalls, then two checked layers a step and issue 12's table (NEXT.md items 1-3)
    grep -q H200 "$R/gpu.txt" || { echo "not an H200: nothing run"; exit 0; }
    ab value-fields
    bash $s47 source
    bash $s47 stalls-int2
    bash benchmarks/experiments/2026-12-06-s44/calls.sh rows-table
    ;;
h200)  # on an H200 only: s47 NEXT.md items 1 and 2 (INT2's source page and stalls, two checked
    # layers a step and issue 12's table); nothing on an H100
    grep -q H200 "$R/gpu.txt" || { echo "not an H200: nothing run"; exit 0; }
    bash $s47 source
    bash $s47 stalls-int2
    bash benchmarks/experiments/2026-12-06-s44/calls.sh rows-table
    ;;
check)  # the value-fields change: the GPU tests of the kernels it touches, then ab value-fields
    t0=$SECONDS
    PYTHONPATH="$site:$PWD" timeout 300 python3 -m pytest -m gpu -q -rs -p no:cacheprovider -n 12 \
        tests/cuda/attention/test_mma.py tests/cuda/test_write.py tests/cuda/attention/test_decode.py \
        tests/cuda/attention/test_decode_bounds.py tests/cuda/attention/test_tiered.py \
        tests/cuda/attention/test_prefill.py tests/cuda/attention/test_persistent.py > "$R/tests.log" 2>&1
    echo "tests rc $? in $((SECONDS - t0)) s"; tail -2 "$R/tests.log"; grep -E "^(FAILED|ERROR)" "$R/tests.log" | head
    ab value-fields
    ;;
san-ncu)  # memcheck and racecheck over all of benchmarks.sanitize on this tree, then ncu's
    # instruction and time counts of INT2 and INT4 at 64 x 32/8 4k, before the change and with it
    t0=$SECONDS
    OUT=/tmp/check/san HEXCORE_GPU_CHECK=sanitize HEXCORE_SANITIZERS="memcheck racecheck" timeout 360 \
        scripts/gpu-check > "$R/sanitize-stage.log" 2>&1
    echo "sanitize rc $? in $((SECONDS - t0)) s"
    for f in /tmp/check/san/sanitize-*.log; do echo "== $f"; grep -v -i "performance" "$f" | tail -n 20; done \
        > "$R/sanitize-tails.log"
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|==" "$R/sanitize-tails.log" | tail -6
    [ -d /tmp/base ] || { cp -r . /tmp/base && (cd /tmp/base && git apply -R "$PWD/$here/value-fields.diff"); }
    for tree in /tmp/base "$PWD"; do
        for args in "int2 1" "int4 1"; do
            set -- $args
            (cd "$tree" && PYTHONPATH="$site:$tree" timeout 90 ncu --clock-control none --kernel-name-base demangled \
                -k regex:decode_kernel --launch-skip 2 --launch-count 1 --csv --page raw \
                --metrics gpu__time_duration.sum,smsp__inst_executed.sum,smsp__issue_active.avg.per_cycle_active,dram__bytes_read.sum \
                python3 -m benchmarks.profile_decode "$1" "$2" > "$R/ncu-$(basename "$tree")-$1.csv" 2>&1)
            echo "== ncu $(basename "$tree") $1 rc $?"; tail -n 1 "$R/ncu-$(basename "$tree")-$1.csv" | tr ',' '\n' | tail -n 4 | tr '\n' ' '; echo
        done
    done
    ;;
*)
    echo "usage: $0 first" >&2; exit 2
    ;;
esac
