import dataclasses

import pytest

from hexcore import PRESETS, HexcoreConfigError, KVCacheConfig, KVDtype

BASE = dict(num_layers=2, num_kv_heads=4, head_dim=128, block_size=16)


def make(**overrides):
    return KVCacheConfig(**{**BASE, **overrides})


@pytest.mark.parametrize("field", ["num_layers", "num_kv_heads", "head_dim", "block_size", "group_size"])
@pytest.mark.parametrize("bad", [0, -4, 2.0, "8", True, None])
def test_non_positive_or_non_int_sizes_name_field_and_value(field, bad):
    with pytest.raises(HexcoreConfigError) as info:
        make(**{field: bad})
    assert field in str(info.value) and repr(bad) in str(info.value)


@pytest.mark.parametrize("bad", [4, 12, 24, 512, 100])
def test_block_size_must_be_power_of_two_in_range(bad):
    with pytest.raises(HexcoreConfigError, match=rf"block_size: .*got {bad}$"):
        make(block_size=bad)


def test_head_dim_not_divisible_by_group_size_names_both():
    with pytest.raises(HexcoreConfigError, match=r"group_size: head_dim 128 is not divisible by group_size 48"):
        make(group_size=48)


@pytest.mark.parametrize("dtype,head_dim,row", [("int2", 32, 8), ("int4", 16, 8), ("fp16", 4, 8)])
def test_code_row_must_be_a_multiple_of_16_bytes(dtype, head_dim, row):
    with pytest.raises(HexcoreConfigError, match=rf"head_dim: .*head_dim {head_dim} is {row} bytes"):
        make(kv_dtype=dtype, head_dim=head_dim, group_size=head_dim)


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
@pytest.mark.parametrize("block_size", [8, 32, 256])
def test_derived_sizes_match_shapes(dtype, head_dim, group_size, block_size):
    cfg = make(kv_dtype=dtype, head_dim=head_dim, group_size=group_size, block_size=block_size)
    assert cfg.row_bytes == head_dim * dtype.bits // 8
    assert cfg.block_bytes_per_layer == brute_force_bytes(cfg)
    assert cfg.block_bytes == cfg.num_layers * cfg.block_bytes_per_layer
    assert cfg.tail_bytes == cfg.num_layers * 2 * cfg.num_kv_heads * block_size * head_dim * 2
    assert cfg.total_bytes(10, 3) == 10 * cfg.block_bytes + 3 * cfg.tail_bytes
    for value in (cfg.row_bytes, cfg.block_bytes, cfg.tail_bytes, cfg.meta_bytes_per_block):
        assert isinstance(value, int)


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
    with pytest.raises(HexcoreConfigError, match="budget_bytes: .*got -1"):
        cfg.blocks_for_budget(-1, 3)
    with pytest.raises(HexcoreConfigError, match="max_seqs: .*got 0"):
        cfg.total_bytes(1, 0)


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
