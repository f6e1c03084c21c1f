"""What the decode kernels share: CTA shape, loads, the per-split softmax, the merge.

Both decode kernels (attention.py on CUDA cores, attention_tc.py on tensor cores) run
one CTA of ``THREADS`` per (split, KV head, sequence), write each split's unnormalised
output and its (max, sum) of exponentials, and ``merge_kernel`` combines the splits
(Flash-Decoding).
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32

from .device import block_max, block_sum, load_u32x2, load_u32x4

NEG_INF = np.float32(-np.inf)
THREADS = 128
WARPS = THREADS // 32
SPLIT_TOKENS = 512  # most tokens one CTA handles (its shared score buffer)


@cuda.jit(device=True)
def load_words(pool, at, vw, out, o):
    """``out[o:o+vw] = pool[at:at+vw]``, as one 16- or 8-byte load where ``vw`` allows."""
    if vw == 4:
        out[o], out[o + 1], out[o + 2], out[o + 3] = load_u32x4(pool, at)
    elif vw == 2:
        out[o], out[o + 1] = load_u32x2(pool, at)
    else:
        out[o] = pool[at]


@cuda.jit(device=True)
def split_softmax(s_p, s_red, part_ml, n_tok, row0, split, G):
    """Per head g: ``s_p[g, :n_tok] = exp(score - max); part_ml[row0 + g, split] = (max, sum)``."""
    tid = cuda.threadIdx.x
    for g in range(G):
        m = NEG_INF
        for t in range(tid, n_tok, THREADS):
            m = max(m, s_p[g, t])
        m = block_max(m, s_red)
        total = float32(0)
        for t in range(tid, n_tok, THREADS):
            p = math.exp(s_p[g, t] - m)
            s_p[g, t] = p
            total += p
        total = block_sum(total, s_red)
        if tid == 0:
            part_ml[row0 + g, split, 0] = m
            part_ml[row0 + g, split, 1] = total


@cuda.jit(device=True)
def write_partial(s_out, part_out, row0, split):
    """``part_out[row0 + g, split, :] = s_out[g, :]``: the CTA's unnormalised output."""
    G, D = s_out.shape
    for i in range(cuda.threadIdx.x, G * D, THREADS):
        part_out[row0 + i // D, split, i % D] = s_out[i // D, i % D]


MERGE_CHUNK = 1024  # split weights staged in shared memory per round


@cuda.jit
def merge_kernel(part_out, part_ml, seq_lens, out, split_tokens):
    # one CTA per (query head, sequence); out: [B, Hq, D] float16, D <= 2 * THREADS
    hq = cuda.blockIdx.x
    b = cuda.blockIdx.y
    tid = cuda.threadIdx.x
    num_q_heads = out.shape[1]
    head_dim = out.shape[2]
    row = b * num_q_heads + hq
    n_splits = (seq_lens[b] + split_tokens - 1) // split_tokens
    s_red = cuda.shared.array(THREADS, float32)
    s_w = cuda.shared.array(MERGE_CHUNK, float32)  # exp(m_s - m) of this round's splits
    m = NEG_INF
    for s in range(tid, n_splits, THREADS):
        m = max(m, part_ml[row, s, 0])
    m = block_max(m, s_red)
    total = float32(0)
    for s in range(tid, n_splits, THREADS):
        total += math.exp(part_ml[row, s, 0] - m) * part_ml[row, s, 1]
    total = block_sum(total, s_red)
    inv = float32(1) / total if total > 0 else float32(0)
    d0 = tid
    d1 = tid + THREADS
    acc0 = float32(0)
    acc1 = float32(0)
    for base in range(0, n_splits, MERGE_CHUNK):
        n = min(MERGE_CHUNK, n_splits - base)
        for s in range(tid, n, THREADS):
            s_w[s] = math.exp(part_ml[row, base + s, 0] - m)
        cuda.syncthreads()  # weights of this round ready
        if d0 < head_dim:
            acc0 += _weighted_sum(part_out, row, base, n, d0, s_w)
        if d1 < head_dim:
            acc1 += _weighted_sum(part_out, row, base, n, d1, s_w)
        cuda.syncthreads()  # weights read before the next round overwrites them
    if d0 < head_dim:
        out[b, hq, d0] = acc0 * inv
    if d1 < head_dim:
        out[b, hq, d1] = acc1 * inv


@cuda.jit(device=True)
def _weighted_sum(part_out, row, base, n, d, s_w):
    # sum_s s_w[s] * part_out[row, base + s, d], four independent loads in flight
    a0 = float32(0)
    a1 = float32(0)
    a2 = float32(0)
    a3 = float32(0)
    s = 0
    while s + 4 <= n:
        a0 += s_w[s] * part_out[row, base + s, d]
        a1 += s_w[s + 1] * part_out[row, base + s + 1, d]
        a2 += s_w[s + 2] * part_out[row, base + s + 2, d]
        a3 += s_w[s + 3] * part_out[row, base + s + 3, d]
        s += 4
    while s < n:
        a0 += s_w[s] * part_out[row, base + s, d]
        s += 1
    return (a0 + a1) + (a2 + a3)
