"""The default split policy's pick at every timed shape, beside the fastest count timed there.

    python -m benchmarks.split_regret [--sms 132] RESULT.json [RESULT.json ...]

Each file is ``bench_decode``'s or ``bench_splits``' JSON (``split_fit.rows_from_json``). Per
(dtype, batch, query heads, KV heads, context) timed: the split count and cluster size that
``launcher.split_blocks_for`` picks as it would on an H200 (``--sms`` SMs, sm_90's cluster
rule, the resident CTAs per SM the rows ran at most often, one wave for an INT4/INT2 grid whose
items fit the uncapped kernel's), the median time of that pick where it was timed ("untimed"
where not), the fastest median timed, and ``regret`` = pick / fastest - 1 (not modelled:
``_choose_kernel``'s fall back to the capped kernel where even one split per item overfills
the uncapped kernel's wave, and FP16's uncapped kernel, which it takes only where its wave
keeps the capped kernel's count or leaves items of at most 128 blocks unsplit: this reads FP16
rows as the capped kernel's pick, which at B=32 4k is 2 splits where 1 runs). Where
``split_fit`` asks which timed count the fitted *model* ranks first, this asks what the
*policy* launches, over every count it may choose.
"""

from __future__ import annotations

import collections
import sys

import numpy as np

from benchmarks.split_fit import BS, DTYPES, items_and_heads, rows_and_sms


def policy_pick(key: tuple, ctas_per_sm: int, sms: int) -> tuple[int, int]:
    """(splits, cluster) the default policy launches for ``key`` = (dtype, batch, hq, hkv,
    ctx) with ``ctas_per_sm`` resident CTAs per SM on ``sms`` SMs of compute capability 9.0."""
    from hexcore.cuda.attention import launcher
    from hexcore.cuda.attention.kernel import MAX_CLUSTER
    from hexcore.cuda.attention.options import DEFAULT_OPTIONS

    dtype, batch, hq, hkv, ctx = key
    items, heads = items_and_heads(dict(batch=batch, hq=hq, hkv=hkv))
    blocks, bits = -(-ctx // BS), DTYPES[dtype]
    one_wave = bits < 16 and items <= launcher.UNCAPPED_CTAS_PER_SM * sms
    slots = ctas_per_sm * sms

    def cluster(splits: int) -> int:
        return DEFAULT_OPTIONS.cluster((9, 0), splits, MAX_CLUSTER, items * splits / slots)

    split_blocks = launcher._search_split_blocks(items, blocks, ctas_per_sm, DEFAULT_OPTIONS, bits, one_wave,
                                                 lambda splits, fill: cluster(splits) > 1, heads, sms)
    splits = -(-blocks // split_blocks)
    return splits, cluster(splits) if splits > 1 else 1


def policy_regrets(rows: list[dict], sms: int = 132) -> list[dict]:
    """Per timed (dtype, shape): ``pick`` (splits, cluster), ``pick_us`` (None: untimed),
    ``best``, ``best_us`` and ``regret`` (None where untimed)."""
    times = collections.defaultdict(lambda: collections.defaultdict(list))
    ctas = collections.defaultdict(collections.Counter)
    for r in rows:
        key = (r["dtype"], r["batch"], r["hq"], r["hkv"], r["ctx"])
        times[key][(r["splits"], r["cluster"])].append(r["us"])
        ctas[key][r["ctas_per_sm"]] += 1
    out = []
    for key in sorted(times, key=lambda k: (list(DTYPES).index(k[0]), k[1:])):
        median = {c: float(np.median(v)) for c, v in times[key].items()}
        pick, best = policy_pick(key, ctas[key].most_common(1)[0][0], sms), min(median, key=median.get)
        pick_us = median.get(pick)
        out.append(dict(shape=key, pick=pick, pick_us=pick_us, best=best, best_us=median[best],
                        regret=None if pick_us is None else pick_us / median[best] - 1))
    return out


def main(argv) -> None:
    table = policy_regrets(*rows_and_sms(argv, "split_regret"))
    tag = lambda c: f"{c[0]}{' cl' if c[1] > 1 else ''}"  # noqa: E731
    for r in table:
        timed = "untimed" if r["pick_us"] is None else f"{r['pick_us']:.2f} us, regret {100 * r['regret']:.1f}%"
        print(f"{r['shape']}: policy {tag(r['pick'])} {timed}; fastest {tag(r['best'])} {r['best_us']:.2f} us")
    for dtype in DTYPES:
        mine = [r["regret"] for r in table if r["shape"][0] == dtype and r["regret"] is not None]
        untimed = sum(r["regret"] is None for r in table if r["shape"][0] == dtype)
        if mine:
            print(f"{dtype}: mean regret {100 * np.mean(mine):.2f}%, max {100 * max(mine):.1f}% over {len(mine)} "
                  f"shapes ({untimed} picks untimed)")


if __name__ == "__main__":
    main(sys.argv[1:])
