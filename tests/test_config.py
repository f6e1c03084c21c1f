import dataclasses

import numpy as np
import pytest

from hexcore import PRESETS, HexcoreConfigError, HexcoreInvalidArgumentError, KVCacheConfig, KVDtype

BASE = dict(num_layers=2, num_kv_heads=4, head_dim=128, block_size=16)


def make(**overrides):
    return KVCacheConfig(**{**BASE, **overrides})


FIELDS = ["num_layers", "num_kv_heads", "head_dim", "block_size", "group_size"]


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("bad, message", [
    (0, "expected an int >= 1, got 0"), (-4, "expected an int >= 1, got -4"),
    (2.0, "expected an int, got float 2.0"), ("8", "expected an int, got str '8'"),
    (True, "expected an int, got True"), (None, "expected an int, got NoneType None"),
    (np.float64(16), "expected an int, got float64 16.0"), (2**70, "expected an int in [1, 4611686018427387903]"),
])
def test_bad_sizes_name_field_and_value(field, bad, message):
    with pytest.raises(HexcoreConfigError) as info:
        make(**{field: bad})
    assert str(info.value).startswith(f"{field}: {message}")


@pytest.mark.parametrize("kind", [np.int64, np.int32, np.uint16])
def test_numpy_int_sizes_are_stored_as_ints(kind):
    cfg = make(**{name: kind(value) for name, value in {**BASE, "group_size": 64}.items()})
    assert cfg == make(group_size=64) and hash(cfg) == hash(make(group_size=64))
    assert all(type(getattr(cfg, name)) is int for name in FIELDS) and type(cfg.block_bytes) is int


@pytest.mark.parametrize("bad", [4, 12, 24, 512, 100])
def test_block_size_must_be_power_of_two_in_range(bad):
    with pytest.raises(HexcoreConfigError, match=rf"block_size: .*got {bad}$"):
        make(block_size=bad)


def test_head_dim_not_divisible_by_group_size_names_both():
    with pytest.raises(HexcoreConfigError, match=r"group_size: head_dim 128 is not divisible by group_size 48"):
        make(group_size=48)


def test_code_row_must_be_a_multiple_of_16_bytes():
    with pytest.raises(HexcoreConfigError, match=r"head_dim: .*head_dim 4 is 8 bytes"):
        make(kv_dtype="fp16", head_dim=4, group_size=4)


@pytest.mark.parametrize("dtype, head_dim", [("int2", 32), ("int4", 16), ("int4", 96)])
def test_quantized_head_dim_is_a_multiple_of_64(dtype, head_dim):
    with pytest.raises(HexcoreConfigError, match=rf"head_dim: {dtype} blocks need a multiple of 64, got {head_dim}"):
        make(kv_dtype=dtype, head_dim=head_dim, group_size=head_dim)


@pytest.mark.parametrize("group_size", [8, 1])
def test_quantized_group_size_fits_the_tiles(group_size):
    with pytest.raises(HexcoreConfigError, match=rf"group_size: int4 blocks need 16, 32 or a multiple of 64, got {group_size}"):
        make(kv_dtype="int4", group_size=group_size)


@pytest.mark.parametrize("bad", ["fp8", "INT3", 4, None])
def test_unknown_dtype_names_value(bad):
    with pytest.raises(HexcoreConfigError) as info:
        make(kv_dtype=bad)
    assert "kv_dtype" in str(info.value) and repr(bad) in str(info.value)


@pytest.mark.parametrize("name,dtype", [("fp16", KVDtype.FP16), ("INT4", KVDtype.INT4), ("int2", KVDtype.INT2),
                                        (KVDtype.INT4, KVDtype.INT4)])
def test_dtype_strings_accepted(name, dtype):
    assert make(kv_dtype=name).kv_dtype is dtype


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        make().head_dim = 64


def brute_force_bytes(cfg: KVCacheConfig) -> int:
    """Sealed-block bytes per layer counted element by element from the array shapes."""
    import numpy as np

    code_itemsize = 2 if cfg.kv_dtype is KVDtype.FP16 else 1
    per_block = 2 * np.prod(cfg.code_shape(1)) * code_itemsize // cfg.num_layers
    if cfg.kv_dtype.is_quantized:
        per_block += (np.prod(cfg.key_meta_shape(1)) + np.prod(cfg.value_meta_shape(1))) * 2 // cfg.num_layers
    return int(per_block)


