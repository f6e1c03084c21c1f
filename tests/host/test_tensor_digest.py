"""The tensor-core head digest of quantized blocks (hexcore/host/tensor_digest.py) against a
plain Python reference written from its definition (fragments byte by byte, the mma as
loops), its guarantees checked exactly on the layouts the decode runs, damage caught."""

from __future__ import annotations

import numpy as np
import pytest

from hexcore.host.checksum import MASK32, head_digests, head_term
from hexcore.host.tensor_digest import (DENSE_C1, DENSE_C2, DENSE_C3, DENSE_SALT, MAX_STEPS, dependence,
                                        lane_weights, staged_chunks, step_rotation, steps_per_chunk,
                                        tensor_head_digest)


def head(rng, bits, D=64, BS=16, NG=1):
    """One (block, layer, KV head) of a quantized cache: k, v [BS, row] uint8, k_meta [2, D],
    v_meta [BS, 2, NG] float16."""
    row = D * bits // 8
    return (rng.integers(0, 256, (BS, row), dtype=np.uint8), rng.integers(0, 256, (BS, row), dtype=np.uint8),
            rng.standard_normal((2, D)).astype(np.float16), rng.standard_normal((BS, 2, NG)).astype(np.float16))


def _words(a):
    return [int(w) for w in np.ascontiguousarray(a).reshape(-1).view(np.uint32)]


def _signed(byte):
    return byte - 256 if byte > 127 else byte


