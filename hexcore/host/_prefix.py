"""njit core of the prefix cache: the block manager's calls when blocks are cached by content.

With ``PagedKVCache(..., prefix_cache=True)`` every call goes through the functions
here instead of their ``_blocks.py`` / ``_step.py`` twins (which stay the
prefix-cache-off paths, unchanged). Like those, every function mutates the arrays it
is given, returns status codes and counts, never raises, and leaves the state
unchanged when it fails.

A sealed block of a *tracked* sequence (one whose every token id was given) is
*indexed*: stored in the key index under the XXH64 of its token prefix (``_keys.py``;
the sequence keeps the hash's running state), with its token ids and its parent
block. A block whose last reference goes stays indexed as CACHED (``blocks[STATE]``):
off the free stack, matchable by a later admission, and -- unless pinned --
*evictable*, in the LRU list of its priority level. An allocation pops the free stack first and evicts only when it
is empty: the oldest block of the lowest non-empty level. Availability is therefore
``counters[NUM_FREE] + pc[C_EVICTABLE]``.

Leaves go before their parents. Every table that holds an indexed block holds its
parent just before it, so a parent's references, pins and level are never below its
child's, its last release comes no earlier (a free releases a table backwards), and
unpinning pushes a chain backwards: in each level's list a block is newer than all of
its cached descendants, so the block evicted never has an indexed child.

A sealed block whose key is already indexed (the same content sealed by another
sequence meanwhile, or a collision) is not indexed, and its sequence stops being
tracked: its later blocks would have a parent outside the index.

State, all owned by ``prefix.PrefixState``:

- ``pblocks [num_blocks, 8]`` int64, columns ``P_KEY`` ... ``P_NS`` (64 bytes a block)
- ``ptok [num_blocks + max_seqs, block_size]`` int32: rows ``[0, num_blocks)`` the token
  ids of indexed blocks, row ``num_blocks + s`` the tail of sequence ``s``
- ``pseqs [8, max_seqs]`` int64, rows ``S_TRACKED`` ... ``S_V4``
- ``index [capacity, 2]`` int64: the key index (``_keys.py``)
- ``pc [PC_SIZE]`` int64: counts, the hash seed and the LRU list ends; ``pc[C_LOG]`` is
  scratch (the events the last call logged), reset by every call that logs
- ``plog [n, 4]`` int64: the events of the last call (``events.py`` layout), while an
  event ring is attached; [0, 4] (nothing logged) otherwise
"""

from __future__ import annotations

import numba
import numpy as np

from ._blocks import (
    CACHED, GEN, INVALID_ARGUMENT, INVALID_SEQUENCE, LEN, LIVE, MARK, NUM_FREE, NUM_LIVE, NUM_RESERVED, OK,
    OUT_OF_MEMORY, PREDICTION_DUPLICATE, PREDICTION_RESERVED, PREDICTION_STALE, PREDICTION_UNFILLED, PREFETCHED,
    QUARANTINED, REFS, RESERVED, STATE, _first_not_live, _is_live, _push_block, add_sequence, drop_slot, fork_sequence,
    pop_free_block,
)
from ._event_ops import ALLOCATED, REMOVED, REUSED, SEALED, STORED
from ._keys import digest, feed, index_find, index_put, index_remove, new_index, root_key, start_state, words_of
from ._ring_ops import CAPACITY, ring_try_pop_batch
from ._step import OUT_STATUS, SEAL_BLOCK, SEAL_LOGICAL, SEAL_SLOT
from ._step import _clear_row as _step_clear_row
from ._step import _write_row as _step_write_row

NUM_PRIORITIES = 8  # eviction levels: priority 0 is evicted first, 7 last

# pblocks[:, P_KEY]:      [block_id] -> its key (while indexed)
# pblocks[:, P_PARENT]:   [block_id] -> parent block id, -1 for a first block, NOT_INDEXED
# pblocks[:, P_PRIO]:     [block_id] -> eviction level: the highest priority of a sequence
#                         that sealed or matched it since it was indexed
# pblocks[:, P_PINS]:     [block_id] -> pins through it (pin_prefix calls whose chain holds it)
# pblocks[:, P_PIN_ENDS]: [block_id] -> pins whose chain ends at it
# pblocks[:, P_PREV]:     [block_id] -> the next older block in its LRU list, -1 none
# pblocks[:, P_NEXT]:     [block_id] -> the next newer block in its LRU list, -1 none
# pblocks[:, P_NS]:       [block_id] -> namespace of the sequence that indexed it
P_KEY, P_PARENT, P_PRIO, P_PINS, P_PIN_ENDS, P_PREV, P_NEXT, P_NS = range(8)
NOT_INDEXED = -2

