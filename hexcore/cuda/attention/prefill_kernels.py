"""The kernels of ``prefill.py``: gather a sequence's cached prefix (dequantized) and its
new tokens into a contiguous FP16 scratch, and causal extend attention over that scratch
on CUDA cores.

Scratch layout, per layer: ``k``, ``v`` float16 ``[H, S, D]`` with ``S = prefix_len +
n_new``: position ``p`` of KV head ``h`` is row ``(h, p)``. Positions below
``(prefix_len // block_size) * block_size`` come from sealed blocks (dequantized exactly
as ``blocks.dequantize_blocks`` does, float32 then rounded to float16), the rest of the
prefix from the sequence's FP16 tail, and positions from ``prefix_len`` on from the new
tokens' K/V.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda, float32

from ... import layout
from ..device_layout import code_offset, key_meta_offset, tail_offset, value_meta_offset

key_code_field = cuda.jit(device=True)(layout.key_code_field)
value_code_field = cuda.jit(device=True)(layout.value_code_field)

GATHER_THREADS = 256
DIMS_PER_THREAD = 8  # one 16-byte chunk of a float16 row (every head_dim is a multiple of 8)
EXTEND_THREADS = 128
ROWS = 16  # query rows (query token, query head of one KV head) per CTA
LANES = EXTEND_THREADS // ROWS  # threads that share one query row
NAN = float32(math.nan)  # (a float16 constant is invalid NVVM IR; stores convert it)


# -- gather ---------------------------------------------------------------------------
def _sealed_readers(cfg):
    """Device functions ``(key_at, value_at)``: float32 element (layer, block, head, token,
    dim) of a sealed block, from the store's flat arrays (codes as float16 for FP16 stores,
    as uint32 words otherwise; metadata float16)."""
    H, BS, D, GS = cfg.num_kv_heads, cfg.block_size, cfg.head_dim, cfg.group_size
    bits, row, NG = cfg.kv_dtype.bits, cfg.row_bytes, cfg.num_groups

    if not cfg.kv_dtype.is_quantized:
        @cuda.jit(device=True)
        def fp16_at(codes, meta, layer, block, h, t, d, num_blocks):
            return float32(codes[code_offset(layer, block, h, t, num_blocks, H, BS, row) // 2 + d])

        return fp16_at, fp16_at

    mask = np.uint32((1 << bits) - 1)
    chunk = layout.value_chunk_dims(GS)

    @cuda.jit(device=True)
    def key_at(words, meta, layer, block, h, t, d, num_blocks):
        word, field = key_code_field(d, bits)
        at = code_offset(layer, block, h, t, num_blocks, H, BS, row) // 4 + word
        q = float32((words[at] >> np.uint32(field * bits)) & mask)
        m = key_meta_offset(layer, block, h, num_blocks, H, D) // 2
        return float32(meta[m + d]) * q + float32(meta[m + D + d])

    @cuda.jit(device=True)
    def value_at(words, meta, layer, block, h, t, d, num_blocks):
        word, field = value_code_field(t, d, bits, D, chunk)
        at = code_offset(layer, block, h, 0, num_blocks, H, BS, row) // 4 + word
        q = float32((words[at] >> np.uint32(field * bits)) & mask)
        m = value_meta_offset(layer, block, h, t, num_blocks, H, BS, NG) // 2
        return float32(meta[m + d // GS]) * q + float32(meta[m + NG + d // GS])

    return key_at, value_at


@functools.cache
def gather_kernel(cfg):
    """The gather kernel of a cache config; grid ``ceil(H * S * D / 8 / GATHER_THREADS)``.

    One thread writes ``DIMS_PER_THREAD`` consecutive channels of one (head, position)
    row of K and of V. A sealed block id outside ``[0, num_blocks)`` (a device table is
    not checked) gives NaN rows, so a bad table shows in the output.
    """
    H, BS, D = cfg.num_kv_heads, cfg.block_size, cfg.head_dim
    key_at, value_at = _sealed_readers(cfg)
    chunks = D // DIMS_PER_THREAD

    @cuda.jit
    def kernel(k_src, v_src, k_meta, v_meta, k_tails, v_tails, table, layer, num_blocks, max_seqs, slot,
               prefix_len, k_new, v_new, k_out, v_out):
        # k_src, v_src: flat sealed codes; k_meta, v_meta: flat float16 metadata; k_tails,
        # v_tails: flat float16 tails; table: int32 [>= prefix_len // BS];
        # k_new, v_new: [n_new, H, D] float16; k_out, v_out: [H, prefix_len + n_new, D] float16
        S = k_out.shape[1]
        i = cuda.grid(1)
        if i >= H * S * chunks:
            return
        d0 = (i % chunks) * DIMS_PER_THREAD
        p = (i // chunks) % S
        h = i // (chunks * S)
        sealed = (prefix_len // BS) * BS
        if p >= prefix_len:  # a new token
            for e in range(DIMS_PER_THREAD):
                k_out[h, p, d0 + e] = k_new[p - prefix_len, h, d0 + e]
                v_out[h, p, d0 + e] = v_new[p - prefix_len, h, d0 + e]
        elif p >= sealed:  # the prefix's open tail
            at = tail_offset(layer, slot, h, p - sealed, max_seqs, H, BS, D) // 2 + d0
            for e in range(DIMS_PER_THREAD):
                k_out[h, p, d0 + e] = k_tails[at + e]
                v_out[h, p, d0 + e] = v_tails[at + e]
        else:
            block = table[p // BS]
            t = p % BS
            for e in range(DIMS_PER_THREAD):
                if block < 0 or block >= num_blocks:
                    k_out[h, p, d0 + e] = NAN
                    v_out[h, p, d0 + e] = NAN
                else:
                    k_out[h, p, d0 + e] = key_at(k_src, k_meta, layer, block, h, t, d0 + e, num_blocks)
                    v_out[h, p, d0 + e] = value_at(v_src, v_meta, layer, block, h, t, d0 + e, num_blocks)

    return kernel


def gather_grid(cfg, total_positions: int) -> int:
    """CTAs of a gather of ``total_positions`` positions per head."""
    threads = cfg.num_kv_heads * total_positions * (cfg.head_dim // DIMS_PER_THREAD)
    return (threads + GATHER_THREADS - 1) // GATHER_THREADS


# -- extend attention -----------------------------------------------------------------
@functools.cache
def extend_kernel(head_dim: int, group: int):
    """Causal extend attention over a scratch, on CUDA cores (float32 throughout).

    Grid ``(ceil(n_new * group / ROWS), H)``, ``EXTEND_THREADS`` threads. A CTA takes
    ``ROWS`` consecutive rows ``f = i * group + g`` (query token ``i``, query head
    ``h * group + g``) of KV head ``h``: they share every key and value tile it loads.
    Thread ``(r, lane)`` = ``(tid // LANES, tid % LANES)`` scores keys ``lane, lane +
    LANES, ...`` of each tile for row ``r`` and accumulates channels ``lane, lane + LANES,
    ...`` of its output; an online softmax (running max and sum, the same in each lane of
    a row) merges the tiles. Query ``i`` sees positions ``0 .. prefix_len + i``.
    """
    D = head_dim
    KT = 32 if D <= 128 else 8  # keys per tile (static shared memory stays under 48 KB)
    KEYS_PER_LANE = KT // LANES
    DIMS_PER_LANE = D // LANES
    K_ROW = D + 1  # k_tile row stride: lanes of a row read distinct banks
    NEG_INF = float32(-math.inf)

    @cuda.jit
    def kernel(q, k, v, prefix_len, scale, out):
        # q: [n_new, Hq, D] f16; k, v: [H, S, D] f16 scratch; out: [n_new, Hq, D] f16
        h = cuda.blockIdx.y
        tid = cuda.threadIdx.x
        r = tid // LANES
        lane = tid % LANES
        n_new = q.shape[0]
        total_rows = n_new * group
        first = cuda.blockIdx.x * ROWS
        q_tile = cuda.shared.array((ROWS, D), float32)
        k_tile = cuda.shared.array((KT, K_ROW), float32)
        v_tile = cuda.shared.array((KT, D), float32)
        p_tile = cuda.shared.array((ROWS, KT), float32)
        red = cuda.shared.array((ROWS, LANES), float32)
        acc = cuda.local.array(DIMS_PER_LANE, float32)

        for x in range(tid, ROWS * D, EXTEND_THREADS):
            f = first + x // D
            q_tile[x // D, x % D] = float32(q[f // group, h * group + f % group, x % D]) if f < total_rows else 0
        f = first + r
        valid = f < total_rows
        limit = prefix_len + (f // group if valid else 0)  # the last position this row sees
        last_row = min(first + ROWS, total_rows) - 1
        num_keys = prefix_len + last_row // group + 1  # positions any row of the CTA sees
        m_run = NEG_INF
        l_run = float32(0)
        for c in range(DIMS_PER_LANE):
            acc[c] = 0
        for j0 in range(0, num_keys, KT):
            cuda.syncthreads()  # the previous tile is no longer read
            for x in range(tid, KT * D, EXTEND_THREADS):
                j, d = x // D, x % D
                inside = j0 + j < num_keys
                k_tile[j, d] = float32(k[h, j0 + j, d]) if inside else 0
                v_tile[j, d] = float32(v[h, j0 + j, d]) if inside else 0
            cuda.syncthreads()  # q, k and v tiles loaded
            m_lane = NEG_INF
            for jj in range(KEYS_PER_LANE):
                j = lane + LANES * jj
                s = NEG_INF
                if j0 + j <= limit and j0 + j < num_keys:
                    s = float32(0)
                    for d in range(D):
                        s += q_tile[r, d] * k_tile[j, d]
                    s *= scale
                p_tile[r, j] = s
                m_lane = max(m_lane, s)
            red[r, lane] = m_lane
            cuda.syncthreads()  # every lane's max of the tile written
            m_new = m_run
            for x in range(LANES):
                m_new = max(m_new, red[r, x])
            cuda.syncthreads()  # red read by every lane: it is reused for the sums
            # m_new is finite: position 0 is visible to every row, in the first tile
            alpha = math.exp(m_run - m_new)
            s_lane = float32(0)
            for jj in range(KEYS_PER_LANE):
                j = lane + LANES * jj
                e = math.exp(p_tile[r, j] - m_new)  # exp(-inf) = 0 for masked keys
                p_tile[r, j] = e
                s_lane += e
            red[r, lane] = s_lane
            cuda.syncthreads()  # probabilities and lane sums written
            s_tile = float32(0)
            for x in range(LANES):
                s_tile += red[r, x]
            l_run = l_run * alpha + s_tile
            m_run = m_new
            for c in range(DIMS_PER_LANE):
                d = lane + LANES * c
                a = acc[c] * alpha
                for j in range(KT):
                    a += p_tile[r, j] * v_tile[j, d]
                acc[c] = a
        if valid:
            i, hq = f // group, h * group + f % group
            for c in range(DIMS_PER_LANE):
                out[i, hq, lane + LANES * c] = acc[c] / l_run

    return kernel


def extend_grid(n_new: int, group: int, num_kv_heads: int) -> tuple[int, int]:
    """The extend kernel's grid for ``n_new`` tokens."""
    return (n_new * group + ROWS - 1) // ROWS, num_kv_heads
