#!/usr/bin/env bash
# GPU calls owed after the fifty-sixth session, run from the repository root on the lent GPU with
# .whl/ carried; results into $OUT. The one-launch call (issue 17) landed in this session; its
# sanitizer run was cut by the call's limit (the INT4/INT2 part reached "sanitize run complete"
# under all four tools without printing an error, but not their summaries, at its 250 s limit;
# the format-by-age part did not finish), so each part gets a call of its own here:
#   sanitize-int (~300-500 s, any GPU): memcheck, racecheck, initcheck and synccheck at once over
#      benchmarks.sanitize --dtypes int4,int2 --no-tiered (the persistent part runs one-launch
#      calls), limit 540 s.
#   sanitize-tiered (~150-250 s, any GPU): the same over benchmarks.sanitize --tiered, limit 400 s.
#   h200 (~400 s, an H200 only): the fifty-fifth session's `h200` (issue 12's table with its peers,
#      INT2's source page and stalls, two checked layers a step).
set -u
source benchmarks/experiments/device-site.sh  # site, R
sanitize_part() {  # sanitize_part NAME LIMIT ARGS: the four sanitizers over benchmarks.sanitize ARGS
    OUT=$R/$1 HEXCORE_GPU_CHECK=sanitize HEXCORE_SANITIZERS="memcheck racecheck initcheck synccheck" \
        HEXCORE_SANITIZE_ARGS="$3" timeout "$2" scripts/gpu-check > "$R/$1-stage.log" 2>&1
    echo "== $3 rc $?"; grep -hE "ERROR SUMMARY|RACECHECK SUMMARY|exit" "$R/$1"/*.log "$R/$1-stage.log" | head -8
}
case "${1:-}" in
sanitize-int) sanitize_part int 540 "--dtypes int4,int2 --no-tiered" ;;
sanitize-tiered) sanitize_part tiered 400 "--tiered" ;;
h200) bash benchmarks/experiments/2026-12-07-s55/calls.sh h200 ;;
*) echo "usage: $0 sanitize-int|sanitize-tiered|h200" >&2; exit 2 ;;
esac