# pseqs[S_TRACKED]: [seq_id] -> 1 while every token id of the sequence is known and its
#                   sealed blocks are all indexed (its next seal can be), else 0
# pseqs[S_PRIO]:    [seq_id] -> its priority (0..NUM_PRIORITIES-1)
# pseqs[S_NS]:      [seq_id] -> its namespace
# pseqs[S_ROOT]:    [seq_id] -> its root key (the hash seed, and the parent key of its first block)
# pseqs[S_V1..S_V4]: [seq_id] -> XXH64's lanes after its sealed blocks' tokens (uint64 bits)
S_TRACKED, S_PRIO, S_NS, S_ROOT, S_V1, S_V2, S_V3, S_V4 = range(8)

# pc: [field] -> value (int64)
C_CACHED, C_EVICTABLE, C_QUERIES, C_HITS, C_EVICTIONS, C_STORED, C_LOG, C_SEED = range(8)
C_HEAD = 8  # pc[C_HEAD + level] -> oldest evictable block of that level, -1 none
C_TAIL = C_HEAD + NUM_PRIORITIES  # pc[C_TAIL + level] -> newest, -1 none
PC_SIZE = C_TAIL + NUM_PRIORITIES

# Compilation modes. Every function that never allocates is compiled without NRT
# (``_fast``), and its helpers are inlined into it at numba IR level (``_helper``):
# without NRT an inlined helper updates no reference counts, and inlining saves the
# call, which passes every array by value. Measured on 128 block references: an
# inlined helper in NRT code 2.9 us, a plain call 0.7 us, inlined here 0.07 us. Only
# the entry points that may copy their tokens (``words_of``) keep NRT (``_jit``) and
# hand over to a ``_fast`` body.
_jit = numba.njit(cache=True)
_fast = numba.njit(cache=True, _nrt=False)
_helper = numba.njit(cache=True, _nrt=False, inline="always")
_write_row = _helper(_step_write_row.py_func)
_clear_row = _helper(_step_clear_row.py_func)


def new_prefix_state(num_blocks: int, max_seqs: int, max_blocks_per_seq: int, block_size: int, seed: int):
    """Fresh (pblocks, ptok, pseqs, index, pc, plog, scratch): nothing indexed, no event
    log (:func:`new_log` makes one while an event ring is attached)."""
    # pblocks: [block_id, column] -> the columns documented above
    pblocks = np.zeros((num_blocks, 8), np.int64)
    pblocks[:, P_PARENT] = NOT_INDEXED
    pblocks[:, [P_PREV, P_NEXT]] = -1
    # ptok: [block_id, i] -> token i of an indexed block; [num_blocks + seq_id, i] -> token
    # i of seq_id's tail (while it is tracked)
    ptok = np.zeros((num_blocks + max_seqs, block_size), np.int32)
    # pseqs: [row, seq_id] -> the rows documented above
    pseqs = np.zeros((8, max_seqs), np.int64)
    # pc: [field] -> value (the fields above)
    pc = np.zeros(PC_SIZE, np.int64)
    pc[C_HEAD:] = -1
    pc[C_SEED] = seed
    # scratch: [logical block] -> block id of a match that fills no table
    scratch = np.zeros(max_blocks_per_seq, np.int32)
    # index: [slot] -> (key, block id or -1)
    return pblocks, ptok, pseqs, new_index(num_blocks), pc, new_log(0, 0), scratch


def new_log(num_blocks: int, max_blocks_per_seq: int) -> np.ndarray:
    """An event log for one call: [event] -> (kind, a, b, c), as in ``events.py``. A call
    logs at most 3 events a seal (evict, seal, store), or an allocation and a reuse per
    block of one table; with 0 rows nothing is logged (no ring attached)."""
    rows = 0 if num_blocks == 0 else 3 * num_blocks + max_blocks_per_seq + 1
    return np.zeros((rows, 4), np.int64)


# -- events, LRU lists, allocation ---------------------------------------------------------------
@_helper
def _log(plog, pc, kind, a, b, c):
    n = pc[C_LOG]
    if n < plog.shape[0]:  # (sized so that it never fills)
        plog[n, 0] = kind
        plog[n, 1] = a
        plog[n, 2] = b
        plog[n, 3] = c
        pc[C_LOG] = n + 1


@_helper
def _lru_push(pblocks, pc, block_id):
    # newest of its level
    level = pblocks[block_id, P_PRIO]
    tail = pc[C_TAIL + level]
    pblocks[block_id, P_PREV] = tail
    pblocks[block_id, P_NEXT] = -1
    if tail >= 0:
        pblocks[tail, P_NEXT] = block_id
    else:
        pc[C_HEAD + level] = block_id
    pc[C_TAIL + level] = block_id
    pc[C_EVICTABLE] += 1


@_helper
def _lru_unlink(pblocks, pc, block_id):
    level = pblocks[block_id, P_PRIO]
    prev, nxt = pblocks[block_id, P_PREV], pblocks[block_id, P_NEXT]
    if prev >= 0:
        pblocks[prev, P_NEXT] = nxt
    else:
        pc[C_HEAD + level] = nxt
    if nxt >= 0:
        pblocks[nxt, P_PREV] = prev
    else:
        pc[C_TAIL + level] = prev
    pblocks[block_id, P_PREV] = -1
    pblocks[block_id, P_NEXT] = -1
    pc[C_EVICTABLE] -= 1


