"""Block events: PagedKVCache publishes table changes into a ring; a mirror rebuilds them.

Like vLLM's KV events (which travel over ZMQ), but through a
:class:`~hexcore.host.LockFreeRingBuffer` of 4-word int64 records, in process memory
or shared memory, so another thread or process can keep a copy of every block table.

An event is ``(kind, seq_id, arg, block_id)``:

====================  ===========  =======================  ============
kind                  seq_id       arg                      block_id
====================  ===========  =======================  ============
``ALLOCATED`` (0)     new seq      0                        -1
``SEALED`` (1)        seq          logical block index      the block
``FREED`` (2)         freed seq    0                        -1
``FORKED`` (3)        child seq    parent seq               -1
====================  ===========  =======================  ============

Reservations (prefetched blocks) are not table changes and publish nothing. The
publisher stages events in a local array and pushes them with one
``ring_try_push_batch`` per cache call; when the ring is full the rest stay staged
(the staging array grows; no event is ever dropped while the ring is open) and go
out with the next call or :meth:`PagedKVCache.flush_events`.
"""

from __future__ import annotations

import time

import numpy as np

from ..errors import HexcoreCorruptionError, HexcoreInvalidArgumentError, HexcoreInvalidSequenceError
from ._event_ops import (  # noqa: F401  (re-exported: the event kinds)
    ALLOCATED, EVENT_WIDTH, FORKED, FREED, NEED_ROOM, SEALED, _flush, apply_events, drain_events,
    publish_one, publish_records, publish_run, publish_sealed,
)
from ._ring_ops import RING_CLOSED
from .._checks import as_int, int_value
from .ring import LockFreeRingBuffer

__all__ = ["ALLOCATED", "SEALED", "FREED", "FORKED", "EVENT_WIDTH", "BlockTableMirror", "EventPublisher"]
KIND_NAMES = ("ALLOCATED", "SEALED", "FREED", "FORKED")


