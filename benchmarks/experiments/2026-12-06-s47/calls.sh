#!/usr/bin/env bash
# GPU calls of the forty-seventh session, run from the repository root on the lent GPU with
# .whl/ carried; results into $OUT. What was owed is ../2026-12-06-s46/NEXT.md. Modes:
#   first: `profile` (as first written, with no kernel matched), then s46's `probe` (issue 19).
#   profile: ncu's speed-of-light, occupancy, scheduler, warp-state, launch and memory sections
#      of one decode launch: INT2 at four GQA shapes, INT4 and FP16 at 128 x 32/8 2k.
#   stalls: every stall reason per issued instruction (INT2 at two shapes, INT4, FP16).
#   source / b1-source / aged-source: ncu's source page (executions and stall samples per
#      SASS instruction; read with benchmarks.ncu_source) of INT2 at 64 x 32/8 4k; of INT2 and
#      INT4 at B=1 32k; of int2-aged's one launch at B=1 32k.
#   h200 (falls through to prefetch and prefetch-time): a source page and stalls, the
#      l2_prefetch GPU test, then the prefetch variants timed (needs prefetch-ahead.diff).
#   tests-rest: on an H200 only, the gpu-marked tests the s46 session did not run there.
#   lane-bases: lane-bases.diff against main, INT4 and INT2 at six shapes (bench_decode).
#   probe-source: issue 19, ncu's source page of each of s46 one_probe.py's kernels.
#   next-h200: on an H200 only, NEXT.md items 1, 4 and 2 (source page and stalls of INT2,
#      probe-source, then the s44 folder's rows-table).
set -u
source benchmarks/experiments/device-site.sh  # site, R
profile() {  # profile DTYPE INDEX: one launch of bench_decode.SHAPES[INDEX], four ncu sections
    PYTHONPATH="$site:$PWD" timeout 120 ncu --clock-control none --kernel-name-base demangled -k regex:decode_kernel --launch-skip 2 \
        --launch-count 1 --section SpeedOfLight --section Occupancy --section SchedulerStats \
        --section WarpStateStats --section LaunchStats --section MemoryWorkloadAnalysis \
        python3 -m benchmarks.profile_decode "$1" "$2" > "$R/ncu-$1-$2.txt" 2>&1
    echo "== ncu $1 shape $2 rc $?"
    grep -E "profiled|Duration|Memory Throughput|DRAM Throughput|Issued Warp|Eligible Warps|Active Warps Per|No Eligible|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Theoretical Occ|Block Limit" \
        "$R/ncu-$1-$2.txt" | sed 's/  */ /g' | head -20
}
stalls() {  # stalls DTYPE INDEX: every stall reason per issued instruction, one launch
    local r metrics=smsp__issue_active.avg.per_cycle_active
    for r in barrier branch_resolving dispatch_stall drain imc_miss lg_throttle long_scoreboard math_pipe_throttle \
        membar mio_throttle misc no_instruction not_selected selected short_scoreboard sleeping tex_throttle wait; do
        metrics=$metrics,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio
    done
    PYTHONPATH="$site:$PWD" timeout 120 ncu --clock-control none --kernel-name-base demangled -k regex:decode_kernel \
        --launch-skip 2 --launch-count 1 --metrics "$metrics" \
        --csv --page raw python3 -m benchmarks.profile_decode "$1" "$2" > "$R/stalls-$1-$2.csv" 2>&1
    echo "== stalls $1 shape $2 rc $?"
    python3 - "$R/stalls-$1-$2.csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 5]
head, val = next(r for r in rows if r[0] == "ID"), rows[-1]
pairs = [(h.split("stalled_")[1].split("_per_issue")[0], float(v.replace(",", ""))) for h, v in zip(head, val)
         if "stalled_" in h and v.replace(",", "").replace(".", "", 1).isdigit()]
print(" ".join(f"{k} {v:.2f}" for k, v in sorted(pairs, key=lambda p: -p[1]) if v >= 0.02))
print("issued per cycle", [v for h, v in zip(head, val) if h.startswith("smsp__issue_active")])
PY
}
source_counts() {  # source_counts DTYPE INDEX [KERNEL]: per-SASS-instruction executions and stall samples, one launch
    PYTHONPATH="$site:$PWD" timeout 200 ncu --clock-control none --kernel-name-base demangled -k regex:${3:-decode_kernel} \
        --launch-skip 2 --launch-count 1 --section SourceCounters --section WarpStateStats \
        --import-source no -f -o /tmp/src-$1-$2 python3 -m benchmarks.profile_decode "$1" "$2" > "$R/src-$1-$2.log" 2>&1
    echo "== source counts $1 shape $2 rc $?"
    ncu -i /tmp/src-$1-$2.ncu-rep --page source --csv --print-source sass 2>&1 | gzip > "$R/src-$1-$2.csv.gz"
    ls -la "$R/src-$1-$2.csv.gz"; zcat "$R/src-$1-$2.csv.gz" | head -3 | cut -c1-400
}
probe_source() {  # issue 19: ncu's source page of each of s46 one_probe.py's seven kernels, sampled alike
    # (--ncu: three setup kernels and one warm launch of each came first in the forty-sixth
    # session's run, then three of each: skip 10, take 21, three pages a kernel)
    PYTHONPATH="$site:$PWD" timeout 300 ncu -k regex:kernel --launch-skip 10 --launch-count 21 \
        --section SourceCounters --section WarpStateStats -f -o /tmp/probe-src \
        python3 benchmarks/experiments/2026-12-06-s46/one_probe.py --ncu > "$R/probe-src.log" 2>&1
    echo "== probe source pages rc $?"
    ncu -i /tmp/probe-src.ncu-rep --page source --csv --print-source sass 2>&1 | gzip > "$R/probe-src.csv.gz"
    python3 -m benchmarks.ncu_source "$R/probe-src.csv.gz" | grep -E "^[^ ]|hot loop|before"
}
case "${1:-}" in
next-h200)  # NEXT.md items 1, 4 and 2 in one call on an H200 (~450 s)
    grep -q H200 "$R/gpu.txt" || { echo "not an H200: nothing run"; exit 0; }
    source_counts int2 1
    stalls int2 1
    stalls int2 2
    probe_source
    bash benchmarks/experiments/2026-12-06-s44/calls.sh rows-table
    ;;
