"""The batch step: a whole decode (or prefill) step in one njit call, and its result.

Output buffers, owned by :class:`PagedKVCache` and reused by every call:

- ``out_rows [6, max_seqs]`` int32, rows ``OUT_STATUS`` ... ``ROW_NB``
- ``out_tables [max_seqs, max_blocks_per_seq]`` int32, the kernel's block tables
- ``sealed [num_blocks, 3]`` int32: a step seals at most every block once
"""

from __future__ import annotations

import numba
import numpy as np

from ..errors import Status, raise_for_status
from ._blocks import (FREE_STACK, GEN, INVALID_ARGUMENT, INVALID_SEQUENCE, LEN, LIVE, MARK,
                      NUM_FREE, NUM_LIVE, NUM_RESERVED, OK, OUT_OF_MEMORY, PREFETCHED, REFS,
                      STATE)

# out_rows[OUT_STATUS]: [row] -> Status of that batch entry
# out_rows[OUT_LEN]:    [row] -> its sequence length after the call
# out_rows[OUT_TAIL]:   [row] -> its tail slot (= seq_id), -1 for an invalid id
# out_rows[ROW_SEQ]:    [row] -> seq_id whose blocks out_tables[row] holds, -1 none
# out_rows[ROW_GEN]:    [row] -> that seq's generation when the row was written
# out_rows[ROW_NB]:     [row] -> entries of out_tables[row] that may be != -1
OUT_STATUS, OUT_LEN, OUT_TAIL, ROW_SEQ, ROW_GEN, ROW_NB = 0, 1, 2, 3, 4, 5


def new_outputs(num_blocks: int, max_seqs: int, max_blocks_per_seq: int):
    """Fresh (out_rows, out_tables, sealed) for :func:`step`."""
    out_rows = np.zeros((6, max_seqs), np.int32)
    out_rows[[OUT_TAIL, ROW_SEQ]] = -1
    # out_tables: [row, logical_block] -> block_id (-1 past the row's sealed blocks)
    out_tables = np.full((max_seqs, max_blocks_per_seq), -1, np.int32)
    # sealed: [i] -> (seq_id, logical_block, block_id) of the i-th block sealed by a step
    sealed = np.zeros((num_blocks, 3), np.int32)
    return out_rows, out_tables, sealed


@numba.njit(cache=True)
def _clear_row(out_rows, out_tables, row):
    for j in range(out_rows[ROW_NB, row]):
        out_tables[row, j] = -1
    out_rows[ROW_NB, row] = 0
    out_rows[ROW_SEQ, row] = -1
    out_rows[OUT_LEN, row] = 0
    out_rows[OUT_TAIL, row] = -1


@numba.njit(cache=True)
def step(blocks, seqs, counters, tables, seq_ids, new_lens, increment, block_size,
         out_rows, out_tables, sealed):
    """Grow every ``seq_ids[i]`` to ``new_lens[i]`` (or by one token when ``increment``).

    Each entry succeeds or fails alone (a failed one is unchanged). Writes statuses,
    lengths, tail slots and block tables of every row, and the sealed blocks as
    rows (seq_id, logical block, block_id) of ``sealed``. Returns
    (num_sealed, num_failed, hits, misses, oom_events).
    """
    # grow_sequence and the row update are inlined by hand: an njit call that takes
    # arrays costs ~40 ns here, 10x the work it does.
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
            prefetched = seqs[PREFETCHED, seq_id]
            available = counters[NUM_FREE]
            if prefetched >= 0:
                available += 1
            if end - first > available:
                status = OUT_OF_MEMORY
                ooms += 1
            else:
                for j in range(first, end):
                    if prefetched >= 0:
                        block_id = prefetched
                        prefetched = -1
                        seqs[PREFETCHED, seq_id] = -1
                        counters[NUM_RESERVED] -= 1
                        hits += 1
                    else:
                        top = counters[NUM_FREE] - 1
                        counters[NUM_FREE] = top
                        block_id = blocks[FREE_STACK, top]
                        misses += 1
                    blocks[STATE, block_id] = LIVE
                    blocks[REFS, block_id] = 1
                    tables[seq_id, j] = block_id
                    sealed[num_sealed, 0] = seq_id
                    sealed[num_sealed, 1] = j
                    sealed[num_sealed, 2] = block_id
                    num_sealed += 1
                counters[NUM_LIVE] += end - first
        seqs[MARK, seq_id] = 1
        if status == OK:
            seqs[LEN, seq_id] = new_len
        else:
            num_failed += 1
        out_rows[OUT_STATUS, i] = status
        # out_tables[i] is kept across calls: if it already holds this sequence (same
        # generation), only the blocks sealed since are copied.
        length = seqs[LEN, seq_id]
        num_blocks = length // block_size
        start = 0
        if out_rows[ROW_SEQ, i] == seq_id and out_rows[ROW_GEN, i] == seqs[GEN, seq_id]:
            start = out_rows[ROW_NB, i]
        else:
            for j in range(num_blocks, out_rows[ROW_NB, i]):
                out_tables[i, j] = -1
            out_rows[ROW_SEQ, i] = seq_id
            out_rows[ROW_GEN, i] = seqs[GEN, seq_id]
        for j in range(start, num_blocks):
            out_tables[i, j] = tables[seq_id, j]
        out_rows[ROW_NB, i] = num_blocks
        out_rows[OUT_LEN, i] = length
        out_rows[OUT_TAIL, i] = seq_id
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
    sealed : [num_sealed, 3] int32 -- rows (seq_id, logical block, block_id): the
        device seals that sequence's tail into that block (a prefill writes them).
    block_tables : [B, max_blocks_per_seq] int32 -- sealed block ids, -1 past the end.
    seq_lens : [B] int32 -- lengths after the step (0 for an invalid id).
    tail_slots : [B] int32 -- tail slot of each entry (= seq_id; -1 for an invalid id).
    num_failed : int -- entries whose status is not OK.
    """

    __slots__ = ("statuses", "sealed", "block_tables", "seq_lens", "tail_slots", "num_failed")

    def __init__(self, statuses, sealed, block_tables, seq_lens, tail_slots, num_failed):
        self.statuses, self.sealed, self.block_tables = statuses, sealed, block_tables
        self.seq_lens, self.tail_slots, self.num_failed = seq_lens, tail_slots, num_failed

    @property
    def ok(self) -> bool:
        """True when every entry succeeded."""
        return self.num_failed == 0

    def raise_for_status(self) -> None:
        """Raise the typed error of the first failed entry, if any."""
        if self.num_failed:
            i = int(np.flatnonzero(self.statuses)[0])
            raise_for_status(self.statuses[i], f"batch entry {i} (seq_id {self.tail_slots[i]}) "
                             f"failed: {Status(int(self.statuses[i])).name}")
