"""njit core of the block manager: free functions over :class:`PagedKVCache`'s arrays.

Every function here mutates the arrays it is given and returns status codes and
counts; none raises, none allocates, and a failed call leaves the state unchanged.
The Python class in ``allocator.py`` owns the arrays, validates and raises.

State (all int32 except ``counters``), grouped so a call unboxes few arrays:

- ``blocks [3, num_blocks]``, rows ``FREE_STACK``, ``REFS``, ``STATE``
- ``seqs [6, max_seqs]``, rows ``LEN`` ... ``MARK``
- ``tables [max_seqs, max_blocks_per_seq]``
- ``counters [5]`` int64

The batch step, and its output arrays, are in ``_step.py``. Speculative prefetch
(``reserve_*``, ``release_*``) parks blocks in ``seqs[PREFETCHED]``. With the prefix
cache on, ``_prefix.py`` holds the versions of these calls that key, index and evict
blocks; the functions here are the prefix-cache-off paths, unchanged by it.
"""

from __future__ import annotations

import numba
import numpy as np

from ..errors import Status
from ._ring_ops import CAPACITY, ring_try_pop_batch

OK = int(Status.OK)
OUT_OF_MEMORY = int(Status.OUT_OF_MEMORY)
INVALID_SEQUENCE = int(Status.INVALID_SEQUENCE)
INVALID_ARGUMENT = int(Status.INVALID_ARGUMENT)

# block states, the values of blocks[STATE]; CACHED only with the prefix cache on
# (``_prefix.py``): no references, kept indexed by its key until evicted; QUARANTINED
# (``quarantine.py``): found corrupted, never handed out again, off the free stack and out
# of the key index, still referenced by the tables that held it until they let it go
FREE, LIVE, RESERVED, CACHED, QUARANTINED = 0, 1, 2, 3, 4

# blocks[FREE_STACK]: [position] -> block_id; positions [0, num_free) hold the free blocks
# blocks[REFS]:       [block_id] -> block-table references (> 0 when LIVE; a QUARANTINED
#                     block may have any number, a block in another state none)
# blocks[STATE]:      [block_id] -> FREE / LIVE / RESERVED / CACHED / QUARANTINED
FREE_STACK, REFS, STATE = 0, 1, 2

# seqs[LEN]:        [seq_id] -> length in tokens, -1 when the slot is not live
# seqs[PREFETCHED]: [seq_id] -> block reserved for its next seal, -1 none
# seqs[GEN]:        [seq_id] -> generation, bumped at each free (stale output rows)
# seqs[FREE_SEQS]:  [position] -> seq_id; positions [0, num_free_seqs) hold free slots
# seqs[SEQ_POS]:    [seq_id] -> its position in seqs[FREE_SEQS] while free
# seqs[MARK]:       [seq_id] -> 1 while a batch call has already met it (else 0)
LEN, PREFETCHED, GEN, FREE_SEQS, SEQ_POS, MARK = 0, 1, 2, 3, 4, 5

# counters: [field] -> count (int64); NUM_LIVE counts LIVE blocks, NUM_QUARANTINED
# QUARANTINED ones (referenced or not)
NUM_FREE, NUM_FREE_SEQS, NUM_LIVE, NUM_RESERVED, NUM_QUARANTINED = 0, 1, 2, 3, 4

# outcome counts of reserve_predictions: [outcome] -> predictions (int64)
PREDICTION_RESERVED, PREDICTION_STALE, PREDICTION_DUPLICATE, PREDICTION_UNFILLED = 0, 1, 2, 3


def new_state(num_blocks: int, max_seqs: int, max_blocks_per_seq: int):
    """Fresh (blocks, seqs, tables, counters): every block free, every slot free."""
    blocks = np.zeros((3, num_blocks), np.int32)
    blocks[FREE_STACK] = np.arange(num_blocks - 1, -1, -1, dtype=np.int32)  # pops give 0 first
    seqs = np.zeros((6, max_seqs), np.int32)
    seqs[[LEN, PREFETCHED]] = -1
    seqs[FREE_SEQS] = np.arange(max_seqs - 1, -1, -1, dtype=np.int32)
    seqs[SEQ_POS] = seqs[FREE_SEQS]  # slot s sits at position max_seqs - 1 - s
    # tables: [seq_id, logical_block] -> block_id (-1 empty)
    tables = np.full((max_seqs, max_blocks_per_seq), -1, np.int32)
    counters = np.array([num_blocks, max_seqs, 0, 0, 0], np.int64)
    return blocks, seqs, tables, counters


