"""Hooks on numba's CUDA simulator: kernel launches from the host, seen or replaced; and a
faster simulator (barriers that wake their threads instead of being polled, OS threads reused
block after block, one module swap per launch instead of one per device call:
``use_fast_simulator``).

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
import os
import threading


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


def use_fast_simulator() -> bool:
    """Make numba's CUDA simulator faster without changing what it computes.

    Three of the simulator's costs are bookkeeping, not simulation. Measured on a 2-core
    machine: one INT2 decode test 26.7 s stock, 10.4 s with the first change, 4.1 s with all
    three (and ``mma.py``'s twin assembling its fragments in a few array
    operations); ``scripts/test`` 1142 s -> 251 s.

    - **Barriers.** The simulator runs a block as one Python thread per CUDA thread, and its
      host thread learns that all of them reached a ``syncthreads`` (or ended) by polling
      every thread in a loop, which under the GIL competes with the threads it waits for.
      Here the last thread to arrive opens the barrier and the host thread sleeps on a
      condition until the block ends or a thread raises. The rules are the simulator's: a
      barrier opens when every thread still running has reached it; the first exception
      aborts the block's other threads and is raised from the launch.
    - **Threads.** The simulator starts a new OS thread for every CUDA thread of every
      block (about 170 us each here, as much as a simple kernel's body). Here a block's
      threads are parked threads handed the block's indices, and park again when it ends.
    - **Device-function calls.** Every call swaps ``numba.cuda`` for the launch's fake
      module in the callee's module globals and back (a context manager, two locks, often a
      scan of the globals). Here the first call into a module during a launch swaps it, and
      it stays swapped (the same fake module) until the launch returns.
    - **Shared arrays** (a correctness fix as well). The simulator finds a block's
      ``cuda.shared.array`` by its call site, allocating it when missing, and the look-up and
      the allocation are not atomic: two threads that reach the line at once can each
      allocate one, and the first then writes and reads an array no other thread sees
      (measured: 2 of 20 trials of 32 threads with a 1 us switch interval; under load the
      tiered, prefill and INT4 graph tests gave wrong bits now and then). Here the
      allocation holds a lock (the look-up is made again under it), and the call site is
      read from the caller's frame, not a formatted stack (``traceback.extract_stack`` reads
      source lines).

    Installed for the process (the simulator's classes are patched), idempotent; returns
    False and changes nothing when numba's simulator is off or its classes are not the ones
    this was written for (numba-cuda 0.30), so the stock ones stay in use.
    """
    global _shared_array
    from numba import config

    if not config.ENABLE_CUDASIM:
        return False
    from numba.cuda import types
    from numba.cuda.np import numpy_support
    from numba.cuda.simulator import kernel as simulator
    from numba.cuda.simulator import kernelapi

    thread, manager, kernel = simulator.BlockThread, simulator.BlockManager, simulator.FakeCUDAKernel
    if getattr(manager, "_hexcore_fast", False):
        return True
    needed = ((thread, "syncthreads"), (thread, "run"), (manager, "run"), (kernel, "__call__"),
              (simulator, "_kernel_context"), (kernelapi, "swapped_cuda_module"), (kernelapi, "FakeCUDAShared"))
    if not all(hasattr(owner, name) for owner, name in needed):
        return False
    stock_call = kernel.__call__
    thread.syncthreads = _barrier
    manager.run = _run_block
    _shared_array = kernelapi.FakeCUDAShared.array = _make_shared_array(kernelapi.FakeCUDAShared.array, types,
                                                                        numpy_support)
    kernel.__call__ = lambda self, *args: _call_pinning_modules(self, args, stock_call, simulator)
    manager._hexcore_fast = True
    return True


_pinned: dict = {}  # id(module globals) -> its entered swap, for the running launch
_pin_lock = threading.Lock()


def _call_pinning_modules(kernel, args, stock_call, simulator):
    """``FakeCUDAKernel.__call__``: a device call inside a launch swaps its module once per
    launch; a host launch releases every module its device calls swapped."""
    fake = simulator._kernel_context
    if fake is None:
        if kernel._device:  # a device function called from the host: the stock path
            return stock_call(kernel, *args)
        try:
            return stock_call(kernel, *args)
        finally:
            _release_pins()
    key = id(kernel.fn.__globals__)
    if key not in _pinned:
        with _pin_lock:
            if key not in _pinned:
                from numba.cuda.simulator.kernelapi import swapped_cuda_module

                swap = swapped_cuda_module(kernel.fn, fake)
                swap.__enter__()
                _pinned[key] = swap
    return kernel.fn(*args)


def _release_pins():
    with _pin_lock:
        swaps = list(_pinned.values())
        _pinned.clear()
    for swap in swaps:
        swap.__exit__(None, None, None)


class _BlockState:
    """One running block: threads still running, threads waiting at the open barrier, which
    barrier (its generation), and the first exception a thread raised (with its traceback)."""

    def __init__(self, threads: int):
        self.cv = threading.Condition()
        self.live = threads
        self.waiting = 0
        self.generation = 0
        self.failed = None

    def open_if_all_wait(self):
        """Open the barrier when every running thread waits at it (holding ``cv``)."""
        if self.waiting and self.waiting == self.live:
            self.waiting = 0
            self.generation += 1
            self.cv.notify_all()

    def leave(self, exception):
        """A thread ended (``exception``: what it raised, or None)."""
        with self.cv:
            self.live -= 1
            if exception is not None and self.failed is None:
                self.failed = exception
            self.open_if_all_wait()
            self.cv.notify_all()


def _barrier(thread):
    """``syncthreads`` for one simulated thread: wait until every running thread arrives."""
    state = thread._hexcore_block
    with state.cv:
        if thread.abort:
            raise RuntimeError("abort flag set on syncthreads call")
        generation = state.generation
        state.waiting += 1
        state.open_if_all_wait()
        while state.generation == generation and not thread.abort:
            state.cv.wait()
        if thread.abort:
            raise RuntimeError("abort flag set on syncthreads clear")


_shared_array = None  # FakeCUDAShared.array once use_fast_simulator has installed it


def _make_shared_array(stock, types, numpy_support):
    """``FakeCUDAShared.array`` in place of ``stock``: the block's shared array of a call site
    (the caller's file and line, as the simulator keys it), looked up without a lock and
    allocated under one, by the first thread to get there; dynamic shared memory (``shape``
    0) and an alignment (refused) are the stock method's."""
    import sys

    import numpy as np

    lock = threading.Lock()

    def array(self, shape, dtype, alignment=None):
        dtype = np.dtype(numpy_support.as_dtype(dtype) if isinstance(dtype, types.Type) else dtype)
        if shape == 0 or alignment is not None:
            return stock(self, shape, dtype, alignment)
        frame = sys._getframe(1)
        caller = (frame.f_code.co_filename, frame.f_lineno)
        found = self._allocations.get(caller)
        if found is None:
            with lock:
                found = self._allocations.get(caller)
                if found is None:
                    found = self._allocations[caller] = np.empty(shape, dtype)
        return found

    return array


_idle: list = []  # parked simulated threads, reused by the next block
_idle_lock = threading.Lock()
_worker_class = None


def _forget_parked_threads():
    """In a forked child: the parent's parked threads do not exist there."""
    global _idle_lock
    _idle.clear()
    _idle_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_parked_threads)


def _workers(simulator, count: int) -> list:
    """``count`` parked threads (started the first time they are needed, then reused: an OS
    thread costs about as much to start as a simple kernel's whole body)."""
    global _worker_class
    if _worker_class is None:
        _worker_class = _make_worker_class(simulator)
    with _idle_lock:
        taken = _idle[len(_idle) - count:] if count <= len(_idle) else list(_idle)
        del _idle[len(_idle) - len(taken):]
    while len(taken) < count:
        worker = _worker_class()
        worker.start()
        taken.append(worker)
    return taken


def _make_worker_class(simulator):
    import numpy as np

    stock_run = simulator.BlockThread.run  # runs the target, records an exception as the simulator does

    class Worker(simulator.BlockThread):
        """A simulated thread that runs one block's thread after another: ``assign`` gives it
        the next (its indices, the block's state), then it parks again."""

        def __init__(self):
            super().__init__(None, _NoManager, (0, 0, 0), (0, 0, 0), False)
            self._go = threading.Lock()
            self._go.acquire()

        def assign(self, manager, state, body, block_point, thread_point):
            block = manager._block_dim
            self._manager, self._hexcore_block = manager, state
            self.blockIdx, self.threadIdx = simulator.Dim3(*block_point), simulator.Dim3(*thread_point)
            self.thread_id = thread_point[0] + block[0] * (thread_point[1] + block[1] * thread_point[2])
            self.abort, self.exception = False, None
            self._target, self._args, self._kwargs = body, (), {}
            self._go.release()

        def run(self):
            while True:
                self._go.acquire()
                state = self._hexcore_block
                try:
                    if self._manager._debug:
                        np.seterr(divide="raise")
                    stock_run(self)
                finally:
                    exception = self.exception
                    with _idle_lock:
                        _idle.append(self)  # parked before the block can end: reused by the next
                    state.leave(exception)

    return Worker


class _NoManager:
    _block_dim = (1, 1, 1)


def _run_block(manager, grid_point, *args):
    """``BlockManager.run``: hand the block's threads to parked workers, sleep until they end
    or one raises."""
    import numpy as np
    from numba.cuda.simulator import kernel as simulator

    points = list(np.ndindex(*manager._block_dim))
    state = _BlockState(len(points))
    workers = _workers(simulator, len(points))

    def body():
        manager._f(*args)

    for worker, point in zip(workers, points):
        worker.assign(manager, state, body, grid_point, point)
    with state.cv:
        while state.live and state.failed is None:
            state.cv.wait()
        failed = state.failed
        if failed is not None:
            for worker in workers:
                worker.abort = True
            state.cv.notify_all()
    if failed is not None:
        raise failed[0].with_traceback(failed[1])
