"""SpeculativeAllocator: one-block-ahead prefetch for PagedKVCache, fed through a ring.

Who does what, and why:

- **Producer** (any one thread, a nogil njit loop, or another process attached to a
  shared ring): *predicts* which sequences seal next -- typically the scheduler,
  which knows how many tokens each sequence gets next step (decode, speculative
  decoding, chunked prefill) -- and pushes ``[seq_id, generation]`` records
  (:meth:`SpeculativeAllocator.predict`, :func:`push_predictions`, :func:`next_sealers`).
- **Owner** (the one thread that drives the cache): before each ``step`` /
  ``grow_sequence`` / ``free_sequence`` it drains the ring in one njit call and
  parks a free block in each predicted sequence's prefetched slot. The seal then
  takes that block (a *hit*) or pops the free stack (a *miss*); a reserved block
  whose sequence is freed or released before sealing is *mispredicted* and goes
  back to the free stack, so ``check_invariants()`` holds throughout.

The free stack is not thread-safe, so only the owner ever touches cache state; the
ring carries only predictions. The alternative -- a producer owning a pool of
pre-reserved block ids -- moves the same O(1) pop to another thread but leaves
blocks outside both the free stack and the tables, where ``check_invariants`` and
OOM handling cannot see them.

What the concurrency buys, honestly: not a faster seal. A hit and a miss are
both O(1) and cost about the same on a CPU (see benchmarks/RESULTS.md); the owner
still pays ~6 ns per applied prediction. It buys (1) decoupling: the predictor
can run in another thread or process without a lock, and (2) the block a
sequence will seal into is fixed one step early (``cache.prefetched_block``), so
the device side can stage the next step (block tables, a captured graph) before
the seal happens. Reservations take blocks from the pool early; on an OOM the
allocator releases them all (counted as mispredicted) so the retry can succeed.
"""

from __future__ import annotations

from time import perf_counter_ns

import numba
import numpy as np

from ..errors import HexcoreInvalidArgumentError, HexcoreOOMError, Status
from . import _blocks as core
from ._ring_ops import CAPACITY, RING_CLOSED, ring_try_pop_batch, ring_try_push_batch
from ._validation import as_index
from .allocator import PagedKVCache
from .ring import LockFreeRingBuffer

__all__ = ["SpeculativeAllocator", "PREDICTION_WIDTH", "next_sealers", "push_predictions"]

PREDICTION_WIDTH = 2  # a prediction record: [seq_id, generation] (-1: any generation)
# stats: [field] -> count (int64)
RESERVED, STALE, DUPLICATE, UNFILLED = 0, 1, 2, 3
_STAT_NAMES = ("reserved", "stale", "duplicate", "unfilled")
_OOM = int(Status.OUT_OF_MEMORY)


@numba.njit(cache=True, nogil=True)
def push_predictions(buf, seq_ids, generations):
    """Producer side: push ``[seq_ids[i], generations[i]]`` records; how many fit, or RING_CLOSED.

    Parameters
    ----------
    buf : int64 [ring_words(capacity, 2)] -- the prediction ring's ``buffer``.
    seq_ids, generations : int [n] -- sequences predicted to seal next; generation -1
        matches any (see :meth:`SpeculativeAllocator.generation`).
    """
    records = np.empty((seq_ids.shape[0], PREDICTION_WIDTH), np.int64)
    for i in range(seq_ids.shape[0]):
        records[i, 0], records[i, 1] = seq_ids[i], generations[i]
    return ring_try_push_batch(buf, records)


@numba.njit(cache=True, nogil=True)
def next_sealers(seq_ids, seq_lens, new_tokens, block_size, out):
    """The sequences among ``seq_ids`` whose next ``new_tokens`` tokens seal a block.

    Parameters
    ----------
    seq_ids, seq_lens : int [n] -- sequences and their current lengths.
    new_tokens : int -- tokens each gets next step (1 for plain decode).
    out : int [>= n] -- receives the predicted seq_ids; returns how many.
    """
    count = 0
    for i in range(seq_ids.shape[0]):
        if (seq_lens[i] + new_tokens) // block_size > seq_lens[i] // block_size:
            out[count] = seq_ids[i]
            count += 1
    return count


