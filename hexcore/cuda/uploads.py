"""A step's small index arrays to the device in one copy.

An eager step (a format by age's tiered step, ``engine_tiered.py``) launches kernels that
read a dozen small int32 arrays: each pool's block tables and lengths, tail slots, the
slots and blocks of its seals. Copied one by one, each is a device allocation and a
synchronous copy on the default stream (which waits for the work queued before it): on
the H200 that made a 4-layer INT2-aged step cost 10.7 ms of host time against 0.16 ms for
a plain INT2 step (2026-12-02). Here they are packed into one buffer and copied once:

    views = upload_once([tables, lens, slots])        # a fresh device buffer, one copy

    uploads = Uploads()                               # an engine's, reused by every step
    uploads.begin(stream)                             # a step starts (waits for a free turn)
    views = uploads.put([tables, lens, slots])        # one async copy from pinned memory
    ... launches reading ``views`` on ``stream`` ...

``Uploads`` keeps two turns of (pinned host buffer, device buffer, event). ``begin``
records an event on the previous step's stream (all its launches are queued by then) and
takes the other turn, waiting on the event recorded after the step that used it last: no
copy overwrites an array that a queued kernel still reads, on any stream, and the host
runs at most one step ahead. Each array starts on a 16-byte boundary; the views have the
arrays' shapes. A view is kept per (buffer, offset, shape) (``views.memo``): a serving loop
puts the same shapes at the same offsets of a turn step after step, and gets the same view
objects, which a prepared launch rebinding them finds unchanged (numba makes a view in
Python, tens of us on the H200; a new buffer, after growth, has none yet).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from numba import cuda

from .._checks import as_int, shown
from ..errors import HexcoreInvalidArgumentError, HexcoreOOMError
from .arrays import device_pointer
from .device import SIMULATOR
from .streams import resolve_stream
from .views import memo

WORDS = 4  # int32 words per 16 bytes: every packed array starts at a multiple
MAX_WORDS = 2**31 - 1  # the most int32 words of an Uploads' first buffers, and the largest scratch dimension


def packed_offsets(arrays: Sequence[np.ndarray]) -> tuple[list[int], int]:
    """(each array's first word, words in all) when packed 16-byte aligned; ``arrays``: a
    list or tuple of host int32 arrays (HexcoreInvalidArgumentError otherwise)."""
    if not isinstance(arrays, (list, tuple)):
        raise HexcoreInvalidArgumentError(f"arrays: expected a list of host int32 arrays, got {type(arrays).__name__}")
    offsets, at = [], 0
    for a in arrays:
        if not isinstance(a, np.ndarray) or a.dtype != np.int32:
            got = f"{a.dtype} array" if isinstance(a, np.ndarray) else type(a).__name__
            raise HexcoreInvalidArgumentError(f"arrays: expected host int32 arrays, got a {got}")
        offsets.append(at)
        at += -(-a.size // WORDS) * WORDS
    return offsets, at


def pack(stage: np.ndarray, arrays: Sequence[np.ndarray], offsets: list[int]) -> None:
    """Write ``arrays`` flat into int32 ``stage`` at ``offsets``."""
    for a, at in zip(arrays, offsets):
        stage[at:at + a.size] = a.reshape(-1)


def device_views(buffer, arrays: Sequence[np.ndarray], offsets: list[int]) -> list:
    """Views of device int32 ``buffer`` shaped like ``arrays``, starting at ``offsets`` (each
    kept on ``buffer``: the same object for the same offset and shape)."""
    return [memo(buffer, ("upload", at, a.shape), lambda b, at=at, shape=a.shape: _view(b, at, shape))
            for a, at in zip(arrays, offsets)]


def _view(buffer, at: int, shape: tuple):
    size = int(np.prod(shape, dtype=np.int64))
    view = buffer[at:at + size]
    return view if len(shape) == 1 else view.reshape(shape)


def upload_once(arrays: Sequence[np.ndarray]) -> list:
    """Device copies of host int32 ``arrays`` (any shapes) in one allocation and one copy."""
    offsets, words = packed_offsets(arrays)
    stage = np.zeros(max(words, WORDS), np.int32)
    pack(stage, arrays, offsets)
    return device_views(cuda.to_device(stage), arrays, offsets)


class Uploads:
    """Double-buffered pinned host and device buffers for the index arrays of one step at a
    time (see the module docstring): ``begin(stream)`` per step, then any number of
    ``put(arrays)``. Buffers grow (doubling) when a step needs more."""

    def __init__(self, words: int = 4096):
        words = as_int("words", words, 1, MAX_WORDS)
        self._turns = [_Turn(words), _Turn(words)]
        self._turn = 1
        self._stream = None  # the stream of the step using the current turn

    def begin(self, stream=None) -> None:
        """Start a step on ``stream`` (``streams.resolve_stream``). The previous step's work
        is all queued by now: an event after it marks its turn; this step takes the other
        turn, waiting for the event recorded after the step that used it last. A bad
        ``stream`` raises before the turn changes."""
        resolved = resolve_stream(stream)
        if self._stream is not None:
            self._turns[self._turn].record(self._stream)
        self._turn ^= 1
        self._turns[self._turn].wait()
        self._stream = resolved

    @property
    def turn(self) -> int:
        """The current step's turn (0 or 1): the step two before had the same buffers, and
        the same shapes at the same offsets give the same views (what a caller keeping
        prepared launches per turn finds unchanged)."""
        return self._turn

    def put(self, arrays: Sequence[np.ndarray]) -> list:
        """Device views of host int32 ``arrays``, copied asynchronously on the step's stream."""
        if self._stream is None:
            raise HexcoreInvalidArgumentError("Uploads.put: call begin(stream) first")
        return self._turns[self._turn].put(arrays, self._stream)

    def scratch(self, shape: tuple, dtype) -> object:
        """A device array of ``shape`` and ``dtype`` (uninitialised) for the step's kernels,
        from the turn's scratch buffer: reused two steps later, not allocated per step.
        ``shape``: a tuple of ints >= 0; ``dtype``: a numeric numpy dtype."""
        if self._stream is None:
            raise HexcoreInvalidArgumentError("Uploads.scratch: call begin(stream) first")
        return self._turns[self._turn].scratch(*_scratch_shape(shape, dtype))


def _scratch_shape(shape, dtype) -> tuple:
    """(shape, dtype) of :meth:`Uploads.scratch` checked: a tuple of ints >= 0 and a numeric
    numpy dtype, or HexcoreInvalidArgumentError naming the bad one."""
    if not isinstance(shape, (tuple, list)):
        raise HexcoreInvalidArgumentError(f"shape: expected a tuple of ints, got {type(shape).__name__}")
    shape = tuple(as_int(f"shape[{i}]", n, 0, MAX_WORDS) for i, n in enumerate(shape))
    try:
        numeric = np.dtype(dtype)
    except TypeError:
        numeric = None
    if numeric is None or numeric.kind not in "biufc":
        raise HexcoreInvalidArgumentError(f"dtype: expected a numeric numpy dtype, got {shown(dtype)}")
    return shape, numeric


class _Turn:
    """A pinned host buffer, a device buffer of the same words, a device scratch buffer,
    bump offsets into them, and the event recorded after the last work that reads them."""

    SCRATCH_ALIGN = 256  # bytes

    def __init__(self, words: int):
        self._alloc(words)
        self._event = None if SIMULATOR else cuda.event(timing=False)
        self._recorded = False
        self._scratch, self._scratch_used = None, 0

    def _alloc(self, words: int) -> None:
        self.host = cuda.pinned_array(words, np.int32)
        self.device = cuda.device_array(words, np.int32)
        self.address = None if SIMULATOR else device_pointer(self.device)  # where a copy goes, from its offset
        self.used = 0
        self.retired = []  # outgrown buffers a queued copy may still read

    def wait(self) -> None:
        if self._recorded:
            self._event.synchronize()
        self.used, self.retired, self._recorded, self._scratch_used = 0, [], False, 0

    def scratch(self, shape: tuple, dtype: np.dtype):
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        size = -(-nbytes // self.SCRATCH_ALIGN) * self.SCRATCH_ALIGN
        have = 0 if self._scratch is None else self._scratch.size
        if self._scratch_used + size > have:
            grown = _device_bytes(max(2 * have, size, 1 << 20))  # (first: refused, nothing changed)
            if self._scratch is not None:
                self.retired.append(self._scratch)  # this step's kernels may still read it
            self._scratch, self._scratch_used = grown, 0
        at = self._scratch_used
        self._scratch_used += size
        return memo(self._scratch, ("scratch", at, dtype.str, shape),
                    lambda s: s[at:at + nbytes].view(dtype).reshape(shape))

    def put(self, arrays: Sequence[np.ndarray], stream) -> list:
        offsets, words = packed_offsets(arrays)
        if self.used + words > self.host.size:
            retired = self.retired + [(self.host, self.device)]
            self._alloc(2 * max(self.host.size, words))
            self.retired = retired
        first = self.used
        offsets = [first + at for at in offsets]
        pack(self.host, arrays, offsets)
        self.used += words
        if words:
            self._copy(first, words, stream)
        return device_views(self.device, arrays, offsets)

    def _copy(self, first: int, words: int, stream) -> None:
        """Words ``first .. first + words`` host to device, asynchronous on ``stream`` (a
        resolved Stream) on a GPU: through the driver from the buffer's address (no device
        view made), since numba copies synchronously on the default stream."""
        host = self.host[first:first + words]
        if SIMULATOR:  # the numpy array under the simulator's: no view made here either (as counted)
            self.device._ary[first:first + words] = host
            return
        from cuda.bindings import driver

        from .steps.capture import check
        from .streams import stream_handle

        check(driver.cuMemcpyHtoDAsync(driver.CUdeviceptr(self.address + 4 * first), host.ctypes.data, host.nbytes,
                                       stream_handle(stream)), "cuMemcpyHtoDAsync")

    def record(self, stream) -> None:
        if self._event is not None:
            self._event.record(stream.numba)
            self._recorded = True


def _device_bytes(nbytes: int):
    """A device uint8 array of ``nbytes``, or HexcoreOOMError."""
    try:
        return cuda.device_array(nbytes, np.uint8)
    except (MemoryError, ValueError):
        raise HexcoreOOMError(f"Uploads.scratch: no device memory for {nbytes} bytes") from None
