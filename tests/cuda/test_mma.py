"""The tensor-core and packed-half helpers (cuda/mma.py, attention/fragments' code functions)
against numpy, through small kernels.

On the simulator these check the twins (and so the fragment layout the decode kernel
relies on); with ``-m gpu`` the same kernels check the inline PTX on the hardware.
"""

import numpy as np
import pytest
from numba import cuda

from hexcore.cuda.attention.fragments import field_exponent, key_code_function, value_code_function, value_exponent
from hexcore.cuda.mma import half2_hi, half2_lo, hfma2, hmul2, mma_f16, mma_u8s8, pack_f16x2, prmt
from hexcore.cuda.device import xor_rotl_and_u32

key4, key2 = key_code_function(4), key_code_function(2)
value4, value2 = value_code_function(4), value_code_function(2)


@cuda.jit
def _mma_kernel(a_words, b_words, c, out):
    # a_words [16, 8] uint32 (A [16, 16] f16, row-major), b_words [8, 8] (B^T [8, 16]),
    # c, out [16, 8] float32: out = A @ B + c, one warp, fragments as mma.py documents
    lane = cuda.threadIdx.x
    g, t = lane // 4, lane % 4
    d = mma_f16(a_words[g, t], a_words[g + 8, t], a_words[g, t + 4], a_words[g + 8, t + 4],
                b_words[g, t], b_words[g, t + 4],
                c[g, 2 * t], c[g, 2 * t + 1], c[g + 8, 2 * t], c[g + 8, 2 * t + 1])
    out[g, 2 * t], out[g, 2 * t + 1], out[g + 8, 2 * t], out[g + 8, 2 * t + 1] = d