@numba.njit(cache=True)
def _apply(buf, scratch, blocks, seqs, counters, floor, max_reserved, stats):
    # Owner side: pop up to one ring's worth of predictions; reserve a block for each
    # live sequence of the predicted generation that holds none. Returns the number reserved.
    reserved = 0
    budget = buf[CAPACITY]  # bounded, so a busy producer cannot keep the owner here
    while budget > 0:
        count = ring_try_pop_batch(buf, scratch[:min(budget, scratch.shape[0])])
        if count <= 0:
            break
        budget -= count
        for i in range(count):
            seq_id, gen = scratch[i, 0], scratch[i, 1]
            if not core._is_live(seqs, seq_id) or (gen >= 0 and gen != seqs[core.GEN, seq_id]):
                stats[STALE] += 1
            elif seqs[core.PREFETCHED, seq_id] >= 0:
                stats[DUPLICATE] += 1
            elif counters[core.NUM_FREE] <= floor or counters[core.NUM_RESERVED] >= max_reserved:
                stats[UNFILLED] += 1
            else:
                top = counters[core.NUM_FREE] - 1
                counters[core.NUM_FREE] = top
                block_id = blocks[core.FREE_STACK, top]
                blocks[core.STATE, block_id] = core.RESERVED
                seqs[core.PREFETCHED, seq_id] = block_id
                counters[core.NUM_RESERVED] += 1
                reserved += 1
    stats[RESERVED] += reserved
    return reserved


def _int_vector(name: str, values) -> np.ndarray:
    array = np.asarray(values)
    if array.ndim > 1 or (array.size and array.dtype.kind not in "iu"):
        raise HexcoreInvalidArgumentError(
            f"{name}: expected a 1-D array of ints, got {array.dtype} shape {array.shape}")
    return array.astype(np.int64).reshape(-1)


