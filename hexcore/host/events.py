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
``REUSED`` (6)        seq          logical block index      the block
====================  ===========  =======================  ============

With the prefix cache on (``hexcore.host.prefix``), an admission publishes ALLOCATED
and a REUSED event per cached block it shares (a table change like SEALED, but no
seal), and two more kinds follow the key index, with other fields:

====================  ===========  =======================  ============
kind                  block_id     key                      parent key
====================  ===========  =======================  ============
``STORED`` (4)        the block    its key                  its parent's key (or root key)
``REMOVED`` (5)       the block    its key                  0
====================  ===========  =======================  ============

so a mirror knows which prefixes a cache holds (``BlockTableMirror.match_keys``).
Within one call, events come in the order they happened (an eviction, the seal that
reuses the block, the block's STORED).

Reservations (prefetched blocks) are not table changes and publish nothing. The
publisher stages events in a local array and pushes them with one
``ring_try_push_batch`` per cache call; when the ring is full the rest stay staged
(the staging array grows; no event is ever dropped while the ring is open) and go
out with the next call or :meth:`PagedKVCache.flush_events`.
"""

from __future__ import annotations

import time

import numba
import numpy as np

from ..errors import HexcoreCorruptionError, HexcoreInvalidArgumentError, HexcoreInvalidSequenceError
from ._event_ops import (  # noqa: F401  (re-exported: the event kinds)
    ALLOCATED, EVENT_WIDTH, FORKED, FREED, NEED_ROOM, REMOVED, REUSED, SEALED, STORED, _flush, apply_events,
    drain_events,
    publish_one, publish_records, publish_run, publish_sealed,
)
from . import _keys
from ._ring_ops import RING_CLOSED
from .._checks import as_int, int_value
from .ring import LockFreeRingBuffer, check_timeout

__all__ = ["ALLOCATED", "SEALED", "FREED", "FORKED", "STORED", "REMOVED", "REUSED", "EVENT_WIDTH",
           "BlockTableMirror", "EventPublisher"]
KIND_NAMES = ("ALLOCATED", "SEALED", "FREED", "FORKED", "STORED", "REMOVED", "REUSED")


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
        """Push staged events, waiting up to ``timeout`` s (None: forever) for room; pending after.

        ``timeout``: a finite number of seconds >= 0 or None (``ring.check_timeout``:
        anything else raises HexcoreInvalidArgumentError before anything is pushed)."""
        timeout = check_timeout("timeout", timeout)
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


@numba.njit(cache=True)
def _match_keys(key_index, keys, wanted):
    # leading entries of wanted stored, each the child of the one before
    for j in range(wanted.shape[0]):
        block = _keys.index_find(key_index, wanted[j])
        if block < 0 or (j > 0 and keys[block, 2] != wanted[j - 1]):
            return j
    return wanted.shape[0]


def replay_records(tables: np.ndarray, lens: np.ndarray, block_size: int, prefix=None) -> np.ndarray:
    """Events (int64 [n, 4]) that rebuild the current state: STORED per indexed block
    (parents first) when ``prefix`` (a PrefixState) is given, then ALLOCATED + SEALED
    per live seq."""
    rows = []
    if prefix is not None:
        from . import _prefix as pcore

        pb = prefix.pblocks
        parent = pb[:, pcore.P_PARENT]
        depth = {}
        for b in np.flatnonzero(parent != pcore.NOT_INDEXED).tolist():
            chain = []
            while b >= 0 and b not in depth:
                chain.append(b)
                b = int(parent[b])
            d = -1 if b < 0 else depth[b]
            for c in reversed(chain):
                d += 1
                depth[c] = d
        for b in sorted(depth, key=depth.__getitem__):
            p = int(parent[b])
            if p >= 0:
                parent_key = int(pb[p, pcore.P_KEY])
            else:
                parent_key = int(_keys.root_key(np.int64(prefix.seed), pb[b, pcore.P_NS]))
            rows.append([STORED, b, int(pb[b, pcore.P_KEY]), parent_key])
    for seq_id in np.flatnonzero(lens >= 0):
        rows.append([ALLOCATED, seq_id, 0, -1])
        for j in range(int(lens[seq_id]) // block_size):
            rows.append([SEALED, seq_id, j, int(tables[seq_id, j])])
    return np.array(rows, np.int64).reshape(-1, EVENT_WIDTH)


class BlockTableMirror:
    """A copy of a PagedKVCache's block tables (and of the keys its prefix cache stores),
    rebuilt from its event ring.

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
        # keys: [block_id] -> (1 while it stores a key, the key, its parent's key)
        self._keys = np.zeros((self.num_blocks, 3), np.int64)
        # key_index: key -> block_id (an index of _keys.py)
        self._key_index = _keys.new_index(self.num_blocks)
        self._out = np.empty((batch, EVENT_WIDTH), np.int64)
        # stats: [field] -> (events applied, bad-event flag, ring closed and drained)
        self._stats = np.zeros(3, np.int64)

    @classmethod
    def like(cls, cache, ring: LockFreeRingBuffer, **kw) -> BlockTableMirror:
        """A mirror sized for ``cache`` (a PagedKVCache) reading ``ring``."""
        from .allocator import PagedKVCache  # (allocator.py imports this module)

        if not isinstance(cache, PagedKVCache):
            raise HexcoreInvalidArgumentError(f"cache: expected a PagedKVCache, got {type(cache).__name__}")
        return cls(ring, cache.num_blocks, cache.max_seqs, cache.max_blocks_per_seq, **kw)

    def poll(self) -> int:
        """Apply every event in the ring now; the number applied."""
        before = int(self._stats[0])
        drain_events(self._buf, self._out, self._tables, self._num_sealed, self._refs, self._keys, self._key_index,
                     self._stats)
        if self._stats[1] == 0:
            kind, seq_id, arg, block_id = self._out[0].tolist()
            name = KIND_NAMES[kind] if 0 <= kind < len(KIND_NAMES) else f"kind {kind}"
            fields = (f"block_id {seq_id}, key {arg}, parent key {block_id}" if kind in (STORED, REMOVED)
                      else f"seq_id {seq_id}, arg {arg}, block_id {block_id}")
            raise HexcoreCorruptionError(
                f"event {self._stats[0]} ({name}, {fields}) "
                f"does not fit the mirrored tables (a lost or reordered event?)")
        return int(self._stats[0]) - before

    def drain(self, timeout: float | None = None) -> int:
        """Apply events until the ring is closed and empty (TimeoutError after ``timeout`` s:
        a finite number of seconds >= 0, or None to wait forever; anything else raises
        HexcoreInvalidArgumentError before any event is applied)."""
        timeout = check_timeout("timeout", timeout)
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

    # -- the prefix cache's keys -----------------------------------------------------------------
    @property
    def num_stored_blocks(self) -> int:
        """Blocks that store a key (indexed by the source's prefix cache, in use or cached)."""
        return int(np.count_nonzero(self._keys[:, 0]))

    def stored_keys(self) -> dict:
        """{block_id: key} of every block that stores a key (a copy)."""
        ids = np.flatnonzero(self._keys[:, 0])
        return dict(zip(ids.tolist(), self._keys[ids, 1].tolist()))

    def block_of(self, key) -> int:
        """The block that stores ``key`` (an int64 key), -1 if none."""
        key = int_value("key", key)
        if not -2**63 <= key < 2**63:
            raise HexcoreInvalidArgumentError(f"key: expected an int64 key, got {key}")
        return int(_keys.index_find(self._key_index, np.int64(key)))

    def match_keys(self, keys) -> int:
        """How many leading ``keys`` (int64 [n], e.g. ``prefix.prefix_keys(tokens, config)``)
        the source stores: the tokens of the longest prefix it holds, in blocks."""
        keys = np.asarray(keys)
        if keys.ndim != 1 or (keys.size and keys.dtype != np.int64):
            raise HexcoreInvalidArgumentError(f"keys: expected an int64 [n] array, got {keys.dtype} shape {keys.shape}")
        if keys.size == 0:
            return 0
        return int(_match_keys(self._key_index, self._keys, keys))
