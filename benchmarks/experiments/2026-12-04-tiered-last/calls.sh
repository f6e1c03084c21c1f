#!/usr/bin/env bash
# The GPU call of the last pool's launch merging a format by age (DecodeOptions.tiered_merge
# "last", thirtieth session), from the repository root on the lent H200 with .whl/ carried;
# results straight to $OUT.
#   all (~400 s): the tiered, engine and graph-step GPU tests (-n 4) beside the four
#      sanitizers over benchmarks.sanitize --tiered (every merge mode, eager and as plans with
#      dependent launches), then formats by age timed by merge mode, twice.
set -u
source benchmarks/experiments/device-site.sh  # site, R
export PYTHONPATH="$site:$PWD"
SHAPES="1,32,8,32768;1,32,8,131072;8,32,8,4096;16,32,8,16384;64,32,8,4096;64,32,32,4096"
bench() {  # bench NAME VARIANTS LIMIT
    OUT=$R timeout "$3" python3 -m benchmarks.bench_decode --shapes "$SHAPES" --dtypes int4-aged,int2-aged \
        --variants --variant-names "$2" --flex none --no-peers --queued --name "$1" > "$R/$1.log" 2>&1
    echo "== $1 (rc $?)"; grep -E "^hexcore" "$R/$1.log" | cut -d'|' -f1-7
}
case "${1:-}" in
all)
    for tool in memcheck racecheck initcheck synccheck; do
        (timeout 300 compute-sanitizer --tool $tool --error-exitcode 1 python3 -m benchmarks.sanitize --tiered \
            > "/tmp/$tool.log" 2>&1; echo "$tool rc $?" >> "/tmp/$tool.log") &
    done
    timeout 300 python3 -m pytest -m gpu -q -rs -p no:cacheprovider -n 4 tests/cuda/attention/test_tiered.py \
        tests/test_engine.py tests/cuda/steps > "$R/tests.log" 2>&1
    echo "tests rc $?"; tail -2 "$R/tests.log"; grep -E "^FAILED" "$R/tests.log" | head
    wait
    for tool in memcheck racecheck initcheck synccheck; do tail -n 3 "/tmp/$tool.log"; done > "$R/sanitizers.log"
    cat "$R/sanitizers.log"
    bench merges1 "default,fp16 launch,last pool merges,last pool merges plain" 200
    bench merges2 "default,last pool merges" 120
    ;;
*)
    echo "usage: $0 all" >&2; exit 2
    ;;
esac
