"""Paged decode attention: the launcher (``paged_decode``, ``DecodePlan``), its options,
and the tensor-core kernel (``kernel.py``, per-warp work in ``fragments.py``, sizes in
``shape.py``, the tensor-core intrinsics in ``cuda/mma.py``); prefill over a cached prefix (``prefill.py``:
``prefill_attention``, ``prefill_attention_batch`` and its ``BatchRows``, ``gather_prefix``);
the persistent checkpoint-and-yield decode (``persistent.py``: ``persistent_decode``,
``PersistentDecode``; its kernels and protocol in ``persistent_kernels.py``); decode over
the pools of a format by age (``tiered.py``: ``tiered_decode``, ``TieredDecodePlan``)."""

from __future__ import annotations

from .launcher import DecodePlan, DecodeVerify, Workspace, paged_decode
from .options import DecodeOptions, SplitCosts
from .persistent import BudgetError, ItemTimes, PersistentDecode, PersistentStats, persistent_decode
from .prefill import BatchRows, gather_prefix, prefill_attention, prefill_attention_batch
from .tiered import TieredDecodePlan, tiered_decode

__all__ = ["BatchRows", "BudgetError", "DecodeOptions", "DecodePlan", "DecodeVerify", "ItemTimes", "PersistentDecode",
           "PersistentStats", "SplitCosts", "TieredDecodePlan", "Workspace", "gather_prefix", "paged_decode",
           "persistent_decode", "prefill_attention", "prefill_attention_batch", "tiered_decode"]
