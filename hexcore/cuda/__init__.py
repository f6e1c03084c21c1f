"""GPU side of hexcore: numba.cuda.jit kernels and the device-memory store.

Importing this package loads numba.cuda; to run on the simulator, set
``NUMBA_ENABLE_CUDASIM=1`` first (``hexcore._runtime.use_simulator_if_no_gpu``).
"""

from __future__ import annotations

from .decode import DecodePlan, paged_decode
from .launch import PreparedLaunch
from .blocks import copy_blocks, copy_tails, dequantize_blocks
from .layout_check import device_layout_offsets, host_layout_offsets, layout_agrees
from .store import DeviceKVStore
from .write import append, seal

__all__ = [
    "DeviceKVStore", "paged_decode", "DecodePlan", "PreparedLaunch", "append", "seal", "copy_blocks", "copy_tails", "dequantize_blocks",
    "device_layout_offsets", "host_layout_offsets", "layout_agrees",
]
