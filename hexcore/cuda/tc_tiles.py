"""The tensor-core decode kernel's per-warp work on 16-token tiles (``mma.sync`` m16n8k16).

Lanes are ``gid = lane // 4``, ``tig = lane % 4`` as in the mma fragment layout (mma.py).

Scores ``S^T[token, head] = K[token, :] . Q^T[:, head]``: M = 16 tokens, N = 8 heads
(``G <= 8``; columns past G are zero), K = head_dim in steps of 16. The A fragments are
the key rows themselves: lane (gid, tig) loads rows ``gid`` and ``gid + 8`` with
16-byte loads at word ``(4c + tig) * VW``, so each load instruction of the warp reads
whole 64-byte runs. The dot product does not care in which order head_dim is summed,
so each loaded pair of elements is simply assigned to the k slots this lane owns, and
q is gathered once per CTA into the B fragments in the same order. INT4/INT2 pairs
come out of a code word as ``(word >> bits*j) & 0x000F000F`` (element j and j+EPW/2) and
are dequantized on two float16 at once (``dequant_f16x2``: 32-bit bit operations,
exact codes, one rounding).

Values ``O^T[dim, head] = V^T[dim, token] . P^T[token, head]``: M = 16 dims, N = 8
heads, K = 16 tokens. A fragments hold two tokens of one dim: lane (gid, tig) loads the
dims ``[gid*D/8, (gid+1)*D/8)`` of tokens ``2tig, 2tig+1, 2tig+8, 2tig+9`` and pairs the
two rows with one byte permute (``prmt``). The probabilities, packed to float16, are
the B fragments. Each lane ends with ``O`` for dims ``gid*D/8 + 2mt (+1)``, heads
``2tig (+1)``, added into shared memory across the warps.

Quantized splits are small, so the kernel asks L2 for a whole split up front
(``prefetch``: ``cp.async.bulk.prefetch.L2``, one lane per array and block).
"""

from __future__ import annotations

import types

import numpy as np
from numba import cuda, float32

from ..layout import code_offset, key_meta_offset, tail_offset, value_meta_offset
from .mma import dequant_f16x2, mma_f16, pack_f16x2, prefetch_l2, prmt
from .splits import load_words

_code_offset = cuda.jit(device=True)(code_offset)
_key_meta_offset = cuda.jit(device=True)(key_meta_offset)
_value_meta_offset = cuda.jit(device=True)(value_meta_offset)
_tail_offset = cuda.jit(device=True)(tail_offset)

LO, HI = 0x5410, 0x7632  # prmt selectors: the low (high) halves of two words


