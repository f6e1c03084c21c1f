"""Engine: the KV cache an inference engine holds, in the terms an engine uses.

One object owns the block manager (``PagedKVCache``), the device store
(``DeviceKVStore``) and the decode graph (``DecodeGraph``), and writes out the order of
a step once: fork copies, append, seal, attention for every layer::

    engine = Engine(KVCacheConfig.from_preset("llama-3-8b", kv_dtype="int4"), num_blocks=4096,
                    max_seqs=64, num_q_heads=32)
    seq = engine.add()
    engine.prefill(seq, k, v)              # the prompt's K/V: [L, n, H, D] float16
    child = engine.fork(seq)               # shares seq's blocks; its tail is copied in the next step
    step = engine.step([seq, child])       # one decode step: the block manager's part
    q, k, v, out = step.buffers            # [L, B, heads, D] views: fill q, k, v ...
    step.run()                             # ... then append, seal and attend for every layer (a graph replay)
    # or, layer by layer as a model computes them: fill q[l], k[l], v[l]; step.attend(l) -> out[l]
    engine.finish(seq)

The low-level calls (``hexcore.host``, ``hexcore.cuda``) stay public for engines that
need another order.
"""

from __future__ import annotations

import numpy as np

from ._checks import as_int
from .config import KVCacheConfig
from .errors import HexcoreInvalidArgumentError, Status, raise_for_status
from .host import PagedKVCache


class Engine:
    """Block manager, device store and decode graph of one KV cache (see the module docstring).

    Parameters
    ----------
    config : the cache's KVCacheConfig; ``num_blocks`` sealed blocks, ``max_seqs`` sequences.
    num_q_heads : query heads of the model (a multiple of ``config.num_kv_heads``).
    max_seq_len : longest sequence (default: what the pool holds, up to 131072).
    batch_buckets, backend, scale, options : passed to :class:`hexcore.cuda.DecodeGraph`.
    metrics : an optional ``MetricsCollector`` for the block manager.
    """

    def __init__(self, config: KVCacheConfig, num_blocks: int, max_seqs: int, num_q_heads: int, *,
                 max_seq_len: int | None = None, batch_buckets=None, backend: str = "auto",
                 scale: float | None = None, options=None, metrics=None):
        from .cuda import DecodeGraph, DeviceKVStore
        from .cuda.steps.graph import DEFAULT_BUCKETS

        self.cache = PagedKVCache(config, num_blocks, max_seqs, metrics, max_seq_len=max_seq_len)
        self.store = DeviceKVStore(config, num_blocks, max_seqs)
        self.graph = DecodeGraph(self.store, num_q_heads, self.cache.max_blocks_per_seq,
                                 batch_buckets=DEFAULT_BUCKETS if batch_buckets is None else batch_buckets,
                                 scale=scale, backend=backend, options=options)
        self.config, self.num_q_heads = config, num_q_heads
        self._forks: list = []  # (parent, child) tail copies not yet made

    # -- sequences ------------------------------------------------------------------
    def add(self, seq_id: int | None = None) -> int:
        """A new, empty sequence; its id (= its tail slot)."""
        return self.cache.add_sequence(seq_id)

    def fork(self, parent: int) -> int:
        """A sequence sharing ``parent``'s tokens (sealed blocks by reference); its id. The
        tail copy runs with the next step or prefill."""
        child = self.cache.fork_sequence(parent)
        self._forks.append((parent, child))
        return child

    def finish(self, seq_id: int) -> None:
        """Free ``seq_id``'s tail and its references to blocks."""
        self.cache.free_sequence(seq_id)
        self._forks = [(p, c) for p, c in self._forks if c != seq_id]

    def seq_len(self, seq_id: int) -> int:
        """Tokens cached for ``seq_id``."""
        return self.cache.seq_len(seq_id)

    # -- writing a prompt -------------------------------------------------------------
    def prefill(self, seq_id: int, k, v, stream=None) -> None:
        """Append a prompt's K/V to ``seq_id``, sealing every block it fills.

        ``k``, ``v``: float16 ``[L, n, H, D]`` (host arrays, device arrays or CUDA tensors).
        The attention over the prompt itself is the model's (e.g. SDPA); this stores its K/V.
        A failure (out of blocks, a bad array) raises before the store or the tables change.
        """
        from .cuda import append, seal
        from .cuda.arrays import checked

        n = _rows(k, v, self.config)
        cfg = self.config
        shape = (cfg.num_layers, n, cfg.num_kv_heads, cfg.head_dim)
        k, v = checked(k, "k", np.float16, shape), checked(v, "v", np.float16, shape)  # one copy of host arrays
        seq_id = as_int("seq_id", seq_id)
        start = self.cache.seq_len(seq_id)
        self._copy_forks(stream)
        blocks = self.cache.grow_sequence(seq_id, start + n)  # raises before anything is written
        bs, done, sealed = self.config.block_size, 0, 0
        while done < n:
            pos = (start + done) % bs
            take = min(n - done, bs - pos)
            append(self.store, k, v, np.full(take, seq_id, np.int32), np.arange(pos, pos + take, dtype=np.int32),
                   stream=stream, rows=(done, take))
            done += take
            if pos + take == bs:
                seal(self.store, np.array([seq_id], np.int32), np.array([blocks[sealed]], np.int32), stream=stream)
                sealed += 1

    # -- decode steps ----------------------------------------------------------------
    def buffers(self, batch: int):
        """The (q, k, v, out) views of a step of ``batch`` sequences (fill them before running)."""
        return self.graph.buffers(batch)

    def step(self, seq_ids) -> "EngineStep":
        """One decode step for ``seq_ids`` (each grows by one token): the block manager's part.

        All or nothing: when an entry cannot grow (not live, listed twice, at its maximum
        length, or the pool is short of blocks) its typed error is raised and nothing changed.
        """
        ids = seq_ids if isinstance(seq_ids, np.ndarray) else np.asarray(seq_ids, dtype=np.int32)
        status, index = self.cache.can_step(ids)
        if status is not Status.OK:
            what = "the pool is short of blocks" if index < 0 else f"seq_ids[{index}] = {ids[index]}"
            raise_for_status(status, f"step: {what} ({status.name}); nothing changed")
        result = self.cache.step(ids)
        result.raise_for_status()  # cannot fail after can_step; kept as a guard
        forks, self._forks = self._forks, []
        return EngineStep(self, result, forks)

    def _copy_forks(self, stream) -> None:
        if self._forks:
            from .cuda import copy_tails

            src, dst = (np.array(x, np.int32) for x in zip(*self._forks))
            copy_tails(self.store, src, dst, stream=stream)
            self._forks = []


