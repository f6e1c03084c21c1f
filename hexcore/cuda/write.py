"""The write path: append new tokens into tails, seal full tails into blocks, copy blocks.

Quantization (KIVI, asymmetric, ``x = scale * q + min``, unsigned codes, float16
scale and min), identical to ``tests/reference.py``:

- keys: per channel over the block's ``block_size`` tokens;
- values: per token over groups of ``group_size`` channels.

For a group with float32 extremes ``lo``, ``hi``: ``scale = f16((hi - lo) / levels)``,
``min = f16(lo)``, ``q = clamp(floor((x - min) / scale + 0.5), 0, levels)`` in float32
(``q = 0`` where ``scale == 0``), ``levels = 2**bits - 1``.

Bit order: a code row is little-endian; element ``i`` of a row sits in byte
``i * bits // 8`` at bit ``(i * bits) % 8``: INT4 puts element 2j in the low nibble of
byte j, INT2 puts element 4j+k at bits 2k..2k+1 of byte j.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda

from ..config import KVCacheConfig
from ..errors import HexcoreInvalidArgumentError
from ..layout import code_offset, key_meta_offset, tail_offset, value_meta_offset
from .arrays import caller_stream, checked, checked_ids, device_only
from .device import load_u32x4
from .launch import PreparedLaunch
from .store import DeviceKVStore, flat_words

_code_offset = cuda.jit(device=True)(code_offset)
_key_meta_offset = cuda.jit(device=True)(key_meta_offset)
_value_meta_offset = cuda.jit(device=True)(value_meta_offset)
_tail_offset = cuda.jit(device=True)(tail_offset)

THREADS = 128


@cuda.jit(device=True)
def _quantize(x, scale, lo, levels):
    if scale <= 0:
        return 0
    q = np.int32(math.floor((x - lo) / scale + np.float32(0.5)))
    if q < 0:
        return 0
    return min(q, levels)


def _layer_range(layer, num_layers: int) -> tuple[int, int]:
    """(first layer, layer count) for ``layer`` = an index or None (all layers)."""
    if layer is None:
        return 0, num_layers
    if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or not 0 <= layer < num_layers:
        raise HexcoreInvalidArgumentError(f"layer: expected an int in [0, {num_layers}) or None, got {layer!r}")
    return int(layer), 1


# -- append ---------------------------------------------------------------------------
@functools.cache
def _append_kernel(num_kv_heads: int, block_size: int, head_dim: int):
    chunks = head_dim // 8  # 16-byte chunks per row
    row_words = head_dim // 2

    @cuda.jit
    def kernel(k_tails, v_tails, k_new, v_new, slots, positions, num_tokens, first_layer, max_seqs):
        # k_new, v_new: [layers_in, num_tokens, H, D] f16 as words; slots, positions: [num_tokens]
        i = cuda.grid(1)
        layer_in = cuda.blockIdx.y
        if i >= num_tokens * num_kv_heads * chunks:
            return
        c = i % chunks
        h = (i // chunks) % num_kv_heads
        t = i // (chunks * num_kv_heads)
        slot = slots[t]
        pos = positions[t]
        if slot < 0 or slot >= max_seqs or pos < 0 or pos >= block_size:
            return  # host arrays were checked; a bad device id writes nothing
        src = ((layer_in * num_tokens + t) * num_kv_heads + h) * row_words + c * 4
        dst = _tail_offset(first_layer + layer_in, slot, h, pos, max_seqs, num_kv_heads, block_size, head_dim) // 4
        dst += c * 4
        a0, a1, a2, a3 = load_u32x4(k_new, src)
        k_tails[dst], k_tails[dst + 1], k_tails[dst + 2], k_tails[dst + 3] = a0, a1, a2, a3
        b0, b1, b2, b3 = load_u32x4(v_new, src)
        v_tails[dst], v_tails[dst + 1], v_tails[dst + 2], v_tails[dst + 3] = b0, b1, b2, b3

    return kernel, chunks


def append(store: DeviceKVStore, k, v, slots, positions, layer: int | None = None, stream=None) -> None:
    """Write new K/V tokens into their sequences' tails, one launch.

    Parameters
    ----------
    k, v : float16 ``[num_tokens, H, D]`` for one ``layer``, or ``[L, num_tokens, H, D]``
        with ``layer=None`` for all layers at once; device arrays or CUDA tensors.
    slots : int32 ``[num_tokens]``: the tail slot of each token's sequence.
    positions : int32 ``[num_tokens]``: each token's place in its tail, ``seq_len % block_size``
        before it was appended.
    """
    stream = caller_stream(stream, k, v, slots, positions)
    kernel, grid, args = _append_launch(store, k, v, slots, positions, layer)
    if grid[0]:
        kernel[grid, THREADS, stream](*args)


def prepare_append(store: DeviceKVStore, k, v, slots, positions, layer: int | None = None) -> PreparedLaunch:
    """``append`` validated once and bound to fixed device buffers; ``run(stream)`` enqueues it.

    Same parameters as :func:`append`, all on the device. Rows whose slot is -1 are
    padding: the kernel skips them. Capture-safe.
    """
    device_only(k=k, v=v, slots=slots, positions=positions)
    kernel, grid, args = _append_launch(store, k, v, slots, positions, layer)
    if not grid[0]:
        raise HexcoreInvalidArgumentError("slots: a prepared append needs at least one row, got 0")
    return PreparedLaunch(kernel, grid, THREADS, args)


def _append_launch(store, k, v, slots, positions, layer):
    """Validate append's arguments; returns (kernel, grid, args)."""
    cfg = store.config
    first, count = _layer_range(layer, cfg.num_layers)
    lead = () if layer is not None else (cfg.num_layers,)
    k = checked(k, "k", np.float16, lead + (None, cfg.num_kv_heads, cfg.head_dim))
    num_tokens = tuple(k.shape)[-3]
    v = checked(v, "v", np.float16, lead + (num_tokens, cfg.num_kv_heads, cfg.head_dim))
    slots = checked_ids(slots, "slots", num_tokens, store.max_seqs)
    positions = checked_ids(positions, "positions", num_tokens, cfg.block_size)
    kernel, chunks = _append_kernel(cfg.num_kv_heads, cfg.block_size, cfg.head_dim)
    blocks = (num_tokens * cfg.num_kv_heads * chunks + THREADS - 1) // THREADS
    return kernel, (blocks, count), (store.words["k_tails"], store.words["v_tails"], flat_words(k), flat_words(v),
                                     slots, positions, num_tokens, first, store.max_seqs)


