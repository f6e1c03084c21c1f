"""benchmarks.split_fit: the split policy's costs fitted to timed decodes."""

import json

import numpy as np
import pytest

from benchmarks import split_fit
from hexcore.cuda.attention.options import SplitCosts

TRUE_US = dict(cta=0.9, merge=0.03, cluster_merge=0.05, cluster_saving=2.0)  # microseconds
BLOCK_US = {"fp16": 0.47, "int4": 0.15, "int2": 0.12}


def synthetic_rows(rng, noise=1e-3):
    """Times from the model itself (``split_fit.parts``) with TRUE_US, BLOCK_US and a = 5 us,
    over B = 1-4 x 32/8 and 32/4 at 1k-32k, 2-64 splits, workspace and cluster merges."""
    rows = []
    for dtype in BLOCK_US:
        for batch, hkv, ctx in ((1, 8, 1024), (1, 8, 8192), (1, 8, 32768), (2, 8, 4096), (4, 4, 2048), (1, 4, 16384)):
            for splits, cluster in ((2, 2), (4, 4), (8, 8), (4, 1), (8, 1), (16, 1), (32, 1), (64, 1)):
                row = dict(dtype=dtype, batch=batch, hq=32, hkv=hkv, ctx=ctx, splits=splits, cluster=cluster,
                           ctas_per_sm=3, us=0.0)
                load, k, merge, cluster_merge, saving = split_fit.parts(row, 132)
                us = 5 + BLOCK_US[dtype] * load + TRUE_US["cta"] * k + TRUE_US["merge"] * merge \
                    + TRUE_US["cluster_merge"] * cluster_merge + TRUE_US["cluster_saving"] * saving
                row["us"] = us * (1 + noise * rng.standard_normal())
                rows.append(row)
    return rows


def test_the_fit_recovers_the_costs_of_its_own_model():
    """Times made by the policy's own price with known costs (0.1% noise): the fit gives them
    back, each dtype's SplitCosts is the microsecond costs over its block time, and the
    model ranks the fastest count first at every shape."""
    rows = synthetic_rows(np.random.default_rng(0))
    result = split_fit.fit(rows)
    for name, value in TRUE_US.items():
        assert result["us"][name] == pytest.approx(value, rel=0.05, abs=2e-3), (name, result["us"])
    for dtype, u in BLOCK_US.items():
        assert result["u"][dtype] == pytest.approx(u, rel=0.02)
        costs = result["costs"][split_fit.DTYPES[dtype]]
        assert costs.cta == pytest.approx(TRUE_US["cta"] / u, rel=0.05)
        assert costs.cluster_spread == split_fit.spread(split_fit.DTYPES[dtype])
        assert result["rel_rms"][dtype] < 0.01
    assert max(r["regret"] for r in split_fit.regrets(result["rows"], result["predicted"])) < 0.01


def test_rows_come_from_bench_decode_json_and_only_one_wave_is_fitted(tmp_path):
    """``rows_from_json`` keeps the hexcore rows (split-policy variants too), not the peers or
    the variants of another kernel or launch; ``one_wave`` drops launches with more CTAs than
    resident slots (128 x 8 x 2 splits > 3 x 132)."""
    hexcore_row = dict(kernel="hexcore int4 load only", B=128, Hq=32, Hkv=8, ctx=2048, ms=0.09, grid=[2, 8, 128],
                       cluster=None, ctas_per_sm=3)
    small = dict(hexcore_row, kernel="hexcore fp16", B=1, grid=[16, 8, 1], cluster=1, ctas_per_sm=4, ms=0.008)
    sdpa = dict(kernel="torch SDPA fp16", B=1, Hq=32, Hkv=8, ctx=2048, ms=0.01)
    prefetch = dict(small, kernel="hexcore fp16 prefetch=all")  # another kernel: not the policy's to fit
    path = tmp_path / "decode.json"
    path.write_text(json.dumps(dict(rows=[hexcore_row, small, sdpa, prefetch])))
    rows = split_fit.rows_from_json(str(path))
    assert [(r["dtype"], r["splits"], r["cluster"], r["us"]) for r in rows] == [("int4", 2, 1, 90.0),
                                                                              ("fp16", 16, 1, 8.0)]
    assert split_fit.one_wave(rows) == rows[1:]
    # a cluster past CLUSTER_MAX_FILL of the wave (the default rule never launches one) is dropped
    clustered = dict(rows[1], splits=8, cluster=8)  # 64 of 528 slots
    crowded = dict(rows[1], batch=8, splits=8, cluster=8)  # 512 of 528
    assert split_fit.one_wave([clustered, crowded, dict(crowded, cluster=1)]) == [clustered, dict(crowded, cluster=1)]
    assert split_fit.items_and_heads(dict(batch=2, hq=64, hkv=4)) == (16, 8)  # 16 heads: two groups of 8
    assert split_fit.items_and_heads(dict(batch=1, hq=24, hkv=2)) == (4, 8)  # 12 heads: groups of 8 and 4


def test_a_negative_fitted_cost_is_clipped_to_zero(monkeypatch):
    """Times made with a cluster merge that gets cheaper per split (-0.02 us): the fit finds
    the negative cost, and each dtype's SplitCosts (which holds no negative) takes 0."""
    monkeypatch.setitem(TRUE_US, "cluster_merge", -0.02)
    result = split_fit.fit(synthetic_rows(np.random.default_rng(1)))
    assert result["us"]["cluster_merge"] == pytest.approx(-0.02, abs=2e-3)
    for costs in result["costs"].values():
        assert isinstance(costs, SplitCosts) and costs.cluster_merge == 0 and costs.merge > 0


def test_a_block_time_of_zero_or_less_is_refused(monkeypatch):
    """Times that fall as the load grows (INT4's block time -0.15 us): a ValueError naming the
    dtype, not costs divided by a negative block time."""
    monkeypatch.setitem(BLOCK_US, "int4", -0.15)
    with pytest.raises(ValueError, match="int4: the fitted block time"):
        split_fit.fit(synthetic_rows(np.random.default_rng(2)))


def test_rows_come_from_bench_splits_json_too(tmp_path):
    """``bench_splits``' rows (a ``shape`` each; untimed ones without ``ms``) read as the same
    dicts as ``bench_decode``'s."""
    timed = dict(dtype="int2", shape=[1, 32, 4, 8192], splits=22, cluster=1, kernel_ctas_per_sm=2, ms=0.0116)
    path = tmp_path / "splits.json"
    path.write_text(json.dumps(dict(rows=[timed, dict(timed, splits=32, ms=0.0105), {"fit": {}}])))
    rows = split_fit.rows_from_json(str(path))
    assert rows[0] == dict(dtype="int2", batch=1, hq=32, hkv=4, ctx=8192, splits=22, cluster=1, ctas_per_sm=2,
                           us=pytest.approx(11.6))
    assert [r["splits"] for r in rows] == [22, 32]
