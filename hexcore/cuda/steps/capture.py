"""CUDA graph capture of a step's launches, through torch or through the driver.

Each backend records ``enqueue(stream)`` once and replays it with one call. Launches
made during a capture must be capture-safe (:class:`PreparedLaunch`) and must have run
once before it (a kernel's module is loaded at its first launch, which a capture does
not allow).
"""

from __future__ import annotations

import warnings
import weakref

from ...errors import HexcoreCudaError, HexcoreInvalidArgumentError
from ..device import SIMULATOR
from ..streams import stream_handle, torch_with_cuda

BACKENDS = ("auto", "torch", "driver", "eager")
_warned: list = []


def check(result, call: str):
    """The output of a ``cuda.bindings`` call (a tuple led by its CUresult), or
    HexcoreCudaError naming ``call`` and the error when it failed."""
    err = result[0]
    if err:
        raise HexcoreCudaError(f"{call} failed: {getattr(err, 'name', err)} ({int(err)})")
    return result[1] if len(result) == 2 else None


class DriverGraph:
    """``enqueue`` captured by ``cuStreamBeginCapture`` on ``capture_stream`` (a numba
    stream, not the legacy default one), instantiated and uploaded once.

    ``replay(handle)`` launches it on any stream (a ``CUstream``) with ``cuGraphLaunch``.
    """

    def __init__(self, enqueue, capture_stream):
        from cuda.bindings import driver

        handle = stream_handle(capture_stream)
        mode = driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        check(driver.cuStreamBeginCapture(handle, mode), "cuStreamBeginCapture")
        try:
            enqueue(capture_stream)
        except BaseException:
            driver.cuStreamEndCapture(handle)  # leave the stream usable; the launch error is the one to raise
            raise
        graph = check(driver.cuStreamEndCapture(handle), "cuStreamEndCapture")
        try:
            self._exec = check(driver.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
        finally:
            driver.cuGraphDestroy(graph)
        weakref.finalize(self, driver.cuGraphExecDestroy, self._exec)
        check(driver.cuGraphUpload(self._exec, handle), "cuGraphUpload")
        self._launch = driver.cuGraphLaunch

    def replay(self, handle) -> None:
        """Launch the graph on the stream ``handle`` (a ``CUstream``)."""
        err = self._launch(self._exec, handle)[0]
        if err:
            raise HexcoreCudaError(f"cuGraphLaunch failed: {getattr(err, 'name', err)} ({int(err)})")


class TorchGraph:
    """``enqueue`` captured into a ``torch.cuda.CUDAGraph`` on the torch side stream
    ``capture_stream``; ``enqueue`` gets ``numba_stream``, a numba view of that stream.

    ``replay()`` launches it on torch's current stream (``torch.cuda.stream(...)`` picks
    another).
    """

    def __init__(self, enqueue, capture_stream, numba_stream):
        import torch

        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, stream=capture_stream, capture_error_mode="thread_local"):
            enqueue(numba_stream)

    def replay(self) -> None:
        """Launch the graph on torch's current stream."""
        self.graph.replay()


def choose_backend(name: str) -> tuple:
    """(backend, torch module or None) for the backend asked for: one of BACKENDS;
    "auto" is torch when torch with CUDA is installed, else driver. The simulator has
    no graphs: every backend is eager there, and the first DecodeGraph says so."""
    if not isinstance(name, str) or name not in BACKENDS:
        raise HexcoreInvalidArgumentError(f"backend: expected one of {BACKENDS}, got {name!r}")
    if SIMULATOR:
        if name != "eager" and not _warned:
            _warned.append(True)
            warnings.warn("DecodeGraph: CUDA graphs need a GPU; on the simulator steps run eagerly", stacklevel=3)
        return "eager", None
    torch = torch_with_cuda()
    if name == "torch" and torch is None:
        raise HexcoreInvalidArgumentError("backend: 'torch' needs torch with CUDA, which is not installed")
    return ("torch" if torch is not None else "driver") if name == "auto" else name, torch