def tile_functions(bits: int, H: int, D: int, BS: int, G: int, GS: int) -> types.SimpleNamespace:
    """Device functions and compile-time sizes for one layout (see the module docstring)."""
    quantized = bits < 16
    NG = D // GS
    EPW = 32 // bits  # elements per 32-bit word
    HALF = EPW // 2  # pairs per word: element j goes with element j + HALF
    MASK2 = ((1 << bits) - 1) * 0x00010001
    RW = D * bits // 32  # words per row
    VW = min(4, RW // 4)  # words per key load
    NC = RW // (4 * VW)  # key loads per row per lane
    KW = NC * VW  # key words per row per lane
    KSTEPS = D // 16
    NP = 2 * KSTEPS  # key pairs per row per lane
    DPT = D // 8  # value dims per lane
    MT = DPT // 2  # value m-tiles
    VWV = DPT * bits // 32  # value words per row per lane
    F_VWV = DPT // 2  # the same for FP16 rows (tails)
    F_RW = D // 2
    F_KW = F_RW // 4
    NGT = max(1, DPT // GS)  # value groups inside one lane's dims
    NSV, NACC = 4 * NGT, 4 * MT  # local array sizes (compile-time constants)
    MW = 2 * NG  # value metadata words of a token pair
    NUP = max(1, 4 * VWV)
    assert MW in (2, 4, 8, 16, 32), "value groups per row: a power of two"
    row_bytes = D * bits // 8

    @cuda.jit(device=True)
    def pair_of(p, tig):
        # key pair p of this lane -> (word index in the lane's loads, its row word, j)
        if quantized:
            c, w, j = p // (VW * HALF), (p // HALF) % VW, p % HALF
        else:
            c, w, j = p // VW, p % VW, 0
        return c * VW + w, (4 * c + tig) * VW + w, j

    def make_score_tile(fp16: bool):
        rw, kvw, nkw = (F_RW, 4, F_KW) if fp16 else (RW, VW, KW)

        @cuda.jit(device=True)
        def score_tile(pool, row0, ntok, t0, qf, sp, mp, s_p, p0, lane, kw, scale):
            # scores of rows t0 .. t0+15 of a block (row words at pool[row0 + t * rw ...]) into
            # s_p[head, p0 + t] for t < ntok
            gid, tig = lane // 4, lane % 4
            for r in range(2):
                t = t0 + gid + 8 * r
                tt = t if t < ntok else 0  # rows past the end repeat row 0 (always written)
                for c in range(nkw // kvw):
                    load_words(pool, row0 + tt * rw + (4 * c + tig) * kvw, kvw, kw, r * 16 + c * kvw)
            c0 = c1 = c2 = c3 = float32(0)
            e0 = e1 = e2 = e3 = float32(0)  # odd k-steps: a second chain of mma in flight
            a = cuda.local.array(4, np.uint32)
            for ks in range(KSTEPS):
                for half in range(2):
                    p = 2 * ks + half
                    if fp16:
                        a[2 * half] = kw[p]
                        a[2 * half + 1] = kw[16 + p]
                    else:
                        i, _, j = pair_of(p, tig)
                        a[2 * half] = dequant_f16x2(kw[i], bits * j, MASK2, sp[p], mp[p])
                        a[2 * half + 1] = dequant_f16x2(kw[16 + i], bits * j, MASK2, sp[p], mp[p])
                if ks % 2 == 0:
                    c0, c1, c2, c3 = mma_f16(a[0], a[1], a[2], a[3], qf[2 * ks], qf[2 * ks + 1], c0, c1, c2, c3)
                else:
                    e0, e1, e2, e3 = mma_f16(a[0], a[1], a[2], a[3], qf[2 * ks], qf[2 * ks + 1], e0, e1, e2, e3)
            c0, c1, c2, c3 = c0 + e0, c1 + e1, c2 + e2, c3 + e3
            for k in range(4):
                t = t0 + gid + 8 * (k // 2)
                g = 2 * tig + k % 2
                value = c0 if k == 0 else (c1 if k == 1 else (c2 if k == 2 else c3))
                if g < G and t < ntok:
                    s_p[g, p0 + t] = value * scale

        return score_tile

    score_fp16 = make_score_tile(True)
    score_codes = make_score_tile(False)

    @cuda.jit(device=True)
    def fp16_q(q, qrow, gid, tig, qh):
        # qh[p]: the q words of head gid matching an FP16 row's pair p (zero past G)
        for p in range(NP):
            qh[p] = q[qrow + (4 * (p // 4) + tig) * 4 + p % 4] if gid < G else np.uint32(0)

    @cuda.jit(device=True)
    def key_meta_pairs(pool, meta_w, lane, sp, mp, km):
        # sp[p], mp[p]: the scales and mins of key pair p's two channels, as float16 pairs
        tig = lane % 4
        for i in range(KW):  # the lane's code words; pair p = i * HALF + j
            word = (4 * (i // VW) + tig) * VW + i % VW
            for c in range(HALF // 4):  # EPW / 2 meta words per code word, 16 bytes at a time
                load_words(pool, meta_w + word * HALF + 4 * c, 4, km, 4 * c)
                load_words(pool, meta_w + D // 2 + word * HALF + 4 * c, 4, km, 8 + 4 * c)
            for j in range(HALF):
                sel = HI if j % 2 else LO
                sp[i * HALF + j] = prmt(km[j // 2], km[j // 2 + HALF // 2], sel)
                mp[i * HALF + j] = prmt(km[8 + j // 2], km[8 + j // 2 + HALF // 2], sel)

    BLOCK_BYTES = BS * row_bytes

    @cuda.jit(device=True)
    def prefetch(pool, which, vb, n_sealed, ntail, b, h, layer, num_blocks, max_seqs, block_tables, tail_slots,
                 offsets):
        # one lane asks L2 for one array of virtual block vb: which = 0 K codes, 1 V codes,
        # 2 K metadata, 3 V metadata (the tail: rows of K, V); offsets = the word offsets
        if vb < n_sealed:
            block = block_tables[b, vb]
            if which < 2:
                at = _code_offset(layer, block, h, 0, num_blocks, H, BS, row_bytes) // 4
                prefetch_l2(pool, (offsets[0] if which == 0 else offsets[1]) + at, BLOCK_BYTES)
            elif which == 2:
                prefetch_l2(pool, offsets[2] + _key_meta_offset(layer, block, h, num_blocks, H, D) // 4, 4 * D)
            else:
                at = _value_meta_offset(layer, block, h, 0, num_blocks, H, BS, NG) // 4
                prefetch_l2(pool, offsets[3] + at, 4 * BS * NG)
        elif which < 2 and ntail > 0:
            at = _tail_offset(layer, tail_slots[b], h, 0, max_seqs, H, BS, D) // 4
            prefetch_l2(pool, (offsets[4] if which == 0 else offsets[5]) + at, ntail * D * 2)

    @cuda.jit(device=True)
    def pick(words, base, i):
        # words[base + i] for a run-time i < NG // 2 (0 when NG <= 2), by masks: indexing a
        # local array at a run-time position would put it in local memory
        out = words[base]
        for k in range(1, NG // 2):
            mask = np.uint32(i == k) * np.uint32(0xFFFFFFFF)
            out = (out & ~mask) | (words[base + k] & mask)
        return out

    def make_value_tile(fp16: bool):
        rw, nw = (F_RW, F_VWV) if fp16 else (RW, VWV)

        @cuda.jit(device=True)
        def value_tile(pool, row0, ntok, t0, s_p, p0, lane, vw, acc, meta_h, mw):
            # acc += V^T P^T for rows t0 .. t0+15 (rows >= ntok count as zero)
            gid, tig = lane // 4, lane % 4
            for r in range(4):
                t = t0 + 2 * tig + (r % 2) + 8 * (r // 2)
                ok = t < ntok
                base = row0 + (t if ok else 0) * rw + gid * nw
                if nw >= 4:
                    for c in range(nw // 4):
                        load_words(pool, base + 4 * c, 4, vw, r * 8 + 4 * c)
                else:
                    load_words(pool, base, nw, vw, r * 8)
                if not ok:
                    for c in range(nw):
                        vw[r * 8 + c] = 0
            b = cuda.local.array(2, np.uint32)
            for half in range(2):
                ta = t0 + 2 * tig + 8 * half
                pa = s_p[gid, p0 + ta] if gid < G and ta < ntok else float32(0)
                pb = s_p[gid, p0 + ta + 1] if gid < G and ta + 1 < ntok else float32(0)
                b[half] = pack_f16x2(pa, pb)
            sv = cuda.local.array(NSV, np.uint32)  # value scale / min pairs per (half, group)
            if not fp16:
                for half in range(2):
                    # a token pair's metadata: 2 * NG words, A's scales, A's mins, B's ...
                    at = (meta_h >> 1) + (t0 + 2 * tig + 8 * half) * NG
                    if MW <= 4:
                        load_words(pool, at, MW, mw, 0)
                    else:
                        for c in range(MW // 4):
                            load_words(pool, at + 4 * c, 4, mw, 4 * c)
                    for gi in range(NGT):
                        grp = gid * DPT // GS + gi
                        for which in range(2):  # the half k = grp + which * NG of a token's metadata
                            word = which * (NG // 2) if NG > 1 else 0
                            sel = HI if (grp + which * NG) % 2 else LO
                            sv[(half * NGT + gi) * 2 + which] = prmt(pick(mw, word, grp // 2),
                                                                     pick(mw, NG + word, grp // 2), sel)
            # codes of two tokens side by side: up[(half * VWV + i) * 2 + hi] holds the low (hi=0)
            # or high 16 bits of word i of tokens 2tig+8*half and 2tig+8*half+1
            up = cuda.local.array(NUP, np.uint32)
            if not fp16:
                for half in range(2):
                    for i in range(VWV):
                        for hi in range(2):
                            up[(half * VWV + i) * 2 + hi] = prmt(vw[16 * half + i], vw[16 * half + 8 + i],
                                                                 HI if hi else LO)
            a = cuda.local.array(4, np.uint32)
            for mt in range(MT):
                for half in range(2):
                    for odd in range(2):
                        e = 2 * mt + odd  # the lane's dim gid * DPT + e
                        if fp16:
                            x = prmt(vw[16 * half + e // 2], vw[16 * half + 8 + e // 2], HI if e % 2 else LO)
                        else:
                            i, k = e // EPW, e % EPW
                            gi = e // GS if NGT > 1 else 0
                            x = dequant_f16x2(up[(half * VWV + i) * 2 + k // HALF], bits * (k % HALF), MASK2,
                                              sv[(half * NGT + gi) * 2], sv[(half * NGT + gi) * 2 + 1])
                        a[2 * half + odd] = x
                acc[4 * mt], acc[4 * mt + 1], acc[4 * mt + 2], acc[4 * mt + 3] = mma_f16(
                    a[0], a[1], a[2], a[3], b[0], b[1], acc[4 * mt], acc[4 * mt + 1], acc[4 * mt + 2],
                    acc[4 * mt + 3])

        return value_tile

    value_fp16 = make_value_tile(True)
    value_codes = make_value_tile(False)

    return types.SimpleNamespace(**{k: v for k, v in locals().items() if not k.startswith("make_")})
