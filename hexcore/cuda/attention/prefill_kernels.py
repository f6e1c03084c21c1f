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
from ..device import load_u32x4
from ..device_layout import code_offset, key_meta_offset, tail_offset, value_meta_offset
from ..mma import half2_hi, half2_lo, half_at, pack_f16x2

key_code_field = cuda.jit(device=True)(layout.key_code_field)
value_code_field = cuda.jit(device=True)(layout.value_code_field)

GATHER_THREADS = 256
DIMS_PER_THREAD = 8  # one 16-byte chunk of a float16 row (every head_dim is a multiple of 8)
EXTEND_THREADS = 128
ROWS = 16  # query rows (query token, query head of one KV head) per CTA
LANES = EXTEND_THREADS // ROWS  # threads that share one query row
NAN = float32(math.nan)  # (a float16 constant is invalid NVVM IR; stores convert it)
NAN_PAIR = np.uint32(0x7E007E00)  # two float16 NaN


# -- gather ---------------------------------------------------------------------------
def _sealed_chunks(cfg):
    """Device functions ``(key_chunk, value_chunk)``: channels ``d0 .. d0 + 7`` of (layer,
    block, head, token) of a sealed block as four words of float16 pairs (low half first),
    from the store's flat uint32 code and metadata words; dequantized in float32
    (``scale * code + min``) and rounded to float16, as ``blocks.dequantize_blocks`` does."""
    H, BS, D, GS = cfg.num_kv_heads, cfg.block_size, cfg.head_dim, cfg.group_size
    bits, row, NG = cfg.kv_dtype.bits, cfg.row_bytes, cfg.num_groups

    if not cfg.kv_dtype.is_quantized:
        @cuda.jit(device=True)
        def fp16_chunk(codes, meta, layer, block, h, t, d0, num_blocks):
            return load_u32x4(codes, (code_offset(layer, block, h, t, num_blocks, H, BS, row) + 2 * d0) // 4)

        return fp16_chunk, fp16_chunk

    mask = np.uint32((1 << bits) - 1)
    chunk = layout.value_chunk_dims(GS)

    @cuda.jit(device=True)
    def key_code(words, at, d):
        word, field = key_code_field(d, bits)
        return float32((words[at + word] >> np.uint32(field * bits)) & mask)

    @cuda.jit(device=True)
    def key_chunk(words, meta, layer, block, h, t, d0, num_blocks):
        # the 8 channels' scales and mins: 16 bytes each (a head's key metadata is 4 * D bytes)
        at = code_offset(layer, block, h, t, num_blocks, H, BS, row) // 4
        m = (key_meta_offset(layer, block, h, num_blocks, H, D) + 2 * d0) // 4
        s0, s1, s2, s3 = load_u32x4(meta, m)
        n0, n1, n2, n3 = load_u32x4(meta, m + D // 2)
        return (key_pair(words, at, d0, s0, n0), key_pair(words, at, d0 + 2, s1, n1),
                key_pair(words, at, d0 + 4, s2, n2), key_pair(words, at, d0 + 6, s3, n3))

    @cuda.jit(device=True)
    def key_pair(words, at, d, scales, mins):
        # channels d, d + 1 as one word of float16 (scales, mins: their float16 pairs)
        return pack_f16x2(half2_lo(scales) * key_code(words, at, d) + half2_lo(mins),
                          half2_hi(scales) * key_code(words, at, d + 1) + half2_hi(mins))

    @cuda.jit(device=True)
    def value_code(words, at, t, d):
        word, field = value_code_field(t, d, bits, D, chunk)
        return float32((words[at + word] >> np.uint32(field * bits)) & mask)

    @cuda.jit(device=True)
    def value_chunk(words, meta, layer, block, h, t, d0, num_blocks):
        # 8 channels lie in one value group (group_size >= 32): one scale, one min
        at = code_offset(layer, block, h, 0, num_blocks, H, BS, row) // 4
        m = value_meta_offset(layer, block, h, t, num_blocks, H, BS, NG) // 2 + d0 // GS
        scale, low = half_at(meta, m), half_at(meta, m + NG)
        return (value_pair(words, at, t, d0, scale, low), value_pair(words, at, t, d0 + 2, scale, low),
                value_pair(words, at, t, d0 + 4, scale, low), value_pair(words, at, t, d0 + 6, scale, low))

    @cuda.jit(device=True)
    def value_pair(words, at, t, d, scale, low):
        return pack_f16x2(scale * value_code(words, at, t, d) + low, scale * value_code(words, at, t, d + 1) + low)

    return key_chunk, value_chunk


@functools.cache
def _prefix_chunk(cfg):
    """``prefix_chunk(...)``: channels ``8 c .. 8 c + 7`` of cached position ``p`` of KV head
    ``h`` as four K and four V words of float16 pairs: from the sealed block ``block`` (NaN
    when it is outside ``[0, num_blocks)``) below ``sealed``, else from tail ``slot``."""
    H, BS, D = cfg.num_kv_heads, cfg.block_size, cfg.head_dim
    key_chunk, value_chunk = _sealed_chunks(cfg)

    @cuda.jit(device=True)
    def prefix_chunk(k_src, v_src, k_meta, v_meta, k_tails, v_tails, block, layer, num_blocks, max_seqs, slot, h,
                     p, sealed, c):
        if p >= sealed:  # the prefix's open tail
            at = tail_offset(layer, slot, h, p - sealed, max_seqs, H, BS, D) // 4 + 4 * c
            k0, k1, k2, k3 = load_u32x4(k_tails, at)
            v0, v1, v2, v3 = load_u32x4(v_tails, at)
        elif block < 0 or block >= num_blocks:
            k0 = k1 = k2 = k3 = v0 = v1 = v2 = v3 = NAN_PAIR
        else:
            k0, k1, k2, k3 = key_chunk(k_src, k_meta, layer, block, h, p % BS, 8 * c, num_blocks)
            v0, v1, v2, v3 = value_chunk(v_src, v_meta, layer, block, h, p % BS, 8 * c, num_blocks)
        return k0, k1, k2, k3, v0, v1, v2, v3

    return prefix_chunk


@cuda.jit(device=True)
def _store_chunk(k_out, v_out, out, k0, k1, k2, k3, v0, v1, v2, v3):
    k_out[out], k_out[out + 1], k_out[out + 2], k_out[out + 3] = k0, k1, k2, k3
    v_out[out], v_out[out + 1], v_out[out + 2], v_out[out + 3] = v0, v1, v2, v3


@functools.cache
def gather_kernel(cfg):
    """The gather kernel of a cache config; grid ``ceil(H * S * D / 8 / GATHER_THREADS)``.

    One thread writes ``DIMS_PER_THREAD`` (8) consecutive channels of one (head, position)
    row of K and of V: 16-byte loads of FP16 rows (new tokens, the tail, FP16 blocks), one
    16-byte store per row. A sealed block id outside ``[0, num_blocks)`` (a device table is
    not checked) gives NaN rows, so a bad table shows in the output.
    """
    H, BS, D = cfg.num_kv_heads, cfg.block_size, cfg.head_dim
    prefix_chunk = _prefix_chunk(cfg)
    chunks, row_words = D // DIMS_PER_THREAD, D // 2

    @cuda.jit
    def kernel(k_src, v_src, k_meta, v_meta, k_tails, v_tails, table, layer, num_blocks, max_seqs, slot,
               prefix_len, k_new, v_new, k_out, v_out, S):
        # every array a flat uint32 view: k_src, v_src sealed codes; k_meta, v_meta float16
        # metadata; k_tails, v_tails float16 tails; table int32 [>= prefix_len // BS];
        # k_new, v_new [n_new, H, D] float16; k_out, v_out [H, S = prefix_len + n_new, D] float16
        i = cuda.grid(1)
        if i >= H * S * chunks:
            return
        c, p, h = i % chunks, (i // chunks) % S, i // (chunks * S)
        out = (h * S + p) * row_words + 4 * c
        sealed = (prefix_len // BS) * BS
        if p >= prefix_len:  # a new token
            at = ((p - prefix_len) * H + h) * row_words + 4 * c
            k0, k1, k2, k3 = load_u32x4(k_new, at)
            v0, v1, v2, v3 = load_u32x4(v_new, at)
            _store_chunk(k_out, v_out, out, k0, k1, k2, k3, v0, v1, v2, v3)
        else:
            block = table[p // BS] if p < sealed else 0
            _store_chunk(k_out, v_out, out, *prefix_chunk(k_src, v_src, k_meta, v_meta, k_tails, v_tails, block,
                                                          layer, num_blocks, max_seqs, slot, h, p, sealed, c))

    return kernel


@functools.cache
def gather_batch_kernel(cfg):
    """The gather of a batch of sequences, one launch; grid ``(ceil(H * S_max * D / 8 /
    GATHER_THREADS), B)``: row ``r`` writes positions ``0 .. prefix_lens[r] + n_new[r]`` of
    ``[B, H, S_max, D]`` as :func:`gather_kernel` does and zeros after (padding that an
    attention mask hides must still be finite)."""
    H, BS, D = cfg.num_kv_heads, cfg.block_size, cfg.head_dim
    prefix_chunk = _prefix_chunk(cfg)
    chunks, row_words = D // DIMS_PER_THREAD, D // 2

    @cuda.jit
    def kernel(k_src, v_src, k_meta, v_meta, k_tails, v_tails, tables, layer, num_blocks, max_seqs, slots,
               prefix_lens, n_new, k_new, v_new, k_out, v_out, S_max, n_max):
        # tables int32 [B, W]; slots, prefix_lens, n_new int32 [B]; k_new, v_new [B, n_max, H, D]
        # and k_out, v_out [B, H, S_max, D] float16 as flat uint32 views
        i = cuda.grid(1)
        r = cuda.blockIdx.y
        if i >= H * S_max * chunks:
            return
        c, p, h = i % chunks, (i // chunks) % S_max, i // (chunks * S_max)
        out = ((r * H + h) * S_max + p) * row_words + 4 * c
        prefix_len = prefix_lens[r]
        sealed = (prefix_len // BS) * BS
        if p >= prefix_len + n_new[r]:
            z = np.uint32(0)
            _store_chunk(k_out, v_out, out, z, z, z, z, z, z, z, z)
        elif p >= prefix_len:  # a new token
            at = ((r * n_max + p - prefix_len) * H + h) * row_words + 4 * c
            k0, k1, k2, k3 = load_u32x4(k_new, at)
            v0, v1, v2, v3 = load_u32x4(v_new, at)
            _store_chunk(k_out, v_out, out, k0, k1, k2, k3, v0, v1, v2, v3)
        else:
            block = tables[r, p // BS] if p < sealed else 0
            _store_chunk(k_out, v_out, out, *prefix_chunk(k_src, v_src, k_meta, v_meta, k_tails, v_tails, block,
                                                          layer, num_blocks, max_seqs, slots[r], h, p, sealed, c))

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
