#!/usr/bin/env bash
# Thirty-third session, optional GPU call for a later session (~200 s; after the plan's calls
# 1-3): the split merge with 32 partial loads in flight per thread instead of 16
# (merge32.diff: at B=1 32k the last CTA of a row reads 32 splits' partials in four rounds of
# 16 loads; 32 make it two). On the CPU (ptxas 13, sm_90, D128 BS32 G4) it costs registers:
# uncapped 197-199 against 156-166 (two CTAs per SM, not three), capped INT4 8 bytes of
# spills (none before); the split policy reads the compiled occupancy, so B=1 rows may split differently.
# Alternating, two rounds, this tree against the patched copy, at B=1 32k and 128k.
set -u
source benchmarks/experiments/device-site.sh  # site, R
here=$PWD
patched_copy /tmp/merge32 "$here/benchmarks/experiments/2026-12-04-s33/merge32.diff" || exit 1
for round in 1 2; do
    for side in main merge32; do
        dir=$here; [ $side = merge32 ] && dir=/tmp/merge32
        (cd $dir && OUT=$R PYTHONPATH="$site:$dir" timeout 90 python3 -m benchmarks.bench_decode \
            --shapes "1,32,8,32768;1,32,8,131072" --dtypes fp16,int4,int2 --flex none --no-peers --queued \
            --name $side$round > /tmp/$side$round.log 2>&1)
        echo "$side$round rc $?"; grep timed /tmp/$side$round.log
    done
done
