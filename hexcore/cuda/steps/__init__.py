"""Whole decode steps: a step's index arrays checked and staged (``indices``), its
launches bound to static buffers (``step``), and CUDA-graph capture and replay
(``capture``, ``graph``), and checksum verification riding in a step (``verify``)."""

from __future__ import annotations

from .graph import DecodeGraph, StepViews
from .step import DecodeStep, PhaseStep, StepBuffers
from .verify import StepVerify, VerifyResults

__all__ = ["DecodeGraph", "DecodeStep", "PhaseStep", "StepBuffers", "StepVerify", "StepViews", "VerifyResults"]
