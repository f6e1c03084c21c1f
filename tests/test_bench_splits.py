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


def test_the_sweep_times_each_cluster_setting_and_fits_only_the_workspace_merges(monkeypatch, capsys):
    """``--cluster-merge both``: a row per (ctas, cluster_merge), its options passed to the
    decode; the fit takes only the rows merged in the workspace (cluster 1), so a sweep whose
    rows all merged in clusters prints that it cannot fit instead of failing."""
    from benchmarks import bench_decode, gpu_common

    seen = []

    def fake_case(dtype, batch, hq, hkv, ctx, options):
        seen.append(options)
        splits = 2 * options.ctas_per_sm if options.ctas_per_sm else 128 // options.min_split_blocks
        return (lambda: None), 1, None, dict(grid=[splits, hkv, batch], ctas_per_sm=4,
                                             cluster=splits if options.cluster_merge else 1)

    monkeypatch.setattr(bench_decode, "decode_case", fake_case)
    monkeypatch.setattr(gpu_common, "time_gpu", lambda run: 1e-5)
    rows = bench_splits.sweep([(1, 32, 8, 4096)], ["int4"], [1, 2], (False, True))
    assert [(o.ctas_per_sm, o.cluster_merge) for o in seen] == [(1, False), (1, True), (2, False), (2, True)]
    assert [(r["splits"], r["cluster"], r["cluster_merge"]) for r in rows] == [(2, 1, False), (2, 2, True),
                                                                              (4, 1, False), (4, 4, True)]
    monkeypatch.setattr(gpu_common, "save", lambda name, rows: None)
    bench_splits.main(["--shapes", "1x32x8x4096", "--dtypes", "int4", "--ctas", "1,2", "--cluster-merge", "on"])
    assert "int4: too few rows merged in the workspace to fit its cost" in capsys.readouterr().out
    # --ctas auto --min-blocks: the kernel's own occupancy, the split count steered by the shortest split
    seen.clear()
    bench_splits.main(["--shapes", "1x32x8x4096", "--dtypes", "int4", "--ctas", "auto", "--min-blocks", "8,32",
                       "--cluster-merge", "off"])
    assert [(o.ctas_per_sm, o.min_split_blocks, o.cluster_merge) for o in seen] == [(None, 8, False), (None, 32, False)]
    assert {o.split_merge_cost for o in seen} == {0}  # no merge term: the steer alone sets the count


def test_the_policy_row_and_its_regret(monkeypatch, capsys):
    """``--policy``: one more row per shape and dtype with the default options, and the
    policy's regret against the fastest row of that shape (here the steer's 4 splits at 10 us
    beat the policy's 8 at 12 us: 20%)."""
    from benchmarks import bench_decode, gpu_common
    from hexcore.cuda import DecodeOptions

    def fake_case(dtype, batch, hq, hkv, ctx, options):
        splits = 8 if options == DecodeOptions() else 128 // options.min_split_blocks
        return (lambda: splits), 1, None, dict(grid=[splits, hkv, batch], ctas_per_sm=4, cluster=1)

    times = {8: 12e-6, 16: 11e-6, 4: 10e-6}
    monkeypatch.setattr(bench_decode, "decode_case", fake_case)
    monkeypatch.setattr(gpu_common, "time_gpu", lambda run: times[run()])
    saved = {}
    monkeypatch.setattr(gpu_common, "save", lambda name, rows: saved.update({name: rows}))
    bench_splits.main(["--shapes", "1x32x8x4096", "--dtypes", "int4", "--ctas", "auto", "--min-blocks", "8,32",
                       "--cluster-merge", "off", "--policy"])
    rows = saved["splits"]
    assert [(r["splits"], r["policy"]) for r in rows if "ms" in r] == [(16, False), (4, False), (8, True)]
    (regret,) = [r["regret"] for r in rows if "regret" in r]
    assert (regret["policy_splits"], regret["best_splits"]) == (8, 4) and abs(regret["regret"] - 0.2) < 1e-9
    assert "regret 20.0%" in capsys.readouterr().out
