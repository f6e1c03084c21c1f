"""Test set-up: the CUDA simulator when no GPU is present; `gpu` tests need a real one.

Random tests take their seed from the ``seed`` fixture (or ``rng``, a generator made
from it): a fresh seed per test, shown in the report when the test fails; replay one
with ``pytest --seed N``.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from hexcore._runtime import use_simulator_if_no_gpu

SIMULATOR = use_simulator_if_no_gpu()  # before anything imports numba.cuda
if SIMULATOR:
    from hexcore.cuda.simulated import use_fast_simulator

    use_fast_simulator()  # woken barriers, reused threads, one module swap per launch: 4.5x faster


def real_gpu_available() -> bool:
    """True when numba.cuda runs on real hardware, not the simulator."""
    if SIMULATOR:
        return False
    from numba import cuda

    return cuda.is_available()


def pytest_runtest_logreport(report):
    """With ``HEXCORE_TEST_LOG`` set, each test's outcome is appended to that file as soon as
    it is known (``passed``/``failed``/``skipped`` and the test's id; ``error`` for a failed
    set-up or tear-down), so a run cut short by a time limit still names its failures
    (``scripts/gpu-check`` sets it). Written by the controlling process only, not by
    pytest-xdist's workers (which report to it)."""
    path = os.environ.get("HEXCORE_TEST_LOG")
    if not path or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    if report.when == "call" or report.failed or (report.when == "setup" and report.skipped):
        outcome = "error" if report.failed and report.when != "call" else report.outcome
        with open(path, "a") as log:
            log.write(f"{outcome} {report.nodeid}\n")


def pytest_addoption(parser):
    parser.addoption("--seed", type=int, default=None, help="seed for every random test (replays a failure)")


def pytest_collection_modifyitems(config, items):
    if real_gpu_available():
        return
    skip = pytest.mark.skip(reason="needs a real NVIDIA GPU (scripts/gpu-check)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def seed(request) -> int:
    """This test's random seed: ``--seed`` if given, else fresh; reported on failure."""
    value = request.config.getoption("--seed")
    if value is None:
        value = int(np.random.SeedSequence().entropy % (1 << 63))
    request.node.hexcore_seed = value
    return value


@pytest.fixture
def rng(seed) -> np.random.Generator:
    """A numpy Generator seeded by ``seed``."""
    return np.random.default_rng(seed)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    seed = getattr(item, "hexcore_seed", None)
    if seed is not None and report.failed:
        report.sections.append(("random seed", f"seed {seed} (replay: pytest --seed {seed} '{item.nodeid}')"))
