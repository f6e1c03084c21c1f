"""Block keys (streaming XXH64 over token ids) and the key index: njit functions shared
by the prefix cache (``_prefix.py``) and the mirror of cached keys (``_event_ops.py``).

A block's key is the XXH64 (https://xxhash.com, the 64-bit variant) of its whole token
prefix, so any xxhash implementation reproduces it (``prefix.xxh64`` is a pure-Python one)::

    key(block j) = XXH64(le32 bytes of tokens[0 : (j + 1) * block_size], seed=root)
    root         = XXH64(le64(namespace), seed=cache seed)   # the cache seed names the
                                                              # kv dtype, block and group size

It is computed as a stream: a sequence keeps XXH64's four-lane state after its last
sealed block, a seal feeds the block's ``4 * block_size`` bytes (whole 32-byte
stripes) and takes the digest, so a key costs O(block_size) however long the prefix,
and a prompt's keys cost one pass (the lanes are the only serial chain: ~2 rounds a
block; the digests are off it). Keys are int64 (the bits of the uint64 hash). The hash
only finds candidates: the prefix cache checks a candidate's tokens and parent block
before using it, so a collision is a miss, never wrong KV.

The index is an open-addressing hash table with linear probing, ``[capacity, 2]``
int64 rows (key, block id; block id -1 marks an empty row), capacity a power of two
at least twice the number of blocks it can hold, and backward-shift deletion (no
tombstones). Every function here assumes that invariant and never raises.
"""

from __future__ import annotations

import numba
import numpy as np

_U = np.uint64
_P1, _P2, _P3 = _U(0x9E3779B185EBCA87), _U(0xC2B2AE3D27D4EB4F), _U(0x165667B19E3779F9)
_P4, _P5 = _U(0x85EBCA77C2B2AE63), _U(0x27D4EB2F165667C5)
_ZERO, _LEN8 = _U(0), _U(0x27D4EB2F165667C5 + 8)  # P5 + 8: the start of an 8-byte hash (before the seed)
_S1, _S7, _S12, _S18, _S27, _S29 = _U(1), _U(7), _U(12), _U(18), _U(27), _U(29)
_S31, _S32, _S33, _S37, _S46, _S52, _S57, _S63 = _U(31), _U(32), _U(33), _U(37), _U(46), _U(52), _U(57), _U(63)

# index rows: [slot] -> (key, block id or EMPTY)
KEY, BLOCK = 0, 1
EMPTY = -1

_jit = numba.njit(cache=True, nogil=True)
_inline = numba.njit(cache=True, nogil=True, inline="always")  # for scalar helpers only
# Helpers that take arrays and run once per block or per entry are compiled without
# NRT (they never allocate): a call then passes its arrays without reference-count
# updates. An inlined or NRT helper taking arrays costs ~20 ns a call in a loop
# (measured: 128 block references in 2.9 us instead of 0.07 us).
_fast = numba.njit(cache=True, nogil=True, _nrt=False)
_fast_inline = numba.njit(cache=True, nogil=True, _nrt=False, inline="always")  # for callers without NRT


# -- XXH64 -------------------------------------------------------------------------------------
@_inline
def _round(acc, lane):
    acc = acc + lane * _P2
    acc = (acc << _S31) | (acc >> _S33)
    return acc * _P1


@_inline
def _merge(acc, value):
    acc = acc ^ _round(_ZERO, value)
    return acc * _P1 + _P4


@_inline
def _avalanche(h):
    h = h ^ (h >> _S33)
    h = h * _P2
    h = h ^ (h >> _S29)
    h = h * _P3
    return h ^ (h >> _S32)


@_jit
def words_of(tokens, count):
    """``tokens[:count]`` (int32, ``count`` even) as uint64 words: XXH64's 8-byte lanes on a
    little-endian host (a view; a copy first if the data is not 8-byte aligned)."""
    if tokens.ctypes.data & 7:
        tokens = tokens[:count].copy()
    return tokens[:count].view(np.uint64)


@_inline
def start_state(seed):
    """XXH64's lanes (v1, v2, v3, v4) before any stripe, for ``seed`` (int64 bits)."""
    s = _U(seed)
    return s + _P1 + _P2, s + _P2, s, s - _P1


@_fast_inline
def feed(v1, v2, v3, v4, words, start, count):
    """The lanes after the ``count`` uint64 ``words[start:start + count]`` (count a
    multiple of 4: whole 32-byte stripes; ``words_of`` makes words of token ids)."""
    for i in range(start, start + count, 4):
        v1 = _round(v1, words[i])
        v2 = _round(v2, words[i + 1])
        v3 = _round(v3, words[i + 2])
        v4 = _round(v4, words[i + 3])
    return v1, v2, v3, v4


