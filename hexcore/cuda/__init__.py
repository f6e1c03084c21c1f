"""GPU side of hexcore: numba.cuda.jit kernels and the device-memory store.

Importing this package loads numba.cuda; to run on the simulator, set
``NUMBA_ENABLE_CUDASIM=1`` first (``hexcore._runtime.use_simulator_if_no_gpu``).
"""

from __future__ import annotations

from .blocks import (
    copy_blocks,
    copy_tails,
    dequantize_blocks,
    prepare_copy_blocks,
    prepare_copy_tails,
)
from .decode import DecodePlan, paged_decode
from .graph import DecodeGraph, StepViews
from .launch import PreparedLaunch
from .layout_check import device_layout_offsets, host_layout_offsets, layout_agrees
from .step import DecodeStep, StepBuffers
from .store import DeviceKVStore
from .write import append, prepare_append, prepare_seal, seal

__all__ = [
    "DecodeGraph",
    "DecodePlan",
    "DecodeStep",
    "DeviceKVStore",
    "PreparedLaunch",
    "StepBuffers",
    "StepViews",
    "append",
    "copy_blocks",
    "copy_tails",
    "dequantize_blocks",
    "device_layout_offsets",
    "host_layout_offsets",
    "layout_agrees",
    "paged_decode",
    "prepare_append",
    "prepare_copy_blocks",
    "prepare_copy_tails",
    "prepare_seal",
    "seal",
]
