"""Paged decode attention: the launcher (``paged_decode``, ``DecodePlan``), its options,
and the tensor-core kernel (``kernel.py``, per-warp work in ``fragments.py``, sizes in
``shape.py``, intrinsics in ``mma.py``)."""

from __future__ import annotations

from .launcher import DecodePlan, Workspace, paged_decode
from .options import DecodeOptions

__all__ = ["DecodeOptions", "DecodePlan", "Workspace", "paged_decode"]
