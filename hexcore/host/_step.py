"""The batch step: a whole decode (or prefill) step in one njit call, and its result.

Output buffers, owned by :class:`PagedKVCache` and reused by every call:

- ``out_rows [6, max_seqs]`` int32, rows ``OUT_STATUS`` ... ``ROW_NB``
- ``out_tables [max_seqs, max_blocks_per_seq]`` int32, the kernel's block tables
- ``seals [3, num_blocks]`` int32, rows ``SEAL_SLOT``, ``SEAL_LOGICAL``, ``SEAL_BLOCK``:
  a step seals at most every block once
"""

from __future__ import annotations

import numba
import numpy as np

from ..errors import Status, raise_for_status
from ._blocks import (GEN, INVALID_ARGUMENT, INVALID_SEQUENCE, LEN, LIVE, MARK, NUM_FREE, NUM_LIVE,
                      NUM_RESERVED, OK, OUT_OF_MEMORY, PREFETCHED, REFS, STATE, pop_free_block)

# out_rows[OUT_STATUS]: [row] -> Status of that batch entry
# out_rows[OUT_LEN]:    [row] -> its sequence length after the call
# out_rows[OUT_TAIL]:   [row] -> its tail slot (= seq_id), -1 for an invalid id
# out_rows[ROW_SEQ]:    [row] -> seq_id whose blocks out_tables[row] holds, -1 none
# out_rows[ROW_GEN]:    [row] -> that seq's generation when the row was written
# out_rows[ROW_NB]:     [row] -> entries of out_tables[row] that may be != -1
OUT_STATUS, OUT_LEN, OUT_TAIL, ROW_SEQ, ROW_GEN, ROW_NB = 0, 1, 2, 3, 4, 5

# seals[SEAL_SLOT]:    [i] -> seq_id (= tail slot) of the i-th block sealed by a step
# seals[SEAL_LOGICAL]: [i] -> its logical block index in that sequence
# seals[SEAL_BLOCK]:   [i] -> its block id
SEAL_SLOT, SEAL_LOGICAL, SEAL_BLOCK = 0, 1, 2


def new_outputs(num_blocks: int, max_seqs: int, max_blocks_per_seq: int):
    """Fresh (out_rows, out_tables, seals) for :func:`step`."""
    out_rows = np.zeros((6, max_seqs), np.int32)
    out_rows[[OUT_TAIL, ROW_SEQ]] = -1
    # out_tables: [row, logical_block] -> block_id (-1 past the row's sealed blocks)
    out_tables = np.full((max_seqs, max_blocks_per_seq), -1, np.int32)
    seals = np.zeros((3, num_blocks), np.int32)
    return out_rows, out_tables, seals


@numba.njit(cache=True)
def _clear_row(out_rows, out_tables, row):
    for j in range(out_rows[ROW_NB, row]):
        out_tables[row, j] = -1
    out_rows[ROW_NB, row] = 0
    out_rows[ROW_SEQ, row] = -1
    out_rows[OUT_LEN, row] = 0
    out_rows[OUT_TAIL, row] = -1


# The helpers of step are inlined into it at numba IR level (inline="always"): as plain
# njit calls taking arrays they double the step's cost per entry (measured).
@numba.njit(cache=True, inline="always")
def _seal(blocks, seqs, counters, tables, seq_id, first, end, seals, num_sealed):
    # Seal logical blocks [first, end) of seq_id (room checked): its reserved block
    # first, then the free stack. Returns num_sealed after.
    prefetched = seqs[PREFETCHED, seq_id]
    for j in range(first, end):
        if prefetched >= 0:
            block_id = prefetched
            prefetched = -1
            seqs[PREFETCHED, seq_id] = -1
            counters[NUM_RESERVED] -= 1
            blocks[STATE, block_id] = LIVE
        else:
            block_id = pop_free_block(blocks, counters, LIVE)
        blocks[REFS, block_id] = 1
        tables[seq_id, j] = block_id
        seals[SEAL_SLOT, num_sealed] = seq_id
        seals[SEAL_LOGICAL, num_sealed] = j
        seals[SEAL_BLOCK, num_sealed] = block_id
        num_sealed += 1
    counters[NUM_LIVE] += end - first
    return num_sealed


