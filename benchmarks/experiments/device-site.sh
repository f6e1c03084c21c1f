# Sourced (from the repository root, on the lent GPU machine, .whl/ carried) by the
# experiments' GPU call scripts: the carried wheels (numpy 2.4.6, which numba-cuda needs)
# installed once into a private site, the simulator off, results into $OUT (or /tmp/r) as
# $R with the commit in head.txt and the GPU in gpu.txt, bundled on exit into
# $R/0-all.tgz. Sets: site, R.
site=/tmp/hexcore-site
mkdir -p "$site"
[ -f "$site/.ok" ] || { python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" \
    .whl/*.whl && touch "$site/.ok"; }
export NUMBA_ENABLE_CUDASIM=0 PYTHONUNBUFFERED=1
R=${OUT:-/tmp/r}
mkdir -p "$R"
git log --oneline -1 > "$R/head.txt"; git status --short >> "$R/head.txt"
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader > "$R/gpu.txt" 2>&1; cat "$R/gpu.txt"
# a call brings back at most eight files of $OUT, the first eight by name: on the script's exit
# everything in $R also goes into $R/0-all.tgz, which sorts first (a script killed by the call's
# own limit leaves none: give each step a timeout)
trap 'tar -czf /tmp/0-all.tgz -C "$R" --exclude 0-all.tgz . && mv /tmp/0-all.tgz "$R/"' EXIT

patched_copy() {  # patched_copy DIR DIFF: this tree copied to DIR with DIFF applied (once per machine);
    # a diff that does not apply leaves no DIR (so nothing runs on the unpatched tree) and says so
    [ -d "$1" ] || { cp -r . "$1" && (cd "$1" && git apply "$2") || { echo "patched_copy: $2 does not apply" >&2
        rm -rf "$1"; return 1; }; }
}

tests_beside_sanitizers() {  # tests_beside_sanitizers DIR LIMIT PYTEST_ARGS...: in the copy DIR, the
    # GPU tests (-n 4) beside memcheck and racecheck of benchmarks.sanitize, within LIMIT seconds
    local dir=$1 limit=$2 tool
    shift 2
    for tool in memcheck racecheck; do
        (cd "$dir" && PYTHONPATH="$site:$dir" timeout $((limit + 30)) compute-sanitizer --tool $tool \
            --error-exitcode 1 python3 -m benchmarks.sanitize > "$R/$tool.log" 2>&1
            echo "$tool rc $?" >> "$R/$tool.log") &
    done
    (cd "$dir" && PYTHONPATH="$site:$dir" timeout "$limit" python3 -m pytest -m gpu -q -rs -p no:cacheprovider \
        -n 4 "$@" > "$R/tests.log" 2>&1)
    echo "tests rc $?"; tail -2 "$R/tests.log"; grep -E "^FAILED" "$R/tests.log" | head
    wait
    tail -n 3 "$R"/memcheck.log "$R"/racecheck.log
}

no_yield_rows() {  # no_yield_rows LOG: the no_yield rows of a bench_persistent log, one line each
    # (dtype, shape, item, variant, items, one launch, grid decode us, persistent us, ratio, outputs finite)
    grep no_yield "$1" | python3 -c '
import json, sys
for line in sys.stdin:
    d = json.loads(line)
    print(d["dtype"], d["B"], d["Hq"], d["Hkv"], d["ctx"], d.get("item"), d.get("variant", "default"), d["items"],
          d["one_launch"], round(d["paged_ms"] * 1e3, 2), round(d["persistent_ms"] * 1e3, 2), round(d["ratio"], 4),
          d["out_finite"])'
}

persistent_rows() {  # persistent_rows NAME TREE SHAPES: in TREE, bench_persistent's no-yield rows (FP16,
    # INT4, INT2 at SHAPES, queued), printed and logged to $R/NAME.log
    (cd "$2" && OUT=$R PYTHONPATH="$site:$2" timeout 200 python3 -m benchmarks.bench_persistent \
        --shapes "$3" --dtypes fp16,int4,int2 --skip-latency --skip-yields --queued > "$R/$1.log" 2>&1)
    echo "== $1 rc $?"; grep -E "no_yield" "$R/$1.log" | head -12
}

persistent_ab() {  # persistent_ab NAME DIFF SHAPES [LIMIT]: the persistent GPU tests on a copy of this
    # tree with DIFF applied (/tmp/NAME; log NAME-tests.log; LIMIT seconds, 200 by default), then
    # persistent_rows at SHAPES, this tree ("main-N") against the copy ("NAME-N"), two rounds alternating
    patched_copy "/tmp/$1" "$2" || return 1
    (cd "/tmp/$1" && PYTHONPATH="$site:/tmp/$1" timeout "${4:-200}" python3 -m pytest -m gpu -q -p no:cacheprovider \
        -n 8 tests/cuda/attention/test_persistent.py > "$R/$1-tests.log" 2>&1)
    echo "$1 tests rc $?"; tail -n 2 "$R/$1-tests.log"; grep -E "^(FAILED|ERROR)" "$R/$1-tests.log" | head
    local round
    for round in 1 2; do
        persistent_rows "main-$round" "$PWD" "$3"
        persistent_rows "$1-$round" "/tmp/$1" "$3"
    done
}
