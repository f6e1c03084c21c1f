"""hexcore.cuda.compiles: a kernel's first launch per argument types is recorded once (a
compilation on a GPU, a first launch on the simulator), host functions compiled by numba
too, and nothing once the recording is closed."""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda, njit

from hexcore.cuda.compiles import recording
from hexcore.errors import HexcoreInvalidArgumentError
from tests.conftest import SIMULATOR


def _fill_kernel():
    @cuda.jit
    def fill(out, value):
        i = cuda.grid(1)
        if i < out.shape[0]:
            out[i] = value

    return fill


def test_a_kernel_is_recorded_once_per_argument_types():
    fill = _fill_kernel()
    floats, ints = cuda.to_device(np.zeros(8, np.float32)), cuda.to_device(np.zeros(8, np.int32))
    with recording() as log:
        fill[1, 8](floats, 1.0)
        fill[1, 8](floats, 2.0)  # the same types: nothing new
        mark = log.mark()
        fill[1, 8](ints, 3)  # an int32 array: another compilation
        fill[1, 8](floats[::2], 4.0)  # a strided view: layout 'A', another one
    assert [e.name.split(".")[0] for e in log.entries] == ["_fill_kernel"] * 3
    assert [e.signature[0] for e in log.since(mark)] == ["array(int32, 1d, C)", "array(float32, 1d, A)"]
    assert log.entries[0].signature == ("array(float32, 1d, C)", "float64")
    assert (log.seconds() > 0) == (not SIMULATOR)  # the simulator compiles nothing
    assert ints.copy_to_host()[0] == 3  # the launches ran
    fill[1, 8](cuda.to_device(np.zeros(8, np.float64)), 5.0)  # after the recording: not recorded
    assert len(log.entries) == 3


def test_host_functions_compiled_by_numba_are_recorded():
    @njit
    def twice(x):
        return 2 * x

    with recording() as log:
        assert twice(3) == 6 and twice(4) == 8 and twice(1.5) == 3.0
    names = [e.name for e in log.entries if "twice" in e.name]
    assert len(names) == 2 and all(e.seconds > 0 for e in log.entries if "twice" in e.name)


def test_a_bad_mark_or_a_second_recording_raises():
    with recording() as log:
        with pytest.raises(HexcoreInvalidArgumentError, match="mark"):
            log.since(1)
        with pytest.raises(HexcoreInvalidArgumentError, match="mark"):
            log.since(-1)
        with pytest.raises(HexcoreInvalidArgumentError, match="another recording"):
            with recording():
                pass
    with recording() as again:  # closed: a new one may open
        assert again.since(0) == []
