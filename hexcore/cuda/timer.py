"""The GPU's global nanosecond timer, ``%globaltimer``, with a simulator twin on a clock
the caller controls.

- ``global_timer_ns()`` (device): PTX ``mov.u64 %globaltimer`` as an int64: nanoseconds,
  the same clock on every SM of the GPU, so CTAs of one launch can compare their
  readings. Its update interval is the GPU's (``benchmarks.bench_persistent`` measures
  it); the read is volatile (never hoisted out of a loop or merged with another read).

On numba's simulator the twin reads the clock installed with :func:`use_clock`: by default
``time.monotonic_ns``; a :class:`SimulatedClock` makes time a function of how often the
timer was read, so a test decides exactly when a time budget runs out.
"""

from __future__ import annotations

import threading
import time

import numpy as np
from numba import cuda, types

from .device import SIMULATOR, device_function


class SimulatedClock:
    """A clock for the simulator: starts at ``start_ns`` and advances ``step_ns`` on every
    read (thread-safe); ``reads`` counts them."""

    def __init__(self, step_ns: int, start_ns: int = 1_000_000):
        self.step_ns, self.now_ns, self.reads = int(step_ns), int(start_ns), 0
        self._lock = threading.Lock()

    def __call__(self) -> int:
        with self._lock:
            self.reads += 1
            self.now_ns += self.step_ns
            return self.now_ns


_clock = [time.monotonic_ns]  # what the simulator's global_timer_ns reads


class use_clock:
    """``with use_clock(SimulatedClock(10_000)): ...``: the simulator's ``global_timer_ns``
    reads ``clock()`` (a callable returning int nanoseconds) inside the block. No effect
    on a GPU, whose kernels read the hardware timer."""

    def __init__(self, clock):
        self.clock = clock

    def __enter__(self):
        self._saved = _clock[0]
        _clock[0] = self.clock
        return self.clock

    def __exit__(self, *exc):
        _clock[0] = self._saved


if not SIMULATOR:
    from llvmlite import ir
    from numba.cuda.extending import intrinsic

    @intrinsic
    def _globaltimer(typingctx):
        sig = types.int64()

        def codegen(context, builder, sig, args):
            fnty = ir.FunctionType(ir.IntType(64), [])
            asm = ir.InlineAsm(fnty, "mov.u64 $0, %globaltimer;", "=l", side_effect=True)
            return builder.call(asm, [])

        return sig, codegen

    @device_function
    def global_timer_ns():
        """``%globaltimer``: the GPU's global clock, int64 nanoseconds."""
        return _globaltimer()

else:
    @cuda.jit(device=True)
    def global_timer_ns():
        """The installed clock (``use_clock``), int64 nanoseconds."""
        return np.int64(_clock[0]())
