#!/usr/bin/env bash
# GPU calls for the split policy that prices the merge (twenty-seventh session), run from the
# repository root on the lent H200 with .whl/ carried, each argument one call; results go
# straight to $OUT (a call cut by its limit still returns what finished).
#   check (~420 s): the whole GPU check of this tree, the tests (-n 8) beside the four
#      sanitizers (the policy changed after the last whole check: host code only, but the
#      plans' split counts and clusters changed with it);
#   sweep-small (~300 s, with FP16's L2 prefetch at B=1 8k-128k) and sweep-wider (~250 s): the default policy against the one before it at
#      the shapes whose split count it changes, which only B=1 32/8 was timed at: ``no merge
#      term`` is the FP16/INT4 policy before it, ``clusters priced alike`` INT2's (read each
#      dtype's rows against its own); B = 1, 2 x 32/8 at 1k-32k and B=1 128k, then B = 4 x
#      32/8 at 1k-16k, B = 8 x 32/8 at 1k, 4k, 64k, B = 16 x 32/4 1k, B = 1, 4 x 32/4 at 2k
#      and 8k, and B = 2 x 32/32 1k (rows the policy changes, and some it keeps as controls).
set -u
source benchmarks/experiments/device-site.sh  # site, R
export PYTHONPATH="$site:$PWD"
sweep() {  # sweep NAME SHAPES LIMIT
    OUT=$R timeout "$3" python3 -m benchmarks.bench_decode --shapes "$2" --variants \
        --variant-names "default,no merge term,clusters priced alike" --flex none --no-peers --queued --name "$1" \
        > "$R/$1.log" 2>&1
    echo "== $1 (rc $?)"; grep -E "^hexcore" "$R/$1.log" | cut -d'|' -f1-7,14-18
}
case "${1:-}" in
check)  # (a call returns at most 8 files: gpu-check's own go to /tmp, the ones to read to $R)
    OUT=/tmp/check/san HEXCORE_GPU_CHECK=sanitize scripts/gpu-check > "$R/sanitize-stage.log" 2>&1 &
    sanitizers=$!
    OUT=/tmp/check/tests HEXCORE_GPU_CHECK=tests timeout 530 scripts/gpu-check -n 8 > "$R/tests-stage.log" 2>&1
    echo "tests rc $?"; tail -2 "$R/tests-stage.log"; grep -E "^FAILED" "$R/tests-stage.log" | head
    cp /tmp/check/tests/gpu-tests-outcomes.txt "$R/" 2>/dev/null
    wait "$sanitizers"; echo "sanitizers rc $?"; grep -E "exit" "$R/sanitize-stage.log"
    for f in /tmp/check/san/sanitize-*.log; do echo "== $f"; tail -n 40 "$f"; done > "$R/sanitize-tails.log"
    ;;
sweep-small)
    sweep small "1,32,8,1024;1,32,8,2048;1,32,8,4096;1,32,8,8192;1,32,8,16384;1,32,8,32768;1,32,8,131072;2,32,8,1024;2,32,8,2048;2,32,8,4096;2,32,8,8192;2,32,8,16384;2,32,8,32768" 280
    # FP16 at B=1 is bound by the bytes each warp has in flight (ncu, twelfth session: 3.09
    # TB/s at 32k, 15 warps per SM, an older kernel); an L2 prefetch of each warp's next block was never
    # timed at B=1 on this kernel (at 64 x 32/8 4k, an older kernel, it cost 41%)
    OUT=$R timeout 90 python3 -m benchmarks.bench_decode --shapes "1,32,8,8192;1,32,8,32768;1,32,8,131072" \
        --dtypes fp16 --variants --variant-names "default,prefetch=all" --flex none --no-peers --queued \
        --name prefetch > "$R/prefetch.log" 2>&1
    echo "== prefetch (rc $?)"; grep -E "^hexcore" "$R/prefetch.log" | cut -d'|' -f1-7,14-18
    ;;
sweep-wider)
    sweep wider "4,32,8,1024;4,32,8,2048;4,32,8,4096;4,32,8,16384;8,32,8,1024;8,32,8,4096;8,32,8,65536;16,32,4,1024;1,32,4,2048;1,32,4,8192;4,32,4,2048;4,32,4,8192;2,32,32,1024" 280
    ;;
*)
    echo "usage: $0 check|sweep-small|sweep-wider" >&2; exit 2
    ;;
esac
