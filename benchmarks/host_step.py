"""Host time of an Engine decode step: hexcore's own Python per step, with the kernel launches
stubbed out on numba's CUDA simulator (no kernel body runs), or on a GPU with real launches.

    NUMBA_ENABLE_CUDASIM=1 python -m benchmarks.host_step [--dtype int2-aged] [--layers 4] [--batch 63]
        [--context 600] [--steps 20] [--profile 25] [--count] [--fresh-views]
    python -m benchmarks.host_step ...        (on a GPU: the same steps, launches real)

``--dtype`` is a kv_dtype (``fp16``, ``int4``, ``int2``: the Engine's graph step) or a format
by age (``int4-aged``, ``int2-aged``: the tiered step). llama-3-8b attention shapes (8 KV
heads, 32 query heads, head_dim 128, block 32), ``--batch`` sequences of about
``--context`` tokens (staggered so their tails differ); each step is ``engine.step`` and
``run()``. Printed: host ms per step, with ``--profile N`` cProfile's N hexcore functions
by cumulative time, and with ``--count`` what a step asks of numba-cuda (:func:`per_step_counts`:
host-to-device copies, device allocations, launches prepared, eager launches, prepared runs,
set_array calls, device array objects made, and on a GPU arguments marshalled by numba),
the same on the simulator as on a GPU (but the last, a GPU's only). ``--fresh-views`` makes
every device view afresh (``hexcore.cuda.views.KEEP`` off), as the step did before it kept
them: one run on a GPU gives both (``scripts/host-step-views``).

What it measures: the block manager's step and every check, table, plan and launch
description hexcore makes for a step. What it leaves out: numba-cuda's own cost per launch
on a GPU (typing and marshalling, 25-55 us for an eager launch, a few us for a prepared
one), device copies and waits. So it compares host paths (a format's step against a plain
one, a change against the code before it) on any machine. On a GPU (no simulator) the
launches run: the steps are timed back to back with one synchronisation after the last, so
the figure is the host's time per step wherever the host is slower than the GPU (the format
steps), and cProfile's functions then include numba-cuda's launch costs.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import os
import pstats
import time

import numpy as np


@contextlib.contextmanager
def stubbed_launches():
    """Kernel launches on the CUDA simulator return at once (device functions called from
    a running kernel still run); restored on exit."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
        raise RuntimeError("host_step needs the CUDA simulator: NUMBA_ENABLE_CUDASIM=1")
    from hexcore.cuda.simulated import launches

    with launches(lambda kernel, args, launch: None):
        yield


def make_engine(dtype: str, layers: int, batch: int, context: int):
    """(engine, sequence ids): ``batch`` sequences of ``context - i`` tokens (zeros)."""
    from hexcore import Engine, KVCacheConfig
    from hexcore.host import pool_blocks_for

    aged = dtype.endswith("-aged")
    cfg = KVCacheConfig(num_layers=layers, num_kv_heads=8, head_dim=128, block_size=32,
                        kv_dtype="int4" if aged else dtype)
    blocks = batch * (context + 400) // cfg.block_size
    if aged:
        engine = Engine(cfg, blocks, batch, 32, format=dtype, pool_blocks=pool_blocks_for(dtype, 32, blocks, batch))
    else:
        engine = Engine(cfg, blocks, batch, 32)
    k = np.zeros((layers, context, 8, 128), np.float16)
    seqs = []
    for i in range(batch):
        seqs.append(engine.add())
        engine.prefill(seqs[-1], k[:, :context - i % context], k[:, :context - i % context])
    return engine, seqs


def host_ms_per_step(engine, seqs, steps: int, warmup: int = 3, profile: int = 0) -> float:
    """Wall ms per ``engine.step(seqs).run()`` over ``steps`` after ``warmup``, synchronised
    once after the last; with ``profile``, then the same steps under cProfile, its top
    hexcore functions printed."""
    from numba import cuda

    def one():
        engine.step(seqs).run()

    for _ in range(warmup):
        one()
    cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        one()
    cuda.synchronize()
    ms = 1e3 * (time.perf_counter() - start) / steps
    if profile:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(steps):
            one()
        prof.disable()
        pstats.Stats(prof).sort_stats("cumulative").print_stats("hexcore", profile)
    return ms


