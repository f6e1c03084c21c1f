"""Where a one-launch decode's time goes, item by item: the persistent decode's one-launch
call (``PersistentDecode.one_launch``: the grid kernel's items over its grid, within 1.03x of
``DecodePlan.run`` at every decode shape) records each CTA's ``%globaltimer`` (32 ns steps on
an H100/H200) before and after its item (``PersistentDecode.item_times``). Read against the
call's CUDA-event time, that splits a decode into the time outside its CTAs (launch, the
kernel's start and end), the ramp (how late the last CTA starts), the items themselves and
the tail of each (sequence, KV head, head group) row: how long its last split runs after
every other split of the row has finished (its merge, and its own lag). Issue 12's B=1 rows
are short decodes whose fixed costs this separates.

    python -m benchmarks.item_timeline [--shapes b1|"B,Hq,Hkv,ctx;..."] [--dtypes fp16,int4,int2] [--calls 20]

One JSON line per (shape, dtype), us: ``event`` (the call by CUDA events, queued, median),
``paged`` (``DecodePlan.run`` the same way), then medians over ``--calls`` single calls of
``summarize``'s fields and ``outside`` (``event`` minus ``span``).
"""

from __future__ import annotations

import json
import statistics
import sys

import numpy as np


def summarize(starts: np.ndarray, ends: np.ndarray, splits: int) -> dict:
    """One one-launch call's records (int64 ns ``[items]``, queue order: split fastest, rows of
    ``splits``) in us: ``span`` (first start to last end), ``ramp`` (first start to last start),
    ``item_p50`` and ``item_max`` (an item's own time), ``tail_p50`` and ``tail_max`` over the
    rows (a row's last end less the latest end of its other splits; 0 for an unsplit row), and
    ``critical_tail``, the tail of the row that ends last."""
    starts, ends = np.asarray(starts, np.int64), np.asarray(ends, np.int64)
    if starts.shape != ends.shape or starts.ndim != 1 or splits < 1 or starts.size % splits:
        raise ValueError(f"summarize: expected two equal 1-D arrays of a multiple of splits={splits} items, "
                         f"got {starts.shape} and {ends.shape}")
    t0 = starts.min()
    rows = np.sort(ends.reshape(-1, splits), axis=1)
    tails = rows[:, -1] - rows[:, -2] if splits > 1 else np.zeros(rows.shape[0], np.int64)
    items = ends - starts
    return dict(span=(ends.max() - t0) / 1e3, ramp=(starts.max() - t0) / 1e3,
                item_p50=float(np.median(items)) / 1e3, item_max=items.max() / 1e3,
                tail_p50=float(np.median(tails)) / 1e3, tail_max=tails.max() / 1e3,
                critical_tail=tails[np.argmax(rows[:, -1])] / 1e3)


def timeline_row(dtype: str, shape: tuple, calls: int, options=None) -> dict:
    """The row of ``dtype`` at ``shape`` (B, Hq, Hkv, ctx): see the module's docstring.
    ``options``: the persistent plan's ``DecodeOptions`` (its defaults where None; on a GPU
    they make every decode shape's call one launch)."""
    from benchmarks.bench_persistent import case
    from benchmarks.gpu_common import QUEUE_NS, time_gpu
    from hexcore.cuda import DecodePlan
    from hexcore.cuda.attention.persistent import MAX_BUDGET_US, PersistentDecode

    store, q, tables, lens, slots = case(dtype, *shape)
    plan = DecodePlan(q, store, tables, lens, slots, max_seq_len=shape[3])
    call = PersistentDecode(q, store, tables, lens, slots, MAX_BUDGET_US, max_seq_len=shape[3], options=options)
    if not call.one_launch:
        raise SystemExit(f"item_timeline: {dtype} at {shape} is not one launch ({call.num_items} items)")
    paged = time_gpu(lambda: plan.run(0), queue_ns=QUEUE_NS)
    event = time_gpu(lambda: call.enqueue(0, 1), queue_ns=QUEUE_NS)
    fields = []
    for _ in range(calls):
        call.enqueue(0, 1)
        fields.append(summarize(*call.item_times()))
    row = {key: statistics.median(f[key] for f in fields) for key in fields[0]}
    batch, hq, hkv, ctx = shape
    return dict(row="item_timeline", dtype=dtype, B=batch, Hq=hq, Hkv=hkv, ctx=ctx, items=call.num_items,
                splits=call.item_times().splits, calls=calls, paged=paged * 1e6, event=event * 1e6,
                outside=event * 1e6 - row["span"], **row)


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
