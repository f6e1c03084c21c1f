"""GPU side of hexcore: numba.cuda.jit kernels and the device-memory store.

Importing this package loads numba.cuda; to run on the simulator, set
``NUMBA_ENABLE_CUDASIM=1`` first (``hexcore._runtime.use_simulator_if_no_gpu``).

- ``store``: DeviceKVStore, the cache in device memory; ``write``: append and seal;
  ``blocks``: copies, dequantization and re-seals (``reseal_blocks``, ``run_tiered_ops``);
  ``launch``: launch descriptions; ``streams``: which stream a launch uses; ``device``:
  intrinsics with simulator twins.
- ``attention/``: paged decode (``paged_decode``, ``DecodePlan``, ``DecodeOptions``) and
  prefill over a cached prefix (``prefill_attention``, ``gather_prefix``), the persistent
  checkpoint-and-yield decode (``persistent_decode``), decode over a format by age's pools
  (``tiered_decode``); ``timer``: the GPU's global timer.
- ``integrity``: block checksums and guard words (used by ``hexcore.fault``).
- ``steps/``: whole decode steps as CUDA graphs (``DecodeGraph``).
"""

from __future__ import annotations

from .attention import (BatchRows, DecodeOptions, DecodePlan, ItemTimes, PersistentDecode, PersistentStats, SplitCosts,
                        TieredDecodePlan, gather_prefix, paged_decode, persistent_decode, prefill_attention,
                        prefill_attention_batch, tiered_decode)
from .blocks import (copy_blocks, copy_tails, dequantize_blocks, prepare_copy_blocks, prepare_copy_tails,
                     reseal_blocks, run_tiered_ops)
from .launch import Launch, PreparedLaunch
from .layout_check import device_layout_offsets, host_layout_offsets, layout_agrees
from .steps import DecodeGraph, DecodeStep, StepBuffers, StepViews
from .store import DeviceKVStore
from .streams import resolve_stream
from .write import append, nonfinite_flags, prepare_append, prepare_seal, seal, seal_rows

__all__ = [
    "BatchRows",
    "DecodeGraph",
    "DecodeOptions",
    "DecodePlan",
    "DecodeStep",
    "DeviceKVStore",
    "ItemTimes",
    "Launch",
    "PersistentDecode",
    "PersistentStats",
    "SplitCosts",
    "PreparedLaunch",
    "StepBuffers",
    "StepViews",
    "TieredDecodePlan",
    "append",
    "copy_blocks",
    "copy_tails",
    "dequantize_blocks",
    "device_layout_offsets",
    "gather_prefix",
    "host_layout_offsets",
    "layout_agrees",
    "nonfinite_flags",
    "paged_decode",
    "persistent_decode",
    "prefill_attention",
    "prefill_attention_batch",
    "prepare_append",
    "prepare_copy_blocks",
    "prepare_copy_tails",
    "prepare_seal",
    "reseal_blocks",
    "resolve_stream",
    "run_tiered_ops",
    "seal",
    "seal_rows",
    "tiered_decode",
]
