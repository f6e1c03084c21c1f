"""A decode step's index arrays on the host: checked, padded into pinned memory, copied once.

``check_step`` validates what ``PagedKVCache.step`` produced (Python checks types and
shapes, one njit call checks every value) and raises HexcoreInvalidArgumentError naming
the first bad entry. ``Staging`` packs a checked step into the layout of a bucket's
index buffer (``step.py``) and copies it to the device with one async copy from pinned
memory, double-buffered: a step never overwrites a buffer whose copy may be in flight.
"""

from __future__ import annotations

from typing import NamedTuple

import numba
import numpy as np
from numba import cuda

from ..._checks import as_int
from ...errors import HexcoreInvalidArgumentError
from ..arrays import checked_store
from ..device import SIMULATOR
from .capture import check
from .step import (FORK_DST, FORK_SRC, POSITIONS, ROWS, SEAL_BLOCKS, SEAL_SLOTS, SEQ_LENS, TABLES_ROW, TAIL_SLOTS)

RANGE, REPEATED, POSITION, OVERLAP = 1, 2, 3, 4  # kinds of bad entry `validate` reports
TABLES = -2  # `validate`'s number for block_tables; other arrays by their row in ROWS (-1: all good)
NO_IDS = np.empty(0, np.int32)


class StepIndices(NamedTuple):
    """A checked step: host int32 arrays, and its longest sequence."""

    block_tables: np.ndarray
    seq_lens: np.ndarray
    tail_slots: np.ndarray
    seal_slots: np.ndarray
    seal_blocks: np.ndarray
    fork_src: np.ndarray
    fork_dst: np.ndarray
    longest: int
    verify_blocks: np.ndarray = NO_IDS


def check_step(store, max_blocks_per_seq: int, block_tables, seq_lens, tail_slots, positions=None, seal_slots=None,
               seal_blocks=None, fork_src=None, fork_dst=None, verify_blocks=None) -> StepIndices:
    """Validate a step's host index arrays (see ``DecodeGraph.step``); None means none.
    ``verify_blocks``: int32 ``[n]`` ids in ``[0, num_blocks)`` (repeats allowed)."""
    store = checked_store(store)
    max_blocks_per_seq = as_int("max_blocks_per_seq", max_blocks_per_seq, 1, 2**31 - 1)
    seq_lens = _ids("seq_lens", seq_lens, None)
    batch = seq_lens.shape[0]
    if batch == 0:
        raise HexcoreInvalidArgumentError("seq_lens: expected at least one sequence, got 0")
    tail_slots = _ids("tail_slots", tail_slots, batch)
    positions = NO_IDS if positions is None else _ids("positions", positions, batch)
    tables = block_tables
    if not isinstance(tables, np.ndarray) or tables.dtype != np.int32 or tables.ndim != 2 or tables.shape[0] != batch:
        got = f"{tables.dtype} {tables.shape}" if isinstance(tables, np.ndarray) else type(tables).__name__
        raise HexcoreInvalidArgumentError(f"block_tables: expected a host int32 array of shape ({batch}, *), got {got}")
    seal_slots = NO_IDS if seal_slots is None else _ids("seal_slots", seal_slots, None)
    seal_blocks = NO_IDS if seal_blocks is None else _ids("seal_blocks", seal_blocks, seal_slots.shape[0])
    fork_src = NO_IDS if fork_src is None else _ids("fork_src", fork_src, None)
    fork_dst = NO_IDS if fork_dst is None else _ids("fork_dst", fork_dst, fork_src.shape[0])
    for name, ids, other in (("seal_blocks", seal_blocks, seal_slots), ("fork_dst", fork_dst, fork_src)):
        if ids.shape[0] != other.shape[0]:
            raise HexcoreInvalidArgumentError(f"{name}: expected shape ({other.shape[0]},), got {ids.shape}")
    block_size = store.config.block_size
    max_len = (min(tables.shape[1], max_blocks_per_seq) + 1) * block_size - 1
    rows = (seq_lens, tail_slots, positions, seal_slots, seal_blocks, fork_src, fork_dst)  # in ROWS order
    which, i, j, kind, longest = validate(tables, *rows[:3], positions is not NO_IDS, *rows[3:], block_size,
                                          store.num_blocks, store.max_seqs, max_len)
    if which != -1:
        raise _bad_entry(store, which, i, j, kind, tables, rows, max_len)
    if verify_blocks is None:  # (no compiled call on the common path)
        verify_blocks = NO_IDS
    else:
        verify_blocks = _ids("verify_blocks", verify_blocks, None)
        i = _first_outside(verify_blocks, store.num_blocks)
        if i >= 0:
            raise HexcoreInvalidArgumentError(f"verify_blocks[{i}] = {verify_blocks[i]} is outside "
                                              f"[0, {store.num_blocks})")
    return StepIndices(tables, seq_lens, tail_slots, seal_slots, seal_blocks, fork_src, fork_dst, int(longest),
                       verify_blocks)


