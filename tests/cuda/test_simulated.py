"""hexcore.cuda.simulated.launches: the simulator's host launches seen or skipped by a hook."""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda

from hexcore.cuda.device import SIMULATOR
from hexcore.cuda.simulated import launches

pytestmark = pytest.mark.skipif(not SIMULATOR, reason="a hook on numba's CUDA simulator")


@cuda.jit(device=True)
def _twice(x):
    return 2 * x


@cuda.jit
def _double(out, a):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = _twice(a[i])  # a device function: not a launch, not hooked


def test_a_hook_sees_host_launches_and_may_skip_them():
    a = np.arange(4, dtype=np.float32)
    out = cuda.to_device(np.zeros(4, np.float32))
    seen = []

    def watch(kernel, args, launch):
        seen.append((kernel.fn.__name__, len(args)))
        return launch()

    with launches(watch):
        _double[1, 4](out, a)
    assert seen == [("_double", 2)]  # one host launch; the device function calls were not hooked
    np.testing.assert_array_equal(out.copy_to_host(), 2 * a)
    skipped = cuda.to_device(np.full(4, -1, np.float32))
    with launches(lambda kernel, args, launch: None):
        _double[1, 4](skipped, a)
    np.testing.assert_array_equal(skipped.copy_to_host(), -1)  # not run
    _double[1, 4](skipped, a)  # restored on exit
    np.testing.assert_array_equal(skipped.copy_to_host(), 2 * a)


def test_hooks_nest_and_an_exception_restores_the_simulator():
    order = []

    def named(name):
        def hook(kernel, args, launch):
            order.append(name)
            return launch()
        return hook

    out = cuda.to_device(np.zeros(2, np.float32))
    with launches(named("outer")), launches(named("inner")):
        _double[1, 2](out, np.ones(2, np.float32))
    assert order == ["inner", "outer"]
    with pytest.raises(RuntimeError), launches(named("gone")):
        raise RuntimeError("inside")
    _double[1, 2](out, np.ones(2, np.float32))
    assert order == ["inner", "outer"]