@numba.njit(cache=True, inline="always")
def _write_row(seqs, tables, out_rows, out_tables, row, seq_id, block_size):
    # out_tables[row] is kept across calls: if it already holds this sequence (same
    # generation), only the blocks sealed since are copied.
    length = seqs[LEN, seq_id]
    num_blocks = length // block_size
    start = 0
    if out_rows[ROW_SEQ, row] == seq_id and out_rows[ROW_GEN, row] == seqs[GEN, seq_id]:
        start = out_rows[ROW_NB, row]
    else:
        for j in range(num_blocks, out_rows[ROW_NB, row]):
            out_tables[row, j] = -1
        out_rows[ROW_SEQ, row] = seq_id
        out_rows[ROW_GEN, row] = seqs[GEN, seq_id]
    for j in range(start, num_blocks):
        out_tables[row, j] = tables[seq_id, j]
    out_rows[ROW_NB, row] = num_blocks
    out_rows[OUT_LEN, row] = length
    out_rows[OUT_TAIL, row] = seq_id


@numba.njit(cache=True)
def step(blocks, seqs, counters, tables, seq_ids, new_lens, increment, block_size,
         out_rows, out_tables, seals):
    """Grow every ``seq_ids[i]`` to ``new_lens[i]`` (or by one token when ``increment``).

    Each entry succeeds or fails alone (a failed one is unchanged). Writes statuses,
    lengths, tail slots and block tables of every row, and the sealed blocks as
    columns (seq_id, logical block, block_id) of ``seals``. Returns
    (num_sealed, num_failed, hits, misses, oom_events).
    """
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
        if seqs[MARK, seq_id] != 0:
            status = INVALID_ARGUMENT  # the same sequence twice in one batch
        elif new_len < old_len or new_len > max_len:
            status = INVALID_SEQUENCE
        elif end > first:
            hit = seqs[PREFETCHED, seq_id] >= 0  # a reserved block serves the first seal
            if end - first > counters[NUM_FREE] + hit:
                status = OUT_OF_MEMORY
                ooms += 1
            else:
                num_sealed = _seal(blocks, seqs, counters, tables, seq_id, first, end, seals, num_sealed)
                hits += hit
                misses += end - first - hit
        seqs[MARK, seq_id] = 1
        if status == OK:
            seqs[LEN, seq_id] = new_len
        else:
            num_failed += 1
        out_rows[OUT_STATUS, i] = status
        _write_row(seqs, tables, out_rows, out_tables, i, seq_id, block_size)
    for i in range(seq_ids.shape[0]):
        seq_id = seq_ids[i]
        if seq_id >= 0 and seq_id < max_seqs:
            seqs[MARK, seq_id] = 0
    return num_sealed, num_failed, hits, misses, ooms


