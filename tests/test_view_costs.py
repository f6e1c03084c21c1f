"""benchmarks.view_costs: numba-cuda's views and marshalling, fresh against kept."""

import pytest

from benchmarks import view_costs
from tests.conftest import SIMULATOR


def test_view_costs_prints_each_cost(capsys):
    out = view_costs.main(["--repeat", "20"])
    names = {"slice buf[a:b]", "reshape (2-D)", "view(uint32)", "kept view (views.memo)"}
    if not SIMULATOR:
        names |= {"set_array, a fresh view", "set_array, kept views (one call)", "eager launch, kept views"}
    assert names <= set(out) and all(us > 0 for us in out.values()), out
    assert "host us per call" in capsys.readouterr().out


@pytest.mark.gpu
def test_view_costs_on_a_gpu_has_the_marshalling_costs():
    out = view_costs.main(["--repeat", "20"])
    assert "fresh view: typeof + _prepare_args" in out and "prepared run" in out