@_inline
def digest(v1, v2, v3, v4, num_tokens):
    """XXH64 of the ``num_tokens`` fed so far (>= 8, a multiple of 8) as int64."""
    h = (((v1 << _S1) | (v1 >> _S63)) + ((v2 << _S7) | (v2 >> _S57))
         + ((v3 << _S12) | (v3 >> _S52)) + ((v4 << _S18) | (v4 >> _S46)))
    h = _merge(_merge(_merge(_merge(h, v1), v2), v3), v4)
    return np.int64(_avalanche(h + _U(4 * num_tokens)))


@_jit
def root_key(seed, namespace):
    """``XXH64(le64(namespace), seed)`` as int64: the seed of a namespace's key stream."""
    h = _U(seed) + _LEN8
    h = h ^ _round(_ZERO, _U(namespace))
    h = ((h << _S27) | (h >> _S37)) * _P1 + _P4
    return np.int64(_avalanche(h))


@_jit
def keys_of(tokens, block_size, root, out):
    """Keys of the ``len(out)`` leading whole blocks of ``tokens`` (int32 [n]) streamed from
    ``root``, into ``out`` (int64 [>= count]); returns count."""
    count = min(out.shape[0], tokens.shape[0] // block_size)
    words = words_of(tokens, count * block_size)
    step = block_size // 2
    v1, v2, v3, v4 = start_state(root)
    for j in range(count):
        v1, v2, v3, v4 = feed(v1, v2, v3, v4, words, j * step, step)
        out[j] = digest(v1, v2, v3, v4, (j + 1) * block_size)
    return count


@_jit
def lanes_after(tokens, seed, out):
    """XXH64's lanes (as int64, into ``out[:4]``) after ``tokens`` (int32 [n], n a multiple of 8)."""
    v1, v2, v3, v4 = start_state(seed)
    v1, v2, v3, v4 = feed(v1, v2, v3, v4, words_of(tokens, tokens.shape[0]), 0, tokens.shape[0] // 2)
    out[0], out[1], out[2], out[3] = np.int64(v1), np.int64(v2), np.int64(v3), np.int64(v4)


# -- the index ---------------------------------------------------------------------------------
def new_index(max_entries: int) -> np.ndarray:
    """An empty index for up to ``max_entries`` keys: int64 [capacity, 2], capacity a
    power of two >= 2 * max_entries (so probes stay short)."""
    capacity = 1 << max(4, (2 * max_entries - 1).bit_length())
    index = np.zeros((capacity, 2), np.int64)
    index[:, BLOCK] = EMPTY
    return index


@_fast_inline
def index_find(index, key):
    """The block id stored under ``key``, or -1."""
    mask = index.shape[0] - 1
    i = key & mask
    while True:
        block = index[i, BLOCK]
        if block == EMPTY:
            return -1
        if index[i, KEY] == key:
            return block
        i = (i + 1) & mask


@_fast_inline
def index_insert(index, key, block):
    """Store ``block`` under ``key`` (the caller knows ``key`` is absent and a row is free)."""
    mask = index.shape[0] - 1
    i = key & mask
    while index[i, BLOCK] != EMPTY:
        i = (i + 1) & mask
    index[i, KEY] = key
    index[i, BLOCK] = block


@_fast_inline
def index_put(index, key, block):
    """Store ``block`` under ``key`` unless ``key`` is there (a row is free): the block
    already stored under it, or -1 when ``block`` was stored. One probe walk."""
    mask = index.shape[0] - 1
    i = key & mask
    while index[i, BLOCK] != EMPTY:
        if index[i, KEY] == key:
            return index[i, BLOCK]
        i = (i + 1) & mask
    index[i, KEY] = key
    index[i, BLOCK] = block
    return -1


@_fast_inline
def index_remove(index, key):
    """Remove ``key`` (backward-shift deletion); True if it was there."""
    mask = index.shape[0] - 1
    i = key & mask
    while True:
        if index[i, BLOCK] == EMPTY:
            return False
        if index[i, KEY] == key:
            break
        i = (i + 1) & mask
    j = i
    while True:  # pull back every later row of the run that may live in the hole
        j = (j + 1) & mask
        if index[j, BLOCK] == EMPTY:
            break
        home = index[j, KEY] & mask
        # the row at j stays if its home is cyclically in (i, j]
        if i <= j:
            stays = i < home and home <= j
        else:
            stays = i < home or home <= j
        if not stays:
            index[i, KEY] = index[j, KEY]
            index[i, BLOCK] = index[j, BLOCK]
            i = j
    index[i, BLOCK] = EMPTY
    index[i, KEY] = 0
    return True
