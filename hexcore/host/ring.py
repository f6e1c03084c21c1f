"""LockFreeRingBuffer: a single-producer, single-consumer ring of int64 records.

The ring is one int64 vector (layout in ``_ring_ops``: head and tail indices on
separate cache lines, then ``capacity`` records of ``record_width`` words) in
process memory or in ``multiprocessing.shared_memory``. The thin class here
validates and raises typed errors; the ``ring_*`` njit functions it re-exports
(``nogil=True``, never raising, returning counts or ``RING_CLOSED``) take the raw
vector, ``ring.buffer``, so other njit code and nogil threads push and pop too.
"""

from __future__ import annotations

import multiprocessing.resource_tracker as _resource_tracker
import sys
import threading
import time
from multiprocessing import shared_memory

import numpy as np

from .._checks import as_int
from ..errors import HexcoreInvalidArgumentError
from ._ring_ops import (  # noqa: F401  (re-exported for njit callers)
    CAPACITY, CLOSED, CONSUMER_TAIL_CACHE, HEAD, HEADER_WORDS, MAGIC, PRODUCER_HEAD_CACHE,
    RECORD_WIDTH, RING_CLOSED, RING_MAGIC, TAIL, ring_close, ring_init, ring_len, ring_try_pop,
    ring_try_pop_batch, ring_try_push, ring_try_push_batch, ring_words,
)

__all__ = ["LockFreeRingBuffer", "RING_CLOSED", "ring_close", "ring_len", "ring_try_pop",
           "ring_try_pop_batch", "ring_try_push", "ring_try_push_batch", "ring_words"]

# -- shared memory --------------------------------------------------------------------
_ATTACH_LOCK = threading.Lock()


def _attach_untracked(name: str) -> shared_memory.SharedMemory:
    # Python < 3.13 registers every attach with the resource tracker, which then
    # unlinks the creator's segment when the attacher exits. The creator owns it.
    if sys.version_info >= (3, 13):
        return shared_memory.SharedMemory(name=name, track=False)
    with _ATTACH_LOCK:
        register = _resource_tracker.register
        _resource_tracker.register = lambda *args, **kwargs: None
        try:
            return shared_memory.SharedMemory(name=name)
        finally:
            _resource_tracker.register = register


MAX_CAPACITY, MAX_RECORD_WIDTH = 2**32, 2**12


def _check_shape(capacity, record_width) -> tuple[int, int]:
    # (capacity, record_width) as ints, or raise naming the bad one
    capacity = as_int("capacity", capacity, low=1, high=MAX_CAPACITY)
    record_width = as_int("record_width", record_width, low=1, high=MAX_RECORD_WIDTH)
    if capacity & (capacity - 1):
        raise HexcoreInvalidArgumentError(f"capacity: expected a power of two, got {capacity}")
    return capacity, record_width


