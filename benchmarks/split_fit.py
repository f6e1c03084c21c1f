"""Fit the split policy's costs (``options.SPLIT_COSTS``) to timed decodes.

    python -m benchmarks.split_fit [--sms 132] RESULT.json [RESULT.json ...]

Each file is ``bench_decode``'s JSON (its ``hexcore <dtype>[ variant]`` rows: batch, heads,
context, grid, cluster, resident CTAs per SM, ms; variants that change the kernel or the
launch, not the split choice, left out: ``KERNEL_VARIANTS``) or ``bench_splits``' (its timed
rows). Only launches whose CTAs are all resident at once, and clusters only where the
default rule launches them, are fitted (where the split count is a choice: in the
twenty-ninth session's files, B = 1-64). The model is the policy's own
price (``launcher.split_cost``), split into its parts, with one set of microsecond costs for
every dtype and each dtype its own block time ``u`` and constant ``a``:

    us = a[dtype] + u[dtype] * load + cta * k + merge * s * h / 4 [workspace]
         + cluster_merge * s * h / 4 [cluster] - cluster_saving [cluster]

(``load``: the busiest SM's blocks at full occupancy, ``k``: its CTAs, ``s``: splits, ``h``:
query heads per CTA), least squares on relative error. Printed: the costs, each dtype's
``SplitCosts`` (the microsecond costs over its ``u``), the relative rms error, and per shape
the split count the fitted costs rank cheapest among those timed beside the fastest
(``regret``: its time over the fastest's, minus 1).
"""

from __future__ import annotations

import collections
import json
import sys

import numpy as np

BS = 32  # bench_decode's block size
# bench_decode variants (``option_variants``) that change the kernel or its launch, not only
# the split count: their times are not the split policy's to fit or judge
KERNEL_VARIANTS = ("prefetch", "register cap", "cap 128", "softmax", "fp16 in merge", "dependent launch",
                   "plain launch", "verify", "unsplit uncapped")
DTYPES = {"fp16": 16, "int4": 4, "int2": 2}


def spread(bits: int) -> float:
    """The share of the SMs clusters of 3-8 CTAs spread over for ``bits``: the default
    ``SplitCosts.cluster_spread`` (a choice the fit takes as given, not a fitted value)."""
    from hexcore.cuda.attention.options import SPLIT_COSTS

    return SPLIT_COSTS[bits].cluster_spread


def rows_from_json(path: str) -> list[dict]:
    """The timed rows of one ``bench_decode`` or ``bench_splits`` JSON file as dicts of dtype,
    batch, hq, hkv, ctx, splits, cluster (CTAs per cluster, 1: the workspace merge),
    ctas_per_sm, us."""
    rows = json.load(open(path))["rows"]
    if any("shape" in r for r in rows):
        return rows_from_splits(rows)
    return rows_from_decode(rows)


def rows_from_splits(rows: list[dict]) -> list[dict]:
    """``rows_from_json`` of ``bench_splits``' rows (those timed)."""
    return [dict(dtype=r["dtype"], batch=r["shape"][0], hq=r["shape"][1], hkv=r["shape"][2], ctx=r["shape"][3],
                 splits=r["splits"], cluster=r["cluster"], ctas_per_sm=r["kernel_ctas_per_sm"], us=r["ms"] * 1e3)
            for r in rows if "ms" in r]


def rows_from_decode(rows: list[dict]) -> list[dict]:
    """``rows_from_json`` of ``bench_decode``'s rows (its ``hexcore <dtype>[ variant]`` ones,
    none of ``KERNEL_VARIANTS``)."""
    out = []
    for r in rows:
        parts = r["kernel"].split()
        variant = " ".join(parts[2:])
        if parts[0] != "hexcore" or parts[1] not in DTYPES or not r.get("grid") \
                or any(name in variant for name in KERNEL_VARIANTS):
            continue
        out.append(dict(dtype=parts[1], batch=r["B"], hq=r["Hq"], hkv=r["Hkv"], ctx=r["ctx"], splits=r["grid"][0],
                        cluster=r.get("cluster") or 1, ctas_per_sm=r["ctas_per_sm"], us=r["ms"] * 1e3))
    return out


