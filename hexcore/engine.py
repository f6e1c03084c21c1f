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

With ``speculative=True`` the Engine also runs the speculative allocator
(:class:`hexcore.host.SpeculativeAllocator`): each ``step`` predicts the sequences whose
new token seals a block and reserves their blocks before the block manager's step (a
producer thread may push its own predictions through ``engine.speculative.predict``);
``engine.speculative.stats()`` counts hits, misses and mispredicted reservations.

With ``prefix_cache=True`` a request's cached prefix is shared and only the rest prefilled::

    adm = engine.admit(tokens)             # Admission(seq_id, cached_tokens); tokens: int32 [n]
    new = tokens[adm.cached_tokens:]       # the model runs these, and per layer l:
    out_l = engine.prefill_attention(adm.seq_id, l, q_l, k_l, v_l)   # [n_new, heads, D]: over the cache + themselves
    engine.prefill(adm.seq_id, k, v, tokens=new)                      # then store their K/V: [L, n_new, H, D]

The low-level calls (``hexcore.host``, ``hexcore.cuda``) stay public for engines that
need another order.
"""

from __future__ import annotations

import numpy as np

from ._checks import as_int
from .config import KVCacheConfig
from .errors import (HexcoreConfigError, HexcoreInvalidArgumentError, HexcoreInvalidSequenceError, Status,
                     raise_for_status)
from .host import PagedKVCache
from .host.prefix import DEFAULT_PRIORITY, as_tokens
from .host.speculative import SpeculativeAllocator, next_sealers

SPECULATIVE_OPTIONS = ("ring", "capacity", "reserve_floor", "max_reserved")  # SpeculativeAllocator's keywords
FAULT_OPTIONS = ("policy", "sample_every", "scrub_blocks", "metrics", "decode_layers",  # fault_tolerance's
                 "max_verify_blocks")


class Engine:
    """Block manager, device store and decode graph of one KV cache (see the module docstring).

    Parameters
    ----------
    config : the cache's KVCacheConfig; ``num_blocks`` sealed blocks, ``max_seqs`` sequences.
    num_q_heads : query heads of the model (a multiple of ``config.num_kv_heads``).
    max_seq_len : longest sequence (default: what the pool holds, up to 131072).
    batch_buckets, backend, scale, options : passed to :class:`hexcore.cuda.DecodeGraph`
        (``scale`` also to :meth:`prefill_attention`).
    metrics : an optional ``MetricsCollector`` for the block manager.
    prefix_cache : cache sealed blocks by their token ids and share them with later
        requests (``PagedKVCache(prefix_cache=True)``; :meth:`admit`).
    speculative : ``True`` to reserve the blocks a step's sequences seal into before the
        step (``engine.speculative``, a :class:`~hexcore.host.SpeculativeAllocator`), or a
        dict of its options (``ring``, ``capacity``, ``reserve_floor``, ``max_reserved``);
        ``False`` (the default): no reservations, ``engine.speculative`` is None.
    format, pool_blocks : a format by age (``hexcore.quant.KVFormat`` or a name such as
        ``"int2-aged"``, ``docs/formats.md``) and the blocks of each of its pools (a dict
        kind name -> count; ``num_blocks`` is then unused): the Engine holds a
        ``TieredKVCache`` (``engine.cache``) and a store per pool (``engine.stores``), and
        runs steps with eager launches (``engine_tiered.py``; ``engine.graph`` and
        ``engine.store`` are None). Not with ``prefix_cache``, ``speculative``,
        ``fault_tolerance``, ``batch_buckets``, ``backend``, ``metrics`` (HexcoreConfigError),
        truncation or the prefill attention helpers; ``pool_blocks`` only with a format.
    fault_tolerance : ``True`` or a dict of :class:`~hexcore.FaultTolerantKVCache` options
        (``policy``, ``sample_every``, ``scrub_blocks``, ``metrics``, ``decode_layers``) and
        the graph's ``max_verify_blocks`` (default 1024): ``engine.faults`` records every
        seal's digest and each step checks the policy's sample of its blocks inside the
        step's launches, or with ``decode_layers`` that many whole layers in turn inside the
        decode (``FaultTolerantKVCache.graph_step``); :meth:`check` reads the outcome. ``False``
        (the default): ``engine.faults`` is None and the steps are unchanged.
    """

    def __init__(self, config: KVCacheConfig, num_blocks: int, max_seqs: int, num_q_heads: int, *,
                 max_seq_len: int | None = None, batch_buckets=None, backend: str = "auto",
                 scale: float | None = None, options=None, metrics=None, prefix_cache: bool = False,
                 speculative: bool | dict = False, fault_tolerance: bool | dict = False, format=None,
                 pool_blocks: dict | None = None):
        from .cuda import DecodeGraph, DeviceKVStore
        from .cuda.steps.graph import DEFAULT_BUCKETS

        self.config, self.num_q_heads, self.scale = config, num_q_heads, scale
        self._forks: list = []  # (parent, child) tail copies not yet made
        self._tiered = None
        if format is not None:
            as_int("num_blocks", num_blocks, low=0)  # (unused: pool_blocks sizes the pools)
            unused = dict(batch_buckets=batch_buckets is not None, backend=backend != "auto",
                          metrics=metrics is not None)
            self._init_tiered(format, pool_blocks, max_seqs, max_seq_len, options, prefix_cache=prefix_cache,
                              speculative=speculative, fault_tolerance=fault_tolerance, **unused)
            return
        if pool_blocks is not None:
            raise HexcoreConfigError("pool_blocks: only with a format by age (format=None)")
        speculative = _options("speculative", speculative, SPECULATIVE_OPTIONS, "SpeculativeAllocator")
        faults = _options("fault_tolerance", fault_tolerance, FAULT_OPTIONS, "FaultTolerantKVCache")
        self.cache = PagedKVCache(config, num_blocks, max_seqs, metrics, max_seq_len=max_seq_len,
                                  prefix_cache=prefix_cache)
        # the speculative allocator (None when off): every allocating call goes through it, so it counts
        self.speculative = None if speculative is None else SpeculativeAllocator(self.cache, **speculative)
        self._owner = self.cache if self.speculative is None else self.speculative
        self.store = DeviceKVStore(config, num_blocks, max_seqs)
        graph_options = dict(batch_buckets=DEFAULT_BUCKETS if batch_buckets is None else batch_buckets, scale=scale,
                             backend=backend, options=options)
        self.faults = None
        if faults is None:
            self.graph = DecodeGraph(self.store, num_q_heads, self.cache.max_blocks_per_seq, **graph_options)
        else:
            from .fault import FaultTolerantKVCache

            max_verify = faults.pop("max_verify_blocks", 1024)
            self.faults = FaultTolerantKVCache(self.cache, self.store, **faults)
            self.graph = self.faults.decode_graph(num_q_heads, max_verify, **graph_options)

    def _init_tiered(self, fmt, pool_blocks, max_seqs, max_seq_len, options, **not_with_a_format) -> None:
        """The parts of a format by age; ``not_with_a_format``: the options it does not take,
        each False unless the caller gave it (HexcoreConfigError naming it)."""
        from .engine_tiered import TieredParts

        for name, value in not_with_a_format.items():
            if value is not False:
                raise HexcoreConfigError(f"{name}: not with a format by age (format={fmt!r:.40})")
        self._tiered = TieredParts(self.config, fmt, pool_blocks, max_seqs, self.num_q_heads, max_seq_len,
                                   self.scale, options)
        self.cache, self.stores = self._tiered.cache, self._tiered.stores
        self.store = self.graph = self.speculative = self.faults = None
        self._owner = self.cache

    @property
    def format(self):
        """The format by age this Engine holds its blocks in (a ``hexcore.quant.KVFormat``),
        or None for one kind of block (``config.kv_dtype``)."""
        return None if self._tiered is None else self.cache.format

    def _not_tiered(self, what: str) -> None:
        if self._tiered is not None:
            raise HexcoreConfigError(f"{what}: not with a format by age ({self.cache.format.name})")

    # -- sequences ------------------------------------------------------------------
    def add(self, seq_id: int | None = None) -> int:
        """A new, empty sequence; its id (= its tail slot)."""
        return self.cache.add_sequence(seq_id)

    def admit(self, tokens, *, namespace: int = 0, priority: int = DEFAULT_PRIORITY, leave_last: bool = True):
        """A new sequence for a request of ``tokens`` (int32 [n]) that shares the request's
        longest cached prefix (whole blocks): ``Admission(seq_id, cached_tokens)``.

        The sequence starts ``cached_tokens`` long; run the model over
        ``tokens[cached_tokens:]`` with :meth:`prefill_attention` per layer, then store their
        K/V with ``prefill(seq_id, k, v, tokens=tokens[cached_tokens:])`` so its blocks are
        cached in turn. ``namespace``, ``priority``, ``leave_last``: see
        :meth:`hexcore.host.PagedKVCache.admit` (with the prefix cache off this is :meth:`add`
        and ``cached_tokens`` is 0).
        """
        self._not_tiered("admit")
        return self.cache.admit(tokens, namespace=namespace, priority=priority, leave_last=leave_last)

    def fork(self, parent: int) -> int:
        """A sequence sharing ``parent``'s tokens (sealed blocks by reference); its id. The
        tail copy runs with the next step or prefill."""
        if self._tiered is not None:
            return self._tiered.fork(parent)
        child = self.cache.fork_sequence(parent)
        # a parent whose own tail copy is pending holds its parent's tail: copy from that one,
        # so no pending copy reads a tail another one writes (one launch copies them all)
        source = next((p for p, c in self._forks if c == parent), parent)
        if any(p == child for p, _ in self._forks):  # the child's slot is a pending source (it was
            self._copy_forks(None)                    # finished): copy out of it before it is overwritten
        self._forks.append((source, child))
        return child

    def finish(self, seq_id: int) -> None:
        """Free ``seq_id``'s tail and its references to blocks (a block reserved for its next
        seal goes back to the pool, counted as mispredicted)."""
        if self._tiered is not None:
            return self._tiered.finish(seq_id)
        self._owner.free_sequence(seq_id)
        self._forks = [(p, c) for p, c in self._forks if c != seq_id]

    def truncate(self, seq_id: int, new_len: int) -> int:
        """Shrink ``seq_id`` to ``new_len`` tokens (inside its open tail, or to a block
        boundary: ``PagedKVCache.truncate_sequence``); the number of sealed blocks it let
        go. Nothing moves on the device: decode reads ``seq_len`` rows, and the next append
        overwrites the stale tail rows."""
        self._not_tiered("truncate")
        return self.cache.truncate_sequence(seq_id, new_len)

    def seq_len(self, seq_id: int) -> int:
        """Tokens cached for ``seq_id``."""
        return self.cache.seq_len(seq_id)

    # -- writing a prompt -------------------------------------------------------------
    def prefill(self, seq_id: int, k, v, stream=None, tokens=None) -> None:
        """Append a prompt's K/V to ``seq_id``, sealing every block it fills: at most four
        launches whatever its length (complete the open tail and seal it, seal the whole
        blocks straight from the rows, append the rest into the tail).

        ``k``, ``v``: float16 ``[L, n, H, D]`` (host arrays, device arrays or CUDA tensors).
        ``tokens``: their token ids, int32 [n], with the prefix cache on (so the blocks
        sealed are cached for later requests; without them the sequence's later blocks are
        not). The attention over the prompt is :meth:`prefill_attention` (or the model's
        own); this stores its K/V. A failure (out of blocks, a bad array, tokens of another
        length) raises before the store or the tables change.
        """
        from .cuda import append, seal, seal_rows
        from .cuda.arrays import check_distinct, check_id_range, checked
        from .cuda.streams import resolve_stream
        from .cuda.uploads import upload_once

        n = _rows(k, v, self.config)
        if self._tiered is not None:
            if tokens is not None:
                raise HexcoreConfigError("tokens: a format by age has no prefix cache")
            return self._tiered.prefill(seq_id, k, v, stream)
        cfg = self.config
        stream = resolve_stream(stream, k, v)  # (every launch below on it; a bad one raises before anything changes)
        shape = (cfg.num_layers, n, cfg.num_kv_heads, cfg.head_dim)
        k, v = checked(k, "k", np.float16, shape), checked(v, "v", np.float16, shape)  # one copy of host arrays
        seq_id = as_int("seq_id", seq_id)
        start = self.cache.seq_len(seq_id)
        blocks = np.asarray(self._owner.grow_sequence(seq_id, start + n, tokens), np.int32)  # raises first
        self._copy_forks(stream)  # (before the appends: a pending fork copies a tail they overwrite)
        plan = _prefill_plan(seq_id, start, n, cfg.block_size, blocks)
        check_id_range(blocks, "block_ids", None, self.store.num_blocks)  # as the seals checked their host ids
        check_distinct(blocks, "block_ids")
        ids = dict(zip(plan, upload_once(list(plan.values())))) if plan else {}  # one copy of every id array
        head, rest = len(plan.get("head_slots", ())), len(plan.get("rest_slots", ()))
        if head:
            append(self.store, k, v, ids["head_slots"], ids["head_positions"], stream=stream, rows=(0, head))
        if "seal_block" in ids:
            seal(self.store, ids["seal_slot"], ids["seal_block"], stream=stream)
        if "row_blocks" in ids:
            seal_rows(self.store, k, v, head, ids["row_blocks"], stream=stream)
        if rest:
            append(self.store, k, v, ids["rest_slots"], ids["rest_positions"], stream=stream, rows=(n - rest, rest))
        sealed = len(plan.get("seal_block", ())) + len(plan.get("row_blocks", ()))
        if sealed and self.faults is not None:
            self.faults.record(blocks[:sealed], stream)  # their digests, for the steps' checks

    def prefill_attention(self, seq_id: int, layer: int, q, k, v, out=None, backend: str = "auto", stream=None):
        """Causal attention of ``seq_id``'s new tokens over the tokens it holds now (sealed
        blocks dequantized, its tail) plus themselves, for one layer.

        ``q``: float16 ``[n, num_q_heads, D]``; ``k``, ``v``: float16 ``[n, H, D]``, the new
        tokens' K/V of ``layer`` (call before :meth:`prefill` stores them). Returns ``out``
        ``[n, num_q_heads, D]`` (see :func:`hexcore.cuda.prefill_attention` for ``out``,
        ``backend`` and ``stream``). A pending fork copy runs first (the tail is read).
        """
        self._not_tiered("prefill_attention")
        from .cuda import prefill_attention, resolve_stream

        seq_id = as_int("seq_id", seq_id)
        table, prefix_len = self.cache.block_table(seq_id), self.cache.seq_len(seq_id)
        self._copy_forks(resolve_stream(stream, q, k, v, out))  # (the stream the attention runs on)
        return prefill_attention(q, k, v, self.store, layer, table, prefix_len, seq_id, out=out, scale=self.scale,
                                 backend=backend, stream=stream)

    def prefill_attention_batch(self, seq_ids, layer: int, q, k, v, n_new, out=None, backend: str = "auto",
                                stream=None, rows=None):
        """:meth:`prefill_attention` of several sequences at once: one gather launch into a
        padded scratch and one attention call (:func:`hexcore.cuda.prefill_attention_batch`).

        ``seq_ids``: ``B`` distinct live sequences; ``q``: float16 ``[B, n_max, num_q_heads,
        D]``; ``k``, ``v``: float16 ``[B, n_max, H, D]``; ``n_new``: host int32 ``[B]``, row
        ``r``'s first ``n_new[r]`` entries being its new tokens (the rest padding). ``rows``:
        :meth:`batch_rows` of the same sequences, ``n_new`` and ``n_max``, made once for all
        the layers of a forward (then ``n_new`` is None); without it each call builds and
        copies them. Returns ``out`` ``[B, n_max, num_q_heads, D]``. Pending fork copies run
        first.
        """
        self._not_tiered("prefill_attention_batch")
        from .cuda import BatchRows, prefill_attention_batch, resolve_stream

        if rows is None:
            ids, padded, prefix = self._batch_tables(seq_ids)
            args = (padded, prefix, ids, n_new)
        elif n_new is not None or (isinstance(rows, BatchRows) and not _same_seq_ids(seq_ids, rows.tail_slots)):
            raise HexcoreInvalidArgumentError("rows: made for other sequences than seq_ids (and n_new must then "
                                              "be None)")
        else:
            args = (None,) * 4
        self._copy_forks(resolve_stream(stream, q, k, v, out))  # (the stream the attention runs on)
        return prefill_attention_batch(q, k, v, self.store, layer, *args, out=out, scale=self.scale, backend=backend,
                                       stream=stream, rows=rows)

    def batch_rows(self, seq_ids, n_new, n_max: int):
        """The rows of :meth:`prefill_attention_batch` for ``seq_ids`` (``B`` distinct live
        sequences), ``n_new`` (host int32 ``[B]``) and ``n_max`` (``k.shape[1]``): their block
        tables, cached lengths and new-token counts checked and copied to the device once
        (a :class:`hexcore.cuda.BatchRows`, valid until one of the sequences changes)."""
        self._not_tiered("batch_rows")
        from .cuda import BatchRows

        ids, padded, prefix = self._batch_tables(seq_ids)
        return BatchRows(self.store, ids.shape[0], n_max, padded, prefix, ids, n_new)

    def live_seq_ids(self, seq_ids, allow_empty: bool = False) -> list:
        """``seq_ids`` (a 1-D sequence of ints) as a list of distinct live sequence ids.

        A malformed list, an empty one (unless ``allow_empty``) or an id listed twice raises
        HexcoreInvalidArgumentError, an id that is not live HexcoreInvalidSequenceError, each
        naming the entry. Reads nothing on a device."""
        if not isinstance(allow_empty, (bool, np.bool_)):
            raise HexcoreInvalidArgumentError(f"allow_empty: expected a bool, got {type(allow_empty).__name__}")
        ids = _as_seq_ids(seq_ids).tolist()
        if not ids and not allow_empty:
            raise HexcoreInvalidArgumentError("seq_ids: expected at least one sequence, got none")
        first: dict = {}
        for i, seq in enumerate(ids):
            if seq in first:
                raise HexcoreInvalidArgumentError(f"seq_ids[{i}]: sequence {seq} is listed twice "
                                                  f"(also seq_ids[{first[seq]}])")
            first[seq] = i
            if not self.cache.is_live(seq):
                raise HexcoreInvalidSequenceError(f"seq_ids[{i}]: {seq} is not a live sequence of this engine")
        return ids

    def _batch_tables(self, seq_ids) -> tuple:
        # (ids, block tables padded with 0 [B, W >= 1], cached lengths), host int32; the
        # sequences distinct and live; a sequence's tail slot is its id
        ids = np.array(self.live_seq_ids(seq_ids, allow_empty=True), np.int32)
        tables = [self.cache.block_table(int(s)) for s in ids]
        padded = np.zeros((ids.shape[0], max([1] + [t.shape[0] for t in tables])), np.int32)
        for r, table in enumerate(tables):
            padded[r, :table.shape[0]] = table
        return ids, padded, np.array([self.cache.seq_len(int(s)) for s in ids], np.int32)

    # -- decode steps ----------------------------------------------------------------
    def buffers(self, batch: int):
        """The (q, k, v, out) views of a step of ``batch`` sequences (fill them before running)."""
        if self._tiered is not None:
            return self._tiered.buffers(batch)
        return self.graph.buffers(batch)

    def check(self, stream=None) -> None:
        """Raise HexcoreCorruptionError for what the steps since the last call found (with
        ``fault_tolerance``: ``FaultTolerantKVCache.check_graph``; synchronises ``stream``,
        one 8-byte read when all is well). Without ``fault_tolerance`` it raises
        HexcoreConfigError: there is nothing to check."""
        self._not_tiered("check")
        if self.faults is None:
            raise HexcoreConfigError("check: this Engine was built without fault_tolerance")
        self.faults.check_graph(self.graph, stream)

    def step(self, seq_ids, tokens=None) -> "EngineStep":
        """One decode step for ``seq_ids`` (each grows by one token): the block manager's part.

        ``tokens``: with the prefix cache on, each sequence's new token id (int32 [B]), so the
        blocks it seals are cached (without them its later blocks are not).
        All or nothing: when an entry cannot grow (not live, listed twice, at its maximum
        length, or the pool is short of blocks) or ``tokens`` is malformed, its typed error
        is raised and nothing changed. With ``speculative`` on, the sequences whose new token
        seals get a reserved block once the step is known to fit (``speculative.stats()``
        counts the seals it serves as hits); a producer's pending predictions are applied
        first, and when the pool is short the blocks they reserved are released (mispredicted)
        before the step is refused.
        """
        ids = _as_seq_ids(seq_ids)
        if self._tiered is not None:
            if tokens is not None:
                raise HexcoreConfigError("tokens: a format by age has no prefix cache")
            return self._tiered.step(ids)
        if tokens is not None:
            tokens = as_tokens("tokens", tokens)
            if tokens.shape != ids.shape:
                raise HexcoreInvalidArgumentError(f"tokens: expected one token id per sequence, shape {ids.shape}, "
                                                  f"got {tokens.shape}")
        if self.speculative is not None:
            self.speculative.apply()  # a producer's predictions first: the check sees their reservations
        self._check_step(ids)
        if self.speculative is not None:
            self._predict_sealers(ids)
        result = self._owner.step(ids, tokens=tokens)  # the allocator's step applies the predictions first
        result.raise_for_status()  # cannot fail after _check_step; kept as a guard
        forks, self._forks = self._forks, []
        return EngineStep(self, result, forks)

    def _check_step(self, ids: np.ndarray) -> None:
        """Raise the typed error of a step of ``ids`` that cannot run (see :meth:`step`)."""
        status, index = self.cache.can_step(ids)
        if status is Status.OUT_OF_MEMORY and self.speculative is not None and self.speculative.release_all():
            status, index = self.cache.can_step(ids)  # the blocks parked for predictions are free again
        if status is not Status.OK:
            what = "the pool is short of blocks" if index < 0 else f"seq_ids[{index}] = {ids[index]}"
            raise_for_status(status, f"step: {what} ({status.name}); nothing changed")

    def _predict_sealers(self, ids: np.ndarray) -> None:
        """Push the sequences among ``ids`` whose next token fills their tail into the
        speculative allocator's ring (its step reserves their blocks, then seals into them)."""
        lens = self.cache.seq_lens(ids).astype(np.int64)
        sealers = np.empty(len(ids), np.int64)
        count = next_sealers(ids.astype(np.int64), lens, 1, self.config.block_size, sealers)
        if count:
            self.speculative.predict(sealers[:count])

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
        """Fork copies, append, seal and attention for every layer; returns ``buffers.out``.
        A bad ``stream`` raises before anything runs (the step can run after)."""
        if self._loaded is not None:
            done = "ran" if self._loaded is True else "was started by attend()"
            raise HexcoreInvalidArgumentError(f"run: this step already {done}")
        faults = self.engine.faults
        if faults is not None:  # the same step, with its sample verified and its seals recorded
            i = self._indices()
            out = faults.graph_step(self.engine.graph, self.result, i["fork_src"], i["fork_dst"], stream)
        else:
            out = self.engine.graph.step(**self._indices(), stream=stream)
        self._loaded = True  # (after the step: a refused one can run again)
        return out

    def attend(self, layer: int, stream=None):
        """Append, seal and attention for one layer (``buffers.q/k/v[layer]`` filled);
        returns ``buffers.out[layer]``. The first call copies the step's indices."""
        from .cuda.arrays import checked_layer

        if self._loaded is True:
            raise HexcoreInvalidArgumentError("attend: this step already ran whole")
        layer = checked_layer(layer, self.engine.config.num_layers)[0]  # (before the step's indices are loaded)
        stream = self.engine.graph._resolve(stream)
        if self._loaded is None:
            faults = self.engine.faults
            if faults is not None:  # layer 0 carries the verification, the last layer the seals' record
                i = self._indices()
                self._loaded = faults.graph_load(self.engine.graph, self.result, i["fork_src"], i["fork_dst"], stream)
            else:
                self._loaded = self.engine.graph.load(**self._indices(), stream=stream)
        self._loaded.enqueue(layer, stream.numba)
        return self.buffers.out[layer]


