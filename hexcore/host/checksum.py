"""FNV-1a checksums: the published byte hashes, and the block checksum of a sealed block.

``fnv1a_32(data)``, ``fnv1a_64(data)``: FNV-1a over bytes (``numba.njit``), matching the
published vectors (``fnv1a_32(b"a") == 0xE40C292C``, ``fnv1a_64(b"a") == 0xAF63DC4C8601EC8C``).

The block checksum
------------------
A sealed block never changes, so a checksum taken when it is sealed holds for its whole
life. Per (block, layer) the checksum covers the block's *segments* in this order --
``k_codes``, ``v_codes``, ``k_meta``, ``v_meta`` (FP16 caches have only the first two) --
each segment being that (layer, block)'s contiguous run of the store array, read as
little-endian uint32 words (every run is a multiple of 16 bytes)::

    lane[0 .. 31] = FNV32_BASIS                        # 32 independent FNV-1a chains
    for segment in (k_codes, v_codes, k_meta, v_meta):  # the ones the cache has
        for c in range(len(segment) // 4):             # 16-byte chunks, in order
            for w in segment[4c : 4c + 4]:            # chunk c goes to lane c % 32
                lane[c % 32] = (lane[c % 32] ^ w) * FNV32_PRIME  mod 2**32
    digest = FNV32_BASIS                               # then FNV-1a over the lanes
    for x in lane[0 .. 31]:
        digest = (digest ^ x) * FNV32_PRIME  mod 2**32

That is the (block, layer) *digest* (:func:`layer_digest`); a GPU warp computes it with
lane ``i`` of the warp owning chain ``i`` and reading 16 bytes at a time, so the chains
run in parallel and the loads are coalesced. A block's digests form ``[num_layers]``
uint32; the one-number *block checksum* (:func:`block_checksum`) is FNV-1a, word-wise,
over the layer digests in layer order. The cache keeps the ``[num_blocks, num_layers]``
digests, so a mismatch also names the layer.

What it guarantees: each FNV-1a step ``h -> (h ^ w) * p`` is a bijection of ``h`` for a
fixed ``w`` and of ``w`` for a fixed ``h`` (``p`` is odd), so a change of any *one* word
of a (block, layer) -- every single-bit flip included -- changes its lane's final state
and then the digest, with certainty. Changes of several words are detected with
probability about ``1 - 2**-32`` per layer, except a known weakness of word-wise FNV:
two flips of bit 31 in the same lane cancel (bit 31 of ``h ^ w`` only reaches bit 31
of the product).

The head digest
---------------
A second digest, per (block, layer, KV head), that any order of reading can compute (the
decode kernel reads each KV head in its own CTA, its lanes in their own order), so a decode
that reads a block anyway can check it too. The head's words, little-endian uint32, are
indexed ``i = 0, 1, ...`` in this order::

    key codes    BS * RW words  from k_codes word code_offset(layer, block, h, 0, ...) / 4
    value codes  BS * RW words  from v_codes, the same offset
    key meta     D words        from k_meta word key_meta_offset(layer, block, h, ...) / 4      (INT only)
    value meta   BS * NG words  from v_meta word value_meta_offset(layer, block, h, 0, ...) / 4 (INT only)

(``RW = D * bits / 32`` words per code row; FP16 caches' code runs hold the FP16 rows, ``RW
= D / 2``, and have no metadata: the offsets of ``hexcore/layout.py``). That is the array
``store.k_codes[layer, block, h]`` flattened, then ``v_codes``, ``k_meta``, ``v_meta`` the
same. The digest is a sum of one term per word, mod 2**32::

    key(i)     = (i * 0x9E3779B1 + 0x7F4A7C15) mod 2**32
    term(i, w) = x ^ (x >> 16)  where  x = w + key(i)  mod 2**32,
                                       x = x ^ (x >> 16),
                                       x = (x * 0x85EBCA6B) mod 2**32,
                                       x = x ^ (x >> 13),
                                       x = (x * 0xC2B2AE35) mod 2**32
    digest     = sum over i of term(i, w_i)  mod 2**32

(:func:`head_term`, :func:`head_digests`, :func:`head_digest`). A sum is order-free: each
lane sums the words it holds, with their indices, and a warp adds the lanes' sums.

What it guarantees: ``term(i, .)`` is a bijection (adding a constant, multiplications
by odd numbers and ``x ^ (x >> s)`` are each invertible), so a change of any *one* word
changes exactly one term and the digest, with certainty -- every single-bit flip is
detected. Several changed words escape with probability near ``2**-32`` (the mixer's
terms behave nearly as independent random values); the same bit flipped both ways in two
words, the pattern likeliest to cancel, escapes with about ``2**-28`` to ``2**-30``
(measured: see below). Why a mixer and not the cheaper ``term = (w
^ key(i)) * P``: flipping bit ``k`` of any word changes that term by ``+-2**k * P``, so the
same bit flipped in two words (one 0 -> 1, the other 1 -> 0) cancels in the sum, half of
all same-bit double flips (tested in ``tests/host/test_head_digest.py``). Words that swap
places are caught too (the key depends on the index). A block copied whole over another
is caught by the other's recorded digest.

The key is added, not XORed: with a key ``k + c`` (a lane's key and a compile-time step)
the GPU forms ``w + k + c`` in one three-input add, where an XOR took an add and a LOP3.
Both are bijections, and same-bit double flips cancel 4 to 20 times as often as
uniform 32-bit terms would with either, with no consistent difference between the two
(``benchmarks/experiments/2026-12-05-s42/mixers.py``). Every step of the mixer is needed:
without the last xorshift the change of a term for one flipped bit takes few distinct
values, and same-bit double flips cancel 1,200 to 5,200 times more often (same script).

The decode checks FP16 blocks with this digest. INT4/INT2 blocks it checks with the
tensor-core head digest of ``tensor_digest.py`` (the same recorded ``head_sums``, computed
from the same words through the integer mma), which costs it a few instructions a 512 bytes
where this one costs a mixer a word; :func:`head_digests` returns whichever the decode checks.

Canary words (:func:`canary_word`) are the fixed pattern of the store's guard regions.
"""

