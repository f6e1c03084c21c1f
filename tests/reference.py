"""Slow, obviously-right numpy references that kernels and njit code are checked against."""

from __future__ import annotations