@pytest.mark.parametrize("dtype", list(KVDtype))
@pytest.mark.parametrize("head_dim,group_size", [(64, 32), (128, 64), (128, 128), (256, 32)])
@pytest.mark.parametrize("block_size", [16, 32, 256])
def test_derived_sizes_match_shapes(dtype, head_dim, group_size, block_size):
    cfg = make(kv_dtype=dtype, head_dim=head_dim, group_size=group_size, block_size=block_size)
    assert cfg.row_bytes == head_dim * dtype.bits // 8
    assert cfg.block_bytes_per_layer == brute_force_bytes(cfg)
    assert cfg.block_bytes == cfg.num_layers * cfg.block_bytes_per_layer
    assert cfg.tail_bytes == cfg.num_layers * 2 * cfg.num_kv_heads * block_size * head_dim * 2
    assert cfg.total_bytes(10, 3) == 10 * cfg.block_bytes + 3 * cfg.tail_bytes
    values = (cfg.row_bytes, cfg.block_bytes, cfg.tail_bytes, cfg.meta_bytes_per_block)
    assert [type(v) for v in values] == [int] * len(values)


def test_llama3_8b_fp16_numbers():
    cfg = KVCacheConfig.from_preset("llama-3-8b", block_size=16)
    # 32 layers * 2 (K,V) * 8 heads * 128 dims * 2 bytes = 128 KiB per token
    assert cfg.block_bytes == 16 * 131072
    assert cfg.compression_ratio == 1.0


def test_int4_and_int2_compression_exact():
    fp16 = make()
    int4 = make(kv_dtype="int4", group_size=64)
    # per (block, head): K codes 16*64 + K meta 2*128*2 + V codes 16*64 + V meta 16*2*2*2
    per_head = 1024 + 512 + 1024 + 128
    assert int4.block_bytes_per_layer == 4 * per_head
    assert int4.compression_ratio == fp16.block_bytes / int4.block_bytes
    assert make(kv_dtype="int2").compression_ratio > int4.compression_ratio > 1


def test_capacity_for_budget():
    cfg = make(kv_dtype="int4")
    budget = 10 * cfg.block_bytes + 3 * cfg.tail_bytes + cfg.block_bytes - 1
    assert cfg.blocks_for_budget(budget, 3) == 10
    assert cfg.tokens_for_budget(budget, 3) == 10 * cfg.block_size
    assert cfg.blocks_for_budget(cfg.tail_bytes, 3) == 0
    assert cfg.blocks_for_budget(np.int64(budget), np.int32(3)) == 10
    assert cfg.total_bytes(np.int64(10), np.uint8(3)) == 10 * cfg.block_bytes + 3 * cfg.tail_bytes


@pytest.mark.parametrize("call, match", [
    (lambda cfg: cfg.blocks_for_budget(-1, 3), "^budget_bytes: expected an int >= 1, got -1$"),
    (lambda cfg: cfg.blocks_for_budget(1e9, 3), "^budget_bytes: expected an int, got float"),
    (lambda cfg: cfg.total_bytes(1, 0), "^max_seqs: expected an int >= 1, got 0$"),
    (lambda cfg: cfg.total_bytes(True, 1), "^num_blocks: expected an int, got True$"),
    (lambda cfg: cfg.tokens_for_budget(10**9, "3"), "^max_seqs: expected an int, got str '3'$"),
    (lambda cfg: cfg.code_shape(0), "^num_blocks: expected an int >= 1, got 0$"),
    (lambda cfg: cfg.tail_shape(2.0), "^max_seqs: expected an int, got float 2.0$"),
])
def test_method_arguments_are_invalid_arguments(call, match):
    with pytest.raises(HexcoreInvalidArgumentError, match=match):
        call(make(kv_dtype="int4"))


def test_shapes_take_numpy_ints():
    cfg = make()
    assert cfg.code_shape(np.int64(3)) == cfg.code_shape(3) and type(cfg.tail_shape(np.int32(2))[1]) is int


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets(name):
    cfg = KVCacheConfig.from_preset(name, kv_dtype="int2", block_size=64)
    preset = PRESETS[name]
    assert (cfg.num_layers, cfg.num_kv_heads, cfg.head_dim) == (preset.num_layers, preset.num_kv_heads, preset.head_dim)
    assert cfg.kv_dtype is KVDtype.INT2 and cfg.block_size == 64


def test_public_preset_shapes():
    assert (PRESETS["llama-3-70b"].num_layers, PRESETS["llama-3-70b"].num_kv_heads) == (80, 8)
    assert (PRESETS["qwen2.5-7b"].num_layers, PRESETS["qwen2.5-7b"].num_kv_heads) == (28, 4)


def test_unknown_preset_names_value():
    with pytest.raises(HexcoreConfigError, match=r"preset: .*got 'gpt-5'"):
        KVCacheConfig.from_preset("gpt-5")
