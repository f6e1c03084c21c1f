"""DecodeStep: one decode step's launches, bound to a batch bucket's static buffers.

A bucket of ``Bb`` rows owns these device buffers (L layers)::

    q, out : float16 [L, Bb, num_q_heads, D]        k, v : float16 [L, Bb, H, D]
    index  : int32, one buffer, read by every launch of a step:
        seq_lens | tail_slots | positions | seal_slots | seal_blocks | fork_src | fork_dst
        (each [Bb]), then block_tables [Bb, width] (width = sealed blocks of the context bucket)

Rows past the batch are padding: seq_len 0 (the decode writes zeros), slot and block
ids -1 (append, seal and copy skip them). Every launch is a :class:`PreparedLaunch`
made once, so ``enqueue`` and ``enqueue_all`` are capture-safe: no allocation, no
synchronisation, no device-to-host read.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from ...errors import HexcoreInvalidArgumentError
from ..attention.launcher import Workspace, decode_launch
from ..attention.options import DEFAULT_OPTIONS, DecodeOptions
from ..blocks import prepare_copy_tails
from ..launch import PreparedLaunch
from ..write import prepare_append, prepare_seal

# The index buffer, described once: row k of ROWS is entries [k * Bb, (k + 1) * Bb), its
# padding value PADDING[k]; the block tables follow at TABLES_ROW * Bb.
ROWS = ("seq_lens", "tail_slots", "positions", "seal_slots", "seal_blocks", "fork_src", "fork_dst")
SEQ_LENS, TAIL_SLOTS, POSITIONS, SEAL_SLOTS, SEAL_BLOCKS, FORK_SRC, FORK_DST = range(len(ROWS))
TABLES_ROW = len(ROWS)
PADDING = (0, -1, -1, -1, -1, -1, -1)  # the value of a padding row in each of ROWS


class StepBuffers:
    """The static device buffers of one batch bucket (see the module docstring).

    Attributes: ``q``, ``k``, ``v``, ``out`` (numba device arrays), ``index`` (the int32
    buffer), ``rows`` (name -> its ``[Bb]`` view), ``bucket`` (Bb).
    """

    def __init__(self, store, num_q_heads: int, bucket: int, max_blocks_per_seq: int):
        cfg = store.config
        L, H, D = cfg.num_layers, cfg.num_kv_heads, cfg.head_dim
        self.store, self.bucket, self.max_blocks_per_seq = store, bucket, max_blocks_per_seq
        self.q = cuda.to_device(np.zeros((L, bucket, num_q_heads, D), np.float16))
        self.out = cuda.to_device(np.zeros((L, bucket, num_q_heads, D), np.float16))
        self.k = cuda.to_device(np.zeros((L, bucket, H, D), np.float16))
        self.v = cuda.to_device(np.zeros((L, bucket, H, D), np.float16))
        host = np.full(TABLES_ROW * bucket + bucket * max_blocks_per_seq, -1, np.int32)
        for i, value in enumerate(PADDING):
            host[i * bucket:(i + 1) * bucket] = value
        self.index = cuda.to_device(host)  # all padding until the first step is loaded
        self.rows = {name: self.index[i * bucket:(i + 1) * bucket] for i, name in enumerate(ROWS)}
        self._launches: dict = {}

    def tables(self, width: int):
        """The ``[Bb, width]`` block-table view of the index buffer."""
        base = TABLES_ROW * self.bucket
        return self.index[base:base + self.bucket * width].reshape(self.bucket, width)

    def fork(self, count: int) -> PreparedLaunch:
        """The tail copy of the first ``count`` fork rows (fork_src -> fork_dst), made once."""
        key = ("fork", count)
        if key not in self._launches:
            rows = self.rows
            self._launches[key] = prepare_copy_tails(self.store, rows["fork_src"][:count], rows["fork_dst"][:count])
        return self._launches[key]

    def seal(self, count: int, layer: int | None = None) -> PreparedLaunch:
        """The seal of the first ``count`` seal rows (of every layer, or one), made once.
        A graph seals all ``bucket`` rows (padding rows are skipped by the kernel)."""
        key = ("seal", count, layer)
        if key not in self._launches:
            rows = self.rows
            self._launches[key] = prepare_seal(self.store, rows["seal_slots"][:count], rows["seal_blocks"][:count],
                                               layer)
        return self._launches[key]


class DecodeStep:
    """The launches of a decode step for one batch bucket and one context bucket.

    ``max_seq_len`` (the context bucket) bounds every ``seq_lens`` entry and sizes the
    decode grid; the block tables are ``max_seq_len // block_size`` wide. ``key`` is
    ``(bucket, max_seq_len)``. Its buffers are ``self.buffers`` (a :class:`StepBuffers`).
    """

    def __init__(self, store, buffers: StepBuffers, max_seq_len: int, scale: float | None, workspace: Workspace,
                 options: DecodeOptions = DEFAULT_OPTIONS):
        cfg = store.config
        self.store, self.buffers, self.max_seq_len = store, buffers, max_seq_len
        self.key = (buffers.bucket, max_seq_len)
        self.width = max_seq_len // cfg.block_size
        self.block_tables = buffers.tables(self.width)
        rows = buffers.rows
        self._append = prepare_append(store, buffers.k, buffers.v, rows["tail_slots"], rows["positions"])
        self._seal = buffers.seal(buffers.bucket)
        self._decode = []
        for layer in range(cfg.num_layers):
            launch, _ = decode_launch(buffers.q[layer], store, layer, self.block_tables, rows["seq_lens"],
                                      rows["tail_slots"], buffers.out[layer], scale, max_seq_len, options, workspace)
            self._decode.append(launch.prepare(options.launch_path))
        self._layers: dict = {}

    def enqueue_all(self, stream=0, num_seals: int | None = None) -> None:
        """Enqueue the whole step on ``stream``: append and seal for every layer (one
        launch each), then one decode launch per layer. Capture-safe. ``num_seals`` (an
        eager step) seals only that many rows, none when 0; None seals the bucket's."""
        self._append.run(stream)
        if num_seals is None:
            self._seal.run(stream)
        elif num_seals:
            self.buffers.seal(num_seals).run(stream)
        for launch in self._decode:
            launch.run(stream)

    def enqueue(self, layer: int, stream=0) -> None:
        """Enqueue one layer's part of the step: append its new K/V, seal, decode.

        For an engine that captures hexcore inside its own model graph: call it once per
        layer after writing ``buffers.k[layer]``, ``buffers.v[layer]`` and
        ``buffers.q[layer]``; the output lands in ``buffers.out[layer]``. Capture-safe
        once a layer has run: its first call prepares (and loads) its kernels, so run a
        step eagerly before capturing, as every CUDA graph capture needs.
        """
        if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or not 0 <= layer < len(self._decode):
            raise HexcoreInvalidArgumentError(f"layer: expected an int in [0, {len(self._decode)}), got {layer!r}")
        launches = self._layers.get(layer)
        if launches is None:
            rows, b = self.buffers.rows, self.buffers
            launches = self._layers[layer] = [
                prepare_append(self.store, b.k[layer], b.v[layer], rows["tail_slots"], rows["positions"], layer),
                b.seal(b.bucket, layer), self._decode[layer]]
        for launch in launches:
            launch.run(stream)
