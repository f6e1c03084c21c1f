"""Launch descriptions: ``Launch`` (what a validator returns) and ``PreparedLaunch``.

Every launcher validates its arguments and returns a :class:`Launch`: the kernel, grid,
block and argument tuple, with ``run(stream)`` (a plain numba launch) and ``prepare()``
(the same launch marshalled once, for buffers that keep their device addresses).

numba's ``kernel[grid, block](*args)`` types and marshals every argument on every call
(25 us for one array, 55 us for eight, measured on the H200 machine). A
:class:`PreparedLaunch` builds the parameter list once:

1. numba's own ``_prepare_args`` turns each argument into the values of the compiled
   kernel's ABI (an array becomes meminfo, parent, nitems, itemsize, data, shape...,
   strides...; scalars become ctypes values);
2. :func:`kernel_params` stores each value once in a ctypes scalar of the width
   ``cuda.core.launch`` would give it (a Python int is an ``intptr_t``, a float a
   ``double``, a ctypes scalar keeps its type), and a ``void*[n]`` array holds their
   addresses: the ``kernelParams`` of ``cuLaunchKernel``;
3. ``run`` is then one ``cuda.bindings.driver.cuLaunchKernel`` call.

Nothing in ``run`` allocates, synchronises or reads device memory, so it is safe inside
CUDA graph capture. ``path="core"`` replays through ``cuda.core.launch`` instead
(numba's own path, which re-converts every parameter on every run).
"""

from __future__ import annotations

import ctypes
from typing import NamedTuple

import numpy as np

from ..errors import HexcoreCudaError, HexcoreInvalidArgumentError
from .arrays import is_numba_array
from .device import SIMULATOR
from .streams import resolve_stream, stream_handle
from .views import memo

PATHS = ("raw", "core")  # cuLaunchKernel, or cuda.core.launch
MAX_CLUSTER = 8  # the portable thread block cluster size


class Launch(NamedTuple):
    """One validated kernel launch: ``kernel[grid, block, stream](*args)``.

    ``grid``, ``block``: ints or tuples of up to three; ``args``: the kernel's arguments.
    """

    kernel: object
    grid: object
    block: object
    args: tuple

    @property
    def empty(self) -> bool:
        """True when the grid has no CTA (nothing to launch)."""
        return any(d == 0 for d in _dim3(self.grid))

    def run(self, stream=None) -> None:
        """Launch now on ``stream`` (see ``streams.resolve_stream``); nothing for an empty grid."""
        if not self.empty:
            self.kernel[self.grid, self.block, resolve_stream(stream).numba](*self.args)

    def prepare(self, path: str = "raw", dependent: bool = False, cluster: int = 1) -> "PreparedLaunch":
        """This launch marshalled once: ``run(stream)`` replays it (capture-safe);
        ``dependent``: as a programmatic dependent launch, ``cluster``: in thread block
        clusters of that many CTAs along x (:class:`PreparedLaunch`)."""
        return PreparedLaunch(self.kernel, self.grid, self.block, self.args, path=path, dependent=dependent,
                              cluster=cluster)


