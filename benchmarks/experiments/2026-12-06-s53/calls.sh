#!/usr/bin/env bash
# GPU calls of the fifty-third session and those it leaves owed (NEXT.md), run from the
# repository root on the lent GPU with .whl/ carried; results into $OUT. Each mode chooses its
# work by the GPU it lands on, so back-to-back calls need no decision between them (a machine
# idle for 30 s is given back).
# Run this session (on an H100, at 2452030 with weight-table.diff rebased):
#   a: on an H200, s50 "h200" (~400 s); on an H100, s52 "table" (~500 s) then s52 "smem" (~30 s).
#   b: on an H200, s52 "table" then "smem"; on an H100, s51 "cap2" (~530 s).
# Owed (NEXT.md), on the tree as landed:
#   1 (~330 s): every gpu-marked test (s51 "tests").
#   2: on an H200, s50 "h200" (~400 s: INT2's source page and stalls, issue 12's table with its
#      peers, two checked layers a step); on an H100, s51 "sanitize" (~390 s: four sanitizers
#      over all of benchmarks.sanitize).
#   3: on an H200, s51 "sanitize"; on an H100, s52 "b1-source" (~120 s, issue 17).
set -u
s50=benchmarks/experiments/2026-12-06-s50/calls.sh
s51=benchmarks/experiments/2026-12-06-s51/calls.sh
s52=benchmarks/experiments/2026-12-06-s52/calls.sh
h200() { nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; }
case "${1:-}" in
a) if h200; then bash $s50 h200; else bash $s52 table; bash $s52 smem; fi ;;
b) if h200; then bash $s52 table; bash $s52 smem; else bash $s51 cap2; fi ;;
1) bash $s51 tests ;;
2) if h200; then bash $s50 h200; else bash $s51 sanitize; fi ;;
3) if h200; then bash $s51 sanitize; else bash $s52 b1-source; fi ;;
*) echo "usage: $0 a|b|1|2|3" >&2; exit 2 ;;
esac
