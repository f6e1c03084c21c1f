"""Argument checks, error messages and the invariant check of the block manager.

Kept out of the hot paths: messages are built only after njit code reported a
failure, by reading the (unchanged) state.
"""

from __future__ import annotations

import numpy as np

from .._checks import range_message
from ..errors import HexcoreInvalidArgumentError, Status
from . import _blocks as core
from .ring import LockFreeRingBuffer

_I32 = np.dtype(np.int32)
_I64 = np.dtype(np.int64)


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
    return (f"out of blocks: sequence {seq_id} growing {length} -> {new_len} needs {need} blocks, "
            f"{cache.num_free_blocks} free + {reserved} reserved")


def _check(ok, message: str) -> None:
    if not ok:
        raise AssertionError(message)


def verify_state(blocks, seqs, tables, counters, block_size: int) -> None:
    """Raise AssertionError at the first broken invariant of the block manager's state."""
    num_blocks, max_seqs = blocks.shape[1], seqs.shape[1]
    num_free, num_free_seqs = int(counters[core.NUM_FREE]), int(counters[core.NUM_FREE_SEQS])
    num_live, num_reserved = int(counters[core.NUM_LIVE]), int(counters[core.NUM_RESERVED])
    _check(num_free + num_live + num_reserved == num_blocks,
           f"free {num_free} + live {num_live} + reserved {num_reserved} != {num_blocks} blocks")
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
    _check(np.array_equal(refs > 0, state == core.LIVE), "LIVE blocks != referenced blocks")
    _check(np.count_nonzero(state == core.LIVE) == num_live, "live block count mismatch")
    prefetched = seqs[core.PREFETCHED]
    _check(np.all(prefetched[~live] == -1), "a dead sequence holds a reserved block")
    held = prefetched[prefetched >= 0]
    _check(len(np.unique(held)) == len(held) == num_reserved, "reserved block count mismatch")
    _check(np.all(state[held] == core.RESERVED), "a prefetched block is not RESERVED")
    _check(np.count_nonzero(state == core.RESERVED) == num_reserved, "stray RESERVED blocks")