COUNTED = {  # what per_step_counts counts: (module path, attribute) -> its name in the report
    ("numba.cuda", "to_device"): "to_device",
    ("numba.cuda", "device_array"): "device_array",
    ("hexcore.cuda.launch", "PreparedLaunch.__init__"): "prepare",
    ("hexcore.cuda.launch", "Launch.run"): "eager launch",
    ("hexcore.cuda.launch", "PreparedLaunch.run"): "prepared run",
    ("hexcore.cuda.launch", "PreparedLaunch.set_array"): "set_array",
    # every device array object made (a slice, reshape, view or allocation: on a GPU each is
    # tens of us of numba's Python, and a fresh one is typed and marshalled anew by a launch):
    # a GPU's class, or the simulator's (the same module path there); the one that exists counts
    ("numba.cuda.cudadrv.devicearray", "DeviceNDArrayBase.__init__"): "device array objects",
    ("numba.cuda.cudadrv.devicearray", "FakeCUDAArray.__init__"): "device array objects",
    # a GPU only: numba's marshalling of one kernel argument (eager launches, set_array)
    ("numba.cuda.dispatcher", "_Kernel._prepare_args"): "arguments marshalled",
}


def per_step_counts(engine, seqs, steps: int) -> dict:
    """Calls per ``engine.step(seqs).run()`` (averaged over ``steps``, after the caller's
    warm-up) of each function in :data:`COUNTED` that exists here (a name none of whose
    functions exists is left out), wrapped for the steps and restored after."""
    calls: dict = {}
    saved = []
    for (module, path), name in COUNTED.items():
        owner, attr = _owner(module, path)
        if owner is None:
            continue
        calls.setdefault(name, 0)
        original = owner.__dict__[attr]  # (a method of the class itself: restored as it was)
        saved.append((owner, attr, original))

        def counting(*args, _original=original, _name=name, **kwargs):
            calls[_name] += 1
            return _original(*args, **kwargs)

        setattr(owner, attr, counting)
    try:
        for _ in range(steps):
            engine.step(seqs).run()
    finally:
        for owner, attr, original in saved:
            setattr(owner, attr, original)
    return {name: n / steps for name, n in calls.items()}


def _owner(module: str, path: str) -> tuple:
    """(the class or module defining ``path``'s last attribute, its name), or (None, None)
    where the module, class or attribute does not exist (the simulator's or a GPU's only)."""
    import importlib

    try:
        owner = importlib.import_module(module)
    except ImportError:
        return None, None
    *outer, attr = path.split(".")
    for part in outer:
        owner = getattr(owner, part, None)
    if owner is None or attr not in getattr(owner, "__dict__", {}):
        return None, None
    return owner, attr


def main(argv=None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="int2-aged")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=63)
    parser.add_argument("--context", type=int, default=600)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="also print cProfile's top N")
    parser.add_argument("--count", action="store_true", help="also print numba-cuda calls per step")
    parser.add_argument("--fresh-views", action="store_true",
                        help="make every device view afresh (hexcore.cuda.views.KEEP off), as before views were kept")
    args = parser.parse_args(argv)
    from hexcore.cuda import views

    keep, views.KEEP = views.KEEP, not args.fresh_views
    try:
        return _main(args)
    finally:
        views.KEEP = keep


def _main(args) -> float:
    simulator = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
    with stubbed_launches() if simulator else contextlib.nullcontext():
        engine, seqs = make_engine(args.dtype, args.layers, args.batch, args.context)
        ms = host_ms_per_step(engine, seqs, args.steps, profile=args.profile)
        counts = per_step_counts(engine, seqs, args.steps) if args.count else None
    how = "kernel launches stubbed" if simulator else "launches on the GPU, one synchronisation after the last step"
    fresh = ", views made afresh" if args.fresh_views else ""
    print(f"{args.dtype}: {ms:.3f} host ms per step ({args.layers} layers, B={args.batch}, about {args.context} "
          f"tokens; {how}{fresh})")
    if counts is not None:
        print("per step: " + ", ".join(f"{name} {n:g}" for name, n in counts.items()))
    return ms


if __name__ == "__main__":
    main()
