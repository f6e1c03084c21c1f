"""Choosing between a real GPU and numba's CUDA simulator, before numba.cuda loads."""

from __future__ import annotations

import os
import shutil

SIMULATOR_ENV = "NUMBA_ENABLE_CUDASIM"


def gpu_present() -> bool:
    """True when this machine shows an NVIDIA driver (checked without importing numba)."""
    return os.path.exists("/dev/nvidiactl") or shutil.which("nvidia-smi") is not None


def use_simulator_if_no_gpu() -> bool:
    """Turn numba's CUDA simulator on when no GPU is present and the user chose nothing.

    Must run before ``numba.cuda`` is first imported. Returns True when the simulator
    is (or already was) on.
    """
    if SIMULATOR_ENV not in os.environ and not gpu_present():
        os.environ[SIMULATOR_ENV] = "1"
    return os.environ.get(SIMULATOR_ENV, "0") == "1"
