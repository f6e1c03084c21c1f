"""The demo's warm-up: every kernel the timed run launches is first launched before it,
and the warm-up's time stays out of the run's figures.

On the simulator nothing compiles, so these tests look at what would: the (kernel,
argument types) pairs launched (``hexcore.cuda.compiles``), a GPU compiling one kernel per
pair. Kernels are not run ("dry" launches: recorded, then skipped), so a run at the GPU's
head shapes costs only its host work; no output is checked here (tests/test_serve.py
checks them), and the fault drill, which reads back what its kernels wrote, is off (on a
GPU the demo's own count of kernels compiled during the run covers it).
"""

from __future__ import annotations

import dataclasses
import time

import pytest

from hexcore import demo
from hexcore.demo import demo_shape, format_summary, run_demo, warmup_workload
from tests.conftest import SIMULATOR

pytestmark = [pytest.mark.skipif(not SIMULATOR, reason="dry launches stand in for the simulator's kernels"),
              pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")]  # outputs never written


@pytest.fixture
def dry_launches(monkeypatch):
    """Kernel launches on the simulator do nothing (device functions still run). The fault
    drill is off: it reads back what its kernels write (guard words, checksums)."""
    from hexcore.cuda.simulated import launches

    monkeypatch.setattr(demo, "_fault_tolerance_available", lambda: False)
    with launches(lambda kernel, args, launch: None):
        yield


def gpu_like_shape(fmt):
    """The GPU demo's head shapes, block size and request lengths over one layer, a pool of
    600 blocks and 8 slots (a smaller pool than the GPU's: the warm-up must not depend on it)."""
    shape = demo_shape(False, layers=1, format=fmt)
    return dataclasses.replace(shape, num_blocks=600, max_seqs=8, check_every=4)


@pytest.mark.parametrize("where,fmt", [("simulator", None), ("simulator", "int2-aged"), ("gpu-like", "int2-aged")])
def test_the_warm_up_launches_every_kernel_the_run_launches(dry_launches, where, fmt):
    """A whole demo run (8 requests) after the warm-up launches no kernel for the first time
    and compiles no host function; at the GPU's sizes it re-seals (prompts past the oldest
    tier) and batches up to its 8 slots."""
    shape = demo_shape(True, format=fmt) if where == "simulator" else gpu_like_shape(fmt)
    requests = 8
    summary = run_demo(shape, requests, seed=3, progress=False, warmup=True)
    assert summary["warmup"] and summary["warmup_kernels_compiled"] >= 4  # append, seal, decode, merge...
    assert summary["kernels_compiled_in_run"] == 0, summary["compiled_in_run"]
    assert summary["requests_finished"] == requests
    if fmt is not None and where == "gpu-like":
        assert summary["reseals"] > 0  # the run re-sealed, and the warm-up had launched those kernels
    assert "none compiled during the run" in format_summary(summary)


def test_without_the_warm_up_the_run_launches_kernels_first(dry_launches):
    """The check above can fail: the same run without the warm-up first-launches its kernels."""
    summary = run_demo(demo_shape(True, format="int2-aged"), 4, seed=3, progress=False, warmup=False)
    assert not summary["warmup"] and summary["warmup_seconds"] == 0
    assert summary["kernels_compiled_in_run"] >= 4
    compiled = set(summary["compiled_in_run"])
    # and a decode kernel (a format's last pool may merge, or all its pools run in one)
    assert "_append_kernel.<locals>.kernel" in compiled
    assert compiled & {"decode_kernel.<locals>.kernel", "pool_kernel.<locals>.kernel",
                       "one_launch_kernel.<locals>.kernel"}, compiled
    assert summary["simulated"] and "first launched or compiled during the run" in format_summary(summary)


def test_the_warm_up_time_is_apart_from_the_run(dry_launches, monkeypatch):
    """A warm-up that takes 1000 s (of a clock it moves on): counted in ``warmup_seconds``,
    not in the run's wall time, steps or tokens/s."""
    calls, real, clock = [], time.perf_counter, {"offset": 0.0}
    monkeypatch.setattr(time, "perf_counter", lambda: real() + clock["offset"])

    def slow_warm_up(shape, seed=0):
        calls.append(shape)
        clock["offset"] += 1000.0

    monkeypatch.setattr(demo, "warm_up", slow_warm_up)
    summary = run_demo(demo_shape(True, format="int2-aged"), 2, seed=1, max_steps=3, progress=False, warmup=True)
    assert len(calls) == 1 and summary["warmup_seconds"] >= 1000
    assert summary["wall_seconds"] < 1000 and summary["step_ms_p99"] < 1e6 and summary["steps"] >= 1
    assert summary["decode_tokens_per_s"] > summary["decode_tokens"] / 1000
    assert "s before the run, not in the figures above" in format_summary(summary)


def test_the_simulator_skips_the_warm_up_by_default(dry_launches, monkeypatch):
    monkeypatch.setattr(demo, "warm_up", lambda shape, seed=0: pytest.fail("warmed up on the simulator"))
    summary = run_demo(demo_shape(True), 1, seed=1, max_steps=1, progress=False)
    assert not summary["warmup"]


@pytest.mark.parametrize("fmt", [None, "int2-aged"])
def test_the_warm_up_workload_reaches_what_the_run_can(fmt):
    """Short prompts, whole blocks, a block and a half, seals in steps; past the oldest tier
    (a re-seal) only when the run's requests can get there (not at the simulator's sizes)."""
    bs = 32
    work = warmup_workload(demo_shape(False, format=fmt))
    assert list(work.prompt_lens[:3]) == [1, 2 * bs, bs + bs // 2] and work.output_lens.min() >= 2
    assert work.arrivals[0] == 0 and (work.arrivals[1:] == 1).all()  # a batch of one, then of several
    long = work.prompt_lens.max() > 384 + 3 * bs
    assert long == (fmt is not None)
    assert warmup_workload(demo_shape(True, format=fmt)).prompt_lens.max() < 384


def test_the_warm_up_takes_the_out_of_memory_retry(dry_launches, monkeypatch):
    """A run whose pool fills releases every speculative reservation before retrying
    (``SpeculativeAllocator.release_all``, a host function the H200's int4 run once compiled
    mid-run); the warm-up takes that path too."""
    from hexcore.host.speculative import SpeculativeAllocator

    calls = []
    release_all = SpeculativeAllocator.release_all
    monkeypatch.setattr(SpeculativeAllocator, "release_all", lambda self: calls.append(1) or release_all(self))
    demo.warm_up(gpu_like_shape(None))
    assert calls


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(preset="llama-4"), "HexcoreConfigError", "preset: expected one of"),
    (dict(preset=["llama-3-8b"]), "HexcoreConfigError", "preset"),
    (dict(block_size=0), "HexcoreConfigError", "block_size"),
    (dict(layers=None), "HexcoreConfigError", "num_layers"),
    (dict(format="int4-aged "), "HexcoreConfigError", "format: expected a KVFormat"),
    (dict(format=5), "HexcoreConfigError", "format"),
])
def test_demo_shape_arguments_are_typed(kwargs, error, match):
    """(an unknown preset once raised KeyError, a list TypeError; a bad format was taken and
    only refused by the run's Server)"""
    import hexcore

    with pytest.raises(getattr(hexcore, error), match=match):
        demo_shape(False, **kwargs)
    if "format" in kwargs:
        with pytest.raises(getattr(hexcore, error), match=match):
            demo_shape(True, **kwargs)


@pytest.mark.parametrize("kwargs,match", [(dict(num_requests=0), "num_requests"),
                                          (dict(num_requests=1.5), "num_requests"), (dict(seed=-1), "seed"),
                                          (dict(seed="x"), "seed"),
                                          (dict(max_steps=-1), "max_steps"), (dict(shape=None), "shape")])
def test_run_demo_arguments_are_typed(kwargs, match):
    """(once numpy's ValueError/TypeError for a seed or count, AttributeError for a shape)"""
    from hexcore import HexcoreInvalidArgumentError

    args = dict(dict(shape=demo_shape(True, format="int4-aged"), num_requests=1, max_steps=1, progress=False), **kwargs)
    with pytest.raises(HexcoreInvalidArgumentError, match=match):
        run_demo(**args)
