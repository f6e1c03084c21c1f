"""The njit core of LockFreeRingBuffer: layout of the ring vector and its push/pop.

The whole ring is one int64 vector, so it can live in process memory or in
``multiprocessing.shared_memory`` and be handed, as is, to njit code::

    word   0        head: records popped so far (consumer writes, release)
    word   1        consumer's cached copy of tail (consumer only)
    word  16        tail: records pushed so far (producer writes, release)
    word  17        producer's cached copy of head (producer only)
    word  32        closed flag (either side, release; never cleared)
    words 33..35    magic, capacity, record_width (fixed at creation)
    word  48 + s*W  record slot s, W words; slot = index & (capacity - 1)

Head and tail are 128 bytes apart (separate 64-byte lines, and separate pairs for
the adjacent-line prefetcher); records start on a 64-byte boundary. Each side
reads the other's index with acquire and publishes its own with release, after
the record words, so a record is visible only when complete: a producer killed
mid-write leaves no torn record. Indices never wrap (int64). Each side keeps a
cached copy of the other's index on its own line and re-reads the shared one
only when the cache says full/empty (the Lamport / FastForward optimisation).

The ``ring_*`` functions are ``njit(nogil=True, cache=True)`` and never raise:
they return a count, or ``RING_CLOSED`` (-1) for a push on a closed ring and a
pop on a closed, drained one.

The header is never trusted. A shared ring's other side may be another process,
so its words can change at any time: every call reads capacity and record width
once (atomically, so the compiler cannot read them twice) and checks them against
the vector's real length and the width of the caller's records before touching a
record (:func:`ring_shape`). A ring whose header does not fit (a forged or
corrupted segment) or a records array of the wrong width is treated as closed:
nothing is read or written and the call returns ``RING_CLOSED``, so every loop
over a ring ends. Head and tail are only ever used masked by ``capacity - 1``, so
no value they hold can index outside the records.
"""

from __future__ import annotations

import numba
import numpy as np

from ._atomics import load_acquire, store_release

RING_CLOSED = -1
HEAD, CONSUMER_TAIL_CACHE, TAIL, PRODUCER_HEAD_CACHE = 0, 1, 16, 17
CLOSED, MAGIC, CAPACITY, RECORD_WIDTH = 32, 33, 34, 35
HEADER_WORDS = 48
RING_MAGIC = 0x68657872696E6731  # "hexring1"
MAX_CAPACITY, MAX_RECORD_WIDTH = 2**32, 2**12  # so capacity * record_width stays far from int64 limits

_jit = numba.njit(cache=True, nogil=True)


def ring_words(capacity: int, record_width: int) -> int:
    """Length in int64 words of the vector that holds a ring of this shape."""
    return HEADER_WORDS + capacity * record_width


def ring_init(buf: np.ndarray, capacity: int, record_width: int) -> None:
    """Write an empty ring's header into ``buf`` (int64, ``ring_words(...)`` long).

    ``capacity`` (a power of two in [1, 2**32]) and ``record_width`` (in [1, 4096]) are
    checked, and so is ``buf``; a bad one raises HexcoreInvalidArgumentError.
    """
    from .._checks import as_int
    from ..errors import HexcoreInvalidArgumentError

    capacity = as_int("capacity", capacity, low=1, high=MAX_CAPACITY)
    record_width = as_int("record_width", record_width, low=1, high=MAX_RECORD_WIDTH)
    if capacity & (capacity - 1):
        raise HexcoreInvalidArgumentError(f"capacity: expected a power of two, got {capacity}")
    need = ring_words(capacity, record_width)
    if (type(buf) is not np.ndarray or buf.dtype != np.int64 or buf.ndim != 1 or not buf.flags.c_contiguous
            or not buf.flags.writeable or buf.shape[0] < need):
        got = f"{buf.dtype} {list(buf.shape)}" if isinstance(buf, np.ndarray) else type(buf).__name__
        raise HexcoreInvalidArgumentError(
            f"buf: expected a writable C-contiguous int64 vector of at least {need} words, got {got}")
    buf[:HEADER_WORDS] = 0
    buf[MAGIC], buf[CAPACITY], buf[RECORD_WIDTH] = RING_MAGIC, capacity, record_width


def header_problem(buf: np.ndarray) -> str:
    """What is wrong with the header of the ring vector ``buf`` ("" when it is sound).

    Checks what every push and pop relies on: the magic, a capacity that is a power of
    two in [1, 2**32], a record width in [1, 4096], and ``ring_words(capacity,
    record_width)`` words present in ``buf``.
    """
    words = buf.shape[0]
    if words < HEADER_WORDS:
        return f"{words * 8} bytes is shorter than a ring header ({HEADER_WORDS * 8} bytes)"
    magic, capacity, width = int(buf[MAGIC]), int(buf[CAPACITY]), int(buf[RECORD_WIDTH])
    if magic != RING_MAGIC:
        return f"bad magic {magic:#x} (expected {RING_MAGIC:#x})"
    if not 1 <= capacity <= MAX_CAPACITY or capacity & (capacity - 1):
        return f"capacity {capacity} is not a power of two in [1, {MAX_CAPACITY}]"
    if not 1 <= width <= MAX_RECORD_WIDTH:
        return f"record_width {width} is outside [1, {MAX_RECORD_WIDTH}]"
    if ring_words(capacity, width) > words:
        return (f"capacity {capacity} x record_width {width} needs {ring_words(capacity, width) * 8} bytes, "
                f"the segment has {words * 8}")
    return ""


