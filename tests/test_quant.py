"""hexcore.quant (precision by age, Hadamard rotation, bytes per token) and the reference
quantizer the quality benchmark uses (tests/reference.fake_quantize)."""

import numpy as np
import pytest

from hexcore import HexcoreConfigError, HexcoreInvalidArgumentError, KVCacheConfig
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


# -- formats by age ---------------------------------------------------------------------------
def test_formats_by_name_and_their_bytes_at_4k():
    # llama-3-8b at 4096 tokens (benchmarks/quality-notes.md, "Decision": 41376 and 25936 B/token)
    shape = dict(head_dim=128, block_size=32, group_size=64, context=4096, num_layers=32, num_kv_heads=8)
    want = {"fp16": 132096, "int4": 39936, "int2": 23552, "int4-aged": 41376, "int2-aged": 25936}
    assert {name: quant.kv_format(name).bytes_per_token(**shape) for name in want} == want
    assert quant.kv_format("INT2-Aged") is quant.FORMATS["int2-aged"]
    fmt = quant.KVFormat("mine", (AgeTier(64, 4, 4),), sink_blocks=2)
    assert quant.kv_format(fmt) is fmt
    assert fmt.block_tiers(5 * 32 + 3, 32).tolist() == [-1, -1, 0, -1, -1]


@pytest.mark.parametrize("value", ["int3", "", None, 4, ("int4",)])
def test_unknown_formats_are_config_errors(value):
    with pytest.raises(HexcoreConfigError, match=r"^format: expected a KVFormat or one of 'fp16'"):
        quant.kv_format(value)


@pytest.mark.parametrize("field, value, match", [
    ("name", "", "name: expected a non-empty str"),
    ("tiers", (AgeTier(64, 4, 4), AgeTier(32, 2, 2)), "tiers: expected strictly increasing min_age"),
    ("tiers", ((0, 4, 4),), "tiers: expected AgeTier items"),
    ("tiers", None, "tiers: expected a tuple of AgeTier, got NoneType"),
    ("tiers", 5, "tiers: expected a tuple of AgeTier, got int"),
    ("sink_blocks", -1, "sink_blocks: "),
    ("fitted_keys", 1, "fitted_keys: expected a bool"),
])
def test_format_fields_are_checked(field, value, match):
    kw = {"name": "x", field: value}
    with pytest.raises(HexcoreInvalidArgumentError, match=f"^{match}"):
        quant.KVFormat(**kw)


# -- the reference of formats by age (tests/reference.py) ----------------------------------------
def test_fitted_key_pairs_fit_better_than_the_extremes(rng, seed):
    # 3 Lloyd steps from the mean and std lower the squared error of a Gaussian channel's
    # 4 levels well below the (min, max) range's; a constant channel stays exact
    print(f"seed {seed}")
    k = (rng.standard_normal((4, 32, 128)) * rng.uniform(0.1, 5, 128)).astype(np.float16)
    k[0, :, :4] = k[0, :1, :4]
    scale, lo = ref.fit_key_params(k, 2)
    assert scale.dtype == lo.dtype == np.float16 and scale.shape == (4, 128)
    codes = ref.quantize(k.astype(np.float32), scale[:, None], lo[:, None], 2)
    fitted = scale[:, None].astype(np.float64) * codes + lo[:, None].astype(np.float64)
    plain = ref.dequantize_keys(*ref.quantize_keys(k, 2), 2)
    err = lambda x: ((x - k.astype(np.float64)) ** 2).sum()  # noqa: E731
    assert err(fitted) < 0.8 * err(plain)
    assert np.array_equal(fitted[0, :, :4], k[0, :, :4].astype(np.float64)) and not scale[0, :4].any()


def test_fitted_key_pairs_fall_back_to_the_extremes_when_not_finite():
    k = np.zeros((1, 32, 64), np.float16)
    k[0, :16, 0], k[0, 16:, 0] = -60000, 60000  # the fitted min, -60000 - 1.5 * scale, overflows float16
    scale, lo = ref.fit_key_params(k, 2)
    plain_scale, plain_lo = ref.quant_params(np.float32(-60000), np.float32(60000), 2)
    assert (scale[0, 0], lo[0, 0]) == (plain_scale, plain_lo) and np.isfinite(scale).all()


def test_tiered_kv_of_single_tier_formats_is_the_plain_seal(rng):
    H, D, BS, n = 2, 64, 32, 3 * 32 + 7
    k, v = (rng.standard_normal((2, H, n, D)) * 3).astype(np.float16)
    for name, bits in (("int4", 4), ("int2", 2)):
        K, V = ref.tiered_kv(k, v, quant.FORMATS[name], BS, 32)
        for j in range(3):
            kc, km, vc, vm = ref.quantize_block(k[:, j * BS:(j + 1) * BS], v[:, j * BS:(j + 1) * BS], bits, 32)
            assert np.array_equal(K[:, j * BS:(j + 1) * BS], ref.dequantize_keys(kc, km, bits))
            assert np.array_equal(V[:, j * BS:(j + 1) * BS], ref.dequantize_values(vc, vm, bits, 32))
        assert np.array_equal(K[:, 3 * BS:], k[:, 3 * BS:].astype(np.float64))  # the open tail


def test_tiered_kv_reseals_old_blocks_from_the_tier_before(rng):
    # int2-aged at 16 blocks + 5 tokens: block 0 the FP16 sink; blocks 1-3 (ages >= 384)
    # INT4 then re-sealed to INT2 with fitted keys from their FP16 unsealing; 4-15 INT4
    fmt, H, D, BS = quant.FORMATS["int2-aged"], 2, 64, 32
    n = 16 * BS + 5
    k, v = rng.standard_normal((2, H, n, D)).astype(np.float16)
    K, V = ref.tiered_kv(k, v, fmt, BS, 64)
    assert fmt.block_tiers(n, BS).tolist() == [-1, 1, 1, 1] + [0] * 12
    rows = lambda x, j: x[:, j * BS:(j + 1) * BS]  # noqa: E731
    assert np.array_equal(rows(K, 0), rows(k, 0).astype(np.float64))
    int4, int2 = fmt.tiers
    for j in (2, 9):
        first = ref.seal_tier_block(rows(k, j), rows(v, j), int4, 64)
        if j == 9:
            want_k, want_v = ref.dequantize_keys(first[0], first[1], 4), ref.dequantize_values(*first[2:], 4, 64)
        else:
            kc, km, vc, vm = ref.seal_tier_block(*ref.unseal_rows(*first, int4, 64), int2, 64, fitted_keys=True)
            scale, lo = ref.fit_key_params(ref.unseal_rows(*first, int4, 64)[0], 2)
            assert np.array_equal(km, np.stack([scale, lo], axis=1))  # the fitted pair is what is stored
            want_k, want_v = ref.dequantize_keys(kc, km, 2), ref.dequantize_values(vc, vm, 2, 64)
        assert np.array_equal(rows(K, j), want_k) and np.array_equal(rows(V, j), want_v)
    # the unsealed rows are the INT4 values rounded to float16
    first = ref.seal_tier_block(rows(k, 2), rows(v, 2), int4, 64)
    uk, _ = ref.unseal_rows(*first, int4, 64)
    assert np.array_equal(uk, ref.dequantize_keys(first[0], first[1], 4).astype(np.float32).astype(np.float16))
