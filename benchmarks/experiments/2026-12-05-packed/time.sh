#!/usr/bin/env bash
# Thirty-sixth session, for the next (~580 s, ~430 with SKIP_TESTS=1; not run: no GPU was
# lent this session): DecodeOptions(tiered_merge="packed") (README.md) on the H200. First
# its GPU tests (test_tiered: the reference at llama-3-8b head shapes with every way of
# merging, twenty overlapped layers of a plan), then int4-aged / int2-aged at eight rows
# (seven of the thirty-fifth session's, 128 x 2k), the default beside "packed" at 128 registers
# and at 168 (each shape's variants back to back, in that order; a second round without the
# 168 cap), and plain INT4 / INT2 at the same rows. SKIP_TESTS=1: no tests (the whole GPU
# check of this tree runs them).
set -u
source benchmarks/experiments/device-site.sh  # site, R
export PYTHONPATH="$site:$PWD"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
    timeout 150 python3 -m pytest -m gpu -q -rs -p no:cacheprovider -n 8 tests/cuda/attention/test_tiered.py \
        > "$R/tests.log" 2>&1
    echo "tests rc $?"; tail -2 "$R/tests.log"; grep -E "^FAILED" "$R/tests.log" | head
fi
shapes="64,32,8,4096;32,32,8,4096;16,32,8,16384;128,32,8,2048;32,32,8,1024;8,32,8,4096;2,32,8,8192;1,32,8,32768"
for round in 1 2; do  # (round 2 without the 168 cap: less to compile)
    names="default,packed,packed cap 168"; limit=220
    [ $round = 2 ] && { names="default,packed"; limit=150; }
    OUT=$R timeout $limit python3 -m benchmarks.bench_decode --shapes "$shapes" --dtypes int4-aged,int2-aged \
        --variants --variant-names "$names" --flex none --no-peers --queued --name "aged$round" \
        > "$R/aged$round.log" 2>&1
    echo "aged$round rc $?"; grep timed "$R/aged$round.log"
done
OUT=$R timeout 60 python3 -m benchmarks.bench_decode --shapes "$shapes" --dtypes int4,int2 --flex none --no-peers \
    --queued --name plain > "$R/plain.log" 2>&1
echo "plain rc $?"; grep timed "$R/plain.log"