class EventPublisher:
    """The cache's side of an event ring: stages events and pushes them in batches."""

    def __init__(self, ring: LockFreeRingBuffer):
        if not isinstance(ring, LockFreeRingBuffer):
            raise HexcoreInvalidArgumentError(f"ring: expected a LockFreeRingBuffer, got {type(ring).__name__}")
        if ring.record_width != EVENT_WIDTH or ring.closed:
            raise HexcoreInvalidArgumentError(
                f"ring: expected an open ring of record_width {EVENT_WIDTH}, got {ring!r}"
                + (" (closed)" if ring.closed else ""))
        self.ring, self._buf = ring, ring.buffer
        self._staging = np.empty((max(64, ring.capacity), EVENT_WIDTH), np.int64)
        self._state = np.zeros(2, np.int64)
        self.dropped = 0  # events lost because the consumer closed the ring

    @property
    def pending(self) -> int:
        """Events staged but not yet in the ring."""
        return int(self._state[1] - self._state[0])

    def one(self, kind: int, seq_id: int, arg: int, block_id: int) -> None:
        """Publish one event."""
        self._done(publish_one(self._buf, self._staging, self._state, kind, seq_id, arg, block_id),
                   1, publish_one, kind, seq_id, arg, block_id)

    def run(self, seq_id: int, first: int, block_ids: np.ndarray) -> None:
        """Publish SEALED events of ``block_ids`` (int32 [n]) at logical ``first`` onward."""
        self._done(publish_run(self._buf, self._staging, self._state, seq_id, first, block_ids),
                   len(block_ids), publish_run, seq_id, first, block_ids)

    def sealed(self, seals: np.ndarray) -> None:
        """Publish SEALED events of a step's seals: int32 [3, n], rows (seq_ids, logical, block_ids)."""
        self._done(publish_sealed(self._buf, self._staging, self._state, seals), seals.shape[1],
                   publish_sealed, seals)

    def records(self, records: np.ndarray) -> None:
        """Publish ready-made events, int64 [n, 4]."""
        self._done(publish_records(self._buf, self._staging, self._state, records), len(records),
                   publish_records, records)

    def flush(self, timeout: float | None = None) -> int:
        """Push staged events, waiting up to ``timeout`` s (None: forever) for room; pending after."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.pending and not self.dropped:
            if self._done(_flush(self._buf, self._staging, self._state), 0) == 0:
                break
            if deadline is not None and time.monotonic() > deadline:
                break
            time.sleep(0)
        return self.pending

    def _done(self, result, n, fn=None, *args) -> int:
        if result == NEED_ROOM:  # grow the staging array, then stage again
            need = self.pending + n
            grown = np.empty((max(need, 2 * len(self._staging)), EVENT_WIDTH), np.int64)
            start, end = self._state
            grown[:end - start] = self._staging[start:end]
            self._staging, self._state[:] = grown, (0, end - start)
            result = fn(self._buf, self._staging, self._state, *args)
        if result == RING_CLOSED:  # the consumer went away: the cache carries on without it
            self.dropped += self.pending
            self._state[:] = 0
            return 0
        return result


def replay_records(tables: np.ndarray, lens: np.ndarray, block_size: int) -> np.ndarray:
    """Events (int64 [n, 4]) that rebuild the current tables: ALLOCATED + SEALED per live seq."""
    rows = []
    for seq_id in np.flatnonzero(lens >= 0):
        rows.append([ALLOCATED, seq_id, 0, -1])
        for j in range(int(lens[seq_id]) // block_size):
            rows.append([SEALED, seq_id, j, int(tables[seq_id, j])])
    return np.array(rows, np.int64).reshape(-1, EVENT_WIDTH)


class BlockTableMirror:
    """A copy of a PagedKVCache's block tables, rebuilt from its event ring.

    Runs in any one thread or process (the ring's single consumer). :meth:`poll`
    applies the events in the ring now; :meth:`drain` applies them until the
    publisher closes the ring. An event that does not fit the mirrored state (a
    lost or reordered event) raises ``HexcoreCorruptionError`` naming it.
    """

    def __init__(self, ring: LockFreeRingBuffer, num_blocks: int, max_seqs: int,
                 max_blocks_per_seq: int, *, batch: int = 1024):
        if not isinstance(ring, LockFreeRingBuffer) or ring.record_width != EVENT_WIDTH:
            raise HexcoreInvalidArgumentError(
                f"ring: expected a LockFreeRingBuffer of record_width {EVENT_WIDTH}, got {ring!r}")
        self.num_blocks = as_int("num_blocks", num_blocks, low=1, high=2**31 - 1)
        self.max_seqs = as_int("max_seqs", max_seqs, low=1, high=2**31 - 1)
        max_blocks_per_seq = as_int("max_blocks_per_seq", max_blocks_per_seq, low=1, high=2**31 - 1)
        batch = as_int("batch", batch, low=1, high=2**24)
        self.ring, self._buf = ring, ring.buffer
        # tables: [seq_id, logical_block] -> block_id (-1 empty)
        self._tables = np.full((self.max_seqs, max_blocks_per_seq), -1, np.int32)
        # num_sealed: [seq_id] -> sealed blocks of a live sequence, -1 when not live
        self._num_sealed = np.full(self.max_seqs, -1, np.int64)
        # refs: [block_id] -> references from the mirrored tables
        self._refs = np.zeros(self.num_blocks, np.int64)
        self._out = np.empty((batch, EVENT_WIDTH), np.int64)
        # stats: [field] -> (events applied, bad-event flag, ring closed and drained)
        self._stats = np.zeros(3, np.int64)

    @classmethod
    def like(cls, cache, ring: LockFreeRingBuffer, **kw) -> BlockTableMirror:
        """A mirror sized for ``cache`` (a PagedKVCache) reading ``ring``."""
        return cls(ring, cache.num_blocks, cache.max_seqs, cache.max_blocks_per_seq, **kw)

    def poll(self) -> int:
        """Apply every event in the ring now; the number applied."""
        before = int(self._stats[0])
        drain_events(self._buf, self._out, self._tables, self._num_sealed, self._refs, self._stats)
        if self._stats[1] == 0:
            kind, seq_id, arg, block_id = self._out[0].tolist()
            name = KIND_NAMES[kind] if 0 <= kind < len(KIND_NAMES) else f"kind {kind}"
            raise HexcoreCorruptionError(
                f"event {self._stats[0]} ({name}, seq_id {seq_id}, arg {arg}, block_id {block_id}) "
                f"does not fit the mirrored tables (a lost or reordered event?)")
        return int(self._stats[0]) - before

    def drain(self, timeout: float | None = None) -> int:
        """Apply events until the ring is closed and empty (TimeoutError after ``timeout`` s)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        applied = 0
        while not self.closed:
            count = self.poll()
            applied += count
            if count == 0 and not self.closed:
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"drain: ring not closed after {timeout} s")
                time.sleep(0)
        return applied

    @property
    def closed(self) -> bool:
        """True once the ring was closed and every event in it applied."""
        return bool(self._stats[2])

    @property
    def events_applied(self) -> int:
        """Events applied so far."""
        return int(self._stats[0])

    def is_live(self, seq_id) -> bool:
        """True if ``seq_id`` is live in the mirrored state (False for any other value, non-ints included)."""
        try:
            seq_id = int_value("seq_id", seq_id)
        except HexcoreInvalidArgumentError:
            return False
        return 0 <= seq_id < self.max_seqs and bool(self._num_sealed[seq_id] >= 0)

    def block_table(self, seq_id: int) -> np.ndarray:
        """A copy of ``seq_id``'s mirrored block ids, in logical order (int32 [n])."""
        seq_id = int_value("seq_id", seq_id)
        if not self.is_live(seq_id):
            raise HexcoreInvalidSequenceError(f"seq_id: sequence {seq_id} is not live in the mirror")
        return self._tables[seq_id, : self._num_sealed[seq_id]].copy()

    def live_seq_ids(self) -> np.ndarray:
        """Ids of the live mirrored sequences, ascending (int64)."""
        return np.flatnonzero(self._num_sealed >= 0)

    def ref_counts(self) -> np.ndarray:
        """[num_blocks] int64: references to each block from the mirrored tables (a copy)."""
        return self._refs.copy()

    @property
    def num_sequences(self) -> int:
        """Live mirrored sequences."""
        return int(np.count_nonzero(self._num_sealed >= 0))

    @property
    def num_active_blocks(self) -> int:
        """Blocks referenced by at least one mirrored table."""
        return int(np.count_nonzero(self._refs))
