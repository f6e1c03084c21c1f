"""FNV-1a: the published vectors, and the block checksum against a plain Python reference."""

from __future__ import annotations

import numpy as np
import pytest

from hexcore.errors import HexcoreInvalidArgumentError
from hexcore.host.checksum import (FNV32_BASIS, block_checksum, canary_word, fnv1a_32, fnv1a_64, fnv32_step,
                                   layer_digest, layer_digests)

VECTORS_32 = [(b"", 0x811C9DC5), (b"a", 0xE40C292C), (b"foobar", 0xBF9CF968)]
VECTORS_64 = [(b"", 0xCBF29CE484222325), (b"a", 0xAF63DC4C8601EC8C), (b"foobar", 0x85944171F73967E8)]


def reference_digest(*segments) -> int:
    """The module docstring's scheme, word by word in plain Python."""
    lanes = [FNV32_BASIS] * 32
    for segment in segments:
        words = [int(w) for w in np.ascontiguousarray(segment).reshape(-1).view(np.uint32)]
        for c in range(len(words) // 4):
            for w in words[4 * c:4 * c + 4]:
                lanes[c % 32] = fnv32_step(lanes[c % 32], w)
    digest = FNV32_BASIS
    for x in lanes:
        digest = fnv32_step(digest, x)
    return digest


@pytest.mark.parametrize("data, expected", VECTORS_32)
def test_fnv1a_32_published_vectors(data, expected):
    assert fnv1a_32(data) == expected
    assert fnv1a_32(np.frombuffer(data, np.uint8)) == expected


@pytest.mark.parametrize("data, expected", VECTORS_64)
def test_fnv1a_64_published_vectors(data, expected):
    assert fnv1a_64(data) == expected
    assert fnv1a_64(bytearray(data)) == expected


def test_fnv1a_of_an_array_is_of_its_bytes(rng):
    x = rng.standard_normal((3, 5)).astype(np.float16)
    assert fnv1a_32(x) == fnv1a_32(x.tobytes())
    assert fnv1a_64(x.T) == fnv1a_64(np.ascontiguousarray(x.T).tobytes())  # memory order of a C copy


@pytest.mark.parametrize("words", [4, 128, 132, 1028])
def test_layer_digest_matches_reference(rng, words):
    a = rng.integers(0, 1 << 32, words, dtype=np.uint32)
    b = rng.integers(0, 1 << 32, 8, dtype=np.uint32)
    assert layer_digest(a, b) == reference_digest(a, b)


@pytest.mark.parametrize("quantized", [False, True])
def test_layer_digests_per_layer(rng, quantized):
    L, H, BS, D = 3, 2, 16, 64
    if quantized:
        k = rng.integers(0, 256, (L, H, BS, D // 2), dtype=np.uint8)
        v = rng.integers(0, 256, (L, H, BS, D // 2), dtype=np.uint8)
        km = rng.standard_normal((L, H, 2, D)).astype(np.float16)
        vm = rng.standard_normal((L, H, BS, 2, 1)).astype(np.float16)
        got = layer_digests(k, v, km, vm)
        expected = [reference_digest(k[i], v[i], km[i], vm[i]) for i in range(L)]
    else:
        k = rng.standard_normal((L, H, BS, D)).astype(np.float16)
        v = rng.standard_normal((L, H, BS, D)).astype(np.float16)
        got = layer_digests(k, v)
        expected = [reference_digest(k[i], v[i]) for i in range(L)]
    assert got.dtype == np.uint32 and got.tolist() == expected


def test_every_single_bit_flip_changes_the_digest(rng):
    # a tiny INT2 block, 1 layer: 256 + 256 code bytes, 256 + 64 metadata bytes = 6656 bits
    k = rng.integers(0, 256, (1, 1, 16, 16), dtype=np.uint8)
    v = rng.integers(0, 256, (1, 1, 16, 16), dtype=np.uint8)
    km = rng.integers(0, 256, (1, 1, 2, 64, 2), dtype=np.uint8).view(np.float16)[..., 0]
    vm = rng.integers(0, 256, (1, 1, 16, 2, 2), dtype=np.uint8).view(np.float16)
    arrays = [k, v, np.ascontiguousarray(km), vm]
    clean = layer_digests(*arrays)[0]
    flips = 0
    for which, array in enumerate(arrays):
        raw = array.view(np.uint8).reshape(-1)
        for byte in range(raw.size):
            for bit in range(8):
                raw[byte] ^= 1 << bit
                assert layer_digests(*arrays)[0] != clean, (which, byte, bit)
                raw[byte] ^= 1 << bit
                flips += 1
    assert flips == 8 * (256 + 256 + 256 + 64)
    assert layer_digests(*arrays)[0] == clean


def test_block_checksum_folds_layer_digests():
    digests = np.array([1, 2, 0xFFFFFFFF], np.uint32)
    expected = FNV32_BASIS
    for d in digests.tolist():
        expected = fnv32_step(expected, d)
    assert block_checksum(digests) == expected
    assert block_checksum(digests[::-1]) != expected


def test_canary_words_are_distinct_and_never_trivial():
    words = [canary_word(g, i) for g in range(8) for i in range(64)]
    assert len(set(words)) == len(words)
    assert all(0 < w < 0xFFFFFFFF for w in words)


def test_bad_input_raises_typed_errors():
    with pytest.raises(HexcoreInvalidArgumentError, match="data: expected bytes or a numpy array, got str"):
        fnv1a_32("abc")
    with pytest.raises(HexcoreInvalidArgumentError, match="k_codes: expected"):
        layer_digests(np.zeros((2, 3), np.uint8), np.zeros((2, 16), np.uint8))
    with pytest.raises(HexcoreInvalidArgumentError, match="v_codes: expected"):
        layer_digests(np.zeros((2, 16), np.uint8), np.zeros((3, 16), np.uint8))
