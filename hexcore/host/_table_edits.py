"""Rare edits of the block manager's state: for fault tolerance, quarantine a block, line up
free blocks for a migration, point a sequence's table at them; for formats by age
(``tiered.py``), take one block out of a sequence's table. Plain numpy over
``PagedKVCache``'s arrays (quarantines and migrations are rare, so only the prefix cache's
parts are njit, in ``_prefix.py``); ``quarantine.py`` validates and calls them.

Each function keeps the invariants ``PagedKVCache.check_invariants`` verifies and is
called with arguments already checked, so none fails half-way.
"""

from __future__ import annotations

import numpy as np

from . import _blocks as core
from . import _prefix as pcore
from . import _step


def quarantine(cache, block_id: int) -> bool:
    """Make ``block_id`` QUARANTINED; False if it already was.

    A FREE block leaves the free stack (the others keep their order), a RESERVED one its
    sequence's prefetched slot, a LIVE one stays in the tables that hold it; with the
    prefix cache on it (and its descendants) leave the key index first.
    """
    blocks, counters = cache._blocks, cache._counters
    state = int(blocks[core.STATE, block_id])
    if state == core.QUARANTINED:
        return False
    prefix = cache._prefix
    if prefix is not None:
        prefix.pc[pcore.C_LOG] = 0  # (the events of this call only)
    if prefix is not None and prefix.pblocks[block_id, pcore.P_PARENT] != pcore.NOT_INDEXED:
        pcore.unindex_subtree(blocks, cache._seqs, counters, cache._tables, prefix.pblocks, prefix.pseqs,
                              prefix.index, prefix.pc, prefix.plog, block_id, cache.block_size)
    if state == core.FREE:
        num_free = int(counters[core.NUM_FREE])
        stack = blocks[core.FREE_STACK, :num_free]
        at = int(np.flatnonzero(stack == block_id)[0])
        stack[at:num_free - 1] = stack[at + 1:].copy()
        counters[core.NUM_FREE] = num_free - 1
    elif state == core.LIVE:
        counters[core.NUM_LIVE] -= 1
    elif state == core.RESERVED:
        holder = int(np.flatnonzero(cache._seqs[core.PREFETCHED] == block_id)[0])
        cache._seqs[core.PREFETCHED, holder] = -1
        counters[core.NUM_RESERVED] -= 1
    blocks[core.STATE, block_id] = core.QUARANTINED
    counters[core.NUM_QUARANTINED] += 1
    return True


def next_free_blocks(cache, count: int) -> np.ndarray:
    """Evict cached blocks (prefix cache) until ``count`` are free (the caller checked that
    enough are available); the ids the next ``count`` pops give, int32 ``[count]``."""
    prefix = cache._prefix
    if prefix is not None:
        prefix.pc[pcore.C_LOG] = 0  # (the events of this call only)
    if prefix is not None and cache._counters[core.NUM_FREE] < count:
        pcore.evict_to_free(cache._blocks, cache._counters, prefix.pblocks, prefix.index, prefix.pc, prefix.plog,
                            count)
    top = int(cache._counters[core.NUM_FREE])
    return cache._blocks[core.FREE_STACK, top - count:top][::-1].copy()


def replace_blocks(cache, seq_id: int, new: np.ndarray) -> int:
    """Point ``seq_id``'s whole table at ``new`` (distinct FREE blocks, one per sealed
    block), dropping its references to the old ones (cached, freed or, quarantined, kept
    out of the pool); with the prefix cache on the sequence stops being tracked (the new
    blocks are not indexed). Returns the number of old blocks released."""
    blocks, counters, tables = cache._blocks, cache._counters, cache._tables
    _take_free(blocks, counters, new)
    n = len(new)
    old = tables[seq_id, :n].copy()
    tables[seq_id, :n] = new
    blocks[core.STATE, new] = core.LIVE
    blocks[core.REFS, new] = 1
    counters[core.NUM_LIVE] += n
    prefix = cache._prefix
    if prefix is not None:
        prefix.pseqs[pcore.S_TRACKED, seq_id] = 0
        released = pcore.drop_references(blocks, counters, prefix.pblocks, prefix.pc, old)
    else:
        released = core.drop_references(blocks, counters, old)
    stale = cache._out_rows[_step.ROW_SEQ] == seq_id  # step output rows copy only new blocks: recopy this one
    cache._out_rows[_step.ROW_SEQ, stale] = -1
    return released


def _take_free(blocks, counters, ids: np.ndarray) -> None:
    # Take FREE blocks `ids` off the free stack (O(len(ids)) when they are its top, in pop
    # order, as next_free_blocks gives them; else O(free blocks)); the others keep their order.
    num_free, n = int(counters[core.NUM_FREE]), len(ids)
    stack = blocks[core.FREE_STACK, :num_free]
    if not np.array_equal(stack[num_free - n:][::-1], ids):
        keep = stack[~np.isin(stack, ids)]
        stack[:len(keep)] = keep
    counters[core.NUM_FREE] = num_free - n


def remove_entry(cache, seq_id: int, index: int) -> int:
    """Take sealed block ``index`` out of ``seq_id``'s table (prefix cache off), the later
    ones moving down one place; the sequence is ``block_size`` tokens shorter and its tail
    untouched. Drops the sequence's reference to the block; returns 1 if that freed it."""
    tables, seqs, bs = cache._tables, cache._seqs, cache.block_size
    n = int(seqs[core.LEN, seq_id]) // bs
    old = tables[seq_id, index:index + 1].copy()
    tables[seq_id, index:n - 1] = tables[seq_id, index + 1:n].copy()
    tables[seq_id, n - 1] = -1
    seqs[core.LEN, seq_id] -= bs
    freed = core.drop_references(cache._blocks, cache._counters, old)
    stale = cache._out_rows[_step.ROW_SEQ] == seq_id  # step output rows copy only new blocks: recopy this one
    cache._out_rows[_step.ROW_SEQ, stale] = -1
    return freed
