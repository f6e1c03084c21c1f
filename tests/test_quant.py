"""hexcore.quant (precision by age, Hadamard rotation, bytes per token) and the reference
quantizer the quality benchmark uses (tests/reference.fake_quantize)."""

import numpy as np
import pytest

from hexcore import HexcoreInvalidArgumentError, KVCacheConfig
from hexcore import quant
from hexcore.quant import AgeTier
from tests import reference as ref


# -- Hadamard rotation ------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 8, 64, 128, 256])
def test_hadamard_is_sylvester_and_orthogonal(n):
    h = quant.hadamard(n)
    i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    parity = np.vectorize(lambda a: bin(a).count("1") % 2)(i & j)  # Sylvester: (-1)^popcount(i & j)
    assert np.array_equal(h * np.sqrt(n), np.where(parity, -1.0, 1.0))
    assert np.allclose(h @ h, np.eye(n), atol=1e-12) and np.array_equal(h, h.T)


@pytest.mark.parametrize("bad", [0, 3, 96, 8192, 2.0, True, "64"])
def test_hadamard_rejects_bad_sizes(bad):
    with pytest.raises(HexcoreInvalidArgumentError, match=r"^n: "):
        quant.hadamard(bad)


def test_rotate_rejects_a_scalar():
    with pytest.raises(HexcoreInvalidArgumentError, match=r"^x: .*scalar"):
        quant.rotate(np.float32(1.0))


@pytest.mark.parametrize("head_dim", [64, 128])
def test_rotated_cache_gives_the_same_attention(rng, head_dim):
    # A cache holding rotate(k), rotate(v), read by rotate(q), gives rotate(out): one more
    # rotate turns it back. The decode kernel needs no change.
    B, Hq, H, n = 2, 6, 2, 37
    q = rng.standard_normal((B, Hq, head_dim))
    keys = [rng.standard_normal((H, n, head_dim)) * rng.uniform(0.1, 10, head_dim) for _ in range(B)]
    values = [rng.standard_normal((H, n, head_dim)) for _ in range(B)]
    want = ref.decode_attention(q, keys, values, head_dim ** -0.5)
    got = ref.decode_attention(quant.rotate(q), [quant.rotate(k) for k in keys],
                               [quant.rotate(v) for v in values], head_dim ** -0.5)
    assert np.allclose(quant.rotate(got), want, rtol=1e-10, atol=1e-12)