@numba.njit(cache=True, inline="always")
def pop_free_block(blocks, counters, state):
    """Pop the free stack's top block and mark it ``state`` (LIVE or RESERVED); its id.

    The only pop of the free stack: every allocation -- a seal's miss, a reservation,
    a step -- goes through it. The caller checks ``counters[NUM_FREE] > 0`` first
    (every caller already knows; a check here too costs ~8 ns per pop, 2x the pop).
    """
    top = counters[NUM_FREE] - 1
    counters[NUM_FREE] = top
    block_id = blocks[FREE_STACK, top]
    blocks[STATE, block_id] = state
    return block_id


@numba.njit(cache=True)
def _push_block(blocks, counters, block_id):
    top = counters[NUM_FREE]
    blocks[FREE_STACK, top] = block_id
    blocks[STATE, block_id] = FREE
    counters[NUM_FREE] = top + 1


@numba.njit(cache=True)
def _is_live(seqs, seq_id):
    # (explicit branches: `a and b` on bools compiles to slow code in numba)
    if seq_id < 0 or seq_id >= seqs.shape[1]:
        return False
    return seqs[LEN, seq_id] >= 0


@numba.njit(cache=True)
def add_sequence(seqs, counters, seq_id):
    """Make ``seq_id`` live (-1: the next free slot); returns (status, seq_id)."""
    num_free_seqs = counters[NUM_FREE_SEQS]
    if seq_id == -1:
        if num_free_seqs == 0:
            return OUT_OF_MEMORY, -1
        seq_id = seqs[FREE_SEQS, num_free_seqs - 1]
    elif seq_id < 0 or seq_id >= seqs.shape[1] or seqs[LEN, seq_id] >= 0:
        return INVALID_SEQUENCE, seq_id
    pos = seqs[SEQ_POS, seq_id]
    last = seqs[FREE_SEQS, num_free_seqs - 1]
    seqs[FREE_SEQS, pos] = last
    seqs[SEQ_POS, last] = pos
    counters[NUM_FREE_SEQS] = num_free_seqs - 1
    seqs[LEN, seq_id] = 0
    return OK, seq_id