class SpeculativeAllocator:
    """One-block-ahead prefetch for a :class:`PagedKVCache`; predictions arrive through a ring.

    ``ring``: a :class:`LockFreeRingBuffer` of record_width 2 (default: a new in-process
    one of ``capacity`` records; use ``LockFreeRingBuffer.create_shared`` for a
    producer process). ``reserve_floor``: free blocks a reservation never takes;
    ``max_reserved``: cap on parked blocks (default ``max_seqs``). Producer side:
    :meth:`predict`. Owner side: every other method, from the cache's one thread.
    Drive the cache through this object, so that hits and mispredictions are counted.
    """

    def __init__(self, cache: PagedKVCache, ring: LockFreeRingBuffer | None = None, *,
                 capacity: int = 4096, reserve_floor: int = 0, max_reserved: int | None = None):
        if not isinstance(cache, PagedKVCache):
            raise HexcoreInvalidArgumentError(f"cache: expected PagedKVCache, got {type(cache).__name__}")
        if ring is None:
            ring = LockFreeRingBuffer(capacity, PREDICTION_WIDTH)
        elif not isinstance(ring, LockFreeRingBuffer) or ring.record_width != PREDICTION_WIDTH:
            raise HexcoreInvalidArgumentError(
                f"ring: expected a LockFreeRingBuffer of record_width {PREDICTION_WIDTH}, got {ring!r}")
        self.cache, self.ring, self._buf = cache, ring, ring.buffer
        self.reserve_floor = as_index("reserve_floor", reserve_floor, low=0, high=cache.num_blocks)
        max_reserved = cache.max_seqs if max_reserved is None else max_reserved
        self.max_reserved = as_index("max_reserved", max_reserved, low=0, high=cache.max_seqs)
        self._scratch = np.empty((min(ring.capacity, 1024), PREDICTION_WIDTH), np.int64)
        self._stats = np.zeros(len(_STAT_NAMES), np.int64)  # [RESERVED ... UNFILLED] -> count
        self._hits = self._misses = self._mispredicted = 0
        self._counters = cache._counters  # NUM_RESERVED moves only by reserve, hit, release

    # -- producer side -------------------------------------------------------------------
    def predict(self, seq_ids, generations=None) -> int:
        """Push predictions that ``seq_ids`` seal next; how many fit in the ring.

        Parameters
        ----------
        seq_ids : [n] int -- predicted sequences (stale or dead ids are dropped when applied).
        generations : [n] int or None -- their generations; None (or -1) matches any.
        """
        seq_ids = _int_vector("seq_ids", seq_ids)
        gens = np.full(len(seq_ids), -1, np.int64) if generations is None else _int_vector(
            "generations", generations)
        if gens.shape != seq_ids.shape:
            raise HexcoreInvalidArgumentError(
                f"generations: expected shape {seq_ids.shape} like seq_ids, got {gens.shape}")
        pushed = push_predictions(self._buf, seq_ids, gens)
        if pushed == RING_CLOSED:
            raise HexcoreInvalidArgumentError("predict: the prediction ring is closed")
        return int(pushed)

    # -- owner side -------------------------------------------------------------------------
    def apply(self) -> int:
        """Reserve blocks for the predictions in the ring now; the number reserved."""
        c = self.cache
        t0 = 0 if c._metrics is None else perf_counter_ns()
        reserved = _apply(self._buf, self._scratch, c._blocks, c._seqs, self._counters,
                          self.reserve_floor, self.max_reserved, self._stats)
        if t0:
            c._record("speculative_apply", t0, allocated=reserved)
        return reserved

    def step(self, seq_ids: np.ndarray, new_lens: np.ndarray | None = None):
        """:meth:`PagedKVCache.step` after :meth:`apply`; counts hits and misses.

        If an entry failed with OUT_OF_MEMORY while blocks were reserved, every
        reservation is released (mispredicted), so retrying the failed entries can succeed.
        """
        self.apply()
        before = self._counters[core.NUM_RESERVED]
        result = self.cache.step(seq_ids, new_lens)
        hits = int(before - self._counters[core.NUM_RESERVED])
        self._hits += hits
        self._misses += len(result.sealed) - hits
        if result.num_failed and self._counters[core.NUM_RESERVED] and (result.statuses == _OOM).any():
            self.release_all()
        return result

    def grow_sequence(self, seq_id: int, new_len: int) -> np.ndarray:
        """:meth:`PagedKVCache.grow_sequence` after :meth:`apply`; releases reservations on OOM."""
        self.apply()
        before = self._counters[core.NUM_RESERVED]
        try:
            sealed = self.cache.grow_sequence(seq_id, new_len)
        except HexcoreOOMError:
            if not self.release_all():
                raise
            before = self._counters[core.NUM_RESERVED]
            sealed = self.cache.grow_sequence(seq_id, new_len)
        hits = int(before - self._counters[core.NUM_RESERVED])
        self._hits += hits
        self._misses += len(sealed) - hits
        return sealed

    def free_sequence(self, seq_id: int) -> None:
        """:meth:`PagedKVCache.free_sequence`; its reserved block, if any, was mispredicted."""
        self.apply()
        before = self._counters[core.NUM_RESERVED]
        self.cache.free_sequence(seq_id)
        self._mispredicted += int(before - self._counters[core.NUM_RESERVED])

    def release(self, seq_ids: np.ndarray) -> int:
        """Return the sequences' reserved blocks to the pool (mispredicted); how many.

        Parameters
        ----------
        seq_ids : [B] int32, C-contiguous -- live sequences.
        """
        released = self.cache.release_reserved(seq_ids)
        self._mispredicted += released
        return released

    def release_all(self) -> int:
        """Return every reserved block to the pool (mispredicted); how many."""
        live = np.flatnonzero(self.cache._seqs[core.PREFETCHED] >= 0).astype(np.int32)
        return self.release(live) if len(live) else 0

    def add_sequence(self, seq_id: int | None = None) -> int:
        """:meth:`PagedKVCache.add_sequence`."""
        return self.cache.add_sequence(seq_id)

    def fork_sequence(self, parent: int, child: int | None = None) -> int:
        """:meth:`PagedKVCache.fork_sequence` (the child starts with no reservation)."""
        return self.cache.fork_sequence(parent, child)

    def generation(self, seq_id: int) -> int:
        """``seq_id``'s generation (bumped at each free): pass it with a prediction."""
        return int(self.cache._seqs[core.GEN, self.cache._live(seq_id)])

    # -- counts -------------------------------------------------------------------------------
    def confirmed_hits(self) -> int:
        """Seals served by a reserved block."""
        return self._hits

    def misses(self) -> int:
        """Seals served by the free stack."""
        return self._misses

    def mispredicted(self) -> int:
        """Reserved blocks returned to the pool because their sequence was freed or released."""
        return self._mispredicted

    def hit_rate(self) -> float:
        """confirmed_hits / (hits + misses), 0.0 before the first seal."""
        seals = self._hits + self._misses
        return self._hits / seals if seals else 0.0

    def stats(self) -> dict:
        """All counts: hits, misses, mispredicted, hit_rate, pending (reserved now), and the
        predictions reserved / stale (dead or reused slot) / duplicate / unfilled (pool at floor)."""
        return {"hits": self._hits, "misses": self._misses, "mispredicted": self._mispredicted,
                "hit_rate": self.hit_rate(), "pending": self.cache.num_reserved_blocks,
                **dict(zip(_STAT_NAMES, self._stats.tolist()))}

    def check_invariants(self) -> None:
        """The cache's invariants, and every reservation accounted for (hit, mispredicted or pending)."""
        self.cache.check_invariants()
        pending = self.cache.num_reserved_blocks
        made = int(self._stats[RESERVED])
        assert made == self._hits + self._mispredicted + pending, (
            f"reservations {made} != hits {self._hits} + mispredicted {self._mispredicted} "
            f"+ pending {pending}")
