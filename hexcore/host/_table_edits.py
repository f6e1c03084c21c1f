"""Rare edits of the block manager's state for fault tolerance (``hexcore.fault``): take
blocks off the free stack, point a sequence's table at other blocks, hold a block in a
sequence that is never stepped. Plain numpy over ``PagedKVCache``'s arrays (a migration
is rare, so nothing here is njit), kept in ``host/`` beside the state they edit;
``hexcore.fault`` is the only caller.

Each function keeps the invariants ``PagedKVCache.check_invariants`` verifies: a block
is FREE on the free stack with no references, or LIVE off it with references equal to
the number of table entries naming it (a taken block is LIVE with none until a table
names it, so the caller must place it or give it back before anything else runs).
"""

from __future__ import annotations

import numpy as np

from . import _blocks as core
from . import _step


def take_free_blocks(cache, count: int) -> np.ndarray:
    """Pop ``count`` blocks off the free stack as LIVE with no references: int32 ``[count]``
    (the caller checked that ``count`` are free)."""
    blocks, counters = cache._blocks, cache._counters
    top = int(counters[core.NUM_FREE])
    ids = blocks[core.FREE_STACK, top - count:top][::-1].copy()
    counters[core.NUM_FREE] = top - count
    blocks[core.STATE, ids] = core.LIVE
    return ids.astype(np.int32)


def return_free_blocks(cache, ids: np.ndarray) -> None:
    """Undo :func:`take_free_blocks` for blocks no table names."""
    blocks, counters = cache._blocks, cache._counters
    top = int(counters[core.NUM_FREE])
    blocks[core.FREE_STACK, top:top + len(ids)] = ids[::-1]
    blocks[core.STATE, ids] = core.FREE
    counters[core.NUM_FREE] = top + len(ids)


def replace_blocks(cache, seq_id: int, new: np.ndarray) -> None:
    """Point the first ``len(new)`` entries of ``seq_id``'s table at ``new`` (taken blocks),
    dropping its references to the old ones (freed when nothing else holds them)."""
    blocks, counters, tables = cache._blocks, cache._counters, cache._tables
    n = len(new)
    old = tables[seq_id, :n].copy()
    tables[seq_id, :n] = new
    blocks[core.REFS, new] = 1
    freed = 0
    for b in old.tolist()[::-1]:
        blocks[core.REFS, b] -= 1
        if blocks[core.REFS, b] == 0:
            top = int(counters[core.NUM_FREE])
            blocks[core.FREE_STACK, top] = b
            blocks[core.STATE, b] = core.FREE
            counters[core.NUM_FREE] = top + 1
            freed += 1
    counters[core.NUM_LIVE] += n - freed
    stale = cache._out_rows[_step.ROW_SEQ] == seq_id  # step output rows copy only new blocks: recopy this one
    cache._out_rows[_step.ROW_SEQ, stale] = -1


def hold_block(cache, holder: int, block: int) -> None:
    """Append ``block`` to sequence ``holder``'s table (one more reference); a free block
    is taken off the free stack first."""
    blocks, seqs, counters = cache._blocks, cache._seqs, cache._counters
    j = int(seqs[core.LEN, holder]) // cache.block_size
    if blocks[core.REFS, block] == 0:
        stack = blocks[core.FREE_STACK, :int(counters[core.NUM_FREE])]
        at = int(np.flatnonzero(stack == block)[0])
        stack[at:-1] = stack[at + 1:].copy()
        counters[core.NUM_FREE] -= 1
        counters[core.NUM_LIVE] += 1
        blocks[core.STATE, block] = core.LIVE
    blocks[core.REFS, block] += 1
    cache._tables[holder, j] = block
    seqs[core.LEN, holder] = (j + 1) * cache.block_size
