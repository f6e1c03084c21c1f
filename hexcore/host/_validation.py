"""Argument checks, error messages and the invariant check of the block manager.

Kept out of the hot paths: messages are built only after njit code reported a
failure, by reading the (unchanged) state.
"""

from __future__ import annotations

import os

import numpy as np

from .._checks import range_message
from ..errors import HexcoreInvalidArgumentError, HexcoreOOMError, Status
from . import _blocks as core
from . import _prefix as pcore
from ._keys import lanes_after, root_key
from .ring import LockFreeRingBuffer

_I32 = np.dtype(np.int32)
_I64 = np.dtype(np.int64)
_NO_STARTS = np.zeros(0, np.int32)


def check_ids(name: str, array, max_len: int | None, like=None) -> None:
    """Raise unless ``array`` is a 1-D C-contiguous int32 ndarray (of ``like``'s shape)."""
    if (type(array) is np.ndarray and (array.dtype is _I32 or array.dtype == _I32)
            and array.ndim == 1 and array.flags.c_contiguous):
        if like is not None and array.shape != like.shape:
            raise HexcoreInvalidArgumentError(
                f"{name}: expected shape {like.shape} like seq_ids, got {array.shape}")
        if max_len is not None and array.shape[0] > max_len:
            raise HexcoreInvalidArgumentError(
                f"{name}: a batch holds at most max_seqs={max_len} entries, got {array.shape[0]}")
        return
    raise HexcoreInvalidArgumentError(f"{name}: expected a C-contiguous int32 1-D array, got {_describe(array)}")


def check_step_tokens(seq_ids, new_lens, tokens, token_starts) -> tuple:
    """A step's ``(tokens, token_starts)`` checked: tokens [B] int32 with ``new_lens`` None,
    else tokens [T] and token_starts [B + 1] int32 (both C-contiguous); ``(None, empty)``
    without tokens. Raises HexcoreInvalidArgumentError naming the bad one."""
    if tokens is None:
        if token_starts is not None:
            raise HexcoreInvalidArgumentError("token_starts: given without tokens")
        return None, _NO_STARTS
    if new_lens is None:
        if token_starts is not None:
            raise HexcoreInvalidArgumentError(
                "token_starts: only with new_lens (a decode step takes tokens [B], one per entry)")
        check_ids("tokens", tokens, None, like=seq_ids)
        return tokens, _NO_STARTS
    check_ids("tokens", tokens, None)
    if token_starts is None:
        raise HexcoreInvalidArgumentError("token_starts: expected [B + 1] int32 offsets into tokens with new_lens, "
                                          "got None")
    check_ids("token_starts", token_starts, None)
    if token_starts.shape[0] != seq_ids.shape[0] + 1:
        raise HexcoreInvalidArgumentError(
            f"token_starts: expected shape ({seq_ids.shape[0] + 1},) (B + 1), got {token_starts.shape}")
    return tokens, token_starts


def state_bytes(num_blocks: int, max_seqs: int, max_blocks_per_seq: int, block_size: int,
                prefix_cache: bool) -> int:
    """Host bytes a PagedKVCache of these sizes allocates up front (its njit state: block
    and slot arrays, two [max_seqs, max_blocks_per_seq] int32 tables; with the prefix cache
    its blocks' keys and token ids, the key index and an event log)."""
    total = 64 + 24 * num_blocks + 48 * max_seqs + 8 * max_seqs * max_blocks_per_seq
    if prefix_cache:
        index = 16 << max(4, (2 * num_blocks - 1).bit_length())
        total += 256 + 64 * num_blocks + 4 * block_size * (num_blocks + max_seqs) + 64 * max_seqs + index
        total += 32 * (3 * num_blocks + max_blocks_per_seq + 1) + 4 * max_blocks_per_seq  # log, scratch
    return total


