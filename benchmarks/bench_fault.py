"""Integrity costs: CPU FNV-1a, GPU scrub against the read ceiling, sampled verification
against a decode step, and migration.

    python -m benchmarks.bench_fault --cpu     (this machine: FNV-1a and the CPU block checksum)
    python -m benchmarks.bench_fault           (an NVIDIA GPU: everything; writes $OUT/fault.json)
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np
import pytest

from hexcore import KVCacheConfig

L, H, D, BS = 32, 8, 128, 32  # llama-3-8b's KV shape


def _best_seconds(fn, repeats: int = 5) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def cpu_rows() -> list[dict]:
    """FNV-1a over bytes, and the word-wise block checksum of host copies of blocks (1 thread)."""
    from hexcore.host.checksum import fnv1a_32, fnv1a_64, layer_digests

    rows = []
    data = np.random.default_rng(0).integers(0, 256, 1 << 26, dtype=np.uint8)
    for name, fn in (("fnv1a_32 bytes", fnv1a_32), ("fnv1a_64 bytes", fnv1a_64)):
        s = _best_seconds(lambda: fn(data), 3)
        rows.append(dict(op=name, MB=data.nbytes / 1e6, ms=s * 1e3, GBs=data.nbytes / s / 1e9))
    cfg = KVCacheConfig(num_layers=L, num_kv_heads=H, head_dim=D, block_size=BS, kv_dtype="int4")
    rng = np.random.default_rng(1)
    blocks = 16
    k = rng.integers(0, 256, (blocks, L, H, BS, cfg.row_bytes), dtype=np.uint8)
    v = rng.integers(0, 256, (blocks, L, H, BS, cfg.row_bytes), dtype=np.uint8)
    km = rng.standard_normal((blocks, L, H, 2, D)).astype(np.float16)
    vm = rng.standard_normal((blocks, L, H, BS, 2, cfg.num_groups)).astype(np.float16)

    def digests():
        for b in range(blocks):
            layer_digests(k[b], v[b], km[b], vm[b])

    s = _best_seconds(digests)
    nbytes = blocks * cfg.block_bytes
    rows.append(dict(op="block checksum int4 (word-wise, 32 lanes)", MB=nbytes / 1e6, ms=s * 1e3,
                     GBs=nbytes / s / 1e9))
    return rows


def gpu_rows() -> list[dict]:
    """Scrub of a whole cache (TB/s of the read ceiling), sampled verify at B=64 against 32
    layers of decode, migration host time and device copy."""
    from numba import cuda

    from benchmarks.gpu_common import CEILING_COPY_TBS, CEILING_READ_TBS, fill_store, time_gpu
    from hexcore import FaultTolerantKVCache, PagedKVCache
    from hexcore.cuda import copy_blocks, paged_decode
    from hexcore.cuda.integrity import checksum_launch, prepare_checksum

    rows = []
    for dtype in ("fp16", "int4", "int2"):
        cfg = KVCacheConfig(num_layers=L, num_kv_heads=H, head_dim=D, block_size=BS, kv_dtype=dtype)
        batch, ctx = 64, 4096
        num_blocks = batch * ctx // BS + 256
        store = _store(cfg, num_blocks, batch, fill_store)
        sums = cuda.device_array((num_blocks, L), np.uint32)
        bad = cuda.device_array(len(store.guard_offsets), np.uint32)
        every = cuda.to_device(np.arange(num_blocks, dtype=np.int32))
        out = cuda.device_array((num_blocks, L), np.uint32)
        scrub = checksum_launch(store, every, sums, out, bad, "compute").prepare()
        s = time_gpu(lambda: scrub.run(0))
        nbytes = num_blocks * cfg.block_bytes
        rows.append(dict(op=f"scrub {dtype}", items=f"{num_blocks} blocks x {L} layers", us=s * 1e6,
                         TBs=nbytes / s / 1e12, of_ceiling=nbytes / s / 1e12 / CEILING_READ_TBS))
        # sampled verify (1 in 16) of a B=64, 4k-token step's blocks, against the step's attention
        tables = np.arange(batch * ctx // BS, dtype=np.int32).reshape(batch, ctx // BS)
        sampled = cuda.to_device(np.ascontiguousarray(tables.reshape(-1)[::16]))
        verify = prepare_checksum(store, sampled, sums, cuda.device_array((sampled.shape[0], L), np.uint32), bad)
        s_verify = time_gpu(lambda: verify.run(0))
        q = cuda.to_device(np.random.default_rng(0).standard_normal((batch, 32, D)).astype(np.float16))
        t, lens, slots = (cuda.to_device(x) for x in (tables, np.full(batch, ctx, np.int32),
                                                       np.arange(batch, dtype=np.int32)))
        s_attend = time_gpu(lambda: [paged_decode(q, store, layer, t, lens, slots, max_seq_len=ctx)
                                     for layer in range(L)], inner=2)
        rows.append(dict(op=f"verify 1-in-16 {dtype}", items=f"B={batch} ctx={ctx}: {sampled.shape[0]} blocks",
                         us=s_verify * 1e6, step_us=s_attend * 1e6, of_step=s_verify / s_attend))
        # migration: host bookkeeping per sequence (8 blocks), and the device copy
        cache = PagedKVCache(cfg, num_blocks, store.max_seqs)
        ft = FaultTolerantKVCache(cache, store)
        seq = cache.add_sequence()
        cache.grow_sequence(seq, 8 * BS)
        ft.record(cache.block_table(seq))
        host = []
        for _ in range(50):
            t0 = time.perf_counter()
            ft.migrate_sequence(seq)
            host.append(time.perf_counter() - t0)
        host.sort()
        rows.append(dict(op=f"migrate {dtype}", items="8 blocks, whole call (3 launches + copies back)",
                         us=statistics.median(host) * 1e6, p99_us=host[int(0.99 * len(host))] * 1e6))
        src = cuda.to_device(np.arange(0, 1024, dtype=np.int32))
        dst = cuda.to_device(np.arange(1024, 2048, dtype=np.int32))
        s = time_gpu(lambda: copy_blocks(store, src, dst))
        nbytes = 2 * 1024 * cfg.block_bytes
        rows.append(dict(op=f"copy_blocks {dtype}", items="1024 blocks", us=s * 1e6, TBs=nbytes / s / 1e12,
                         of_copy=nbytes / s / 1e12 / CEILING_COPY_TBS))
        del store, ft, cache
    return rows


def _store(cfg, num_blocks, max_seqs, fill):
    from hexcore.cuda import DeviceKVStore

    store = DeviceKVStore(cfg, num_blocks, max_seqs)
    fill(store)
    return store


@pytest.mark.gpu
def test_fault_costs():
    from benchmarks.gpu_common import save

    rows = gpu_rows()
    save("fault", rows)
    assert rows


def test_cpu_checksum_speed(benchmark):
    from hexcore.host.checksum import layer_digests

    words = np.random.default_rng(0).integers(0, 1 << 32, (1, 1 << 16), dtype=np.uint32)
    assert benchmark(layer_digests, words, words).shape == (1,)


if __name__ == "__main__":
    rows = cpu_rows() if "--cpu" in sys.argv else cpu_rows() + gpu_rows()
    keys = sorted({k for r in rows for k in r}, key=lambda k: (k != "op", k))
    for r in rows:
        print(" | ".join(f"{k}={r[k]:.4g}" if isinstance(r[k], float) else f"{k}={r[k]}" for k in keys if k in r))
    if "--cpu" not in sys.argv:
        from benchmarks.gpu_common import save

        save("fault", rows)