class PreparedLaunch:
    """One kernel with fixed grid, block and arguments; ``run(stream)`` enqueues it.

    The argument arrays are kept alive by this object; their contents may change
    between runs, their addresses must not. On the simulator it is a plain launch.

    ``dependent=True`` (``path`` "raw" only): each run is a programmatic dependent launch
    (``cuLaunchKernelEx`` with ``CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION``): the
    GPU may start its CTAs before the kernel ahead of it on the stream has finished, once
    every CTA of that kernel has called ``device.allow_dependent_grids`` (or exited). Only for
    a kernel that calls ``device.wait_prior_grids`` before it touches global memory and says
    so with a true ``waits_for_prior_grids`` attribute (others are refused).

    ``cluster`` > 1 (``path`` "raw" only, a GPU of compute capability 9.0 or newer): each run
    launches the grid in thread block clusters of ``cluster`` consecutive CTAs along x
    (``CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION``), which the GPU schedules together and whose
    CTAs can read each other's shared memory (``device.load_cluster_f32``); the grid's x must
    be a multiple of it, at most 8. On the simulator (no clusters) it is refused.
    """

    def __init__(self, dispatcher, griddim, blockdim, args, path: str = "raw", dependent: bool = False,
                 cluster: int = 1):
        if path not in PATHS:
            raise HexcoreInvalidArgumentError(f"path: expected one of {PATHS}, got {path!r}")
        if not isinstance(dependent, bool) or (dependent and path != "raw"):
            raise HexcoreInvalidArgumentError(f"dependent: expected a bool, True only with path 'raw', got "
                                              f"{dependent!r} with path {path!r}")
        name = getattr(getattr(dispatcher, "py_func", None), "__name__", dispatcher)
        if dependent and not getattr(dispatcher, "waits_for_prior_grids", False):
            raise HexcoreInvalidArgumentError(
                f"dependent: True for kernel {name!s}, which does not wait for the grid before it "
                f"(no waits_for_prior_grids): it would race with that grid")
        self.dependent = dependent
        self._dispatcher, self._griddim, self._blockdim = dispatcher, griddim, blockdim
        self._args = tuple(args)
        self.grid, self.block = _dim3(griddim), _dim3(blockdim)
        if isinstance(cluster, bool) or not isinstance(cluster, int) or not 1 <= cluster <= MAX_CLUSTER \
                or self.grid[0] % cluster or (cluster > 1 and (path != "raw" or SIMULATOR)):
            where = " on the simulator" if SIMULATOR else ""
            raise HexcoreInvalidArgumentError(
                f"cluster: expected an int in [1, {MAX_CLUSTER}] dividing the grid's x {self.grid[0]}, above 1 "
                f"only with path 'raw' on a GPU, got {cluster!r} with path {path!r}{where}")
        merges = bool(getattr(dispatcher, "merges_in_cluster", False))
        if not SIMULATOR and (merges != (cluster > 1) or (merges and cluster != self.grid[0])):
            raise HexcoreInvalidArgumentError(  # (the simulator runs a cluster kernel as clusters of one)
                f"cluster: {cluster} for kernel {name!s} on grid {self.grid}, which "
                f"{'merges in clusters of the grid x: it needs them' if merges else 'does not merge in clusters'}")
        self.cluster = cluster
        if SIMULATOR:
            return
        argtypes = tuple(dispatcher.typeof_pyval(a) for a in self._args)
        kernel = dispatcher.compile(argtypes)
        self._kernel, self._argtypes = kernel, argtypes
        values: list = []
        self._first = []  # argument i -> the index of its first marshalled value
        for argtype, value in zip(kernel.argument_types, self._args):
            self._first.append(len(values))
            kernel._prepare_args(argtype, value, 0, [], values)  # numba's own marshalling, done once
        function = kernel._codelibrary.get_cufunc()
        self.name, self._core = function.name, None
        if path == "core":
            from cuda.core import LaunchConfig

            self._core = (function.kernel, LaunchConfig(grid=griddim, block=blockdim, shmem_size=0), values)
            return
        from cuda.bindings import driver

        self._keep, self._params = kernel_params(values)
        # numba-cuda loads modules as libraries: the handle is a CUkernel, which
        # cuLaunchKernel takes in place of a CUfunction (cuda.core casts it the same way)
        self._head = (driver.CUfunction(int(function.handle)), *self.grid, *self.block, 0)
        self._launch = driver.cuLaunchKernel
        self._configs: dict = {}  # CUstream handle -> its CUlaunchConfig (dependent or cluster launches)

    def as_launch(self) -> Launch:
        """The :class:`Launch` this replays, with its arguments as they are now (after any
        ``set_array`` / ``set_scalar`` / ``rebind``): to compile, inspect or re-prepare it,
        e.g. with another kernel of the same arguments (``launch._replace(kernel=k)``). It does
        not carry ``cluster`` or ``dependent``: re-prepare a cluster kernel with its cluster."""
        return Launch(self._dispatcher, self.grid, self.block, self._args)

    def set_scalar(self, index: int, value: int) -> None:
        """Argument ``index``, an int the launch was prepared with, becomes ``value`` for the
        runs that follow (a layer index: one prepared launch serves every layer). Runs
        already enqueued keep the value they had (``cuLaunchKernel`` copies its parameters)."""
        old = self._args[index] if 0 <= index < len(self._args) else None
        if type(old) is not int:
            raise HexcoreInvalidArgumentError(f"index: argument {index} is not an int argument of this launch")
        value = int(value)
        self._args = self._args[:index] + (value,) + self._args[index + 1:]
        if SIMULATOR:
            return
        at = self._first[index]  # an int argument is one value
        if self._core is not None:
            values = self._core[2]
            values[at] = type(values[at])(value)  # the ctypes integer numba marshalled
        else:
            self._keep[0][at].value = value

    def set_array(self, index: int, array) -> None:
        """Argument ``index``, an array the launch was prepared with, becomes ``array`` for the
        runs that follow: a device array of the same numba type (dtype, dimensions, layout)
        at another address, such as another layer's view of one buffer. Its shape may
        differ (it is part of the marshalled values); the launch keeps ``array`` alive. Runs
        already enqueued keep the array they had. An array's numba type and marshalled values
        are kept on it (:func:`marshalled`): setting the same array objects again, as a
        step's layers do, costs no numba call."""
        old = self._args[index] if 0 <= index < len(self._args) else None
        if not (is_numba_array(old) and is_numba_array(array)):
            raise HexcoreInvalidArgumentError(f"index: argument {index} is not a device array argument of this "
                                              f"launch, or the new value is not a numba device array")
        if array is old:
            return  # (its values are in place)
        if SIMULATOR:
            if np.dtype(array.dtype) != np.dtype(old.dtype) or array.ndim != old.ndim:
                raise HexcoreInvalidArgumentError(f"array: expected {old.dtype} with {old.ndim} dimensions like "
                                                  f"argument {index}, got {array.dtype} with {array.ndim}")
        else:
            argtype, values, plain = marshalled(self._dispatcher, self._kernel, array)
            if argtype != self._argtypes[index]:
                raise HexcoreInvalidArgumentError(f"array: expected {self._argtypes[index]} like argument {index}, "
                                                  f"got {argtype}")
            at = self._first[index]
            if self._core is not None:
                self._core[2][at:at + len(values)] = values
            else:
                for cell, value in zip(self._keep[0][at:at + len(plain)], plain):
                    cell.value = value
        self._args = self._args[:index] + (array,) + self._args[index + 1:]

    def matches(self, launch: Launch) -> bool:
        """True when ``launch`` is this kernel with this grid and block and equal non-array
        arguments: :meth:`rebind` can then make this launch run ``launch``."""
        if launch.kernel is not self._dispatcher or _dim3(launch.grid) != self.grid \
                or _dim3(launch.block) != self.block or len(launch.args) != len(self._args):
            return False
        for old, new in zip(self._args, launch.args):
            if is_numba_array(old) != is_numba_array(new):
                return False
            if not is_numba_array(old) and (type(old) is not type(new) or old != new):
                return False
        return True

    def rebind(self, args: tuple) -> None:
        """Put the arrays of ``args`` (a :meth:`matches` launch's) in place of this launch's,
        skipping those that are already the same memory, shape and strides (cheaper than a
        new prepare: no typing of the other arguments, no new parameter array)."""
        for index, (old, new) in enumerate(zip(self._args, args)):
            if is_numba_array(new) and new is not old and _layout(new) != _layout(old):
                self.set_array(index, new)

    def run(self, stream=0) -> None:
        """Enqueue the kernel on ``stream``: a numba stream, a raw ``CUstream`` handle (int)
        or object, or 0 for the default stream."""
        if SIMULATOR:
            self._dispatcher[self._griddim, self._blockdim, resolve_stream(stream).numba](*self._args)
            return
        entry = _streams.get(id(stream))
        if entry is None:
            entry = _remember_stream(stream)
        if self._core is not None:
            from cuda.core import Stream, launch

            function, config, values = self._core
            launch(Stream.from_handle(int(entry[1])), config, function, *values)
            return
        err = self._enqueue(entry[1])
        if err:
            self._retry(err, entry[1])

    def max_active_clusters(self) -> int | None:
        """How many of this launch's clusters the GPU holds at once (the driver's
        ``cuOccupancyMaxActiveClusters`` for its kernel, block and cluster size): a grid of
        more clusters than that runs in more than one wave. None without clusters (``cluster``
        1) or on the simulator."""
        if SIMULATOR or self.cluster == 1:
            return None
        from cuda.bindings import driver
        from numba import cuda

        cuda.current_context()  # (the kernel handle is a CUkernel cast to a CUfunction, as for
        # the launch: the driver reads the current context for it)
        err, count = driver.cuOccupancyMaxActiveClusters(self._head[0], self._config(driver, driver.CUstream(0)))
        if err:
            raise HexcoreCudaError(f"cuOccupancyMaxActiveClusters({self.name}, cluster {self.cluster}) failed: "
                                   f"{getattr(err, 'name', err)} ({int(err)})")
        return int(count)

    def _enqueue(self, handle):
        # the driver's launch on stream `handle`: its error code (0: enqueued)
        if self.dependent or self.cluster > 1:
            return self._launch_ex(handle)
        return self._launch(*self._head, handle, self._params, 0)[0]

    def _launch_ex(self, handle):
        # cuLaunchKernelEx with this launch's attributes (dependent, cluster)
        from cuda.bindings import driver

        return driver.cuLaunchKernelEx(self._config(driver, handle), self._head[0], self._params, 0)[0]

    def _config(self, driver, handle):
        # the CUlaunchConfig of this launch on stream `handle` (made once per stream)
        config = self._configs.get(int(handle))
        if config is None:
            if len(self._configs) >= MAX_STREAMS:
                self._configs.clear()
            attributes = []
            if self.dependent:
                attribute = driver.CUlaunchAttribute()
                attribute.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
                attribute.value.programmaticStreamSerializationAllowed = 1
                attributes.append(attribute)
            if self.cluster > 1:
                attribute = driver.CUlaunchAttribute()
                attribute.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
                attribute.value.clusterDim.x, attribute.value.clusterDim.y = self.cluster, 1
                attribute.value.clusterDim.z = 1
                attributes.append(attribute)
            config = driver.CUlaunchConfig()
            config.gridDimX, config.gridDimY, config.gridDimZ = self.grid
            config.blockDimX, config.blockDimY, config.blockDimZ = self.block
            config.sharedMemBytes, config.hStream = 0, handle
            config.attrs, config.numAttrs = attributes, len(attributes)
            self._configs[int(handle)] = config
        return config

    def _retry(self, err, handle) -> None:
        # a thread that never touched numba has no current context: make numba's
        # current, then try once more; any other error is raised with its name
        from cuda.bindings import driver

        if err == driver.CUresult.CUDA_ERROR_INVALID_CONTEXT:
            from numba import cuda

            cuda.current_context()
            err = self._enqueue(handle)
        if err:
            call = "cuLaunchKernelEx" if self.dependent or self.cluster > 1 else "cuLaunchKernel"
            raise HexcoreCudaError(f"{call}({self.name}, grid {self.grid}, block {self.block}) failed: "
                                   f"{getattr(err, 'name', err)} ({int(err)})")


