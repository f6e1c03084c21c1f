"""The persistent decode's slice and the grid decode of one shape, for Nsight Compute: both
warmed up, then one ``DecodePlan.run`` and one no-yield slice (``enqueue(0, 1)``) between
``cuda.profile_start`` and ``profile_stop``:

    ncu --profile-from-start off --clock-control none --section SpeedOfLight --section Occupancy \\
        --section LaunchStats --section WarpStateStats python3 -m benchmarks.profile_persistent int4 1,32,8,32768 [slices]

A no-yield call whose items outnumber the resident CTAs is one wide launch by default
(``DecodeOptions.wide_one_launch``); ``slices`` turns that off, to profile the slice kernel.

On a GPU only (the simulator has no profiler calls).
"""

from __future__ import annotations

import sys

from numba import cuda


def main(argv: list[str]) -> None:
    from benchmarks.bench_decode import parse_shapes
    from benchmarks.bench_persistent import case
    from hexcore.cuda import DecodePlan
    from hexcore.cuda.attention.options import DecodeOptions
    from hexcore.cuda.attention.persistent import MAX_BUDGET_US, PersistentDecode

    dtype = argv[0] if argv else "int4"
    shape = parse_shapes(argv[1] if len(argv) > 1 else "1,32,8,32768")[0]  # (a named set: its first)
    store, q, tables, lens, slots = case(dtype, *shape)
    plan = DecodePlan(q, store, tables, lens, slots, max_seq_len=shape[3])
    options = DecodeOptions(wide_one_launch=False) if "slices" in argv[2:] else None
    whole = PersistentDecode(q, store, tables, lens, slots, MAX_BUDGET_US, max_seq_len=shape[3], options=options)
    for _ in range(3):
        plan.run(0)
        whole.enqueue(0, 1)
    cuda.synchronize()
    cuda.profile_start()
    plan.run(0)
    whole.enqueue(0, 1)
    cuda.synchronize()
    cuda.profile_stop()
    print(f"profiled {dtype} {shape}: plan then one slice ({whole.num_items} items)")


if __name__ == "__main__":
    main(sys.argv[1:])
