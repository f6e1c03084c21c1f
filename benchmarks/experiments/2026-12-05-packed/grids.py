"""The grids (CTAs per (sequence, KV head, head group) row, per launch) that a format by
age's decode launches at the decode table's rows, per ``tiered_merge`` mode, worked out on
the CPU (simulator) with the H200's 132 SMs and the occupancy ptxas gives the decode kernel
(4 CTAs per SM at the 128-register cap, 3 uncapped). The thirty-third session's
``2026-12-04-s33/grids.py`` with "packed" (thirty-sixth session) and two more rows:

    NUMBA_ENABLE_CUDASIM=1 PYTHONPATH=. python benchmarks/experiments/2026-12-05-packed/grids.py

Prints per format and (B, context): blocks per sequence per pool, then each mode's launches'
split counts ("last": the pools' launches; "one", "one cap 128", "packed": the one launch's
x and, after "@", its kernel's register cap; "launch": the pools' launches and the merge
launch's x).
"""
import dataclasses

import numpy as np

from hexcore import KVCacheConfig
from hexcore.cuda import DecodeOptions, DeviceKVStore
from hexcore.cuda.attention import launcher, tiered
from hexcore.cuda.attention.tiered import tiered_decode_launches
from hexcore.host.tiered import block_pools, pool_kinds
from hexcore.quant import kv_format

BS, D = 32, 128  # 32/8 heads, head_dim 128, block 32
ROWS = ((1, 32768), (2, 8192), (8, 4096), (1, 131072), (32, 4096), (16, 16384), (64, 4096), (128, 2048), (32, 1024))
MODES = {"last": DecodeOptions(tiered_merge="last"), "one": DecodeOptions(tiered_merge="one"),
         "one cap 128": DecodeOptions(tiered_merge="one", max_registers=128),
         "launch": DecodeOptions(tiered_merge="launch"), "packed": DecodeOptions(tiered_merge="packed")}


def _marked(factory, resident):  # the factory's kernels say how many CTAs of them an SM holds
    def marked(shapes, cap=None, *args, **kwargs):
        kernel = factory(shapes, cap, *args, **kwargs)
        kernel.resident, kernel.cap = resident(cap), cap
        return kernel
    return marked


# ptxas, sm_90, D128 BS32 G4: the decode kernel 128 registers capped (4 per SM), 156-166
# uncapped (3); the one-launch kernel 128 capped (4), 164-168 at 168 (3), 170-184 uncapped (2)
launcher.decode_kernel = _marked(launcher.decode_kernel, lambda cap: 4 if cap in (None, 128) else 3)
tiered.one_launch_kernel = _marked(tiered.one_launch_kernel, lambda cap: {128: 4, 168: 3}.get(cap, 2))
launcher._num_sms = lambda: 132
launcher._ctas_per_sm = lambda kernel, args: kernel.resident


def grids(name: str, batch: int, ctx: int) -> str:
    fmt = kv_format(name)
    base = KVCacheConfig(num_layers=1, num_kv_heads=8, head_dim=D, block_size=BS)
    pools = block_pools(fmt, ctx, BS)
    per_seq = [int((pools == p).sum()) for p in range(len(pool_kinds(fmt, BS)))]
    stores, tables, counts = [], [], []
    for kind, n in zip(pool_kinds(fmt, BS), per_seq):
        cfg = dataclasses.replace(base, kv_dtype=kind)
        stores.append(DeviceKVStore(cfg, num_blocks=max(1, batch * n), max_seqs=batch))
        table = np.arange(batch * n, dtype=np.int32).reshape(batch, n)
        tables.append(table if n else np.full((batch, 1), -1, np.int32))
        counts.append(np.full(batch, n, np.int32))
    q = np.zeros((batch, 32, D), np.float16)
    index = (np.full(batch, ctx % BS, np.int32), np.zeros(batch, np.int32), np.arange(batch, dtype=np.int32))
    modes = []
    for mode, options in MODES.items():
        launches, _ = tiered_decode_launches(q, stores, tables, counts, *index, options=options)
        cap = f" @{launches[0].kernel.cap}" if len(launches) == 1 else ""
        modes.append(f"{mode}: " + " ".join(str(launch.grid[0]) for launch in launches) + cap)
    return f"{name} {batch} {ctx} {per_seq} " + " | ".join(modes)


if __name__ == "__main__":
    for name in ("int4-aged", "int2-aged"):
        for batch, ctx in ROWS:
            print(grids(name, batch, ctx), flush=True)
