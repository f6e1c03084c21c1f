#!/usr/bin/env bash
# GPU calls of the fifty-first session, run from the repository root on the lent GPU with .whl/
# carried; results into $OUT. Modes:
#   digest (~400 s, any GPU; issue 14): tensor-digest.diff (INT blocks checked with the
#      tensor-core head digest): on a copy with it, its GPU tests (the head digest's record and
#      verify, the integer mma, fault tolerance's captured graphs, the decode's verify cases)
#      beside memcheck and racecheck of benchmarks.sanitize for INT4 and INT2; then
#      bench_fault's graph rows (two and one checked layers a step at 1-in-16), main and the
#      copy, INT4 and INT2.
#   tests (~330 s, any GPU): the whole GPU test suite on this tree (HEXCORE_GPU_CHECK=tests,
#      -n 12), into $OUT/tests.
#   sanitize (~390 s, any GPU): memcheck, racecheck, initcheck and synccheck at once over
#      benchmarks.sanitize in its three parts (INT4 and INT2, FP16, the format by age), each
#      part's logs into $OUT/<part>.
#   cap2 (~530 s, any GPU; issue 17): slice-cap-2.diff (the slice kernel capped only where
#      its uncapped resident CTAs are fewer than the items): its persistent GPU tests on a
#      copy (250 s allowed: the capped kernels add compiles; the first cap's passed 45 of 50
#      in 200 s this session), then no-yield rows, main against the copy, at B=1 32k, B=1
#      128k and B=2 128k, two rounds alternating.
set -u
source benchmarks/experiments/device-site.sh  # site, R, patched_copy, persistent_ab
here=benchmarks/experiments/2026-12-06-s51
case "${1:-}" in
digest)
    patched_copy /tmp/digest "$PWD/$here/tensor-digest.diff" || exit 1
    for tool in memcheck racecheck; do
        (cd /tmp/digest && PYTHONPATH="$site:/tmp/digest" timeout 220 compute-sanitizer --tool $tool \
            --error-exitcode 1 python3 -m benchmarks.sanitize --dtypes int4,int2 --no-tiered > "$R/digest-$tool.log" 2>&1
            echo "$tool rc $?" >> "$R/digest-$tool.log") &
    done
    (cd /tmp/digest && PYTHONPATH="$site:/tmp/digest" timeout 220 python3 -m pytest -m gpu -q -rs -p no:cacheprovider \
        -n 4 tests/cuda/test_head_digest.py tests/cuda/attention/test_mma.py tests/test_fault.py \
        "tests/cuda/attention/test_decode.py::test_dependent_launch_reads_what_the_kernel_before_it_wrote_gpu" > "$R/digest-tests.log" 2>&1)
    echo "digest tests rc $?"; tail -n 2 "$R/digest-tests.log"; grep -E "^(FAILED|ERROR)" "$R/digest-tests.log" | head
    wait
    tail -n 2 "$R/digest-memcheck.log" "$R/digest-racecheck.log"
    for tree in "$PWD" /tmp/digest; do
        name=rows-$(basename "$tree")
        (cd "$tree" && OUT=$R PYTHONPATH="$site:$tree" timeout 120 python3 -m benchmarks.bench_fault --graph --every 16 \
            --dtypes int4,int2 --name "$name" > "$R/$name.log" 2>&1)
        echo "== $name rc $?"; grep -E "^graph" "$R/$name.log"
    done
    ;;
tests)
    OUT=$R/tests HEXCORE_GPU_CHECK=tests timeout 560 scripts/gpu-check -n 12 > "$R/tests-stage.log" 2>&1
    echo "tests rc $?"; tail -n 2 "$R/tests-stage.log"; grep -E "^(FAILED|ERROR)" "$R/tests-stage.log" | head
    ;;
sanitize)
    for part in "--dtypes int4,int2 --no-tiered" "--dtypes fp16 --no-tiered" "--tiered"; do
        name=$(echo "$part" | tr -dc 'a-z0-9,' | cut -c1-24)
        OUT=$R/$name HEXCORE_GPU_CHECK=sanitize HEXCORE_SANITIZERS="memcheck racecheck initcheck synccheck"             HEXCORE_SANITIZE_ARGS="$part" timeout 250 scripts/gpu-check > "$R/$name-stage.log" 2>&1
        echo "== $part rc $?"; grep -hE "ERROR SUMMARY|RACECHECK SUMMARY|exit" "$R/$name"/*.log "$R/$name-stage.log" | head -8
    done
    ;;
cap2)
    persistent_ab cap2 "$PWD/$here/slice-cap-2.diff" "1,32,8,32768;1,32,8,131072;2,32,8,131072" 250
    ;;
*)
    echo "usage: $0 digest|tests|sanitize|cap2" >&2; exit 2
    ;;
esac
