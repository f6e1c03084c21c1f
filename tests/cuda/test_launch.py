"""PreparedLaunch: parameters marshalled once, each at the width cuda.core would pass, replayed
with one cuLaunchKernel; on a GPU it must equal numba's own launch bit for bit."""

import ctypes

import numpy as np
import pytest
from numba import cuda

from hexcore import HexcoreCudaError, HexcoreInvalidArgumentError
from hexcore.cuda import PreparedLaunch
from hexcore.cuda.launch import Launch, kernel_params
from hexcore.cuda.streams import raw_handle, stream_handle


def test_kernel_params_store_each_value_at_cuda_cores_width():
    """What numba's _prepare_args produces (ints for array fields, ctypes for scalars),
    read back through the void* array cuLaunchKernel receives."""
    own = ctypes.c_int32(-7)
    values = [0, 0, 12, 2, 0x7F00DEADBEEF0, 3, -8, own, ctypes.c_uint16(0x3C00), ctypes.c_float(1.5), 2.25, True,
              np.int32(9), np.float16(1.5), np.float32(0.5), np.uint8(200)]
    expected = [(ctypes.c_ssize_t, v) for v in (0, 0, 12, 2, 0x7F00DEADBEEF0, 3, -8)] + [
        (ctypes.c_int32, -7), (ctypes.c_uint16, 0x3C00), (ctypes.c_float, 1.5), (ctypes.c_double, 2.25),
        (ctypes.c_ssize_t, 1), (ctypes.c_int32, 9), (ctypes.c_uint16, 0x3E00), (ctypes.c_float, 0.5),
        (ctypes.c_uint8, 200)]
    keep, address = kernel_params(values)
    pointers = (ctypes.c_void_p * len(values)).from_address(address)
    for i, (ctype, value) in enumerate(expected):
        assert ctype.from_address(pointers[i]).value == value, f"parameter {i}"
    assert pointers[7] == ctypes.addressof(own)  # numba's ctypes values are passed as they are
    assert keep  # the storage lives as long as the caller keeps this
    with pytest.raises(HexcoreInvalidArgumentError, match="parameter 1: unsupported type str"):
        kernel_params([0, "x"])


def test_stream_handle_of_every_kind_of_stream():
    from cuda.bindings import driver

    class NumbaLike:
        handle = driver.CUstream(0x1234)

    class CoreLike:
        def __cuda_stream__(self):
            return (0, 0x5678)

    class TorchLike:
        cuda_stream = 0x9ABC

    assert int(stream_handle(0)) == int(stream_handle(None)) == 0
    assert [int(stream_handle(s)) for s in (77, NumbaLike(), CoreLike(), TorchLike())] == [77, 0x1234, 0x5678, 0x9ABC]
    handle = driver.CUstream(5)
    assert stream_handle(handle) is handle
    torch_like = type("Stream", (), {"__module__": "torch.cuda.streams", "cuda_stream": 0xDEF0,
                                     "__cuda_stream__": lambda self: (0, 0xDEF0)})
    for stream in (0, None, 77, NumbaLike(), CoreLike(), TorchLike(), handle, torch_like()):  # no CUstream for torch's
        assert raw_handle(stream) == int(stream_handle(stream))
    for bad in (True, "stream"):
        with pytest.raises(HexcoreInvalidArgumentError, match="stream"):
            stream_handle(bad)
        with pytest.raises(HexcoreInvalidArgumentError, match="stream"):
            raw_handle(bad)


