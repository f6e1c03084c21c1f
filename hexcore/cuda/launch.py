"""PreparedLaunch: a numba kernel launch marshalled once and replayed cheaply.

numba's ``kernel[grid, block](*args)`` re-types and re-marshals every argument on
every call (tens of microseconds for a dozen arrays). For buffers that stay at the
same device addresses between steps, the kernel's parameter list can be built once;
``run`` then only enqueues the launch. Nothing in ``run`` allocates, synchronises or
reads device memory, so it is safe inside CUDA graph capture.
"""

from __future__ import annotations

from .device import SIMULATOR


class PreparedLaunch:
    """One kernel with fixed grid, block and arguments; ``run(stream)`` enqueues it.

    The argument arrays are kept alive by this object; their contents may change
    between runs, their addresses must not. On the simulator it is a plain launch.
    """

    def __init__(self, dispatcher, griddim, blockdim, args):
        self._dispatcher, self._griddim, self._blockdim, self._args = dispatcher, griddim, blockdim, tuple(args)
        if SIMULATOR:
            return
        from cuda.core import LaunchConfig

        argtypes = tuple(dispatcher.typeof_pyval(a) for a in self._args)
        kernel = dispatcher.compile(argtypes)
        params: list = []
        for argtype, value in zip(kernel.argument_types, self._args):
            kernel._prepare_args(argtype, value, 0, [], params)  # numba's own marshalling, done once
        self._params = params
        self._function = kernel._codelibrary.get_cufunc().kernel
        self._config = LaunchConfig(grid=griddim, block=blockdim, shmem_size=0)
        self._streams: dict = {}

    def run(self, stream=0) -> None:
        """Enqueue the kernel on ``stream`` (a numba stream, or 0 for the default)."""
        if SIMULATOR:
            self._dispatcher[self._griddim, self._blockdim, stream](*self._args)
            return
        from cuda.core import launch

        core_stream = self._streams.get(id(stream))
        if core_stream is None:
            from numba.cuda.cudadrv import driver

            core_stream = self._streams[id(stream)] = driver._to_core_stream(stream)
        launch(core_stream, self._config, self._function, *self._params)