class Staging:
    """Two pinned host buffers shaped like ``index`` (a bucket's device index buffer),
    each with an event recorded after the copy that reads it."""

    def __init__(self, index, block_size: int, verify_capacity: int = 0):
        self.index, self.block_size, self.verify_capacity = index, block_size, verify_capacity
        self._stages = [cuda.pinned_array(index.shape[0], np.int32) for _ in range(2)]
        self._addresses = [stage.ctypes.data for stage in self._stages]
        self._turn = 0
        if not SIMULATOR:
            from cuda.bindings import driver

            from ..arrays import device_pointer

            self._events = [cuda.event(timing=False) for _ in range(2)]
            self._device = driver.CUdeviceptr(device_pointer(index))
            self._copy, self._record = driver.cuMemcpyHtoDAsync, driver.cuEventRecord
            self._wait = driver.cuEventSynchronize

    def upload(self, step: StepIndices, bucket: int, width: int, handle) -> None:
        """Pack ``step`` padded to ``bucket`` rows with ``width``-wide block tables, and
        copy it to ``index`` on the stream ``handle`` (a CUstream; ignored on the simulator)."""
        stage = self._stages[self._turn]
        if not SIMULATOR:  # the copy that last read this buffer must be done
            check(self._wait(self._events[self._turn].handle), "cuEventSynchronize")
        count = pack(stage, bucket, width, step.block_tables, step.seq_lens, step.tail_slots, step.seal_slots,
                     step.seal_blocks, step.fork_src, step.fork_dst, step.verify_blocks, self.verify_capacity,
                     self.block_size)
        if SIMULATOR:
            self.index[:count].copy_to_device(stage[:count])
        else:
            check(self._copy(self._device, self._addresses[self._turn], 4 * count, handle), "cuMemcpyHtoDAsync")
            check(self._record(self._events[self._turn].handle, handle), "cuEventRecord")
        self._turn ^= 1


def _ids(name: str, x, count: int | None) -> np.ndarray:
    if not isinstance(x, np.ndarray) or x.dtype != np.int32 or x.ndim != 1 or (count is not None
                                                                               and x.shape[0] != count):
        want = f"({'*' if count is None else count},)"
        got = f"{x.dtype} {x.shape}" if isinstance(x, np.ndarray) else type(x).__name__
        raise HexcoreInvalidArgumentError(f"{name}: expected a host int32 array of shape {want}, got {got}")
    return x


def _bad_entry(store, which, i, j, kind, tables, rows, max_len) -> HexcoreInvalidArgumentError:
    block_size, seq_lens = store.config.block_size, rows[SEQ_LENS]
    if which == TABLES:
        return HexcoreInvalidArgumentError(f"block_tables[{i}, {j}] = {tables[i, j]} is outside "
                                           f"[0, {store.num_blocks}) for seq_len {seq_lens[i]}")
    name, value = ROWS[which], rows[which][i]
    if kind == POSITION:
        return HexcoreInvalidArgumentError(f"positions[{i}] = {value}: expected (seq_lens[{i}] - 1) % block_size "
                                           f"= {(seq_lens[i] - 1) % block_size}")
    if kind == REPEATED:
        return HexcoreInvalidArgumentError(f"{name}[{i}] = {value} repeats an earlier entry: expected distinct ids")
    if kind == OVERLAP:
        return HexcoreInvalidArgumentError(
            f"{name}[{i}] = {value} is also a fork_src entry: one copy launch would read and write tail {value} "
            f"(a race); fork from a sequence that is not itself a fork target of this step")
    low, high = {SEQ_LENS: (1, max_len + 1), POSITIONS: (0, block_size),
                 SEAL_BLOCKS: (0, store.num_blocks)}.get(which, (0, store.max_seqs))
    return HexcoreInvalidArgumentError(f"{name}[{i}] = {value} is outside [{low}, {high})")


