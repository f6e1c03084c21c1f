"""Sealed-format arithmetic that lives outside the kernels: precision by age, the
Hadamard rotation of K/V per head, and bytes per token.

Precision by age: a sealed block of a sequence of length ``n`` whose tokens end at
``(j + 1) * block_size`` is ``age = n - (j + 1) * block_size`` tokens old. A format is a
list of :class:`AgeTier` sorted by ``min_age``; a block is held by the last tier whose
``min_age`` it has reached, and in FP16 before the first (``min_age = 0`` for the first
tier: quantized when sealed, as hexcore does today). Moving a block to a later tier is
one more seal of an immutable block.

The rotation: ``H`` (:func:`hadamard`) is symmetric and orthogonal (``H @ H = I``), so a
cache that holds ``k @ H`` and ``v @ H`` (rotated at append, after RoPE) gives exact
attention to a query rotated the same way, ``(q @ H) . (k @ H) = q . k``, and an output
that :func:`rotate` turns back: ``(sum p v @ H) @ H = sum p v``. Neither the seal nor the
decode kernel changes; the rotation spreads a head's outlier channels over all of them
before the per-channel / per-group scales are taken (QuaRot, SpinQuant).
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from ._checks import as_int
from .errors import HexcoreConfigError, HexcoreInvalidArgumentError

FP16_BYTES = 2
_BITS = (2, 4)  # the integer formats of KVDtype


@dataclasses.dataclass(frozen=True)
class AgeTier:
    """Sealed blocks at least ``min_age`` tokens old hold keys/values in these bits."""

    min_age: int
    key_bits: int
    value_bits: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "min_age", as_int("min_age", self.min_age, low=0))
        for name in ("key_bits", "value_bits"):
            bits = as_int(name, getattr(self, name), low=2, high=4)
            if bits not in _BITS:
                raise HexcoreInvalidArgumentError(f"{name}: expected one of {_BITS}, got {bits}")
            object.__setattr__(self, name, bits)


def check_tiers(tiers, block_size: int) -> tuple[AgeTier, ...]:
    """``tiers`` as a tuple, or HexcoreInvalidArgumentError unless their ``min_age`` strictly
    increase and are multiples of ``block_size`` (a block changes tier on a seal boundary)."""
    tiers = tuple(tiers)
    ages = [t.min_age for t in tiers]
    if ages != sorted(set(ages)) or any(a % block_size for a in ages):
        raise HexcoreInvalidArgumentError(
            f"tiers: expected strictly increasing min_age, multiples of block_size {block_size}, got {ages}")
    return tiers


def block_tiers(length: int, block_size: int, tiers, sink_blocks: int = 0) -> np.ndarray:
    """Tier of each sealed block of a sequence of ``length`` tokens: int32 ``[length //
    block_size]``, ``-1`` for a block held FP16 (younger than the first tier, or one of the
    first ``sink_blocks`` blocks, the attention sink, which stay FP16), else the index into
    ``tiers``."""
    length = as_int("length", length, low=0)
    block_size = as_int("block_size", block_size, low=1)
    sink_blocks = as_int("sink_blocks", sink_blocks, low=0)
    tiers = check_tiers(tiers, block_size)
    num_blocks = length // block_size
    age = length - (np.arange(num_blocks, dtype=np.int64) + 1) * block_size  # [num_blocks]
    level = np.full(num_blocks, -1, np.int32)
    for i, tier in enumerate(tiers):
        level[age >= tier.min_age] = i
    level[:sink_blocks] = -1
    return level


def sealed_bytes_per_head(block_size: int, head_dim: int, group_size: int, tier: AgeTier | None) -> int:
    """Bytes of one sealed block of one head and layer, K and V: FP16 for ``tier=None``, else
    codes, key scale/min per channel and value scale/min per token and group (float16)."""
    if tier is None:
        return 2 * block_size * head_dim * FP16_BYTES
    codes = block_size * head_dim * (tier.key_bits + tier.value_bits) // 8
    key_meta = 2 * head_dim * FP16_BYTES
    value_meta = block_size * 2 * (head_dim // group_size) * FP16_BYTES
    return codes + key_meta + value_meta


def bytes_per_token(*, head_dim: int, block_size: int, group_size: int, tiers, context: int,
                    num_layers: int = 1, num_kv_heads: int = 1, sink_blocks: int = 0) -> float:
    """Cache bytes per token of one sequence of ``context`` tokens: its sealed blocks (each at
    the precision its age gives it, :func:`block_tiers`, the first ``sink_blocks`` FP16) and
    its FP16 tail buffer of
    ``block_size`` slots, K and V, over ``num_layers`` x ``num_kv_heads``, divided by
    ``context``. ``tiers=()`` is an FP16 cache.
    """
    head_dim = as_int("head_dim", head_dim, low=1)
    block_size = as_int("block_size", block_size, low=1)
    group_size = as_int("group_size", group_size, low=1)
    context = as_int("context", context, low=1)
    if head_dim % group_size:
        raise HexcoreInvalidArgumentError(f"group_size: {group_size} does not divide head_dim {head_dim}")
    tiers = check_tiers(tiers, block_size)
    level = block_tiers(context, block_size, tiers, sink_blocks)
    per_level = [sealed_bytes_per_head(block_size, head_dim, group_size, t) for t in tiers]
    sealed = int(np.sum(level < 0)) * sealed_bytes_per_head(block_size, head_dim, group_size, None)
    sealed += sum(int(np.sum(level == i)) * b for i, b in enumerate(per_level))
    tail = sealed_bytes_per_head(block_size, head_dim, group_size, None)
    heads = as_int("num_layers", num_layers, low=1) * as_int("num_kv_heads", num_kv_heads, low=1)
    return heads * (sealed + tail) / context


@dataclasses.dataclass(frozen=True)
class KVFormat:
    """What a sequence's sealed blocks hold as they age: ``tiers`` (:class:`AgeTier`, by
    ``min_age``; FP16 before the first), the first ``sink_blocks`` blocks FP16 for life (the
    attention sink), and with ``fitted_keys`` the (scale, min) of each 2-bit key channel
    fitted to its block by Lloyd steps instead of taken from its extremes (the stored
    format and the decode are the same; only the seal's choice of the pair changes).

    A block moves to its next tier by a *re-seal*: its codes dequantized to FP16 rows
    (``float16(float32(scale) * code + float32(min))``), then sealed from those rows as a
    tail holding them would be sealed at the new tier. The float64 reference of every step
    is ``tests/reference.py`` (``tiered_kv``); the measured quality of each preset is in
    ``benchmarks/RESULTS.md`` and ``benchmarks/quality-notes.md``.
    """

    name: str
    tiers: tuple = ()
    sink_blocks: int = 0
    fitted_keys: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise HexcoreInvalidArgumentError(f"name: expected a non-empty str, got {self.name!r}")
        if not isinstance(self.tiers, (tuple, list)):
            raise HexcoreInvalidArgumentError(f"tiers: expected a tuple of AgeTier, got {type(self.tiers).__name__}")
        tiers = tuple(self.tiers)
        if not all(isinstance(t, AgeTier) for t in tiers):
            raise HexcoreInvalidArgumentError(f"tiers: expected AgeTier items, got {tiers!r:.120}")
        object.__setattr__(self, "tiers", check_tiers(tiers, 1))  # ages increase (block multiples: at use)
        object.__setattr__(self, "sink_blocks", as_int("sink_blocks", self.sink_blocks, low=0))
        if not isinstance(self.fitted_keys, bool):
            raise HexcoreInvalidArgumentError(f"fitted_keys: expected a bool, got {self.fitted_keys!r}")

    def block_tiers(self, length: int, block_size: int) -> np.ndarray:
        """:func:`block_tiers` of this format: int32 ``[length // block_size]``, -1 for FP16."""
        return block_tiers(length, block_size, self.tiers, self.sink_blocks)

    def bytes_per_token(self, *, head_dim: int, block_size: int, group_size: int, context: int,
                        num_layers: int = 1, num_kv_heads: int = 1) -> float:
        """:func:`bytes_per_token` of one sequence of ``context`` tokens in this format."""
        return bytes_per_token(head_dim=head_dim, block_size=block_size, group_size=group_size, tiers=self.tiers,
                               context=context, num_layers=num_layers, num_kv_heads=num_kv_heads,
                               sink_blocks=self.sink_blocks)


# The formats by name: today's kv_dtypes as formats, and the two measured presets
# (benchmarks/quality-notes.md, "The chosen sealed format").
FORMATS = {f.name: f for f in (
    KVFormat("fp16"),
    KVFormat("int4", (AgeTier(0, 4, 4),)),
    KVFormat("int2", (AgeTier(0, 2, 2),)),
    KVFormat("int4-aged", (AgeTier(32, 4, 4),), sink_blocks=1),
    KVFormat("int2-aged", (AgeTier(0, 4, 4), AgeTier(384, 2, 2)), sink_blocks=1, fitted_keys=True),
)}


def kv_format(value) -> KVFormat:
    """A KVFormat from itself or a name in :data:`FORMATS` (HexcoreConfigError otherwise)."""
    if isinstance(value, KVFormat):
        return value
    if isinstance(value, str) and value.lower() in FORMATS:
        return FORMATS[value.lower()]
    raise HexcoreConfigError(f"format: expected a KVFormat or one of {', '.join(map(repr, FORMATS))}, "
                             f"got {value!r:.60}")


@functools.cache
def _hadamard(n: int) -> np.ndarray:
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    h = h / np.sqrt(n)
    h.setflags(write=False)
    return h


def hadamard(n: int) -> np.ndarray:
    """Normalized Walsh-Hadamard matrix ``[n, n]`` float64 (Sylvester order, read-only):
    symmetric, ``H @ H = I``; ``n`` a power of two in [1, 4096]."""
    n = as_int("n", n, low=1, high=4096)
    if n & (n - 1):
        raise HexcoreInvalidArgumentError(f"n: expected a power of two, got {n}")
    return _hadamard(n)


def rotate(x: np.ndarray) -> np.ndarray:
    """``x @ H`` over the last axis (head_dim, a power of two): float64 ``[..., D]`` from
    ``[..., D]``. Its own inverse: ``rotate(rotate(x)) == x`` up to rounding."""
    x = np.asarray(x)
    if x.ndim == 0:
        raise HexcoreInvalidArgumentError("x: expected an array [..., head_dim], got a scalar")
    return x.astype(np.float64) @ hadamard(x.shape[-1])
