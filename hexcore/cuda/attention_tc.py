"""Paged decode attention on tensor cores (``mma.sync`` m16n8k16, float32 accumulation).

Same grid, arguments and outputs as the CUDA-core kernel in attention.py: one CTA of
four warps per (split, KV head, sequence), warp ``w`` takes the split's virtual blocks
``w, w+4, ...``; scores, a softmax over the split, then values. What changes is how a
warp handles 16 tokens of a block: on tensor cores, see tc_tiles.py.

Used when ``G <= 8``, ``block_size % 16 == 0`` and the row splits evenly into lanes
(see ``supported``); otherwise attention.py's CUDA-core kernel runs.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, float32

from .attention import KERNEL_OPTIONS
from .mma import prmt
from .splits import SPLIT_TOKENS, THREADS, WARPS, split_softmax, write_partial
from .tc_tiles import (
    HI,
    LO,
    _code_offset,
    _key_meta_offset,
    _tail_offset,
    _value_meta_offset,
    tile_functions,
)


def supported(bits: int, D: int, BS: int, G: int, GS: int = 64) -> bool:
    """Whether the tensor-core kernel handles this layout (``GS``: value group size), and
    is chosen for it: not for FP16 MHA, where one FMA per element keeps CUDA cores at
    the bandwidth limit (measured 0.99 ms there against 1.13 ms on tensor cores)."""
    row_words = D * bits // 32
    if bits == 16 and G == 1:
        return False
    return G <= 8 and BS % 16 == 0 and D in (64, 128) and row_words % 4 == 0 and (D // 8 * bits) % 32 == 0 \
        and D % GS == 0 and D // GS in (1, 2, 4, 8, 16)


def tc_decode_kernel(bits: int, H: int, D: int, BS: int, G: int, GS: int):
    """Build the tensor-core split-K decode kernel for one layout (not cached: see decode_kernel)."""
    t = tile_functions(bits, H, D, BS, G, GS)
    quantized, NG, EPW, HALF, NP, MT, DPT, NACC, MW = t.quantized, t.NG, t.EPW, t.HALF, t.NP, t.MT, t.DPT, t.NACC, t.MW
    row_bytes = t.row_bytes
    pair_of, fp16_q, key_meta_pairs, prefetch = t.pair_of, t.fp16_q, t.key_meta_pairs, t.prefetch
    score_fp16, score_codes, value_fp16, value_codes = t.score_fp16, t.score_codes, t.value_fp16, t.value_codes

    @cuda.jit(**KERNEL_OPTIONS)
    def kernel(pool, k_codes, v_codes, k_meta, v_meta, k_tails, v_tails, q, block_tables, seq_lens, tail_slots,
               part_out, part_ml, layer, num_blocks, max_seqs, split_blocks, scale):
        split = cuda.blockIdx.x
        h = cuda.blockIdx.y
        b = cuda.blockIdx.z
        tid = cuda.threadIdx.x
        warp = tid // 32
        lane = tid % 32
        gid, tig = lane // 4, lane % 4
        seq_len = seq_lens[b]
        n_sealed = seq_len // BS
        n_virtual = (seq_len + BS - 1) // BS
        vb0 = split * split_blocks
        if vb0 >= n_virtual:
            return
        vb1 = min(vb0 + split_blocks, n_virtual)
        n_tok = min(seq_len, vb1 * BS) - vb0 * BS
        row_q = (b * H + h) * G

        s_p = cuda.shared.array((G, SPLIT_TOKENS), float32)  # scores, then probabilities
        s_out = cuda.shared.array((G, D), float32)
        s_red = cuda.shared.array(THREADS, float32)
        for i in range(tid, G * D, THREADS):
            s_out[i // D, i % D] = 0
        # B fragments of q for head gid: qf for sealed rows (the code pair order), qh for
        # FP16 rows (tails, and FP16 blocks)
        qf = cuda.local.array(NP, np.uint32)
        qh = cuda.local.array(NP, np.uint32)
        qrow = (row_q + gid) * (D // 2)
        fp16_q(q, qrow, gid, tig, qh)
        for p in range(NP):
            qf[p] = 0
            if gid < G and quantized:
                _, word, j = pair_of(p, tig)
                at = qrow + (word * EPW + j) // 2
                qf[p] = prmt(q[at], q[at + HALF // 2], HI if j % 2 else LO)
        kw = cuda.local.array(32, np.uint32)
        km = cuda.local.array(16, np.uint32)
        mw = cuda.local.array(MW, np.uint32)
        sp = cuda.local.array(NP, np.uint32)
        mp = cuda.local.array(NP, np.uint32)
        offsets = (k_codes, v_codes, k_meta, v_meta, k_tails, v_tails)
        ntail = seq_len - n_sealed * BS
        if quantized and lane < 4:  # a quantized split is small (64 KB at INT4): ask for all of it
            for vb in range(vb0 + warp, vb1, WARPS):  # (measured slower for FP16: not done there)
                prefetch(pool, lane, vb, n_sealed, ntail, b, h, layer, num_blocks, max_seqs, block_tables,
                         tail_slots, offsets)
        cuda.syncthreads()  # s_out zeroed

        for vb in range(vb0 + warp, vb1, WARPS):
            p0 = (vb - vb0) * BS
            if vb < n_sealed:
                block = block_tables[b, vb]
                row0 = k_codes + _code_offset(layer, block, h, 0, num_blocks, H, BS, row_bytes) // 4
                if quantized:
                    key_meta_pairs(pool, k_meta + _key_meta_offset(layer, block, h, num_blocks, H, D) // 4, lane,
                                   sp, mp, km)
                    for t0 in range(0, BS, 16):
                        score_codes(pool, row0, BS, t0, qf, sp, mp, s_p, p0, lane, kw, scale)
                else:
                    for t0 in range(0, BS, 16):
                        score_fp16(pool, row0, BS, t0, qh, sp, mp, s_p, p0, lane, kw, scale)
            else:
                row0 = k_tails + _tail_offset(layer, tail_slots[b], h, 0, max_seqs, H, BS, D) // 4
                for t0 in range(0, n_tok - p0, 16):
                    score_fp16(pool, row0, n_tok - p0, t0, qh, sp, mp, s_p, p0, lane, kw, scale)
        cuda.syncthreads()  # all scores written

        split_softmax(s_p, s_red, part_ml, n_tok, row_q, split, G)
        cuda.syncthreads()  # probabilities complete

        acc = cuda.local.array(NACC, float32)
        for i in range(NACC):
            acc[i] = 0
        vw = cuda.local.array(32, np.uint32)
        for vb in range(vb0 + warp, vb1, WARPS):
            p0 = (vb - vb0) * BS
            if vb < n_sealed:
                block = block_tables[b, vb]
                row0 = v_codes + _code_offset(layer, block, h, 0, num_blocks, H, BS, row_bytes) // 4
                meta_h = 2 * v_meta + _value_meta_offset(layer, block, h, 0, num_blocks, H, BS, NG) // 2
                for t0 in range(0, BS, 16):
                    if quantized:
                        value_codes(pool, row0, BS, t0, s_p, p0, lane, vw, acc, meta_h, mw)
                    else:
                        value_fp16(pool, row0, BS, t0, s_p, p0, lane, vw, acc, meta_h, mw)
            else:
                row0 = v_tails + _tail_offset(layer, tail_slots[b], h, 0, max_seqs, H, BS, D) // 4
                for t0 in range(0, n_tok - p0, 16):
                    value_fp16(pool, row0, n_tok - p0, t0, s_p, p0, lane, vw, acc, 0, mw)
        for mt in range(MT):
            for k in range(4):
                g = 2 * tig + k % 2
                if g < G:
                    cuda.atomic.add(s_out, (g, gid * DPT + 2 * mt + k // 2), acc[4 * mt + k])
        cuda.syncthreads()  # s_out complete
        write_partial(s_out, part_out, row_q, split)

    return kernel