from __future__ import annotations

import numba
import numpy as np

FNV32_BASIS = 0x811C9DC5
FNV32_PRIME = 0x01000193
FNV64_BASIS = 0xCBF29CE484222325
FNV64_PRIME = 0x100000001B3
MASK32 = 0xFFFFFFFF
LANES = 32  # independent chains of a block checksum (one warp)
CHUNK_WORDS = 4  # words a lane takes at a time (one 16-byte load)


def fnv32_step(h, w):
    """One word-wise FNV-1a step: ``(h ^ w) * FNV32_PRIME mod 2**32`` (ints in [0, 2**32))."""
    return ((h ^ w) * FNV32_PRIME) & MASK32


def canary_word(region, index):
    """Word ``index`` of guard region ``region``: a fixed pattern that differs per word and
    per region (so a guard copied over another is seen too), never 0 or all ones."""
    x = ((region * 0x10000 + index) * 0x9E3779B1 + 0x7F4A7C15) & MASK32
    return (x ^ (x >> 15)) | 0x00010001


canary_word_njit = numba.njit(cache=True)(canary_word)
_PRIME = np.uint64(FNV32_PRIME)
_MASK = np.uint64(MASK32)


@numba.njit(cache=True, inline="always")
def _step(h, w):
    # uint64 h, w (numba mixes uint64 and int64 into float64: every operand is uint64)
    return ((h ^ w) * _PRIME) & _MASK


@numba.njit(cache=True)
def _fnv1a_32(data):
    h = np.uint64(FNV32_BASIS)
    for b in data:
        h = _step(h, np.uint64(b))
    return h


@numba.njit(cache=True)
def _fnv1a_64(data):
    h = np.uint64(FNV64_BASIS)
    for b in data:
        h = (h ^ np.uint64(b)) * np.uint64(FNV64_PRIME)  # uint64 arithmetic wraps mod 2**64
    return h


def _as_bytes(data) -> np.ndarray:
    if isinstance(data, (bytes, bytearray, memoryview)):
        return np.frombuffer(bytes(data), np.uint8)
    if isinstance(data, np.ndarray):
        if not data.flags.c_contiguous:
            data = np.ascontiguousarray(data)
        return data.reshape(-1).view(np.uint8)
    from ..errors import HexcoreInvalidArgumentError

    raise HexcoreInvalidArgumentError(f"data: expected bytes or a numpy array, got {type(data).__name__}")


def fnv1a_32(data) -> int:
    """FNV-1a 32 of ``data`` (bytes, or a numpy array's bytes in memory order)."""
    return int(_fnv1a_32(_as_bytes(data)))


def fnv1a_64(data) -> int:
    """FNV-1a 64 of ``data`` (bytes, or a numpy array's bytes in memory order)."""
    return int(_fnv1a_64(_as_bytes(data)))


