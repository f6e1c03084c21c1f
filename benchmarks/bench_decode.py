"""Paged decode on the GPU: achieved TB/s against the 4.47 TB/s read ceiling, torch SDPA as peer.

    python -m benchmarks.bench_decode          (or through scripts/gpu-check)
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from hexcore import KVCacheConfig

B, HQ, D, BS, CTX = 64, 32, 128, 32, 4096


def kv_bytes(cfg: KVCacheConfig, batch: int, ctx: int) -> int:
    """Bytes a decode must read: sealed codes and metadata plus tail rows, one layer."""
    sealed, tail = divmod(ctx, cfg.block_size)
    return batch * (sealed * cfg.block_bytes_per_layer + tail * 2 * cfg.num_kv_heads * cfg.head_dim * 2)


def decode_case(dtype: str, batch: int, num_kv_heads: int, ctx: int, num_q_heads: int = HQ):
    """(run, bytes) for one shape: a filled store with shuffled block tables."""
    from numba import cuda

    from benchmarks.gpu_common import fill_store
    from hexcore.cuda import DecodePlan, DeviceKVStore

    cfg = KVCacheConfig(num_layers=1, num_kv_heads=num_kv_heads, head_dim=D, block_size=BS, kv_dtype=dtype)
    per_seq = -(-ctx // BS)
    store = DeviceKVStore(cfg, num_blocks=batch * per_seq, max_seqs=batch)
    fill_store(store)
    rng = np.random.default_rng(0)
    tables = cuda.to_device(rng.permutation(batch * per_seq).astype(np.int32).reshape(batch, per_seq))
    lens = cuda.to_device(np.full(batch, ctx, np.int32))
    slots = cuda.to_device(np.arange(batch, dtype=np.int32))
    q = cuda.to_device(rng.standard_normal((batch, num_q_heads, D)).astype(np.float16))
    plan = DecodePlan(q, store, tables, lens, slots, max_seq_len=ctx)
    return (lambda: plan.run(0)), kv_bytes(cfg, batch, ctx), store


def sdpa_case(batch: int, num_kv_heads: int, ctx: int, num_q_heads: int = HQ):
    """torch SDPA (default backend) on contiguous FP16 KV of the same shape."""
    import torch
    import torch.nn.functional as F

    q = torch.randn(batch, num_q_heads, 1, D, device="cuda", dtype=torch.float16)
    k = torch.randn(batch, num_kv_heads, ctx, D, device="cuda", dtype=torch.float16)
    v = torch.randn_like(k)
    gqa = num_kv_heads != num_q_heads
    return lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa), 2 * k.numel() * 2


def rows_for(shapes, dtypes=("fp16", "int4", "int2"), peer=True):
    from benchmarks.gpu_common import CEILING_READ_TBS, time_gpu

    rows = []
    for batch, kv_heads, ctx in shapes:
        fp16_time = None
        for dtype in dtypes:
            run, nbytes, store = decode_case(dtype, batch, kv_heads, ctx)
            seconds = time_gpu(run)
            del store
            fp16_time = seconds if dtype == "fp16" else fp16_time
            rows.append(dict(kernel=f"hexcore {dtype}", B=batch, kv_heads=kv_heads, ctx=ctx, ms=seconds * 1e3,
                             GB=nbytes / 1e9, TBs=nbytes / seconds / 1e12,
                             ceiling=nbytes / seconds / 1e12 / CEILING_READ_TBS,
                             vs_fp16=(fp16_time / seconds) if fp16_time else 1.0))
        if not peer:
            continue
        try:
            run, nbytes = sdpa_case(batch, kv_heads, ctx)
            seconds = time_gpu(run)
            rows.append(dict(kernel="torch SDPA fp16 contiguous", B=batch, kv_heads=kv_heads, ctx=ctx,
                             ms=seconds * 1e3, GB=nbytes / 1e9, TBs=nbytes / seconds / 1e12,
                             ceiling=nbytes / seconds / 1e12 / CEILING_READ_TBS, vs_fp16=fp16_time / seconds))
        except Exception as exc:  # torch missing or too old: say so, keep hexcore's rows
            print(f"torch SDPA peer skipped: {exc}")
        import gc

        gc.collect()
    return rows


def host_overhead_rows():
    """Host microseconds per call: eager paged_decode, a DecodePlan replay, and bare launches."""
    from numba import cuda

    from benchmarks.gpu_common import host_seconds_per_call
    from hexcore.cuda import paged_decode
    from hexcore.cuda.launch import PreparedLaunch

    run, _, store = decode_case("int4", 1, 8, 4096)
    rng = np.random.default_rng(0)
    q = cuda.to_device(rng.standard_normal((1, HQ, D)).astype(np.float16))
    tables = cuda.to_device(np.arange(4096 // BS, dtype=np.int32)[None])
    lens, slots = cuda.to_device(np.full(1, 4096, np.int32)), cuda.to_device(np.zeros(1, np.int32))
    out = cuda.device_array((1, HQ, D), np.float16)
    one = cuda.device_array(1, np.float32)
    cases = {
        "paged_decode eager (int4, B=1, ctx 4096, numba arrays)":
            lambda: lambda: paged_decode(q, store, 0, tables, lens, slots, out=out, max_seq_len=4096),
        "DecodePlan.run (decode + merge)": lambda: run,
        "numba launch, 1 array argument": lambda: lambda: _touch[1, 1](one),
        "PreparedLaunch.run, 1 array argument": lambda: PreparedLaunch(_touch, 1, 1, (one,)).run,
    }
    rows = []
    for name, make in cases.items():
        try:
            rows.append(dict(call=name, host_us=host_seconds_per_call(make()) * 1e6))
        except Exception as exc:  # keep the other rows; say what failed
            print(f"{name}: {type(exc).__name__}: {exc}")
    return rows


def _touch_kernel(a):
    a[0] = 1.0


_touch = None


@pytest.mark.gpu
def test_decode_bandwidth():
    from benchmarks.gpu_common import save

    rows = rows_for([(B, 32, CTX), (B, 8, CTX)])
    rows += rows_for([(1, 8, 32768), (1, 8, 131072)])
    save("decode", rows)
    host()
    assert all(math.isfinite(r["ms"]) for r in rows)


def host() -> None:
    """Host overhead rows only."""
    from numba import cuda

    from benchmarks.gpu_common import save

    global _touch
    _touch = cuda.jit(_touch_kernel)
    save("decode_host", host_overhead_rows())


def quick() -> None:
    """The MHA shape (all dtypes) and B=1 at 32k only, no peer: one tuning variant in ~20 s."""
    from benchmarks.gpu_common import save

    rows = rows_for([(B, 32, CTX)], peer=False) + rows_for([(1, 8, 32768)], dtypes=("fp16", "int4"), peer=False)
    save("decode_quick", rows)


def sweep(shapes: list[str]) -> None:
    """One tuning variant (set by HEXCORE_* variables) over ``BxKVxCTX`` shapes, no peer;
    dtypes from BENCH_DTYPES (default all), saved as decode_<BENCH_NAME>.json."""
    import os

    from benchmarks.gpu_common import save

    dtypes = tuple(os.environ.get("BENCH_DTYPES", "fp16,int4,int2").split(","))
    rows = []
    for shape in shapes:
        batch, kv_heads, ctx = (int(x) for x in shape.split("x"))
        rows += rows_for([(batch, kv_heads, ctx)], dtypes=dtypes, peer=False)
    save(f"decode_{os.environ.get('BENCH_NAME', 'sweep')}", rows)


if __name__ == "__main__":
    import sys

    if "--sweep" in sys.argv:
        sweep(sys.argv[sys.argv.index("--sweep") + 1:])
    else:
        {"--quick": quick, "--host": host}.get(sys.argv[-1], test_decode_bandwidth)()
