"""One decode shape at a time, for Nsight Compute:

    ncu --clock-control none -k regex:kernel --launch-skip 2 --launch-count 1 \\
        --section SpeedOfLight --section Occupancy --section WarpStateStats \\
        python3 -m benchmarks.profile_decode int4 1     (dtype, index into bench_decode.SHAPES)
"""

from __future__ import annotations

import sys

from numba import cuda

from benchmarks.bench_decode import SHAPES, decode_case

if __name__ == "__main__":
    dtype = sys.argv[1] if len(sys.argv) > 1 else "fp16"
    shape = SHAPES[int(sys.argv[2]) if len(sys.argv) > 2 else 0]
    run, nbytes, _store, info = decode_case(dtype, *shape)
    for _ in range(3):
        run()
    cuda.synchronize()
    print(f"profiled {dtype} {shape} ({nbytes / 1e9:.3f} GB) {info}")
