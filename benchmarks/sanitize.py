"""A small append + seal + decode run per dtype, for compute-sanitizer (memcheck, racecheck).

    compute-sanitizer --tool racecheck python3 -m benchmarks.sanitize
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from hexcore import KVCacheConfig
from hexcore.cuda import DeviceKVStore, append, paged_decode, seal


def main() -> None:
    rng = np.random.default_rng(0)
    for dtype in ("fp16", "int4", "int2"):
        for group in (1, 4):
            cfg = KVCacheConfig(num_layers=1, num_kv_heads=2, head_dim=128, block_size=16, kv_dtype=dtype)
            store = DeviceKVStore(cfg, num_blocks=8, max_seqs=3)
            store.poison()
            k = rng.standard_normal((16, 2, 128)).astype(np.float16)
            append(store, k, k, np.zeros(16, np.int32), np.arange(16, dtype=np.int32), layer=0)
            seal(store, np.array([0], np.int32), np.array([5], np.int32))
            append(store, k[:3], k[:3], np.zeros(3, np.int32), np.arange(3, dtype=np.int32), layer=0)
            tables = np.array([[5, 0], [5, 0]], np.int32)
            out = paged_decode(rng.standard_normal((2, 2 * group, 128)).astype(np.float16), store, 0, tables,
                               np.array([19, 16], np.int32), np.array([0, 1], np.int32))
            cuda.synchronize()
            assert not np.isnan(out.copy_to_host()).any(), dtype
    print("sanitize run complete")


if __name__ == "__main__":
    main()
