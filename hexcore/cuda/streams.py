"""Which CUDA stream a launch goes to: one policy for every launcher.

``resolve_stream(stream, *arrays)`` gives a :class:`Stream` (what numba's
``kernel[grid, block, stream]`` takes, and the raw ``CUstream`` handle that
``cuLaunchKernel`` and the graph calls take):

- ``stream`` given: that stream. It may be a numba stream, a torch stream, anything with
  ``__cuda_stream__``, a ``CUstream`` or an int handle (0 is the default stream).
- otherwise, when any of ``arrays`` is a torch tensor: torch's current stream. torch
  exports ``__cuda_array_interface__`` without a stream, so work must follow the caller's
  stream, as torch's own ops do.
- otherwise the default stream.

Resolved streams are cached per raw handle, so the objects stay stable (prepared
launches and graphs look them up by identity) and a repeated call costs a dict lookup.
"""

from __future__ import annotations

from typing import NamedTuple

from .._checks import shown
from ..errors import HexcoreInvalidArgumentError
from .device import SIMULATOR

MAX_STREAMS = 256  # handles remembered (each entry keeps its stream alive)


class Stream(NamedTuple):
    """A resolved stream: ``numba`` for numba launches (a numba stream, or 0 for the
    default stream), ``handle`` the ``CUstream`` (None on the simulator)."""

    numba: object
    handle: object


DEFAULT = Stream(0, None)
_by_handle: dict = {}
_torch_device: list = []


def resolve_stream(stream=None, *arrays) -> Stream:
    """The stream to launch on (see the module docstring)."""
    if isinstance(stream, Stream):
        return stream
    if SIMULATOR:
        return Stream(0 if stream is None else _simulated_stream(stream), None)
    if stream is None:
        if not any(type(a).__module__.startswith("torch") for a in arrays):
            raw = 0
        else:
            raw = torch_current_stream()
    else:
        raw = raw_handle(stream)
    found = _by_handle.get(raw)
    if found is None:
        from numba import cuda

        if len(_by_handle) >= MAX_STREAMS:
            _by_handle.clear()
        found = _by_handle[raw] = Stream(cuda.external_stream(raw) if raw else 0, stream_handle(raw))
    return found


def torch_stream(torch, stream, resolved: Stream):
    """A context in which torch's work goes to ``resolved`` (what ``stream``, given by the
    caller, resolved to); no change when ``stream`` is None or already torch's current one.

    A torch stream is entered as given and handle 0 as torch's own default stream: wrapping
    handle 0 in ``torch.cuda.ExternalStream`` gave wrong prefill outputs on a busy H200
    (2026-12-01), which the default stream's own object does not."""
    import contextlib

    if stream is None:
        return contextlib.nullcontext()
    if isinstance(stream, torch.cuda.Stream):
        return torch.cuda.stream(stream)
    handle = int(resolved.handle or 0)
    if handle == torch.cuda.current_stream().cuda_stream:
        return contextlib.nullcontext()
    return torch.cuda.stream(torch.cuda.default_stream() if handle == 0 else torch.cuda.ExternalStream(handle))


def _simulated_stream(stream):
    # What the GPU path would accept, refused as it would refuse it (the simulator has no
    # handles): a numba (simulator) stream, an int handle, or a stream-like object.
    if isinstance(stream, bool) or not (_is_handle(stream) or type(stream).__module__.startswith("numba")
                                        or hasattr(stream, "__cuda_stream__") or hasattr(stream, "cuda_stream")):
        raise HexcoreInvalidArgumentError(f"stream: expected a numba or torch stream or a handle, got "
                                          f"{type(stream).__name__} {shown(stream)}")
    return stream


def _is_handle(stream) -> bool:
    # an int CUstream value (0 is the default stream)
    return type(stream) is int and 0 <= stream < 2**64


def torch_with_cuda():
    """The torch module when torch with CUDA is installed and this is a real GPU (not the
    simulator), else None: the one test of whether torch can run beside the kernels."""
    if SIMULATOR:
        return None
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def torch_current_stream() -> int:
    """torch's current CUDA stream as a raw handle. ``torch.cuda.current_stream()``
    builds a Stream object per call (several us); the C accessor does not."""
    import torch

    raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw_stream is None:
        return torch.cuda.current_stream().cuda_stream
    if not _torch_device:
        _torch_device.append(torch.cuda.current_device())
    return raw_stream(_torch_device[0])


def raw_handle(stream) -> int:
    """``int(stream_handle(stream))``; a torch stream's read from its ``cuda_stream`` with no
    ``CUstream`` built (``resolve_stream`` runs per launch: a transformers forward passes
    torch's current stream at every layer)."""
    if type(stream).__module__.startswith("torch") and not hasattr(stream, "handle"):
        raw = getattr(stream, "cuda_stream", None)
        if type(raw) is int and _is_handle(raw):
            return raw
    return int(stream_handle(stream))


def stream_handle(stream):
    """The ``CUstream`` of ``stream``: 0 or None (the default stream), an int handle, a
    numba stream, a :class:`Stream`, or anything with ``__cuda_stream__`` or
    ``cuda_stream`` (torch)."""
    from cuda.bindings import driver

    if isinstance(stream, Stream):
        return stream.handle if stream.handle is not None else driver.CUstream(0)
    if stream is None or isinstance(stream, (bool, int)):
        if isinstance(stream, bool) or not (stream is None or _is_handle(int(stream))):
            raise HexcoreInvalidArgumentError(f"stream: expected a stream or a handle in [0, 2**64), got {stream!r}")
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
