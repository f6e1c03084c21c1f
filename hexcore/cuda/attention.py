"""Paged decode attention on CUDA cores, split-K (FP16 MHA, and layouts attention_tc.py
does not take).

One CTA of 128 threads handles one (split, KV head, sequence): a run of up to
``SPLIT_TOKENS`` tokens of one sequence, for all ``G = num_q_heads // num_kv_heads``
query heads that share the KV head, so every K/V byte is read once. A merge kernel
combines the splits (Flash-Decoding).

Inside a CTA, warp ``w`` takes the split's virtual blocks ``w, w+4, ...``; a virtual
block is a sealed block, or the tail when it is the sequence's last. Within a block
``TPT`` lanes share one token row, each lane owning ``VW`` 32-bit words of it::

    INT4, head_dim 128, VW 4: row = 16 words = 4 lanes x 16 bytes; 8 tokens per pass

Scores:  ``s[g, t] = sum_d q'[g, d] code[t, d] + sum_d q[g, d] kmin[d]`` with
``q' = q * kscale`` computed once per block (keys are per-channel quantized).
Values:  ``o[g, d] = sum_t (p[g, t] vscale[t]) code[t, d] + sum_t p[g, t] vmin[t]``.
Codes become floats with the magic-number trick (device.py), in 32-bit arithmetic.
"""

from __future__ import annotations

import functools
import os

import numpy as np
from numba import cuda, float32

from ..layout import code_offset, key_meta_offset, tail_offset, value_meta_offset
from .codes import code_value, code_weight, vector_words
from .device import SIMULATOR, half2_hi, half2_lo, half_at, xor_sum_add, xor_sum_store
from .splits import (  # noqa: F401
    SPLIT_TOKENS,
    THREADS,
    WARPS,
    load_words,
    merge_kernel,
    split_softmax,
    write_partial,
)

_code_offset = cuda.jit(device=True)(code_offset)
_key_meta_offset = cuda.jit(device=True)(key_meta_offset)
_value_meta_offset = cuda.jit(device=True)(value_meta_offset)
_tail_offset = cuda.jit(device=True)(tail_offset)