class StepResult:
    """What :meth:`PagedKVCache.step` did, and the int32 arrays a decode kernel needs.

    Every array is a view of a buffer the next ``step`` call overwrites: copy what
    you keep, and do not write to them (``block_tables`` is read-only).

    Attributes
    ----------
    statuses : [B] int32 -- a :class:`Status` per entry; a failed entry is unchanged.
    block_tables : [B, max_blocks_per_seq] int32 -- sealed block ids, -1 past the end.
    seq_lens : [B] int32 -- lengths after the step (0 for an invalid id).
    tail_slots : [B] int32 -- tail slot of each entry (= seq_id; -1 for an invalid id).
    seq_ids : [B] int32 -- the ids the step was asked for (the caller's array, not a copy).
    num_failed : int -- entries whose status is not OK.
    num_sealed : int -- blocks sealed by the step.
    num_hits : int -- sealed blocks that were their sequence's reserved (prefetched)
        block; the other ``num_sealed - num_hits`` came from the free stack.
    seal_slots : [num_sealed] int32, contiguous -- the tail slot (= seq_id) each sealed
        block was filled from: the device seals tail ``seal_slots[i]``...
    seal_blocks : [num_sealed] int32, contiguous -- ...into block ``seal_blocks[i]``
        (pass both to the seal kernel, or to ``DecodeGraph.step``).
    seal_logical : [num_sealed] int32, contiguous -- that block's logical index in its
        sequence (``block_tables`` row entry); a prefill seals several per sequence.
    sealed : [num_sealed, 3] int32 -- the same as rows (seq_id, logical block, block_id),
        a strided view (``sealed[:, 0]`` is ``seal_slots``), kept for compatibility.
    """

    __slots__ = ("statuses", "block_tables", "seq_lens", "tail_slots", "seq_ids", "num_failed",
                 "num_sealed", "num_hits", "_seals")

    def __init__(self, statuses, seals, block_tables, seq_lens, tail_slots, seq_ids, num_failed, num_sealed,
                 num_hits):
        # seals: [3, num_sealed] int32 view of the step's seals buffer (rows SEAL_SLOT ...)
        self.statuses, self._seals, self.block_tables = statuses, seals, block_tables
        self.seq_lens, self.tail_slots, self.seq_ids = seq_lens, tail_slots, seq_ids
        self.num_failed, self.num_sealed, self.num_hits = num_failed, num_sealed, num_hits

    @property
    def seal_slots(self) -> np.ndarray:
        """[num_sealed] int32: tail slot (= seq_id) of each sealed block (a contiguous view)."""
        return self._seals[SEAL_SLOT]

    @property
    def seal_logical(self) -> np.ndarray:
        """[num_sealed] int32: logical index of each sealed block in its sequence (a contiguous view)."""
        return self._seals[SEAL_LOGICAL]

    @property
    def seal_blocks(self) -> np.ndarray:
        """[num_sealed] int32: block id of each sealed block (a contiguous view)."""
        return self._seals[SEAL_BLOCK]

    @property
    def sealed(self) -> np.ndarray:
        """[num_sealed, 3] int32 rows (seq_id, logical block, block_id): a strided view."""
        return self._seals.T

    @property
    def ok(self) -> bool:
        """True when every entry succeeded."""
        return self.num_failed == 0

    def raise_for_status(self) -> None:
        """Raise the typed error of the first failed entry, if any, naming its index and seq_id."""
        if self.num_failed:
            i = int(np.flatnonzero(self.statuses)[0])
            raise_for_status(self.statuses[i], f"batch entry {i} (seq_id {int(self.seq_ids[i])}) "
                             f"failed: {Status(int(self.statuses[i])).name}")


@numba.njit(cache=True)
def check_step(seqs, counters, max_len, seq_ids, block_size, evictable):
    """Whether ``step(seq_ids)`` (one token each) would succeed for every entry, without
    changing anything: (status, first failing index, -1 for a shortage of blocks).
    ``evictable``: blocks a seal may evict besides the free stack (the prefix cache's)."""
    max_seqs = seqs.shape[1]
    need = 0
    bad = -1
    status = OK
    for i in range(seq_ids.shape[0]):
        seq_id = seq_ids[i]
        if seq_id < 0 or seq_id >= max_seqs or seqs[LEN, seq_id] < 0:
            status, bad = INVALID_SEQUENCE, i
            break
        if seqs[MARK, seq_id] != 0:
            status, bad = INVALID_ARGUMENT, i
            break
        seqs[MARK, seq_id] = 1
        length = seqs[LEN, seq_id]
        if length + 1 > max_len:
            status, bad = INVALID_SEQUENCE, i
            break
        if (length + 1) // block_size > length // block_size and seqs[PREFETCHED, seq_id] < 0:
            need += 1
    for i in range(seq_ids.shape[0]):
        seq_id = seq_ids[i]
        if seq_id >= 0 and seq_id < max_seqs:
            seqs[MARK, seq_id] = 0
    if status == OK and need > counters[NUM_FREE] + evictable:
        return OUT_OF_MEMORY, -1
    return status, bad
