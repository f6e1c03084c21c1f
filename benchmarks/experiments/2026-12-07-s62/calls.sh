#!/usr/bin/env bash
# GPU calls owed by the sixty-second session (issue 12; no machine was lent that session), run
# from the repository root on the lent GPU with .whl/ carried; results into $OUT. In order
# (NEXT.md), back to back, each deciding nothing between calls:
#   ab-tests (~330 s, any GPU): merge1.diff and merge2.diff (the split merge in one pass of
#      online rounds, no statistics pass first) each on a copy, all side by side: the decode's
#      GPU tests of the merge, the reference layouts and long context, and racecheck, memcheck
#      and synccheck (merge2's shuffles) of benchmarks.sanitize --dtypes int4 --no-tiered (the grid and persistent
#      decodes); limit 400 s.
#   ab (~450 s, an H200 preferred): this tree, merge1 and merge2 in turn, each in one process
#      of two rounds (ab_rows.py): bench_decode's rows, --queued, at B=1 1k, 32k and 128k (32k
#      also at 49 splits, and capped at 64; 128k also capped at 64 splits), 32 x 64/8 4k and
#      128 x 32/8 2k; limit 560 s.
#   timeline (~250 s, an H200 preferred): the sixty-first session's owed timeline (B=1 1k,
#      32k, 128k, every dtype) on this tree, the 32k rows with other split lengths
#      (timeline_splits.py), and the 32k timeline on merge1 and merge2; limit 480 s.
#   (then ../2026-12-07-s61/calls.sh san-new and ../2026-12-07-s57/calls.sh tests)
set -u
source benchmarks/experiments/device-site.sh  # site, R, patched_copy
here=benchmarks/experiments/2026-12-07-s62
copies() {  # the two merge copies, once per machine
    patched_copy /tmp/merge1 "$PWD/$here/merge1.diff" && patched_copy /tmp/merge2 "$PWD/$here/merge2.diff"
}
case "${1:-}" in
ab-tests)  # correctness only, so everything side by side
    copies || exit 1
    for tree in /tmp/merge1 /tmp/merge2; do
        name=$(basename $tree)
        (cd $tree && PYTHONPATH="$site:$tree" timeout 330 python3 -m pytest -m gpu -q -p no:cacheprovider -n 5 \
            tests/cuda/attention/test_decode.py -k "merge or long_context or matches_reference" \
            > "$R/tests-$name.log" 2>&1; echo "tests rc $?" >> "$R/tests-$name.log") &
        for tool in racecheck memcheck synccheck; do
            (cd $tree && PYTHONPATH="$site:$tree" timeout 330 compute-sanitizer --tool $tool --error-exitcode 1 \
                python3 -m benchmarks.sanitize --dtypes int4 --no-tiered > "$R/$name-$tool.log" 2>&1
                echo "$tool rc $?" >> "$R/$name-$tool.log") &
        done
    done
    wait
    for f in "$R"/tests-*.log "$R"/*check.log; do echo "== $f"; tail -n 2 "$f"; grep -E "^(FAILED|ERROR)" "$f" | head; done
    ;;
ab)
    copies || exit 1
    source $here/ab.sh
    ab_trees "$PWD" /tmp/merge1 /tmp/merge2
    ;;
timeline)
    copies || exit 1
    bash benchmarks/experiments/2026-12-07-s61/calls.sh timeline
    PYTHONPATH="$site:$PWD" timeout 120 python3 $here/timeline_splits.py > "$R/splits.log" 2>&1
    echo "splits rc $?"; grep '^{' "$R/splits.log" | cut -c1-400; grep -v '^{' "$R/splits.log" | grep -vi warn | tail -5
    for tree in /tmp/merge1 /tmp/merge2; do
        (cd $tree && PYTHONPATH="$site:$tree" timeout 60 python3 -m benchmarks.item_timeline \
            --shapes "1,32,8,32768" --dtypes fp16,int4,int2 --calls 20 > "$R/timeline-$(basename $tree).log" 2>&1)
        echo "== $(basename $tree) timeline rc $?"; grep '^{' "$R/timeline-$(basename $tree).log" | cut -c1-400
    done
    ;;
*) echo "usage: $0 ab-tests|ab ROUND|timeline" >&2; exit 2 ;;
esac
