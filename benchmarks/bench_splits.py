"""The decode's split policy on the GPU: time per split count, and a fit of the merge's cost
per split (``DecodeOptions.split_merge_cost``) for each dtype.

    python -m benchmarks.bench_splits [--shapes 1x32x8x32768,1x32x8x131072] [--dtypes fp16,int4,int2]
        [--ctas 1,2,4,8,16|auto] [--min-blocks 4,8,16,32] [--cluster-merge auto|on|off|both]

Each shape (``BxHqxHkvxctx``) and dtype is decoded with ``DecodeOptions(ctas_per_sm=c,
min_split_blocks=n)`` for each ``c`` of ``--ctas`` (``auto``: the kernel's own occupancy) and
``n`` of ``--min-blocks`` (default 4, the option's default), and no merge term
(``split_merge_cost=0``: the count is the steer's alone), timed with CUDA events
(``bench_decode.decode_case``). ``c`` steers the split count where the grid needs more than one
wave (about ``c`` x SMs / items splits per (sequence, KV head)); at B=1 every count up to one
wave fits and the policy takes the most, so there ``n`` steers it: the splits at least ``n``
blocks long (``--ctas auto --min-blocks 4,8,16,32`` times 4 counts per shape). Then per dtype,
over all its rows, the least-squares fit

    ms = a * waves * blocks_per_split + m * splits + c_shape        (one constant per shape)

(``waves``: the grid's CTAs over the kernel's resident CTAs on the GPU, which ``ctas_per_sm``
does not change; rows merged in a cluster, ``--cluster-merge on`` or ``both``, are left out of the
fit) and ``split_merge_cost = m / a``: the merge's cost per split in blocks of
that dtype's work. On the eleventh session's sweep (B=1, 32k and 128k, before the merge
rewrite) ``m`` came out at 0.13-0.17 us per split for every dtype (the partials are float32
whatever the cache's dtype) and ``a`` at 0.1-0.33 us per block, so the cost in blocks
differs by dtype and context (FP16 about 0.5, INT4/INT2 0.8-1.5).
Printed per row: splits, blocks per split, ms; per dtype: a, m, the cost, and for each shape
the split count the policy picks without a merge term and with the fitted cost. Rows as JSON under $OUT
(``gpu_common.save``, name "splits").
"""

from __future__ import annotations

import gc
import sys

import numpy as np

from benchmarks.bench_decode import BS


def fit_merge_cost(rows: list[dict]) -> dict:
    """``rows``: dicts with ``shape``, ``waves``, ``blocks``, ``splits``, ``ms`` (one dtype).
    Returns ``a`` (ms per block of a split, per wave), ``m`` (ms per split), ``cost`` (``m /
    a``, blocks per split) and ``constants`` ({shape: ms})."""
    shapes = sorted({tuple(r["shape"]) for r in rows})
    design = np.array([[r["waves"] * r["blocks"], r["splits"]] + [float(tuple(r["shape"]) == s) for s in shapes]
                       for r in rows])
    times = np.array([r["ms"] for r in rows])
    solution, *_ = np.linalg.lstsq(design, times, rcond=None)
    a, m = float(solution[0]), float(solution[1])
    return dict(a=a, m=m, cost=m / a if a > 0 else float("nan"),
                constants={s: float(c) for s, c in zip(shapes, solution[2:])})


