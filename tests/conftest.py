"""Test set-up: the CUDA simulator when no GPU is present; `gpu` tests need a real one."""

from __future__ import annotations

import pytest

from hexcore._runtime import use_simulator_if_no_gpu

SIMULATOR = use_simulator_if_no_gpu()  # before anything imports numba.cuda


def real_gpu_available() -> bool:
    """True when numba.cuda runs on real hardware, not the simulator."""
    if SIMULATOR:
        return False
    from numba import cuda

    return cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if real_gpu_available():
        return
    skip = pytest.mark.skip(reason="needs a real NVIDIA GPU (scripts/gpu-check)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
