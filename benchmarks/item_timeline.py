"""Where a one-launch decode's time goes, item by item: the persistent decode's one-launch
call (``PersistentDecode.one_launch``: the grid kernel's items over its grid, within 1.03x of
``DecodePlan.run`` at every shape of ``bench_decode``'s table; 1.2-1.3x at B=1 1k, where the plan
merges in a cluster) records each CTA's ``%globaltimer`` (32 ns steps on
an H100/H200) before and after its item (``PersistentDecode.item_times``). Read against the
call's CUDA-event time, that splits a decode into the time outside its CTAs (launch, the
kernel's start and end), the ramp (how late the last CTA starts), the items themselves and
the tail of each (sequence, KV head, head group) row: how long its last split runs after
every other split of the row has finished (its merge, and its own lag). Issue 12's B=1 rows
are short decodes whose fixed costs this separates.

    python -m benchmarks.item_timeline [--shapes b1|"B,Hq,Hkv,ctx;..."] [--dtypes fp16,int4,int2] [--calls 20]

One JSON line per (shape, dtype), us: ``paged`` and ``queued`` (``DecodePlan.run`` and the
one-launch call by CUDA events around ten calls back to back, queued: ``gpu_common.time_gpu``),
then medians over ``--calls`` single calls, each queued behind a held stream, of its CUDA-event
time ``event``, ``summarize``'s fields of its records and ``outside`` (``event`` minus
``span``: the launch and the kernel's start and end; back to back, dependent launches may
hide part of it, which ``queued`` against ``event`` shows).
"""

from __future__ import annotations

import json
import statistics
import sys

import numpy as np


def summarize(starts: np.ndarray, ends: np.ndarray, splits: int) -> dict:
    """One one-launch call's records (int64 ns ``[items]``, queue order: split fastest, rows of
    ``splits``) in us: ``span`` (first start to last end), ``ramp`` (first start to last start:
    the launch's spread over the SMs, and whole waves of items where they outnumber the
    resident CTAs), ``item_p50`` and ``item_max`` (an item's own time), ``tail_p50`` and
    ``tail_max`` over the rows (a row's last end less the latest end of its other splits; 0 for
    an unsplit row), and ``critical_tail``, the tail of the row that ends last. ValueError,
    naming the sizes, for records that are no call's."""
    starts, ends = np.asarray(starts), np.asarray(ends)
    if (not isinstance(splits, (int, np.integer)) or splits < 1 or starts.shape != ends.shape or starts.ndim != 1
            or starts.size == 0 or starts.size % splits or starts.dtype.kind not in "iu" or ends.dtype.kind not in "iu"):
        raise ValueError(f"summarize: expected two equal, non-empty 1-D integer arrays of a multiple of "
                         f"splits={splits!r} items, got {starts.dtype} {starts.shape} and {ends.dtype} {ends.shape}")
    starts, ends = starts.astype(np.int64), ends.astype(np.int64)
    t0 = starts.min()
    rows = np.sort(ends.reshape(-1, splits), axis=1)
    tails = rows[:, -1] - rows[:, -2] if splits > 1 else np.zeros(rows.shape[0], np.int64)
    items = ends - starts
    return {key: float(value) / 1e3 for key, value in dict(
        span=ends.max() - t0, ramp=starts.max() - t0, item_p50=np.median(items), item_max=items.max(),
        tail_p50=np.median(tails), tail_max=tails.max(), critical_tail=tails[np.argmax(rows[:, -1])]).items()}


def timeline_row(dtype: str, shape: tuple, calls: int, options=None) -> dict:
    """The row of ``dtype`` at ``shape`` (B, Hq, Hkv, ctx) over ``calls`` single calls (at least
    one): see the module's docstring. ``options``: the persistent plan's ``DecodeOptions``
    (its defaults where None; on a GPU they make every decode shape's call one launch)."""
    from numba import cuda

    from benchmarks.bench_persistent import case
    from benchmarks.gpu_common import QUEUE_NS, hold_stream, time_gpu
    from hexcore.cuda import DecodePlan
    from hexcore.cuda.attention.persistent import MAX_BUDGET_US, PersistentDecode

    if calls < 1:
        raise ValueError(f"timeline_row: expected at least one call, got calls={calls!r}")
    store, q, tables, lens, slots = case(dtype, *shape)
    plan = DecodePlan(q, store, tables, lens, slots, max_seq_len=shape[3])
    call = PersistentDecode(q, store, tables, lens, slots, MAX_BUDGET_US, max_seq_len=shape[3], options=options)
    if not call.one_launch:
        raise SystemExit(f"item_timeline: {dtype} at {shape} is not one launch ({call.num_items} items)")
    paged = time_gpu(lambda: plan.run(0), queue_ns=QUEUE_NS)
    queued = time_gpu(lambda: call.enqueue(0, 1), queue_ns=QUEUE_NS)
    fields = []
    for _ in range(calls):  # each call alone, queued behind a held stream, its events and records
        hold_stream(QUEUE_NS)
        start, stop = cuda.event(), cuda.event()
        start.record()
        call.enqueue(0, 1)
        stop.record()
        stop.synchronize()
        times = call.item_times()
        row = summarize(*times)
        row["event"] = start.elapsed_time(stop) * 1e3
        row["outside"] = row["event"] - row["span"]
        fields.append(row)
    medians = {key: statistics.median(f[key] for f in fields) for key in fields[0]}
    batch, hq, hkv, ctx = shape
    return dict(row="item_timeline", dtype=dtype, B=batch, Hq=hq, Hkv=hkv, ctx=ctx, items=call.num_items,
                splits=times.splits, calls=calls, paged=paged * 1e6, queued=queued * 1e6, **medians)


def main(argv) -> None:
    from benchmarks.bench_decode import parse_shapes
    from benchmarks.gpu_common import flag_value

    shapes = parse_shapes(flag_value(argv, "--shapes", "b1"))
    dtypes = flag_value(argv, "--dtypes", "fp16,int4,int2").split(",")
    calls = flag_value(argv, "--calls", "20")
    if not calls.isdigit() or int(calls) < 1:
        raise SystemExit(f"--calls: expected a positive number of calls, got {calls!r}")
    for shape in shapes:
        for dtype in dtypes:
            row = timeline_row(dtype, shape, int(calls))
            print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
