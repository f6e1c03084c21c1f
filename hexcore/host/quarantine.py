"""Quarantine and migration support of the block manager (what ``hexcore.fault`` builds on).

A block found corrupted is *quarantined*: ``blocks[STATE]`` QUARANTINED, counted in
``num_quarantined_blocks`` (gauge ``quarantined_blocks``) and in ``check_invariants()``.
It is never handed out again -- it is on no free stack, in no prefetched slot, in no LRU
list and (prefix cache) out of the key index with every block whose key chains on it, so
a later admission of the same tokens recomputes them -- while the tables that held it
keep it (their sequences read it until migrated) through ``fork`` and ``free``: its last
reference going leaves it quarantined. ::

    cache.quarantine_block(b)                  # at once, when a check finds b corrupted
    cache.block_references(b)                  # [(seq_id, logical), ...]: who lost tokens
    new = cache.prepare_free_blocks(n)         # the blocks a migration will take: copy into them
    cache.replace_blocks(seq_id, new)          # then point seq_id's table at them, one call

The read methods (``block_states``, ``block_references``, ``quarantined_blocks``) are
O(state size) scans, for rare paths; the decode step never looks at the state.
"""

from __future__ import annotations

import enum

import numpy as np

from .._checks import as_int
from ..errors import HexcoreConfigError, HexcoreInvalidArgumentError, HexcoreOOMError
from . import _blocks as core
from ._table_edits import next_free_blocks, quarantine, replace_blocks
from ._validation import check_ids

__all__ = ["BlockState", "QuarantineMethods"]


class BlockState(enum.IntEnum):
    """The state of a block (values of :meth:`PagedKVCache.block_states`)."""

    FREE = core.FREE  # on the free stack
    LIVE = core.LIVE  # referenced by block tables
    RESERVED = core.RESERVED  # parked in a sequence's prefetched slot
    CACHED = core.CACHED  # prefix cache: no references, indexed for reuse
    QUARANTINED = core.QUARANTINED  # found corrupted: never handed out again


