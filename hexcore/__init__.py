"""hexcore: a paged, quantized KV cache for LLM inference, in pure Python on numba.

The CPU side (``hexcore.host``) and the layout math load with ``import hexcore``;
the GPU side (``hexcore.cuda``) loads numba.cuda and is imported explicitly, as is
``hexcore.engine.Engine`` (also ``hexcore.Engine``), the facade over both, and
``hexcore.FaultTolerantKVCache`` (``hexcore.fault``: checksums, canaries, quarantine).
"""

from __future__ import annotations

from .config import PRESETS, KVCacheConfig, KVDtype, ModelPreset
from .errors import (
    HexcoreConfigError,
    HexcoreCorruptionError,
    HexcoreCudaError,
    HexcoreError,
    HexcoreInvalidArgumentError,
    HexcoreInvalidBlockError,
    HexcoreInvalidSequenceError,
    HexcoreOOMError,
    Status,
    raise_for_status,
)

__version__ = "0.1.0"

_HOST_NAMES = ("PagedKVCache", "MetricsCollector", "LockFreeRingBuffer", "SpeculativeAllocator", "BlockTableMirror",
               "StepResult")

__all__ = [
    "PRESETS",
    "HexcoreConfigError",
    "HexcoreCorruptionError",
    "HexcoreCudaError",
    "HexcoreError",
    "HexcoreInvalidArgumentError",
    "HexcoreInvalidBlockError",
    "HexcoreInvalidSequenceError",
    "HexcoreOOMError",
    "KVCacheConfig",
    "KVDtype",
    "BlockTableMirror",
    "Engine",
    "CorruptionReport",
    "FaultTolerantKVCache",
    "StepResult",
    "LockFreeRingBuffer",
    "MetricsCollector",
    "ModelPreset",
    "PagedKVCache",
    "SpeculativeAllocator",
    "Status",
    "__version__",
    "raise_for_status",
]


def __getattr__(name: str):
    if name in _HOST_NAMES:
        from . import host

        return getattr(host, name)
    if name == "Engine":  # loads numba.cuda: imported on first use
        from .engine import Engine

        return Engine
    if name in ("FaultTolerantKVCache", "CorruptionReport"):  # loads numba.cuda too
        from . import fault

        return getattr(fault, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
