"""The ``ab`` call's rows of one tree, in one process (each kernel compiled once): for
``--rounds`` rounds, every shape of SHAPES with every dtype under its DecodeOptions variants,
timed queued (``bench_decode.rows_for``, no peers). Rows carry ``round``; JSON into $OUT as
decode_<--name>.json (``gpu_common.save``).

At B=1 the variants set the split count, since the split policy's own choice ("ctas 3"
included) stays at 32 splits at 32k: 49 splits (21 blocks each: 392 CTAs, one wave of the
uncapped kernel's three an SM) and, with the kernel capped at 128 registers (four an SM), 64
(512 CTAs). They test whether a cheaper merge makes more splits, so more warps an SM, pay.

    python benchmarks/experiments/2026-12-07-s62/ab_rows.py --name NAME [--rounds 2]
"""
import sys

from benchmarks.bench_decode import rows_for
from benchmarks.gpu_common import QUEUE_NS, flag_value, save
from hexcore.cuda import DecodeOptions

DEFAULT = {"": None}
SHAPES = {  # shape -> its variants (name -> DecodeOptions; None: the defaults)
    (1, 32, 8, 1024): DEFAULT,  # (a cluster merge at the default: a control)
    (1, 32, 8, 32768): {"": None, " splits 49": DecodeOptions(split_blocks=21),
                        " cap 128 splits 64": DecodeOptions(max_registers=128, split_blocks=16)},
    (1, 32, 8, 131072): {"": None, " cap 128 splits 64": DecodeOptions(max_registers=128, split_blocks=64)},
    (32, 64, 8, 4096): DEFAULT,
    (128, 32, 8, 2048): DEFAULT,
}

argv = sys.argv[1:]
name, rounds = flag_value(argv, "--name", "ab"), int(flag_value(argv, "--rounds", "2"))
rows = []
for rnd in range(1, rounds + 1):
    for shape, variants in SHAPES.items():
        for row in rows_for(shape, variants=variants, peers=False, flex=False, queue_ns=QUEUE_NS):
            row["round"] = rnd
            rows.append(row)
            print(rnd, row["kernel"], shape, row.get("grid"), round(row["ms"] * 1e3, 2), flush=True)
save(f"decode_{name}", rows, table=False)