@numba.njit(cache=True)
def _absorb(lanes, words):
    # the chunks of one segment into the 32 lanes (chunk c -> lane c % 32)
    for c in range(words.shape[0] // CHUNK_WORDS):
        lane = c % LANES
        h = lanes[lane]
        for j in range(CHUNK_WORDS):
            h = _step(h, np.uint64(words[c * CHUNK_WORDS + j]))
        lanes[lane] = h


@numba.njit(cache=True)
def _fold(lanes):
    h = np.uint64(FNV32_BASIS)
    for i in range(lanes.shape[0]):
        h = _step(h, np.uint64(lanes[i]))
    return h


@numba.njit(cache=True)
def _digests(k_codes, v_codes, k_meta, v_meta, has_meta, out):
    # each argument [L, words] uint32; out [L] uint32
    lanes = np.empty(LANES, np.uint64)
    for layer in range(k_codes.shape[0]):
        lanes[:] = FNV32_BASIS
        _absorb(lanes, k_codes[layer])
        _absorb(lanes, v_codes[layer])
        if has_meta:
            _absorb(lanes, k_meta[layer])
            _absorb(lanes, v_meta[layer])
        out[layer] = _fold(lanes)


def _layer_words(name: str, array, num_layers: int) -> np.ndarray:
    array = np.ascontiguousarray(array)
    if array.shape[:1] != (num_layers,) or (array.nbytes // max(1, num_layers)) % (4 * CHUNK_WORDS):
        from ..errors import HexcoreInvalidArgumentError

        raise HexcoreInvalidArgumentError(
            f"{name}: expected [{num_layers}, ...] with a multiple of 16 bytes per layer, got {array.dtype} "
            f"{array.shape}")
    return array.view(np.uint8).reshape(num_layers, -1).view(np.uint32)


def layer_digests(k_codes, v_codes, k_meta=None, v_meta=None) -> np.ndarray:
    """Digests of one sealed block, a layer each (the scheme in the module docstring).

    Parameters
    ----------
    k_codes, v_codes : ``[L, H, block_size, row]`` -- the block's codes in each layer, any
        dtype (uint8 codes, float16 for FP16 caches): e.g. ``store.k_codes[:, block]``
        copied to the host.
    k_meta, v_meta : ``[L, H, 2, D]`` and ``[L, H, block_size, 2, num_groups]`` float16, or
        None (FP16 caches, which have no metadata).

    Returns uint32 ``[L]``.
    """
    num_layers = int(np.shape(k_codes)[0]) if np.ndim(k_codes) else -1
    words = [_layer_words(n, a, num_layers) for n, a in (("k_codes", k_codes), ("v_codes", v_codes))]
    has_meta = k_meta is not None or v_meta is not None
    if has_meta:
        words += [_layer_words(n, a, num_layers) for n, a in (("k_meta", k_meta), ("v_meta", v_meta))]
    else:
        words += words[:2]
    out = np.empty(num_layers, np.uint32)
    _digests(*words, has_meta, out)
    return out


def layer_digest(*segments) -> int:
    """The digest of one (block, layer) from its segments (uint32 word arrays, in order)."""
    lanes = np.full(LANES, FNV32_BASIS, np.uint64)
    for segment in segments:
        _absorb(lanes, np.ascontiguousarray(segment).reshape(-1).view(np.uint32))
    return int(_fold(lanes))


def block_checksum(digests) -> int:
    """The one-number checksum of a block: FNV-1a, word-wise, over its ``[L]`` layer digests."""
    return int(_fold(np.asarray(digests, np.uint32).astype(np.uint64)))




# -- the head digest: order-free, per (block, layer, KV head) -----------------------------
HEAD_K1 = 0x9E3779B1  # index key: word i gets (i * HEAD_K1 + HEAD_K2) added, mod 2**32
HEAD_K2 = 0x7F4A7C15
HEAD_M1 = 0x85EBCA6B  # the mixer's multipliers (murmur3's fmix32, all of it: the first xorshift too)
HEAD_M2 = 0xC2B2AE35


def head_term(i, w):
    """The term of word ``w`` at index ``i`` of a head digest (Python ints in [0, 2**32)):
    ``x = w + key(i)``, ``x ^= x >> 16``, ``x *= M1``, ``x ^= x >> 13``, ``x *= M2``, ``x ^=
    x >> 16`` (mod 2**32), ``key(i) = (i * HEAD_K1 + HEAD_K2) mod 2**32``. Every step is a
    bijection of ``x``, so the term is a bijection of ``w`` for each ``i``. The first xorshift
    matters: without it a flip of a high bit reaches the first product as that bit alone,
    and the term's change took few distinct values (about 15,000 for bit 31 over 200,000
    words), so two same-bit flips cancelled far more often than 2**-32."""
    x = (w + i * HEAD_K1 + HEAD_K2) & MASK32
    x ^= x >> 16
    x = (x * HEAD_M1) & MASK32
    x ^= x >> 13
    x = (x * HEAD_M2) & MASK32
    return x ^ (x >> 16)


_HK1, _HK2 = np.uint64(HEAD_K1), np.uint64(HEAD_K2)
_HM1, _HM2 = np.uint64(HEAD_M1), np.uint64(HEAD_M2)
_S13, _S16 = np.uint64(13), np.uint64(16)


@numba.njit(cache=True, inline="always")
def _head_term(i, w):
    # uint64 i, w; every operand uint64 (see _step), products of two words below 2**64
    x = (w + ((i * _HK1 + _HK2) & _MASK)) & _MASK
    x ^= x >> _S16
    x = (x * _HM1) & _MASK
    x ^= x >> _S13
    x = (x * _HM2) & _MASK
    return x ^ (x >> _S16)


@numba.njit(cache=True)
def _head_sum(words, first, total):
    # total + the terms of words[j] at indices first + j, mod 2**32 (uint64 total)
    for j in range(words.shape[0]):
        total = (total + _head_term(np.uint64(first + j), np.uint64(words[j]))) & _MASK
    return total


@numba.njit(cache=True)
def _head_digests(k_codes, v_codes, out):
    # an FP16 block's head digests: each argument [L, H, words] uint32; out [L, H] uint32
    for layer in range(k_codes.shape[0]):
        for h in range(k_codes.shape[1]):
            total = _head_sum(k_codes[layer, h], 0, np.uint64(0))
            out[layer, h] = _head_sum(v_codes[layer, h], k_codes.shape[2], total)


def _head_words(name: str, array, num_layers: int, num_heads: int) -> np.ndarray:
    array = np.ascontiguousarray(array)
    if array.ndim < 3 or array.shape[:2] != (num_layers, num_heads) or \
            (array.nbytes // max(1, num_layers * num_heads)) % 4:
        from ..errors import HexcoreInvalidArgumentError

        raise HexcoreInvalidArgumentError(
            f"{name}: expected [{num_layers}, {num_heads}, ...] with a multiple of 4 bytes per head, got "
            f"{array.dtype} {array.shape}")
    return array.view(np.uint8).reshape(num_layers, num_heads, -1).view(np.uint32)


def head_digests(k_codes, v_codes, k_meta=None, v_meta=None) -> np.ndarray:
    """Head digests of one sealed block, a (layer, KV head) each, as the decode checks them:
    uint32 ``[L, H]``. FP16 caches (no metadata): the head digest of the module docstring;
    INT caches: the tensor-core head digest (``tensor_digest.tensor_head_digest``).

    Parameters: the block's arrays from a host copy of the store, as for
    :func:`layer_digests` (``store.k_codes[:, block]`` is ``[L, H, block_size, row]``):
    ``k_codes``, ``v_codes`` ``[L, H, block_size, row]`` (float16 rows for FP16 caches);
    ``k_meta`` ``[L, H, 2, D]``, ``v_meta`` ``[L, H, block_size, 2, num_groups]`` float16,
    or None for FP16 caches.
    """
    shape = np.shape(k_codes)
    L, H = (int(shape[0]), int(shape[1])) if len(shape) >= 3 else (-1, -1)
    words = [_head_words(n, a, L, H) for n, a in (("k_codes", k_codes), ("v_codes", v_codes))]
    out = np.empty((L, H), np.uint32)
    if k_meta is None and v_meta is None:
        _head_digests(*words, out)
        return out
    for name, array in (("k_meta", k_meta), ("v_meta", v_meta)):
        _head_words(name, array, L, H)  # (checked as the codes are)
    from .tensor_digest import tensor_head_digest

    k, v, km, vm = (np.ascontiguousarray(a) for a in (k_codes, v_codes, k_meta, v_meta))
    for layer in range(L):
        for h in range(H):
            out[layer, h] = tensor_head_digest(k[layer, h], v[layer, h], km[layer, h], vm[layer, h])
    return out


def head_digest(*segments) -> int:
    """The head digest of one (block, layer, KV head) from its segments in order (key codes,
    value codes, then for INT caches key metadata and value metadata), each read as
    little-endian uint32 words and indexed consecutively across the segments."""
    total, first = np.uint64(0), 0
    for segment in segments:
        words = np.ascontiguousarray(segment).reshape(-1).view(np.uint32)
        total = _head_sum(words, first, total)
        first += words.shape[0]
    return int(total)


__all__ = ["CHUNK_WORDS", "FNV32_BASIS", "FNV32_PRIME", "FNV64_BASIS", "FNV64_PRIME", "HEAD_K1", "HEAD_K2", "HEAD_M1",
           "HEAD_M2", "LANES", "block_checksum", "canary_word", "fnv1a_32", "fnv1a_64", "fnv32_step", "head_digest",
           "head_digests", "head_term", "layer_digest", "layer_digests"]
