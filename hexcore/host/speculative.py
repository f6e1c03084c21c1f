"""SpeculativeAllocator: one-block-ahead prefetch for PagedKVCache, fed through a ring.

Who does what, and why:

- **Producer** (any one thread, a nogil njit loop, or another process attached to a
  shared ring): *predicts* which sequences seal next -- typically the scheduler,
  which knows how many tokens each sequence gets next step (decode, speculative
  decoding, chunked prefill) -- and pushes ``[seq_id, generation]`` records
  (:meth:`SpeculativeAllocator.predict`, :func:`push_predictions`, :func:`next_sealers`).
- **Owner** (the one thread that drives the cache): before each ``step`` /
  ``grow_sequence`` / ``free_sequence`` it hands the ring to
  :meth:`PagedKVCache.reserve_predictions`, which drains it and parks a free block in
  each predicted sequence's prefetched slot, in one njit call. The seal then
  takes that block (a *hit*) or pops the free stack (a *miss*); a reserved block
  whose sequence is freed or released before sealing is *mispredicted* and goes
  back to the free stack, so ``check_invariants()`` holds throughout.

The free stack is not thread-safe, so only the owner ever touches cache state (and
only through PagedKVCache's public methods); the ring carries only predictions. The
alternative -- a producer owning a pool of pre-reserved block ids -- moves the same
O(1) pop to another thread but leaves blocks outside both the free stack and the
tables, where ``check_invariants`` and OOM handling cannot see them.

What the concurrency buys, honestly: not a faster seal. A hit and a miss are
both O(1) and cost about the same on a CPU (see benchmarks/RESULTS.md); the owner
still pays ~1.3 us per apply that finds predictions (~0.2 us when the ring is
empty), plus ~5 ns per prediction. It buys (1) decoupling: the predictor can run
in another thread or process without a lock, and (2) the block a
sequence will seal into is fixed one step early (``cache.prefetched_block``), so
the device side can stage the next step (block tables, a captured graph) before
the seal happens. Reservations take blocks from the pool early; on an OOM the
allocator releases them all (counted as mispredicted) so the retry can succeed.
"""

from __future__ import annotations

import numba
import numpy as np

from .._checks import as_int
from ..errors import HexcoreInvalidArgumentError, HexcoreOOMError, Status
from ._ring_ops import HEAD, RING_CLOSED, TAIL, ring_try_push_batch
from .allocator import PREDICTION_OUTCOMES, PagedKVCache
from .ring import LockFreeRingBuffer

__all__ = ["SpeculativeAllocator", "PREDICTION_WIDTH", "next_sealers", "push_predictions"]

PREDICTION_WIDTH = 2  # a prediction record: [seq_id, generation] (-1: any generation)
_RESERVED = PREDICTION_OUTCOMES.index("reserved")
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
    producer process). ``reserve_floor`` (in [0, num_blocks]): free blocks a
    reservation never takes; ``max_reserved`` (in [0, max_seqs]): cap on parked blocks
    (default ``max_seqs``). Producer side: :meth:`predict`. Owner side: every other
    method, from the cache's one thread. Drive the cache through this object, so that
    hits and mispredictions are counted.
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
        self.reserve_floor = as_int("reserve_floor", reserve_floor, low=0, high=cache.num_blocks)
        max_reserved = cache.max_seqs if max_reserved is None else max_reserved
        self.max_reserved = as_int("max_reserved", max_reserved, low=0, high=cache.max_seqs)
        self.cache, self.ring, self._buf = cache, ring, ring.buffer
        # counts: [outcome] -> predictions, in PREDICTION_OUTCOMES order
        self._counts = np.zeros(len(PREDICTION_OUTCOMES), np.int64)
        self._hits = self._misses = self._mispredicted = 0

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
        """Reserve blocks for the predictions in the ring now; the number reserved.

        Drains at most one ring's worth, so a busy producer cannot keep the owner here.
        """
        buf = self._buf
        if buf[TAIL] == buf[HEAD]:  # empty (a plain read: a record it misses waits one call)
            return 0
        return self.cache.reserve_predictions(self.ring, self.reserve_floor, self.max_reserved, self._counts)

    def step(self, seq_ids: np.ndarray, new_lens: np.ndarray | None = None, tokens: np.ndarray | None = None,
             token_starts: np.ndarray | None = None):
        """:meth:`PagedKVCache.step` (token ids included) after :meth:`apply`; counts hits and misses.

        If an entry failed with OUT_OF_MEMORY while blocks were reserved, every
        reservation is released (mispredicted), so retrying the failed entries can succeed.
        """
        self.apply()
        result = self.cache.step(seq_ids, new_lens, tokens, token_starts)
        self._hits += result.num_hits
        self._misses += result.num_sealed - result.num_hits
        if result.num_failed and self.cache.num_reserved_blocks and (result.statuses == _OOM).any():
            self.release_all()
        return result

    def grow_sequence(self, seq_id: int, new_len: int, tokens=None) -> np.ndarray:
        """:meth:`PagedKVCache.grow_sequence` (token ids included) after :meth:`apply`;
        releases reservations on OOM."""
        self.apply()
        before = self.cache.num_reserved_blocks
        try:
            sealed = self.cache.grow_sequence(seq_id, new_len, tokens)
        except HexcoreOOMError:
            if not self.release_all():
                raise
            before = 0
            sealed = self.cache.grow_sequence(seq_id, new_len, tokens)
        hits = before - self.cache.num_reserved_blocks
        self._hits += hits
        self._misses += len(sealed) - hits
        return sealed

    def free_sequence(self, seq_id: int) -> None:
        """:meth:`PagedKVCache.free_sequence`; its reserved block, if any, was mispredicted."""
        self.apply()
        before = self.cache.num_reserved_blocks
        self.cache.free_sequence(seq_id)
        self._mispredicted += before - self.cache.num_reserved_blocks

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
        released = self.cache.release_all_reserved()
        self._mispredicted += released
        return released

    def add_sequence(self, seq_id: int | None = None) -> int:
        """:meth:`PagedKVCache.add_sequence`."""
        return self.cache.add_sequence(seq_id)

    def fork_sequence(self, parent: int, child: int | None = None) -> int:
        """:meth:`PagedKVCache.fork_sequence` (the child starts with no reservation)."""
        return self.cache.fork_sequence(parent, child)

    def generation(self, seq_id: int) -> int:
        """``seq_id``'s generation (bumped at each free): pass it with a prediction."""
        return self.cache.generation(seq_id)

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
                **dict(zip(PREDICTION_OUTCOMES, self._counts.tolist()))}

    def check_invariants(self) -> None:
        """The cache's invariants, and every reservation accounted for (hit, mispredicted or pending)."""
        self.cache.check_invariants()
        pending = self.cache.num_reserved_blocks
        made = int(self._counts[_RESERVED])
        assert made == self._hits + self._mispredicted + pending, (
            f"reservations {made} != hits {self._hits} + mispredicted {self._mispredicted} "
            f"+ pending {pending}")