class EngineStep:
    """One decode step of an :class:`Engine`: ``buffers`` to fill, then ``run()`` (all
    layers) or ``attend(layer)`` per layer. ``result`` is the block manager's StepResult."""

    def __init__(self, engine: Engine, result, forks):
        self.engine, self.result = engine, result
        self.batch = int(result.seq_lens.shape[0])
        self.buffers = engine.graph.buffers(self.batch)
        self._forks = np.array(forks, np.int32).reshape(-1, 2)
        self._loaded = None

    def _indices(self) -> dict:
        r = self.result
        forks = self._forks
        return dict(block_tables=r.block_tables, seq_lens=r.seq_lens, tail_slots=r.tail_slots,
                    seal_slots=r.seal_slots, seal_blocks=r.seal_blocks,
                    fork_src=np.ascontiguousarray(forks[:, 0]) if len(forks) else None,
                    fork_dst=np.ascontiguousarray(forks[:, 1]) if len(forks) else None)

    def write(self, q, k, v) -> None:
        """Copy host arrays into the step's buffers: ``q`` ``[L, B, num_q_heads, D]``, ``k``,
        ``v`` ``[L, B, num_kv_heads, D]`` float16 (a convenience for tests and demos; a model
        writes the views directly)."""
        for view, host, name in zip(self.buffers[:3], (q, k, v), "qkv"):
            host = np.asarray(host)
            if host.dtype != np.float16 or tuple(host.shape) != tuple(view.shape):
                raise HexcoreInvalidArgumentError(f"{name}: expected float16 {tuple(view.shape)}, got "
                                                  f"{host.dtype} {tuple(host.shape)}")
            if hasattr(view, "copy_"):  # a torch view
                import torch

                view.copy_(torch.from_numpy(np.ascontiguousarray(host)))
            else:
                for layer in range(host.shape[0]):
                    view[layer].copy_to_device(np.ascontiguousarray(host[layer]))

    def output(self) -> np.ndarray:
        """``buffers.out`` on the host: float16 ``[L, B, num_q_heads, D]`` (synchronises)."""
        out = self.buffers.out
        if hasattr(out, "cpu"):
            return out.cpu().numpy()
        return np.stack([out[layer].copy_to_host() for layer in range(out.shape[0])])

    def run(self, stream=None):
        """Fork copies, append, seal and attention for every layer; returns ``buffers.out``."""
        if self._loaded is not None:
            raise HexcoreInvalidArgumentError("run: this step was already loaded by attend()")
        self._loaded = True
        return self.engine.graph.step(**self._indices(), stream=stream)

    def attend(self, layer: int, stream=None):
        """Append, seal and attention for one layer (``buffers.q/k/v[layer]`` filled);
        returns ``buffers.out[layer]``. The first call copies the step's indices."""
        if self._loaded is True:
            raise HexcoreInvalidArgumentError("attend: this step already ran whole")
        if self._loaded is None:
            self._loaded = self.engine.graph.load(**self._indices(), stream=stream)
        self._loaded.enqueue(layer, self.engine.graph._resolve(stream).numba)
        return self.buffers.out[layer]


def _rows(k, v, config: KVCacheConfig) -> int:
    shape = tuple(getattr(k, "shape", ()))
    expect = (config.num_layers, None, config.num_kv_heads, config.head_dim)
    if len(shape) != 4 or any(e is not None and e != a for e, a in zip(expect, shape)):
        raise HexcoreInvalidArgumentError(f"k: expected shape ({config.num_layers}, n, {config.num_kv_heads}, "
                                          f"{config.head_dim}), got {shape}")
    if tuple(getattr(v, "shape", ())) != shape:
        raise HexcoreInvalidArgumentError(f"v: expected shape {shape} like k, got {tuple(getattr(v, 'shape', ()))}")
    return shape[1]
