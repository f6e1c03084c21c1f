"""The decode's split policy on the GPU: time per split count, and a fit of the merge's cost
per split (``DecodeOptions.split_merge_cost``) for each dtype.

    python -m benchmarks.bench_splits [--shapes 1x32x8x32768,1x32x8x131072] [--dtypes fp16,int4,int2]
        [--ctas 1,2,4,8,16|auto] [--min-blocks 4,8,16,32] [--cluster-merge auto|on|off|both] [--policy]

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
the split count the policy picks without a merge term and with the fitted cost. ``--policy``
also times each shape with the default options and prints the policy's regret: its time
over the fastest row's of that shape (``policy_regret``). Rows as JSON under $OUT
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


def sweep(shapes, dtypes, ctas, clusters=(None,), min_blocks=(4,), policy=False) -> list[dict]:
    """Rows per shape, dtype, ``ctas_per_sm`` steer (None: the kernel's own), ``min_split_blocks``
    of ``min_blocks`` and ``DecodeOptions.cluster_merge`` value of ``clusters`` (None: the
    default rule; True: each item's 2-8 splits as a cluster); ``policy``: one more row per
    shape and dtype with the default options (the split policy's own count, ``policy`` True)."""
    from numba import cuda

    from hexcore.cuda import DecodeOptions

    sms = getattr(cuda.get_current_device(), "MULTIPROCESSOR_COUNT", 1)  # (the simulator: one)
    rows = []
    for shape in shapes:
        for dtype in dtypes:
            for c, n, cluster in ((c, n, cluster) for c in ctas for n in min_blocks for cluster in clusters):
                options = DecodeOptions(ctas_per_sm=c, min_split_blocks=n, cluster_merge=cluster,
                                        split_merge_cost=0)
                rows.append(timed_row(dtype, shape, options, sms, ctas=c, min_blocks=n, cluster_merge=cluster,
                                      policy=False))
            if policy:
                rows.append(timed_row(dtype, shape, DecodeOptions(), sms, ctas=None, min_blocks=None,
                                      cluster_merge=None, policy=True))
    return rows


def timed_row(dtype, shape, options, sms: int, **labels) -> dict:
    """One decode of ``shape`` with ``options`` timed (``bench_decode.decode_case``, CUDA
    events): its split count, waves, blocks per split, cluster, ms and TB/s, with ``labels``."""
    from benchmarks.bench_decode import decode_case
    from benchmarks.gpu_common import time_gpu

    run, nbytes, store, info = decode_case(dtype, *shape, options=options)
    ms = time_gpu(run) * 1e3
    (splits, ys, batch), max_virtual = info["grid"], -(-shape[3] // BS)
    waves = -(-splits * ys * batch // (info["ctas_per_sm"] * sms))
    row = dict(dtype=dtype, shape=list(shape), **labels, splits=splits, waves=waves,
               blocks=-(-max_virtual // splits), ms=ms, TBs=nbytes / ms / 1e9,
               kernel_ctas_per_sm=info["ctas_per_sm"], cluster=info.get("cluster", 1))
    steer = "policy" if labels.get("policy") else f"ctas {labels['ctas']!s:4s} min {labels['min_blocks']:3d}"
    print(f"{dtype:5s} {shape} {steer} cluster_merge {labels['cluster_merge']!s:5s}: {splits:4d} splits of "
          f"{row['blocks']:4d} blocks, cluster {row['cluster']}, {waves} wave(s), {ms:.5f} ms", flush=True)
    del store
    gc.collect()
    return row


def policy_regret(rows: list[dict]) -> list[dict]:
    """Per (dtype, shape) with a ``policy`` row: the policy's count and time beside the
    fastest row of that dtype and shape, and ``regret`` = policy ms / fastest ms - 1."""
    out = []
    for row in (r for r in rows if r.get("policy")):
        same = [r for r in rows if "ms" in r and r["dtype"] == row["dtype"] and r["shape"] == row["shape"]]
        best = min(same, key=lambda r: r["ms"])
        out.append(dict(dtype=row["dtype"], shape=row["shape"], policy_splits=row["splits"],
                        policy_cluster=row["cluster"], policy_ms=row["ms"], best_splits=best["splits"],
                        best_cluster=best["cluster"], best_ms=best["ms"], regret=row["ms"] / best["ms"] - 1))
    return out


def main(argv) -> None:
    def arg(flag, default):
        return argv[argv.index(flag) + 1] if flag in argv else default

    shapes = [tuple(int(x) for x in s.split("x")) for s in arg("--shapes", "1x32x8x32768,1x32x8x131072").split(",")]
    dtypes = arg("--dtypes", "fp16,int4,int2").split(",")
    ctas = [None if c == "auto" else int(c) for c in arg("--ctas", "1,2,4,8,16").split(",")]
    min_blocks = [int(n) for n in arg("--min-blocks", "4").split(",")]
    clusters = {"auto": (None,), "on": (True,), "off": (False,), "both": (False, True)}[arg("--cluster-merge", "auto")]
    rows = sweep(shapes, dtypes, ctas, clusters, min_blocks, policy="--policy" in argv)
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
    for r in policy_regret(rows):
        print(f"{r['dtype']} {r['shape']}: the policy's {r['policy_splits']} splits (cluster {r['policy_cluster']}) "
              f"{r['policy_ms']:.5f} ms, the fastest {r['best_splits']} (cluster {r['best_cluster']}) "
              f"{r['best_ms']:.5f} ms: regret {100 * r['regret']:.1f}%")
        rows.append(dict(regret=r))
    from benchmarks.gpu_common import save

    save("splits", rows)


if __name__ == "__main__":
    main(sys.argv[1:])
