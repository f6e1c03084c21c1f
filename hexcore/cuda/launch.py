"""PreparedLaunch: a numba kernel launch marshalled once and replayed with one driver call.

numba's ``kernel[grid, block](*args)`` types and marshals every argument on every call
(25 us for one array, 55 us for eight; DESIGN.md §4). For buffers that keep their
device addresses between steps, the parameter list can be built once:

1. numba's own ``_prepare_args`` turns each argument into the values of the compiled
   kernel's ABI (an array becomes meminfo, parent, nitems, itemsize, data, shape...,
   strides...; scalars become ctypes values);
2. :func:`kernel_params` stores each value once in a ctypes scalar of the width
   ``cuda.core.launch`` would give it (a Python int is an ``intptr_t``, a float a
   ``double``, a ctypes scalar keeps its type), and a ``void*[n]`` array holds their
   addresses: the ``kernelParams`` of ``cuLaunchKernel``;
3. ``run`` is then one ``cuda.bindings.driver.cuLaunchKernel`` call.

Nothing in ``run`` allocates, synchronises or reads device memory, so it is safe inside
CUDA graph capture. ``HEXCORE_LAUNCH=core`` replays through ``cuda.core.launch``
instead (numba's own path, which re-converts every parameter on every run).
"""

from __future__ import annotations

import ctypes
import os

import numpy as np

from ..errors import HexcoreCudaError, HexcoreInvalidArgumentError
from .device import SIMULATOR

LAUNCH_PATH = os.environ.get("HEXCORE_LAUNCH", "raw")  # "raw" (cuLaunchKernel) or "core" (cuda.core)
MAX_STREAMS = 256  # stream handles remembered by id (each entry keeps its stream alive)
_streams: dict = {}  # id(stream) -> (stream, CUstream)


class PreparedLaunch:
    """One kernel with fixed grid, block and arguments; ``run(stream)`` enqueues it.

    The argument arrays are kept alive by this object; their contents may change
    between runs, their addresses must not. On the simulator it is a plain launch.
    """

    def __init__(self, dispatcher, griddim, blockdim, args):
        self._dispatcher, self._griddim, self._blockdim = dispatcher, griddim, blockdim
        self._args = tuple(args)
        self.grid, self.block = _dim3(griddim), _dim3(blockdim)
        if SIMULATOR:
            return
        argtypes = tuple(dispatcher.typeof_pyval(a) for a in self._args)
        kernel = dispatcher.compile(argtypes)
        values: list = []
        for argtype, value in zip(kernel.argument_types, self._args):
            kernel._prepare_args(argtype, value, 0, [], values)  # numba's own marshalling, done once
        function = kernel._codelibrary.get_cufunc()
        self.name, self._core = function.name, None
        if LAUNCH_PATH == "core":
            from cuda.core import LaunchConfig

            self._core = (function.kernel, LaunchConfig(grid=griddim, block=blockdim, shmem_size=0), values)
            return
        from cuda.bindings import driver

        self._keep, self._params = kernel_params(values)
        # numba-cuda loads modules as libraries: the handle is a CUkernel, which
        # cuLaunchKernel takes in place of a CUfunction (cuda.core casts it the same way)
        self._head = (driver.CUfunction(int(function.handle)), *self.grid, *self.block, 0)
        self._launch = driver.cuLaunchKernel

    def run(self, stream=0) -> None:
        """Enqueue the kernel on ``stream``: a numba stream, a raw ``CUstream`` handle (int)
        or object, or 0 for the default stream."""
        if SIMULATOR:
            self._dispatcher[self._griddim, self._blockdim, stream](*self._args)
            return
        entry = _streams.get(id(stream))
        if entry is None:
            entry = _remember_stream(stream)
        if self._core is not None:
            from cuda.core import Stream, launch

            function, config, values = self._core
            launch(Stream.from_handle(int(entry[1])), config, function, *values)
            return
        err = self._launch(*self._head, entry[1], self._params, 0)[0]
        if err:
            self._retry(err, entry[1])

    def _retry(self, err, handle) -> None:
        # a thread that never touched numba has no current context: make numba's
        # current, then try once more; any other error is raised with its name
        from cuda.bindings import driver

        if err == driver.CUresult.CUDA_ERROR_INVALID_CONTEXT:
            from numba import cuda

            cuda.current_context()
            err = self._launch(*self._head, handle, self._params, 0)[0]
        if err:
            raise HexcoreCudaError(f"cuLaunchKernel({self.name}, grid {self.grid}, block {self.block}) failed: "
                                   f"{getattr(err, 'name', err)} ({int(err)})")


