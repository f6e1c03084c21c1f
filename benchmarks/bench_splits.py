"""The decode's split policy on the GPU: time per split count, the policy's regret, and a
fit of its costs (``benchmarks.split_fit``) to the rows.

    python -m benchmarks.bench_splits [--shapes 1x32x8x32768,1x32x8x131072] [--dtypes fp16,int4,int2]
        [--ctas 1,2,4,8,16|auto] [--min-blocks 4,8,16,32] [--split-blocks 8,11,12,16]
        [--cluster-merge auto|on|off|both] [--policy]

Each shape (``BxHqxHkvxctx``) and dtype is decoded with ``DecodeOptions(ctas_per_sm=c,
min_split_blocks=n, split_costs=LOAD_ONLY)`` for each ``c`` of ``--ctas`` (``auto``: the
kernel's own occupancy) and ``n`` of ``--min-blocks`` (default 4, the option's default), timed
with CUDA events (``bench_decode.decode_case``). ``LOAD_ONLY`` prices the busiest SM's blocks
alone (no CTA or merge costs), so the policy splits as finely as that load rewards and ``n``,
the shortest split, steers the count below that (``--ctas auto --min-blocks 4,8,16,32``: 4
counts per shape); ``c`` changes the rounds of resident CTAs the policy assumes. ``--policy``
also times each shape with the default options and prints the policy's regret: its time over
the fastest row's of that shape (``policy_regret``). ``--split-blocks``: rows of fixed split
lengths instead (``DecodeOptions(split_blocks=n)``, each ``c`` of ``--ctas`` too): any count,
where the load-only steer reaches only those its price ranks first (a split's blocks are
priced as its busiest warp's, so lengths short of a multiple of four tie with the next
one and the fewer splits win). Then per run, where at least 8 rows fit
in one wave, ``split_fit.fit`` over them: the microsecond costs and each dtype's
``SplitCosts`` (the defaults, ``options.SPLIT_COSTS``, come from that fit over many more
shapes: ``benchmarks/RESULTS.md``, twenty-ninth session). Rows as JSON under $OUT
(``gpu_common.save``, name "splits").
"""

from __future__ import annotations

import gc
import sys

from benchmarks.bench_decode import BS


def sweep(shapes, dtypes, ctas, clusters=(None,), min_blocks=(4,), policy=False, fixed=()) -> list[dict]:
    """Rows per shape, dtype, ``ctas_per_sm`` steer (None: the kernel's own), ``min_split_blocks``
    of ``min_blocks`` (or, where ``fixed`` is given, ``split_blocks`` of ``fixed`` instead) and
    ``DecodeOptions.cluster_merge`` value of ``clusters`` (None: the default rule; True: each
    item's 2-8 splits as a cluster); ``policy``: one more row per shape and dtype with the
    default options (the split policy's own count, ``policy`` True)."""
    from hexcore.cuda import DecodeOptions, SplitCosts
    from hexcore.cuda.attention import launcher

    load_only = SplitCosts(0, 0, 0, 0)
    sms = launcher.policy_sms()  # (the simulator: an H200's, as the policy prices it there)
    rows = []
    for shape in shapes:
        for dtype in dtypes:
            for c, n, cluster in ((c, n, cluster) for c in ctas for n in fixed or min_blocks for cluster in clusters):
                steer = dict(split_blocks=n) if fixed else dict(min_split_blocks=n, split_costs=load_only)
                options = DecodeOptions(ctas_per_sm=c, cluster_merge=cluster, **steer)
                rows.append(timed_row(dtype, shape, options, sms, ctas=c, min_blocks=None if fixed else n,
                                      split_blocks=n if fixed else None, cluster_merge=cluster, policy=False))
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
               kernel_ctas_per_sm=info["ctas_per_sm"], cluster=info.get("cluster", 1), sms=sms)
    fixed = labels.get("split_blocks")
    steer = "policy" if labels.get("policy") else f"ctas {labels['ctas']!s:4s} " + (
        f"fixed {fixed:3d}" if fixed else f"min {labels['min_blocks']:3d}")
    print(f"{dtype:5s} {shape} {steer} cluster_merge {labels['cluster_merge']!s:5s}: {splits:4d} splits of "
          f"{row['blocks']:4d} blocks, cluster {row['cluster']}, {waves} wave(s), {ms:.5f} ms", flush=True)
    del store
    gc.collect()
    return row


def fit_costs(rows: list[dict]) -> dict | None:
    """``split_fit.fit`` over the timed rows (printed), or None (and says so) with fewer than
    8 rows whose CTAs fit in one wave."""
    from benchmarks import split_fit

    timed = split_fit.rows_from_splits(rows)
    sms = next((r["sms"] for r in rows if "sms" in r), 132)
    one_wave = split_fit.one_wave(timed, sms)
    if len(one_wave) < 8:
        print(f"too few rows to fit the split costs ({len(one_wave)} in one wave, at least 8)")
        return None
    result = split_fit.fit(one_wave, sms)
    print("split costs (us): " + ", ".join(f"{k} {v:.4f}" for k, v in result["us"].items()))
    for bits, costs in result["costs"].items():
        print(f"  {bits}-bit: {costs}")
    return dict(fit=dict(us=result["us"], costs={str(b): c.__dict__ for b, c in result["costs"].items()}))


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
    from benchmarks.gpu_common import flag_value

    def arg(flag, default):
        return flag_value(argv, flag, default)

    shapes = [tuple(int(x) for x in s.split("x")) for s in arg("--shapes", "1x32x8x32768,1x32x8x131072").split(",")]
    dtypes = arg("--dtypes", "fp16,int4,int2").split(",")
    ctas = [None if c == "auto" else int(c) for c in arg("--ctas", "1,2,4,8,16").split(",")]
    min_blocks = [int(n) for n in arg("--min-blocks", "4").split(",")]
    fixed = [int(n) for n in arg("--split-blocks", "").split(",") if n]
    clusters = {"auto": (None,), "on": (True,), "off": (False,), "both": (False, True)}[arg("--cluster-merge", "auto")]
    rows = sweep(shapes, dtypes, ctas, clusters, min_blocks, policy="--policy" in argv, fixed=fixed)
    fitted = fit_costs(rows)
    if fitted is not None:
        rows.append(fitted)
    for r in policy_regret(rows):
        print(f"{r['dtype']} {r['shape']}: the policy's {r['policy_splits']} splits (cluster {r['policy_cluster']}) "
              f"{r['policy_ms']:.5f} ms, the fastest {r['best_splits']} (cluster {r['best_cluster']}) "
              f"{r['best_ms']:.5f} ms: regret {100 * r['regret']:.1f}%")
        rows.append(dict(regret=r))
    from benchmarks.gpu_common import save

    save("splits", rows)


if __name__ == "__main__":
    main(sys.argv[1:])
