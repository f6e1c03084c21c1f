"""CPU side of hexcore: numba.njit code over numpy arrays; never imports hexcore.cuda.

Public names load lazily (importing hexcore compiles or loads no njit module):
PagedKVCache and StepResult (allocator), MetricsCollector (metrics),
LockFreeRingBuffer (ring), SpeculativeAllocator (speculative), BlockTableMirror (events),
Admission and prefix_keys (prefix: automatic prefix caching), BlockState (quarantine:
the states a block can be in, QUARANTINED among them), TieredKVCache and pool_blocks_for
(tiered: a pool per kind of block, for formats by age, and the pool sizes a workload needs).
"""

from __future__ import annotations

import importlib

_MODULE_OF = {
    "Admission": "prefix",
    "BlockState": "quarantine",
    "BlockTableMirror": "events",
    "LockFreeRingBuffer": "ring",
    "MetricsCollector": "metrics",
    "PagedKVCache": "allocator",
    "SpeculativeAllocator": "speculative",
    "StepResult": "allocator",
    "TieredKVCache": "tiered",
    "pool_blocks_for": "tiered",
    "prefix_keys": "prefix",
}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    # Lazy, so importing hexcore does not compile or load every njit module.
    if name in _MODULE_OF:
        return getattr(importlib.import_module(f"{__name__}.{_MODULE_OF[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
