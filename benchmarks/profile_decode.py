"""One decode kernel per call at the MHA benchmark shape, for Nsight Compute:

    ncu --clock-control none -k regex:locals --launch-skip 2 --launch-count 1 \\
        --section SpeedOfLight --section WarpStateStats python3 -m benchmarks.profile_decode int4
"""

from __future__ import annotations

import sys

from numba import cuda

from benchmarks.bench_decode import B, CTX, decode_case

if __name__ == "__main__":
    run, nbytes, _store = decode_case(sys.argv[1] if len(sys.argv) > 1 else "fp16", B, 32, CTX)
    for _ in range(3):
        run()
    cuda.synchronize()
    print(f"profiled {sys.argv[1:]} ({nbytes / 1e9:.3f} GB)")