def _options(name: str, value, allowed: tuple, owner: str) -> dict | None:
    """``Engine(name=value)`` for an optional part: True -> {} (its defaults), False -> None
    (off), a dict of ``allowed`` keywords -> a copy; anything else raises
    HexcoreInvalidArgumentError naming ``name`` and the value."""
    if isinstance(value, (bool, np.bool_)):
        return {} if value else None
    if not isinstance(value, dict):
        raise HexcoreInvalidArgumentError(f"{name}: expected True, False or a dict of {owner} options, "
                                          f"got {value!r}")
    unknown = sorted(str(key) for key in value if key not in allowed)
    if unknown:
        raise HexcoreInvalidArgumentError(f"{name}: unknown option(s) {unknown}; expected some of {list(allowed)}")
    return dict(value)


def _prefill_plan(seq_id: int, start: int, n: int, block_size: int, blocks: np.ndarray) -> dict:
    """The host int32 id arrays of :meth:`Engine.prefill`'s launches for ``n`` rows after the
    ``start`` that sequence ``seq_id`` holds, ``blocks`` the blocks its growth seals, in
    order (``grow_sequence``'s): ``head_slots``,
    ``head_positions`` ``[head]`` (the rows completing the open tail), ``seal_slot``,
    ``seal_block`` ``[1]`` (when they fill it), ``row_blocks`` ``[full]`` (whole blocks sealed
    from the rows), ``rest_slots``, ``rest_positions`` ``[rest]`` (the rows left in the new
    tail); a part with no rows is left out. Each comes from the engine's own state, so is in
    range and distinct by construction (the launches' host checks have nothing to find)."""
    pos = start % block_size
    head = min(n, (block_size - pos) % block_size)
    full = (n - head) // block_size
    rest = n - head - full * block_size
    first, plan = 0, {}
    if head:
        plan.update(head_slots=np.full(head, seq_id, np.int32),
                    head_positions=np.arange(pos, pos + head, dtype=np.int32))
        if pos + head == block_size:
            plan.update(seal_slot=np.array([seq_id], np.int32), seal_block=blocks[first:first + 1])
            first += 1
    if full:
        plan["row_blocks"] = blocks[first:first + full]
    if rest:
        plan.update(rest_slots=np.full(rest, seq_id, np.int32), rest_positions=np.arange(rest, dtype=np.int32))
    return plan


