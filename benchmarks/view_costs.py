"""Host cost of numba-cuda's device views and argument marshalling, made fresh against kept
(``hexcore.cuda.views``): what the eager tiered step paid per view before it kept them.

    python -m benchmarks.view_costs [--repeat 2000]        (a GPU: numba-cuda's real classes)
    NUMBA_ENABLE_CUDASIM=1 python -m benchmarks.view_costs  (the simulator: its numpy wrappers)

Printed: us per call of a slice, a reshape, a dtype view, a fresh view's address as a check
reads it (``__cuda_array_interface__``; none on the simulator), a kept view's lookup, and on a GPU ``typeof`` and
``_prepare_args`` of a fresh view (what ``PreparedLaunch.set_array`` paid per call before),
``set_array`` with a fresh view and with kept ones, and an eager launch with fresh views
against kept ones (the launch itself included in both).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np


def per_call_us(fn, repeat: int) -> float:
    """Best of three runs of ``repeat`` calls of ``fn()``: us per call (the device idle
    before each run: launches time the host, not a full queue)."""
    from numba import cuda

    best = float("inf")
    for _ in range(3):
        cuda.synchronize()
        start = time.perf_counter()
        for _ in range(repeat):
            fn()
        best = min(best, time.perf_counter() - start)
    return 1e6 * best / repeat


def costs(repeat: int) -> dict:
    """{what: us per call} (see the module docstring)."""
    from numba import cuda

    from hexcore.cuda import views
    from hexcore.cuda.arrays import _pointer  # (the address as a check reads it, not kept)
    from hexcore.cuda.launch import Launch, marshalled

    buf = cuda.device_array(4096, np.int32)
    table = views.memo(buf, "table", lambda b: b[64:64 + 63 * 20].reshape(63, 20))
    found = {
        "slice buf[a:b]": lambda: buf[64:64 + 1260],
        "reshape (2-D)": lambda: buf.reshape(64, 64),
        "view(uint32)": lambda: buf.view(np.uint32),
        "slice + reshape + its address": lambda: _pointer(buf[64:64 + 1260].reshape(63, 20)),
        "kept view (views.memo)": lambda: views.memo(buf, "table", None),
        "kept slice (views.sliced)": lambda: views.sliced(buf, 64, 128),
    }
    out = {name: per_call_us(fn, repeat) for name, fn in found.items()}
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        return out

    @cuda.jit
    def touch(table, out, n):
        if cuda.grid(1) < n:
            out[0] = table[0, 0]

    dest = cuda.device_array(4, np.int32)
    prepared = Launch(touch, 1, 32, (table, dest, 1)).prepare()
    kernel = prepared._kernel
    other = views.memo(buf, "other", lambda b: b[2048:2048 + 1260].reshape(63, 20))

    def fresh_marshal():
        view = buf[64:64 + 1260].reshape(63, 20)
        kernel._prepare_args(touch.typeof_pyval(view), view, 0, [], [])

    def switch_kept():
        prepared.set_array(0, other)
        prepared.set_array(0, table)

    out.update({
        "fresh view: typeof + _prepare_args": per_call_us(fresh_marshal, repeat),
        "kept view: marshalled (memo hit)": per_call_us(lambda: marshalled(touch, kernel, table), repeat),
        "set_array, a fresh view": per_call_us(lambda: prepared.set_array(0, buf[64:64 + 1260].reshape(63, 20)),
                                               repeat),
        "set_array, kept views (one call)": per_call_us(switch_kept, repeat) / 2,
        "eager launch, fresh views": per_call_us(lambda: touch[1, 32](buf[64:64 + 1260].reshape(63, 20),
                                                                      dest[0:4], 1), repeat),
        "eager launch, kept views": per_call_us(lambda: touch[1, 32](table, dest, 1), repeat),
        "prepared run": per_call_us(lambda: prepared.run(0), repeat),
    })
    cuda.synchronize()
    return out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2000)
    args = parser.parse_args(argv)
    where = "simulator" if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" else "GPU"
    out = costs(args.repeat)
    print(f"host us per call ({where}, best of 3 x {args.repeat}):")
    for name, us in out.items():
        print(f"  {name:45s} {us:8.2f}")
    return out


if __name__ == "__main__":
    main()
