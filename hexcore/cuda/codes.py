"""Packed codes on CUDA cores: how the CUDA-core decode kernel (attention.py) turns INT4/INT2
code words into float32, and how many words a lane loads per row."""

from __future__ import annotations

import os

from numba import cuda, float32

from .device import MAGIC, MAGIC_F32, u32_as_f32

MAX_REGS_PER_LANE = int(os.environ.get("HEXCORE_MAX_LANE_VALUES", "32"))  # q' values (or accumulators) a lane keeps: elements x heads


def vector_words(bits: int, head_dim: int, group: int) -> int:
    """32-bit words each lane loads per token row: 4 (16-byte loads) unless the
    lane's elements times the query heads would not fit ``MAX_REGS_PER_LANE``."""
    row_words = head_dim * bits // 32
    if bits == 16:
        return 4  # FP16 rows have their own mapping (8 halves per lane)
    for vw in (4, 2, 1):
        if vw <= row_words and (vw * 32 // bits) * group <= MAX_REGS_PER_LANE:
            return vw
    return 1


@cuda.jit(device=True)
def code_value(word, k, bits, mask):
    # element k of a packed word times 2**position(k): one LOP3 and one FADD.
    # Positions up to bit 22 use the magic float directly; higher elements are read
    # from word >> 12 (position k*bits - 12), which the compiler computes once a word.
    if k * bits + bits <= 23:
        return u32_as_f32(MAGIC | (word & (mask << (k * bits)))) - MAGIC_F32
    return u32_as_f32(MAGIC | ((word >> 12) & (mask << (k * bits - 12)))) - MAGIC_F32


@cuda.jit(device=True)
def code_weight(k, bits):
    # 2**-position(k): undoes the position left in code_value's result
    if k * bits + bits <= 23:
        return float32(1.0) / float32(1 << (k * bits))
    return float32(1.0) / float32(1 << (k * bits - 12))