class Relaunch:
    """Eager launches replayed through prepared ones kept across calls: ``run(launch,
    stream)`` runs :class:`Launch` ``launch`` through the kept :class:`PreparedLaunch` of its
    kernel, grid, block and non-array arguments (their types too), its arrays put in
    (:meth:`PreparedLaunch.rebind`: nothing to do for arrays it already holds, as kept views
    are), or prepares one and keeps it.

    For a loop that makes alike launches step after step (a format by age's appends, seals
    and re-seals): numba's eager launch types and marshals every argument on every call
    (25-55 us on the H200), a prepared run is one ``cuLaunchKernel``. A run already enqueued
    keeps the arguments it had (``cuLaunchKernel`` copies them), so rebinding for the next is
    safe. Up to ``size`` kept (then all dropped: a loop whose grids drift makes them anew);
    the kept launches keep their last arrays alive.
    """

    def __init__(self, size: int = 64):
        self._kept: dict = {}
        self._size = size

    def run(self, launch: Launch, stream=None) -> None:
        """Enqueue ``launch`` on ``stream`` (``streams.resolve_stream``); nothing for an empty grid."""
        if launch.empty:
            return
        key = (launch.kernel, _dim3(launch.grid), _dim3(launch.block),
               tuple(None if is_numba_array(a) else (type(a), a) for a in launch.args))
        try:
            prepared = self._kept.get(key)
        except TypeError:  # an argument that is no array and cannot be a key: run it as it is
            launch.run(stream)
            return
        if prepared is None:
            if len(self._kept) >= self._size:
                self._kept.clear()
            prepared = self._kept[key] = launch.prepare()
        else:
            prepared.rebind(launch.args)
        prepared.run(resolve_stream(stream))


