"""benchmarks.split_regret: the default policy's pick at each timed shape beside the fastest."""

import pytest

from benchmarks import split_regret
from hexcore.cuda.attention import launcher


def row(splits, cluster, us, dtype="int4", ctx=8192, ctas_per_sm=3):
    return dict(dtype=dtype, batch=1, hq=32, hkv=8, ctx=ctx, splits=splits, cluster=cluster, ctas_per_sm=ctas_per_sm,
                us=us)


def test_the_regret_is_the_picks_median_over_the_fastest(monkeypatch):
    """Medians per (splits, cluster); the pick's over the fastest's, minus 1; a pick never
    timed is reported untimed (None), not compared."""
    monkeypatch.setattr(split_regret, "policy_pick", lambda key, ctas, sms: (16, 1) if key[4] == 8192 else (8, 8))
    rows = [row(16, 1, 11.0), row(16, 1, 10.0), row(16, 1, 30.0), row(32, 1, 10.0), row(4, 4, 9.0, ctx=1024)]
    first, second = split_regret.policy_regrets(rows)
    assert first["shape"] == ("int4", 1, 32, 8, 1024) and first["pick_us"] is None and first["regret"] is None
    assert second["pick"] == (16, 1) and second["pick_us"] == 11.0 and second["best"] == (32, 1)
    assert second["regret"] == pytest.approx(0.1)


def test_the_pick_is_the_launchers_on_an_h200(monkeypatch):
    """``policy_pick`` asks the launcher's own search (132 SMs, sm_90's cluster rule): at B=1
    32/8 INT4 1k the policy merges 8 splits in one cluster (``test_decode``'s H200 counts), and
    a change to the search shows here."""
    assert split_regret.policy_pick(("int4", 1, 32, 8, 1024), 3, 132) == (8, 8)
    monkeypatch.setattr(launcher, "_search_split_blocks", lambda *a: 32)  # one split of all 32 blocks
    assert split_regret.policy_pick(("int4", 1, 32, 8, 1024), 3, 132) == (1, 1)
