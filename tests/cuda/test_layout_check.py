"""Layout agreement: host and GPU compute the same byte offsets, equal to numpy's strides."""

import numpy as np
import pytest

from hexcore import KVCacheConfig, KVDtype
from hexcore.cuda import device_layout_offsets, host_layout_offsets

CONFIGS = [
    KVCacheConfig(num_layers=2, num_kv_heads=2, head_dim=64, block_size=16, kv_dtype=d, group_size=32)
    for d in KVDtype
]
GPU_CONFIGS = [
    KVCacheConfig(num_layers=3, num_kv_heads=8, head_dim=128, block_size=b, kv_dtype=d, group_size=64)
    for d in KVDtype for b in (16, 64)
]


def offsets_from_numpy(cfg: KVCacheConfig, num_blocks: int) -> np.ndarray:
    """The offsets the store's arrays really have: numpy strides of the config's shapes."""
    code_item = 2 if cfg.kv_dtype is KVDtype.FP16 else 1
    codes = np.empty(cfg.code_shape(num_blocks), np.float16 if code_item == 2 else np.uint8)
    kmeta = np.empty(cfg.key_meta_shape(num_blocks), np.float16)
    vmeta = np.empty(cfg.value_meta_shape(num_blocks), np.float16)
    tails = np.empty(cfg.tail_shape(num_blocks), np.float16)
    idx = np.indices(codes.shape[:4]).reshape(4, -1).T
    out = np.empty((len(idx), 4), np.int64)
    for i, (l, b, h, t) in enumerate(idx):
        out[i] = [np.dot((l, b, h, t, 0), codes.strides), np.dot((l, b, h, 0, 0), kmeta.strides),
                  np.dot((l, b, h, t, 0, 0), vmeta.strides), np.dot((l, b, h, t, 0), tails.strides)]
    return out.reshape(codes.shape[:4] + (4,))


def check(cfg: KVCacheConfig, num_blocks: int) -> None:
    host = host_layout_offsets(cfg, num_blocks)
    np.testing.assert_array_equal(host, offsets_from_numpy(cfg, num_blocks))
    np.testing.assert_array_equal(device_layout_offsets(cfg, num_blocks), host)


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.kv_dtype.value)
def test_layout_agrees_on_this_machine(cfg):
    check(cfg, num_blocks=3)


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", GPU_CONFIGS, ids=lambda c: f"{c.kv_dtype.value}-bs{c.block_size}")
def test_layout_agrees_on_gpu(cfg):
    check(cfg, num_blocks=5)
