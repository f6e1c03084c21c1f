#!/usr/bin/env bash
# Thirty-fifth session, for the next (~400 s; not run: the session's device time was spent):
# formats by age in one launch (the default, and "one" explicitly) with the last pool's split
# count priced on the busiest SM counting the younger pools' CTAs (one-busiest.diff) against
# main, alternating, two rounds,
# at four rows: the grid changes at int2-aged B=1 32k / 2 8k / 1 128k and int4-aged B=2 8k
# (the default there), int4-aged B=8 4k ("one" only); int4-aged B=1 32k / 128k are controls.
set -u
source benchmarks/experiments/device-site.sh  # site, R
export PYTHONPATH="$site:$PWD"
here=$PWD
shapes="1,32,8,32768;2,32,8,8192;8,32,8,4096;1,32,8,131072"
patched_copy /tmp/busiest "$here/benchmarks/experiments/2026-12-05-one-busiest-sm/one-busiest.diff" || exit 1
for round in 1 2; do
    for side in main busiest; do
        dir=$here; [ $side = busiest ] && dir=/tmp/busiest
        (cd $dir && OUT=$R PYTHONPATH="$site:$dir" timeout 110 python3 -m benchmarks.bench_decode --shapes "$shapes" \
            --dtypes int4-aged,int2-aged --variants --variant-names "default,one launch" --flex none --no-peers \
            --queued --name "$side$round" > "$R/$side$round.log" 2>&1)
        echo "$side$round rc $?"; grep timed "$R/$side$round.log"
    done
done
