"""The head digest (per block, layer and KV head, order-free) against a plain Python
reference; every single-bit flip changes it; double and multi-word damage is caught."""

from __future__ import annotations

import numpy as np
import pytest

from hexcore.errors import HexcoreInvalidArgumentError
from hexcore.host.checksum import HEAD_K1, HEAD_K2, MASK32, head_digest, head_digests, head_term


def reference(*segments) -> int:
    """The module docstring's definition, word by word in plain Python."""
    words = [int(w) for s in segments for w in np.ascontiguousarray(s).reshape(-1).view(np.uint32)]
    return sum(head_term(i, w) for i, w in enumerate(words)) & MASK32


def head_segments(rng, quantized, L=2, H=3, BS=16, D=64, NG=1):
    """A block's arrays as a host copy of the store holds them ([L, H, ...])."""
    if not quantized:
        k = rng.standard_normal((L, H, BS, D)).astype(np.float16)
        return k, rng.standard_normal((L, H, BS, D)).astype(np.float16), None, None
    k = rng.integers(0, 256, (L, H, BS, D // 2), dtype=np.uint8)
    v = rng.integers(0, 256, (L, H, BS, D // 2), dtype=np.uint8)
    km = rng.standard_normal((L, H, 2, D)).astype(np.float16)
    vm = rng.standard_normal((L, H, BS, 2, NG)).astype(np.float16)
    return k, v, km, vm


def test_head_term_values():
    """Pinned values, so a GPU or another implementation can check itself against them."""
    assert head_term(0, 0) == _mix(HEAD_K2)
    assert head_term(5, 0xDEADBEEF) == _mix((0xDEADBEEF + 5 * HEAD_K1 + HEAD_K2) & MASK32) == 0x198464F5
    assert head_term(0, 0) == 0x4BC0FBEB
    assert head_digest(np.arange(8, dtype=np.uint32)) == 0xD69F4C8E


def _mix(x):
    x ^= x >> 16
    x = (x * 0x85EBCA6B) & MASK32
    x ^= x >> 13
    x = (x * 0xC2B2AE35) & MASK32
    return x ^ (x >> 16)


def test_head_digests_match_reference(rng):
    """FP16 blocks (the decode checks INT blocks with the tensor-core digest:
    tests/host/test_tensor_digest.py)."""
    segs = head_segments(rng, False)
    got = head_digests(*segs)
    assert got.shape == (2, 3) and got.dtype == np.uint32
    for layer in range(2):
        for h in range(3):
            parts = [s[layer, h] for s in segs if s is not None]
            assert got[layer, h] == reference(*parts) == head_digest(*parts), (layer, h)


def test_order_free_lane_sums(rng):
    """32 lanes each summing chunks lane, lane + 32, ... (their indices kept) add up to the digest."""
    words = rng.integers(0, 1 << 32, 1000, dtype=np.uint32)
    lanes = [0] * 32
    for c in range(len(words) // 4):
        for j in range(4):
            lanes[c % 32] = (lanes[c % 32] + head_term(4 * c + j, int(words[4 * c + j]))) & MASK32
    assert sum(lanes) & MASK32 == head_digest(words) == reference(words)


@pytest.mark.parametrize("quantized", [False, True])
def test_every_single_bit_flip_changes_the_head_digest(rng, quantized):
    """Exhaustive over one (block, layer, head): every bit of every word of every segment."""
    segs = [s[0, 0].copy() for s in head_segments(rng, quantized, L=1, H=1) if s is not None]
    words = [s.reshape(-1).view(np.uint32) for s in segs]  # views: flipping them changes segs
    clean = head_digest(*segs)
    flips = 0
    for w in words:
        for i in range(w.shape[0]):
            for bit in range(32):
                w[i] ^= np.uint32(1 << bit)
                assert head_digest(*segs) != clean, (i, bit)
                w[i] ^= np.uint32(1 << bit)
                flips += 1
    assert head_digest(*segs) == clean
    assert flips == 32 * sum(w.shape[0] for w in words)


def test_same_bit_double_flips_are_caught_where_a_linear_term_misses_them(rng):
    """The reason for the mixer: with term = (w ^ key(i)) * P a bit flipped 0 -> 1 in one
    word's ``w ^ key(i)`` and 1 -> 0 in another's cancels (half of all same-bit double
    flips); the mixer's terms do not. Half the flips are of the top 8 bits, where a mixer
    that multiplies before its first xorshift kept too little of the flip (its term's change
    took about 15,000 distinct values for bit 31: one such pair in 2000 cancelled)."""
    n = 512
    words = rng.integers(0, 1 << 32, n, dtype=np.uint32)
    keys = (np.arange(n, dtype=np.uint64) * HEAD_K1 + HEAD_K2) & MASK32

    def linear(ws):
        return int((((ws.astype(np.uint64) ^ keys) * 0x01000193) & MASK32).sum() & MASK32)

    clean, clean_linear, missed_linear = head_digest(words), linear(words), 0
    for trial in range(2000):
        bit = int(rng.integers(32)) if trial % 2 else 31 - int(rng.integers(8))
        x = (words.astype(np.uint64) ^ keys) >> bit
        ones, zeros = np.flatnonzero(x & 1), np.flatnonzero((x & 1) == 0)
        a, b = int(rng.choice(ones)), int(rng.choice(zeros))
        bad = words.copy()
        bad[[a, b]] ^= np.uint32(1 << bit)
        assert head_digest(bad) != clean
        missed_linear += linear(bad) == clean_linear
    assert missed_linear == 2000  # each one cancels in the linear sum


def test_a_flipped_bit_changes_a_term_by_all_but_unrepeated_amounts(rng):
    """The change of a term when one bit of its word flips takes (nearly) as many values as
    there are words, for high bits too: else two same-bit flips in different words cancel
    far more often than 2**-32 (a mixer that multiplied before its first xorshift gave about
    2,700 distinct changes of 5000 for bit 31, 4,500 for bit 28)."""
    for bit in (31, 28, 24, 16, 0):
        changes = set()
        for w in rng.integers(0, 1 << 32, 5000, dtype=np.uint64).tolist():
            changes.add((head_term(7, w ^ (1 << bit)) - head_term(7, w)) & MASK32)
        assert len(changes) >= 4990, (bit, len(changes))


def test_random_multi_word_damage_is_caught(rng):
    words = rng.integers(0, 1 << 32, 2048, dtype=np.uint32)
    clean = head_digest(words)
    for _ in range(2000):
        bad = words.copy()
        at = rng.choice(words.shape[0], int(rng.integers(2, 9)), replace=False)
        bad[at] ^= rng.integers(1, 1 << 32, at.shape[0], dtype=np.uint32)
        assert head_digest(bad) != clean
    swapped = words.copy()
    swapped[[3, 700]] = swapped[[700, 3]]
    assert head_digest(swapped) != clean


def test_head_digests_bad_input_raises_typed_errors(rng):
    k, v, km, vm = head_segments(rng, True)
    with pytest.raises(HexcoreInvalidArgumentError, match=r"v_codes: expected \[2, 3, \.\.\.\]"):
        head_digests(k, v[:1], km, vm)
    with pytest.raises(HexcoreInvalidArgumentError, match="k_codes"):
        head_digests(np.zeros(4, np.uint8), v)
    with pytest.raises(HexcoreInvalidArgumentError, match="k_meta"):
        head_digests(k, v, km[:, :2], vm)
