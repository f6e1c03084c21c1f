"""Issue 12 (sixty-second session): the B=1 timeline at 32k with the split length halved and
doubled from the split policy's choice, and at 21 blocks (49 splits: 392 items, three CTAs an SM), per dtype, so the timeline's parts (outside, ramp,
items, tail) are seen moving with the split count. One JSON line per row (item_timeline's).

    python benchmarks/experiments/2026-12-07-s62/timeline_splits.py [--dtypes fp16,int4,int2]
"""
import json
import sys

from benchmarks.bench_persistent import case
from benchmarks.gpu_common import flag_value
from benchmarks.item_timeline import timeline_row
from hexcore.cuda import DecodeOptions
from hexcore.cuda.attention.persistent import MAX_BUDGET_US, PersistentDecode

SHAPE = (1, 32, 8, 32768)
for dtype in flag_value(sys.argv[1:], "--dtypes", "fp16,int4,int2").split(","):
    store, q, tables, lens, slots = case(dtype, *SHAPE)
    default = PersistentDecode(q, store, tables, lens, slots, MAX_BUDGET_US, max_seq_len=SHAPE[3])
    chosen = default._sized[2]  # (kernel, grid, split_blocks, ...)
    del default, store
    for split_blocks in sorted({chosen // 2, 21, chosen * 2} - {chosen}):  # 21: 49 splits, 392 items
        row = timeline_row(dtype, SHAPE, 20, DecodeOptions(split_blocks=split_blocks))
        row.update(chosen=chosen, split_blocks=split_blocks)
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