class QuarantineMethods:
    """The quarantine and migration calls of :class:`~hexcore.host.PagedKVCache` (a mixin
    over its state arrays)."""

    def quarantine_block(self, block_id: int) -> bool:
        """Never hand ``block_id`` (int in [0, num_blocks)) out again; False if it already was.

        Whatever its state: a free block leaves the free stack, a reserved one its
        sequence's prefetched slot, a cached one the prefix cache; tables that hold it
        keep it. With the prefix cache on, it and every indexed block whose key chains on
        it leave the key index (REMOVED events; the unreferenced ones go to the free
        stack), and the sequences holding any of them stop being tracked. Raises
        HexcoreInvalidArgumentError for a bad id, changing nothing.
        """
        t0 = self._clock()
        block_id = as_int("block_id", block_id, low=0, high=self.num_blocks - 1)
        done = quarantine(self, block_id)
        if self._prefix is not None:
            self._publish_prefix_events()
        if t0:
            self._record("quarantine_block", t0)
        return done

    def is_quarantined(self, block_id: int) -> bool:
        """True if ``block_id`` (int in [0, num_blocks)) is quarantined."""
        block_id = as_int("block_id", block_id, low=0, high=self.num_blocks - 1)
        return bool(self._blocks[core.STATE, block_id] == core.QUARANTINED)

    def quarantined_blocks(self) -> np.ndarray:
        """The quarantined block ids, ascending (int32 [n], a copy; O(num_blocks))."""
        return np.flatnonzero(self._blocks[core.STATE] == core.QUARANTINED).astype(np.int32)

    @property
    def num_quarantined_blocks(self) -> int:
        """Blocks quarantined (never handed out again)."""
        return int(self._counters[core.NUM_QUARANTINED])

    def block_states(self) -> np.ndarray:
        """Every block's :class:`BlockState` value, int8 [num_blocks] (a copy)."""
        return self._blocks[core.STATE].astype(np.int8)

    def block_references(self, block_id: int) -> np.ndarray:
        """The table entries naming ``block_id``: int32 [n, 2] rows (seq_id, logical block),
        ascending; its tokens there are ``[logical * block_size, (logical + 1) * block_size)``.
        O(max_seqs * max_blocks_per_seq) unless no table names it."""
        block_id = as_int("block_id", block_id, low=0, high=self.num_blocks - 1)
        if self._blocks[core.REFS, block_id] == 0:
            return np.zeros((0, 2), np.int32)
        return np.argwhere(self._tables == block_id).astype(np.int32)

    @property
    def event_ring_attached(self) -> bool:
        """True while block events are published (:meth:`attach_event_ring`)."""
        return self._events is not None

    def prepare_free_blocks(self, count: int) -> np.ndarray:
        """The ``count`` blocks the next allocations will take, int32 [count] in order,
        without taking them: a migration copies into them, then :meth:`replace_blocks`.

        With the prefix cache on, cached blocks are evicted to the free stack first as
        needed (leaves first, as an allocation would). Raises HexcoreInvalidArgumentError
        for a bad count and HexcoreOOMError when fewer blocks are available (free plus
        evictable), changing nothing.
        """
        count = as_int("count", count, low=0, high=self.num_blocks)
        if count > self.num_available_blocks:
            raise HexcoreOOMError(f"count: {count} blocks asked for, {self.num_free_blocks} free"
                                  + (f" + {self.num_evictable_blocks} evictable" if self._prefix is not None else ""))
        t0 = self._clock()
        ids = next_free_blocks(self, count)
        if self._prefix is not None:
            self._publish_prefix_events()
        if t0:
            self._record("prepare_free_blocks", t0)
        return ids

    def replace_blocks(self, seq_id: int, block_ids: np.ndarray) -> None:
        """Point live ``seq_id``'s whole table at ``block_ids`` in one edit (a migration).

        Parameters
        ----------
        seq_id : a live sequence.
        block_ids : [n] int32, C-contiguous -- distinct FREE blocks (e.g. from
            :meth:`prepare_free_blocks`), ``n`` = the sequence's sealed blocks; entry ``j``
            replaces logical block ``j``. The old blocks lose a reference (freed or cached
            when it was their last; quarantined ones stay quarantined). With the prefix
            cache on the new blocks are not indexed and the sequence stops being tracked.

        Raises HexcoreInvalidSequenceError (not live), HexcoreInvalidArgumentError (bad
        ``block_ids``), HexcoreConfigError (an event ring is attached: a mirror cannot
        follow a table edited in place); a failed call changes nothing.
        """
        t0 = self._clock()
        seq_id = self._live("seq_id", seq_id)
        check_ids("block_ids", block_ids, None)
        n = int(self._seqs[core.LEN, seq_id]) // self.block_size
        if block_ids.shape[0] != n:
            raise HexcoreInvalidArgumentError(
                f"block_ids: expected {n} block ids (sequence {seq_id}'s sealed blocks), got {block_ids.shape[0]}")
        bad = np.flatnonzero((block_ids < 0) | (block_ids >= self.num_blocks))
        if bad.size:
            raise HexcoreInvalidArgumentError(
                f"block_ids[{bad[0]}]: expected an int in [0, {self.num_blocks - 1}], got {block_ids[bad[0]]}")
        states = self._blocks[core.STATE, block_ids]
        bad = np.flatnonzero(states != core.FREE)
        if bad.size:
            raise HexcoreInvalidArgumentError(f"block_ids[{bad[0]}]: block {block_ids[bad[0]]} is not free "
                                              f"({BlockState(states[bad[0]]).name})")
        if len(np.unique(block_ids)) != n:
            raise HexcoreInvalidArgumentError(f"block_ids: expected distinct block ids, got {block_ids.tolist()}")
        if self._events is not None:
            raise HexcoreConfigError("replace_blocks: detach the event ring first (a table changes in place)")
        released = replace_blocks(self, seq_id, block_ids)
        if t0:
            self._record("replace_blocks", t0, allocated=n, freed=released)
