"""The block manager of a cache in a format by age (``hexcore.quant.KVFormat``,
``docs/formats.md``): a pool per kind of block, and the seals and re-seals of each step.

Blocks of different kinds (FP16, INT4, INT2) have different sizes, so each kind has its
own pool: a :class:`~hexcore.host.PagedKVCache` of that kind (its free stack, reference
counts and tables), every one with the same sequence slots. A sequence's sealed block
``j`` lives in the pool of the kind its age gives it (``KVFormat.block_tiers``): sequence
``s``'s table in pool ``k`` lists its blocks of kind ``k`` in logical order (the decode
reads each pool's table and merges; attention does not depend on the order of blocks).
The tail (the open block) is the caller's, in the tail slot ``s``, as for PagedKVCache.

A step grows sequences by one token. When a sequence's tail fills, block ``j`` is sealed
into the pool of its age-0 kind; and every older block whose age reaches a tier's
``min_age`` on this step is *re-sealed*: a block of the next kind is taken from that
kind's pool, the old one leaves its table (and its pool when no other sequence holds it).
The step's operations come back in the order the device must run them, so that no block
is overwritten before a re-seal has read it: the re-seals of the oldest tier first, then
the next, then the seals. Each is ``(seq_id, logical block, source kind, source block,
kind, block)``, the source kind -1 for a seal (its rows are the tail's, or the prompt's).

Not supported (typed errors): the prefix cache, event rings, reservations and truncation
(a format by age is a function of a sequence's length; rolling back would have to
un-quantize blocks). Forked sequences share blocks as in PagedKVCache and re-seal a shared
block each on their own (two copies of the older kind; correct, not the fewest bytes).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

from .._checks import as_int
from ..config import KVCacheConfig, KVDtype
from ..errors import HexcoreConfigError, HexcoreInvalidArgumentError, HexcoreInvalidSequenceError, HexcoreOOMError
from ..quant import kv_format
from . import _blocks as core
from ._validation import check_ids
from .allocator import PagedKVCache

__all__ = ["TieredKVCache", "TieredStep", "SEAL", "block_pools", "pool_kinds"]

SEAL = -1  # the source kind of an operation that seals rows (the tail's, or a prompt's)
# columns of TieredStep.ops
OP_SEQ, OP_LOGICAL, OP_SRC_KIND, OP_SRC_BLOCK, OP_KIND, OP_BLOCK = range(6)
_BITS_DTYPE = {4: KVDtype.INT4, 2: KVDtype.INT2}


class TieredStep(NamedTuple):
    """What :meth:`TieredKVCache.step` did.

    ``ops``: int32 ``[n, 6]``, rows ``(seq_id, logical block, source kind, source block,
    kind, block)`` in the order the device runs them: a re-seal reads ``source block`` of
    pool ``source kind`` (then free unless another sequence holds it) and seals it into
    ``block`` of pool ``kind``; a seal (source kind ``SEAL``) seals the sequence's full tail
    into ``block``. ``seq_lens``: int32 ``[B]``, the lengths after the step.
    """

    ops: np.ndarray
    seq_lens: np.ndarray


class TieredKVCache:
    """Block manager of a paged KV cache whose sealed blocks change kind as they age.

    Parameters
    ----------
    config : KVCacheConfig -- the cache's shape (its ``kv_dtype`` is ignored: each pool
        has the kind of its blocks).
    format : a ``hexcore.quant.KVFormat`` or a name in ``hexcore.quant.FORMATS``; its tiers
        must hold keys and values at the same bits, each tier at other bits than the
        one before, their ages multiples of ``block_size``.
    pool_blocks : dict kind name ("fp16", "int4", "int2") -> blocks of that pool, one
        entry per kind the format uses (:attr:`kinds`).
    max_seqs : sequence slots (the same in every pool; tails are slots).
    max_seq_len : longest sequence, tokens (default: what all pools hold together, at most 131072).
    """

    def __init__(self, config: KVCacheConfig, format, pool_blocks: dict, max_seqs: int, *,
                 max_seq_len: int | None = None):
        if not isinstance(config, KVCacheConfig):
            raise HexcoreInvalidArgumentError(f"config: expected KVCacheConfig, got {type(config).__name__}")
        self.format = kv_format(format)
        self.block_size = bs = config.block_size
        self.kinds = pool_kinds(self.format, bs)
        pools = _pool_sizes(pool_blocks, self.kinds)
        max_seqs = as_int("max_seqs", max_seqs, low=1)
        if max_seq_len is None:
            max_seq_len = min(131072, sum(pools) * bs)
        max_seq_len = as_int("max_seq_len", max_seq_len, low=1, high=2**31 - bs)
        self.config, self.max_seqs = config, max_seqs
        self.pools = [PagedKVCache(dataclasses.replace(config, kv_dtype=kind), n, max_seqs, max_seq_len=max_seq_len)
                      for kind, n in zip(self.kinds, pools)]
        self.max_seq_len = self.pools[0].max_seq_len
        self._first_fp16 = int(self.kinds[0] is KVDtype.FP16)  # pool of tier t: t + this
        tiers = self.format.tiers
        # the pool a block is sealed into (age 0), past the sink: tier 0's if its age is 0, else FP16's
        self._seal_pool = self._first_fp16 if tiers and tiers[0].min_age == 0 else 0
        self._ages = np.array([t.min_age for t in self.format.tiers], np.int64)
        self._lens = np.full(max_seqs, -1, np.int64)  # [seq_id] -> length in tokens, -1 not live
        # [seq_id, logical block] -> the pool holding it, -1 not sealed
        self._kind = np.full((max_seqs, self.max_seq_len // bs), -1, np.int8)

    # -- sequences ------------------------------------------------------------------
    def add_sequence(self, seq_id: int | None = None) -> int:
        """Start an empty sequence in slot ``seq_id`` (default: the next free slot); its id."""
        sid = self.pools[0].add_sequence(seq_id)
        for pool in self.pools[1:]:
            pool.add_sequence(sid)
        self._lens[sid] = 0
        return sid

    def free_sequence(self, seq_id: int) -> None:
        """Release ``seq_id``: one reference less to each of its blocks, in every pool."""
        seq_id = self._live("seq_id", seq_id)
        for pool in self.pools:
            pool.free_sequence(seq_id)
        self._lens[seq_id] = -1
        self._kind[seq_id] = -1

    def fork_sequence(self, parent: int, child: int | None = None) -> int:
        """New sequence sharing ``parent``'s sealed blocks in every pool; the child's id
        (the device copies tail slot ``parent`` to the child's, as for PagedKVCache)."""
        parent = self._live("parent", parent)
        cid = self.pools[0].fork_sequence(parent, child)
        for pool in self.pools[1:]:
            pool.fork_sequence(parent, cid)
        self._lens[cid] = self._lens[parent]
        self._kind[cid] = self._kind[parent]
        return cid

    # -- growth ---------------------------------------------------------------------
    def step(self, seq_ids: np.ndarray) -> TieredStep:
        """Grow each of ``seq_ids`` (int32 ``[B]``, distinct live sequences) by one token;
        the seals and re-seals this takes (:class:`TieredStep`).

        All or nothing: a bad entry raises HexcoreInvalidSequenceError or
        HexcoreInvalidArgumentError naming it, a pool with fewer free blocks than the step
        takes from it HexcoreOOMError naming the pool, and nothing changes.
        """
        check_ids("seq_ids", seq_ids, self.max_seqs)
        self._check_batch(seq_ids)
        new_lens = self._lens[seq_ids] + 1
        moves = [move for phase in self._moves(seq_ids, new_lens) for move in phase]  # oldest tier first
        self._check_room(moves, "the step")
        ops = [self._apply(move) for move in moves]
        self._lens[seq_ids] = new_lens
        return TieredStep(np.array(ops, np.int32).reshape(-1, 6), new_lens.astype(np.int32))

    def grow(self, seq_id: int, new_len: int) -> TieredStep:
        """Grow ``seq_id`` to ``new_len`` tokens (a prompt): the operations of every block it
        fills, block after block, each as a step would make it (a block that ages past a
        tier within the prompt is sealed, then re-sealed: the chain of the format).

        The device runs them in order; a seal's rows are the prompt's rows of that block
        (or the tail's, for the block the tail was filling). All or nothing:
        HexcoreInvalidSequenceError, HexcoreInvalidArgumentError (``new_len`` not an int in
        ``[seq_len, max_seq_len]``) or HexcoreOOMError naming the pool; nothing changes.
        """
        seq_id = self._live("seq_id", seq_id)
        old = int(self._lens[seq_id])
        new_len = as_int("new_len", new_len, low=old, high=self.max_seq_len)
        bs, ids = self.block_size, np.array([seq_id], np.int32)
        moves = []
        for n in range((old // bs + 1) * bs, new_len + 1, bs):
            moves += [move for phase in self._moves(ids, np.array([n])) for move in phase]
        self._check_room(moves, f"growing sequence {seq_id} to {new_len} tokens")
        ops = [self._apply(move) for move in moves]
        self._lens[seq_id] = new_len
        return TieredStep(np.array(ops, np.int32).reshape(-1, 6), np.array([new_len], np.int32))

    # -- queries --------------------------------------------------------------------
    def seq_len(self, seq_id: int) -> int:
        """Length of ``seq_id`` in tokens (sealed blocks of every kind plus its tail)."""
        return int(self._lens[self._live("seq_id", seq_id)])

    def block_kinds(self, seq_id: int) -> np.ndarray:
        """The pool of each of ``seq_id``'s sealed blocks, in logical order (int8 ``[n]``)."""
        seq_id = self._live("seq_id", seq_id)
        return self._kind[seq_id, : self._lens[seq_id] // self.block_size].copy()

    def tail_pools(self, seq_ids: np.ndarray) -> np.ndarray:
        """The pool each of ``seq_ids``' open tail will be sealed into (int32 ``[B]``): the
        store whose tail slot receives its new tokens (the seal reads them there)."""
        check_ids("seq_ids", seq_ids, self.max_seqs)
        self._check_batch(seq_ids, growing=False)
        blocks = self._lens[seq_ids] // self.block_size  # the open block's logical index
        return np.where(blocks < self.format.sink_blocks, 0, self._seal_pool).astype(np.int32)

    def block_tables(self, seq_ids: np.ndarray) -> list:
        """Per pool, int32 ``[B, n_k]``: the blocks of that kind of each of ``seq_ids`` in
        logical order, -1 past a row's own; and int32 ``[B]`` counts: ``[(table, counts)]``."""
        check_ids("seq_ids", seq_ids, self.max_seqs)
        self._check_batch(seq_ids, growing=False)
        out = []
        for pool in self.pools:
            counts = (pool._seqs[core.LEN, seq_ids] // self.block_size).astype(np.int32)
            width = max(1, int(counts.max(initial=0)))
            table = pool._tables[seq_ids, :width].copy()
            out.append((table, counts))
        return out

    @property
    def num_sequences(self) -> int:
        """Live sequences."""
        return int((self._lens >= 0).sum())

    def check_invariants(self) -> None:
        """Raise AssertionError if the state is inconsistent (for tests; O(state size)):
        every pool's own invariants, and every live sequence's blocks in the pools its
        length's ages give them, in logical order."""
        for pool in self.pools:
            pool.check_invariants()
        for s in np.flatnonzero(self._lens >= 0):
            n = int(self._lens[s]) // self.block_size
            want = block_pools(self.format, int(self._lens[s]), self.block_size)
            assert np.array_equal(self._kind[s, :n], want), (s, self._kind[s, :n], want)
            assert (self._kind[s, n:] == -1).all(), s
            for k, pool in enumerate(self.pools):
                assert pool.seq_len(int(s)) == int((want == k).sum()) * self.block_size, (s, k)

    # -- internals --------------------------------------------------------------------
    def _moves(self, seq_ids: np.ndarray, new_lens: np.ndarray) -> list:
        # [tier T-1 re-seals, ..., tier 0 re-seals, seals]: (seq_id, logical, source kind, kind)
        bs, tiers = self.block_size, len(self._ages)
        phases = [[] for _ in range(tiers + 1)]
        for s, n in zip(seq_ids[new_lens % bs == 0].tolist(), new_lens[new_lens % bs == 0].tolist()):
            j = n // bs - 1
            phases[tiers].append((s, j, SEAL, 0 if j < self.format.sink_blocks else self._seal_pool))
            for t in range(tiers - 1, -1, -1):  # blocks reaching tier t's age now (none for an age-0 tier: sealed so)
                age = int(self._ages[t])
                old = (n - age) // bs - 1
                if age and old >= self.format.sink_blocks:  # it is in the pool of the tier before
                    src = t - 1 + self._first_fp16 if t else 0
                    phases[tiers - 1 - t].append((s, old, src, t + self._first_fp16))
        return phases

    def _check_room(self, moves: list, what: str) -> None:
        # Run `moves` on the pools' free counts, in order: a seal or re-seal takes a block of
        # its pool; a re-seal gives its source block back when this sequence held the last
        # reference (a block sealed by these same moves, or one no fork shares). Raises
        # HexcoreOOMError naming the first pool that runs out, before anything changes.
        free = [pool.num_free_blocks for pool in self.pools]
        sealed_before = {}
        for s, j, src, kind in moves:
            if src != SEAL:
                if j < sealed_before.setdefault(s, int(self._lens[s]) // self.block_size):
                    at = int((self._kind[s, :j] == src).sum())
                    block = self.pools[src]._tables[s, at]
                    freed = self.pools[src]._blocks[core.REFS, block] == 1
                else:
                    freed = True
                free[src] += int(freed)
            free[kind] -= 1
            if free[kind] < 0:
                pool = self.pools[kind]
                raise HexcoreOOMError(f"pool {self.kinds[kind].value}: {what} needs more blocks than the "
                                      f"{pool.num_free_blocks} free")

    def _apply(self, move: tuple) -> tuple:
        # one seal or re-seal on the host state; its operation row
        s, j, src, kind = move
        bs = self.block_size
        src_block = -1
        if src != SEAL:
            at = int((self._kind[s, :j] == src).sum())  # j's place in its pool's table
            src_block = int(self.pools[src]._tables[s, at])
            self.pools[src].remove_block(s, at)
        pool = self.pools[kind]
        at = int((self._kind[s, :j] == kind).sum())
        pool.grow_sequence(s, pool.seq_len(s) + bs)  # a new block at the end of the pool's table ...
        block = int(pool._tables[s, pool.seq_len(s) // bs - 1])
        if at != pool.seq_len(s) // bs - 1:  # ... moved to j's place (logical order within the pool)
            row = pool._tables[s]
            row[at + 1: pool.seq_len(s) // bs] = row[at: pool.seq_len(s) // bs - 1].copy()
            row[at] = block
        self._kind[s, j] = kind
        return s, j, src, src_block, kind, block

    def _check_batch(self, seq_ids: np.ndarray, growing: bool = True) -> None:
        bad = np.flatnonzero((seq_ids < 0) | (seq_ids >= self.max_seqs))
        if bad.size == 0:
            bad = np.flatnonzero(self._lens[seq_ids] < 0)
        if bad.size:
            raise HexcoreInvalidSequenceError(f"seq_ids[{bad[0]}] = {seq_ids[bad[0]]} is not a live sequence")
        if len(np.unique(seq_ids)) != len(seq_ids):
            first = int(np.flatnonzero(np.bincount(seq_ids) > 1)[0])
            raise HexcoreInvalidArgumentError(f"seq_ids: sequence {first} is listed twice")
        over = np.flatnonzero(self._lens[seq_ids] + int(growing) > self.max_seq_len)
        if over.size:
            raise HexcoreInvalidSequenceError(f"seq_ids[{over[0]}] = {seq_ids[over[0]]} is at max_seq_len "
                                              f"{self.max_seq_len}")

    def _live(self, name: str, seq_id) -> int:
        seq_id = as_int(name, seq_id)
        if not 0 <= seq_id < self.max_seqs or self._lens[seq_id] < 0:
            raise HexcoreInvalidSequenceError(f"{name}: {seq_id} is not a live sequence")
        return seq_id


def block_pools(fmt, length: int, block_size: int) -> np.ndarray:
    """The pool (index into :func:`pool_kinds`) of each sealed block of a sequence of
    ``length`` tokens in format ``fmt`` (a KVFormat or a name): int8 ``[length // block_size]``."""
    fmt = kv_format(fmt)
    first_fp16 = int(pool_kinds(fmt, block_size)[0] is KVDtype.FP16)  # (checks block_size)
    levels = fmt.block_tiers(length, block_size)  # -1 FP16, else the tier
    return np.where(levels < 0, 0, levels + first_fp16).astype(np.int8)


def pool_blocks_for(fmt, block_size: int, total_blocks: int, max_seqs: int) -> dict:
    """Pool sizes (``TieredKVCache``'s ``pool_blocks``) in which any ``max_seqs`` sequences
    holding ``total_blocks`` sealed blocks between them fit, in format ``fmt``: a pool a
    block leaves as it ages (the sink's FP16 blocks, a recent window, a middle tier) gets
    ``max_seqs`` times the most one sequence ever holds in it, the last tier's pool
    ``total_blocks`` (each at most ``total_blocks``)."""
    fmt = kv_format(fmt)
    block_size = as_int("block_size", block_size, low=1)
    total_blocks = as_int("total_blocks", total_blocks, low=1)
    max_seqs = as_int("max_seqs", max_seqs, low=1)
    kinds = pool_kinds(fmt, block_size)
    sizes = [min(total_blocks, max(1, max_seqs * m)) for m in _most_blocks(fmt, block_size)[:-1]] + [total_blocks]
    return {kind.value: n for kind, n in zip(kinds, sizes)}


def _most_blocks(fmt, block_size: int) -> list:
    """The most blocks one sequence ever holds in each pool of :func:`pool_kinds`, in closed
    form (O(tiers), whatever the format's ages and sink): a sequence's youngest blocks are
    the ones younger than an age, so the FP16 pool holds at most the sink and the blocks
    younger than the first tier, tier ``t``'s pool the blocks between its age and the next
    tier's, and the last pool (unbounded) is given as 0."""
    ages = [t.min_age // block_size for t in fmt.tiers]  # in blocks (multiples: pool_kinds checked)
    most = [fmt.sink_blocks + ages[0]] if ages and pool_kinds(fmt, block_size)[0] is KVDtype.FP16 else []
    most += [later - age for age, later in zip(ages, ages[1:])]
    return most + [0]


def pool_kinds(fmt, block_size: int) -> list:
    """The pools a format needs, in order: FP16 (when a block can be FP16: the sink, or
    blocks younger than the first tier), then one per tier, a kind at most once (else
    HexcoreConfigError). ``fmt``: a KVFormat or a name; ``block_size``: an int >= 1
    (HexcoreInvalidArgumentError naming it otherwise)."""
    fmt, block_size = kv_format(fmt), as_int("block_size", block_size, low=1)
    tiers = fmt.tiers
    ages = [t.min_age for t in tiers]
    if any(a % block_size for a in ages):
        raise HexcoreConfigError(f"format {fmt.name!r}: tier ages {ages} are not multiples of block_size "
                                 f"{block_size}")
    kinds = [KVDtype.FP16] if not tiers or fmt.sink_blocks or tiers[0].min_age > 0 else []
    for i, t in enumerate(tiers):
        if t.key_bits != t.value_bits:
            raise HexcoreConfigError(f"format {fmt.name!r}: tier {i} holds keys and values at different bits "
                                     f"({t.key_bits}, {t.value_bits}): a pool holds one kind of block")
        kind = _BITS_DTYPE[t.key_bits]
        if kinds and kinds[-1] is kind:
            raise HexcoreConfigError(f"format {fmt.name!r}: tier {i} keeps the bits of the one before")
        if kind in kinds:  # pool_blocks names a pool by its kind: one pool per kind
            raise HexcoreConfigError(f"format {fmt.name!r}: tier {i} returns to {kind.value}, the kind of an "
                                     f"earlier tier (a pool per kind)")
        kinds.append(kind)
    return kinds


def _pool_sizes(pool_blocks, kinds: list) -> list:
    names = [k.value for k in kinds]
    if not isinstance(pool_blocks, dict) or set(pool_blocks) != set(names):
        raise HexcoreInvalidArgumentError(
            f"pool_blocks: expected a dict with the keys {names} (the format's pools), got {pool_blocks!r:.80}")
    return [as_int(f"pool_blocks[{name!r}]", pool_blocks[name], low=1) for name in names]