# -- precision by age -------------------------------------------------------------------------
def _tiers_by_loop(length, block_size, tiers, sink_blocks=0):
    out = []
    for j in range(length // block_size):
        age = length - (j + 1) * block_size
        held = [i for i, t in enumerate(tiers) if age >= t.min_age and j >= sink_blocks]
        out.append(max(held, default=-1))
    return out


@pytest.mark.parametrize("tiers", [(), (AgeTier(0, 4, 4),), (AgeTier(64, 2, 2),),
                                   (AgeTier(32, 4, 4), AgeTier(256, 2, 2)), (AgeTier(0, 4, 4), AgeTier(96, 4, 2))])
@pytest.mark.parametrize("sink_blocks", [0, 1, 2])
def test_block_tiers_follow_age(rng, tiers, sink_blocks):
    for length in [0, 1, 31, 32, 33, 95, 96, 97, 300, int(rng.integers(0, 5000))]:
        got = quant.block_tiers(length, 32, tiers, sink_blocks).tolist()
        assert got == _tiers_by_loop(length, 32, tiers, sink_blocks), length


@pytest.mark.parametrize("ages", [(32, 32), (64, 32), (0, 48)])
def test_tiers_must_increase_on_block_boundaries(ages):
    tiers = [AgeTier(a, 2, 2) for a in ages]
    with pytest.raises(HexcoreInvalidArgumentError, match=r"^tiers: .*block_size 32"):
        quant.block_tiers(100, 32, tiers)


@pytest.mark.parametrize("field, value", [("key_bits", 3), ("value_bits", 8), ("key_bits", 16), ("min_age", -32)])
def test_age_tier_rejects_bad_fields(field, value):
    kw = dict(min_age=0, key_bits=4, value_bits=4) | {field: value}
    with pytest.raises(HexcoreInvalidArgumentError, match=rf"^{field}: .*{value}"):
        AgeTier(**kw)


# -- bytes per token --------------------------------------------------------------------------
@pytest.mark.parametrize("dtype, bits", [("fp16", None), ("int4", 4), ("int2", 2)])
@pytest.mark.parametrize("block_size, group_size", [(16, 32), (32, 64), (64, 128)])
def test_bytes_per_token_of_one_tier_match_the_config(dtype, bits, block_size, group_size):
    cfg = KVCacheConfig(num_layers=3, num_kv_heads=2, head_dim=128, block_size=block_size,
                        kv_dtype=dtype, group_size=group_size)
    context = 4096
    tiers = () if bits is None else (AgeTier(0, bits, bits),)
    got = quant.bytes_per_token(head_dim=128, block_size=block_size, group_size=group_size, tiers=tiers,
                                context=context, num_layers=3, num_kv_heads=2)
    assert got == (context // block_size * cfg.block_bytes + cfg.tail_bytes) / context


def test_bytes_per_token_count_the_fp16_window_and_each_tier():
    # 4096 tokens, block 32: 128 blocks of ages 4064, ..., 32, 0. FP16 below age 64 (2 blocks),
    # INT4 below 1024 (30 blocks), INT2 from there (96 blocks); plus a 32-slot FP16 tail buffer.
    D = 128
    fp16, int4, int2 = 2 * 32 * D * 2, 32 * D + 2 * D * 2 + 32 * 2 * 2 * 2, 32 * D // 2 + 2 * D * 2 + 32 * 2 * 2 * 2
    want = (2 * fp16 + 30 * int4 + 96 * int2 + fp16) / 4096
    tiers = (AgeTier(64, 4, 4), AgeTier(1024, 2, 2))
    assert quant.bytes_per_token(head_dim=D, block_size=32, group_size=64, tiers=tiers, context=4096) == want
    # the sink block 0 (age 4064, INT2 otherwise) held FP16
    sink = quant.bytes_per_token(head_dim=D, block_size=32, group_size=64, tiers=tiers, context=4096, sink_blocks=1)
    assert sink == want + (fp16 - int2) / 4096


def test_bytes_per_token_rejects_a_group_that_does_not_divide_head_dim():
    with pytest.raises(HexcoreInvalidArgumentError, match=r"^group_size: 48 .*head_dim 128"):
        quant.bytes_per_token(head_dim=128, block_size=32, group_size=48, tiers=(), context=4096)


# -- the reference quantizer without packing --------------------------------------------------
@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("block_size, group_size", [(16, 32), (32, 64)])
def test_fake_quantize_is_the_reference_round_trip(rng, bits, block_size, group_size):
    H, NB, D = 3, 4, 128
    x = (rng.standard_normal((H, NB * block_size, D)) * rng.uniform(0.01, 20, D)).astype(np.float16)
    x[:, :block_size, :8] = x[:, :1, :8]  # constant key channels in block 0: scale 0
    keys = ref.fake_quantize(x.reshape(H, NB, block_size, D), bits, axis=2).reshape(H, -1, D)
    values = ref.fake_quantize(x.reshape(H, -1, D // group_size, group_size), bits, axis=3).reshape(H, -1, D)
    for b in range(NB):
        blk = x[:, b * block_size:(b + 1) * block_size]
        kc, km, vc, vm = ref.quantize_block(blk, blk, bits, group_size)
        assert np.array_equal(keys[:, b * block_size:(b + 1) * block_size], ref.dequantize_keys(kc, km, bits))
        assert np.array_equal(values[:, b * block_size:(b + 1) * block_size],
                              ref.dequantize_values(vc, vm, bits, group_size))
