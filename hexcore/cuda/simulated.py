"""A hook on numba's CUDA simulator: kernel launches from the host, seen or replaced.

On the simulator a launch is a call of ``FakeCUDAKernel``, the same object a running
kernel calls for a device function. ``launches(hook)`` gives every launch from the host to
``hook(kernel, args, launch)`` while open: ``kernel`` the simulator's kernel object,
``args`` its arguments, ``launch()`` runs it as it would have run. A hook that does not
call ``launch()`` skips the launch (host-cost benchmarks, dry tests); one that does sees it
(counting first launches, host arrays among the arguments). Device functions, and
launches from inside a running kernel, are not hooked. Hooks nest: an inner one's
``launch()`` goes through the outer one.

    with launches(lambda kernel, args, launch: None):   # launches do nothing
        engine.step(seqs).run()
"""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def launches(hook):
    """Route the simulator's host launches through ``hook(kernel, args, launch)`` while open."""
    from numba.cuda.simulator import kernel as simulator

    original = simulator.FakeCUDAKernel.__call__

    def call(self, *args):
        if self._device or simulator._kernel_context:  # a device function, or inside a kernel
            return original(self, *args)
        return hook(self, args, lambda: original(self, *args))

    simulator.FakeCUDAKernel.__call__ = call
    try:
        yield
    finally:
        simulator.FakeCUDAKernel.__call__ = original
