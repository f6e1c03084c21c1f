"""benchmarks.profile_decode: --lineinfo (kernels only compiled with numba's line table), formats by age."""

import pytest
from numba import cuda

from benchmarks import profile_decode


def test_with_lineinfo_sets_it_for_kernels_only(monkeypatch):
    seen = []
    monkeypatch.setattr(cuda, "jit", lambda *args, **kwargs: seen.append(kwargs))
    profile_decode.with_lineinfo()
    cuda.jit(max_registers=128)
    cuda.jit(device=True)
    cuda.jit(debug=True)
    cuda.jit(lineinfo=False)
    assert seen == [{"max_registers": 128, "lineinfo": True}, {"device": True}, {"debug": True},
                    {"lineinfo": False}]


def test_a_format_by_age_runs_its_plan(monkeypatch, capsys):
    """``int2-aged`` goes through ``bench_decode.tiered_case`` (a store per pool), as
    bench_decode times it, not through the one-store case, which has no such dtype."""
    from benchmarks import bench_decode

    monkeypatch.setattr(bench_decode, "SHAPES", [(1, 8, 1, 1000)])
    profile_decode.main(["int2-aged", "0"])
    assert "profiled int2-aged (1, 8, 1, 1000)" in capsys.readouterr().out


def test_a_variant_passes_its_options_to_the_case(monkeypatch, capsys):
    from benchmarks import bench_decode

    seen = []

    def case(dtype, *shape, options=None):
        seen.append((dtype, shape, options))
        return (lambda: None), 1e9, None, {}

    monkeypatch.setattr(bench_decode, "SHAPES", [(1, 8, 1, 1000)])
    monkeypatch.setattr(bench_decode, "case_for", lambda dtype: case)
    profile_decode.main(["int2-aged", "--variant", "last pool merges", "0"])
    (dtype, shape, options), = seen
    assert (dtype, shape, options.tiered_merge) == ("int2-aged", (1, 8, 1, 1000), "last")
    assert "profiled int2-aged last pool merges (1, 8, 1, 1000)" in capsys.readouterr().out


def test_an_unknown_variant_names_the_known_ones():
    with pytest.raises(SystemExit, match="'no such' is not one of .*last pool merges"):
        profile_decode.variant_options("no such")
