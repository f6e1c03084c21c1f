"""benchmarks.host_step: host time of Engine steps, launches stubbed on the simulator, real on a GPU."""

import numpy as np
import pytest
from numba import cuda

from benchmarks import host_step
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