def reference(k, v, km, vm) -> int:
    """The definition in plain Python: staged chunks, per-lane weights, the mma as loops."""
    BS = k.shape[0]
    T = min(BS, 32)
    rw, ng = k.shape[1] // 4, vm.shape[1] * vm.shape[2] // 2
    kw, vw, kmw, vmw = _words(k), _words(v), _words(km), _words(vm)
    C = [[0] * 8 for _ in range(16)]
    for c in range(BS // T):
        staged = (kw[c * T * rw:(c + 1) * T * rw] + vw[c * T * rw:(c + 1) * T * rw] + kmw
                  + vmw[c * T * ng:(c + 1) * T * ng])
        staged += [0] * (-len(staged) % 128)
        for s in range(len(staged) // 128):
            A = [[0] * 32 for _ in range(16)]
            B = [[0] * 8 for _ in range(32)]
            for lane in range(32):
                g, t = divmod(lane, 4)
                m = head_term(32 * c + lane, DENSE_SALT)
                bases = (m | 0x01010101, ((m * DENSE_C1) & MASK32) | 0x01010101)
                rs = ((m * DENSE_C2) & MASK32, (m * DENSE_C3) & MASK32)
                n = 2 * s + 1
                for j in range(2):
                    w = bases[j] ^ ((((rs[j] << n) | (rs[j] >> (32 - n))) & MASK32) & 0xFEFEFEFE)
                    for i in range(4):
                        B[16 * j + 4 * t + i][g] = _signed((w >> (8 * i)) & 0xFF)
                for q in range(4):
                    word = staged[128 * s + 4 * lane + q]
                    for i in range(4):
                        A[g + 8 * (q % 2)][4 * t + 16 * (q // 2) + i] = (word >> (8 * i)) & 0xFF
            for r in range(16):
                for col in range(8):
                    C[r][col] += sum(A[r][kk] * B[kk][col] for kk in range(32))
    return sum(head_term(8 * r + col, C[r][col] & MASK32) for r in range(16) for col in range(8)) & MASK32


@pytest.mark.parametrize("bits,D,BS,NG", [(4, 64, 16, 1), (2, 64, 64, 1), (2, 128, 32, 2)])
def test_matches_the_plain_reference(rng, bits, D, BS, NG):
    parts = head(rng, bits, D, BS, NG)
    assert tensor_head_digest(*parts) == reference(*parts)


def test_pinned_value():
    """A fixed head (bytes 0, 1, 2, ... mod 251), so another implementation can check itself."""
    k, v, km, vm = (np.arange(n, dtype=np.int64) % 251 for n in (16 * 32, 16 * 32, 4 * 64, 4 * 16))
    parts = (k.astype(np.uint8).reshape(16, 32), v.astype(np.uint8).reshape(16, 32),
             km.astype(np.uint8).view(np.float16).reshape(2, 64), vm.astype(np.uint8).view(np.float16).reshape(16, 2, 1))
    assert tensor_head_digest(*parts) == reference(*parts) == PINNED


PINNED = 0xD2854D99


def test_head_digests_of_a_quantized_block_are_tensor_digests(rng):
    L, H = 2, 3
    heads = [[head(rng, 4) for _ in range(H)] for _ in range(L)]
    k, v, km, vm = (np.array([[parts[i] for parts in row] for row in heads]) for i in range(4))
    got = head_digests(k, v, km, vm)
    assert got.shape == (L, H) and got.dtype == np.uint32
    for layer in range(L):
        for h in range(H):
            assert got[layer, h] == tensor_head_digest(k[layer, h], v[layer, h], km[layer, h], vm[layer, h])


def test_weights_are_odd_bytes_and_rotations_distinct():
    w = lane_weights(3, MAX_STEPS).view(np.uint8)
    assert np.all(w & 1)
    assert len({step_rotation(s) for s in range(MAX_STEPS)}) == MAX_STEPS
    with pytest.raises(ValueError, match="at most 16 steps"):
        step_rotation(MAX_STEPS)


# every quantized layout the decode supports for D 64 and 128 at block sizes with one, two and
# eight chunks, group sizes of 64 and 16 (1, 2, 4 and 8 value groups a row)
LAYOUTS = [(bits, D, BS, D // gs) for bits in (4, 2) for D in (64, 128) for BS in (16, 32, 64, 256)
           for gs in (64, 16)]


@pytest.mark.parametrize("bits,D,BS,NG", LAYOUTS)
def test_every_byte_moves_the_sums_and_no_two_of_a_row_cancel(bits, D, BS, NG):
    """Exact: no byte's summed weight vector is zero (every single-byte change, every bit
    flip, is caught for certain) and no two of one accumulator row are parallel (every change
    of two bytes of a row is caught for certain)."""
    assert steps_per_chunk(BS, D, bits, NG) <= MAX_STEPS
    found = dependence(BS, D, bits, NG, triples=False)
    assert found["zero"] == 0 and found["parallel"] == 0, found


@pytest.mark.parametrize("bits,D,BS,NG", [(4, 64, 16, 1), (2, 64, 32, 1), (2, 128, 16, 2)])
def test_no_three_bytes_of_a_row_cancel(bits, D, BS, NG):
    """Exact on small layouts (INT4 and INT2 at D 128, block 32, the decode's usual ones, are
    checked the same way in benchmarks/experiments: about 5 s and 1 s)."""
    assert dependence(BS, D, bits, NG)["dependent"] == 0


def test_random_damage_is_caught(rng):
    parts = head(rng, 4, 128, 32, 2)
    clean = tensor_head_digest(*parts)
    flat = [np.ascontiguousarray(p).view(np.uint8).reshape(-1) for p in parts]
    sizes = np.array([f.size for f in flat])
    for trial in range(300):
        bad = [f.copy() for f in flat]
        for _ in range(1 + trial % 8):  # 1 to 8 random bytes, any segments
            seg = int(rng.choice(4, p=sizes / sizes.sum()))
            bad[seg][int(rng.integers(sizes[seg]))] ^= np.uint8(1 << int(rng.integers(8)))
        damaged = [b.view(p.dtype).reshape(p.shape) for b, p in zip(bad, parts)]
        if any(not np.array_equal(b, f) for b, f in zip(bad, flat)):  # (two flips of one bit undo)
            assert tensor_head_digest(*damaged) != clean, trial


def test_a_staged_chunk_is_the_decode_ring_stage():
    """Chunks of min(BS, 32) tokens, each key codes, value codes, key meta, value meta, padded
    to whole steps: INT4 D=128 BS=64 NG=2 is two chunks of 1216 words, 10 steps each."""
    rng = np.random.default_rng(0)
    k, v, km, vm = head(rng, 4, 128, 64, 2)
    chunks = staged_chunks(k, v, km, vm)
    assert [c.size for c in chunks] == [1280, 1280]
    assert np.array_equal(chunks[1][:512], k[32:].reshape(-1).view(np.uint32))
    assert np.array_equal(chunks[1][1024:1152], km.reshape(-1).view(np.uint32))
    assert np.array_equal(chunks[1][1152:1216], vm[32:].reshape(-1).view(np.uint32)) and not chunks[1][1216:].any()