def marshalled(dispatcher, kernel, array) -> tuple:
    """(numba type, marshalled values, their plain Python values) of device ``array`` as an
    argument of ``kernel``, the compiled kernel of ``dispatcher`` (its ``typeof_pyval`` and
    numba's ``_prepare_args``, as at prepare: meminfo, parent, nitems, itemsize, data,
    shape..., strides...; the plain values are what :func:`kernel_params`' ctypes cells
    hold), kept on ``array`` (``views.memo``): they depend only on its layout, which never
    changes, unless the kernel has argument extensions (then made anew)."""
    def make(a):
        argtype, values = dispatcher.typeof_pyval(a), []
        kernel._prepare_args(argtype, a, 0, [], values)
        return argtype, tuple(values), tuple(_as_ctypes(v, i).value for i, v in enumerate(values))

    if getattr(kernel, "extensions", None):
        return make(array)
    return memo(array, ("marshalled",), make)


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


MAX_STREAMS = 256  # streams remembered by id (each entry keeps its stream alive)
_streams: dict = {}  # id(stream) -> (stream, CUstream)


def _remember_stream(stream) -> tuple:
    if len(_streams) >= MAX_STREAMS:
        _streams.clear()
    entry = _streams[id(stream)] = (stream, stream_handle(stream))  # keeps `stream`, so its id stays unique
    return entry


def _layout(array) -> tuple:
    """(address, shape, strides, dtype) of a device array (the simulator's: its object), kept
    on the array (``views.memo``)."""
    if SIMULATOR:
        return (id(array),)
    return memo(array, ("layout",), _interface_layout)


def _interface_layout(array) -> tuple:
    iface = array.__cuda_array_interface__
    return iface["data"][0], iface["shape"], iface["strides"], iface["typestr"]


def _dim3(dim) -> tuple[int, int, int]:
    dims = tuple(int(d) for d in (dim if isinstance(dim, tuple) else (dim,)))
    return (dims + (1, 1, 1))[:3]