@numba.njit(cache=True)
def validate(tables, seq_lens, tail_slots, positions, has_positions, seal_slots, seal_blocks, fork_src, fork_dst,
             block_size, num_blocks, max_seqs, max_len):
    """First bad entry of a step's index arrays as (array, row, column, kind, longest):
    array TABLES or a row number of ROWS (-1: all good), kind RANGE, REPEATED,
    POSITION or OVERLAP (a fork_dst entry that is also a fork_src entry: the fork copy
    would read and write it in one launch), longest the largest seq_len. Array lengths
    are checked by the caller."""
    longest = 0
    for b in range(seq_lens.shape[0]):
        n = seq_lens[b]
        if n < 1 or n > max_len:
            return SEQ_LENS, b, 0, RANGE, 0
        longest = max(longest, n)
        if tail_slots[b] < 0 or tail_slots[b] >= max_seqs:
            return TAIL_SLOTS, b, 0, RANGE, 0
        if has_positions and positions[b] != (n - 1) % block_size:
            return POSITIONS, b, 0, RANGE if positions[b] < 0 or positions[b] >= block_size else POSITION, 0
        for j in range(n // block_size):
            if tables[b, j] < 0 or tables[b, j] >= num_blocks:
                return TABLES, b, j, RANGE, 0
    for k, i in ((SEAL_SLOTS, _first_outside(seal_slots, max_seqs)),
                 (SEAL_BLOCKS, _first_outside(seal_blocks, num_blocks)),
                 (FORK_SRC, _first_outside(fork_src, max_seqs)), (FORK_DST, _first_outside(fork_dst, max_seqs))):
        if i >= 0:
            return k, i, 0, RANGE, 0
    for k, i in ((TAIL_SLOTS, _first_repeat(tail_slots)), (SEAL_SLOTS, _first_repeat(seal_slots)),
                 (SEAL_BLOCKS, _first_repeat(seal_blocks)), (FORK_DST, _first_repeat(fork_dst))):
        if i >= 0:
            return k, i, 0, REPEATED, 0
    i = _first_shared(fork_src, fork_dst)
    if i >= 0:
        return FORK_DST, i, 0, OVERLAP, 0
    return -1, 0, 0, 0, longest


@numba.njit(cache=True)
def _first_shared(src, dst):
    # the first index of dst whose id is also in src, -1 if none
    if src.shape[0] == 0:
        return -1
    ordered = np.sort(src)
    for i in range(dst.shape[0]):
        k = np.searchsorted(ordered, dst[i])
        if k < ordered.shape[0] and ordered[k] == dst[i]:
            return i
    return -1


@numba.njit(cache=True)
def _first_outside(ids, upper):
    # the first index whose id is outside [0, upper), -1 if none
    for i in range(ids.shape[0]):
        if ids[i] < 0 or ids[i] >= upper:
            return i
    return -1


@numba.njit(cache=True)
def _first_repeat(ids):
    # the first index whose value appeared before it, -1 if none
    order = np.argsort(ids, kind="mergesort")
    first = -1
    for k in range(1, ids.shape[0]):
        if ids[order[k]] == ids[order[k - 1]] and (first < 0 or order[k] < first):
            first = order[k]
    return first


@numba.njit(cache=True)
def pack(staging, bucket, width, tables, seq_lens, tail_slots, seal_slots, seal_blocks, fork_src, fork_dst,
         verify_blocks, verify_capacity, block_size):
    """Write a checked step into ``staging`` in the index buffer's layout, padded (the
    ``verify_capacity`` verify rows only when it is not 0); returns the number of int32
    entries the device needs (table rows past the batch are not read, so not copied)."""
    batch = seq_lens.shape[0]
    for b in range(bucket):
        real = b < batch
        staging[SEQ_LENS * bucket + b] = seq_lens[b] if real else 0
        staging[TAIL_SLOTS * bucket + b] = tail_slots[b] if real else -1
        staging[POSITIONS * bucket + b] = (seq_lens[b] - 1) % block_size if real else -1
    _pack_ids(staging, SEAL_SLOTS * bucket, bucket, seal_slots)
    _pack_ids(staging, SEAL_BLOCKS * bucket, bucket, seal_blocks)
    _pack_ids(staging, FORK_SRC * bucket, bucket, fork_src)
    _pack_ids(staging, FORK_DST * bucket, bucket, fork_dst)
    _pack_ids(staging, TABLES_ROW * bucket, verify_capacity, verify_blocks)
    base = TABLES_ROW * bucket + verify_capacity
    for b in range(batch):
        for j in range(seq_lens[b] // block_size):
            staging[base + b * width + j] = tables[b, j]
    return base + batch * width


@numba.njit(cache=True)
def _pack_ids(staging, start, bucket, ids):
    for i in range(bucket):
        staging[start + i] = ids[i] if i < ids.shape[0] else -1
