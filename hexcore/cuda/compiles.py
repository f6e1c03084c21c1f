"""Which kernels are used for the first time: a record of numba's compilations.

numba compiles a ``@cuda.jit`` kernel the first time it is launched with a new tuple of
argument types (its dispatcher's ``overloads`` are keyed by them: dtype, dimensions and
layout of each array, the type of each scalar). hexcore's kernel factories
(``functools.cache`` over compile-time constants: the cache config, a ``DecodeShape``,
flags such as ``from_rows`` or ``fitted``) give one dispatcher per key, so a kernel is
compiled once per (factory key, argument types) per process, whatever the pool's size.

``recording()`` notes every such first use while it is open::

    with recording() as log:
        warm_up()                 # compiles what the run will need
        mark = log.mark()
        run()                     # should compile nothing
    late = log.since(mark)        # [Compile(name, signature, seconds)]: compiled during run()

On a GPU it wraps ``CUDADispatcher.compile`` (every launch path, eager or prepared, goes
through it) and records the calls that add an overload, with their seconds. On numba's
CUDA simulator nothing compiles: it records each kernel launch whose (kernel, argument
types) it has not seen since ``recording()`` opened, the types being ``numba.typeof`` of
the arrays the simulator holds: what a GPU would compile for (0 seconds). Either way it
also records host functions (``@njit``) that numba compiles (its ``numba:compile``
events; a function loaded from numba's disk cache is not compiled). Not re-entrant: one
recording at a time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from typing import NamedTuple

from ..errors import HexcoreInvalidArgumentError
from .device import SIMULATOR

_active = threading.Lock()  # one recording at a time (the wrapper is installed on a class)


class Compile(NamedTuple):
    """One first use: the kernel's Python name, its argument types (numba types as text)
    and the seconds it took to compile (0 on the simulator)."""

    name: str
    signature: tuple
    seconds: float


@dataclasses.dataclass
class CompileLog:
    """The first uses recorded so far, in order (``entries``)."""

    entries: list = dataclasses.field(default_factory=list)

    def mark(self) -> int:
        """A position in the log: :meth:`since` gives what was recorded after it."""
        return len(self.entries)

    def since(self, mark: int) -> list:
        """The :class:`Compile` entries recorded after ``mark`` (an int from :meth:`mark`)."""
        if type(mark) is not int or not 0 <= mark <= len(self.entries):
            raise HexcoreInvalidArgumentError(f"mark: expected an int from mark() in [0, {len(self.entries)}], "
                                              f"got {mark!r}")
        return self.entries[mark:]

    def seconds(self, mark: int = 0) -> float:
        """Seconds of compilation recorded after ``mark``."""
        return sum(entry.seconds for entry in self.since(mark))


@contextlib.contextmanager
def recording():
    """Record the kernels used for the first time while open; yields a :class:`CompileLog`."""
    if not _active.acquire(blocking=False):
        raise HexcoreInvalidArgumentError("recording: another recording is open (one at a time)")
    log = CompileLog()
    try:
        with (_simulator_launches(log) if SIMULATOR else _gpu_compiles(log)), _host_compiles(log):
            yield log
    finally:
        _active.release()


@contextlib.contextmanager
def _host_compiles(log: CompileLog):
    """numba's ``numba:compile`` events: host functions (``@njit``) compiled, not loaded
    from their disk cache; one compiled inside another counts 0 seconds (its time is in
    the outer one's)."""
    from numba.core import event

    class Listener(event.Listener):
        def __init__(self):
            self.started: list = []

        def on_start(self, ev):
            self.started.append(time.perf_counter())

        def on_end(self, ev):
            seconds = time.perf_counter() - self.started.pop()
            data = ev.data or {}
            dispatcher = data.get("dispatcher")
            name = getattr(getattr(dispatcher, "py_func", None), "__qualname__", "?")
            log.entries.append(Compile(name, tuple(str(t) for t in data.get("args", ())),
                                       0.0 if self.started else seconds))

    with event.install_listener("numba:compile", Listener()):
        yield


@contextlib.contextmanager
def _gpu_compiles(log: CompileLog):
    from numba.cuda.dispatcher import CUDADispatcher

    original = CUDADispatcher.compile

    def compile(self, sig):
        before, start = len(self.overloads), time.perf_counter()
        kernel = original(self, sig)
        if len(self.overloads) > before:
            log.entries.append(Compile(self.py_func.__qualname__, tuple(str(t) for t in _argtypes(sig)),
                                       time.perf_counter() - start))
        return kernel

    CUDADispatcher.compile = compile
    try:
        yield
    finally:
        CUDADispatcher.compile = original


def _argtypes(sig) -> tuple:
    return tuple(sig.args) if hasattr(sig, "args") else tuple(sig)


def _simulator_launches(log: CompileLog):
    from .simulated import launches

    seen = set()

    def first_use(kernel, args, launch):
        key = (id(kernel.fn), simulator_signature(args))
        if key not in seen:
            seen.add(key)
            log.entries.append(Compile(kernel.fn.__qualname__, key[1], 0.0))
        return launch()

    return launches(first_use)


def simulator_signature(args: tuple) -> tuple:
    """The argument types (as text) a GPU would compile a kernel launched with ``args`` for:
    ``numba.typeof`` of each argument, a simulator device array typed as the host array it
    holds (dtype, dimensions, layout)."""
    import numba

    return tuple(str(numba.typeof(getattr(a, "_ary", a))) for a in args)