probe-source)
    probe_source
    ;;
lane-bases)  # lane-bases.diff (a block's copy addresses stepped from four per-lane bases) against main
    shapes="64,32,8,4096;128,32,8,2048;16,32,8,16384;32,64,8,4096;1,32,8,32768;1,32,8,131072"
    patched_copy /tmp/lb "$PWD/benchmarks/experiments/2026-12-06-s47/lane-bases.diff" || exit 1
    for tree in "$PWD" /tmp/lb; do
        (cd "$tree" && OUT=$R PYTHONPATH="$site:$tree" timeout 200 python3 -m benchmarks.bench_decode --shapes "$shapes" \
            --dtypes int4,int2 --no-peers --flex none --queued --name "lb-$(basename "$tree")" > "$R/lb-$(basename "$tree").log" 2>&1)
        echo "== $tree rc $?"; grep -E "^hexcore" "$R/lb-$(basename "$tree").log" | cut -d'|' -f1-7
    done
    ;;
tests-rest)  # on an H200 only: the gpu-marked tests the forty-sixth session did not run there
    grep -q H200 "$R/gpu.txt" || { echo "not an H200: nothing run"; exit 0; }
    OUT=$R/check HEXCORE_GPU_CHECK=tests timeout ${TESTS_LIMIT:-400} scripts/gpu-check -n 12 \
        --ignore=tests/cuda/attention/test_decode.py --ignore=tests/cuda/attention/test_decode_bounds.py \
        --ignore=tests/cuda/test_integrity.py --ignore=tests/test_fault.py --ignore=tests/host/test_checksum.py \
        > "$R/tests-stage.log" 2>&1
    echo "tests rc $?"; tail -2 "$R/tests-stage.log"; grep -E "^(FAILED|ERROR)" "$R/tests-stage.log" | head
    grep -c "passed" "$R/check/gpu-tests-outcomes.txt" 2>/dev/null
    ;;
h200)
    source_counts int2 1
    stalls int2 2
    ;&
prefetch)
    PYTHONPATH="$site:$PWD" timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider -n 0 \
        tests/cuda/attention/test_decode.py -k l2_prefetch > "$R/prefetch-tests.log" 2>&1
    echo "== prefetch tests rc $?"; tail -2 "$R/prefetch-tests.log"
    ;&
prefetch-time)
    shapes="64,32,8,4096;128,32,8,2048;16,32,8,16384;32,64,8,4096;1,32,8,32768;1,32,8,131072"
    OUT=$R PYTHONPATH="$site:$PWD" timeout 200 python3 -m benchmarks.bench_decode --shapes "$shapes" --dtypes int4,int2 --variants \
        --variant-names "default,prefetch=quantized" --no-peers --flex none --queued --name prefetch47 \
        > "$R/prefetch.log" 2>&1
    echo "== prefetch variants rc $?"; grep -E "^hexcore" "$R/prefetch.log" | cut -d'|' -f1-8
    ;;
source)
    source_counts int2 1
    ;;
aged-source)
    source_counts int2-aged 5 one_launch_kernel
    ;;
b1-source)
    source_counts int2 5
    source_counts int4 5
    ;;
stalls-int2)  # INT2 at 64 x 32/8 4k and 128 x 32/8 2k (the forty-eighth session's h200 mode)
    stalls int2 1
    stalls int2 2
    ;;
stalls)
    for args in "int2 1" "int2 4" "int4 1" "fp16 1"; do stalls $args; done
    ;;
profile)
    for args in "int2 2" "int2 1" "int2 4" "int2 3" "int4 2" "fp16 2"; do profile $args; done
    ;;
first)
    for args in "int2 2" "int2 1" "int2 4" "int2 3" "int4 2" "fp16 2"; do profile $args; done
    bash benchmarks/experiments/2026-12-06-s46/calls.sh probe
    ;;
*)
    echo "usage: $0 first" >&2; exit 2
    ;;
esac