@_fast  # (a call: rare, and inlined it would be compiled into every caller)
def _evict(pblocks, index, pc, plog):
    # Unindex the oldest block of the lowest non-empty level (the caller knows there is
    # one); it stays CACHED for the caller to retag. Returns its id.
    block_id = -1
    for level in range(NUM_PRIORITIES):
        if pc[C_HEAD + level] >= 0:
            block_id = pc[C_HEAD + level]
            break
    _lru_unlink(pblocks, pc, block_id)
    key = pblocks[block_id, P_KEY]
    index_remove(index, key)
    pblocks[block_id, P_PARENT] = NOT_INDEXED
    pc[C_CACHED] -= 1
    pc[C_EVICTIONS] += 1
    _log(plog, pc, REMOVED, block_id, key, 0)
    return block_id


@_helper
def _take(blocks, counters, pblocks, index, pc, plog, state):
    # A block for an allocation, marked `state`: the free stack's top, else an eviction.
    # The caller checked counters[NUM_FREE] + pc[C_EVICTABLE] > 0.
    if counters[NUM_FREE] > 0:
        return pop_free_block(blocks, counters, state)
    block_id = _evict(pblocks, index, pc, plog)
    blocks[STATE, block_id] = state
    return block_id


@_helper
def _release(blocks, counters, pblocks, pc, block_id):
    # The last reference to block_id went: cache it if indexed, else free it.
    if pblocks[block_id, P_PARENT] == NOT_INDEXED:
        _push_block(blocks, counters, block_id)
    else:
        blocks[STATE, block_id] = CACHED
        pc[C_CACHED] += 1
        if pblocks[block_id, P_PINS] == 0:
            _lru_push(pblocks, pc, block_id)


@_helper
def _acquire(blocks, counters, pblocks, pc, block_id, prio):
    # One more reference to an indexed block (LIVE or CACHED).
    refs = blocks[REFS, block_id]
    if refs == 0:
        if pblocks[block_id, P_PINS] == 0:
            _lru_unlink(pblocks, pc, block_id)
        pc[C_CACHED] -= 1
        blocks[STATE, block_id] = LIVE
        counters[NUM_LIVE] += 1
    blocks[REFS, block_id] = refs + 1
    if prio > pblocks[block_id, P_PRIO]:
        pblocks[block_id, P_PRIO] = prio


# -- matching and storing ------------------------------------------------------------------------
@_helper
def _match(pblocks, ptok, index, tokens, words, limit, block_size, namespace, root, out):
    # Leading whole blocks of `tokens` (at most `limit`; `words` its words_of) that are
    # indexed, checked token by token and parent by parent; their ids into out[:count].
    # Returns (count, the hash lanes after those blocks).
    parent = -1
    v1, v2, v3, v4 = start_state(root)
    step = block_size // 2
    for j in range(limit):
        start = j * block_size
        w1, w2, w3, w4 = feed(v1, v2, v3, v4, words, j * step, step)
        block_id = index_find(index, digest(w1, w2, w3, w4, start + block_size))
        if block_id < 0 or pblocks[block_id, P_PARENT] != parent:
            return j, v1, v2, v3, v4
        if parent == -1 and pblocks[block_id, P_NS] != namespace:
            return j, v1, v2, v3, v4
        diff = 0
        for i in range(block_size):  # (no early exit: vectorized)
            diff |= ptok[block_id, i] ^ tokens[start + i]
        if diff != 0:
            return j, v1, v2, v3, v4
        out[j] = block_id
        parent = block_id
        v1, v2, v3, v4 = w1, w2, w3, w4
    return limit, v1, v2, v3, v4


@_helper
def _save_lanes(pseqs, seq_id, v1, v2, v3, v4):
    pseqs[S_V1, seq_id] = np.int64(v1)
    pseqs[S_V2, seq_id] = np.int64(v2)
    pseqs[S_V3, seq_id] = np.int64(v3)
    pseqs[S_V4, seq_id] = np.int64(v4)