@_jit
def ring_shape(buf, width):
    """(capacity, record width) of the ring ``buf`` read once, or (0, 0) when its header
    does not fit ``buf`` or its width is not ``width`` (-1: any width)."""
    if buf.shape[0] < HEADER_WORDS:
        return 0, 0
    capacity = load_acquire(buf, CAPACITY)
    have = load_acquire(buf, RECORD_WIDTH)
    if capacity < 1 or capacity > MAX_CAPACITY or (capacity & (capacity - 1)) != 0:
        return 0, 0
    if have < 1 or have > MAX_RECORD_WIDTH or (width >= 0 and have != width):
        return 0, 0
    if HEADER_WORDS + capacity * have > buf.shape[0]:
        return 0, 0
    return capacity, have


@_jit
def ring_len(buf):
    """Records in the ring now, in [0, capacity] (a snapshot: either side may move it;
    0 for a ring whose header does not fit ``buf``)."""
    capacity, _ = ring_shape(buf, -1)
    if capacity == 0:
        return 0
    head = load_acquire(buf, HEAD)  # head first: the tail read after it is never behind it
    count = load_acquire(buf, TAIL) - head
    return max(0, min(count, capacity))


@_jit
def ring_close(buf):
    """Mark the ring closed: pushes then return RING_CLOSED, pops drain then do
    (nothing for a vector too short to be a ring)."""
    if buf.shape[0] >= HEADER_WORDS:
        store_release(buf, CLOSED, 1)


@_jit
def _writable(buf, capacity, wanted):
    # Free slots for the producer, re-reading head only when the cache is short.
    tail = buf[TAIL]
    free = capacity - (tail - buf[PRODUCER_HEAD_CACHE])
    if free < wanted:
        head = load_acquire(buf, HEAD)
        buf[PRODUCER_HEAD_CACHE] = head
        free = capacity - (tail - head)
    return min(wanted, free, capacity)  # a forged head never lets a push lap the ring


@_jit
def _readable(buf, capacity, wanted):
    # Ready records for the consumer, re-reading tail only when the cache is short.
    head = buf[HEAD]
    ready = buf[CONSUMER_TAIL_CACHE] - head
    if ready < wanted:
        tail = load_acquire(buf, TAIL)
        buf[CONSUMER_TAIL_CACHE] = tail
        ready = tail - head
    return min(wanted, ready, capacity)


@_jit
def ring_try_push_batch(buf, records):
    """Push the first records of ``records`` that fit; return how many, or RING_CLOSED.

    Parameters
    ----------
    buf : int64 [ring_words(capacity, W)], the ring
    records : int64 [n, W]
    """
    capacity, width = ring_shape(buf, records.shape[1])
    if capacity == 0 or load_acquire(buf, CLOSED) != 0:
        return RING_CLOSED
    count = _writable(buf, capacity, records.shape[0])
    if count <= 0:
        return 0
    mask, tail = capacity - 1, buf[TAIL]
    for i in range(count):
        base = HEADER_WORDS + ((tail + i) & mask) * width
        for w in range(width):
            buf[base + w] = records[i, w]
    store_release(buf, TAIL, tail + count)  # publishes the words written above
    return count


@_jit
def ring_try_push(buf, record):
    """Push one record (int64 [W]); return 1, 0 when full, or RING_CLOSED."""
    capacity, width = ring_shape(buf, record.shape[0])
    if capacity == 0 or load_acquire(buf, CLOSED) != 0:
        return RING_CLOSED
    if _writable(buf, capacity, 1) <= 0:
        return 0
    tail = buf[TAIL]
    base = HEADER_WORDS + (tail & (capacity - 1)) * width
    for w in range(width):
        buf[base + w] = record[w]
    store_release(buf, TAIL, tail + 1)
    return 1


@_jit
def _end_of_stream(buf, capacity):
    # Empty: closed and, re-read after the closed flag, still empty.
    return load_acquire(buf, CLOSED) != 0 and _readable(buf, capacity, 1) <= 0


@_jit
def ring_try_pop_batch(buf, out):
    """Pop up to ``out.shape[0]`` records into ``out``; return how many, or RING_CLOSED.

    Parameters
    ----------
    buf : int64 [ring_words(capacity, W)], the ring
    out : int64 [m, W], receives the records in rows ``0..count-1``
    """
    capacity, width = ring_shape(buf, out.shape[1])
    if capacity == 0:
        return RING_CLOSED
    count = _readable(buf, capacity, out.shape[0])
    if count <= 0:
        return RING_CLOSED if out.shape[0] > 0 and _end_of_stream(buf, capacity) else 0
    mask, head = capacity - 1, buf[HEAD]
    for i in range(count):
        base = HEADER_WORDS + ((head + i) & mask) * width
        for w in range(width):
            out[i, w] = buf[base + w]
    store_release(buf, HEAD, head + count)  # hands the slots back to the producer
    return count


@_jit
def ring_try_pop(buf, out):
    """Pop one record into ``out`` (int64 [W]); return 1, 0 when empty, or RING_CLOSED."""
    capacity, width = ring_shape(buf, out.shape[0])
    if capacity == 0:
        return RING_CLOSED
    if _readable(buf, capacity, 1) <= 0:
        return RING_CLOSED if _end_of_stream(buf, capacity) else 0
    head = buf[HEAD]
    base = HEADER_WORDS + (head & (capacity - 1)) * width
    for w in range(width):
        out[w] = buf[base + w]
    store_release(buf, HEAD, head + 1)
    return 1