def policy_splits(shape, ctas_per_sm: int, merge_cost: float) -> int:
    """Splits per (sequence, KV head) that ``launcher.split_blocks_for`` picks for ``shape``
    with ``merge_cost`` (one head group per KV head, as at Hq / Hkv <= 8)."""
    from hexcore.cuda.attention import launcher
    from hexcore.cuda.attention.options import DecodeOptions

    batch, _, hkv, ctx = shape
    max_virtual = -(-ctx // BS)
    blocks = launcher.split_blocks_for(batch * hkv, max_virtual, ctas_per_sm,
                                       DecodeOptions(split_merge_cost=max(0.0, merge_cost)))
    return -(-max_virtual // blocks)


def sweep(shapes, dtypes, ctas, clusters=(None,), min_blocks=(4,)) -> list[dict]:
    """Rows per shape, dtype, ``ctas_per_sm`` steer (None: the kernel's own), ``min_split_blocks``
    of ``min_blocks`` and ``DecodeOptions.cluster_merge`` value of ``clusters`` (None: the
    default rule; True: each item's 2-8 splits as a cluster)."""
    from numba import cuda

    from benchmarks.bench_decode import decode_case
    from benchmarks.gpu_common import time_gpu
    from hexcore.cuda import DecodeOptions

    sms = getattr(cuda.get_current_device(), "MULTIPROCESSOR_COUNT", 1)  # (the simulator: one)
    rows = []
    for shape in shapes:
        for dtype in dtypes:
            for c, n, cluster in ((c, n, cluster) for c in ctas for n in min_blocks for cluster in clusters):
                options = DecodeOptions(ctas_per_sm=c, min_split_blocks=n, cluster_merge=cluster,
                                        split_merge_cost=0)
                run, nbytes, store, info = decode_case(dtype, *shape, options=options)
                ms = time_gpu(run) * 1e3
                (splits, ys, batch), max_virtual = info["grid"], -(-shape[3] // BS)
                waves = -(-splits * ys * batch // (info["ctas_per_sm"] * sms))
                rows.append(dict(dtype=dtype, shape=list(shape), ctas=c, min_blocks=n, splits=splits, waves=waves,
                                 blocks=-(-max_virtual // splits), ms=ms, TBs=nbytes / ms / 1e9,
                                 kernel_ctas_per_sm=info["ctas_per_sm"], cluster_merge=cluster,
                                 cluster=info.get("cluster", 1)))
                print(f"{dtype:5s} {shape} ctas {c!s:4s} min {n:3d} cluster_merge {cluster!s:5s}: "
                      f"{splits:4d} splits of {rows[-1]['blocks']:4d} blocks, cluster {rows[-1]['cluster']}, "
                      f"{waves} wave(s), {ms:.5f} ms",
                      flush=True)
                del store
                gc.collect()
    return rows


def main(argv) -> None:
    def arg(flag, default):
        return argv[argv.index(flag) + 1] if flag in argv else default

    shapes = [tuple(int(x) for x in s.split("x")) for s in arg("--shapes", "1x32x8x32768,1x32x8x131072").split(",")]
    dtypes = arg("--dtypes", "fp16,int4,int2").split(",")
    ctas = [None if c == "auto" else int(c) for c in arg("--ctas", "1,2,4,8,16").split(",")]
    min_blocks = [int(n) for n in arg("--min-blocks", "4").split(",")]
    clusters = {"auto": (None,), "on": (True,), "off": (False,), "both": (False, True)}[arg("--cluster-merge", "auto")]
    rows = sweep(shapes, dtypes, ctas, clusters, min_blocks)
    for dtype in dtypes:
        own = [r for r in rows if r["dtype"] == dtype and r["cluster"] == 1]  # the workspace merge's cost
        if len(own) < 3:
            print(f"{dtype}: too few rows merged in the workspace to fit its cost")
            continue
        fit = fit_merge_cost(own)
        resident = own[0]["kernel_ctas_per_sm"]
        picks = {str(s): (policy_splits(s, resident, 0.0), policy_splits(s, resident, fit["cost"])) for s in shapes}
        print(f"{dtype}: a {fit['a'] * 1e3:.3f} us per block, m {fit['m'] * 1e3:.3f} us per split, "
              f"split_merge_cost {fit['cost']:.2f} blocks; splits without it / with it: {picks}")
        rows.append(dict(dtype=dtype, fit=dict(a=fit["a"], m=fit["m"], cost=fit["cost"]), picks=picks))
    from benchmarks.gpu_common import save

    save("splits", rows)


if __name__ == "__main__":
    main(sys.argv[1:])
