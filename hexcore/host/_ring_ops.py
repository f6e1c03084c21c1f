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

_jit = numba.njit(cache=True, nogil=True)


def ring_words(capacity: int, record_width: int) -> int:
    """Length in int64 words of the vector that holds a ring of this shape."""
    return HEADER_WORDS + capacity * record_width


def ring_init(buf: np.ndarray, capacity: int, record_width: int) -> None:
    """Write an empty ring's header into ``buf`` (int64, ``ring_words(...)`` long)."""
    buf[:HEADER_WORDS] = 0
    buf[MAGIC], buf[CAPACITY], buf[RECORD_WIDTH] = RING_MAGIC, capacity, record_width


@_jit
def ring_len(buf):
    """Records in the ring now (a snapshot: either side may move it)."""
    return load_acquire(buf, TAIL) - load_acquire(buf, HEAD)


@_jit
def ring_close(buf):
    """Mark the ring closed: pushes then return RING_CLOSED, pops drain then do."""
    store_release(buf, CLOSED, 1)


@_jit
def _writable(buf, wanted):
    # Free slots for the producer, re-reading head only when the cache is short.
    tail = buf[TAIL]
    free = buf[CAPACITY] - (tail - buf[PRODUCER_HEAD_CACHE])
    if free < wanted:
        head = load_acquire(buf, HEAD)
        buf[PRODUCER_HEAD_CACHE] = head
        free = buf[CAPACITY] - (tail - head)
    return min(wanted, free)


@_jit
def _readable(buf, wanted):
    # Ready records for the consumer, re-reading tail only when the cache is short.
    head = buf[HEAD]
    ready = buf[CONSUMER_TAIL_CACHE] - head
    if ready < wanted:
        tail = load_acquire(buf, TAIL)
        buf[CONSUMER_TAIL_CACHE] = tail
        ready = tail - head
    return min(wanted, ready)


@_jit
def ring_try_push_batch(buf, records):
    """Push the first records of ``records`` that fit; return how many, or RING_CLOSED.

    Parameters
    ----------
    buf : int64 [ring_words(capacity, W)], the ring
    records : int64 [n, W]
    """
    if load_acquire(buf, CLOSED) != 0:
        return RING_CLOSED
    count = _writable(buf, records.shape[0])
    if count <= 0:
        return 0
    width, mask, tail = buf[RECORD_WIDTH], buf[CAPACITY] - 1, buf[TAIL]
    for i in range(count):
        base = HEADER_WORDS + ((tail + i) & mask) * width
        for w in range(width):
            buf[base + w] = records[i, w]
    store_release(buf, TAIL, tail + count)  # publishes the words written above
    return count


@_jit
def ring_try_push(buf, record):
    """Push one record (int64 [W]); return 1, 0 when full, or RING_CLOSED."""
    if load_acquire(buf, CLOSED) != 0:
        return RING_CLOSED
    if _writable(buf, 1) == 0:
        return 0
    width, tail = buf[RECORD_WIDTH], buf[TAIL]
    base = HEADER_WORDS + (tail & (buf[CAPACITY] - 1)) * width
    for w in range(width):
        buf[base + w] = record[w]
    store_release(buf, TAIL, tail + 1)
    return 1


@_jit
def _end_of_stream(buf):
    # Empty: closed and, re-read after the closed flag, still empty.
    return load_acquire(buf, CLOSED) != 0 and _readable(buf, 1) == 0


@_jit
def ring_try_pop_batch(buf, out):
    """Pop up to ``out.shape[0]`` records into ``out``; return how many, or RING_CLOSED.

    Parameters
    ----------
    buf : int64 [ring_words(capacity, W)], the ring
    out : int64 [m, W], receives the records in rows ``0..count-1``
    """
    count = _readable(buf, out.shape[0])
    if count <= 0:
        return RING_CLOSED if out.shape[0] > 0 and _end_of_stream(buf) else 0
    width, mask, head = buf[RECORD_WIDTH], buf[CAPACITY] - 1, buf[HEAD]
    for i in range(count):
        base = HEADER_WORDS + ((head + i) & mask) * width
        for w in range(width):
            out[i, w] = buf[base + w]
    store_release(buf, HEAD, head + count)  # hands the slots back to the producer
    return count


@_jit
def ring_try_pop(buf, out):
    """Pop one record into ``out`` (int64 [W]); return 1, 0 when empty, or RING_CLOSED."""
    if _readable(buf, 1) == 0:
        return RING_CLOSED if _end_of_stream(buf) else 0
    width, head = buf[RECORD_WIDTH], buf[HEAD]
    base = HEADER_WORDS + (head & (buf[CAPACITY] - 1)) * width
    for w in range(width):
        out[w] = buf[base + w]
    store_release(buf, HEAD, head + 1)
    return 1