# FP16 rows: load the next batch while computing on this one (tuning knob)
PIPELINE = os.environ.get("HEXCORE_PIPELINE", "0") == "1"
# FP16 rows: 16-byte loads each lane issues before using any (tuning knob)
FP16_PASSES_IN_FLIGHT = int(os.environ.get("HEXCORE_FP16_LOADS", "4"))
# CTAs per SM the compiler must fit (caps registers through launch bounds); 0 = no cap
MIN_CTAS_PER_SM = int(os.environ.get("HEXCORE_MIN_CTAS_PER_SM", "0"))
KERNEL_OPTIONS = {"launch_bounds": (THREADS, MIN_CTAS_PER_SM)} if MIN_CTAS_PER_SM and not SIMULATOR else {}
# paged decode on tensor cores where the layout allows (attention_tc.py); 0 = CUDA cores
TENSOR_CORES = os.environ.get("HEXCORE_TENSOR_CORES", "1") == "1"
@functools.cache
def decode_kernel(bits: int, H: int, D: int, BS: int, G: int, GS: int):
    """The split-K decode kernel for one layout, compiled on first launch and cached:
    the tensor-core kernel (attention_tc.py) where it applies, else the one below."""
    from . import attention_tc

    if TENSOR_CORES and attention_tc.supported(bits, D, BS, G, GS):
        return attention_tc.tc_decode_kernel(bits, H, D, BS, G, GS)
    quantized = bits < 16
    NG = D // GS
    row_bytes = D * bits // 8
    ROW_WORDS = row_bytes // 4
    VW = vector_words(bits, D, G)
    EPW = 32 // bits  # elements per word
    EPT = VW * EPW  # elements per lane per row
    TPT = ROW_WORDS // VW  # lanes per token row
    TPW = 32 // TPT  # tokens per warp pass
    PASSES = (BS + TPW - 1) // TPW
    NLQ = max(1, min(PASSES, 16 // VW))  # passes whose loads are issued together
    NGC = max(1, EPT // GS)  # value groups inside one lane's elements
    EPG = EPT // NGC  # elements per such group
    MASK = (1 << bits) - 1
    # FP16 rows (the tail, and FP16 blocks): 16-byte chunks
    F_TPT = D // 8
    F_TPW = 32 // F_TPT
    F_PASSES = (BS + F_TPW - 1) // F_TPW
    NLF = min(F_PASSES, FP16_PASSES_IN_FLIGHT)
    F_BATCHES = F_PASSES // NLF
    TAIL_WORDS = D // 2
    G8, G_EPT, G_NGC = G * 8, G * EPT, G * NGC  # local array sizes: compile-time constants
    HALF_WORDS = max(16, 4 * NLF)
    WORDS = 2 * HALF_WORDS  # local staging: two batches of 16-byte loads per lane

    @cuda.jit(device=True)
    def fp16_load(pool, row0, ntok, lane, words, o, batch):
        # NLF passes of 16-byte chunks of FP16 rows into words[o:o + 4 * NLF]; rows past
        # ntok load row 0 instead (always present), so nothing unwritten is read
        for u in range(NLF):
            t = (batch * NLF + u) * F_TPW + lane // F_TPT
            tt = t if t < ntok else 0
            load_words(pool, row0 + tt * TAIL_WORDS + (lane % F_TPT) * 4, 4, words, o + 4 * u)

    @cuda.jit(device=True)
    def fp16_scores(pool, row0, ntok, s_q, s_p, p0, lane, words, qh):
        # scores of FP16 rows pool[row0 + t * D/2 ...], t < ntok, into s_p[:, p0 + t]
        chunk = lane % F_TPT
        for i in range(G8):
            qh[i] = s_q[i // 8, chunk * 8 + i % 8]
        fp16_load(pool, row0, ntok, lane, words, 0, 0)
        for batch in range(F_BATCHES):
            o = (batch % 2) * HALF_WORDS if PIPELINE else 0
            if PIPELINE and batch + 1 < F_BATCHES:  # next batch's loads in flight meanwhile
                fp16_load(pool, row0, ntok, lane, words, HALF_WORDS - o, batch + 1)
            elif not PIPELINE and batch > 0:
                fp16_load(pool, row0, ntok, lane, words, 0, batch)
            for u in range(NLF):
                t = (batch * NLF + u) * F_TPW + lane // F_TPT
                tt = t if t < ntok else 0
                for g in range(G):
                    acc = float32(0)
                    for w in range(4):
                        word = words[o + 4 * u + w]
                        acc += qh[g * 8 + 2 * w] * half2_lo(word) + qh[g * 8 + 2 * w + 1] * half2_hi(word)
                    # rows past the end still shuffle (every lane must), but store nothing
                    xor_sum_store(s_p, g, p0 + tt, acc, lane, 1, F_TPT // 2, t < ntok)

    @cuda.jit(device=True)
    def fp16_values(pool, row0, ntok, s_p, p0, lane, words, acc8):
        fp16_load(pool, row0, ntok, lane, words, 0, 0)
        for batch in range(F_BATCHES):
            o = (batch % 2) * HALF_WORDS if PIPELINE else 0
            if PIPELINE and batch + 1 < F_BATCHES:
                fp16_load(pool, row0, ntok, lane, words, HALF_WORDS - o, batch + 1)
            elif not PIPELINE and batch > 0:
                fp16_load(pool, row0, ntok, lane, words, 0, batch)
            for u in range(NLF):
                t = (batch * NLF + u) * F_TPW + lane // F_TPT
                if t < ntok:
                    for g in range(G):
                        p = s_p[g, p0 + t]
                        for w in range(4):
                            acc8[g * 8 + 2 * w] += p * half2_lo(words[o + 4 * u + w])
                            acc8[g * 8 + 2 * w + 1] += p * half2_hi(words[o + 4 * u + w])

    @cuda.jit(device=True)
    def quantized_scores(pool, row0, meta_w, s_q, s_p, p0, lane, words, qp, mt):
        # scores of one sealed INT block: s = sum q*kscale*code + sum q*kmin
        chunk = lane % TPT
        c0 = chunk * EPT
        for g in range(G):
            mt[g] = 0
        for v in range(EPT // 8):  # 8 channels' scales and mins per pair of 16-byte loads
            load_words(pool, meta_w + (c0 + v * 8) // 2, 4, words, 0)
            load_words(pool, meta_w + (D + c0 + v * 8) // 2, 4, words, 4)
            for i in range(8):
                e = v * 8 + i
                ks = half2_hi(words[i // 2]) if i % 2 else half2_lo(words[i // 2])
                km = half2_hi(words[4 + i // 2]) if i % 2 else half2_lo(words[4 + i // 2])
                weight = code_weight(e % EPW, bits) * ks
                for g in range(G):
                    qv = s_q[g, c0 + e]
                    qp[g * EPT + e] = qv * weight
                    mt[g] += qv * km
        for batch in range(PASSES // NLQ):
            for u in range(NLQ):
                t = (batch * NLQ + u) * TPW + lane // TPT
                tt = t if t < BS else 0
                load_words(pool, row0 + tt * ROW_WORDS + chunk * VW, VW, words, VW * u)
            for u in range(NLQ):
                t = (batch * NLQ + u) * TPW + lane // TPT
                tt = t if t < BS else 0
                for g in range(G):
                    acc = mt[g]
                    for w in range(VW):
                        word = words[VW * u + w]
                        for k in range(EPW):
                            acc += qp[g * EPT + w * EPW + k] * code_value(word, k, bits, MASK)
                    xor_sum_store(s_p, g, p0 + tt, acc, lane, 1, TPT // 2, t < BS)

    @cuda.jit(device=True)
    def quantized_values(pool, row0, meta_h, s_p, p0, lane, words, acc, mv, pvs):
        # acc[g, e] += sum_t p[g,t] vscale[t] code[t, e] * 2**pos(e); mv[g, j] += sum_t p vmin
        chunk = lane % TPT
        c0 = chunk * EPT
        for batch in range(PASSES // NLQ):
            for u in range(NLQ):
                t = (batch * NLQ + u) * TPW + lane // TPT
                tt = t if t < BS else 0
                load_words(pool, row0 + tt * ROW_WORDS + chunk * VW, VW, words, VW * u)
            for u in range(NLQ):
                t = (batch * NLQ + u) * TPW + lane // TPT
                if t < BS:
                    for j in range(NGC):
                        grp = (c0 + j * EPG) // GS
                        vs = half_at(pool, meta_h + t * 2 * NG + grp)
                        vm = half_at(pool, meta_h + t * 2 * NG + NG + grp)
                        for g in range(G):
                            p = s_p[g, p0 + t]
                            mv[g * NGC + j] += p * vm
                            pvs[g * NGC + j] = p * vs
                    for g in range(G):
                        for w in range(VW):
                            word = words[VW * u + w]
                            for k in range(EPW):
                                e = w * EPW + k
                                acc[g * EPT + e] += pvs[g * NGC + e // EPG] * code_value(word, k, bits, MASK)

    @cuda.jit(**KERNEL_OPTIONS)
    def kernel(pool, k_codes, v_codes, k_meta, v_meta, k_tails, v_tails, q, block_tables, seq_lens, tail_slots,
               part_out, part_ml, layer, num_blocks, max_seqs, split_blocks, scale):
        # pool: every store array as uint32 words; k_codes..v_tails: their word offsets
        # q: [B, Hq, D] f16 as words; part_out: [B*Hq, splits, D] f32; part_ml: [B*Hq, splits, 2]
        split = cuda.blockIdx.x
        h = cuda.blockIdx.y
        b = cuda.blockIdx.z
        tid = cuda.threadIdx.x
        warp = tid // 32
        lane = tid % 32
        seq_len = seq_lens[b]
        n_sealed = seq_len // BS
        n_virtual = (seq_len + BS - 1) // BS
        vb0 = split * split_blocks
        if vb0 >= n_virtual:
            return
        vb1 = min(vb0 + split_blocks, n_virtual)
        n_tok = min(seq_len, vb1 * BS) - vb0 * BS

        s_q = cuda.shared.array((G, D), float32)  # q[g, d] * softmax scale
        s_p = cuda.shared.array((G, SPLIT_TOKENS), float32)  # scores, then probabilities
        s_out = cuda.shared.array((G, D), float32)  # the CTA's unnormalised output
        s_red = cuda.shared.array(THREADS, float32)  # block reductions
        words = cuda.local.array(WORDS, np.uint32)
        qh = cuda.local.array(G8, float32)
        for i in range(tid, G * D, THREADS):
            g = i // D
            w = q[((b * H + h) * G + g) * (D // 2) + (i % D) // 2]
            s_q[g, i % D] = (half2_hi(w) if i % 2 else half2_lo(w)) * scale
            s_out[g, i % D] = 0
        for i in range(tid, G * n_tok, THREADS):
            s_p[i // n_tok, i % n_tok] = 0
        cuda.syncthreads()  # s_q, s_p, s_out ready

        # ---- scores ----------------------------------------------------------------
        qp = cuda.local.array(G_EPT, float32)
        mt = cuda.local.array(G, float32)
        for vb in range(vb0 + warp, vb1, WARPS):
            p0 = (vb - vb0) * BS
            if vb < n_sealed:
                block = block_tables[b, vb]
                row0 = k_codes + _code_offset(layer, block, h, 0, num_blocks, H, BS, row_bytes) // 4
                if quantized:
                    meta_w = k_meta + _key_meta_offset(layer, block, h, num_blocks, H, D) // 4
                    quantized_scores(pool, row0, meta_w, s_q, s_p, p0, lane, words, qp, mt)
                else:
                    fp16_scores(pool, row0, BS, s_q, s_p, p0, lane, words, qh)
            else:
                row0 = k_tails + _tail_offset(layer, tail_slots[b], h, 0, max_seqs, H, BS, D) // 4
                fp16_scores(pool, row0, n_tok - p0, s_q, s_p, p0, lane, words, qh)
        cuda.syncthreads()  # all scores written

        split_softmax(s_p, s_red, part_ml, n_tok, (b * H + h) * G, split, G)
        cuda.syncthreads()  # probabilities complete

        # ---- values -----------------------------------------------------------------
        acc = cuda.local.array(G_EPT, float32)
        acc8 = cuda.local.array(G8, float32)
        mv = cuda.local.array(G_NGC, float32)
        pvs = cuda.local.array(G_NGC, float32)
        for i in range(G_EPT):
            acc[i] = 0
        for i in range(G8):
            acc8[i] = 0
        for i in range(G_NGC):
            mv[i] = 0
        for vb in range(vb0 + warp, vb1, WARPS):
            p0 = (vb - vb0) * BS
            if vb < n_sealed:
                block = block_tables[b, vb]
                row0 = v_codes + _code_offset(layer, block, h, 0, num_blocks, H, BS, row_bytes) // 4
                if quantized:
                    meta_h = 2 * v_meta + _value_meta_offset(layer, block, h, 0, num_blocks, H, BS, NG) // 2
                    quantized_values(pool, row0, meta_h, s_p, p0, lane, words, acc, mv, pvs)
                else:
                    fp16_values(pool, row0, BS, s_p, p0, lane, words, acc8)
            else:
                row0 = v_tails + _tail_offset(layer, tail_slots[b], h, 0, max_seqs, H, BS, D) // 4
                fp16_values(pool, row0, n_tok - p0, s_p, p0, lane, words, acc8)
        # reduce the token lanes of each warp, then the warps, into s_out
        for g in range(G):
            for e in range(8):
                xor_sum_add(s_out, g, (lane % F_TPT) * 8 + e, acc8[g * 8 + e], lane, F_TPT, 16)
        if quantized:
            c0 = (lane % TPT) * EPT
            for g in range(G):
                for e in range(EPT):
                    value = acc[g * EPT + e] * code_weight(e % EPW, bits) + mv[g * NGC + e // EPG]
                    xor_sum_add(s_out, g, c0 + e, value, lane, TPT, 16)
        cuda.syncthreads()  # s_out complete
        write_partial(s_out, part_out, (b * H + h) * G, split)

    return kernel