@_helper
def _store(tables, pblocks, ptok, pseqs, index, pc, plog, seq_id, j, block_id, row, block_size):
    # Index block_id, just sealed as logical block j of tracked seq_id from ptok[row].
    if j == 0:
        parent = -1
        parent_key = pseqs[S_ROOT, seq_id]
    else:
        parent = tables[seq_id, j - 1]
        parent_key = pblocks[parent, P_KEY]
    v1, v2, v3, v4 = feed(np.uint64(pseqs[S_V1, seq_id]), np.uint64(pseqs[S_V2, seq_id]),
                          np.uint64(pseqs[S_V3, seq_id]), np.uint64(pseqs[S_V4, seq_id]),
                          ptok[row].view(np.uint64), 0, block_size // 2)
    key = digest(v1, v2, v3, v4, (j + 1) * block_size)
    if index_put(index, key, block_id) >= 0:
        pseqs[S_TRACKED, seq_id] = 0  # cached already: this sequence's later blocks are not
        return
    _save_lanes(pseqs, seq_id, v1, v2, v3, v4)
    pblocks[block_id, P_KEY] = key
    pblocks[block_id, P_PARENT] = parent
    pblocks[block_id, P_PRIO] = pseqs[S_PRIO, seq_id]
    pblocks[block_id, P_PINS] = 0
    pblocks[block_id, P_PIN_ENDS] = 0
    pblocks[block_id, P_NS] = pseqs[S_NS, seq_id]
    for i in range(block_size):
        ptok[block_id, i] = ptok[row, i]
    pc[C_STORED] += 1
    _log(plog, pc, STORED, block_id, key, parent_key)


@_helper
def _fill(ptok, row, dst, tokens, src, count):
    for i in range(count):
        ptok[row, dst + i] = tokens[src + i]


@_helper
def _advance(blocks, seqs, counters, tables, pblocks, ptok, pseqs, index, pc, plog, seq_id, old_len, new_len,
             tokens, start, block_size):
    # Grow seq_id from old_len to new_len (checked, room checked): tail tokens, then a
    # block per boundary crossed (its reserved block first), indexed while tracked.
    # tokens[start:start + new_len - old_len] are the new token ids when tracked.
    tracked = pseqs[S_TRACKED, seq_id] != 0
    row = ptok.shape[0] - seqs.shape[1] + seq_id
    first, end = old_len // block_size, new_len // block_size
    pos = old_len
    for j in range(first, end):
        stop = (j + 1) * block_size
        if tracked:
            _fill(ptok, row, pos - j * block_size, tokens, start + pos - old_len, stop - pos)
        pos = stop
        prefetched = seqs[PREFETCHED, seq_id]
        if prefetched >= 0:
            block_id = prefetched
            seqs[PREFETCHED, seq_id] = -1
            counters[NUM_RESERVED] -= 1
            blocks[STATE, block_id] = LIVE
        else:
            block_id = _take(blocks, counters, pblocks, index, pc, plog, LIVE)
        blocks[REFS, block_id] = 1
        tables[seq_id, j] = block_id
        _log(plog, pc, SEALED, seq_id, j, block_id)
        if tracked:
            _store(tables, pblocks, ptok, pseqs, index, pc, plog, seq_id, j, block_id, row, block_size)
            tracked = pseqs[S_TRACKED, seq_id] != 0
    if tracked and new_len > pos:
        _fill(ptok, row, pos - end * block_size, tokens, start + pos - old_len, new_len - pos)
    counters[NUM_LIVE] += end - first
    seqs[LEN, seq_id] = new_len


@_helper
def _init_seq(pseqs, pc, seq_id, namespace, prio):
    pseqs[S_TRACKED, seq_id] = 1
    pseqs[S_PRIO, seq_id] = prio
    pseqs[S_NS, seq_id] = namespace
    root = root_key(pc[C_SEED], namespace)
    pseqs[S_ROOT, seq_id] = root
    v1, v2, v3, v4 = start_state(root)
    _save_lanes(pseqs, seq_id, v1, v2, v3, v4)


# -- the block manager's calls -------------------------------------------------------------------
@_fast
def add(seqs, counters, pseqs, pc, seq_id, namespace, prio):
    """``_blocks.add_sequence``, and the sequence tracked in ``namespace`` at ``prio``."""
    status, seq_id = add_sequence(seqs, counters, seq_id)
    if status == OK:
        _init_seq(pseqs, pc, seq_id, namespace, prio)
    return status, seq_id


@_jit
def admit(blocks, seqs, counters, tables, pblocks, ptok, pseqs, index, pc, plog, tokens, limit, seq_id,
          namespace, prio, block_size):
    """Add a sequence (slot ``seq_id``, -1 any) that starts with the longest indexed
    prefix of ``tokens`` (int32 [n]), at most ``limit`` blocks, shared by reference.

    Returns (status, seq_id, matched blocks); the sequence's length is
    ``matched * block_size``. Counts ``n`` queried tokens and the matched ones as hits.
    """
    return _admit(blocks, seqs, counters, tables, pblocks, ptok, pseqs, index, pc, plog, tokens,
                  words_of(tokens, limit * block_size), limit, seq_id, namespace, prio, block_size)


@_fast
def _admit(blocks, seqs, counters, tables, pblocks, ptok, pseqs, index, pc, plog, tokens, words, limit, seq_id,
           namespace, prio, block_size):
    pc[C_LOG] = 0
    status, seq_id = add_sequence(seqs, counters, seq_id)
    if status != OK:
        return status, seq_id, 0
    _init_seq(pseqs, pc, seq_id, namespace, prio)
    _log(plog, pc, ALLOCATED, seq_id, 0, -1)
    row = tables[seq_id]
    matched, v1, v2, v3, v4 = _match(pblocks, ptok, index, tokens, words, limit, block_size, namespace,
                                     pseqs[S_ROOT, seq_id], row)
    _save_lanes(pseqs, seq_id, v1, v2, v3, v4)
    for j in range(matched):
        _acquire(blocks, counters, pblocks, pc, row[j], prio)
        _log(plog, pc, REUSED, seq_id, j, row[j])
    seqs[LEN, seq_id] = matched * block_size
    pc[C_QUERIES] += tokens.shape[0]
    pc[C_HITS] += matched * block_size
    return OK, seq_id, matched


@_jit
def match(pblocks, ptok, index, pc, scratch, tokens, namespace, block_size):
    """Leading whole blocks of ``tokens`` (int32 [n]) indexed in ``namespace``, their ids
    into ``scratch``; changes nothing else."""
    limit = min(tokens.shape[0] // block_size, scratch.shape[0])
    return _match_into(pblocks, ptok, index, pc, scratch, tokens, words_of(tokens, limit * block_size), limit,
                       namespace, block_size)


@_fast
def _match_into(pblocks, ptok, index, pc, scratch, tokens, words, limit, namespace, block_size):
    return _match(pblocks, ptok, index, tokens, words, limit, block_size, namespace,
                  root_key(pc[C_SEED], namespace), scratch)[0]


@_fast
def free(blocks, seqs, counters, tables, pblocks, pc, seq_id, block_size):
    """``_blocks.free_sequence``: indexed blocks whose last reference goes are cached."""
    if not _is_live(seqs, seq_id):
        return INVALID_SEQUENCE, 0
    freed = 0
    for j in range(seqs[LEN, seq_id] // block_size - 1, -1, -1):  # leaves first
        block_id = tables[seq_id, j]
        tables[seq_id, j] = -1
        refs = blocks[REFS, block_id] - 1
        blocks[REFS, block_id] = refs
        if refs == 0:
            if blocks[STATE, block_id] == QUARANTINED:  # it stays out of the pool
                continue
            _release(blocks, counters, pblocks, pc, block_id)
            freed += 1
    counters[NUM_LIVE] -= freed
    return OK, freed + drop_slot(blocks, seqs, counters, seq_id)


@_fast
def fork(blocks, seqs, counters, tables, pseqs, ptok, parent, child, block_size):
    """``_blocks.fork_sequence``; the child inherits tracking, namespace, priority and tail tokens."""
    status, child = fork_sequence(blocks, seqs, counters, tables, parent, child, block_size)
    if status == OK:
        for r in range(pseqs.shape[0]):
            pseqs[r, child] = pseqs[r, parent]
        base = ptok.shape[0] - seqs.shape[1]
        for i in range(block_size):
            ptok[base + child, i] = ptok[base + parent, i]
    return status, child


@_fast
def grow(blocks, seqs, counters, tables, pblocks, ptok, pseqs, index, pc, plog, seq_id, new_len, block_size,
         tokens, has_tokens):
    """``_blocks.grow_sequence`` with the new token ids ``tokens`` (int32 [new_len -
    old_len]) when ``has_tokens``; without them the sequence is no longer tracked.

    Returns (status, first sealed logical block, hits, misses); INVALID_ARGUMENT when
    ``tokens`` has the wrong length. All or nothing.
    """
    pc[C_LOG] = 0
    if not _is_live(seqs, seq_id):
        return INVALID_SEQUENCE, 0, 0, 0
    old_len = seqs[LEN, seq_id]
    first = old_len // block_size
    if new_len < old_len or new_len > tables.shape[1] * block_size:
        return INVALID_SEQUENCE, first, 0, 0
    if has_tokens and tokens.shape[0] != new_len - old_len:
        return INVALID_ARGUMENT, first, 0, 0
    end = new_len // block_size
    hits = 0
    if end > first:
        hits = 1 if seqs[PREFETCHED, seq_id] >= 0 else 0
        if end - first > counters[NUM_FREE] + pc[C_EVICTABLE] + hits:
            return OUT_OF_MEMORY, first, 0, 0
    if new_len > old_len and not has_tokens:
        pseqs[S_TRACKED, seq_id] = 0
    _advance(blocks, seqs, counters, tables, pblocks, ptok, pseqs, index, pc, plog, seq_id, old_len, new_len,
             tokens, 0, block_size)
    return OK, first, hits, end - first - hits


@_fast
def truncate(blocks, seqs, counters, tables, pblocks, ptok, pseqs, pc, seq_id, new_len, block_size):
    """``_blocks.truncate_sequence``: indexed blocks whose last reference goes are cached.

    A tracked sequence stays tracked: its hash state is recomputed from the token ids
    of the sealed blocks it keeps (all indexed), so its next seal is indexed under the
    right key; the tail's token ids past ``new_len`` are overwritten by the next growth.
    Returns (status, blocks released).
    """
    pc[C_LOG] = 0
    if not _is_live(seqs, seq_id):
        return INVALID_SEQUENCE, 0
    old_len = seqs[LEN, seq_id]
    keep, end = new_len // block_size, old_len // block_size
    if new_len < 0 or new_len > old_len or (keep < end and new_len % block_size != 0):
        return INVALID_ARGUMENT, 0
    released = drop_references(blocks, counters, pblocks, pc, tables[seq_id, keep:end])  # leaves first
    for j in range(keep, end):
        tables[seq_id, j] = -1
    if keep < end and pseqs[S_TRACKED, seq_id] != 0:
        v1, v2, v3, v4 = start_state(pseqs[S_ROOT, seq_id])
        for j in range(keep):
            v1, v2, v3, v4 = feed(v1, v2, v3, v4, ptok[tables[seq_id, j]].view(np.uint64), 0, block_size // 2)
        _save_lanes(pseqs, seq_id, v1, v2, v3, v4)
    seqs[LEN, seq_id] = new_len
    return OK, released


@_fast
def step(blocks, seqs, counters, tables, seq_ids, new_lens, increment, block_size, out_rows, out_tables, seals,
         pblocks, ptok, pseqs, index, pc, plog, tokens, token_starts, has_tokens):
    """``_step.step`` with token ids: when ``has_tokens``, entry ``i``'s new tokens are
    ``tokens[i]`` (``increment``, tokens [B]) or ``tokens[token_starts[i]:token_starts[i +
    1]]`` (tokens [T], token_starts [B + 1]); a span of the wrong length fails that entry
    with INVALID_ARGUMENT. Without tokens, the sequences that grow are no longer tracked.
    """
    pc[C_LOG] = 0
    max_seqs, max_len = seqs.shape[1], tables.shape[1] * block_size
    num_sealed = num_failed = hits = misses = ooms = 0
    for i in range(seq_ids.shape[0]):
        seq_id = seq_ids[i]
        if seq_id < 0 or seq_id >= max_seqs or seqs[LEN, seq_id] < 0:
            out_rows[OUT_STATUS, i] = INVALID_SEQUENCE
            num_failed += 1
            _clear_row(out_rows, out_tables, i)
            continue
        old_len = seqs[LEN, seq_id]
        new_len = old_len + 1 if increment else new_lens[i]
        first, end = old_len // block_size, new_len // block_size
        status = OK
        start = i
        hit = 0
        if seqs[MARK, seq_id] != 0:
            status = INVALID_ARGUMENT  # the same sequence twice in one batch
        elif new_len < old_len or new_len > max_len:
            status = INVALID_SEQUENCE
        else:
            if has_tokens and not increment:
                start = token_starts[i]
                stop = token_starts[i + 1]
                if start < 0 or stop > tokens.shape[0] or stop - start != new_len - old_len:
                    status = INVALID_ARGUMENT
            if status == OK and end > first:
                hit = 1 if seqs[PREFETCHED, seq_id] >= 0 else 0
                if end - first > counters[NUM_FREE] + pc[C_EVICTABLE] + hit:
                    status = OUT_OF_MEMORY
                    ooms += 1
        seqs[MARK, seq_id] = 1
        if status == OK:
            if new_len > old_len and not has_tokens:
                pseqs[S_TRACKED, seq_id] = 0
            _advance(blocks, seqs, counters, tables, pblocks, ptok, pseqs, index, pc, plog, seq_id, old_len,
                     new_len, tokens, start, block_size)
            for j in range(first, end):
                seals[SEAL_SLOT, num_sealed] = seq_id
                seals[SEAL_LOGICAL, num_sealed] = j
                seals[SEAL_BLOCK, num_sealed] = tables[seq_id, j]
                num_sealed += 1
            if end > first:
                hits += hit
                misses += end - first - hit
        else:
            num_failed += 1
        out_rows[OUT_STATUS, i] = status
        _write_row(seqs, tables, out_rows, out_tables, i, seq_id, block_size)
    for i in range(seq_ids.shape[0]):
        seq_id = seq_ids[i]
        if seq_id >= 0 and seq_id < max_seqs:
            seqs[MARK, seq_id] = 0
    return num_sealed, num_failed, hits, misses, ooms


# -- reservations (a reservation may evict, as a seal would) -------------------------------------
@_fast
def reserve_blocks(blocks, seqs, counters, pblocks, index, pc, plog, seq_ids, out):
    """``_blocks.reserve_blocks``, evicting when the free stack is empty."""
    pc[C_LOG] = 0
    bad = _first_not_live(seqs, seq_ids)
    if bad >= 0:
        return bad, 0
    reserved = 0
    for i in range(seq_ids.shape[0]):
        seq_id = seq_ids[i]
        if seqs[PREFETCHED, seq_id] < 0 and counters[NUM_FREE] + pc[C_EVICTABLE] > 0:
            seqs[PREFETCHED, seq_id] = _take(blocks, counters, pblocks, index, pc, plog, RESERVED)
            reserved += 1
        out[i] = seqs[PREFETCHED, seq_id]
    counters[NUM_RESERVED] += reserved
    return -1, reserved


@_helper
def _reserve_rows(blocks, seqs, counters, pblocks, index, pc, plog, predictions, floor, max_reserved, counts):
    reserved = 0
    for i in range(predictions.shape[0]):
        seq_id, gen = predictions[i, 0], predictions[i, 1]
        if not _is_live(seqs, seq_id) or (gen >= 0 and gen != seqs[GEN, seq_id]):
            counts[PREDICTION_STALE] += 1
        elif seqs[PREFETCHED, seq_id] >= 0:
            counts[PREDICTION_DUPLICATE] += 1
        elif counters[NUM_FREE] + pc[C_EVICTABLE] <= floor or counters[NUM_RESERVED] >= max_reserved:
            counts[PREDICTION_UNFILLED] += 1
        else:
            seqs[PREFETCHED, seq_id] = _take(blocks, counters, pblocks, index, pc, plog, RESERVED)
            counters[NUM_RESERVED] += 1
            reserved += 1
    counts[PREDICTION_RESERVED] += reserved
    return reserved


@_fast
def reserve_predictions(blocks, seqs, counters, pblocks, index, pc, plog, predictions, floor, max_reserved,
                        counts):
    """``_blocks.reserve_predictions``; ``floor`` counts available (free + evictable) blocks."""
    pc[C_LOG] = 0
    return _reserve_rows(blocks, seqs, counters, pblocks, index, pc, plog, predictions, floor, max_reserved,
                         counts)


@_fast
def reserve_ring_predictions(blocks, seqs, counters, pblocks, index, pc, plog, buf, scratch, floor,
                             max_reserved, counts):
    """``_blocks.reserve_ring_predictions`` with evictions."""
    pc[C_LOG] = 0
    reserved = 0
    budget = buf[CAPACITY]
    while budget > 0:
        want = min(budget, scratch.shape[0])
        count = ring_try_pop_batch(buf, scratch[:want])
        if count <= 0:
            break
        budget -= count
        reserved += _reserve_rows(blocks, seqs, counters, pblocks, index, pc, plog, scratch[:count], floor,
                                  max_reserved, counts)
        if count < want:
            break
    return reserved


# -- pins, clearing ------------------------------------------------------------------------------
@_fast
def pin(blocks, pblocks, pc, scratch, count):
    """Pin the ``count`` blocks :func:`match` left in ``scratch`` (the longest indexed
    prefix of some tokens): they are not evicted until unpinned. Returns count."""
    for j in range(count):
        block_id = scratch[j]
        if pblocks[block_id, P_PINS] == 0 and blocks[REFS, block_id] == 0:
            _lru_unlink(pblocks, pc, block_id)
        pblocks[block_id, P_PINS] += 1
    if count:
        pblocks[scratch[count - 1], P_PIN_ENDS] += 1
    return count


@_fast
def unpin(blocks, pblocks, pc, scratch, count):
    """Undo one :func:`pin` of the longest pinned prefix among the ``count`` blocks
    :func:`match` left in ``scratch``; the blocks unpinned (0: none)."""
    last = -1
    for j in range(count):
        block_id = scratch[j]
        if pblocks[block_id, P_PINS] == 0:
            break
        if pblocks[block_id, P_PIN_ENDS] > 0:
            last = j
    if last < 0:
        return 0
    pblocks[scratch[last], P_PIN_ENDS] -= 1
    for j in range(last, -1, -1):  # leaves first, so they are evicted first
        block_id = scratch[j]
        pins = pblocks[block_id, P_PINS] - 1
        pblocks[block_id, P_PINS] = pins
        if pins == 0 and blocks[REFS, block_id] == 0:
            _lru_push(pblocks, pc, block_id)
    return last + 1


@_jit
def check_index(index, pblocks, ids):
    """For ``check_invariants``: the first of ``ids`` (int64 [n]) not found under its key, -1 if none."""
    for i in range(ids.shape[0]):
        if index_find(index, pblocks[ids[i], P_KEY]) != ids[i]:
            return ids[i]
    return -1


@_jit
def check_chains(pblocks, ptok, seed, block_size):
    """For ``check_invariants``, in O(indexed blocks): the first indexed block whose key is
    not the hash of its chain's tokens (or whose parents loop), -1 if none."""
    n = pblocks.shape[0]
    lanes = np.zeros((n, 4), np.uint64)  # [block_id] -> the hash lanes after its chain
    depth = np.full(n, -1, np.int64)  # [block_id] -> blocks before it in its chain, -1 not done
    stack = np.empty(n + 1, np.int64)
    step = block_size // 2
    for b in range(n):
        if pblocks[b, P_PARENT] == NOT_INDEXED or depth[b] >= 0:
            continue
        top, c = 0, b
        while c >= 0 and depth[c] < 0:  # up to a block already checked, or a root
            if top > n or pblocks[c, P_PARENT] == NOT_INDEXED:
                return b
            stack[top] = c
            top += 1
            c = pblocks[c, P_PARENT]
        for k in range(top - 1, -1, -1):
            x = stack[k]
            p = pblocks[x, P_PARENT]
            if p < 0:
                v1, v2, v3, v4 = start_state(root_key(seed, pblocks[x, P_NS]))
                depth[x] = 0
            else:
                v1, v2, v3, v4 = lanes[p, 0], lanes[p, 1], lanes[p, 2], lanes[p, 3]
                depth[x] = depth[p] + 1
            v1, v2, v3, v4 = feed(v1, v2, v3, v4, ptok[x].view(np.uint64), 0, step)
            if digest(v1, v2, v3, v4, (depth[x] + 1) * block_size) != pblocks[x, P_KEY]:
                return x
            lanes[x, 0], lanes[x, 1], lanes[x, 2], lanes[x, 3] = v1, v2, v3, v4
    return -1


@_fast
def clear(blocks, counters, pblocks, index, pc, plog):
    """Evict every evictable block (cached, unpinned) to the free stack, leaves first; how many."""
    pc[C_LOG] = 0
    evicted = 0
    while pc[C_EVICTABLE] > 0:
        _push_block(blocks, counters, _evict(pblocks, index, pc, plog))
        evicted += 1
    return evicted


# -- quarantine and migration (rare: ``_table_edits.py`` calls these) ----------------------------
@_jit
def unindex_subtree(blocks, seqs, counters, tables, pblocks, pseqs, index, pc, plog, block_id, block_size):
    """Take indexed ``block_id`` and every indexed descendant (their keys chain on it) out
    of the index, for a quarantine, so no later admission can match them.

    Descendants that no table references go to the free stack (ascending ids); the
    others stay LIVE, unindexed. A CACHED ``block_id`` leaves the cached count (the
    caller retags it). Pins through ``block_id`` become pins ending at its parent, so
    ``unpin_prefix`` of the same tokens still finds one. Sequences holding a removed block
    stop being tracked. Logs a REMOVED event per block; returns the number removed.
    """
    pc[C_LOG] = 0
    n = pblocks.shape[0]
    # under: [block] -> 1 if block_id or one of its descendants, 2 if not, 0 not yet known
    under = np.zeros(n, np.int8)
    under[block_id] = 1
    chain = np.empty(n + 1, np.int64)
    for b in range(n):
        top, c = 0, b
        while c >= 0 and under[c] == 0 and pblocks[c, P_PARENT] != NOT_INDEXED and top <= n:
            chain[top] = c
            top += 1
            c = pblocks[c, P_PARENT]
        verdict = 2  # reached a root (or an unindexed block): not under block_id
        if c >= 0 and under[c] != 0:
            verdict = under[c]
        for k in range(top):
            under[chain[k]] = verdict
    parent = pblocks[block_id, P_PARENT]
    if parent >= 0:
        pblocks[parent, P_PIN_ENDS] += pblocks[block_id, P_PINS]
    removed = 0
    for b in range(n):
        if under[b] != 1:
            continue
        key = pblocks[b, P_KEY]
        cached = blocks[STATE, b] == CACHED
        if cached:
            if pblocks[b, P_PINS] == 0:
                _lru_unlink(pblocks, pc, b)
            pc[C_CACHED] -= 1
        index_remove(index, key)
        pblocks[b, P_PARENT] = NOT_INDEXED
        pblocks[b, P_PINS] = 0
        pblocks[b, P_PIN_ENDS] = 0
        _log(plog, pc, REMOVED, b, key, 0)
        if cached and b != block_id:
            _push_block(blocks, counters, b)
        removed += 1
    for s in range(seqs.shape[1]):
        for j in range(max(seqs[LEN, s], 0) // block_size):
            if under[tables[s, j]] == 1:
                pseqs[S_TRACKED, s] = 0
                break
    return removed


@_fast
def evict_to_free(blocks, counters, pblocks, index, pc, plog, count):
    """Evict cached blocks to the free stack until ``count`` blocks are free (or none is
    evictable); the number evicted."""
    pc[C_LOG] = 0
    evicted = 0
    while counters[NUM_FREE] < count and pc[C_EVICTABLE] > 0:
        _push_block(blocks, counters, _evict(pblocks, index, pc, plog))
        evicted += 1
    return evicted


@_fast
def drop_references(blocks, counters, pblocks, pc, block_ids):
    """One reference less to each of ``block_ids`` (int32 [n], a table's old entries in
    logical order), leaves first: indexed blocks whose last reference goes are cached,
    others freed, quarantined ones stay. Returns the number released."""
    released = 0
    for i in range(block_ids.shape[0] - 1, -1, -1):
        block_id = block_ids[i]
        refs = blocks[REFS, block_id] - 1
        blocks[REFS, block_id] = refs
        if refs == 0:
            if blocks[STATE, block_id] == QUARANTINED:
                continue
            _release(blocks, counters, pblocks, pc, block_id)
            released += 1
    counters[NUM_LIVE] -= released
    return released