@cuda.jit
def _mixed(out, a2d, b1d, i32, i64, f32, f64, u8):
    # a function of every parameter: a wrong width, order, shape or stride changes it
    i = cuda.grid(1)
    if i < out.shape[0]:
        r, c = i % a2d.shape[0], (i // 3) % a2d.shape[1]
        out[i] = a2d[r, c] * f32 + b1d[i % b1d.shape[0]] * f64 + i32 + i64 * 2 + u8 + a2d.strides[0] + r


@cuda.jit
def _other_kernel(out, a2d, b1d, i32, i64, f32, f64, u8):
    pass


def _mixed_args(rng):
    a = cuda.to_device(rng.standard_normal((5, 14)))[:, ::2]  # strided: strides must travel too
    b = cuda.to_device(rng.standard_normal(11).astype(np.float32))
    return a, b, np.int32(-3), 2**40 + 5, np.float32(0.25), 1.0 / 3, np.uint8(200)


def test_prepared_launch_on_the_simulator_follows_new_contents(rng):
    args = _mixed_args(rng)
    expect, got = cuda.device_array(40), cuda.device_array(40)
    prepared = PreparedLaunch(_mixed, 2, 32, (got, *args))
    for _ in range(2):  # the second time with new contents at the same addresses
        _mixed[2, 32](expect, *args)
        prepared.run()
        np.testing.assert_array_equal(got.copy_to_host(), expect.copy_to_host())
        args[1].copy_to_device(rng.standard_normal(11).astype(np.float32))
    assert prepared.grid == (2, 1, 1) and prepared.block == (32, 1, 1)


@pytest.mark.gpu
@pytest.mark.parametrize("path", ["raw", "core"])
def test_prepared_launch_equals_plain_launch_gpu(path, rng):
    """Bit-equal to numba's launch: on the default stream, a numba stream, an external
    stream, after the inputs change in place, and (raw path) replayed from a CUDA graph."""
    args = _mixed_args(rng)
    expect, got = cuda.device_array(300), cuda.device_array(300)
    prepared = Launch(_mixed, 3, 128, (got, *args)).prepare(path)
    stream = cuda.stream()
    external = cuda.external_stream(int(stream.handle))
    for run_on in (0, stream, external, 0):
        got.copy_to_device(np.full(300, np.nan))
        _mixed[3, 128](expect, *args)
        prepared.run(run_on)
        cuda.synchronize()
        assert np.array_equal(got.copy_to_host(), expect.copy_to_host()), f"stream {run_on}"
        args[1].copy_to_device(rng.standard_normal(11).astype(np.float32))  # same address, new contents
    prepared.set_scalar(4, -12345)  # i64: the next runs see the new value, the arrays stay
    got.copy_to_device(np.full(300, np.nan))
    _mixed[3, 128](expect, *args[:3], -12345, *args[4:])
    prepared.run(stream)
    stream.synchronize()
    assert np.array_equal(got.copy_to_host(), expect.copy_to_host()), "set_scalar"
    prepared.set_scalar(4, args[3])
    if path == "raw":
        from hexcore.cuda.steps.capture import DriverGraph

        graph = DriverGraph(prepared.run, cuda.stream())  # capture-safe: no sync, allocation or read
        got.copy_to_device(np.full(300, np.nan))
        _mixed[3, 128](expect, *args)
        graph.replay(stream_handle(0))
        cuda.synchronize()
        assert np.array_equal(got.copy_to_host(), expect.copy_to_host()), "graph replay"


def test_set_scalar_changes_an_int_argument_for_later_runs(rng):
    args = _mixed_args(rng)
    expect, got = cuda.device_array(40), cuda.device_array(40)
    prepared = PreparedLaunch(_mixed, 2, 32, (got, *args))
    prepared.set_scalar(4, 17)
    prepared.run()
    _mixed[2, 32](expect, *args[:3], 17, *args[4:])
    np.testing.assert_array_equal(got.copy_to_host(), expect.copy_to_host())
    for index in (1, 3, 5, 8, -1):  # an array, an np.int32, a float, out of range
        with pytest.raises(HexcoreInvalidArgumentError, match=f"index: argument {index} is not an int"):
            prepared.set_scalar(index, 1)


def test_as_launch_gives_the_arguments_as_they_are_now(rng):
    """as_launch: the launch a prepared one replays, after set_scalar/set_array, so another
    kernel of the same arguments can be prepared from it (bench_decode's partials variant)."""
    args = _mixed_args(rng)
    got, other_out = cuda.device_array(40), cuda.device_array(40)
    prepared = PreparedLaunch(_mixed, 2, 32, (got, *args))
    prepared.set_scalar(4, 17)
    prepared.set_array(0, other_out)
    launch = prepared.as_launch()
    assert launch.kernel is _mixed and launch.grid == (2, 1, 1) and launch.block == (32, 1, 1)
    assert launch.args[0] is other_out and launch.args[4] == 17 and launch.args[1] is args[0]
    swapped = launch._replace(kernel=_other_kernel).prepare()
    assert swapped.as_launch().kernel is _other_kernel and swapped.as_launch().args == launch.args


def check_set_array(rng, path=None):
    """set_array: another address and shape of the same type (another strided view, another
    output) for later runs; a wrong type or a non-array argument refused."""
    args = _mixed_args(rng)
    expect, got = cuda.device_array(300), cuda.to_device(np.full(300, np.nan))
    launch = Launch(_mixed, 3, 128, (got, *args))
    prepared = launch.prepare(path) if path else PreparedLaunch(_mixed, 3, 128, launch.args)
    other = cuda.to_device(rng.standard_normal((7, 18)))[:, ::3]  # another strided 2-D view, another shape
    out2 = cuda.to_device(np.full(300, np.nan))
    prepared.set_array(1, other)
    prepared.set_array(0, out2)
    prepared.run()
    cuda.synchronize()
    _mixed[3, 128](expect, other, *args[1:])
    np.testing.assert_array_equal(out2.copy_to_host(), expect.copy_to_host())
    assert np.isnan(got.copy_to_host()).all()  # the old output is no longer written
    prepared.set_array(0, got)  # back to the first output (on a GPU: its values as kept on it)
    prepared.set_array(0, got)  # (the same array again: nothing changes)
    prepared.run()
    cuda.synchronize()
    np.testing.assert_array_equal(got.copy_to_host(), expect.copy_to_host())
    wrong = cuda.to_device(np.zeros((4, 4), np.float32))
    for index, value, message in ((1, wrong, "array: expected"), (1, wrong, "array: expected"),  # kept: refused again
                                  (1, cuda.to_device(np.zeros(8)), "array: expected"),
                                  (3, other, "not a device array argument"), (9, other, "not a device array")):
        with pytest.raises(HexcoreInvalidArgumentError, match=message):
            prepared.set_array(index, value)


def test_set_array_changes_an_array_argument_for_later_runs(rng):
    check_set_array(rng)


@pytest.mark.gpu
@pytest.mark.parametrize("path", ["raw", "core"])
def test_set_array_gpu(path, rng):
    check_set_array(rng, path)


@pytest.mark.gpu
def test_set_array_marshals_each_array_once_gpu(rng, monkeypatch):
    """An array's numba type and marshalled values are kept on it (``launch.marshalled``):
    a step's layers set the same views again and again, each marshalled by numba once."""
    from numba.cuda.dispatcher import _Kernel

    args = _mixed_args(rng)
    first, second = cuda.to_device(np.full(300, np.nan)), cuda.to_device(np.full(300, np.nan))
    prepared = Launch(_mixed, 3, 128, (first, *args)).prepare()
    calls, original = [], _Kernel._prepare_args
    monkeypatch.setattr(_Kernel, "_prepare_args", lambda self, *a: calls.append(a[1]) or original(self, *a))
    for out in (second, first, second, first, second):
        prepared.set_array(0, out)
    assert [id(a) for a in calls] == [id(second), id(first)]
    prepared.run()
    expect = cuda.device_array(300)
    _mixed[3, 128](expect, *args)
    cuda.synchronize()
    np.testing.assert_array_equal(second.copy_to_host(), expect.copy_to_host())
    assert np.isnan(first.copy_to_host()).all()


def check_relaunch(rng, monkeypatch):
    """Relaunch: a launch of a kept kernel, grid, block and scalars runs through the launch
    prepared the first time (its arrays put in), one with other scalars or another grid
    gets its own; each equals the eager launch; an empty grid runs nothing."""
    from hexcore.cuda.launch import Relaunch

    prepares = []
    init = PreparedLaunch.__init__
    monkeypatch.setattr(PreparedLaunch, "__init__", lambda self, *a, **k: prepares.append(1) or init(self, *a, **k))
    relaunch, args = Relaunch(), _mixed_args(rng)
    other = cuda.to_device(rng.standard_normal((7, 18)))[:, ::3]
    runs = [(3, (other, *args[1:])), (3, args), (3, (other, *args[1:3], 2**40 + 6, *args[4:])), (2, args),
            (3, (other, *args[1:]))]
    for step, (grid, inputs) in enumerate(runs):
        got, expect = cuda.to_device(np.full(300, np.nan)), cuda.to_device(np.full(300, np.nan))
        relaunch.run(Launch(_mixed, grid, 128, (got, *inputs)))
        _mixed[grid, 128](expect, *inputs)
        cuda.synchronize()
        np.testing.assert_array_equal(got.copy_to_host(), expect.copy_to_host(), err_msg=f"run {step}")
    assert len(prepares) == 3  # the first run, another scalar, another grid
    relaunch.run(Launch(_mixed, (0, 1), 128, (got, *args)))  # nothing to launch
    assert len(prepares) == 3


def test_relaunch_runs_alike_launches_through_one_prepared_launch(rng, monkeypatch):
    check_relaunch(rng, monkeypatch)


@pytest.mark.gpu
def test_relaunch_gpu(rng, monkeypatch):
    check_relaunch(rng, monkeypatch)


def check_rebind(rng):
    """matches/rebind: a launch of the same kernel, grid, block and scalars is run by the
    prepared one after rebind (its arrays put in); any other difference does not match."""
    args = _mixed_args(rng)
    prepared = Launch(_mixed, 3, 128, (cuda.device_array(300), *args)).prepare()
    new_args = (cuda.to_device(np.full(300, np.nan)), cuda.to_device(rng.standard_normal((5, 14)))[:, ::2],
                args[1], *args[2:])  # a new output and a new strided view; b the same array
    launch = Launch(_mixed, 3, 128, new_args)
    assert prepared.matches(launch)
    prepared.rebind(launch.args)
    prepared.run()
    expect = cuda.device_array(300)
    _mixed[3, 128](expect, *new_args[1:])
    cuda.synchronize()
    np.testing.assert_array_equal(new_args[0].copy_to_host(), expect.copy_to_host())
    for other in (Launch(_mixed, 2, 128, new_args), Launch(_mixed, 3, 64, new_args),
                  Launch(_other_kernel, 3, 128, new_args),
                  Launch(_mixed, 3, 128, (*new_args[:3], np.int32(-4), *new_args[4:])),
                  Launch(_mixed, 3, 128, (*new_args[:4], 2**40 + 6, *new_args[5:])),
                  Launch(_mixed, 3, 128, (*new_args[:3], -3, *new_args[4:])),  # an int, not an np.int32
                  Launch(_mixed, 3, 128, (*new_args[:2], np.float32(1), *new_args[3:]))):  # a scalar for an array
        assert not prepared.matches(other)


def test_a_matching_launch_is_rebound_into_a_prepared_one(rng):
    check_rebind(rng)


@pytest.mark.gpu
def test_rebind_gpu(rng):
    check_rebind(rng)


@pytest.mark.gpu
def test_launch_failure_names_the_cuda_error_gpu(rng):
    prepared = PreparedLaunch(_mixed, 1, 2048, (cuda.device_array(4), *_mixed_args(rng)))  # > 1024 threads
    with pytest.raises(HexcoreCudaError, match="CUDA_ERROR_INVALID_VALUE"):
        prepared.run()


def test_launch_description_runs_prepares_and_checks_its_path(rng):
    args = _mixed_args(rng)
    expect, got = cuda.device_array(40), cuda.device_array(40)
    launch = Launch(_mixed, 2, 32, (got, *args))
    assert not launch.empty and Launch(_mixed, (0, 1), 32, ()).empty
    launch.run()
    _mixed[2, 32](expect, *args)
    np.testing.assert_array_equal(got.copy_to_host(), expect.copy_to_host())
    with pytest.raises(HexcoreInvalidArgumentError, match="path"):
        launch.prepare("fast")


def test_dependent_launches_only_for_kernels_that_wait(rng):
    """``dependent=True`` is refused with the core path and for a kernel that does not wait
    for the grid before it (it would race with it); a kernel that says it waits is taken."""
    args = (cuda.device_array(40), *_mixed_args(rng))
    with pytest.raises(HexcoreInvalidArgumentError, match="dependent: True for kernel _mixed"):
        Launch(_mixed, 2, 32, args).prepare(dependent=True)
    with pytest.raises(HexcoreInvalidArgumentError, match="only with path 'raw'"):
        PreparedLaunch(_mixed, 2, 32, args, path="core", dependent=True)
    with pytest.raises(HexcoreInvalidArgumentError, match="expected a bool"):
        PreparedLaunch(_mixed, 2, 32, args, dependent=1)
    _waiting.waits_for_prior_grids = True
    prepared = Launch(_waiting, 2, 32, args).prepare(dependent=True)
    prepared.run()
    assert prepared.dependent and not Launch(_waiting, 2, 32, args).prepare().dependent


@cuda.jit
def _waiting(out, a2d, b1d, i32, i64, f32, f64, u8):
    pass
