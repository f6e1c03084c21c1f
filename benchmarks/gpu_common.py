"""Shared pieces of the GPU benchmarks: device-side random fill, event timing, results."""

from __future__ import annotations

import json
import os
import statistics
import time

import numpy as np
from numba import cuda, float32, uint32

from hexcore.cuda.timer import global_timer_ns

CEILING_READ_TBS = 4.47  # measured HBM read ceiling of the H200 (DESIGN.md §5)
CEILING_COPY_TBS = 4.27  # measured device-to-device copy (read + write)
QUEUE_NS = 2_000_000  # the benchmarks' --queued: the stream held 2 ms before each timed run


def flag_value(argv: list, flag: str, default: str) -> str:
    """The benchmarks' ``--flag VALUE`` options: the word after ``flag`` in ``argv``, or
    ``default`` where ``flag`` is absent; a flag with nothing after it exits naming it."""
    if flag not in argv:
        return default
    at = argv.index(flag) + 1
    if at == len(argv):
        raise SystemExit(f"{flag} needs a value")
    return argv[at]


@cuda.jit(device=True)
def _hash(x):
    # a 32-bit integer hash; each step is cut back to 32 bits: numba types uint32 * uint32
    # as 64-bit on the GPU (numpy's simulator wraps at 32), and an uncut product there left
    # bits above 32 in the result, so the float fill below wrote inf until 2026-12-03
    x = uint32(x)
    x = uint32(x ^ (x >> uint32(16)))
    x = uint32((x * uint32(0x7FEB352D)) & uint32(0xFFFFFFFF))
    x = uint32(x ^ (x >> uint32(15)))
    x = uint32((x * uint32(0x846CA68B)) & uint32(0xFFFFFFFF))
    x = uint32(x ^ (x >> uint32(16)))
    return x


@cuda.jit
def _fill_bytes(words, seed):
    i = cuda.grid(1)
    if i < words.shape[0]:
        words[i] = _hash((i * 2654435761 + seed) & 0xFFFFFFFF)


@cuda.jit
def _fill_halves(halves, seed, lo, hi):
    # u in [0, 1) from the hash's top 24 bits, in float32 (lo, hi float32 too). Until
    # 2026-12-03 the hash kept 64-bit products on the GPU (see _hash), u ran to 4e9 and the
    # H200 wrote inf almost everywhere, while the simulator wrote the intended values: every
    # GPU benchmark before then read inf/NaN data
    i = cuda.grid(1)
    if i < halves.shape[0]:
        u = float32(_hash((i * 2654435761 + seed) & 0xFFFFFFFF) >> uint32(8)) * float32(1.0 / 16777216.0)
        halves[i] = lo + (hi - lo) * u


FILL_CHECKED = 4096  # elements of each float array read back by fill_store's check


def fill_store(store, seed: int = 1) -> None:
    """Random content for every store array: codes random bytes, FP16 data in [-1, 1),
    quantization scales and mins in [0.01, 0.1). The first and last ``FILL_CHECKED``
    elements of each FP16 array are read back and must be finite and in their range, else
    RuntimeError: a benchmark never times garbage."""
    for name, array in store.arrays.items():
        flat = array.reshape(array.size)
        if array.dtype == np.uint8:
            words = flat.view(np.uint32)
            _fill_bytes[(words.shape[0] + 255) // 256, 256](words, seed)
        else:
            lo, hi = (0.01, 0.1) if name.endswith("meta") else (-1.0, 1.0)
            _fill_halves[(flat.shape[0] + 255) // 256, 256](flat, seed, np.float32(lo), np.float32(hi))
            check_filled(name, flat, lo, hi)
        seed += 7
    cuda.synchronize()


def check_filled(name: str, flat, lo: float, hi: float) -> None:
    """RuntimeError unless the ends of the float16 device array ``flat`` hold finite values in
    ``[lo, hi]`` (the fill's range; float16 rounding may reach ``hi``)."""
    n = min(FILL_CHECKED, flat.shape[0])
    for part in (flat[:n], flat[flat.shape[0] - n:]):
        values = part.copy_to_host().astype(np.float32)
        bad = ~(np.isfinite(values) & (values >= np.float32(lo)) & (values <= np.float32(hi)))
        if bad.any():
            raise RuntimeError(f"fill_store: {name} holds {int(bad.sum())} of {n} values outside [{lo}, {hi}] "
                               f"(first: {values[bad][0]!r}): the device fill is broken")


@cuda.jit
def _spin(ns):
    # one thread holds the stream for ``ns`` nanoseconds of %globaltimer
    t0 = global_timer_ns()
    while global_timer_ns() - t0 < ns:
        pass


def hold_stream(ns: int) -> None:
    """Hold the default stream for ``ns`` nanoseconds (a one-thread ``%globaltimer`` spin), so
    that what the host enqueues next is queued before the GPU reaches it."""
    _spin[1, 1](np.int64(ns))


def time_gpu(fn, warmup: int = 3, repeats: int = 10, inner: int = 10, queue_ns: int = 0) -> float:
    """Median seconds per ``fn()`` on the device: CUDA events around ``inner`` calls
    back to back (so host time overlaps device time), ``repeats`` times.

    ``queue_ns`` > 0: before each start event a one-thread kernel holds the default stream
    for that long, so the host has enqueued the ``inner`` calls before the GPU reaches them
    and the events time the device alone, kernel after kernel (without it a call whose
    host time exceeds its device time is timed at its host rate, and the first call's host
    time before the GPU sees it is counted too)."""
    for _ in range(warmup):
        fn()
    cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, stop = cuda.event(), cuda.event()
        if queue_ns:
            hold_stream(queue_ns)
        start.record()
        for _ in range(inner):
            fn()
        stop.record()
        stop.synchronize()
        times.append(cuda.event_elapsed_time(start, stop) / 1e3 / inner)
    return statistics.median(times)


def host_seconds_per_call(fn, calls: int = 200, idle: bool = False, until_done: bool = False) -> float:
    """Median seconds of one ``fn()`` call that only enqueues work (no sync inside).

    ``idle``: synchronize before each call, so each starts on an idle GPU (not timed);
    ``until_done``: the timed span ends after a device synchronize (the call's latency).
    """
    for _ in range(5):
        fn()
    cuda.synchronize()
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        if until_done:
            cuda.synchronize()
        times.append(time.perf_counter() - t0)
        if idle:
            cuda.synchronize()
    cuda.synchronize()
    return statistics.median(times)


def save(name: str, rows: list[dict], table: bool = True) -> None:
    """Write rows as JSON under $OUT (or ./gpu-results) and print them as a table (unless
    ``table`` is False: a run saving as it goes)."""
    out = os.environ.get("OUT") or os.path.join(os.getcwd(), "gpu-results")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"{name}.json"), "w") as f:
        name = getattr(cuda.get_current_device(), "name", "CUDA simulator")
        json.dump({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                   "device": name.decode() if isinstance(name, bytes) else str(name), "rows": rows}, f, indent=1)
    if not table:
        return
    keys = list(dict.fromkeys(k for r in rows for k in r))  # rows may differ (a tiered row has no registers)
    print("\n" + " | ".join(keys))
    for r in rows:
        print(" | ".join(f"{r[k]:.4g}" if isinstance(r.get(k), float) else str(r.get(k, "")) for k in keys))
