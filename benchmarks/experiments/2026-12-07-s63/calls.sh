#!/usr/bin/env bash
# GPU calls owed by the sixty-third session (issue 12), run from the repository root on the lent
# GPU with .whl/ carried; results into $OUT. NEXT.md gives the order; each call decides nothing:
#   ab3 (~270 s, an H200 preferred): main, then a copy with merge3.diff (FP16 partials over
#      their own sum, a merge round of 32 splits: one L2 wait at 32 splits), each in one process
#      of two rounds of ../2026-12-07-s62/ab_rows.py (B=1 1k, 32k, 128k with explicit 49/64
#      splits too; 32 x 64/8 4k; 128 x 32/8 2k); ab_table.py prints them side by side; limit 420 s.
#   ab3-tests (~250 s, any GPU): on the merge3 copy, the decode tests of the merge, the
#      reference layouts and long context, the tiered tests (the pools' partials are FP16 too),
#      beside racecheck, memcheck and synccheck of benchmarks.sanitize --dtypes int4 --no-tiered
#      (the grid and persistent decodes); limit 400 s.
set -u
source benchmarks/experiments/device-site.sh  # site, R, patched_copy
here=benchmarks/experiments/2026-12-07-s63
s62=benchmarks/experiments/2026-12-07-s62
case "${1:-}" in
ab3)
    patched_copy /tmp/merge3 "$PWD/$here/merge3.diff" || exit 1
    source $s62/ab.sh
    ab_trees "$PWD" /tmp/merge3
    ;;
ab3-tests)
    patched_copy /tmp/merge3 "$PWD/$here/merge3.diff" || exit 1
    cd /tmp/merge3
    PYTHONPATH="$site:$PWD" timeout 330 python3 -m pytest -m gpu -q -p no:cacheprovider -n 6 \
        tests/cuda/attention/test_decode.py tests/cuda/attention/test_tiered.py \
        -k "merge or long_context or matches_reference or tiered" > "$R/tests-merge3.log" 2>&1 &
    for tool in racecheck memcheck synccheck; do
        (PYTHONPATH="$site:$PWD" timeout 330 compute-sanitizer --tool $tool --error-exitcode 1 \
            python3 -m benchmarks.sanitize --dtypes int4 --no-tiered > "$R/merge3-$tool.log" 2>&1
            echo "$tool rc $?" >> "$R/merge3-$tool.log") &
    done
    wait
    for f in "$R"/tests-merge3.log "$R"/merge3-*.log; do echo "== $f"; tail -n 2 "$f"; grep -E "^(FAILED|ERROR)" "$f" | head; done
    ;;
*) echo "usage: $0 ab3|ab3-tests" >&2; exit 2 ;;
esac
