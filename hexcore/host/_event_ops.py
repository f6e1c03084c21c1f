"""The njit core of block events: staging and pushing events, and applying them to a mirror.

Layout of an event and the kinds are documented in ``events.py``. Every function
here is ``njit(nogil=True, cache=True)`` and never raises: publishers return the
number of events still pending, ``RING_CLOSED`` or ``NEED_ROOM``; the mirror's
functions return the index of the first inconsistent event.
"""

from __future__ import annotations

import numba

from ._keys import index_find, index_insert, index_remove
from ._ring_ops import RING_CLOSED, ring_try_pop_batch, ring_try_push_batch

ALLOCATED, SEALED, FREED, FORKED = 0, 1, 2, 3
STORED, REMOVED, REUSED = 4, 5, 6  # prefix cache events (hexcore.host.prefix)
EVENT_WIDTH = 4
NEED_ROOM = -2  # a publish_* call found the staging array too small; nothing was staged

_jit = numba.njit(cache=True, nogil=True)


# -- publisher side ---------------------------------------------------------------------
# staging: int64 [capacity, 4] -> events not yet in the ring, rows [state[0], state[1])
# state:   int64 [2] -> (first pending row, end of pending rows)
@_jit
def _flush(buf, staging, state):
    start, end = state[0], state[1]
    if start < end:
        count = ring_try_push_batch(buf, staging[start:end])
        if count == RING_CLOSED:
            return RING_CLOSED
        start += count
    if start == end:
        start = end = 0
    state[0], state[1] = start, end
    return end - start


@_jit
def _room(staging, state, n):
    # True when n more rows fit after the pending ones (moving them to row 0 if needed).
    if state[1] + n <= staging.shape[0]:
        return True
    pending = state[1] - state[0]
    if pending + n > staging.shape[0]:
        return False
    for i in range(pending):
        for w in range(EVENT_WIDTH):
            staging[i, w] = staging[state[0] + i, w]
    state[0], state[1] = 0, pending
    return True


@_jit
def publish_one(buf, staging, state, kind, seq_id, arg, block_id):
    """Stage one event and flush; returns events still pending, RING_CLOSED or NEED_ROOM."""
    if not _room(staging, state, 1):
        return NEED_ROOM
    end = state[1]
    staging[end, 0], staging[end, 1], staging[end, 2], staging[end, 3] = kind, seq_id, arg, block_id
    state[1] = end + 1
    return _flush(buf, staging, state)


@_jit
def publish_run(buf, staging, state, seq_id, first, block_ids):
    """Stage SEALED events for ``block_ids`` (int32 [n]) at logical ``first``...; then flush."""
    n = block_ids.shape[0]
    if not _room(staging, state, n):
        return NEED_ROOM
    end = state[1]
    for i in range(n):
        staging[end + i, 0], staging[end + i, 1] = SEALED, seq_id
        staging[end + i, 2], staging[end + i, 3] = first + i, block_ids[i]
    state[1] = end + n
    return _flush(buf, staging, state)


@_jit
def publish_sealed(buf, staging, state, seals):
    """Stage SEALED events for a step's seals, int32 [3, n] rows (seq_id, logical, block_id)."""
    n = seals.shape[1]
    if not _room(staging, state, n):
        return NEED_ROOM
    end = state[1]
    for i in range(n):
        staging[end + i, 0], staging[end + i, 1] = SEALED, seals[0, i]
        staging[end + i, 2], staging[end + i, 3] = seals[1, i], seals[2, i]
    state[1] = end + n
    return _flush(buf, staging, state)


@_jit
def publish_records(buf, staging, state, records):
    """Stage ready-made events (int64 [n, 4]) and flush."""
    n = records.shape[0]
    if not _room(staging, state, n):
        return NEED_ROOM
    end = state[1]
    staging[end:end + n] = records
    state[1] = end + n
    return _flush(buf, staging, state)


# -- consumer side ---------------------------------------------------------------------
@numba.njit(cache=True, nogil=True, _nrt=False)  # no NRT: the key index helpers inline without refcounts
def apply_events(events, tables, num_sealed, refs, keys, key_index):
    """Apply ``events`` (int64 [n, 4]) to the mirror's arrays; index of the first bad event or -1.

    ``keys`` int64 [num_blocks, 3]: [block_id] -> (stored flag, key, parent key);
    ``key_index``: key -> block id (``_keys.py``). Events before a bad one stay applied;
    the bad one and those after are not.
    """
    max_seqs, max_blocks, num_blocks = tables.shape[0], tables.shape[1], refs.shape[0]
    for i in range(events.shape[0]):
        kind, seq_id, arg, block_id = events[i, 0], events[i, 1], events[i, 2], events[i, 3]
        if kind == STORED or kind == REMOVED:  # (kind, block_id, key, parent key)
            block, key = seq_id, arg
            if block < 0 or block >= num_blocks:
                return i
            if kind == STORED:
                if keys[block, 0] != 0 or index_find(key_index, key) >= 0:
                    return i
                keys[block, 0], keys[block, 1], keys[block, 2] = 1, key, block_id
                index_insert(key_index, key, block)
            else:
                if keys[block, 0] == 0 or keys[block, 1] != key:
                    return i
                keys[block, 0] = 0
                index_remove(key_index, key)
            continue
        if seq_id < 0 or seq_id >= max_seqs:
            return i
        live = num_sealed[seq_id] >= 0
        if kind == ALLOCATED:
            if live:
                return i
            num_sealed[seq_id] = 0
        elif kind == SEALED or kind == REUSED:
            if not live or arg != num_sealed[seq_id] or arg >= max_blocks:
                return i
            if block_id < 0 or block_id >= refs.shape[0]:
                return i
            tables[seq_id, arg] = block_id
            refs[block_id] += 1
            num_sealed[seq_id] = arg + 1
        elif kind == FREED:
            if not live:
                return i
            for j in range(num_sealed[seq_id]):
                refs[tables[seq_id, j]] -= 1
                tables[seq_id, j] = -1
            num_sealed[seq_id] = -1
        elif kind == FORKED:
            if live or arg < 0 or arg >= max_seqs or num_sealed[arg] < 0:
                return i
            for j in range(num_sealed[arg]):
                tables[seq_id, j] = tables[arg, j]
                refs[tables[arg, j]] += 1
            num_sealed[seq_id] = num_sealed[arg]
        else:
            return i
    return -1


@_jit
def drain_events(buf, out, tables, num_sealed, refs, keys, key_index, stats):
    """Pop and apply every event in the ring now; stats: int64 [3] -> (applied, bad event row, closed).

    On a bad event its 4 words are left in ``out[0]`` and ``stats[1]`` is 0 (else -1).
    """
    stats[1] = -1
    while True:
        count = ring_try_pop_batch(buf, out)
        if count == RING_CLOSED:
            stats[2] = 1
            return
        if count == 0:
            return
        bad = apply_events(out[:count], tables, num_sealed, refs, keys, key_index)
        if bad >= 0:
            stats[0] += bad
            out[0, :] = out[bad, :]
            stats[1] = 0
            return
        stats[0] += count
