"""Which register cap the grid launch takes, and how many items the persistent decode makes,
at B=1 32/8 D=128 BS=32 for 8k-128k (issue 17): run on the simulator with the H100's 132 SMs
and the occupancy ptxas gives (sm_90, D=128 BS=32 G=4: the uncapped grid kernel 156-166
registers, three CTAs an SM; the 128 cap, four). Not part of hexcore.

Where the grid launch is uncapped (cap 255) and the items exceed 264, the slice kernel
compiled at 255 (INT2 187, FP16 188 registers: two CTAs an SM, 264 resident) takes two rounds.

Run: ``NUMBA_ENABLE_CUDASIM=1 python benchmarks/experiments/2026-12-06-s50/slice_items.py``.
"""
import numpy as np
from numba import cuda
from hexcore import KVCacheConfig
from hexcore.cuda import DeviceKVStore
from hexcore.cuda.attention import launcher
from hexcore.cuda.attention.persistent import PersistentDecode
caps = {}
orig = launcher.decode_kernel
def recording(shape, max_registers=None, *a, **k):
    kern = orig(shape, max_registers, *a, **k)
    caps[id(kern)] = max_registers
    return kern
launcher.decode_kernel = recording
launcher._num_sms = lambda: 132
# occupancy from ptxas (sm_90, D=128 BS=32 G=4): uncapped 156-166 registers -> 3 CTAs an SM, capped 128 -> 4
launcher._ctas_per_sm = lambda kernel, args: 3 if caps.get(id(kernel)) == launcher.UNCAPPED_REGISTERS else 4
for dtype in ("fp16", "int4", "int2"):
    for ctx in (8192, 32768, 65536, 98304, 131072):
        cfg = KVCacheConfig(num_layers=1, num_kv_heads=8, head_dim=128, block_size=32, kv_dtype=dtype)
        store = DeviceKVStore(cfg, num_blocks=2, max_seqs=1)
        store.pool.copy_to_device(np.zeros(store.pool.shape, np.uint32))
        q = cuda.to_device(np.zeros((1, 32, 128), np.float16))
        tables = cuda.to_device(np.zeros((1, ctx // 32), np.int32))
        lens = cuda.to_device(np.full(1, ctx, np.int32)); slots = cuda.to_device(np.zeros(1, np.int32))
        d = PersistentDecode(q, store, tables, lens, slots, 1e6, max_seq_len=ctx)
        launch, _ = launcher.decode_launch(q, store, 0, tables, lens, slots, None, None, ctx, d.options, d._workspace)
        print(dtype, ctx, "grid-launch cap", caps.get(id(launch.kernel)), "grid", launch.grid, "items", d.num_items)