# -- seal -----------------------------------------------------------------------------
@functools.cache
def _seal_quantized_kernel(cfg: KVCacheConfig):
    H, BS, D, G = cfg.num_kv_heads, cfg.block_size, cfg.head_dim, cfg.group_size
    bits, row, NG = cfg.kv_dtype.bits, cfg.row_bytes, cfg.num_groups
    per_byte = 8 // bits
    levels = (1 << bits) - 1
    packs = D // per_byte

    @cuda.jit
    def kernel(k_tails, v_tails, k_codes, v_codes, k_meta, v_meta, slots, block_ids, num_seals,
               first_layer, num_blocks, max_seqs):
        # tails, meta: flat float16; codes: flat uint8; one CTA per (seal, layer)
        s = cuda.blockIdx.x
        layer = first_layer + cuda.blockIdx.y
        slot = slots[s]
        block = block_ids[s]
        if slot < 0 or slot >= max_seqs or block < 0 or block >= num_blocks:
            return
        # keys: one thread per (head, byte column); per-channel groups over the tokens
        for work in range(cuda.threadIdx.x, H * packs, cuda.blockDim.x):
            h = work // packs
            p = work % packs
            tail = _tail_offset(layer, slot, h, 0, max_seqs, H, BS, D) // 2
            meta = _key_meta_offset(layer, block, h, num_blocks, H, D) // 2
            for e in range(per_byte):
                d = p * per_byte + e
                lo = np.float32(k_tails[tail + d])
                hi = lo
                for t in range(1, BS):
                    x = np.float32(k_tails[tail + t * D + d])
                    lo = min(lo, x)
                    hi = max(hi, x)
                k_meta[meta + d] = (hi - lo) / np.float32(levels)
                k_meta[meta + D + d] = lo
            for t in range(BS):
                byte = 0
                for e in range(per_byte):
                    d = p * per_byte + e
                    x = np.float32(k_tails[tail + t * D + d])
                    q = _quantize(x, np.float32(k_meta[meta + d]), np.float32(k_meta[meta + D + d]), levels)
                    byte |= q << (e * bits)
                k_codes[_code_offset(layer, block, h, t, num_blocks, H, BS, row) + p] = byte
        # values: one thread per (head, token, group); per-token groups over channels
        for work in range(cuda.threadIdx.x, H * BS * NG, cuda.blockDim.x):
            g = work % NG
            t = (work // NG) % BS
            h = work // (NG * BS)
            src = _tail_offset(layer, slot, h, t, max_seqs, H, BS, D) // 2 + g * G
            meta = _value_meta_offset(layer, block, h, t, num_blocks, H, BS, NG) // 2
            lo = np.float32(v_tails[src])
            hi = lo
            for d in range(1, G):
                x = np.float32(v_tails[src + d])
                lo = min(lo, x)
                hi = max(hi, x)
            v_meta[meta + g] = (hi - lo) / np.float32(levels)
            v_meta[meta + NG + g] = lo
            scale = np.float32(v_meta[meta + g])
            low = np.float32(v_meta[meta + NG + g])
            dst = _code_offset(layer, block, h, t, num_blocks, H, BS, row) + g * G // per_byte
            for b in range(G // per_byte):
                byte = 0
                for e in range(per_byte):
                    q = _quantize(np.float32(v_tails[src + b * per_byte + e]), scale, low, levels)
                    byte |= q << (e * bits)
                v_codes[dst + b] = byte

    return kernel


@functools.cache
def _seal_fp16_kernel(num_kv_heads: int, block_size: int, head_dim: int):
    words = num_kv_heads * block_size * head_dim // 2  # one (layer, block) run, as uint32

    @cuda.jit
    def kernel(k_tails, v_tails, k_blocks, v_blocks, slots, block_ids, first_layer, num_blocks, max_seqs):
        s = cuda.blockIdx.x
        layer = first_layer + cuda.blockIdx.y
        slot = slots[s]
        block = block_ids[s]
        if slot < 0 or slot >= max_seqs or block < 0 or block >= num_blocks:
            return
        src = (layer * max_seqs + slot) * words
        dst = (layer * num_blocks + block) * words
        for w in range(cuda.threadIdx.x * 4, words, cuda.blockDim.x * 4):
            a0, a1, a2, a3 = load_u32x4(k_tails, src + w)
            k_blocks[dst + w], k_blocks[dst + w + 1], k_blocks[dst + w + 2], k_blocks[dst + w + 3] = a0, a1, a2, a3
            b0, b1, b2, b3 = load_u32x4(v_tails, src + w)
            v_blocks[dst + w], v_blocks[dst + w + 1], v_blocks[dst + w + 2], v_blocks[dst + w + 3] = b0, b1, b2, b3

    return kernel


def seal(store: DeviceKVStore, slots, block_ids, layer: int | None = None, stream=None) -> None:
    """Seal full tails into blocks (quantizing for INT4/INT2), all of a step's in one launch.

    Parameters
    ----------
    slots : int32 ``[num_seals]``: tail slots whose ``block_size`` tokens are complete.
    block_ids : int32 ``[num_seals]``: the distinct destination block of each.
    layer : one layer, or None for all layers (the default).
    """
    stream = caller_stream(stream, slots, block_ids)
    kernel, grid, args = _seal_launch(store, slots, block_ids, layer)
    if grid[0]:
        kernel[grid, THREADS, stream](*args)


def prepare_seal(store: DeviceKVStore, slots, block_ids, layer: int | None = None) -> PreparedLaunch:
    """``seal`` validated once and bound to fixed device buffers; ``run(stream)`` enqueues it.

    ``slots``, ``block_ids``: device int32 ``[rows]``; a row whose slot or block is -1
    is padding (the kernel skips it). Capture-safe.
    """
    device_only(slots=slots, block_ids=block_ids)
    kernel, grid, args = _seal_launch(store, slots, block_ids, layer)
    if not grid[0]:
        raise HexcoreInvalidArgumentError("slots: a prepared seal needs at least one row, got 0")
    return PreparedLaunch(kernel, grid, THREADS, args)


def _seal_launch(store, slots, block_ids, layer):
    """Validate seal's arguments; returns (kernel, grid, args)."""
    cfg = store.config
    first, count = _layer_range(layer, cfg.num_layers)
    slots = checked_ids(slots, "slots", None, store.max_seqs)
    num = slots.shape[0]
    if isinstance(block_ids, np.ndarray) and block_ids.ndim == 1 and len(np.unique(block_ids)) != len(block_ids):
        raise HexcoreInvalidArgumentError(f"block_ids: expected distinct ids, got {block_ids.tolist()}")
    block_ids = checked_ids(block_ids, "block_ids", num, store.num_blocks)
    if cfg.kv_dtype.is_quantized:
        f = store.flat
        return _seal_quantized_kernel(cfg), (num, count), (
            f["k_tails"], f["v_tails"], f["k_codes"], f["v_codes"], f["k_meta"], f["v_meta"], slots, block_ids, num,
            first, store.num_blocks, store.max_seqs)
    w = store.words
    return _seal_fp16_kernel(cfg.num_kv_heads, cfg.block_size, cfg.head_dim), (num, count), (
        w["k_tails"], w["v_tails"], w["k_codes"], w["v_codes"], slots, block_ids, first, store.num_blocks,
        store.max_seqs)
