"""LockFreeRingBuffer: a single-producer, single-consumer ring of int64 records.

The ring is one int64 vector (layout in ``_ring_ops``: head and tail indices on
separate cache lines, then ``capacity`` records of ``record_width`` words) in
process memory or in ``multiprocessing.shared_memory``. The thin class here
validates and raises typed errors; the ``ring_*`` njit functions it re-exports
(``nogil=True``, never raising, returning counts or ``RING_CLOSED``) take the raw
vector, ``ring.buffer``, so other njit code and nogil threads push and pop too.

A shared ring's header is never trusted: ``attach`` checks it against the segment's
size (HexcoreCorruptionError naming what is wrong), and every push and pop checks it
again (``_ring_ops``), so a peer that rewrites it later makes the calls report a
corrupted ring, never read or write outside the segment. Timeouts are finite
numbers of seconds >= 0, or None (wait forever).
"""

from __future__ import annotations

import errno
import math
import multiprocessing.resource_tracker as _resource_tracker
import numbers
import os
import sys
import threading
import time
from multiprocessing import shared_memory

import numpy as np

from .._checks import as_int
from ..errors import HexcoreCorruptionError, HexcoreInvalidArgumentError, HexcoreOOMError
from ._ring_ops import (  # noqa: F401  (re-exported for njit callers)
    CAPACITY, CLOSED, CONSUMER_TAIL_CACHE, HEAD, HEADER_WORDS, MAGIC, MAX_CAPACITY, MAX_RECORD_WIDTH,
    PRODUCER_HEAD_CACHE, RECORD_WIDTH, RING_CLOSED, RING_MAGIC, TAIL, header_problem, ring_close, ring_init,
    ring_len, ring_shape, ring_try_pop, ring_try_pop_batch, ring_try_push, ring_try_push_batch, ring_words,
)

__all__ = ["LockFreeRingBuffer", "RING_CLOSED", "check_timeout", "ring_close", "ring_len", "ring_try_pop",
           "ring_try_pop_batch", "ring_try_push", "ring_try_push_batch", "ring_words"]

MAX_NAME_LEN = 200  # POSIX shared-memory names: NAME_MAX (255) with room for the leading "/"


def check_timeout(name: str, value, allow_none: bool = True) -> float | None:
    """``value`` as a timeout in seconds: a finite real number >= 0 (numpy numbers
    accepted), or None (wait forever) when ``allow_none``; else HexcoreInvalidArgumentError.

    NaN and infinities are refused: a NaN deadline never passes, so a wait on one never
    ends. Every timeout or poll interval of ``hexcore.host`` should go through here.
    """
    if value is None and allow_none:
        return None
    if (isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real)):
        want = "a finite number of seconds >= 0" + (" or None" if allow_none else "")
        raise HexcoreInvalidArgumentError(f"{name}: expected {want}, got {type(value).__name__} {value!r}")
    try:
        seconds = float(value)
    except (OverflowError, ValueError, TypeError):
        seconds = math.inf
    if not math.isfinite(seconds) or seconds < 0:
        want = "a finite number of seconds >= 0" + (" or None" if allow_none else "")
        raise HexcoreInvalidArgumentError(f"{name}: expected {want}, got {value!r}")
    return seconds


_SHM_DIR = "/dev/shm"  # where POSIX shared memory lives on Linux


def _shm_free_bytes() -> int | None:
    # bytes free for shared memory, None where it cannot be told
    try:
        st = os.statvfs(_SHM_DIR)
    except (OSError, AttributeError):
        return None
    return st.f_bavail * st.f_frsize


def _reserve_pages(shm, nbytes: int, owner: bool = True) -> None:
    # Give the segment its pages now: a tmpfs that fills up later would kill the
    # producer with SIGBUS on a record write. Where the system cannot (no posix_fallocate,
    # a filesystem without it) the segment stays sparse, as before.
    fd = getattr(shm, "_fd", -1)
    fallocate = getattr(os, "posix_fallocate", None)
    if fd < 0 or fallocate is None:
        return
    try:
        fallocate(fd, 0, nbytes)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG):
            name = shm.name
            shm.close()
            if owner:
                shm.unlink()
            raise HexcoreOOMError(f"no room for shared ring {name!r} of {nbytes} bytes: "
                                  f"{exc.strerror or exc}") from None


def _check_name(name) -> str:
    # a shared-memory name: a non-empty str of at most MAX_NAME_LEN characters, no "/" or NUL
    if not isinstance(name, str):
        raise HexcoreInvalidArgumentError(f"name: expected a str, got {type(name).__name__} {name!r}")
    if not name or len(name) > MAX_NAME_LEN or "/" in name or "\0" in name:
        raise HexcoreInvalidArgumentError(
            f"name: expected 1 to {MAX_NAME_LEN} characters without '/' or NUL, got {name[:80]!r}"
            + ("..." if len(name) > 80 else ""))
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise HexcoreInvalidArgumentError(f"name: expected a name encodable as UTF-8, got {name[:80]!r}") from None
    return name


