"""A warp's tensor-core work on one 16-token k-step: loads, scores, softmax, output.

Built per :class:`DecodeShape` by :func:`warp_functions` (closures over its sizes,
inlined into the kernel). The fragment layouts are in ``shape.py`` and mma.py; the
sealed code order they read is ``layout.key_code_field`` / ``value_code_field``.

Numerics, for a sealed INT block (keys per channel ``k = s_c * code + m_c``; values per
token and group ``v = s_t * code + m_t``):

- codes enter the mma as float16 subnormals: a code field masked out of its word (after a
  shift that the word's registers share) with nothing in the exponent bits is the exact
  float16 ``code * 2**(e - 24)``, ``e`` the field's mantissa bit, one ``and`` per register
  (the tensor cores take subnormal operands as they are; float32 accumulators hold their
  products with room to spare, ``2**-24`` is far from float32's ``2**-126``).
- scores: ``q . k = sum_c (q_c s_c) code + sum_c q_c m_c``, computed as ``S^T = K Q^T``: the
  16 tokens of a k-step are the rows of the mma (its A operand, straight from the sealed
  words), the CTA's 8 query heads its columns, so no row of the mma is padding. Key codes
  sit at ``e_c = field_exponent`` (0-8 for INT2, 0 or 4 for INT4); q is loaded once per
  item times ``2**(P - e_c)`` per register (``P = key_prescale``: factors within
  ``2**-P .. 2**P``, so ``q * s`` neither overflows nor underflows much more than
  unscaled), ``qs_c = q_c 2**(P - e_c) s_c`` is made once per block (``hmul2``), and the
  mma gives ``2**(P - 24) sum_c q_c s_c code_c``. Once per block ``fold_keys`` makes ``corr =
  sum_c q_c m_c`` per head (the mins as every token row against q, their registers times
  ``2**(e_c - P)``), and every score is ``2**(24 - P) * mma + corr`` (one ``ffma``). A lane
  then holds the scores of tokens ``gid, gid+8`` for heads ``2tig, 2tig+1``; the softmax
  reduces over the 8 lanes of a ``tig``, and one 8x8 transpose (``movmatrix``) per 8 tokens
  turns the probabilities into the B operand of the output product. FP16 tail rows take q
  unscaled (``unscale_q``, exact powers of two).
- outputs: ``sum_t p_t v_t = sum_t (p_t s_t) code + sum_t p_t m_t``: the probabilities,
  scaled per group by the tokens' scales, are the B operand against the codes (A, rows:
  channels), which sit at ``e = 0`` in rows ``gid`` and ``e = bits`` in rows ``gid + 8``
  (INT2's second tile of a word at 4 and 6: ``value_exponent``), so after the sealed blocks
  ``unscale_values`` multiplies each row once by ``2**(24 - e)``, before FP16 tail rows
  add to it. The mins term is one "stats" mma per
  k-step whose A rows are the group mins (rows 0..NG-1 read) and ones (row 8 read, giving
  ``l = sum_t p_t``); the rows nobody reads hold copies, so no lane tests or zeroes its
  operands.

q carries ``scale * log2(e)``, so scores are in log2 units and the softmax uses ``exp2``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import cuda, float32

from ..device import cp_async16_at, device_function, exp2, ld, load_words, shfl_idx, shfl_xor, warp_any
from ..integrity import head_chunk, head_key_ahead, head_key_opaque
from ..mma import F16X2_ONES, half2_hi, half2_lo, hmul2, mma_f16, pack_f16x2, prmt, transpose8x8
from .shape import DecodeShape

LO, HI = 0x5410, 0x7632  # prmt selectors: the low (high) halves of two words
NEG_INF = np.float32(-np.inf)
LAZY = np.float32(8.0)


class WarpFunctions(NamedTuple):
    """The device functions of one shape (see the module docstring)."""

    load_q_words: object
    scale_q: object
    unscale_q: object
    issue_chunk: object
    fold_keys: object
    chunk_codes: object
    kstep_rows: object
    finish: object
    pair_codes: object
    unscale_values: object


def _per_lane(copies: int) -> int:
    """16-byte copies per lane when a warp makes ``copies`` of them."""
    return -(-copies // 32)


def field_exponent(bits: int, j: int) -> int:
    """``e`` of ``key_code(word, j)``: codes ``j`` and ``j + 16/bits`` of a packed key word sit
    at mantissa bit ``e`` of their float16 halves (fields past bit 9 are shifted down by 8
    first)."""
    pos = j * bits
    return pos - 8 if pos + bits > 10 else pos


def key_prescale(bits: int) -> int:
    """``P`` of the quantized score product (module docstring): half the largest field exponent,
    so q's per-register factors ``2**(P - e)`` and the key mins' ``2**(e - P)`` stay within
    ``2**-P .. 2**P`` (4 for INT2, 2 for INT4)."""
    return max(field_exponent(bits, j) for j in range(16 // bits)) // 2


def key_code_function(bits: int):
    """``key_code(word, j)``: codes ``j`` and ``j + 16/bits`` of a packed key word as the
    float16 subnormal pair ``code * 2**(e - 24)`` (``e = field_exponent(bits, j)``): an ``and``
    (after one shift by 8 that the word's upper fields share), exact; the tensor cores take
    subnormal float16 operands as they are."""
    mask = (1 << bits) - 1

    @device_function
    def key_code(word, j):
        pos = j * bits
        shift = 8 if pos + bits > 10 else 0
        return (word >> np.uint32(shift)) & np.uint32((mask << (pos - shift)) * 0x10001)

    return key_code


def value_exponent(bits: int, j: int) -> int:
    """``e`` of ``value_code(word, j)``: ``bits * (2 * (j // 4) + j % 2)``, the same for the two
    registers of an mma row (slots 0 and 2: channel ``c``; 1 and 3: ``c + 1``); INT2 words
    hold two tiles (``j // 4``), the second at ``e`` 4 and 6."""
    return bits * (2 * (j // 4) + j % 2)


def value_code_function(bits: int):
    """``value_code(word, j)``: register ``j`` of a value code word (its two tokens' codes)
    as the float16 subnormal pair ``code * 2**(e - 24)``, ``e = value_exponent(bits, j)``: a
    right shift by 8 for slots 2 and 3 of a tile (``j % 4 // 2``), whose fields the seal puts
    8 bits above slots 0 and 1 (``layout.value_code_field``), one ``shf`` a word shared by
    its registers, then an ``and``, exact."""
    mask = (1 << bits) - 1

    @device_function
    def value_code(word, j):
        shift = 8 * (j % 4 // 2)
        e = bits * (2 * (j // 4) + j % 2)  # value_exponent(bits, j)
        return (word >> np.uint32(shift)) & np.uint32((mask << e) * 0x10001)

    return value_code


def warp_functions(shape: DecodeShape, joint_softmax: bool = True) -> WarpFunctions:
    """The k-step functions of ``shape`` (see the module docstring); ``joint_softmax``: one
    softmax update per 32-token chunk of a sealed INT block instead of one per k-step."""
    s = shape
    D, NG, GS = s.D, s.num_groups, s.GS
    KREGS, KW, KL = s.key_regs, s.key_words, s.key_load
    ROW_KW = D // 8  # FP16 key words per lane and row
    RPW, VW, MT, CW, NCH = s.regs_per_word, s.value_words, s.m_tiles, s.chunk, s.chunks
    META, META_LOAD = s.meta_words, min(4, s.meta_words)
    VM_WORDS = 2 * META  # value metadata words of a lane's four tokens of a k-step
    CK, RW = s.chunk_ksteps, s.D * s.bits // 32
    SOFTMAX_KSTEPS = CK if joint_softmax else 1
    RING_K, RING_V, RING_VM = s.ring_regions
    assert (RING_K + RING_V + D) % 4 == 0, "a ring stage's value metadata must be 16-byte aligned"
    QUANTIZED, s_BS = s.quantized, s.BS
    COPIES = tuple(_per_lane(words // 4) for words in (RING_K, RING_V, D, RING_VM))  # per lane and stage
    BITS = s.bits if s.quantized else 4  # (FP16 shapes never call the code functions)
    key_code, value_code = key_code_function(BITS), value_code_function(BITS)
    # the output product's rows gid (tile slots 0, 2) and gid + 8 (slots 1, 3) of m-tile t
    # back from the subnormal codes' units (value_code): UNITS[t % TILES_PER_WORD]
    TILES_PER_WORD = max(1, RPW // 4)
    UNITS = tuple((float32(2.0 ** (24 - value_exponent(BITS, 4 * w))),
                   float32(2.0 ** (24 - value_exponent(BITS, 4 * w + 1)))) for w in range(TILES_PER_WORD))
    P = key_prescale(BITS)
    KEY_UNIT = float32(2.0 ** (24 - P))  # the quantized score product's unit

    @device_function
    def reg_exponent(r):
        # field_exponent of key (and key-min) fragment register r
        pos = (r % RPW) * BITS
        return pos - 8 if pos + BITS > 10 else pos

    @device_function
    def load_q_words(q, row, lane, qh):
        # qh[r]: the raw words of q's head row `row` (channels tig*D/4 + 2r, +1), 16-byte
        # loads; scale_q makes them the mma's operand. Split so that a kernel can issue these
        # loads first and use them after other loads are in flight
        tig = (lane & 3)
        for i in range(KREGS // 4):
            load_words(q, row * (D // 2) + tig * KREGS + 4 * i, 4, qh, 4 * i)

    @device_function
    def scale_q(qh, valid, factor):
        # qh (load_q_words') times factor (a quantized kernel: times 2**(P - e) for register
        # r's field exponent e, the factor the raw codes ask for; unscale_q undoes it); zero
        # if not valid
        for r in range(KREGS):
            w = qh[r]
            f = factor * float32(1 << (8 + P - reg_exponent(r))) * float32(1.0 / 256) if QUANTIZED else factor
            qh[r] = pack_f16x2(half2_lo(w) * f, half2_hi(w) * f) if valid else np.uint32(0)

    @device_function
    def unscale_q(qh):
        # a quantized kernel's qh back to q times factor (before FP16 tail rows): exact
        # powers of two
        if QUANTIZED:
            for r in range(KREGS):
                qh[r] = hmul2(qh[r], ((15 + reg_exponent(r) - P) << 10) * 0x10001)

    @device_function
    def issue_chunk(pool, ring, stage, krun, vrun, kmeta, vmeta, k0, lane):
        # start copying chunk k0 (CK k-steps) of a sealed INT block into the ring stage at
        # word `stage` (layout: ring_layout); no registers hold the data in flight. Trip
        # counts are compile-time constants, so the copies unroll with no loop control.
        kfrom, vfrom, vmfrom = krun + 16 * k0 * RW, vrun + 32 * k0 * VW, vmeta + 16 * k0 * NG
        # (a lane's copies of one region share its first one's addresses: cp_async16_at)
        for i in range(COPIES[0]):  # key rows of the chunk's tokens
            p = lane + 32 * i
            if (RING_K // 4) % 32 == 0 or p < RING_K // 4:
                cp_async16_at(ring, stage + 4 * lane, pool, kfrom + 4 * lane, 128 * i)
        for i in range(COPIES[1]):  # value codes of its k-steps (fragment order)
            p = lane + 32 * i
            if (RING_V // 4) % 32 == 0 or p < RING_V // 4:
                cp_async16_at(ring, stage + RING_K + 4 * lane, pool, vfrom + 4 * lane, 128 * i)
        for i in range(COPIES[2]):  # the block's key scales and mins
            p = lane + 32 * i
            if (D // 4) % 32 == 0 or p < D // 4:
                cp_async16_at(ring, stage + RING_K + RING_V + 4 * lane, pool, kmeta + 4 * lane, 128 * i)
        for i in range(COPIES[3]):  # value scales and mins of the chunk's tokens
            p = lane + 32 * i
            if (RING_VM // 4) % 32 == 0 or p < RING_VM // 4:
                cp_async16_at(ring, stage + RING_K + RING_V + D + 4 * lane, pool, vmfrom + 4 * lane, 128 * i)

    @device_function
    def scaled_min(ring, at, r):
        # key-min register r (in the ring at word at + r) times 2**(e - P); no multiply
        # where e == P
        w = ld(ring, at + r)
        return w if reg_exponent(r) == P else hmul2(w, ((15 + reg_exponent(r) - P) << 10) * 0x10001)

    @device_function
    def fold_keys(ring, meta, lane, qh, qs):
        # the key mins' share of every score of the block (one value per head, the same for
        # every token: the ``corr`` of the module docstring) and ``qs``, q times the key
        # scales. The mins of fragment registers 4j..4j+3 are one A fragment as they lie in
        # the ring (no copies into a register quad), each register times 2**(e - P) to meet
        # qh's 2**(P - e): rows gid take registers 4j, 4j+2 (with q's 4j, 4j+2: chain c),
        # rows gid + 8 registers 4j+1, 4j+3 (q's 4j+1, 4j+3: chain e); each chain's other
        # rows are unused
        tig = (lane & 3)
        c0 = c1 = c2 = c3 = float32(0)
        e0 = e1 = e2 = e3 = float32(0)
        at = meta + D // 2 + tig * KREGS
        for j in range(KREGS // 4):
            w0, w1 = scaled_min(ring, at, 4 * j), scaled_min(ring, at, 4 * j + 1)
            w2, w3 = scaled_min(ring, at, 4 * j + 2), scaled_min(ring, at, 4 * j + 3)
            c0, c1, c2, c3 = mma_f16(w0, w1, w2, w3, qh[4 * j], qh[4 * j + 2], c0, c1, c2, c3)
            e0, e1, e2, e3 = mma_f16(w0, w1, w2, w3, qh[4 * j + 1], qh[4 * j + 3], e0, e1, e2, e3)
        for r in range(KREGS):
            qs[r] = hmul2(qh[r], ld(ring, meta + tig * KREGS + r))
        return c0 + e2, c1 + e3

    @device_function
    def kstep_regs(ks):
        # the fragment registers (channels) of k-step ks of a score product: (2ks, 2ks+1),
        # or in a quantized kernel (4j + i, 4j + i + 2) for ks = 2j + i, the pairs fold_keys
        # takes q in, so that q's registers pair the same way everywhere (no copies)
        if QUANTIZED:
            return 4 * (ks // 2) + ks % 2, 4 * (ks // 2) + ks % 2 + 2
        return 2 * ks, 2 * ks + 1

    @device_function
    def key_reg(kw, at, r, codes):
        # fragment register r of the key row whose words start at kw[at]: codes as float16
        # subnormals (``code * 2**(e - 24)``), or FP16 rows as they are
        return key_code(ld(kw, at + r // RPW), r % RPW) if codes else kw[at + r]

    @device_function
    def scores(kw, at0, at1, qa, codes):
        # S^T = K Q^T of one k-step: the key rows of tokens gid (this lane's words at kw[at0:])
        # and gid+8 (at kw[at1:]) are the A fragments, q the B fragments; returns
        # (S[gid, 2tig], S[gid, 2tig+1], S[gid+8, 2tig], S[gid+8, 2tig+1]) as (token, head);
        # two mma chains in flight (even and odd channel steps)
        a0 = a1 = a2 = a3 = b0 = b1 = b2 = b3 = float32(0)
        for ks in range(KREGS // 2):
            r0, r1 = kstep_regs(ks)
            x0, x1 = key_reg(kw, at0, r0, codes), key_reg(kw, at0, r1, codes)
            y0, y1 = key_reg(kw, at1, r0, codes), key_reg(kw, at1, r1, codes)
            if ks % 2 == 0:
                a0, a1, a2, a3 = mma_f16(x0, y0, x1, y1, qa[r0], qa[r1], a0, a1, a2, a3)
            else:
                b0, b1, b2, b3 = mma_f16(x0, y0, x1, y1, qa[r0], qa[r1], b0, b1, b2, b3)
        return a0 + b0, a1 + b1, a2 + b2, a3 + b3

    @device_function
    def lane_maxima(s, n):
        # the largest of this lane's n scores s[:n] of head 2tig (s[2i]) and of head 2tig+1
        # (s[2i+1])
        m0, m1 = s[0], s[1]
        for i in range(2, n, 2):
            m0 = max(m0, s[i])
            m1 = max(m1, s[i + 1])
        return m0, m1

    @device_function
    def tig_maxima(m0, m1):
        # lane_maxima's pair reduced over the 8 lanes of this tig (the head's other tokens)
        for mask in (4, 8, 16):
            m0 = max(m0, shfl_xor(m0, mask))
            m1 = max(m1, shfl_xor(m1, mask))
        return m0, m1

    @device_function
    def exponentiate(s, n, r0, r1):
        # s[:n] becomes exp2(s - r): r0 for head 2tig's scores, r1 for head 2tig+1's
        for i in range(0, n, 2):
            s[i] = exp2(s[i] - r0)
            s[i + 1] = exp2(s[i + 1] - r1)

    @device_function
    def softmax(s, n, state):
        # online softmax over the n scores s[:n] of this lane (s[2i] of head 2tig, s[2i+1] of
        # head 2tig+1; the other tokens of a head are in the lanes of the same tig); s becomes
        # exp2(s - m); state: [m of head 2tig, m of head 2tig+1, alpha of each]
        m0, m1 = lane_maxima(s, n)
        m0, m1 = tig_maxima(m0, m1)
        m0, m1 = max(m0, state[0]), max(m1, state[1])
        state[2] = exp2(state[0] - m0)
        state[3] = exp2(state[1] - m1)
        state[0], state[1] = m0, m1
        exponentiate(s, n, m0, m1)

    @device_function
    def softmax_lazy(s, n, state):
        # softmax with a lazy reference (pair_codes): s becomes exp2(s - r) for a reference
        # r at or above every score seen, so every probability is <= 1 as with the exact
        # maximum, and a probability times a value scale (hmul2, float16) is at most the
        # scale (< 43,690 for INT2 codes of finite float16 values): finite by construction.
        # r moves only when a score exceeds it, to the new maximum + LAZY (the top
        # probability then 2**-LAZY): until scores rise that far again no shuffles, no exp2
        # of alphas, no rescale. state: [r of head 2tig, r of head 2tig+1, alpha of each]
        m0, m1 = lane_maxima(s, n)
        if warp_any(m0 > state[0] or m1 > state[1]):
            m0, m1 = tig_maxima(m0, m1)
            r0 = m0 + LAZY if m0 > state[0] else state[0]
            r1 = m1 + LAZY if m1 > state[1] else state[1]
            state[2] = exp2(state[0] - r0)
            state[3] = exp2(state[1] - r1)
            state[0], state[1] = r0, r1
        else:
            state[2] = state[3] = float32(1)
        exponentiate(s, n, state[0], state[1])

    @device_function
    def rescale(o, stats, state):
        # o and stats times alpha, column by column (heads 2tig, 2tig+1); skipped by the warp
        # when no head's maximum moved, as in most k-steps after the first few
        lo, hi = state[2], state[3]
        if warp_any(lo != 1 or hi != 1):
            for i in range(MT):
                o[4 * i] *= lo
                o[4 * i + 1] *= hi
                o[4 * i + 2] *= lo
                o[4 * i + 3] *= hi
            stats[0] *= lo
            stats[1] *= hi
            stats[2] *= lo
            stats[3] *= hi

    @device_function
    def probabilities(s, i):
        # the B fragments of P^T for the output product (tokens 2tig.. and 2tig+8.. of head
        # gid) from this lane's S^T layout: one 8x8 transpose per 8 tokens
        return transpose8x8(pack_f16x2(s[i], s[i + 1])), transpose8x8(pack_f16x2(s[i + 2], s[i + 3]))

    @device_function
    def step_stats(stats, a0, a2, ones, b0, b1):
        stats[0], stats[1], stats[2], stats[3] = mma_f16(a0, ones, a2, ones, b0, b1, stats[0], stats[1], stats[2],
                                                          stats[3])

    @device_function
    def chunk_codes(ring, stage, qs, corr_lo, corr_hi, s, o, stats, state, lane):
        # CK k-steps of a sealed INT block, staged in the ring: scores, softmax (one update
        # for the chunk, or one per k-step when SOFTMAX_KSTEPS is 1), outputs
        for c0 in range(0, CK, SOFTMAX_KSTEPS):
            for c in range(c0, c0 + SOFTMAX_KSTEPS):
                row = stage + (16 * c + (lane >> 2)) * RW + ((lane & 3)) * KW
                i = 4 * (c - c0)
                s[i], s[i + 1], s[i + 2], s[i + 3] = scores(ring, row, row + 8 * RW, qs, True)
            for i in range(0, 4 * SOFTMAX_KSTEPS, 2):
                s[i] = s[i] * KEY_UNIT + corr_lo
                s[i + 1] = s[i + 1] * KEY_UNIT + corr_hi
            softmax(s, 4 * SOFTMAX_KSTEPS, state)
            rescale(o, stats, state)
            for c in range(c0, c0 + SOFTMAX_KSTEPS):
                kstep_values(ring, stage, c, s, 4 * (c - c0), o, stats, lane)


    @device_function
    def pair_codes(ring, stage_a, stage_b, meta_off, qh, qs, s, o, stats, state, lane):
        # two sealed blocks (one chunk each) with one softmax update over their 2 * CK k-steps
        corr_lo, corr_hi = fold_keys(ring, stage_a + meta_off, lane, qh, qs)
        for c in range(CK):
            row = stage_a + (16 * c + (lane >> 2)) * RW + (lane & 3) * KW
            i = 4 * c
            s[i], s[i + 1], s[i + 2], s[i + 3] = scores(ring, row, row + 8 * RW, qs, True)
        for i in range(0, 4 * CK, 2):
            s[i] = s[i] * KEY_UNIT + corr_lo
            s[i + 1] = s[i + 1] * KEY_UNIT + corr_hi
        corr_lo, corr_hi = fold_keys(ring, stage_b + meta_off, lane, qh, qs)
        for c in range(CK):
            row = stage_b + (16 * c + (lane >> 2)) * RW + (lane & 3) * KW
            i = 4 * CK + 4 * c
            s[i], s[i + 1], s[i + 2], s[i + 3] = scores(ring, row, row + 8 * RW, qs, True)
        for i in range(4 * CK, 8 * CK, 2):
            s[i] = s[i] * KEY_UNIT + corr_lo
            s[i + 1] = s[i + 1] * KEY_UNIT + corr_hi
        softmax_lazy(s, 8 * CK, state)
        rescale(o, stats, state)
        for c in range(CK):
            kstep_values(ring, stage_a, c, s, 4 * c, o, stats, lane)
        for c in range(CK):
            kstep_values(ring, stage_b, c, s, 4 * CK + 4 * c, o, stats, lane)

    @device_function
    def kstep_values(ring, stage, c, s, i, o, stats, lane):
        # the output product of staged k-step c, probabilities s[i:i+4]
        gid, tig = (lane >> 2), (lane & 3)
        b0, b1 = probabilities(s, i)
        # the value metadata of tokens 2tig, 2tig+1 (words 0..2NG-1 of vm) and 2tig+8, 2tig+9
        # (words 2NG..), 8- or 16-byte loads (scalar loads here were 8 LDS a k-step, INT2 D128)
        vm = cuda.local.array(VM_WORDS, np.uint32)
        meta0 = stage + RING_K + RING_V + D + (16 * c + 2 * tig) * NG
        for h in range(2):
            for w in range(0, 2 * NG, META_LOAD):
                load_words(ring, meta0 + 8 * NG * h + w, META_LOAD, vm, 2 * NG * h + w)
        # stats rows: the mins of group gid % NG in rows gid, ones in rows gid + 8. Only rows
        # 0..NG-1 and 8 are read (finish), so no lane needs a test or a zero
        a0 = _meta_pair(vm, 0, NG + gid % NG)
        a2 = _meta_pair(vm, 2 * NG, NG + gid % NG)
        step_stats(stats, a0, a2, F16X2_ONES, b0, b1)
        vw = stage + RING_K + (c * 32 + lane) * VW
        for t in range(MT):
            g = (8 * (t // (CW // 2)) * CW) // GS
            bs0 = hmul2(b0, _meta_pair(vm, 0, g))
            bs1 = hmul2(b1, _meta_pair(vm, 2 * NG, g))
            q0 = 4 * t
            o[q0], o[q0 + 1], o[q0 + 2], o[q0 + 3] = mma_f16(
                value_code(ld(ring, vw + q0 // RPW), q0 % RPW),
                value_code(ld(ring, vw + (q0 + 1) // RPW), (q0 + 1) % RPW),
                value_code(ld(ring, vw + (q0 + 2) // RPW), (q0 + 2) % RPW),
                value_code(ld(ring, vw + (q0 + 3) // RPW), (q0 + 3) % RPW),
                bs0, bs1, o[q0], o[q0 + 1], o[q0 + 2], o[q0 + 3])

    @device_function
    def _meta_pair(vm, base, half):
        # float16 pair (token 0, token 1) of half `half` of a token's metadata (s_0..s_NG-1,
        # m_0..m_NG-1), the two tokens' words at vm[base:base+NG] and vm[base+NG:...]
        if NG == 1:
            return prmt(ld(vm, base), ld(vm, base + 1), HI if half else LO)
        return prmt(ld(vm, base + half // 2), ld(vm, base + NG + half // 2), HI if half % 2 else LO)

    @device_function
    def key_terms(total, kw, kstep, lane):
        # total + the head-digest terms of the key words kstep_rows loaded (FP16 block): words
        # tig * ROW_KW.. of the key row of token 16 kstep + 8 n + gid (each word of the block
        # is loaded by one lane of the warp)
        gid, tig = lane >> 2, lane & 3
        for n in range(2):
            key = head_key_opaque((16 * kstep + 8 * n + gid) * (D // 2) + tig * ROW_KW)
            for i in range(ROW_KW // 4):
                j = n * ROW_KW + 4 * i
                total = head_chunk(total, kw[j], kw[j + 1], kw[j + 2], kw[j + 3], head_key_ahead(key, 4 * i))
        return total

    @device_function
    def value_terms(total, vw, kstep, lane):
        # the same for its value words: CW (8 c + gid) / 2.. of the value row of token
        # 16 kstep + 8 (u // 2) + 2 tig + u % 2, after the block's BS key rows
        gid, tig = lane >> 2, lane & 3
        for u in range(4):
            row = (s_BS + 16 * kstep + 8 * (u // 2) + 2 * tig + u % 2) * (D // 2)
            for c in range(NCH):
                j = (u * NCH + c) * 4
                total = head_chunk(total, vw[j], vw[j + 1], vw[j + 2], vw[j + 3],
                                   head_key_opaque(row + 4 * (8 * c + gid)))
        return total

    @device_function
    def kstep_rows(pool, kbase, vbase, kstep, ntok, lane, qh, kw, vw, s, o, stats, state, dg):
        # one k-step of FP16 rows (a tail, or an FP16 block): rows at word kbase / vbase +
        # token * D/2, tokens >= ntok masked (they read row 0, always written); in an FP16
        # kernel with dg[1] != 0 (a checked block) dg[0] also gets the terms of the words
        # loaded, each hashed where the k-step reads it anyway
        gid, tig = (lane >> 2), (lane & 3)
        for n in range(2):
            t = 16 * kstep + 8 * n + gid
            at = kbase + (t if t < ntok else 0) * (D // 2) + tig * ROW_KW
            for i in range(ROW_KW // 4):
                load_words(pool, at + 4 * i, 4, kw, n * ROW_KW + 4 * i)
        for u in range(4):
            t = 16 * kstep + 8 * (u // 2) + 2 * tig + u % 2
            at = vbase + (t if t < ntok else 0) * (D // 2)
            for c in range(NCH):
                load_words(pool, at + CW * (8 * c + gid) // 2, CW // 2, vw, (u * NCH + c) * (CW // 2))
        s[0], s[1], s[2], s[3] = scores(kw, 0, ROW_KW, qh, False)
        if not QUANTIZED:
            if dg[1] != 0:
                dg[0] = key_terms(dg[0], kw, kstep, lane)
        if 16 * kstep + gid >= ntok:  # s[0], s[1]: token gid; s[2], s[3]: token gid + 8
            s[0] = s[1] = NEG_INF
        if 16 * kstep + 8 + gid >= ntok:
            s[2] = s[3] = NEG_INF
        softmax(s, 4, state)
        rescale(o, stats, state)
        b0, b1 = probabilities(s, 0)
        step_stats(stats, 0, 0, F16X2_ONES if gid == 0 else 0, b0, b1)
        if not QUANTIZED:
            if dg[1] != 0:
                dg[0] = value_terms(dg[0], vw, kstep, lane)
        for t in range(MT):
            c, i = t // (CW // 2), t % (CW // 2)
            w0 = vw[(0 * NCH + c) * (CW // 2) + i]
            w1 = vw[(1 * NCH + c) * (CW // 2) + i]
            w2 = vw[(2 * NCH + c) * (CW // 2) + i]
            w3 = vw[(3 * NCH + c) * (CW // 2) + i]
            o[4 * t], o[4 * t + 1], o[4 * t + 2], o[4 * t + 3] = mma_f16(
                prmt(w0, w1, LO), prmt(w0, w1, HI), prmt(w2, w3, LO), prmt(w2, w3, HI), b0, b1, o[4 * t],
                o[4 * t + 1], o[4 * t + 2], o[4 * t + 3])

    @device_function
    def unscale_values(o):
        # a quantized kernel's outputs after its sealed blocks (before FP16 tail rows add
        # to them): from value_code's units to values' units, exact powers of two
        if QUANTIZED:
            for t in range(MT):
                lo, hi = UNITS[t % TILES_PER_WORD]
                o[4 * t] *= lo
                o[4 * t + 1] *= lo
                o[4 * t + 2] *= hi
                o[4 * t + 3] *= hi

    @device_function
    def finish(o, stats, state, lane):
        # the warp's partial for heads 2tig and 2tig+1: adds each value group's mins term
        # (stats row g, held by lanes 4g + tig) to o; returns (m, l) of both heads (log2 units)
        tig = (lane & 3)
        for t in range(MT):
            if QUANTIZED:
                g = (8 * (t // (CW // 2)) * CW) // GS
                lo = shfl_idx(stats[0], 4 * g + tig)
                hi = shfl_idx(stats[1], 4 * g + tig)
                o[4 * t] += lo
                o[4 * t + 1] += hi
                o[4 * t + 2] += lo
                o[4 * t + 3] += hi
        return state[0], shfl_idx(stats[2], tig), state[1], shfl_idx(stats[3], tig)

    return WarpFunctions(load_q_words, scale_q, unscale_q, issue_chunk, fold_keys, chunk_codes, kstep_rows, finish,
                         pair_codes, unscale_values)
