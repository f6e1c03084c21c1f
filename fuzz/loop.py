"""A plain random loop over one fuzz target, for targets whose work atheris cannot see
(the simulator's kernels): random inputs through ``TARGETS[TARGET]`` until one fails.

    python fuzz/loop.py TARGET SEED COUNT [--max-len N]

Inputs are ``numpy.random.default_rng(SEED)`` bytes, 8 to N - 1 long (N = 64 by default),
so a run is reproducible from its seed. Prints each input's time; on a failure, the input
in hex and the error, and exits 1. Simulator targets (``fuzz.py``'s ``SIMULATED``) run on
numba's CUDA simulator with ``hexcore.cuda.simulated.use_fast_simulator``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def main() -> int:
    from fuzz.fuzz import IMPORTS, SIMULATED

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", choices=sorted(IMPORTS))
    parser.add_argument("seed", type=int)
    parser.add_argument("count", type=int)
    parser.add_argument("--max-len", type=int, default=64)
    args = parser.parse_args()
    if args.target in SIMULATED:
        os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
        from hexcore.cuda.simulated import use_fast_simulator

        use_fast_simulator()
    import numpy as np

    from fuzz.harness import TARGETS

    rng, start = np.random.default_rng(args.seed), time.perf_counter()
    for i in range(args.count):
        data = rng.integers(0, 256, int(rng.integers(8, args.max_len)), dtype=np.uint8).tobytes()
        began = time.perf_counter()
        try:
            TARGETS[args.target](data)
        except AssertionError as exc:
            print(f"FAIL input {i}: {data.hex()}\n{exc!r}", flush=True)
            return 1
        print(f"{i} {time.perf_counter() - began:.2f} s", flush=True)
    print(f"{args.count} inputs in {time.perf_counter() - start:.0f} s, no failure")
    return 0


if __name__ == "__main__":
    sys.exit(main())
