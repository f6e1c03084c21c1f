"""The ``ab`` call's rows of one tree, in one process (each kernel compiled once): for
``--rounds`` rounds, every shape of SHAPES with every dtype and the DecodeOptions variants of
VARIANTS (bench_decode's), timed queued (``bench_decode.rows_for``, no peers). Rows carry
``round``; JSON into $OUT as decode_<--name>.json (``gpu_common.save``).

    python benchmarks/experiments/2026-12-07-s62/ab_rows.py --name NAME [--rounds 2]
"""
import sys

from benchmarks.bench_decode import option_variants, rows_for
from benchmarks.gpu_common import QUEUE_NS, flag_value, save

SHAPES = [(1, 32, 8, 1024), (1, 32, 8, 32768), (1, 32, 8, 131072), (32, 64, 8, 4096), (128, 32, 8, 2048)]
VARIANTS = ("", " ctas 3", " cap 128")  # the default; splits sized for three CTAs an SM; the capped kernel
B1_ONLY = (" ctas 3", " cap 128")  # variants timed at B=1 only

argv = sys.argv[1:]
name, rounds = flag_value(argv, "--name", "ab"), int(flag_value(argv, "--rounds", "2"))
every = option_variants()
rows = []
for rnd in range(1, rounds + 1):
    for shape in SHAPES:
        variants = {v: every[v] for v in VARIANTS if shape[0] == 1 or v not in B1_ONLY}
        for row in rows_for(shape, variants=variants, peers=False, flex=False, queue_ns=QUEUE_NS):
            row["round"] = rnd
            rows.append(row)
            print(rnd, row["kernel"], shape, round(row["ms"] * 1e3, 2), flush=True)
save(f"decode_{name}", rows, table=False)
