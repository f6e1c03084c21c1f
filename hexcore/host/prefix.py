"""Automatic prefix caching: sealed blocks found again by their token ids.

Opt in with ``PagedKVCache(config, num_blocks, max_seqs, prefix_cache=True)``. A sealed
block is immutable, so its identity is its token prefix: each block a *tracked*
sequence seals gets a key, the XXH64 of its whole token prefix seeded by a root that
mixes in a namespace (a model or adapter id) and the cache's kv dtype, block size and
group size. It is computed as a stream chained on the parent block's hash state, so a
key costs O(block_size) (``_keys.py``; :func:`prefix_keys` reproduces it), and the
block is stored in a key index with its token ids and its parent block. A new request
whose leading blocks are indexed shares them by reference count, and only the rest is
prefilled::

    cache = PagedKVCache(cfg, num_blocks=4096, max_seqs=64, prefix_cache=True)
    adm = cache.admit(prompt)                    # prompt: int32 [n] token ids
    adm.seq_id, adm.cached_tokens                # the sequence starts cached_tokens long
    cache.grow_sequence(adm.seq_id, len(prompt), tokens=prompt[adm.cached_tokens:])  # prefill the rest
    cache.step(ids, tokens=next_tokens)          # decode: one new token id per sequence, int32 [B]
    cache.free_sequence(adm.seq_id)              # its indexed blocks stay cached, evictable

Hits are exact: a candidate found by key is used only if its token ids and its parent
block match, so a hash collision is a miss, never wrong KV. Matches are whole blocks
(the open tail is private); by default the last prompt token is never matched, so a
fully cached prompt still leaves one token whose logits the model computes (as vLLM).

A sequence is *tracked* while every one of its token ids was given: ``admit`` and
``add_sequence`` start one, ``grow_sequence(..., tokens=...)`` and ``step(...,
tokens=...)`` keep it, a growth without tokens ends it (its later blocks are not
indexed), and so does sealing a block whose content another sequence indexed first
(two requests with one uncached prompt prefilled at once: the second's blocks stay
private; admit requests that share a prefix after the first one's prefill to share it).

Freed indexed blocks stay *cached* until the pool needs them: an allocation pops the
free stack first, then evicts in O(1) the least recently released block of the lowest
priority level (``priority`` 0..7 per request, default 4; a block keeps the highest
priority of the requests that used it), and never a block with indexed children
(leaves go first). ``pin_prefix`` keeps a prefix from eviction until ``unpin_prefix``;
``clear_prefix_cache`` evicts every unpinned cached block.

Events (``attach_event_ring``): ``STORED (4, block_id, key, parent_key)`` when a block
is indexed, ``REMOVED (5, block_id, key, 0)`` when it is evicted, and ``REUSED (6,
seq_id, logical block, block_id)`` for each block an admission shares (applied to a
table like SEALED); ``BlockTableMirror`` keeps the set of stored keys
(``mirror.match_keys(prefix_keys(tokens, config))``), so another process can tell
which prefixes live where.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

import numpy as np

from .._checks import INT_LIMIT, as_int
from ..config import KVCacheConfig
from ..errors import HexcoreInvalidArgumentError, HexcoreInvalidSequenceError
from . import _keys
from . import _prefix as pcore

__all__ = ["Admission", "DEFAULT_PRIORITY", "NUM_PRIORITIES", "PrefixCacheMethods", "PrefixState",
           "cache_seed", "prefix_keys", "root_key", "xxh64"]

NUM_PRIORITIES = pcore.NUM_PRIORITIES
DEFAULT_PRIORITY = 4
_I32 = np.dtype(np.int32)
_M64 = 2**64 - 1


class Admission(NamedTuple):
    """What :meth:`PagedKVCache.admit` did.

    ``seq_id``: the new sequence (and tail slot). ``cached_tokens``: leading tokens of
    the request whose KV is already cached (a multiple of block_size); the sequence
    starts that long, sharing those blocks, and ``tokens[cached_tokens:]`` remain to be
    prefilled (``grow_sequence(seq_id, n, tokens=tokens[cached_tokens:])``).
    """

    seq_id: int
    cached_tokens: int


# -- keys, reproducible outside hexcore -----------------------------------------------------------
_P1, _P2, _P3, _P4, _P5 = (0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0x85EBCA77C2B2AE63,
                           0x27D4EB2F165667C5)


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _M64


def _round(acc: int, lane: int) -> int:
    return (_rotl((acc + lane * _P2) & _M64, 31) * _P1) & _M64


def xxh64(data: bytes, seed: int = 0) -> int:
    """XXH64 of ``data`` (pure Python, the reference of the njit hash): an int in [0, 2**64)."""
    n, p = len(data), 0
    if n >= 32:
        v = [(seed + _P1 + _P2) & _M64, (seed + _P2) & _M64, seed & _M64, (seed - _P1) & _M64]
        while p + 32 <= n:
            for k in range(4):
                v[k] = _round(v[k], int.from_bytes(data[p:p + 8], "little"))
                p += 8
        h = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & _M64
        for k in range(4):
            h = (((h ^ _round(0, v[k])) * _P1) + _P4) & _M64
    else:
        h = (seed + _P5) & _M64
    h = (h + n) & _M64
    while p + 8 <= n:
        h ^= _round(0, int.from_bytes(data[p:p + 8], "little"))
        h = (_rotl(h, 27) * _P1 + _P4) & _M64
        p += 8
    if p + 4 <= n:
        h ^= (int.from_bytes(data[p:p + 4], "little") * _P1) & _M64
        h = (_rotl(h, 23) * _P2 + _P3) & _M64
        p += 4
    while p < n:
        h ^= (data[p] * _P5) & _M64
        h = (_rotl(h, 11) * _P1) & _M64
        p += 1
    h ^= h >> 33
    h = (h * _P2) & _M64
    h ^= h >> 29
    h = (h * _P3) & _M64
    return h ^ (h >> 32)


def _signed(value: int) -> int:
    return value - 2**64 if value >= 2**63 else value


def cache_seed(config: KVCacheConfig) -> int:
    """The hash seed of caches of ``config``: ``XXH64("hexcore-prefix/v1/<kv_dtype>/<block_size>/<group_size>")``
    as int64, so caches whose blocks hold different bytes never share keys."""
    if not isinstance(config, KVCacheConfig):
        raise HexcoreInvalidArgumentError(f"config: expected KVCacheConfig, got {type(config).__name__}")
    text = f"hexcore-prefix/v1/{config.kv_dtype.value}/{config.block_size}/{config.group_size}"
    return _signed(xxh64(text.encode()))


def root_key(config: KVCacheConfig, namespace: int = 0) -> int:
    """The seed of a namespace's keys (and parent key of its first blocks):
    ``XXH64(le64(namespace), seed=cache_seed(config))`` as int64."""
    namespace = check_namespace(namespace)
    return _signed(xxh64(struct.pack("<q", namespace), cache_seed(config) % 2**64))


def prefix_keys(tokens, config: KVCacheConfig, namespace: int = 0) -> np.ndarray:
    """The keys (int64 [len(tokens) // block_size]) that ``tokens``' whole blocks get in a
    cache of ``config`` in ``namespace``: what a router compares with a mirror's stored keys.

    Block ``j``'s key is ``XXH64(le32 bytes of tokens[:(j + 1) * block_size],
    seed=root_key(config, namespace))`` as int64 (computed as one stream, O(len(tokens))).
    """
    tokens = as_tokens("tokens", tokens)
    root = root_key(config, namespace)
    out = np.empty(len(tokens) // config.block_size, np.int64)
    _keys.keys_of(tokens, config.block_size, root, out)
    return out


# -- argument checks ------------------------------------------------------------------------------
def as_tokens(name: str, tokens) -> np.ndarray:
    """``tokens`` as a C-contiguous int32 [n] array of token ids (a copy unless it is one).

    Accepts integer arrays and lists of ints whose values fit int32; anything else
    raises HexcoreInvalidArgumentError naming ``name``.
    """
    if (type(tokens) is np.ndarray and (tokens.dtype is _I32 or tokens.dtype == _I32) and tokens.ndim == 1
            and tokens.flags.c_contiguous):
        return tokens
    if isinstance(tokens, np.ndarray):
        array = tokens
    elif isinstance(tokens, (list, tuple, range)):
        try:
            array = np.asarray(tokens)
        except (ValueError, TypeError, OverflowError):
            raise HexcoreInvalidArgumentError(f"{name}: expected a 1-D sequence of int token ids") from None
    else:
        raise HexcoreInvalidArgumentError(
            f"{name}: expected an int32 [n] array (or a list of ints) of token ids, got {type(tokens).__name__}")
    if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
        raise HexcoreInvalidArgumentError(
            f"{name}: expected a 1-D array of int token ids, got {array.dtype} shape {array.shape}")
    if array.size and (int(array.min()) < -2**31 or int(array.max()) >= 2**31):
        bad = int(array.min()) if int(array.min()) < -2**31 else int(array.max())
        raise HexcoreInvalidArgumentError(f"{name}: token ids must fit int32, got {bad}")
    return np.ascontiguousarray(array, dtype=np.int32)


def check_namespace(namespace) -> int:
    """``namespace`` as an int in [0, 2**62), or HexcoreInvalidArgumentError naming it."""
    if type(namespace) is int and 0 <= namespace < INT_LIMIT:
        return namespace
    return as_int("namespace", namespace, low=0, high=INT_LIMIT - 1)


def check_priority(priority) -> int:
    """``priority`` as an int in [0, NUM_PRIORITIES - 1], or HexcoreInvalidArgumentError naming it."""
    if type(priority) is int and 0 <= priority < NUM_PRIORITIES:
        return priority
    return as_int("priority", priority, low=0, high=NUM_PRIORITIES - 1)


# -- state ----------------------------------------------------------------------------------------
class PrefixState:
    """The prefix cache's arrays, owned by a PagedKVCache (layout in ``_prefix.py``)."""

    __slots__ = ("pblocks", "ptok", "pseqs", "index", "pc", "plog", "scratch", "seed")

    def __init__(self, config: KVCacheConfig, num_blocks: int, max_seqs: int, max_blocks_per_seq: int):
        self.seed = cache_seed(config)
        (self.pblocks, self.ptok, self.pseqs, self.index, self.pc, self.plog,
         self.scratch) = pcore.new_prefix_state(num_blocks, max_seqs, max_blocks_per_seq, config.block_size,
                                                self.seed)

    def arrays(self) -> tuple:
        """Every state array (for snapshots in tests)."""
        return (self.pblocks, self.ptok, self.pseqs, self.index, self.pc)

    def events(self) -> np.ndarray:
        """The events the last njit call logged, int64 [n, 4] (a view)."""
        return self.plog[:self.pc[pcore.C_LOG]]


class PrefixCacheMethods:
    """The prefix-cache calls of :class:`~hexcore.host.PagedKVCache` (a mixin: the cache
    owns ``self._prefix``, a :class:`PrefixState`, or None when the cache is off)."""

    def admit(self, tokens, seq_id: int | None = None, *, namespace: int = 0,
              priority: int = DEFAULT_PRIORITY, leave_last: bool = True) -> Admission:
        """Start a sequence for a request of ``tokens``, sharing its longest cached prefix.

        Parameters
        ----------
        tokens : int32 [n] token ids of the request (lists and other int arrays are
            converted; an int32 C-contiguous array is the fast path), n <= max_seq_len.
        seq_id : the slot to use (default: the next free one), as in :meth:`add_sequence`.
        namespace : int in [0, 2**62) -- e.g. a model or adapter id; blocks are shared
            only within a namespace.
        priority : int in [0, 7] -- eviction level of the blocks it uses (0 goes first).
        leave_last : never match the last token (default), so the model has at least one
            token to compute logits for; False matches every whole block.

        Returns an :class:`Admission` ``(seq_id, cached_tokens)``. The new sequence is
        tracked: give the rest of the prompt with ``grow_sequence(seq_id, n,
        tokens=tokens[cached_tokens:])``. With the prefix cache off this is
        ``add_sequence`` and ``cached_tokens`` is 0. Raises as ``add_sequence`` does,
        ``HexcoreInvalidSequenceError`` when n > max_seq_len, and
        ``HexcoreInvalidArgumentError`` for bad tokens, namespace or priority; a failed
        call changes nothing.
        """
        t0 = self._clock()
        tokens = as_tokens("tokens", tokens)
        sid = -1 if seq_id is None else self._slot("seq_id", seq_id)
        namespace, priority = check_namespace(namespace), check_priority(priority)
        if type(leave_last) is not bool:
            raise HexcoreInvalidArgumentError(f"leave_last: expected a bool, got {type(leave_last).__name__}")
        n = tokens.shape[0]
        if n > self.max_seq_len:
            raise HexcoreInvalidSequenceError(f"tokens: a request of {n} tokens exceeds max_seq_len {self.max_seq_len}")
        prefix = self._prefix
        if prefix is None:
            return Admission(self.add_sequence(seq_id, namespace=namespace, priority=priority), 0)
        bs = self.block_size
        limit = max(0, n - 1 if leave_last else n) // bs
        status, sid, matched = pcore.admit(self._blocks, self._seqs, self._counters, self._tables, prefix.pblocks,
                                           prefix.ptok, prefix.pseqs, prefix.index, prefix.pc, prefix.plog,
                                           tokens, limit, sid, namespace, priority, bs)
        if status:
            self._fail(status, "add", "seq_id", None if seq_id is None else sid)
        if self._events is not None:
            self._events.records(prefix.events())
        if t0:
            self._record("admit", t0)
        return Admission(sid, matched * bs)

    def match_prefix(self, tokens, *, namespace: int = 0) -> int:
        """Leading tokens of ``tokens`` (int32 [n]) whose blocks are cached now, whole
        blocks only (0 with the cache off); changes nothing and counts no query."""
        tokens = as_tokens("tokens", tokens)
        namespace = check_namespace(namespace)
        prefix = self._prefix
        if prefix is None:
            return 0
        return self.block_size * pcore.match(prefix.pblocks, prefix.ptok, prefix.index, prefix.pc, prefix.scratch,
                                             tokens, namespace, self.block_size)

    def pin_prefix(self, tokens, *, namespace: int = 0) -> int:
        """Keep the cached blocks of ``tokens``' longest cached prefix (int32 [n]) from
        eviction until :meth:`unpin_prefix`; returns the tokens pinned (whole blocks).

        Pins count: each pin needs its own unpin. Pinned blocks no reference holds stay
        cached (``num_cached_blocks``) but are not available to allocations.
        """
        return self._on_matched_prefix(pcore.pin, tokens, namespace)

    def unpin_prefix(self, tokens, *, namespace: int = 0) -> int:
        """Undo one :meth:`pin_prefix` of the longest pinned prefix of ``tokens``; the
        tokens unpinned (0: no pin of a prefix of ``tokens`` was found)."""
        return self._on_matched_prefix(pcore.unpin, tokens, namespace)

    def _on_matched_prefix(self, apply, tokens, namespace) -> int:
        # apply (pcore.pin or pcore.unpin) to the blocks of tokens' longest cached prefix
        # (matched into scratch); the tokens it took, in whole blocks
        tokens = as_tokens("tokens", tokens)
        namespace = check_namespace(namespace)
        prefix = self._prefix
        if prefix is None:
            return 0
        count = pcore.match(prefix.pblocks, prefix.ptok, prefix.index, prefix.pc, prefix.scratch, tokens, namespace,
                            self.block_size)
        return self.block_size * apply(self._blocks, prefix.pblocks, prefix.pc, prefix.scratch, count)

    def clear_prefix_cache(self) -> int:
        """Evict every cached block that is neither referenced nor pinned (to the free
        stack, leaves first); the number evicted. Blocks in use stay indexed."""
        prefix = self._prefix
        if prefix is None:
            return 0
        t0 = self._clock()
        evicted = pcore.clear(self._blocks, self._counters, prefix.pblocks, prefix.index, prefix.pc, prefix.plog)
        if self._events is not None:
            self._events.records(prefix.events())
        if t0:
            self._record("clear_prefix_cache", t0)
        return evicted

    # -- queries --------------------------------------------------------------------------------------
    @property
    def prefix_cache_enabled(self) -> bool:
        """True when blocks are cached by content (``prefix_cache=True``)."""
        return self._prefix is not None

    @property
    def num_cached_blocks(self) -> int:
        """Blocks no table references that stay indexed for reuse (evictable or pinned)."""
        return 0 if self._prefix is None else int(self._prefix.pc[pcore.C_CACHED])

    @property
    def num_evictable_blocks(self) -> int:
        """Cached blocks an allocation may evict (not pinned)."""
        return 0 if self._prefix is None else int(self._prefix.pc[pcore.C_EVICTABLE])

    @property
    def num_available_blocks(self) -> int:
        """Blocks an allocation can take now: the free stack plus the evictable blocks."""
        return self.num_free_blocks + self.num_evictable_blocks

    def prefix_cache_stats(self) -> dict:
        """Counts since construction: ``queries`` and ``hits`` in tokens (vLLM's
        prefix_cache_queries / prefix_cache_hits), ``hit_rate``, blocks ``stored`` and
        ``evicted``; and now: ``cached_blocks``, ``evictable_blocks``, ``indexed_blocks``."""
        if self._prefix is None:
            return {"queries": 0, "hits": 0, "hit_rate": 0.0, "stored": 0, "evicted": 0, "cached_blocks": 0,
                    "evictable_blocks": 0, "indexed_blocks": 0}
        pc = self._prefix.pc
        queries, hits = int(pc[pcore.C_QUERIES]), int(pc[pcore.C_HITS])
        return {"queries": queries, "hits": hits, "hit_rate": hits / queries if queries else 0.0,
                "stored": int(pc[pcore.C_STORED]), "evicted": int(pc[pcore.C_EVICTIONS]),
                "cached_blocks": int(pc[pcore.C_CACHED]), "evictable_blocks": int(pc[pcore.C_EVICTABLE]),
                "indexed_blocks": int(np.count_nonzero(self._prefix.pblocks[:, pcore.P_PARENT] != pcore.NOT_INDEXED))}

    def block_key(self, block_id: int) -> int | None:
        """The key of block ``block_id`` if it is indexed, else None."""
        block_id = as_int("block_id", block_id, low=0, high=self.num_blocks - 1)
        if self._prefix is None or self._prefix.pblocks[block_id, pcore.P_PARENT] == pcore.NOT_INDEXED:
            return None
        return int(self._prefix.pblocks[block_id, pcore.P_KEY])

    def is_tracked(self, seq_id: int) -> bool:
        """True while ``seq_id``'s blocks are indexed as it seals them (False with the cache off)."""
        seq_id = self._live("seq_id", seq_id)
        return self._prefix is not None and bool(self._prefix.pseqs[pcore.S_TRACKED, seq_id])
