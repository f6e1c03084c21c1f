"""Layout agreement: the GPU computes byte offsets with the host's own layout functions."""

from __future__ import annotations

import numpy as np
from numba import cuda

from .. import layout
from .._checks import as_int
from ..config import KVCacheConfig
from ..errors import HexcoreInvalidArgumentError

from .device_layout import code_offset, key_meta_offset, tail_offset, value_meta_offset

NUM_OFFSETS = 4  # code, key meta, value meta, tail


@cuda.jit
def _layout_offsets_kernel(out, dims):
    # out: [num_layers * num_blocks * num_kv_heads * block_size, 4] int64
    # dims: [num_layers, num_blocks, num_kv_heads, block_size, row_bytes, head_dim,
    #        num_groups, max_seqs] int64
    i = cuda.grid(1)
    if i >= out.shape[0]:
        return
    num_blocks, num_kv_heads, block_size = dims[1], dims[2], dims[3]
    token = i % block_size
    head = (i // block_size) % num_kv_heads
    block = (i // (block_size * num_kv_heads)) % num_blocks
    layer = i // (block_size * num_kv_heads * num_blocks)
    out[i, 0] = code_offset(layer, block, head, token, num_blocks, num_kv_heads, block_size, dims[4])
    out[i, 1] = key_meta_offset(layer, block, head, num_blocks, num_kv_heads, dims[5])
    out[i, 2] = value_meta_offset(layer, block, head, token, num_blocks, num_kv_heads, block_size, dims[6])
    # the block index doubles as the tail slot (num_blocks <= max_seqs in the check)
    out[i, 3] = tail_offset(layer, block, head, token, dims[7], num_kv_heads, block_size, dims[5])


def _checked(config, num_blocks) -> int:
    """The config type and ``num_blocks`` (an int in [1, 2**20]) checked; returns num_blocks."""
    if not isinstance(config, KVCacheConfig):
        raise HexcoreInvalidArgumentError(f"config: expected KVCacheConfig, got {type(config).__name__}")
    return as_int("num_blocks", num_blocks, 1, 1 << 20)


def _dims(config: KVCacheConfig, num_blocks: int) -> np.ndarray:
    return np.array([config.num_layers, num_blocks, config.num_kv_heads, config.block_size,
                     config.row_bytes, config.head_dim, config.num_groups, num_blocks], np.int64)


def device_layout_offsets(config: KVCacheConfig, num_blocks: int) -> np.ndarray:
    """Offsets of every (layer, block, head, token), computed on the GPU.

    Returns ``[num_layers, num_blocks, num_kv_heads, block_size, 4]`` int64: the code,
    key-meta, value-meta and tail byte offsets (block index used as the tail slot).
    """
    num_blocks = _checked(config, num_blocks)
    shape = (config.num_layers, num_blocks, config.num_kv_heads, config.block_size)
    count = int(np.prod(shape))
    out = cuda.to_device(np.full((count, NUM_OFFSETS), -1, np.int64))
    threads = 128
    _layout_offsets_kernel[(count + threads - 1) // threads, threads](out, cuda.to_device(_dims(config, num_blocks)))
    return out.copy_to_host().reshape(shape + (NUM_OFFSETS,))


def host_layout_offsets(config: KVCacheConfig, num_blocks: int) -> np.ndarray:
    """The same offsets as :func:`device_layout_offsets`, computed on the CPU."""
    num_blocks = _checked(config, num_blocks)
    d = _dims(config, num_blocks)
    layer, block, head, token = np.indices((config.num_layers, num_blocks, config.num_kv_heads, config.block_size))
    out = np.stack([
        layout.code_offset(layer, block, head, token, d[1], d[2], d[3], d[4]),
        layout.key_meta_offset(layer, block, head, d[1], d[2], d[5]),
        layout.value_meta_offset(layer, block, head, token, d[1], d[2], d[3], d[6]),
        layout.tail_offset(layer, block, head, token, d[7], d[2], d[3], d[5]),
    ], axis=-1)
    return out.astype(np.int64)


def layout_agrees(config: KVCacheConfig, num_blocks: int = 3) -> bool:
    """True when the GPU's offsets equal the host's for this config."""
    return bool(np.array_equal(device_layout_offsets(config, num_blocks), host_layout_offsets(config, num_blocks)))
