"""One quantizing seal at a time, for Nsight Compute (llama-3-8b KV shape: 32 layers, 8 KV
heads, head_dim 128, block 32; ``blocks`` tails sealed into as many blocks):

    ncu --clock-control none --kernel-name-base demangled -k regex:_seal_quantized \\
        --launch-skip 2 --launch-count 1 --section SpeedOfLight --section Occupancy \\
        --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \\
        python3 -m benchmarks.profile_seal int4 1024        (dtype, blocks)

numba names every kernel ``kernel``; ncu matches ``-k`` against that base name unless
``--kernel-name-base demangled`` (the demangled name carries the factory,
``hexcore::cuda::write::_seal_quantized_kernel``).
"""

from __future__ import annotations

import sys

import numpy as np
from numba import cuda

from benchmarks.gpu_common import fill_store
from hexcore import KVCacheConfig
from hexcore.cuda import DeviceKVStore, seal

if __name__ == "__main__":
    dtype = sys.argv[1] if len(sys.argv) > 1 else "int4"
    blocks = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
    cfg = KVCacheConfig(num_layers=32, num_kv_heads=8, head_dim=128, block_size=32, kv_dtype=dtype)
    store = DeviceKVStore(cfg, num_blocks=blocks, max_seqs=blocks)
    fill_store(store)
    rng = np.random.default_rng(0)
    slots = cuda.to_device(rng.permutation(blocks).astype(np.int32))
    block_ids = cuda.to_device(rng.permutation(blocks).astype(np.int32))
    for _ in range(3):
        seal(store, slots, block_ids)
    cuda.synchronize()
    print(f"sealed {blocks} {dtype} blocks x {cfg.num_layers} layers three times")
