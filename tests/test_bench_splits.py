"""benchmarks.bench_splits: the fit of the merge's cost per split, and the policy's pick with it."""

import numpy as np

from benchmarks import bench_splits
from hexcore.cuda.attention import launcher


def test_fit_recovers_the_costs_of_a_known_model():
    """Times made from a = 0.3 us per block and wave, m = 0.2 us per split and one constant
    per shape (plus noise of 0.1%): the fit gives m / a = 2/3 of a block per split."""
    rng = np.random.default_rng(0)
    rows = []
    for shape, constant, max_virtual in (((1, 32, 8, 32768), 0.008, 1024), ((1, 32, 8, 131072), 0.02, 4096)):
        for splits in (16, 32, 64, 128, 256):
            blocks, waves = -(-max_virtual // splits), -(-8 * splits // 528)  # 8 heads, 528 resident CTAs
            ms = (0.3 * waves * blocks + 0.2 * splits) * 1e-3 + constant
            noisy = ms * (1 + 1e-3 * rng.standard_normal())
            rows.append(dict(shape=list(shape), splits=splits, waves=waves, blocks=blocks, ms=noisy))
    fit = bench_splits.fit_merge_cost(rows)
    assert abs(fit["cost"] - 2 / 3) < 0.05, fit
    assert abs(fit["constants"][(1, 32, 8, 32768)] - 0.008) < 1e-3


def test_the_policy_takes_fewer_splits_with_a_merge_cost(monkeypatch):
    monkeypatch.setattr(launcher, "_num_sms", lambda: 132)
    assert bench_splits.policy_splits((1, 32, 8, 32768), 4, 0.0) == 64
    assert bench_splits.policy_splits((1, 32, 8, 32768), 4, 0.7) == 38
    assert bench_splits.policy_splits((1, 32, 8, 131072), 4, 0.7) == 64
