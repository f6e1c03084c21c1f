"""One tree's rows for the sixty-fifth session's epilogue A/B, in one process (each kernel
compiled once): for ``--rounds`` rounds, five shapes of issue 12's table, FP16/INT4/INT2 at the
defaults, timed queued (``bench_decode.rows_for``); ``--peers``: torch SDPA on contiguous FP16
KV beside them. Rows carry ``round``; JSON into $OUT as decode_<--name>.json.

    python benchmarks/experiments/2026-12-08-s65/ab_rows.py --name NAME [--rounds 2] [--peers]
"""
import sys

from benchmarks.bench_decode import rows_for
from benchmarks.gpu_common import QUEUE_NS, flag_value, save

SHAPES = [(1, 32, 8, 32768), (1, 32, 8, 131072), (16, 32, 8, 16384), (128, 32, 8, 2048), (64, 32, 32, 4096)]

argv = sys.argv[1:]
name, rounds = flag_value(argv, "--name", "ab"), int(flag_value(argv, "--rounds", "2"))
rows = []
for rnd in range(1, rounds + 1):
    for shape in SHAPES:
        for row in rows_for(shape, variants={"": None}, peers="--peers" in argv, flex=False, queue_ns=QUEUE_NS):
            row["round"] = rnd
            rows.append(row)
            print(rnd, row["kernel"], shape, row.get("grid"), round(row["ms"] * 1e3, 2), flush=True)
    save(f"decode_{name}", rows, table=False)  # after every round: a timeout keeps the rounds done