def _rows(k, v, config: KVCacheConfig) -> int:
    shape = tuple(getattr(k, "shape", ()))
    expect = (config.num_layers, None, config.num_kv_heads, config.head_dim)
    if len(shape) != 4 or any(e is not None and e != a for e, a in zip(expect, shape)):
        raise HexcoreInvalidArgumentError(f"k: expected shape ({config.num_layers}, n, {config.num_kv_heads}, "
                                          f"{config.head_dim}), got {shape}")
    if tuple(getattr(v, "shape", ())) != shape:
        raise HexcoreInvalidArgumentError(f"v: expected shape {shape} like k, got {tuple(getattr(v, 'shape', ()))}")
    return shape[1]


def _same_seq_ids(seq_ids, ids: np.ndarray) -> bool:
    """Whether ``seq_ids`` lists exactly the int32 ``ids`` (a BatchRows' sequences), in order.
    A list or tuple of Python ints equal to them (what a caller passes at every layer) is
    found so in a few microseconds; anything else goes through :func:`_as_seq_ids`, as
    before, with its typed errors."""
    if type(seq_ids) in (list, tuple) and all(type(s) is int for s in seq_ids) and list(seq_ids) == ids.tolist():
        return True
    return np.array_equal(_as_seq_ids(seq_ids), ids)


def _as_seq_ids(seq_ids) -> np.ndarray:
    """``seq_ids`` as an int32 ``[B]`` array; anything else (a scalar, NaN, an int beyond
    int32, a nested list) raises HexcoreInvalidArgumentError naming it."""
    if isinstance(seq_ids, np.ndarray) and seq_ids.dtype == np.int32 and seq_ids.ndim == 1:
        return seq_ids
    try:
        if isinstance(seq_ids, (str, bytes)) or not hasattr(seq_ids, "__len__"):
            raise TypeError
        items = list(seq_ids)  # (a 0-d array or tensor has __len__ but cannot be iterated)
    except TypeError:
        raise HexcoreInvalidArgumentError(f"seq_ids: expected a 1-D sequence of ints, got {seq_ids!r}") from None
    values = [as_int(f"seq_ids[{i}]", s, -2**31, 2**31 - 1) for i, s in enumerate(items)]
    return np.array(values, dtype=np.int32)