def kernel_params(values) -> tuple[tuple, int]:
    """ctypes storage for marshalled kernel parameters and their ``void*`` array.

    ``values``: what numba's ``_prepare_args`` produced (Python ints, floats, bools,
    numpy or ctypes scalars). Returns (objects that must stay alive, the address of
    the ``void*[n]`` array), the address being what ``cuLaunchKernel`` takes as
    ``kernelParams``. Widths follow ``cuda.core``'s ``ParamHolder``.
    """
    scalars = tuple(_as_ctypes(value, i) for i, value in enumerate(values))
    array = (ctypes.c_void_p * max(1, len(scalars)))(*(ctypes.addressof(s) for s in scalars))
    return (scalars, array), ctypes.addressof(array)


_NUMPY_CTYPES = {np.dtype(t): c for t, c in (
    (np.bool_, ctypes.c_bool), (np.int8, ctypes.c_int8), (np.int16, ctypes.c_int16), (np.int32, ctypes.c_int32),
    (np.int64, ctypes.c_int64), (np.uint8, ctypes.c_uint8), (np.uint16, ctypes.c_uint16),
    (np.uint32, ctypes.c_uint32), (np.uint64, ctypes.c_uint64), (np.float32, ctypes.c_float),
    (np.float64, ctypes.c_double))}


def _as_ctypes(value, index: int):
    if isinstance(value, ctypes._SimpleCData):
        return value
    if isinstance(value, (bool, int)):  # bool too: cuda.core checks int first
        return ctypes.c_ssize_t(int(value))  # intptr_t: pointers, sizes, shapes, strides
    if isinstance(value, float):
        return ctypes.c_double(value)
    if isinstance(value, np.generic):
        if value.dtype == np.float16:
            return ctypes.c_uint16(int(value.view(np.uint16)))
        if value.dtype in _NUMPY_CTYPES:
            return _NUMPY_CTYPES[value.dtype](value.item())
    raise HexcoreInvalidArgumentError(f"kernel parameter {index}: unsupported type {type(value).__name__}")


def stream_handle(stream):
    """The ``CUstream`` of ``stream``: 0 or None (the default stream), an int handle, a
    numba stream, or anything with ``__cuda_stream__`` or ``cuda_stream`` (torch)."""
    from cuda.bindings import driver

    if stream is None or isinstance(stream, (bool, int)):
        if isinstance(stream, bool):
            raise HexcoreInvalidArgumentError(f"stream: expected a stream or handle, got {stream!r}")
        return driver.CUstream(int(stream or 0))
    if isinstance(stream, driver.CUstream):
        return stream
    handle = getattr(stream, "handle", None)  # numba Stream: a CUstream (value 0 for the default stream)
    if handle is not None:
        return driver.CUstream(int(handle))
    if hasattr(stream, "__cuda_stream__"):
        return driver.CUstream(int(stream.__cuda_stream__()[1]))
    if hasattr(stream, "cuda_stream"):
        return driver.CUstream(int(stream.cuda_stream))
    raise HexcoreInvalidArgumentError(f"stream: expected a numba or torch stream or a handle, got "
                                      f"{type(stream).__name__}")


def _remember_stream(stream) -> tuple:
    if len(_streams) >= MAX_STREAMS:
        _streams.clear()
    entry = _streams[id(stream)] = (stream, stream_handle(stream))  # keeps `stream`, so its id stays unique
    return entry


def _dim3(dim) -> tuple[int, int, int]:
    dims = tuple(int(d) for d in (dim if isinstance(dim, tuple) else (dim,)))
    return (dims + (1, 1, 1))[:3]
