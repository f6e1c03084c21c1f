"""Byte offsets of every element of the cache: one set of functions for CPU and GPU.

These are plain integer functions. The host calls them as Python (or compiles them
with ``numba.njit``); ``hexcore.cuda`` compiles the very same functions with
``cuda.jit(device=True)``, so the two sides cannot disagree about a byte.

Each pool is one allocation per kind with the layer as its leading axis, head-major
within a block ("HND"), so one (block, head) is one contiguous run::

    sealed codes  [num_layers, num_blocks, num_kv_heads, block_size, row_bytes] uint8
                  (FP16 pools: [..., block_size, head_dim] float16, same bytes)
    key meta      [num_layers, num_blocks, num_kv_heads, 2, head_dim]        float16
                  row 0 = per-channel scale, row 1 = per-channel min
    value meta    [num_layers, num_blocks, num_kv_heads, block_size, 2, num_groups]
                  float16: per token, num_groups scales then num_groups mins
    tails         [num_layers, max_seqs, num_kv_heads, block_size, head_dim] float16

K and V each have their own codes, metadata and tails, with identical layouts.
"""

from __future__ import annotations

FP16_BYTES = 2


def code_offset(layer, block, head, token, num_blocks, num_kv_heads, block_size, row_bytes):
    """Byte offset of the code row of (layer, block, head, token) in a sealed pool."""
    return (((layer * num_blocks + block) * num_kv_heads + head) * block_size + token) * row_bytes


def key_meta_offset(layer, block, head, num_blocks, num_kv_heads, head_dim):
    """Byte offset of the key scale row of (layer, block, head); the min row follows."""
    return ((layer * num_blocks + block) * num_kv_heads + head) * 2 * head_dim * FP16_BYTES


def value_meta_offset(layer, block, head, token, num_blocks, num_kv_heads, block_size, num_groups):
    """Byte offset of the value scales of (layer, block, head, token); the mins follow."""
    row = ((layer * num_blocks + block) * num_kv_heads + head) * block_size + token
    return row * 2 * num_groups * FP16_BYTES


def tail_offset(layer, slot, head, token, max_seqs, num_kv_heads, block_size, head_dim):
    """Byte offset of the FP16 row of (layer, tail slot, head, token) in a tail pool."""
    return (((layer * max_seqs + slot) * num_kv_heads + head) * block_size + token) * head_dim * FP16_BYTES
