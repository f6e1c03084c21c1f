"""Persistent checkpoint-and-yield decode on the GPU: cost against paged_decode, cost per
yield, what a competing stream sees, and %globaltimer's granularity. One JSON line per row.

    python -m benchmarks.bench_persistent [--shapes all|quick|gqa|b1|"B,Hq,Hkv,ctx;..."] [--dtypes fp16,int4,int2]
                                          [--skip-latency]
                                          [--registers default,168,128] [--items call,inline] [--skip-yields]
                                          [--queued] [--unclustered]
                                          [--variants "default;ctas_per_sm=8:eager_first=1;..."]

Rows:
- ``timer``: the smallest nonzero step of ``%globaltimer`` seen by one thread over many reads.
- ``no_yield``: GPU time (events) of ``PersistentDecode.enqueue(layer, 1)`` with a budget
  no decode reaches (one slice, the reset included) against ``DecodePlan.run``; target
  ratio <= 1.05; also the eager ``run`` (which reads the cursor back, or where a call is one
  launch waits for its stream) per call, and whether
  a call is one launch with no slice state (``one_launch``: the slice grid holds every item,
  or the item model puts the call within a quarter of its budget, ``wide_one_launch``; the
  ``yield_1ms`` rows of the decode shapes are then that one launch too).
- ``--queued``: the ``no_yield`` and ``yield_1ms`` GPU times with the calls enqueued before
  the GPU reaches them (``gpu_common.time_gpu``'s ``queue_ns``, 2 ms: the device's time
  alone, not a host-paced one); rows carry ``queued``.
- ``--unclustered``: the ``no_yield`` rows also against a plan that never merges in clusters
  (``DecodeOptions(cluster_merge=False)``, as eager ``paged_decode`` and the persistent
  decode itself): ``paged_unclustered_ms``, ``ratio_unclustered``.
- ``--variants``: ``;``-separated sets of the persistent plan's ``DecodeOptions`` beside
  ``--registers`` and ``--items`` (integer fields, ``name=value`` joined by ``:``; "default"
  none), each row run per set and labelled with it (``variant``); every set is checked
  before any GPU work. With ``ctas_per_sm`` past the occupancy (``ctas_per_sm`` times the
  SMs at least the items) the slice grid holds every item, so a call runs as one wide
  launch whose CTAs the hardware schedules: ``eager_first=1`` makes it the one-launch
  kernel, ``eager_first=0`` the slice kernel with static items only (each CTA checks the
  budget first). ``split_blocks`` pins the split length. By default a call the item model
  puts within a quarter of its budget is one wide launch anyway (``wide_one_launch``, on a
  GPU): ``wide_one_launch=0`` times the slice protocol at such a shape instead.
- ``--skip-yields``: the ``no_yield`` rows alone (no ``LONG`` decode, no ``yield_1ms`` rows).
- ``yield_1ms``: the same with a 1 ms budget (first on a ~15 ms decode, ``LONG``, then on
  each decode shape; per persistent-kernel register cap of ``--registers``, "default" being
  the kernel's own, and per way of running an item of ``--items``, ``DecodeOptions.persistent_item``):
  slices, GPU time, cost per yield
  ``(t - t_no_yield) / yields``, and the relaunch gap (GPU time minus the sum of slice
  spans by %globaltimer, per yield).
- ``latency``: a one-CTA kernel on a second stream, launched every ~0.2 ms while a ~50 ms
  decode runs on the first (both created streams): its launch-to-end latency (host
  time; median, p99, max), with the decode as one launch and in slices of 1 ms.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import numpy as np

from benchmarks.bench_decode import BS, D, parse_shapes


def emit(row: dict) -> None:
    print(json.dumps(row), flush=True)


def timer_granularity() -> dict:
    from numba import cuda

    from hexcore.cuda.timer import global_timer_ns

    @cuda.jit
    def reads(out):
        for i in range(out.shape[0]):
            out[i] = global_timer_ns()

    out = cuda.device_array(1 << 16, np.int64)
    reads[1, 1](out)
    cuda.synchronize()
    host = out.copy_to_host()
    steps = np.diff(host)
    nonzero = steps[steps > 0]
    return dict(row="timer", reads=int(host.size), min_step_ns=int(nonzero.min()) if nonzero.size else 0,
                median_step_ns=float(np.median(nonzero)) if nonzero.size else 0.0,
                distinct=int(np.unique(host).size), span_ns=int(host[-1] - host[0]), monotonic=bool((steps >= 0).all()))


def case(dtype, batch, hq, hkv, ctx, num_blocks=None):
    """(store, q, tables, lens, slots): a filled store, shuffled tables (bench_decode's case)."""
    from numba import cuda

    from benchmarks.gpu_common import fill_store
    from hexcore import KVCacheConfig
    from hexcore.cuda import DeviceKVStore

    cfg = KVCacheConfig(num_layers=1, num_kv_heads=hkv, head_dim=D, block_size=BS, kv_dtype=dtype)
    per_seq = -(-ctx // BS)
    pool = num_blocks or batch * per_seq
    store = DeviceKVStore(cfg, num_blocks=pool, max_seqs=batch)
    fill_store(store)
    rng = np.random.default_rng(0)
    ids = rng.permutation(pool) if pool == batch * per_seq else rng.integers(0, pool, batch * per_seq)
    tables = cuda.to_device(ids.astype(np.int32).reshape(batch, per_seq))
    lens = cuda.to_device(np.full(batch, ctx, np.int32))
    slots = cuda.to_device(np.arange(batch, dtype=np.int32))
    q = cuda.to_device(rng.standard_normal((batch, hq, D)).astype(np.float16))
    return store, q, tables, lens, slots


# a decode of about 15 ms (69 GB of reads over an 8 GiB pool), long enough for a 1 ms budget to
# yield about 15 times; the decode-benchmark shapes run in under 1.1 ms and never yield at 1 ms
LONG = (128, 32, 8, 131072)


def cost_rows(dtype, shape, num_blocks=None, registers=None, item="inline", yields=True, queue_ns=0,
              unclustered=False, variant="default") -> list[dict]:
    """The ``no_yield`` row (persistent over ``DecodePlan.run`` at its defaults; ``unclustered``:
    also over a plan that never merges in clusters, as eager ``paged_decode`` launches and the
    persistent decode itself do) and, with ``yields``, the ``yield_1ms`` row. ``variant``: more
    of the persistent plan's options (``parse_variant``)."""
    import functools

    from benchmarks.gpu_common import host_seconds_per_call, time_gpu
    from hexcore.cuda import DecodePlan
    from hexcore.cuda.attention.options import DecodeOptions
    from hexcore.cuda.attention.persistent import MAX_BUDGET_US, PersistentDecode

    batch, hq, hkv, ctx = shape
    store, q, tables, lens, slots = case(dtype, *shape, num_blocks=num_blocks)
    base = dict(dtype=dtype, B=batch, Hq=hq, Hkv=hkv, ctx=ctx, registers=registers or "default", item=item,
                queued=queue_ns > 0, variant=variant)
    time_gpu = functools.partial(time_gpu, queue_ns=queue_ns)
    # the persistent kernel's cap and item only (the plan keeps its own)
    options = DecodeOptions(max_registers=registers, persistent_item=item, **parse_variant(variant))
    plan = DecodePlan(q, store, tables, lens, slots, max_seq_len=ctx)
    t_plan = time_gpu(lambda: plan.run(0))
    whole = PersistentDecode(q, store, tables, lens, slots, MAX_BUDGET_US, max_seq_len=ctx, options=options)
    whole.run(0)
    t_whole = time_gpu(lambda: whole.enqueue(0, 1))
    assert whole.stats().drained and whole.stats().launches == 1
    eager = host_seconds_per_call(lambda: whole.run(0), calls=50, until_done=True)
    from benchmarks.bench_decode import out_finite

    rows = [dict(row="no_yield", **base, paged_ms=t_plan * 1e3, persistent_ms=t_whole * 1e3, ratio=t_whole / t_plan,
                 eager_run_ms=eager * 1e3, items=whole.num_items, out_finite=out_finite(whole.out),
                 one_launch=whole.one_launch)]
    if unclustered:
        plain = DecodePlan(q, store, tables, lens, slots, max_seq_len=ctx, options=DecodeOptions(cluster_merge=False))
        t_plain = time_gpu(lambda: plain.run(0))
        rows[0].update(paged_unclustered_ms=t_plain * 1e3, ratio_unclustered=t_whole / t_plain)
    if not yields:
        return rows
    sliced = PersistentDecode(q, store, tables, lens, slots, 1000.0, max_seq_len=ctx, options=options)
    sliced.run(0)
    stats = sliced.stats()
    slices = stats.launches
    t_sliced = time_gpu(lambda: sliced.enqueue(0, slices))
    stats = sliced.stats()
    yields = max(stats.yields, 1)
    gap_us = (t_sliced * 1e6 - sum(stats.launch_us)) / max(stats.launches, 1)
    rows.append(dict(row="yield_1ms", **base, launches=stats.launches, yields=stats.yields, items=stats.items,
                     persistent_ms=t_sliced * 1e3, per_yield_us=(t_sliced - t_whole) * 1e6 / yields,
                     relaunch_gap_us=gap_us, longest_launch_us=stats.longest_launch_us,
                     longest_item_us=stats.longest_item_us, drained=stats.drained))
    return rows


BOOL_FIELDS = ("eager_first", "wide_one_launch")  # --variants fields read as 0/1


def parse_variant(text: str) -> dict:
    """``DecodeOptions`` keywords from ``--variants``' ``name=value:name=value`` ("default":
    none); ``eager_first`` and ``wide_one_launch`` read 0/1 as a bool, the other fields as
    integers. Exits naming the piece it cannot read, or a field that ``--registers``/``--items``
    set."""
    if text.strip() == "default":
        return {}
    out = {}
    for pair in text.split(":"):
        name, eq, value = (part.strip() for part in pair.partition("="))
        if not eq or not name or not value.lstrip("-").isdigit():
            raise SystemExit(f"--variants: {pair!r} in {text!r} is not name=integer")
        if name in ("max_registers", "persistent_item"):
            raise SystemExit(f"--variants: {name} is set by --registers / --items")
        if name in BOOL_FIELDS and value not in ("0", "1"):
            raise SystemExit(f"--variants: {name}={value} is not 0 or 1")
        out[name] = value == "1" if name in BOOL_FIELDS else int(value)
    return out


def check_variants(variants: list[str]) -> None:
    """Every ``--variants`` set made into ``DecodeOptions`` before any GPU work: a bad one
    exits naming it, not midway through a run."""
    from hexcore.cuda.attention.options import DecodeOptions

    for variant in variants:
        try:
            DecodeOptions(**parse_variant(variant))
        except (TypeError, ValueError) as exc:
            raise SystemExit(f"--variants: {variant!r}: {exc}") from exc


def latency_rows() -> list[dict]:
    """A small kernel's latency on another stream while a ~50 ms decode runs, with and without slices.

    Both run on created streams: a stream made by ``cuda.stream()`` waits for everything
    queued on the legacy default stream, so a decode on stream 0 made the small kernel wait
    for its end (one sample per run in the 2026-12-01 session-4 H200 run). The latency is
    host time from the launch to the small kernel's completion."""
    from numba import cuda

    from benchmarks.gpu_common import time_gpu
    from hexcore.cuda import DecodePlan
    from hexcore.cuda.attention.persistent import PersistentDecode

    @cuda.jit
    def tiny(x):
        x[cuda.threadIdx.x] += 1

    shape = (400, 32, 8, 131072)  # 215 GB of reads over an 8 GiB pool: about 50 ms at 4.4 TB/s
    store, q, tables, lens, slots = case("fp16", *shape, num_blocks=65536)
    plan = DecodePlan(q, store, tables, lens, slots, max_seq_len=shape[3])
    decode_ms = time_gpu(lambda: plan.run(0), 1, 3, 1) * 1e3
    sliced = PersistentDecode(q, store, tables, lens, slots, 1000.0, max_seq_len=shape[3])
    sliced.run(0)
    slices = sliced.stats().launches
    main, other, x = cuda.stream(), cuda.stream(), cuda.device_array(32, np.float32)
    tiny[1, 32, other](x)
    rows = []
    for mode, start in (("one launch", lambda: plan.run(0, main)),
                        ("1 ms slices", lambda: sliced.enqueue(0, slices, main))):
        cuda.synchronize()
        start()
        waits = []
        t_end = time.perf_counter() + decode_ms / 1e3 * 0.9
        while time.perf_counter() < t_end:
            t0 = time.perf_counter()
            tiny[1, 32, other](x)
            other.synchronize()
            waits.append((time.perf_counter() - t0) * 1e6)
            time.sleep(0.0002)
        cuda.synchronize()
        waits.sort()
        rows.append(dict(row="latency", mode=mode, decode_ms=decode_ms, samples=len(waits),
                         median_us=statistics.median(waits), p99_us=waits[int(0.99 * (len(waits) - 1))],
                         max_us=waits[-1]))
    return rows


def main(argv) -> None:
    from benchmarks.gpu_common import QUEUE_NS, flag_value

    def arg(flag, default):
        return flag_value(argv, flag, default)

    shapes = parse_shapes(arg("--shapes", "all"))
    dtypes = arg("--dtypes", "fp16,int4,int2").split(",")
    variants = arg("--variants", "default").split(";")
    check_variants(variants)
    emit(timer_granularity())
    yields = "--skip-yields" not in argv
    if yields:  # the yield costs first: what a short run must see
        for row in cost_rows("fp16", LONG, num_blocks=65536):
            emit(row)
    if "--skip-latency" not in argv:
        for row in latency_rows():
            emit(row)
    caps = [None if c == "default" else int(c) for c in arg("--registers", "default").split(",")]
    items = arg("--items", "inline").split(",")
    for shape in shapes:
        for dtype in dtypes:
            for cap in caps:
                for item in items:
                    for variant in variants:
                        for row in cost_rows(dtype, shape, registers=cap, item=item, yields=yields,
                                             queue_ns=QUEUE_NS if "--queued" in argv else 0,
                                             unclustered="--unclustered" in argv, variant=variant):
                            emit(row)


if __name__ == "__main__":
    main(sys.argv[1:])