def physical_memory_bytes() -> int | None:
    """This machine's physical memory (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_state_size(num_blocks: int, max_seqs: int, max_blocks_per_seq: int, block_size: int,
                     prefix_cache: bool) -> None:
    """Raise HexcoreOOMError when a PagedKVCache of these sizes needs more host memory than
    the machine has (numpy would raise a bare MemoryError, or an overcommitting kernel
    hand out pages until the OOM killer steps in)."""
    need = state_bytes(num_blocks, max_seqs, max_blocks_per_seq, block_size, prefix_cache)
    have = physical_memory_bytes()
    if have is not None and need > have:
        raise HexcoreOOMError(
            f"PagedKVCache(num_blocks={num_blocks}, max_seqs={max_seqs}, max_seq_len="
            f"{max_blocks_per_seq * block_size}) needs {need / 2**30:.1f} GiB of host memory for its state "
            f"(24 bytes a block, 8 a block-table entry: max_seqs * max_seq_len / block_size of them), more "
            f"than this machine's {have / 2**30:.1f} GiB")


def check_predictions(name: str, array) -> None:
    """Raise unless ``array`` is an int64 ``[n, 2]`` ndarray (the message names the ring option too)."""
    if type(array) is np.ndarray and array.dtype == _I64 and array.ndim == 2 and array.shape[1] == 2:
        return
    got = repr(array) if isinstance(array, LockFreeRingBuffer) else _describe(array)
    raise HexcoreInvalidArgumentError(
        f"{name}: expected an int64 [n, 2] array or a LockFreeRingBuffer of record_width 2, got {got}")


def check_counts(name: str, array, size: int) -> None:
    """Raise unless ``array`` is a writable int64 ``[size]`` ndarray."""
    if type(array) is np.ndarray and array.dtype == _I64 and array.shape == (size,) and array.flags.writeable:
        return
    got = _describe(array) + ("" if not isinstance(array, np.ndarray) or array.flags.writeable else " read-only")
    raise HexcoreInvalidArgumentError(f"{name}: expected a writable int64 [{size}] array, got {got}")


def _describe(array) -> str:
    if isinstance(array, np.ndarray):
        return f"{array.dtype} shape {array.shape}" + ("" if array.flags.c_contiguous else " strided")
    return type(array).__name__


def describe_seq_error(cache, status: int, action: str, name: str, seq_id, new_len=None) -> str:
    """The message of a failed ``action`` on sequence ``seq_id``, passed as argument ``name``.

    Read from the (unchanged) state after the njit core reported ``status``. A message
    about an argument starts with it (``"<name>: ..."``); an id out of ``[0, max_seqs)``
    gets the integer rule's ``"<name>: expected an int in [0, max_seqs - 1], got <id>"``.
    """
    seqs, max_seqs = cache._seqs, cache.max_seqs
    if action == "add" and seq_id is None:
        return f"no free sequence slot: all max_seqs={max_seqs} slots are live"
    if not 0 <= seq_id < max_seqs:
        return range_message(name, seq_id, 0, max_seqs - 1)
    length = int(seqs[core.LEN, seq_id])
    if action == "add":
        return f"{name}: sequence {seq_id} is already live (length {length})"
    if length < 0:
        hint = " (double free?)" if action == "free" else ""
        return f"{name}: sequence {seq_id} is not live{hint}"
    if action != "grow":
        return f"{name}: sequence {seq_id}: {action} failed with {Status(status).name}"
    if not length <= new_len <= cache.max_seq_len:
        return (range_message("new_len", new_len, length, cache.max_seq_len)
                + f" (sequence {seq_id} holds {length} tokens; max_seq_len {cache.max_seq_len})")
    bs = cache.block_size
    need = new_len // bs - length // bs
    reserved = int(seqs[core.PREFETCHED, seq_id] >= 0)
    evictable = f" + {cache.num_evictable_blocks} evictable" if cache.prefix_cache_enabled else ""
    return (f"out of blocks: sequence {seq_id} growing {length} -> {new_len} needs {need} blocks, "
            f"{cache.num_free_blocks} free{evictable} + {reserved} reserved")


def check_truncation(seq_id: int, old_len: int, new_len: int, block_size: int) -> None:
    """Raise HexcoreInvalidArgumentError unless sequence ``seq_id`` (``old_len`` tokens) can
    shrink to ``new_len``: within ``[0, old_len]``, and inside its open tail or on a block boundary."""
    if not 0 <= new_len <= old_len:
        raise HexcoreInvalidArgumentError(range_message("new_len", new_len, 0, old_len)
                                          + f" (sequence {seq_id} holds {old_len} tokens)")
    tail_start = old_len // block_size * block_size
    if new_len < tail_start and new_len % block_size:
        block = new_len // block_size
        raise HexcoreInvalidArgumentError(
            f"new_len: {new_len} falls inside sealed block {block} (tokens [{block * block_size}, "
            f"{(block + 1) * block_size})) of sequence {seq_id}, which holds {old_len} tokens; it can shrink to "
            f"[{tail_start}, {old_len}] (its open tail) or to a multiple of block_size {block_size}")


def _check(ok, message: str) -> None:
    if not ok:
        raise AssertionError(message)


def verify_state(blocks, seqs, tables, counters, block_size: int, prefix=None) -> None:
    """Raise AssertionError at the first broken invariant of the block manager's state
    (``prefix``: the cache's PrefixState, or None when the prefix cache is off)."""
    num_blocks, max_seqs = blocks.shape[1], seqs.shape[1]
    num_free, num_free_seqs = int(counters[core.NUM_FREE]), int(counters[core.NUM_FREE_SEQS])
    num_live, num_reserved = int(counters[core.NUM_LIVE]), int(counters[core.NUM_RESERVED])
    num_cached = 0 if prefix is None else int(prefix.pc[pcore.C_CACHED])
    num_quarantined = int(counters[core.NUM_QUARANTINED])
    _check(num_free + num_live + num_reserved + num_cached + num_quarantined == num_blocks,
           f"free {num_free} + live {num_live} + reserved {num_reserved} + cached {num_cached} + quarantined "
           f"{num_quarantined} != {num_blocks} blocks")
    free_ids = blocks[core.FREE_STACK, :num_free]
    _check(len(np.unique(free_ids)) == num_free, "duplicate ids on the free stack")
    state, refs = blocks[core.STATE], blocks[core.REFS]
    _check(np.all(state[free_ids] == core.FREE), "a block on the free stack is not FREE")
    _check(np.count_nonzero(state == core.FREE) == num_free, "FREE blocks missing from the stack")
    lens = seqs[core.LEN]
    live = lens >= 0
    _check(max_seqs - num_free_seqs == np.count_nonzero(live), "live sequence count mismatch")
    free_seqs = seqs[core.FREE_SEQS, :num_free_seqs]
    _check(np.array_equal(np.sort(free_seqs), np.flatnonzero(~live)), "free slot stack mismatch")
    _check(np.array_equal(seqs[core.SEQ_POS, free_seqs], np.arange(num_free_seqs)), "slot positions")
    _check(not np.any(seqs[core.MARK]), "batch marks left set")
    counts = np.zeros(num_blocks, np.int64)
    for s in np.flatnonzero(live):
        nb = lens[s] // block_size
        _check(np.all(tables[s, :nb] >= 0) and np.all(tables[s, nb:] == -1),
               f"table row of seq {s} does not hold exactly {nb} blocks")
        np.add.at(counts, tables[s, :nb], 1)
    _check(np.all(tables[~live] == -1), "a dead sequence's table row is not empty")
    _check(np.array_equal(counts, refs), "reference counts != block-table references")
    quarantined = state == core.QUARANTINED
    _check(np.array_equal(refs > 0, (state == core.LIVE) | (quarantined & (refs > 0))),
           "LIVE blocks != referenced blocks (quarantined ones aside)")
    _check(np.count_nonzero(state == core.LIVE) == num_live, "live block count mismatch")
    _check(np.count_nonzero(quarantined) == num_quarantined, "quarantined block count mismatch")
    prefetched = seqs[core.PREFETCHED]
    _check(np.all(prefetched[~live] == -1), "a dead sequence holds a reserved block")
    held = prefetched[prefetched >= 0]
    _check(len(np.unique(held)) == len(held) == num_reserved, "reserved block count mismatch")
    _check(np.all(state[held] == core.RESERVED), "a prefetched block is not RESERVED")
    _check(np.count_nonzero(state == core.RESERVED) == num_reserved, "stray RESERVED blocks")
    if prefix is None:
        _check(not np.any(state == core.CACHED), "CACHED blocks with the prefix cache off")
    else:
        _check(not np.any(quarantined & (prefix.pblocks[:, pcore.P_PARENT] != pcore.NOT_INDEXED)),
               "a quarantined block is still indexed")
        _verify_prefix(blocks, seqs, tables, prefix, block_size)


def _verify_prefix(blocks, seqs, tables, prefix, block_size: int) -> None:
    # The prefix cache's invariants (_prefix.py): index, chains, pins, levels, LRU lists.
    pb, ptok, pseqs, index, pc = prefix.pblocks, prefix.ptok, prefix.pseqs, prefix.index, prefix.pc
    state, refs = blocks[core.STATE], blocks[core.REFS]
    parent, prio = pb[:, pcore.P_PARENT], pb[:, pcore.P_PRIO]
    pins, pin_ends = pb[:, pcore.P_PINS], pb[:, pcore.P_PIN_ENDS]
    indexed = parent != pcore.NOT_INDEXED
    ids = np.flatnonzero(indexed)
    cached = state == core.CACHED
    _check(np.count_nonzero(cached) == pc[pcore.C_CACHED], "cached block count mismatch")
    _check(np.all(indexed[cached]), "a CACHED block is not indexed")
    _check(np.all((state[ids] == core.LIVE) | (state[ids] == core.CACHED)), "an indexed block is free or reserved")
    _check(not np.any(pins[~indexed]) and not np.any(pin_ends[~indexed]), "pins on a block not indexed")
    # the index holds exactly the indexed blocks, each under its key and found by probing
    rows = index[index[:, 1] >= 0]
    _check(np.array_equal(np.sort(rows[:, 1]), ids), "index rows != indexed blocks")
    _check(np.array_equal(pb[rows[:, 1], pcore.P_KEY], rows[:, 0]), "an index row's key is not its block's")
    bad = pcore.check_index(index, pb, ids)
    _check(bad < 0, f"block {bad} is not found under its key")
    # chains: a key is the hash of the tokens of its chain from the root; parents are
    # indexed, within one namespace, with at least the child's references, pins and level
    par = parent[ids]
    _check(np.all(par >= -1) and np.all(indexed[par[par >= 0]]), "an indexed block's parent is not indexed")
    bad = pcore.check_chains(pb, ptok, np.int64(prefix.seed), block_size)
    _check(bad < 0, f"block {bad}'s key is not the hash of its chain's tokens")
    child, p = ids[par >= 0], par[par >= 0]
    _check(np.array_equal(pb[p, pcore.P_NS], pb[child, pcore.P_NS]), "a parent is in another namespace")
    _check(np.all((refs[p] >= refs[child]) & (pins[p] >= pins[child]) & (prio[p] >= prio[child])),
           "a parent has fewer references, pins or a lower level than its child")
    child_pins = np.zeros(len(pb), np.int64)
    np.add.at(child_pins, par[par >= 0], pins[ids[par >= 0]])
    _check(np.all(pin_ends >= 0) and np.array_equal(pins, pin_ends + child_pins),
           "pins != pins ending here + the children's pins")
    _check(np.all((prio[ids] >= 0) & (prio[ids] < pcore.NUM_PRIORITIES)), "a level out of range")
    # LRU lists: exactly the cached unpinned blocks, by level; in each, a block is newer
    # than its listed descendants (so the head of the lowest level is a leaf)
    position = np.full(len(pb), -1, np.int64)
    listed = 0
    for level in range(pcore.NUM_PRIORITIES):
        b, prev = pc[pcore.C_HEAD + level], -1
        while b >= 0:
            _check(position[b] < 0 and listed < len(pb), f"LRU list {level} loops")
            _check(pb[b, pcore.P_PREV] == prev and prio[b] == level, f"LRU list {level} links or level of block {b}")
            position[b] = listed
            listed += 1
            prev, b = b, pb[b, pcore.P_NEXT]
        _check(pc[pcore.C_TAIL + level] == prev, f"LRU list {level} tail")
    evictable = cached & (pins == 0)
    _check(listed == pc[pcore.C_EVICTABLE] and np.array_equal(position >= 0, evictable),
           "LRU lists != cached unpinned blocks")
    on_list = ids[(position[ids] >= 0) & (par >= 0)]
    on_list = on_list[position[parent[on_list]] >= 0]
    _check(np.all(position[parent[on_list]] > position[on_list]), "a parent would be evicted before its child")
    # tables: an indexed block follows its parent; a tracked sequence's blocks are all indexed
    lens = seqs[core.LEN]
    for s in np.flatnonzero(lens >= 0):
        row = tables[s, :lens[s] // block_size]
        expected = np.concatenate(([-1], row[:-1])) if len(row) else row
        _check(np.all(parent[row][indexed[row]] == expected[indexed[row]]),
               f"seq {s}: an indexed block does not follow its parent")
        _check(not len(row) or not indexed[row[0]] or pb[row[0], pcore.P_NS] == pseqs[pcore.S_NS, s],
               f"seq {s}: its first block is in another namespace")
        if pseqs[pcore.S_TRACKED, s]:
            _check(np.all(indexed[row]), f"tracked seq {s} holds a block that is not indexed")
            root = root_key(np.int64(prefix.seed), pseqs[pcore.S_NS, s])
            _check(pseqs[pcore.S_ROOT, s] == root, f"seq {s}'s root key")
            lanes = np.zeros(4, np.int64)
            lanes_after(np.ascontiguousarray(ptok[row]).reshape(-1), pseqs[pcore.S_ROOT, s], lanes)
            _check(np.array_equal(lanes, pseqs[pcore.S_V1:pcore.S_V4 + 1, s]), f"seq {s}'s hash state")
