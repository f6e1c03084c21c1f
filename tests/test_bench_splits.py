"""benchmarks.bench_splits: the sweep's steered rows, the policy's regret and the fit of its costs."""

from benchmarks import bench_splits
from hexcore.cuda import SplitCosts


def test_the_sweep_times_each_cluster_setting_and_fits_when_it_has_rows_enough(monkeypatch, capsys):
    """``--cluster-merge both``: a row per (ctas, cluster_merge), its options passed to the
    decode, every one pricing the load alone; a sweep of fewer than 8 rows in one wave says it
    cannot fit the costs instead of failing."""
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
    assert "too few rows to fit the split costs (2 in one wave, at least 8)" in capsys.readouterr().out
    # --ctas auto --min-blocks: the kernel's own occupancy, the split count steered by the shortest split
    seen.clear()
    bench_splits.main(["--shapes", "1x32x8x4096", "--dtypes", "int4", "--ctas", "auto", "--min-blocks", "8,32",
                       "--cluster-merge", "off"])
    assert [(o.ctas_per_sm, o.min_split_blocks, o.cluster_merge) for o in seen] == [(None, 8, False), (None, 32, False)]
    assert {o.split_costs for o in seen} == {SplitCosts(0, 0, 0, 0)}  # the load and the steer set the count
    # --split-blocks: fixed split lengths (the policy's price not asked), labelled as such
    seen.clear()

    def fixed_case(dtype, batch, hq, hkv, ctx, options):
        seen.append(options)
        return (lambda: None), 1, None, dict(grid=[-(-128 // options.split_blocks), hkv, batch], ctas_per_sm=4,
                                             cluster=1)

    monkeypatch.setattr(bench_decode, "decode_case", fixed_case)
    saved = {}
    monkeypatch.setattr(gpu_common, "save", lambda name, rows: saved.update({name: rows}))
    bench_splits.main(["--shapes", "1x32x8x4096", "--dtypes", "int4", "--ctas", "auto", "--split-blocks", "11,12",
                       "--cluster-merge", "off"])
    assert [(o.split_blocks, o.min_split_blocks, o.split_costs) for o in seen] == [(11, 4, None), (12, 4, None)]
    assert [(r["split_blocks"], r["min_blocks"], r["splits"]) for r in saved["splits"] if "ms" in r] == [
        (11, None, 12), (12, None, 11)]
    assert "fixed  11" in capsys.readouterr().out


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


def test_a_sweep_of_enough_rows_fits_the_costs(monkeypatch, capsys):
    """Eight or more one-wave rows: the fit runs over them and its costs are saved with the rows."""
    from benchmarks import bench_decode, gpu_common

    def fake_case(dtype, batch, hq, hkv, ctx, options):
        splits = 128 // options.min_split_blocks
        return (lambda: splits), 1, None, dict(grid=[splits, hkv, batch], ctas_per_sm=3, cluster=1)

    monkeypatch.setattr(bench_decode, "decode_case", fake_case)
    monkeypatch.setattr(gpu_common, "time_gpu", lambda run: (5 + 128 / run() * 0.2 + run() * 0.05) * 1e-6)
    saved = {}
    monkeypatch.setattr(gpu_common, "save", lambda name, rows: saved.update({name: rows}))
    bench_splits.main(["--shapes", "1x32x8x4096,2x32x8x4096", "--dtypes", "int4,int2", "--ctas", "auto",
                       "--min-blocks", "4,8,16,32", "--cluster-merge", "off"])
    (fit,) = [r["fit"] for r in saved["splits"] if "fit" in r]
    assert set(fit["costs"]) == {"4", "2"} and set(fit["us"]) == {"cta", "merge", "cluster_merge", "cluster_saving"}
    assert "split costs (us): cta" in capsys.readouterr().out