def _os_error(name, exc: OSError, action: str):
    # an OSError of shm_open/ftruncate/mmap as the typed error it stands for
    if exc.errno in (errno.ENOMEM, errno.ENOSPC, errno.EFBIG):
        return HexcoreOOMError(f"{action} shared ring {name!r}: {exc.strerror or exc}")
    return HexcoreInvalidArgumentError(f"name: cannot {action} shared ring {name!r} ({exc.strerror or exc})")

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
        try:
            raw = np.zeros(ring_words(capacity, record_width) + 8, dtype=np.int64)
        except MemoryError:
            raise HexcoreOOMError(f"a ring of {capacity} x {record_width} words does not fit in memory") from None
        skip = (-raw.ctypes.data % 64) // 8  # records and lines on 64-byte boundaries
        buf = raw[skip:skip + ring_words(capacity, record_width)]
        ring_init(buf, capacity, record_width)
        self._setup(buf, None, False)

    @classmethod
    def create_shared(cls, capacity: int, record_width: int = 4, name: str | None = None):
        """A new ring in a shared-memory segment that this handle owns and unlinks.

        ``name``: None (a fresh random name) or a str of 1 to 200 characters without
        "/" or NUL. The segment's pages are reserved at creation (``posix_fallocate``),
        so a full ``/dev/shm`` is an error here, not a SIGBUS in the producer later.
        Raises HexcoreInvalidArgumentError for a bad or taken name, and HexcoreOOMError
        when the system cannot give the segment.
        """
        capacity, record_width = _check_shape(capacity, record_width)
        if name is not None:
            name = _check_name(name)
        nbytes = ring_words(capacity, record_width) * 8
        free = _shm_free_bytes()
        if free is not None and nbytes > free:
            raise HexcoreOOMError(f"a shared ring of {capacity} x {record_width} words needs {nbytes} bytes, "
                                  f"{free} are free in {_SHM_DIR}")
        try:
            shm = shared_memory.SharedMemory(name=name, create=True, size=nbytes)
        except FileExistsError:
            raise HexcoreInvalidArgumentError(f"name: a shared segment {name!r} already exists") from None
        except OSError as exc:
            raise _os_error(name, exc, "create") from None
        except (ValueError, OverflowError) as exc:
            raise HexcoreInvalidArgumentError(f"name: cannot create shared ring {name!r} ({exc})") from None
        _reserve_pages(shm, nbytes)
        buf = np.ndarray(nbytes // 8, dtype=np.int64, buffer=shm.buf)
        ring_init(buf, capacity, record_width)
        ring = cls.__new__(cls)
        ring._setup(buf, shm, True)
        return ring

    @classmethod
    def attach(cls, name: str):
        """Attach to the shared ring ``name`` made by ``create_shared`` (never unlinks it).

        The segment's header is checked against its size: HexcoreInvalidArgumentError
        for a bad name or a segment that is not a ring (no such segment, shorter than a
        header, another magic), HexcoreCorruptionError for a ring header whose capacity
        or record width is impossible or does not fit the segment.
        """
        name = _check_name(name)
        try:
            shm = _attach_untracked(name)
        except FileNotFoundError as exc:
            raise HexcoreInvalidArgumentError(f"name: no shared ring named {name!r} ({exc})") from None
        except OSError as exc:
            raise _os_error(name, exc, "attach") from None
        except (ValueError, TypeError, OverflowError) as exc:  # an empty segment cannot be mapped
            raise HexcoreInvalidArgumentError(f"name: {name!r} is not a hexcore ring ({exc})") from None
        words = shm.size // 8
        buf = np.ndarray(words, dtype=np.int64, buffer=shm.buf)
        problem = header_problem(buf)
        if problem:
            del buf
            shm.close()
            if words < HEADER_WORDS or problem.startswith("bad magic"):
                raise HexcoreInvalidArgumentError(f"name: {name!r} is not a hexcore ring ({problem})")
            raise HexcoreCorruptionError(f"shared ring {name!r}: corrupted header: {problem}")
        del buf
        _reserve_pages(shm, words * 8, owner=False)  # a sparse segment (not made here) gets its pages now
        ring = cls.__new__(cls)
        ring._setup(np.ndarray(words, dtype=np.int64, buffer=shm.buf), shm, False)
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
        buf = self._live()
        self._check_header(buf)
        return int(ring_len(buf))

    def _check_header(self, buf) -> None:
        # raise HexcoreCorruptionError when the header no longer matches this handle's ring
        cap, _ = ring_shape(buf, self.record_width)
        if cap != self.capacity:
            problem = header_problem(buf) or (
                f"capacity x record_width changed from {self.capacity} x {self.record_width} to "
                f"{int(buf[CAPACITY])} x {int(buf[RECORD_WIDTH])}")
            raise HexcoreCorruptionError(f"ring {self.name!r}: corrupted header: {problem}")

    def _live(self) -> np.ndarray:
        if self._buf is None:
            raise HexcoreInvalidArgumentError(f"ring {self.name!r} is closed and detached")
        return self._buf

    def _records(self, records, ndim: int, out: bool = False) -> np.ndarray:
        name = "out" if out else "records"
        if type(records) is not np.ndarray:
            if out:
                raise HexcoreInvalidArgumentError(f"out: expected a numpy array, got {type(records).__name__}")
            try:
                records = np.asarray(records)
            except (ValueError, TypeError, OverflowError) as exc:  # ragged lists, odd objects
                raise HexcoreInvalidArgumentError(f"records: expected int64 rows, got {exc}") from None
            if records.dtype.kind in "iu":
                if records.dtype == np.uint64 and records.size and records.max() > np.iinfo(np.int64).max:
                    raise HexcoreInvalidArgumentError(f"records: a value {records.max()} does not fit int64")
                records = records.astype(np.int64)
        if records.dtype != np.int64 or records.ndim != ndim or records.shape[-1] != self.record_width:
            want = "[n, %d]" % self.record_width if ndim == 2 else "[%d]" % self.record_width
            raise HexcoreInvalidArgumentError(
                f"{name}: expected int64 {want}, got {records.dtype} {list(records.shape)}")
        if out and not records.flags.writeable:
            raise HexcoreInvalidArgumentError(f"out: expected a writable array, got a read-only int64 "
                                              f"{list(records.shape)}")
        return records

    # -- push (producer side) ------------------------------------------------------
    def try_push(self, record) -> int:
        """Push one record (int64 [W]) if there is room; return 1, or 0 when full."""
        buf = self._live()
        return self._pushed(ring_try_push(buf, self._records(record, 1)), buf)

    def try_push_batch(self, records) -> int:
        """Push the leading rows of ``records`` (int64 [n, W]) that fit; return how many."""
        buf = self._live()
        return self._pushed(ring_try_push_batch(buf, self._records(records, 2)), buf)

    def push(self, record, timeout: float | None = None) -> None:
        """Push one record (int64 [W]), waiting for room (TimeoutError after ``timeout`` s:
        a finite number >= 0, or None to wait forever)."""
        self.push_batch(self._records(record, 1)[None, :], timeout)

    def push_batch(self, records, timeout: float | None = None) -> None:
        """Push every row of ``records`` (int64 [n, W]) in order, waiting for room
        (``timeout`` as in :meth:`push`)."""
        timeout = check_timeout("timeout", timeout)
        records, done = self._records(records, 2), 0
        deadline = None if timeout is None else time.monotonic() + timeout
        while done < records.shape[0]:
            count = self.try_push_batch(records[done:])
            done += count
            if count == 0:
                _wait(deadline, f"push: ring full for {timeout} s")

    def _pushed(self, count: int, buf) -> int:
        if count == RING_CLOSED:
            self._check_header(buf)
            raise HexcoreInvalidArgumentError(f"push: ring {self.name!r} is closed")
        return count

    def _popped(self, count: int, buf) -> int:
        if count == RING_CLOSED:
            self._check_header(buf)
        return count

    # -- pop (consumer side) -----------------------------------------------------------
    def try_pop(self, out: np.ndarray) -> int:
        """Pop one record into ``out`` (writable int64 [W]); return 1, 0 when empty, or RING_CLOSED."""
        buf = self._live()
        return self._popped(ring_try_pop(buf, self._records(out, 1, True)), buf)

    def try_pop_batch(self, out: np.ndarray) -> int:
        """Pop up to len(out) records into ``out`` (writable int64 [m, W]); return the count or RING_CLOSED."""
        buf = self._live()
        return self._popped(ring_try_pop_batch(buf, self._records(out, 2, True)), buf)

    def pop(self, timeout: float | None = None) -> np.ndarray | None:
        """The next record (int64 [W]), waiting for one; None once closed and drained.

        ``timeout``: seconds (a finite number >= 0; TimeoutError when it passes), or None
        to wait forever."""
        batch = self.pop_batch(1, timeout)
        return batch[0] if len(batch) else None

    def pop_batch(self, max_records: int, timeout: float | None = None) -> np.ndarray:
        """Up to ``max_records`` (an int in [1, 2**32]) records (int64 [n, W]), waiting for
        at least one (``timeout`` as in :meth:`pop`).

        Returns an empty [0, W] array once the ring is closed and drained.
        """
        max_records = as_int("max_records", max_records, low=1, high=MAX_CAPACITY)
        timeout = check_timeout("timeout", timeout)
        # one call never pops more than a ring's worth: no larger buffer is needed
        out = np.empty((min(max_records, self.capacity), self.record_width), dtype=np.int64)
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
