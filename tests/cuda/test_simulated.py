"""hexcore.cuda.simulated: the simulator's host launches seen or skipped by a hook; its
barriers woken instead of polled, and a block's shared arrays allocated once under a lock
(installed for every test by tests/conftest.py)."""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda

from hexcore.cuda.device import SIMULATOR
from hexcore.cuda.simulated import launches, use_fast_simulator

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


@cuda.jit
def _rotate_left_after_barriers(out, rounds, leave_before):
    # each round: every thread reads its right neighbour's value, a barrier, writes it back,
    # a barrier; threads at or past `leave_before` leave before the first barrier (their
    # values stay), so a barrier must open for the threads that are still running
    i = cuda.threadIdx.x
    if i >= leave_before:
        return
    for _ in range(rounds):
        right = out[(i + 1) % leave_before]
        cuda.syncthreads()
        out[i] = right
        cuda.syncthreads()


@cuda.jit
def _count_then_raise_in_one(out, bad):
    i = cuda.threadIdx.x
    out[i] = cuda.syncthreads_count(i % 3 == 0)
    if i == bad:
        raise ValueError("thread raised")
    cuda.syncthreads()  # the others wait here when `bad` raises
    out[i] += 100


def test_event_barriers_are_installed_and_open_for_the_threads_still_running():
    from numba.cuda.simulator import kernel as simulator

    assert use_fast_simulator() and use_fast_simulator()  # installed by conftest; idempotent
    assert simulator.BlockManager._hexcore_fast
    values = np.arange(64, dtype=np.float32)
    out = cuda.to_device(values)
    _rotate_left_after_barriers[2, 64](out, 5, 48)  # two blocks: the same rotation applied twice
    np.testing.assert_array_equal(out.copy_to_host(), np.r_[np.roll(values[:48], -10), values[48:]])


def test_event_barriers_count_and_a_raising_thread_aborts_the_block():
    out = cuda.to_device(np.zeros(33, np.int64))
    _count_then_raise_in_one[1, 33](out, 99)  # none raises
    np.testing.assert_array_equal(out.copy_to_host(), 11 + 100)  # 0, 3, ..., 30
    with pytest.raises(ValueError, match="tid=\\[7, 0, 0\\].*thread raised"):
        _count_then_raise_in_one[1, 33](out, 7)  # the others were waiting: no hang
    _count_then_raise_in_one[1, 33](out, 99)  # the simulator still runs
    np.testing.assert_array_equal(out.copy_to_host(), 11 + 100)


@cuda.jit(device=True)
def _block_size():
    return cuda.blockDim.x


@cuda.jit
def _write_block_size(out):
    out[cuda.threadIdx.x] = _block_size()


def test_device_calls_see_their_own_launch_and_the_module_is_restored_after():
    import numba.cuda

    for threads in (4, 8, 4):  # each launch's device calls see that launch's fake module
        out = cuda.to_device(np.full(8, -1, np.int64))
        _write_block_size[1, threads](out)
        np.testing.assert_array_equal(out.copy_to_host()[:threads], threads)
    assert globals()["cuda"] is numba.cuda  # the real module again between launches


@cuda.jit
def _write_indices(out):
    x, y, z = cuda.threadIdx.x, cuda.threadIdx.y, cuda.threadIdx.z
    flat = x + cuda.blockDim.x * (y + cuda.blockDim.y * z)
    out[cuda.blockIdx.x, flat, 0] = x
    out[cuda.blockIdx.x, flat, 1] = y
    out[cuda.blockIdx.x, flat, 2] = z
    out[cuda.blockIdx.x, flat, 3] = cuda.laneid


def test_reused_threads_take_each_blocks_indices():
    import threading

    for block in ((4, 3, 2), (8, 8, 1), (5, 1, 1)):  # fewer, more, then fewer threads than parked
        threads = int(np.prod(block))
        out = cuda.to_device(np.full((2, threads, 4), -1, np.int64))
        _write_indices[2, block](out)
        z, y, x = np.unravel_index(np.arange(threads), block[::-1])
        expected = np.stack([x, y, z, np.arange(threads) % 32], axis=1)
        np.testing.assert_array_equal(out.copy_to_host(), np.stack([expected, expected]))
    parked = threading.active_count()
    _write_indices[3, (8, 8, 1)](cuda.to_device(np.zeros((3, 64, 4), np.int64)))
    assert threading.active_count() == parked  # no new OS thread: the 64 parked ones ran it


def test_a_forked_child_starts_its_own_threads():
    import multiprocessing

    _write_indices[1, 8](cuda.to_device(np.zeros((1, 8, 4), np.int64)))  # threads parked here
    context = multiprocessing.get_context("fork")
    child = context.Process(target=_launch_and_exit)
    child.start()
    child.join(60)
    assert child.exitcode == 0  # a child that handed the block to the parent's threads would hang


def _launch_and_exit():
    out = cuda.to_device(np.full((1, 8, 4), -1, np.int64))
    _write_indices[1, 8](out)
    raise SystemExit(0 if out.copy_to_host()[0, 7, 0] == 7 else 1)


def _threads_sharing_one_array(array, threads: int = 32) -> int:
    """How many different arrays ``threads`` threads, released together, get from one
    ``cuda.shared.array`` call site of one block (``array``: FakeCUDAShared.array)."""
    import threading

    from numba.cuda.simulator import kernelapi

    shared = kernelapi.FakeCUDAShared(0)
    start = threading.Barrier(threads)
    got = [None] * threads

    def run(i):
        start.wait()
        got[i] = id(array(shared, (4096,), np.float32))  # one call site for every thread

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return len(set(got))


def test_threads_of_a_block_share_its_shared_arrays():
    """Every thread of a block that reaches a ``cuda.shared.array`` line at the same time gets
    the same array (the stock simulator's look-up and allocation race: with a 1 us switch
    interval 2 of 20 such trials gave a thread its own array)."""
    import sys

    from numba.cuda.simulator import kernelapi

    from hexcore.cuda import simulated

    assert kernelapi.FakeCUDAShared.array is simulated._shared_array  # installed (tests/conftest.py)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        assert all(_threads_sharing_one_array(simulated._shared_array) == 1 for _ in range(40))
    finally:
        sys.setswitchinterval(interval)


def test_shared_arrays_keep_one_array_per_call_site_and_dynamic_shared_memory():
    from numba.cuda.simulator import kernelapi

    from hexcore.cuda.simulated import _shared_array

    shared = kernelapi.FakeCUDAShared(64)
    a = _shared_array(shared, (8,), np.float32)
    b = _shared_array(shared, (8,), np.float32)  # another line: another array
    assert a is not b and a.shape == (8,) and a.dtype == np.float32
    again = [_shared_array(shared, (8,), np.int32) for _ in range(2)]  # one line, twice: the same
    assert again[0] is again[1]
    dynamic = _shared_array(shared, 0, np.float32)
    assert dynamic.shape == (16,) and np.shares_memory(dynamic, _shared_array(shared, 0, np.int32))
