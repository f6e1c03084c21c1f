"""Integrity costs: CPU FNV-1a, GPU scrub against the read ceiling, sampled verification
against a decode step (separate launch, and inside a captured DecodeGraph step), and migration.

    python -m benchmarks.bench_fault --cpu     (this machine: FNV-1a and the CPU block checksum)
    python -m benchmarks.bench_fault --graph [--every 16,32] [--dtypes fp16,int4] [--name NAME]
                                               (an NVIDIA GPU: verification inside a graph step only,
                                                a line per row; writes $OUT/NAME.json, fault_graph)
    NUMBA_ENABLE_CUDASIM=1 python -m benchmarks.bench_fault --sample
                                               (any machine: host time of the in-graph sampling)
    python -m benchmarks.bench_fault           (an NVIDIA GPU: everything; writes $OUT/fault.json)

In-graph case (``graph_rows``): llama-3-8b's KV shape (32 layers), B=64 sequences of 4k
tokens, block 32; the GPU time of one replayed ``DecodeGraph`` step (CUDA events around 10
back-to-back steps, index copy included) without verification, and with
``verify_sums`` and a 1-in-N sample of the step's blocks as ``verify_blocks`` (the ids
``FaultTolerantKVCache.graph_step`` would pick: ``(block + call) % N == 0``, a new call
each step, capacity = the largest sample; ``share``: the blocks checked a step over the
blocks the step reads, the floor of ``overhead`` for a bandwidth-bound step). Every block's
digest is recorded first; after the timed steps ``verify_results()`` must report nothing
(``false_alarms`` = 0). Then whole layers in turn (``FaultTolerantKVCache(decode_layers=k)``):
the same step with ``verify_heads`` (every block's head digests recorded first) and
``verify_layers`` k, each step decoding k of the 32 layers with the verify variant (every
block they read checked: each (block, layer) once in 32 / k steps, i.e. 1-in-16 at k = 2),
all 32 / k phases captured by ``warmup`` and timed over whole rounds (``inner`` = 32 / k
steps, or 16 for the others).
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


def graph_rows(every=(16, 32, 64), dtypes=("fp16", "int4", "int2"), batch: int = 64, ctx: int = 4096,
               backend: str = "auto", layers=(2, 1)) -> list[dict]:
    """GPU time of a 32-layer DecodeGraph step at ``batch`` x ``ctx`` with and without
    sampled verification riding inside it (1-in-N for N in ``every``), and with k whole
    layers a step checked inside the decode (k in ``layers``)."""
    import warnings

    from numba import cuda

    from benchmarks.gpu_common import fill_store, time_gpu
    from hexcore.cuda import DecodeGraph
    from hexcore.cuda.integrity import checksum_launch, record_head_sums

    rows = []
    HQ = 32
    for dtype in dtypes:
        cfg = KVCacheConfig(num_layers=L, num_kv_heads=H, head_dim=D, block_size=BS, kv_dtype=dtype)
        per_seq = ctx // BS + 1
        num_blocks = batch * per_seq
        store = _store(cfg, num_blocks, batch, fill_store)
        rng = np.random.default_rng(0)
        tables = rng.permutation(num_blocks).astype(np.int32).reshape(batch, per_seq)
        lens, slots = np.full(batch, ctx, np.int32), np.arange(batch, dtype=np.int32)
        sums = cuda.device_array((num_blocks, L), np.uint32)
        every_block = np.arange(num_blocks, dtype=np.int32)
        checksum_launch(store, every_block, sums, cuda.device_array((num_blocks, L), np.uint32),
                        cuda.device_array(len(store.guard_offsets), np.uint32), "record").run(0)
        heads = cuda.device_array((num_blocks, L, H), np.uint32)
        record_head_sums(store, every_block, heads)
        cuda.synchronize()
        sealed = np.unique(tables[:, :ctx // BS])
        data = [rng.standard_normal((L, batch, h, D)).astype(np.float16) for h in (HQ, H, H)]

        def make(**kwargs):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                graph = DecodeGraph(store, HQ, per_seq, batch_buckets=(batch,), backend=backend, **kwargs)
            for view, host in zip(graph.buffers(batch)[:3], data):
                _fill_view(view, host)
            return graph

        plain = make()
        s_off = time_gpu(lambda: plain.step(tables, lens, slots), inner=16)
        for n in every:
            samples = [sealed[(sealed + call) % n == 0].astype(np.int32) for call in range(1, n + 1)]
            capacity = max(len(x) for x in samples)
            graph = make(verify_sums=sums, max_verify_blocks=capacity)
            turn = [0]

            def step():
                turn[0] += 1
                graph.step(tables, lens, slots, verify_blocks=samples[turn[0] % n])

            s_on = time_gpu(step, inner=16)
            results = graph.verify_results()
            rows.append(dict(op=f"graph step + verify 1-in-{n} {dtype}", backend=graph.backend,
                             items=f"B={batch} ctx={ctx} L={L}: {capacity} of {sealed.size} blocks a step",
                             off_us=s_off * 1e6, on_us=s_on * 1e6, overhead=s_on / s_off - 1,
                             share=float(np.mean([len(x) for x in samples])) / sealed.size, steps_checked=turn[0],
                             false_alarms=results.mismatches + results.guard_words))
            del graph
        for k in layers:
            graph = make(verify_sums=sums, max_verify_blocks=1, verify_heads=heads, verify_layers=k)
            graph.warmup(batch, ctx)
            turn = [0]

            def layered_step():
                turn[0] += 1
                graph.step(tables, lens, slots)

            s_on = time_gpu(layered_step, inner=L // k)
            results = graph.verify_results()
            rows.append(dict(op=f"graph step + {k} whole layer(s) a step in the decode {dtype}", backend=graph.backend,
                             items=f"B={batch} ctx={ctx} L={L}: every block of {k} layers a step (1-in-{L // k})",
                             off_us=s_off * 1e6, on_us=s_on * 1e6, overhead=s_on / s_off - 1, share=k / L,
                             steps_checked=turn[0], false_alarms=results.mismatches + results.guard_words))
            del graph
        del plain, store, sums, heads
    return rows


def sample_rows(batch: int = 64, ctx: int = 4096, calls: int = 2000) -> list[dict]:
    """Host time of ``FaultTolerantKVCache.sample_step`` (what ``graph_step`` adds on the
    host) for a ``batch`` x ``ctx`` step, block 32, 1-in-16 and always; a tiny store (the
    sampling reads only the tables). Median and p99 of ``calls`` calls."""
    from hexcore import FaultTolerantKVCache

    cache, store, ids = _grown_cache(1, batch, ctx)
    rows = []
    for policy, every in (("sampled", 16), ("always", 1)):
        ft = FaultTolerantKVCache(cache, store, policy=policy, sample_every=every)
        ft.recorded[:] = True
        result = cache.step(ids, np.full(batch, ctx, np.int32))  # (the first call seals; then no-ops)
        result.raise_for_status()
        times = []
        for _ in range(calls):
            t0 = time.perf_counter_ns()
            n = ft.sample_step(result).size
            times.append(time.perf_counter_ns() - t0)
        times.sort()
        rows.append(dict(op=f"sample_step {policy} 1-in-{every}", items=f"B={batch} ctx={ctx}: {n} blocks",
                         us=statistics.median(times) / 1e3, p99_us=times[int(0.99 * calls)] / 1e3))
    return rows + [_phase_row(batch, ctx, calls)]


def _phase_row(batch: int, ctx: int, calls: int) -> dict:
    """Host time a step with ``decode_layers=2`` (32 layers) adds: its tables' distinct
    blocks, the phase they need (``step_phase``) and its credit to them."""
    from hexcore import FaultTolerantKVCache
    from hexcore.fault import _credit_phase

    cache, store, ids = _grown_cache(32, batch, ctx)
    ft = FaultTolerantKVCache(cache, store, decode_layers=2)
    result = cache.step(ids, np.full(batch, ctx, np.int32))
    result.raise_for_status()
    times = []
    for call in range(calls):
        t0 = time.perf_counter_ns()
        phase = ft.step_phase(result)
        _credit_phase(ft._missing, ft._round_start, ft._sampled[:ft._table_count], phase, ft._full_round, call + 1)
        times.append(time.perf_counter_ns() - t0)
    times.sort()
    return dict(op="step_phase + credit, decode_layers 2 of 32", items=f"B={batch} ctx={ctx}: {ft._table_count} blocks",
                us=statistics.median(times) / 1e3, p99_us=times[int(0.99 * calls)] / 1e3)


def _grown_cache(num_layers: int, batch: int, ctx: int) -> tuple:
    """(cache, store, seq ids): ``batch`` sequences grown to ``ctx - 1`` tokens, block 32,
    one KV head of 64 (a tiny store: the host paths timed read only the tables)."""
    from hexcore import PagedKVCache
    from hexcore.cuda import DeviceKVStore

    cfg = KVCacheConfig(num_layers=num_layers, num_kv_heads=1, head_dim=64, block_size=BS, kv_dtype="fp16")
    num_blocks = batch * (ctx // BS + 2)
    cache, store = PagedKVCache(cfg, num_blocks, batch), DeviceKVStore(cfg, num_blocks, batch)
    ids = np.array([cache.add_sequence() for _ in range(batch)], np.int32)
    for s in ids.tolist():
        cache.grow_sequence(s, ctx - 1)
    return cache, store, ids


def _fill_view(view, host) -> None:
    if hasattr(view, "copy_"):  # torch
        import torch

        view.copy_(torch.as_tensor(host, device="cuda"))
    else:
        for layer in range(host.shape[0]):
            view[layer].copy_to_device(host[layer])


def _store(cfg, num_blocks, max_seqs, fill):
    from hexcore.cuda import DeviceKVStore

    store = DeviceKVStore(cfg, num_blocks, max_seqs)
    fill(store)
    return store


@pytest.mark.gpu
def test_fault_costs():
    from benchmarks.gpu_common import save

    rows = gpu_rows() + graph_rows()
    save("fault", rows)
    assert rows and not any(r.get("false_alarms") for r in rows)


def test_cpu_checksum_speed(benchmark):
    from hexcore.host.checksum import layer_digests

    words = np.random.default_rng(0).integers(0, 1 << 32, (1, 1 << 16), dtype=np.uint32)
    assert benchmark(layer_digests, words, words).shape == (1,)


if __name__ == "__main__":
    if "--sample" in sys.argv:
        for r in sample_rows():
            print(" | ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()))
        sys.exit(0)
    if "--graph" in sys.argv:
        from benchmarks.gpu_common import flag_value, save

        def option(flag, default):
            return flag_value(sys.argv, flag, default)

        rows = graph_rows(every=tuple(int(n) for n in option("--every", "16,32,64").split(",")),
                          dtypes=tuple(option("--dtypes", "fp16,int4,int2").split(",")))
        for r in rows:
            print(f"{r['op']} | off {r['off_us']:.1f} us | on {r['on_us']:.1f} us | overhead "
                  f"{100 * r['overhead']:.2f}% | false alarms {r['false_alarms']} | {r['items']}", flush=True)
        save(option("--name", "fault_graph"), rows)
        sys.exit(0)
    rows = cpu_rows() if "--cpu" in sys.argv else cpu_rows() + gpu_rows() + graph_rows()
    keys = sorted({k for r in rows for k in r}, key=lambda k: (k != "op", k))
    for r in rows:
        print(" | ".join(f"{k}={r[k]:.4g}" if isinstance(r[k], float) else f"{k}={r[k]}" for k in keys if k in r))
    if "--cpu" not in sys.argv:
        from benchmarks.gpu_common import save

        save("fault", rows)