@numba.njit(cache=True)
def free_sequence(blocks, seqs, counters, tables, seq_id, block_size):
    """Drop ``seq_id``'s block references and reservation; returns (status, blocks freed)."""
    if not _is_live(seqs, seq_id):
        return INVALID_SEQUENCE, 0
    freed = 0
    # In reverse, so the next allocations pop these blocks back in table order.
    for j in range(seqs[LEN, seq_id] // block_size - 1, -1, -1):
        block_id = tables[seq_id, j]
        tables[seq_id, j] = -1
        refs = blocks[REFS, block_id] - 1
        blocks[REFS, block_id] = refs
        if refs == 0:
            if blocks[STATE, block_id] == QUARANTINED:  # it stays out of the pool
                continue
            _push_block(blocks, counters, block_id)
            freed += 1
    counters[NUM_LIVE] -= freed
    return OK, freed + drop_slot(blocks, seqs, counters, seq_id)


@numba.njit(cache=True)
def drop_references(blocks, counters, block_ids):
    """One reference less to each of ``block_ids`` (int32 [n], a table's old entries in
    logical order), leaves first, as a free: a block whose last reference goes is freed
    (a quarantined one stays). Returns the number freed."""
    freed = 0
    for i in range(block_ids.shape[0] - 1, -1, -1):
        block_id = block_ids[i]
        refs = blocks[REFS, block_id] - 1
        blocks[REFS, block_id] = refs
        if refs == 0:
            if blocks[STATE, block_id] == QUARANTINED:
                continue
            _push_block(blocks, counters, block_id)
            freed += 1
    counters[NUM_LIVE] -= freed
    return freed


@numba.njit(cache=True, inline="always")
def drop_slot(blocks, seqs, counters, seq_id):
    """The end of a free, once ``seq_id``'s table is released: its reserved block back to
    the free stack, its slot back to the free slots; returns 1 if it held a reserved block."""
    released = 0
    prefetched = seqs[PREFETCHED, seq_id]
    if prefetched >= 0:
        _push_block(blocks, counters, prefetched)
        seqs[PREFETCHED, seq_id] = -1
        counters[NUM_RESERVED] -= 1
        released = 1
    seqs[LEN, seq_id] = -1
    seqs[GEN, seq_id] += 1
    pos = counters[NUM_FREE_SEQS]
    seqs[FREE_SEQS, pos] = seq_id
    seqs[SEQ_POS, seq_id] = pos
    counters[NUM_FREE_SEQS] = pos + 1
    return released


@numba.njit(cache=True)
def fork_sequence(blocks, seqs, counters, tables, parent, child, block_size):
    """Make ``child`` (-1: any free slot) share ``parent``'s sealed blocks; (status, child)."""
    if not _is_live(seqs, parent):
        return INVALID_SEQUENCE, parent
    status, child = add_sequence(seqs, counters, child)
    if status != OK:
        return status, child
    length = seqs[LEN, parent]
    for j in range(length // block_size):
        block_id = tables[parent, j]
        tables[child, j] = block_id
        blocks[REFS, block_id] += 1
    seqs[LEN, child] = length
    return OK, child


@numba.njit(cache=True)
def grow_sequence(blocks, seqs, counters, tables, seq_id, new_len, block_size):
    """Grow ``seq_id`` to ``new_len`` tokens, sealing a block per boundary crossed.

    Returns (status, first sealed logical block, hits, misses); the sealed blocks are
    ``tables[seq_id, first:first + hits + misses]``. A hit takes the sequence's
    reserved block, a miss pops the free stack. All or nothing.
    """
    if not _is_live(seqs, seq_id):
        return INVALID_SEQUENCE, 0, 0, 0
    old_len = seqs[LEN, seq_id]
    first = old_len // block_size
    if new_len < old_len or new_len > tables.shape[1] * block_size:
        return INVALID_SEQUENCE, first, 0, 0
    end = new_len // block_size
    hits = 0
    if end > first:
        prefetched = seqs[PREFETCHED, seq_id]
        if prefetched >= 0:
            hits = 1
        if end - first > counters[NUM_FREE] + hits:
            return OUT_OF_MEMORY, first, 0, 0
        if hits:  # the first seal takes the reserved block
            seqs[PREFETCHED, seq_id] = -1
            counters[NUM_RESERVED] -= 1
            blocks[STATE, prefetched] = LIVE
            blocks[REFS, prefetched] = 1
            tables[seq_id, first] = prefetched
        for j in range(first + hits, end):  # the others pop the free stack
            block_id = pop_free_block(blocks, counters, LIVE)
            blocks[REFS, block_id] = 1
            tables[seq_id, j] = block_id
        counters[NUM_LIVE] += end - first
    seqs[LEN, seq_id] = new_len
    return OK, first, hits, end - first - hits


@numba.njit(cache=True)
def truncate_sequence(blocks, seqs, counters, tables, seq_id, new_len, block_size):
    """Shrink ``seq_id`` to ``new_len`` tokens; returns (status, blocks freed).

    ``new_len`` in ``[old_len // block_size * block_size, old_len]`` (inside the open
    tail) changes only the length; a block boundary below it drops the references to
    the later sealed blocks, leaves first, as a free does (a quarantined block stays out
    of the pool), and leaves the tail empty. Any other ``new_len`` is INVALID_ARGUMENT;
    a reserved block stays reserved. All or nothing.
    """
    if not _is_live(seqs, seq_id):
        return INVALID_SEQUENCE, 0
    old_len = seqs[LEN, seq_id]
    keep, end = new_len // block_size, old_len // block_size
    if new_len < 0 or new_len > old_len or (keep < end and new_len % block_size != 0):
        return INVALID_ARGUMENT, 0
    freed = drop_references(blocks, counters, tables[seq_id, keep:end])
    for j in range(keep, end):
        tables[seq_id, j] = -1
    seqs[LEN, seq_id] = new_len
    return OK, freed


@numba.njit(cache=True)
def _first_not_live(seqs, seq_ids):
    for i in range(seq_ids.shape[0]):
        if not _is_live(seqs, seq_ids[i]):
            return i
    return -1


@numba.njit(cache=True)
def reserve_blocks(blocks, seqs, counters, seq_ids, out):
    """Park a free block in each sequence's prefetched slot; returns (bad index, newly reserved).

    ``out[i]`` gets the sequence's reserved block, or -1 when the pool ran out. A
    sequence that already holds one keeps it. Nothing changes if an id is not live.
    """
    bad = _first_not_live(seqs, seq_ids)
    if bad >= 0:
        return bad, 0
    reserved = 0
    for i in range(seq_ids.shape[0]):
        seq_id = seq_ids[i]
        if seqs[PREFETCHED, seq_id] < 0 and counters[NUM_FREE] > 0:
            seqs[PREFETCHED, seq_id] = pop_free_block(blocks, counters, RESERVED)
            reserved += 1
        out[i] = seqs[PREFETCHED, seq_id]
    counters[NUM_RESERVED] += reserved
    return -1, reserved


@numba.njit(cache=True)
def release_reserved(blocks, seqs, counters, seq_ids):
    """Return the sequences' reserved blocks to the pool; returns (bad index, released)."""
    bad = _first_not_live(seqs, seq_ids)
    if bad >= 0:
        return bad, 0
    released = 0
    for i in range(seq_ids.shape[0]):
        block_id = seqs[PREFETCHED, seq_ids[i]]
        if block_id >= 0:
            _push_block(blocks, counters, block_id)
            seqs[PREFETCHED, seq_ids[i]] = -1
            released += 1
    counters[NUM_RESERVED] -= released
    return -1, released


@numba.njit(cache=True)
def release_all_reserved(blocks, seqs, counters):
    """Return every sequence's reserved block to the pool; returns the number released."""
    released = 0
    for seq_id in range(seqs.shape[1]):
        block_id = seqs[PREFETCHED, seq_id]
        if block_id >= 0:
            _push_block(blocks, counters, block_id)
            seqs[PREFETCHED, seq_id] = -1
            released += 1
    counters[NUM_RESERVED] -= released
    return released


@numba.njit(cache=True)
def reserve_predictions(blocks, seqs, counters, predictions, floor, max_reserved, counts):
    """Reserve a block for each predicted row (seq_id, generation); returns the number reserved.

    ``predictions`` int64 [n, 2]; generation -1 matches any. ``counts`` int64 [4] is
    incremented per row at PREDICTION_RESERVED, _STALE (not live, or another
    generation), _DUPLICATE (already holds a block) or _UNFILLED (``floor`` free blocks
    left, or ``max_reserved`` blocks parked). Any row is accepted: a bad id is stale.
    """
    reserved = 0
    for i in range(predictions.shape[0]):
        seq_id, gen = predictions[i, 0], predictions[i, 1]
        if not _is_live(seqs, seq_id) or (gen >= 0 and gen != seqs[GEN, seq_id]):
            counts[PREDICTION_STALE] += 1
        elif seqs[PREFETCHED, seq_id] >= 0:
            counts[PREDICTION_DUPLICATE] += 1
        elif counters[NUM_FREE] <= floor or counters[NUM_RESERVED] >= max_reserved:
            counts[PREDICTION_UNFILLED] += 1
        else:
            seqs[PREFETCHED, seq_id] = pop_free_block(blocks, counters, RESERVED)
            counters[NUM_RESERVED] += 1
            reserved += 1
    counts[PREDICTION_RESERVED] += reserved
    return reserved


@numba.njit(cache=True)
def reserve_ring_predictions(blocks, seqs, counters, buf, scratch, floor, max_reserved, counts):
    """:func:`reserve_predictions` for the records of the ring ``buf`` (record_width 2).

    Pops batches into ``scratch`` (int64 [m, 2]) until the ring is empty, or one
    ring's worth was popped (so a busy producer cannot keep the owner here); returns
    the number reserved.
    """
    reserved = 0
    budget = buf[CAPACITY]
    while budget > 0:
        want = min(budget, scratch.shape[0])
        count = ring_try_pop_batch(buf, scratch[:want])
        if count <= 0:
            break
        budget -= count
        reserved += reserve_predictions(blocks, seqs, counters, scratch[:count], floor, max_reserved, counts)
        if count < want:
            break  # drained
    return reserved