@cuda.jit
def _imma_kernel(a, b, c, out, rot):
    # a [16, 32] uint8, b [32, 8] int8 as stored bytes (uint8), c, out [16, 8] uint32: out =
    # A @ B + c mod 2**32, one warp, the fragments packed here byte by byte as mma.py
    # documents; rot [32] uint32: xor_rotl_and_u32 of lane-made words
    lane = cuda.threadIdx.x
    g, t = lane // 4, lane % 4
    w = cuda.local.array(6, np.uint32)
    for q in range(4):  # a_q: row g + 8 (q % 2), columns 4t + 16 (q // 2) + i
        x = 0
        for i in range(4):
            x |= int(a[g + 8 * (q % 2), 4 * t + 16 * (q // 2) + i]) << (8 * i)
        w[q] = x
    for j in range(2):  # b_j: rows 16 j + 4t + i, column g
        x = 0
        for i in range(4):
            x |= int(b[16 * j + 4 * t + i, g]) << (8 * i)
        w[4 + j] = x
    d = mma_u8s8(w[0], w[1], w[2], w[3], w[4], w[5], c[g, 2 * t], c[g, 2 * t + 1], c[g + 8, 2 * t],
                 c[g + 8, 2 * t + 1])
    out[g, 2 * t], out[g, 2 * t + 1], out[g + 8, 2 * t], out[g + 8, 2 * t + 1] = d
    rot[lane] = xor_rotl_and_u32(w[0], w[4], 2 * (lane % 16) + 1, 0xFEFEFEFE)


@cuda.jit
def _bits_kernel(words, halves, sel_out, code4, code2, arith, packed, unpacked):
    # code4 [n, 2, 4], code2 [n, 2, 8]: key_code, value_code of every register
    i = cuda.grid(1)
    if i < words.shape[0]:
        sel_out[i, 0] = prmt(words[i], words[i - 1], 0x5410)
        sel_out[i, 1] = prmt(words[i], words[i - 1], 0x7632)
        sel_out[i, 2] = prmt(words[i], words[i - 1], 0x3210)
        for j in range(4):
            code4[i, 0, j] = key4(words[i], j)
            code4[i, 1, j] = value4(words[i], j)
        for j in range(8):
            code2[i, 0, j] = key2(words[i], j)
            code2[i, 1, j] = value2(words[i], j)
        arith[i, 0] = hmul2(halves[i, 0], halves[i, 1])
        arith[i, 1] = hfma2(halves[i, 0], halves[i, 1], halves[i, 2])
        packed[i] = pack_f16x2(np.float32(i) * np.float32(0.1), np.float32(-i))
        unpacked[i, 0] = half2_lo(halves[i, 0])
        unpacked[i, 1] = half2_hi(halves[i, 0])


def check_mma(rng, subnormal=False):
    # subnormal: A holds value codes as code_small makes them (code * 2**(e - 24), e = 0..4),
    # which the tensor cores must take as they are (no flush to zero)
    A = rng.standard_normal((16, 16)).astype(np.float16)
    if subnormal:
        A = (rng.integers(0, 16, (16, 16)) * 2.0 ** (rng.integers(0, 5, (16, 16)) - 24)).astype(np.float16)
        assert np.count_nonzero(A) > 200 and np.all(np.abs(A) < np.float16(2.0 ** -14))
    B = rng.standard_normal((16, 8)).astype(np.float16)
    C = rng.standard_normal((16, 8)).astype(np.float32) * np.float32(2.0 ** -24 if subnormal else 1.0)
    out = cuda.to_device(np.full((16, 8), np.nan, np.float32))
    _mma_kernel[1, 32](A.view(np.uint32), np.ascontiguousarray(B.T).view(np.uint32), C, out)
    expect = A.astype(np.float64) @ B.astype(np.float64) + C
    if not subnormal:
        np.testing.assert_allclose(out.copy_to_host(), expect, rtol=1e-5, atol=1e-5)
        return
    # at the product's own scale, within 1e-6 of the terms' magnitudes: the tensor cores'
    # float32 sums round differently from float64 (the H200 was 6e-5 off a 0.95 that
    # cancelled terms of hundreds); a flushed subnormal would be off by whole terms
    unit = 2.0 ** 24
    bound = 1e-6 * (np.abs(A.astype(np.float64)) @ np.abs(B.astype(np.float64)) + np.abs(C)) * unit
    assert np.all(np.abs(out.copy_to_host() * unit - expect * unit) <= bound + 1e-9)


def check_imma(rng):
    """The integer mma (u8 x s8, int32 sums wrapping in uint32) and the rotate helper."""
    A = rng.integers(0, 256, (16, 32), dtype=np.uint8)
    B = rng.integers(-128, 128, (32, 8)).astype(np.int8)
    C = rng.integers(0, 1 << 32, (16, 8), dtype=np.uint64).astype(np.uint32)
    out, rot = cuda.to_device(np.zeros((16, 8), np.uint32)), cuda.to_device(np.zeros(32, np.uint32))
    _imma_kernel[1, 32](A, B.view(np.uint8), C, out, rot)
    expect = (A.astype(np.int64) @ B.astype(np.int64) + C.astype(np.int64)) & 0xFFFFFFFF
    np.testing.assert_array_equal(out.copy_to_host(), expect.astype(np.uint32))
    lanes = np.arange(32)
    words = [int.from_bytes(bytes(A[g, 4 * t:4 * t + 4]), "little") for g, t in zip(lanes // 4, lanes % 4)]
    weights = [int.from_bytes(B[4 * t:4 * t + 4, g].tobytes(), "little") for g, t in zip(lanes // 4, lanes % 4)]
    expect_rot = []
    for lane, (x, r) in enumerate(zip(words, weights)):
        n = 2 * (lane % 16) + 1
        expect_rot.append(x ^ (((r << n) | (r >> (32 - n))) & 0xFFFFFFFF & 0xFEFEFEFE))
    np.testing.assert_array_equal(rot.copy_to_host(), np.array(expect_rot, np.uint32))


def _fields(words, bits, j):
    mask = (1 << bits) - 1
    half = 16 // bits
    return np.stack([(words >> (bits * j)) & mask, (words >> (bits * (j + half))) & mask], axis=1)


def check_bits(rng):
    n = 64
    words = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
    halves = rng.uniform(-4, 4, (n, 3, 2)).astype(np.float16)
    sel, code4, code2, arith, packed = (cuda.to_device(np.zeros(s, np.uint32))
                                        for s in ((n, 3), (n, 2, 4), (n, 2, 8), (n, 2), (n,)))
    unpacked = cuda.to_device(np.zeros((n, 2), np.float32))
    _bits_kernel[1, n](words, halves.view(np.uint32).reshape(n, 3), sel, code4, code2, arith, packed, unpacked)
    prev = np.roll(words, 1)
    lo16, hi16 = words & 0xFFFF, words >> 16
    expect_sel = np.stack([lo16 | ((prev & 0xFFFF) << 16), hi16 | (prev & 0xFFFF0000), words], axis=1)
    np.testing.assert_array_equal(sel.copy_to_host(), expect_sel.astype(np.uint32))
    for bits, got, count in ((4, code4, 4), (2, code2, 8)):
        got = got.copy_to_host().view(np.float16).reshape(n, 2, count, 2).astype(np.float64)
        for j in range(count):  # key codes j and j + 16/bits, value register j's fields, times 2**(e - 24), exactly
            fields = _fields(words, bits, j).astype(np.float64)
            np.testing.assert_array_equal(got[:, 0, j] * 2.0 ** (24 - field_exponent(bits, j)), fields)
            value_fields = _fields(words, bits, 2 * (j // 4) + j % 2 + count // 2 * (j % 4 // 2)).astype(np.float64)
            np.testing.assert_array_equal(got[:, 1, j] * 2.0 ** (24 - value_exponent(bits, j)), value_fields)
    h = halves.astype(np.float64)
    got = arith.copy_to_host().view(np.float16).reshape(n, 2, 2)
    np.testing.assert_array_equal(got[:, 0], (h[:, 0] * h[:, 1]).astype(np.float16))
    np.testing.assert_array_equal(got[:, 1], (h[:, 0] * h[:, 1] + h[:, 2]).astype(np.float16))  # one rounding
    expect_pack = np.stack([np.arange(n) * np.float32(0.1), -np.arange(n)], axis=1).astype(np.float32)
    np.testing.assert_array_equal(packed.copy_to_host().view(np.float16).reshape(n, 2),
                                  expect_pack.astype(np.float16))
    np.testing.assert_array_equal(unpacked.copy_to_host(), halves[:, 0].astype(np.float32))


def test_mma_matches_numpy(rng):
    check_mma(rng)


def test_mma_takes_subnormal_codes(rng):
    check_mma(rng, subnormal=True)


def test_bit_helpers_match_numpy(rng):
    check_bits(rng)


def test_integer_mma_matches_numpy(rng):
    check_imma(rng)


@pytest.mark.gpu
def test_mma_and_bit_helpers_on_gpu(rng):
    check_mma(rng)
    check_mma(rng, subnormal=True)
    check_bits(rng)
    check_imma(rng)
