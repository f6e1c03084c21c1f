"""The Engine's parts for a cache in a format by age (``Engine(..., format="int2-aged")``,
``docs/formats.md``): a ``TieredKVCache``, a ``DeviceKVStore`` per pool, and the order of
a step written once:

- a fork's tail copy (in the store that holds the tail) runs with the next prefill or step;
- a step's new token goes into the tail of the store its block will be sealed in
  (``TieredKVCache.tail_pools``, one masked append per pool);
- the step's re-seals run before its seals (all layers at the first layer's call: they
  read only old, complete blocks), a layer's seals after that layer's append; ``run()``
  appends and seals every layer at once (a launch per pool), ``attend(layer)`` one layer;
- attention is ``tiered_decode`` over every pool and the tail (a ``TieredDecodePlan`` per
  step over the step's buffers: its index arrays checked and copied once, its launches
  marshalled once, each layer only its ``q``, ``out`` and layer number put in).

A step's index arrays (tables, lengths, slots, seal and re-seal ids) are built on the host
and go to the device in three asynchronous copies from pinned memory (``cuda.uploads``);
the re-seals' rows use the uploads' scratch; a step's attention plan takes over the
prepared launches of the plan two steps before where they match (only arrays changed), and
its appends, seals and re-seals run through prepared launches kept across steps
(``TieredParts.relaunch``). The views all of these read are kept (``cuda.views``): a step
at unchanged shapes makes no device array object.
No CUDA graph yet: correct, not yet the serving path's speed. Not with the prefix cache,
speculative allocation, fault tolerance, truncation or the prefill attention helpers
(typed errors from ``Engine``).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ._checks import as_int
from .config import KVCacheConfig
from .errors import HexcoreInvalidArgumentError
from .host.tiered import OP_BLOCK, OP_KIND, OP_SEQ, OP_SRC_KIND, SEAL, TieredKVCache


class TieredParts:
    """Block manager and stores of an Engine in a format by age (see the module docstring)."""

    def __init__(self, config: KVCacheConfig, fmt, pool_blocks: dict, max_seqs: int, num_q_heads: int,
                 max_seq_len: int | None, scale, options):
        from .cuda import DeviceKVStore
        from .cuda.launch import Relaunch

        self.cache = TieredKVCache(config, fmt, pool_blocks, max_seqs, max_seq_len=max_seq_len)
        num_q_heads = check_decode_args(config, self.cache.kinds, num_q_heads, scale, options)  # (before any step)
        self.stores = [DeviceKVStore(dataclasses.replace(config, kv_dtype=kind), pool.num_blocks, max_seqs)
                       for kind, pool in zip(self.cache.kinds, self.cache.pools)]
        self.config, self.num_q_heads, self.scale, self.options = config, num_q_heads, scale, options
        self._buffers: dict = {}
        self._forks: list = []  # (pool, parent, child) tail copies not yet made
        self._uploads = None  # cuda.uploads.Uploads, made at the first step
        self.plans: list = []  # the last two steps' TieredDecodePlans (a step reuses the launches of two before)
        self._relaunch = (Relaunch(), Relaunch())  # per turn of the uploads (see relaunch)

    @property
    def uploads(self):
        """The ``Uploads`` every step's index arrays and re-seal rows go through (three
        asynchronous copies per step, no allocation)."""
        if self._uploads is None:
            from .cuda.uploads import Uploads

            self._uploads = Uploads()
        return self._uploads

    @property
    def relaunch(self):
        """The ``Relaunch`` the current step's appends, seals and re-seals run through: one
        per turn of the uploads, so that a launch is rebound to the index views of the step
        two before, the same objects where the shapes are the same (nothing to put in)."""
        return self._relaunch[self.uploads.turn]

    def fork(self, parent: int) -> int:
        """The child sequence; its tail copy (in the store that holds the parent's tail) runs
        with the next prefill or step, as ``Engine.fork``'s."""
        child = self.cache.fork_sequence(parent)
        pool = int(self.cache.tail_pools(np.array([parent], np.int32))[0])
        # a parent whose own copy is pending holds its parent's tail: copy from that one
        source = next((p for _, p, c in self._forks if c == parent), parent)
        if any(p == child for _, p, _ in self._forks):  # the child's slot is a pending source: copy it out first
            self.copy_forks(None)
        self._forks.append((pool, source, child))
        return child

    def finish(self, seq_id: int) -> None:
        """Free ``seq_id`` (its pending tail copy, if any, is dropped)."""
        self.cache.free_sequence(seq_id)
        self._forks = [f for f in self._forks if f[2] != seq_id]

    def copy_forks(self, stream, forks: list | None = None) -> None:
        """Tail copies, a launch per store: ``forks`` ((pool, parent, child) items), or the
        pending ones (taken)."""
        from .cuda import copy_tails

        if forks is None:
            forks, self._forks = self._forks, []
        for pool in sorted({f[0] for f in forks}):
            src, dst = (np.array(x, np.int32) for x in zip(*((p, c) for k, p, c in forks if k == pool)))
            copy_tails(self.stores[pool], src, dst, stream=stream)

    def prefill(self, seq_id: int, k, v, stream=None) -> None:
        """Append a prompt's K/V (float16 ``[L, n, H, D]``, shape checked by the Engine):
        complete the open tail, grow (the block manager's seals and re-seals of every block
        the prompt fills; raises before anything changes), run them (whole blocks sealed from
        the rows), then the rest into the new tail."""
        from .cuda import append, run_tiered_ops
        from .cuda.arrays import checked

        bs = self.config.block_size
        k, v = checked(k, "k", np.float16, tuple(k.shape)), checked(v, "v", np.float16, tuple(k.shape))
        n, seq_id = k.shape[1], as_int("seq_id", seq_id)
        start = self.cache.seq_len(seq_id)
        ids = np.array([seq_id], np.int32)
        pool = int(self.cache.tail_pools(ids)[0])
        ops = self.cache.grow(seq_id, start + n).ops  # all or nothing: raises before any write
        self.copy_forks(stream)
        head = min(n, (bs - start % bs) % bs)  # rows that complete the open tail
        if head:
            append(self.stores[pool], k, v, np.full(head, seq_id, np.int32),
                   np.arange(start % bs, start % bs + head, dtype=np.int32), stream=stream, rows=(0, head))
        run_tiered_ops(self.stores, ops, self.cache.format.fitted_keys, rows=(k, v, start), stream=stream)
        rest = (start + n) % bs if n > head else 0
        if rest:
            pool = int(self.cache.tail_pools(ids)[0])
            append(self.stores[pool], k, v, np.full(rest, seq_id, np.int32), np.arange(rest, dtype=np.int32),
                   stream=stream, rows=(n - rest, rest))

    def buffers(self, batch: int) -> tuple:
        """``StepViews`` (q, k, v, out) of a step of ``batch`` sequences (an int in [1, max_seqs]): ``[L, B, heads, D]``
        float16, torch tensors whenever torch with CUDA is installed (as ``DecodeGraph``'s),
        numba device arrays otherwise."""
        return self.arrays(batch)[1]

    def arrays(self, batch: int) -> tuple:
        """(numba device arrays, the views :meth:`buffers` gives) of a step of ``batch``: an
        int in [1, max_seqs] (a step's distinct sequences; HexcoreInvalidArgumentError otherwise)."""
        from numba import cuda

        from .cuda import StepViews
        from .cuda.streams import torch_with_cuda

        batch = as_int("batch", batch, low=1, high=self.cache.max_seqs)
        if batch not in self._buffers:
            cfg = self.config
            L, H, D = cfg.num_layers, cfg.num_kv_heads, cfg.head_dim
            arrays = StepViews(*(cuda.device_array((L, batch, h, D), np.float16)
                                 for h in (self.num_q_heads, H, H, self.num_q_heads)))
            torch = torch_with_cuda()
            views = arrays if torch is None else StepViews(*(torch.as_tensor(a, device="cuda") for a in arrays))
            self._buffers[batch] = (arrays, views)
        return self._buffers[batch]

    def step(self, ids: np.ndarray) -> "TieredEngineStep":
        """The block manager's part of a step of ``ids`` (raises before anything changes)."""
        pools = self.cache.tail_pools(ids)  # where each new token goes (before the step seals it)
        positions = np.array([self.cache.seq_len(int(s)) % self.config.block_size for s in ids], np.int32)
        result = self.cache.step(ids)
        forks, self._forks = self._forks, []  # this step's copies: a fork after this call waits for the next
        return TieredEngineStep(self, ids, pools, positions, result, forks)


class TieredEngineStep:
    """One decode step of an Engine in a format by age: ``buffers`` (q, k, v, out) to fill,
    then ``run()`` (all layers) or ``attend(layer)`` per layer, as ``EngineStep``."""

    def __init__(self, parts: TieredParts, ids: np.ndarray, pools: np.ndarray, positions: np.ndarray, result,
                 forks: list):
        from .cuda import TieredDecodePlan

        self.parts, self.result, self.batch = parts, result, len(ids)
        self._arrays, self.buffers = parts.arrays(self.batch)
        cache, bs = parts.cache, parts.config.block_size
        # host arrays until the step starts (``_start`` copies them with the step's other index arrays)
        self._slots = [np.where(pools == p, ids, -1).astype(np.int32)  # -1: skipped by append
                       if (pools == p).any() else None for p in range(len(parts.stores))]
        self._positions = positions
        tables = cache.block_tables(ids)  # the step's tables: the same for every layer
        # the plan of two steps before: its index arrays were in this step's turn of the uploads,
        # so where the arrays' sizes did not change, their addresses did not either
        reuse = parts.plans[0] if len(parts.plans) == 2 else None
        self._decode = TieredDecodePlan(parts.stores, [t for t, _ in tables], [c for _, c in tables],
                                        (result.seq_lens % bs).astype(np.int32), cache.tail_pools(ids), ids,
                                        scale=parts.scale, options=parts.options,
                                        buffers=(self._arrays[0], self._arrays[3]), upload=parts.uploads.put,
                                        reuse=reuse)
        parts.plans = parts.plans[-1:] + [self._decode]
        self._forks, self._resealed, self._loaded = forks, False, None
        ops = result.ops  # split once, for every layer: re-seals, and seals per pool
        self._reseals = np.ascontiguousarray(ops[ops[:, OP_SRC_KIND] != SEAL])
        self._seals = seal_lists(parts, ops[ops[:, OP_SRC_KIND] == SEAL])

    def write(self, q, k, v) -> None:
        """Copy host arrays into the step's buffers (as ``EngineStep.write``)."""
        from .engine import EngineStep

        EngineStep.write(self, q, k, v)

    def output(self) -> np.ndarray:
        """``out`` on the host: float16 ``[L, B, num_q_heads, D]`` (synchronises)."""
        return self._arrays[3].copy_to_host()

    def run(self, stream=None):
        """Append, seal and attention for every layer; returns ``out``. The appends and seals
        take every layer in one launch per pool; attention is, per layer, one launch of every
        pool where the step has few items, else a launch per pool (and a merge launch:
        ``DecodeOptions.tiered_merge``)."""
        if self._loaded is not None:
            done = "ran" if self._loaded else "was started by attend()"
            raise HexcoreInvalidArgumentError(f"run: this step already {done}")
        stream = self._start(stream)
        self._write(None, stream)
        for layer in range(self.parts.config.num_layers):
            self._decode.run(layer, stream=stream)
        self._loaded = True
        return self.buffers[3]

    def attend(self, layer: int, stream=None):
        """Append, seal and attention for one layer (``q/k/v[layer]`` filled); returns ``out[layer]``."""
        if self._loaded is True:
            raise HexcoreInvalidArgumentError("attend: this step already ran whole")
        layer = as_int("layer", layer, low=0, high=self.parts.config.num_layers - 1)
        stream = self._start(stream)
        self._loaded = False
        self._write(layer, stream)
        self._decode.run(layer, stream=stream)
        return self.buffers[3][layer]

    def _start(self, stream):
        """The stream the step runs on; the first time, the step's index arrays to the device
        (``TieredParts.uploads``: its appends' and seals' in one copy, the re-seals' in
        another, attention's at its first layer), its fork copies and re-seals (they read
        only old blocks, so they come before any layer's writes; their rows in the uploads'
        scratch)."""
        from .cuda import run_tiered_ops
        from .cuda.streams import resolve_stream, torch_current_stream

        if stream is None and self.buffers is not self._arrays:  # torch views: torch's current stream
            stream = resolve_stream(torch_current_stream())
        if not self._resealed:
            parts = self.parts
            parts.uploads.begin(stream)
            self._upload_writes()
            parts.copy_forks(stream, self._forks)
            run_tiered_ops(parts.stores, self._reseals, parts.cache.format.fitted_keys, stream=stream,
                           upload=parts.uploads.put, scratch=parts.uploads.scratch, launch=parts.relaunch.run)
            self._resealed = True
        return stream

    def _upload_writes(self) -> None:
        """The appends' slots and positions and the seals' slots and blocks to the device, one copy."""
        slots = [s for s in self._slots if s is not None]
        seals = [a for _, s, b, _ in self._seals for a in (s, b)]
        staged = iter(self.parts.uploads.put([*slots, self._positions, *seals]))
        self._slots = [None if s is None else next(staged) for s in self._slots]
        self._positions = next(staged)
        self._seals = [(kind, next(staged), next(staged), fitted) for kind, _, _, fitted in self._seals]

    def _write(self, layer: int | None, stream) -> None:
        """The new tokens' K/V into their pools' tails, then the step's seals, a launch per
        pool: of ``layer``, or of every layer when it is None (through ``TieredParts.relaunch``:
        the same launches every step, their views kept, run prepared)."""
        from .cuda.views import layer_of
        from .cuda.write import append_launch, seal_launch

        stores, run = self.parts.stores, self.parts.relaunch.run
        k, v = self._arrays[1], self._arrays[2]
        if layer is not None:
            k, v = layer_of(k, layer), layer_of(v, layer)
        for store, slots in zip(stores, self._slots):
            if slots is not None:
                run(append_launch(store, k, v, slots, self._positions, layer), stream)
        for kind, slots, blocks, fitted in self._seals:
            run(seal_launch(stores[kind], slots, blocks, layer, fitted_keys=fitted), stream)


def check_decode_args(config: KVCacheConfig, kinds: list, num_q_heads, scale, options) -> int:
    """What every step's ``tiered_decode`` would check at its first layer, checked once when
    the Engine is made (a step's block manager changes come before its decode): ``num_q_heads``
    a positive multiple of ``num_kv_heads`` (returned as an int), ``scale`` a positive finite
    number or None, ``options`` DecodeOptions or None, a head_dim, block and group size the
    decode of every pool's kind (``kinds``) supports. HexcoreInvalidArgumentError naming the
    argument otherwise."""
    from .cuda.attention.launcher import check_q_heads, checked_scale, resolved_options
    from .cuda.attention.shape import unsupported_reason

    num_q_heads = as_int("num_q_heads", num_q_heads, low=1)
    check_q_heads(num_q_heads, config.num_kv_heads)
    checked_scale(scale, config.head_dim)
    resolved_options(options)
    for kind in kinds:
        reason = unsupported_reason(kind.bits, config.head_dim, config.block_size, config.group_size)
        if reason:
            raise HexcoreInvalidArgumentError(f"{kind.value} pool: paged_decode does not support {reason}")
    return num_q_heads


def seal_lists(parts: TieredParts, seals: np.ndarray) -> list:
    """A step's seal ops grouped by pool: ``(pool, slots, block ids, fitted keys)`` per pool
    with seals, the arrays int32 ``[n]`` as ``seal`` takes them."""
    fitted = parts.cache.format.fitted_keys
    lists = []
    for kind in np.unique(seals[:, OP_KIND]).tolist():
        mine = seals[seals[:, OP_KIND] == kind]
        lists.append((kind, np.ascontiguousarray(mine[:, OP_SEQ]), np.ascontiguousarray(mine[:, OP_BLOCK]),
                      fitted and kind_bits(parts, kind) == 2))
    return lists


def kind_bits(parts: TieredParts, kind: int) -> int:
    """Bits of pool ``kind``'s blocks."""
    return parts.stores[kind].config.kv_dtype.bits