def items_and_heads(row: dict) -> tuple[int, int]:
    """(CTAs per split, query heads of the fullest CTA) of a row, as the launcher counts them
    (``DecodeShape.head_groups``: groups of ``HEADS_PER_CTA`` query heads)."""
    from hexcore.cuda.attention.shape import HEADS_PER_CTA

    group = row["hq"] // row["hkv"]
    return row["batch"] * row["hkv"] * -(-group // HEADS_PER_CTA), min(group, HEADS_PER_CTA)


def parts(row: dict, sms: int) -> list[float]:
    """The row's price split into its parts: [load, k, workspace merge units, cluster merge
    units, -1 if clustered], each from ``launcher.split_cost`` with one unit cost set."""
    from hexcore.cuda.attention.launcher import split_cost
    from hexcore.cuda.attention.options import SplitCosts

    items, heads = items_and_heads(row)
    share, clustered = spread(DTYPES[row["dtype"]]), row["cluster"] > 1
    args = (items, row["splits"], -(-row["ctx"] // BS), row["ctas_per_sm"])

    def price(cta=0.0, merge=0.0, cluster_merge=0.0, saving=0.0):
        costs = SplitCosts(cta, merge, cluster_merge, saving, cluster_spread=share)
        return split_cost(*args, costs, heads, clustered, sms)

    load = price()
    return [load, price(cta=1) - load, price(merge=1) - load, price(cluster_merge=1) - load, price(saving=1) - load]


def one_wave(rows: list[dict], sms: int = 132) -> list[dict]:
    """The rows ``fit`` takes: those whose CTAs were all resident at once on ``sms`` SMs,
    clustered ones only where the default cluster rule launches clusters (at most
    ``CLUSTER_MAX_FILL`` of the wave: past it a cluster's CTAs may wait for a second wave,
    which the model does not price)."""
    from hexcore.cuda.attention.options import CLUSTER_MAX_FILL

    def fits(r):
        fill = items_and_heads(r)[0] * r["splits"] / (r["ctas_per_sm"] * sms)
        return fill <= 1 and (r["cluster"] == 1 or fill <= CLUSTER_MAX_FILL)

    return [r for r in rows if fits(r)]


def fit(rows: list[dict], sms: int = 132) -> dict:
    """The least-squares fit (relative error) of one-wave ``rows``: ``a`` and ``u`` per dtype,
    the shared microsecond costs, ``costs`` (bits -> SplitCosts) and ``rel_rms`` per dtype."""
    from hexcore.cuda.attention.options import SplitCosts

    rows = one_wave(rows, sms)
    dtypes = sorted({r["dtype"] for r in rows}, key=list(DTYPES).index)
    design = []
    for r in rows:
        load, per_sm, merge, cluster_merge, saving = parts(r, sms)
        one_hot = [float(r["dtype"] == d) for d in dtypes]
        design.append(one_hot + [load * h for h in one_hot] + [per_sm, merge, cluster_merge, saving])
    design, times = np.array(design), np.array([r["us"] for r in rows])
    weight = 1 / times
    solution, *_ = np.linalg.lstsq(design * weight[:, None], times * weight, rcond=None)
    n = len(dtypes)
    cta, merge, cluster_merge, saving = (float(x) for x in solution[2 * n:])
    out = dict(a={}, u={}, costs={}, rel_rms={}, us=dict(cta=cta, merge=merge, cluster_merge=cluster_merge,
                                                          cluster_saving=saving), rows=rows)
    predicted = design @ solution
    for i, d in enumerate(dtypes):
        u = float(solution[n + i])
        if not u > 0:
            raise ValueError(f"{d}: the fitted block time is {u:.3g} us, not positive: too few or too alike rows")
        out["a"][d], out["u"][d] = float(solution[i]), u
        out["costs"][DTYPES[d]] = SplitCosts(*(max(0.0, round(x / u, 3)) for x in (cta, merge, cluster_merge, saving)),
                                             cluster_spread=spread(DTYPES[d]))
        mine = [j for j, r in enumerate(rows) if r["dtype"] == d]
        out["rel_rms"][d] = float(np.sqrt(np.mean(((predicted[mine] - times[mine]) / times[mine]) ** 2)))
    out["predicted"] = predicted
    return out


def regrets(rows: list[dict], predicted) -> list[dict]:
    """Per (dtype, shape): the split count (and cluster) the model ranks cheapest among the
    timed ones (median per count), its time, the fastest's, and ``regret``."""
    by = collections.defaultdict(lambda: collections.defaultdict(list))
    for r, p in zip(rows, predicted):
        by[(r["dtype"], r["batch"], r["hq"], r["hkv"], r["ctx"])][(r["splits"], r["cluster"])].append((r["us"], p))
    out = []
    for key, counts in sorted(by.items()):
        median = {c: (float(np.median([t for t, _ in v])), float(np.mean([p for _, p in v])))
                  for c, v in counts.items()}
        best = min(median, key=lambda c: median[c][0])
        pick = min(median, key=lambda c: median[c][1])
        out.append(dict(shape=key, pick=pick, pick_us=median[pick][0], best=best, best_us=median[best][0],
                        regret=median[pick][0] / median[best][0] - 1))
    return out


def rows_and_sms(argv, tool: str) -> tuple[list[dict], int]:
    """(timed rows of every file named, SMs) from ``[--sms 132] RESULT.json ...`` (``tool``:
    the module named in the usage message)."""
    sms = int(argv[argv.index("--sms") + 1]) if "--sms" in argv else 132
    paths = [a for i, a in enumerate(argv) if a != "--sms" and (i == 0 or argv[i - 1] != "--sms")]
    if not paths:
        raise SystemExit(f"usage: python -m benchmarks.{tool} [--sms 132] RESULT.json [RESULT.json ...]")
    return [r for path in paths for r in rows_from_json(path)], sms


def main(argv) -> None:
    rows, sms = rows_and_sms(argv, "split_fit")
    result = fit(rows, sms)
    print("shared costs (us): " + ", ".join(f"{k} {v:.4f}" for k, v in result["us"].items()))
    for d in result["u"]:
        print(f"{d}: a {result['a'][d]:.2f} us, u {result['u'][d]:.4f} us per block, rel rms "
              f"{result['rel_rms'][d]:.3f}, {result['costs'][DTYPES[d]]}")
    table = regrets(result["rows"], result["predicted"])
    for r in table:
        tag = lambda c: f"{c[0]}{' cl' if c[1] > 1 else ''}"  # noqa: E731
        print(f"{r['shape']}: picks {tag(r['pick'])} {r['pick_us']:.2f} us, fastest {tag(r['best'])} "
              f"{r['best_us']:.2f} us, regret {100 * r['regret']:.1f}%")
    for d in result["u"]:
        mine = [r["regret"] for r in table if r["shape"][0] == d]
        print(f"{d}: mean regret {100 * np.mean(mine):.2f}%, max {100 * max(mine):.1f}% over {len(mine)} shapes")


if __name__ == "__main__":
    main(sys.argv[1:])
