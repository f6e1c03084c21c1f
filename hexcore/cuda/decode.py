"""``paged_decode``: the launcher of the split-K decode kernel and its merge."""

from __future__ import annotations

import functools
import math
import os

import numpy as np
from numba import cuda

from ..errors import HexcoreInvalidArgumentError
from .arrays import caller_stream, checked, checked_ids
from .attention import SPLIT_TOKENS, THREADS, decode_kernel, merge_kernel
from .device import SIMULATOR
from .store import DeviceKVStore, flat_words

# splits are shortened until a launch has about this many CTAs per SM (tuning knob)
CTAS_PER_SM = int(os.environ.get("HEXCORE_CTAS_PER_SM", "4"))


@functools.cache
def _num_sms() -> int:
    return 1 if SIMULATOR else cuda.get_current_device().MULTIPROCESSOR_COUNT


def choose_split_blocks(batch: int, num_kv_heads: int, max_blocks: int, block_size: int) -> int:
    """Blocks per split: as long as the shared buffer allows, shorter while the grid is
    too small to fill the GPU (B=1 at long context still gets many CTAs)."""
    split = max(1, SPLIT_TOKENS // block_size)
    target = CTAS_PER_SM * _num_sms()
    while split > 1 and batch * num_kv_heads * -(-max_blocks // split) < target:
        split //= 2
    return split


class _Workspace:
    """Split partials, allocated once per shape and reused (no allocation per call)."""

    def __init__(self):
        self._arrays = {}

    def get(self, rows: int, splits: int, head_dim: int):
        key = (rows, splits, head_dim)
        if key not in self._arrays:
            self._arrays[key] = (cuda.device_array((rows, splits, head_dim), np.float32),
                                 cuda.device_array((rows, splits, 2), np.float32))
        return self._arrays[key]


_workspace = _Workspace()


def paged_decode(q, store: DeviceKVStore, layer: int, block_tables, seq_lens, tail_slots, out=None,
                 scale: float | None = None, max_seq_len: int | None = None, stream=None):
    """Decode attention of one new query token per sequence over its paged KV cache.

    Each sequence ``b`` attends over its ``seq_lens[b] // block_size`` sealed blocks
    (``block_tables[b, :n]``, dequantized on the fly) and the ``seq_lens[b] % block_size``
    tokens of its tail ``tail_slots[b]``. Float32 accumulation; GQA/MQA by head grouping.

    Parameters
    ----------
    q : float16 ``[B, num_q_heads, head_dim]``, ``num_q_heads`` a multiple of the store's KV heads.
    store : the DeviceKVStore; ``layer`` selects the layer.
    block_tables : int32 ``[B, max_blocks]``: sealed block ids per sequence.
    seq_lens : int32 ``[B]``: tokens per sequence (0 gives a zero output).
    tail_slots : int32 ``[B]``: each sequence's tail slot.
    out : optional float16 ``[B, num_q_heads, head_dim]`` to write; allocated if None.
    stream : numba stream to launch on; by default torch's current stream when any
        argument is a torch tensor, else the default stream.
    scale : softmax scale, ``1/sqrt(head_dim)`` by default.
    max_seq_len : the longest ``seq_lens`` entry when they live on the device (sizes
        the grid without reading them back); taken from host arrays directly.

    Returns ``out``. Host (numpy) index arrays are range-checked before the launch;
    device arrays are trusted (checking them would synchronise). For repeated calls on
    fixed buffers, :class:`DecodePlan` does the checks once and launches in a few us.
    """
    stream = caller_stream(stream, q, block_tables, seq_lens, tail_slots, out)
    key = _eager_key(q, store, layer, block_tables, seq_lens, tail_slots, out, scale, max_seq_len, stream)
    prepared = _eager_plans.get(key) if key is not None else None
    if prepared is None:
        launches, out = _prepare(q, store, layer, block_tables, seq_lens, tail_slots, out, scale, max_seq_len,
                                 stream)
        if key is None:
            for dispatcher, grid, args in launches:
                dispatcher[grid, THREADS, stream](*args)
            return out
        from .launch import PreparedLaunch

        # the entry keeps the argument objects alive, so their ids cannot be reused
        keep = (q, block_tables, seq_lens, tail_slots, store, stream)
        prepared = [PreparedLaunch(d, g, THREADS, a) for d, g, a in launches], out, keep
        if len(_eager_plans) >= EAGER_PLANS:
            _eager_plans.pop(next(iter(_eager_plans)))
        _eager_plans[key] = prepared
    launches, out, _ = prepared
    for launch in launches:
        launch.run(stream)
    return out


EAGER_PLANS = 64  # eager calls remembered: the same buffers again launch without re-marshalling
_eager_plans: dict = {}


def _identity(x):
    """What makes an argument the same buffer next time, or None if it cannot be cached.

    numba device arrays never move; a torch tensor is keyed by its data pointer too.
    Host (numpy) arrays and host scalars are copied or checked per call: not cached.
    """
    if isinstance(x, np.ndarray) or x is None:
        return None
    if hasattr(x, "copy_to_host"):
        return id(x)
    data_ptr = getattr(x, "data_ptr", None)
    return (id(x), data_ptr(), tuple(x.shape)) if data_ptr is not None else None


def _eager_key(q, store, layer, block_tables, seq_lens, tail_slots, out, scale, max_seq_len, stream):
    # only fully device-resident calls with an output and a grid bound are cached
    if max_seq_len is None or SIMULATOR:
        return None
    ids = tuple(_identity(x) for x in (q, block_tables, seq_lens, tail_slots, out))
    if None in ids or not isinstance(layer, (int, np.integer)) or isinstance(layer, bool):
        return None
    return id(store), int(layer), scale, int(max_seq_len), id(stream), ids


class DecodePlan:
    """``paged_decode`` for buffers that keep their addresses between steps.

    Arguments are validated and marshalled once per layer; ``run(layer)`` only enqueues
    the decode and merge kernels (capture-safe). Change the contents of ``q``,
    ``block_tables``, ``seq_lens`` and ``tail_slots`` between runs, never the arrays;
    every ``seq_lens`` entry must stay at most ``max_seq_len``.
    """

    def __init__(self, q, store: DeviceKVStore, block_tables, seq_lens, tail_slots, max_seq_len: int, out=None,
                 scale: float | None = None):
        self.store = store
        self._inputs = (q, block_tables, seq_lens, tail_slots)
        self._scale, self._max_seq_len = scale, max_seq_len
        _, self.out = _prepare(q, store, 0, block_tables, seq_lens, tail_slots, out, scale, max_seq_len, 0)
        self._layers: dict = {}

    def run(self, layer: int, stream=None):
        """Enqueue attention for ``layer`` into ``self.out``; returns ``self.out``.

        ``stream``: a numba stream; by default torch's current stream when the plan was
        built from torch tensors, else the default stream."""
        stream = caller_stream(stream, *self._inputs)
        prepared = self._layers.get(layer)
        if prepared is None:
            from .launch import PreparedLaunch

            launches, _ = _prepare(self._inputs[0], self.store, layer, *self._inputs[1:], self.out, self._scale,
                                   self._max_seq_len, 0)
            prepared = self._layers[layer] = [PreparedLaunch(d, g, THREADS, a) for d, g, a in launches]
        for launch in prepared:
            launch.run(stream)
        return self.out


def _prepare(q, store, layer, block_tables, seq_lens, tail_slots, out, scale, max_seq_len, stream):
    """Validate paged_decode's arguments; returns ([(kernel, grid, args), ...], out)."""
    cfg = store.config
    if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or not 0 <= layer < cfg.num_layers:
        raise HexcoreInvalidArgumentError(f"layer: expected an int in [0, {cfg.num_layers}), got {layer!r}")
    if cfg.head_dim > 2 * THREADS:
        raise HexcoreInvalidArgumentError(f"head_dim: paged_decode supports up to {2 * THREADS}, got {cfg.head_dim}")
    q = checked(q, "q", np.float16, (None, None, cfg.head_dim))
    batch, num_q_heads = q.shape[0], q.shape[1]
    if num_q_heads % cfg.num_kv_heads or num_q_heads == 0:
        raise HexcoreInvalidArgumentError(
            f"q: num_q_heads {num_q_heads} is not a positive multiple of num_kv_heads {cfg.num_kv_heads}")
    group = num_q_heads // cfg.num_kv_heads
    max_blocks = _max_blocks(block_tables, batch)
    capacity = (max_blocks + 1) * cfg.block_size - 1
    host_lens = seq_lens if isinstance(seq_lens, np.ndarray) else None
    seq_lens = checked_ids(seq_lens, "seq_lens", batch, capacity + 1)
    tail_slots = checked_ids(tail_slots, "tail_slots", batch, store.max_seqs)
    if isinstance(block_tables, np.ndarray) and host_lens is not None:
        _check_tables(block_tables, host_lens, cfg.block_size, store.num_blocks)
    block_tables = checked(block_tables, "block_tables", np.int32, (batch, max_blocks), align=4)
    if out is None:
        out = cuda.device_array((batch, num_q_heads, cfg.head_dim), np.float16, stream=stream)
    out = checked(out, "out", np.float16, (batch, num_q_heads, cfg.head_dim))
    if max_seq_len is None:
        max_seq_len = int(host_lens.max(initial=0)) if host_lens is not None else capacity
    scale = 1.0 / math.sqrt(cfg.head_dim) if scale is None else float(scale)

    max_virtual = max(1, -(-max_seq_len // cfg.block_size))
    split_blocks = choose_split_blocks(batch, cfg.num_kv_heads, max_virtual, cfg.block_size)
    splits = -(-max_virtual // split_blocks)
    part_out, part_ml = _workspace.get(batch * num_q_heads, splits, cfg.head_dim)
    kernel = decode_kernel(cfg.kv_dtype.bits, cfg.num_kv_heads, cfg.head_dim, cfg.block_size, group,
                           cfg.group_size)
    w = store.word_offsets
    decode_args = (store.pool, w["k_codes"], w["v_codes"], w.get("k_meta", 0), w.get("v_meta", 0), w["k_tails"],
                   w["v_tails"], flat_words(q), block_tables, seq_lens, tail_slots, part_out, part_ml, layer,
                   store.num_blocks, store.max_seqs, split_blocks, np.float32(scale))
    merge_args = (part_out, part_ml, seq_lens, out, split_blocks * cfg.block_size)
    return [(kernel, (splits, cfg.num_kv_heads, batch), decode_args),
            (merge_kernel, (num_q_heads, batch), merge_args)], out


def _max_blocks(block_tables, batch: int) -> int:
    shape = tuple(getattr(block_tables, "shape", ()))
    if len(shape) != 2 or shape[0] != batch:
        raise HexcoreInvalidArgumentError(f"block_tables: expected shape ({batch}, max_blocks), got {shape}")
    return shape[1]


def _check_tables(tables: np.ndarray, lens: np.ndarray, block_size: int, num_blocks: int) -> None:
    used = np.arange(tables.shape[1])[None, :] < (lens // block_size)[:, None]
    bad = np.argwhere(used & ((tables < 0) | (tables >= num_blocks)))
    if bad.size:
        b, j = bad[0]
        raise HexcoreInvalidArgumentError(
            f"block_tables[{b}, {j}] = {tables[b, j]} is outside [0, {num_blocks}) for seq_len {lens[b]}")