class LockFreeRingBuffer:
    """SPSC ring of fixed-width int64 records, in process memory or shared memory.

    ``capacity`` (a power of two in [1, 2**32]) records of ``record_width`` (in [1,
    4096]) int64 words. One thread (or process) pushes, one pops. ``try_*`` methods
    never wait and return counts (0 when full/empty; ``try_pop*`` return
    ``RING_CLOSED`` once a closed ring is drained); ``push*``/``pop*`` wait. ``buffer``
    is the raw int64 vector that the njit ``ring_*`` functions take, for callers in
    njit code or nogil threads.
    """

    def __init__(self, capacity: int, record_width: int = 4):
        capacity, record_width = _check_shape(capacity, record_width)
        raw = np.zeros(ring_words(capacity, record_width) + 8, dtype=np.int64)
        skip = (-raw.ctypes.data % 64) // 8  # records and lines on 64-byte boundaries
        buf = raw[skip:skip + ring_words(capacity, record_width)]
        ring_init(buf, capacity, record_width)
        self._setup(buf, None, False)

    @classmethod
    def create_shared(cls, capacity: int, record_width: int = 4, name: str | None = None):
        """A new ring in a shared-memory segment that this handle owns and unlinks."""
        capacity, record_width = _check_shape(capacity, record_width)
        nbytes = ring_words(capacity, record_width) * 8
        try:
            shm = shared_memory.SharedMemory(name=name, create=True, size=nbytes)
        except FileExistsError:
            raise HexcoreInvalidArgumentError(f"name: a shared segment {name!r} already exists") from None
        buf = np.ndarray(nbytes // 8, dtype=np.int64, buffer=shm.buf)
        ring_init(buf, capacity, record_width)
        ring = cls.__new__(cls)
        ring._setup(buf, shm, True)
        return ring

    @classmethod
    def attach(cls, name: str):
        """Attach to the shared ring ``name`` made by ``create_shared`` (never unlinks it)."""
        try:
            shm = _attach_untracked(name)
        except (FileNotFoundError, ValueError, TypeError) as exc:
            raise HexcoreInvalidArgumentError(f"name: no shared ring named {name!r} ({exc})") from None
        words = shm.size // 8
        buf = np.ndarray(words, dtype=np.int64, buffer=shm.buf)
        ok = words >= HEADER_WORDS and buf[MAGIC] == RING_MAGIC
        if not ok or words < ring_words(int(buf[CAPACITY]), int(buf[RECORD_WIDTH])):
            del buf
            shm.close()
            raise HexcoreInvalidArgumentError(f"name: {name!r} is not a hexcore ring")
        ring = cls.__new__(cls)
        ring._setup(buf, shm, False)
        return ring

    def _setup(self, buf, shm, owner) -> None:
        # ring: int64 [ring_words(capacity, record_width)] -> header words, then records
        self._buf, self._shm, self._owner = buf, shm, owner
        self.capacity, self.record_width = int(buf[CAPACITY]), int(buf[RECORD_WIDTH])
        self.name = shm.name if shm is not None else None

    def __reduce__(self):
        if self._shm is None:
            raise HexcoreInvalidArgumentError("an in-process ring cannot be pickled; use create_shared")
        return (LockFreeRingBuffer.attach, (self.name,))

    # -- state -----------------------------------------------------------------------
    @property
    def buffer(self) -> np.ndarray:
        """The ring as one int64 vector, for the njit ``ring_*`` functions."""
        return self._live()

    @property
    def closed(self) -> bool:
        """True once either side called ``close()`` (or this handle is detached)."""
        return self._buf is None or bool(self._buf[CLOSED])

    def __len__(self) -> int:
        return int(ring_len(self._live()))

    def _live(self) -> np.ndarray:
        if self._buf is None:
            raise HexcoreInvalidArgumentError(f"ring {self.name!r} is closed and detached")
        return self._buf

    def _records(self, records, ndim: int, out: bool = False) -> np.ndarray:
        if type(records) is not np.ndarray:
            if out:
                raise HexcoreInvalidArgumentError(f"out: expected a numpy array, got {type(records).__name__}")
            records = np.asarray(records)
            if records.dtype.kind in "iu":
                records = records.astype(np.int64)
        if records.dtype != np.int64 or records.ndim != ndim or records.shape[-1] != self.record_width:
            want = "[n, %d]" % self.record_width if ndim == 2 else "[%d]" % self.record_width
            raise HexcoreInvalidArgumentError(
                f"records: expected int64 {want}, got {records.dtype} {list(records.shape)}")
        return records

    # -- push (producer side) ------------------------------------------------------
    def try_push(self, record) -> int:
        """Push one record (int64 [W]) if there is room; return 1, or 0 when full."""
        return self._pushed(ring_try_push(self._live(), self._records(record, 1)))

    def try_push_batch(self, records) -> int:
        """Push the leading rows of ``records`` (int64 [n, W]) that fit; return how many."""
        return self._pushed(ring_try_push_batch(self._live(), self._records(records, 2)))

    def push(self, record, timeout: float | None = None) -> None:
        """Push one record (int64 [W]), waiting for room (TimeoutError after ``timeout`` s)."""
        self.push_batch(self._records(record, 1)[None, :], timeout)

    def push_batch(self, records, timeout: float | None = None) -> None:
        """Push every row of ``records`` (int64 [n, W]) in order, waiting for room."""
        records, done = self._records(records, 2), 0
        deadline = None if timeout is None else time.monotonic() + timeout
        while done < records.shape[0]:
            count = self.try_push_batch(records[done:])
            done += count
            if count == 0:
                _wait(deadline, f"push: ring full for {timeout} s")

    def _pushed(self, count: int) -> int:
        if count == RING_CLOSED:
            raise HexcoreInvalidArgumentError(f"push: ring {self.name!r} is closed")
        return count

    # -- pop (consumer side) -----------------------------------------------------------
    def try_pop(self, out: np.ndarray) -> int:
        """Pop one record into ``out`` (int64 [W]); return 1, 0 when empty, or RING_CLOSED."""
        return ring_try_pop(self._live(), self._records(out, 1, True))

    def try_pop_batch(self, out: np.ndarray) -> int:
        """Pop up to len(out) records into ``out`` (int64 [m, W]); return the count or RING_CLOSED."""
        return ring_try_pop_batch(self._live(), self._records(out, 2, True))

    def pop(self, timeout: float | None = None) -> np.ndarray | None:
        """The next record (int64 [W]), waiting for one; None once closed and drained."""
        batch = self.pop_batch(1, timeout)
        return batch[0] if len(batch) else None

    def pop_batch(self, max_records: int, timeout: float | None = None) -> np.ndarray:
        """Up to ``max_records`` records (int64 [n, W]), waiting for at least one.

        Returns an empty [0, W] array once the ring is closed and drained.
        """
        max_records = as_int("max_records", max_records, low=1, high=MAX_CAPACITY)
        out = np.empty((max_records, self.record_width), dtype=np.int64)
        deadline = None if timeout is None else time.monotonic() + timeout
        while (count := self.try_pop_batch(out)) == 0:
            _wait(deadline, f"pop: ring empty for {timeout} s")
        return out[:max(count, 0)]

    # -- lifetime ------------------------------------------------------------------------
    def close(self) -> None:
        """Close the stream for both sides; detach shared memory; the creator unlinks it.

        Idempotent. Drop views of ``buffer`` first, or the mapping outlives this call.
        """
        if self._buf is not None:
            ring_close(self._buf)
        self._release()

    def _release(self) -> None:
        shm, self._shm = getattr(self, "_shm", None), None
        if shm is None:
            return  # in-process: the other thread's handle may still drain it
        self._buf = None
        try:
            shm.close()
        except BufferError:
            pass  # a caller still holds a view; the mapping goes with it
        if self._owner:
            try:
                shm.unlink()
            except FileNotFoundError:
                pass

    def __del__(self):
        self._release()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def __repr__(self):
        where = f"shared {self.name!r}" if self.name else "in-process"
        return f"LockFreeRingBuffer(capacity={self.capacity}, record_width={self.record_width}, {where})"


def _wait(deadline, message: str) -> None:
    if deadline is not None and time.monotonic() > deadline:
        raise TimeoutError(message)
    time.sleep(0)
