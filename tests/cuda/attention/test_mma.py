"""The tensor-core helpers (hexcore/cuda/mma.py) against numpy, through small kernels.

On the simulator these check the twins (and so the fragment layout the decode kernel
relies on); with ``-m gpu`` the same kernels check the inline PTX on the hardware.
"""

import numpy as np
import pytest
from numba import cuda

from hexcore.cuda.mma import dequant_f16x2, mma_f16, pack_f16x2, prmt


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
def _bits_kernel(words, scales, lows, sel_out, deq_out, packed):
    i = cuda.grid(1)
    if i < words.shape[0]:
        sel_out[i, 0] = prmt(words[i], words[i - 1], 0x5410)
        sel_out[i, 1] = prmt(words[i], words[i - 1], 0x7632)
        sel_out[i, 2] = prmt(words[i], words[i - 1], 0x3210)
        for j in range(4):  # INT4 pairs: elements j and j + 4 of the word
            deq_out[i, j] = dequant_f16x2(words[i], 4 * j, 0x000F000F, scales[i], lows[i])
        packed[i] = pack_f16x2(np.float32(i) * np.float32(0.1), np.float32(-i))


def check_mma(rng):
    A = rng.standard_normal((16, 16)).astype(np.float16)
    B = rng.standard_normal((16, 8)).astype(np.float16)
    C = rng.standard_normal((16, 8)).astype(np.float32)
    out = cuda.to_device(np.full((16, 8), np.nan, np.float32))
    _mma_kernel[1, 32](A.view(np.uint32), np.ascontiguousarray(B.T).view(np.uint32), C, out)
    expect = A.astype(np.float64) @ B.astype(np.float64) + C
    np.testing.assert_allclose(out.copy_to_host(), expect, rtol=1e-5, atol=1e-5)


def check_bits(rng):
    n = 64
    words = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
    scales = rng.uniform(0.01, 1, (n, 2)).astype(np.float16)
    lows = rng.uniform(-2, 2, (n, 2)).astype(np.float16)
    sel, deq, packed = (cuda.to_device(np.zeros(s, np.uint32)) for s in ((n, 3), (n, 4), (n,)))
    _bits_kernel[1, n](words, scales.view(np.uint32).ravel(), lows.view(np.uint32).ravel(), sel, deq, packed)
    prev = np.roll(words, 1)
    lo16, hi16 = words & 0xFFFF, words >> 16
    expect_sel = np.stack([lo16 | ((prev & 0xFFFF) << 16), hi16 | (prev & 0xFFFF0000), words], axis=1)
    np.testing.assert_array_equal(sel.copy_to_host(), expect_sel.astype(np.uint32))
    got = deq.copy_to_host().view(np.float16).reshape(n, 4, 2).astype(np.float64)
    for j in range(4):
        codes = np.stack([(words >> (4 * j)) & 15, (words >> (4 * j + 16)) & 15], axis=1).astype(np.float64)
        expect = (codes * scales + lows.astype(np.float64)).astype(np.float16)  # one rounding, like fma.rn
        np.testing.assert_array_equal(got[:, j], expect.astype(np.float64))
    expect_pack = np.stack([np.arange(n) * np.float32(0.1), -np.arange(n)], axis=1).astype(np.float32)
    np.testing.assert_array_equal(packed.copy_to_host().view(np.float16).reshape(n, 2),
                                  expect_pack.astype(np.float16))


def test_mma_matches_numpy():
    check_mma(np.random.default_rng())


def test_bit_helpers_match_numpy():
    check_bits(np.random.default_rng())


@pytest.mark.gpu
def test_mma_and_bit_helpers_on_gpu():
    rng = np.random.default_rng()
    check_mma(rng)
    check_bits(rng)
