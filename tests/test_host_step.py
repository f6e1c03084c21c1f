"""benchmarks.host_step: host time of Engine steps, launches stubbed on the simulator, real on a GPU."""

import numpy as np
import pytest
from numba import cuda

from benchmarks import host_step
from hexcore.cuda.attention import options
from tests.conftest import SIMULATOR


@pytest.mark.skipif(not SIMULATOR, reason="stubs the CUDA simulator's launches")
@pytest.mark.parametrize("dtype", ["int4", "int2-aged"])
def test_host_step_times_steps_and_restores_launches(dtype):
    ms = host_step.main(["--dtype", dtype, "--layers", "2", "--batch", "3", "--context", "70", "--steps", "2"])
    assert 0 < ms < 5000

    @cuda.jit
    def write_one(out):
        out[0] = 1

    out = cuda.to_device(np.zeros(1, np.int32))
    write_one[1, 1](out)  # launches run again once the stub is gone
    assert out.copy_to_host()[0] == 1


@pytest.mark.gpu
def test_host_step_runs_the_launches_on_a_gpu():
    """Without the simulator the steps' kernels run (a format's step: its pools' launches)."""
    ms = host_step.main(["--dtype", "int2-aged", "--layers", "2", "--batch", "3", "--context", "70", "--steps", "2"])
    assert 0 < ms < 5000


@pytest.mark.skipif(not SIMULATOR, reason="stubs the CUDA simulator's launches")
def test_a_format_step_makes_no_copy_or_allocation_of_its_own(capsys):
    """--count: a format's step puts its index arrays through the engine's uploads (no
    cuda.to_device, no device_array per step; before them, 12 copies at these sizes) and
    takes over its plan's launches from two steps before (here every step but the first
    two); the counted functions are restored afterwards."""
    from hexcore.cuda.launch import PreparedLaunch

    init = PreparedLaunch.__init__
    counts = warm_format_counts()
    assert counts["to_device"] == 0 and counts["device_array"] == 0, counts
    assert counts["prepare"] == 0 and counts["prepared run"] > 0, counts
    assert PreparedLaunch.__init__ is init and cuda.to_device.__name__ == "to_device"
    host_step.main(["--dtype", "int2-aged", "--layers", "2", "--batch", "3", "--context", "70", "--steps", "2",
                    "--count"])
    assert "per step: to_device 0, device_array 0" in capsys.readouterr().out


def warm_format_counts() -> dict:
    """``--count``'s per-step counts of an int2-aged Engine step (2 layers, 5 sequences of
    about 100 tokens) after three warm-up steps, launches stubbed."""
    with host_step.stubbed_launches():
        engine, seqs = host_step.make_engine("int2-aged", 2, 5, 100)
        for _ in range(3):
            engine.step(seqs).run()
        return host_step.per_step_counts(engine, seqs, 4)


@pytest.mark.skipif(not SIMULATOR, reason="stubs the CUDA simulator's launches")
def test_a_warm_format_step_makes_no_device_array_object(monkeypatch):
    """--count's device array objects (numba's DeviceNDArray on a GPU, each tens of us of
    Python; FakeCUDAArray here): a format's step at unchanged shapes takes every view it
    launches with from ``cuda.views`` (its uploads' per offset, its buffers' per layer, flat
    words per array), so none (before: 45 per step at these sizes, 72 at the benchmark's);
    its set_array calls only move the prepared launches from layer to layer (q and out of
    the one decode launch at each of 2 layers: 4; of a launch per pool: 12; before views,
    28), and its appends, seals and re-seals run
    prepared (``TieredParts.relaunch``: no eager launch, none prepared anew)."""
    counts = warm_format_counts()
    assert counts["device array objects"] == 0, counts
    assert counts["set_array"] == 4, counts
    assert counts["eager launch"] == 0 and counts["prepare"] == 0, counts
    monkeypatch.setattr(options, "TIERED_ONE_MAX_ITEMS", {})  # a launch per pool, the last merging
    counts = warm_format_counts()
    assert counts["device array objects"] == 0 and counts["set_array"] == 12, counts
    assert counts["eager launch"] == 0 and counts["prepare"] == 0, counts


@pytest.mark.skipif(not SIMULATOR, reason="stubs the CUDA simulator's launches")
def test_fresh_views_makes_views_per_step_as_before_and_is_restored(capsys):
    """--fresh-views (``views.KEEP`` off for the run): the step makes its views again (the
    counter sees them), and keeping is back on afterwards."""
    from hexcore.cuda import views

    host_step.main(["--dtype", "int2-aged", "--layers", "2", "--batch", "3", "--context", "70", "--steps", "2",
                    "--count", "--fresh-views"])
    text = capsys.readouterr().out
    assert "views made afresh" in text and views.KEEP is True
    fresh = float(text.split("device array objects ")[1].split()[0].rstrip(","))
    assert fresh > 20, text
