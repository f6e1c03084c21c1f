"""KVCacheConfig and KVDtype: every size and byte count of the cache, in one place."""

from __future__ import annotations

import dataclasses
import enum

from ._checks import as_int
from .errors import HexcoreConfigError, HexcoreInvalidArgumentError
from .layout import FP16_BYTES


class KVDtype(enum.Enum):
    """Storage type of sealed blocks; tails are always FP16."""

    FP16 = "fp16"
    INT4 = "int4"
    INT2 = "int2"

    @property
    def bits(self) -> int:
        """Bits per stored element."""
        return {"fp16": 16, "int4": 4, "int2": 2}[self.value]

    @property
    def is_quantized(self) -> bool:
        """True for the integer formats that carry scale/min metadata."""
        return self is not KVDtype.FP16

    @classmethod
    def parse(cls, value: "KVDtype | str") -> "KVDtype":
        """A KVDtype from itself or its name ("fp16", "int4", "int2", any case)."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            try:
                return cls(value.lower())
            except ValueError:
                pass
        names = ", ".join(repr(d.value) for d in cls)
        raise HexcoreConfigError(f"kv_dtype: expected one of {names}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class ModelPreset:
    """Attention shape of a public model: what sizes its KV cache."""

    num_layers: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int


PRESETS: dict[str, ModelPreset] = {
    "llama-3-8b": ModelPreset(num_layers=32, num_q_heads=32, num_kv_heads=8, head_dim=128),
    "llama-3-70b": ModelPreset(num_layers=80, num_q_heads=64, num_kv_heads=8, head_dim=128),
    "mistral-7b": ModelPreset(num_layers=32, num_q_heads=32, num_kv_heads=8, head_dim=128),
    "qwen2.5-7b": ModelPreset(num_layers=28, num_q_heads=28, num_kv_heads=4, head_dim=128),
    "llama-2-7b": ModelPreset(num_layers=32, num_q_heads=32, num_kv_heads=32, head_dim=128),
}


def _field_int(name: str, value) -> int:
    # A size field: the integer rule of hexcore._checks, raised as HexcoreConfigError.
    try:
        return as_int(name, value, low=1)
    except HexcoreInvalidArgumentError as exc:
        raise HexcoreConfigError(str(exc)) from None


@dataclasses.dataclass(frozen=True)
class KVCacheConfig:
    """Shape and storage type of a KV cache; derives every byte count as an exact int.

    ``block_size`` is tokens per sealed block (and per tail); ``group_size`` is the
    number of channels that share one value scale/min in INT4/INT2 blocks. INT4/INT2
    need ``head_dim`` a multiple of 64 and ``group_size`` 16, 32 or a multiple of 64 (the
    sealed code order follows the decode kernel's tensor-core tiles).

    The size fields are ints >= 1 (numpy integers are accepted and stored as int); a
    bad field raises HexcoreConfigError naming it (``"<field>: expected an int >= 1,
    got <value>"`` for a non-int or a value out of range). Method arguments follow the
    same integer rule with HexcoreInvalidArgumentError.
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int = 32
    kv_dtype: KVDtype = KVDtype.FP16
    group_size: int = 64

    def __post_init__(self) -> None:
        object.__setattr__(self, "kv_dtype", KVDtype.parse(self.kv_dtype))
        for name in ("num_layers", "num_kv_heads", "head_dim", "block_size", "group_size"):
            object.__setattr__(self, name, _field_int(name, getattr(self, name)))  # numpy ints -> int
        bs = self.block_size
        if bs & (bs - 1) or not 16 <= bs <= 256:
            raise HexcoreConfigError(f"block_size: expected a power of two in [16, 256], got {bs}")
        if self.head_dim % self.group_size:
            raise HexcoreConfigError(
                f"group_size: head_dim {self.head_dim} is not divisible by group_size {self.group_size}"
            )
        if self.kv_dtype.is_quantized and self.head_dim % 64:
            raise HexcoreConfigError(
                f"head_dim: {self.kv_dtype.value} blocks need a multiple of 64, got {self.head_dim}")
        if self.kv_dtype.is_quantized and not (self.group_size in (16, 32) or self.group_size % 64 == 0):
            raise HexcoreConfigError(
                f"group_size: {self.kv_dtype.value} blocks need 16, 32 or a multiple of 64, got {self.group_size}")
        if self.row_bytes % 16:
            raise HexcoreConfigError(
                f"head_dim: a {self.kv_dtype.value} code row of head_dim {self.head_dim} is "
                f"{self.row_bytes} bytes, not a multiple of 16"
            )

    # -- per token row, per (block, head) -------------------------------------------
    @property
    def row_bytes(self) -> int:
        """Code bytes of one token of one head in a sealed block."""
        return self.head_dim * self.kv_dtype.bits // 8

    @property
    def num_groups(self) -> int:
        """Value-quantization groups per token and head."""
        return self.head_dim // self.group_size

    # -- per sealed block, one layer ------------------------------------------------
    @property
    def code_bytes_per_block(self) -> int:
        """Code bytes of one sealed block of one layer, K or V alone."""
        return self.num_kv_heads * self.block_size * self.row_bytes

    @property
    def key_meta_bytes_per_block(self) -> int:
        """Key scale and min bytes of one sealed block of one layer (0 for FP16)."""
        if not self.kv_dtype.is_quantized:
            return 0
        return self.num_kv_heads * 2 * self.head_dim * FP16_BYTES

    @property
    def value_meta_bytes_per_block(self) -> int:
        """Value scale and min bytes of one sealed block of one layer (0 for FP16)."""
        if not self.kv_dtype.is_quantized:
            return 0
        return self.num_kv_heads * self.block_size * 2 * self.num_groups * FP16_BYTES

    @property
    def meta_bytes_per_block(self) -> int:
        """Metadata bytes of one sealed block of one layer, K and V."""
        return self.key_meta_bytes_per_block + self.value_meta_bytes_per_block

    @property
    def block_bytes_per_layer(self) -> int:
        """Bytes of one sealed block of one layer: K and V codes plus metadata."""
        return 2 * self.code_bytes_per_block + self.meta_bytes_per_block

    @property
    def block_bytes(self) -> int:
        """Bytes of one sealed block over all layers."""
        return self.num_layers * self.block_bytes_per_layer

    # -- tails ------------------------------------------------------------------------
    @property
    def tail_bytes_per_layer(self) -> int:
        """Bytes of one sequence's FP16 tail in one layer, K and V."""
        return 2 * self.num_kv_heads * self.block_size * self.head_dim * FP16_BYTES

    @property
    def tail_bytes(self) -> int:
        """Bytes of one sequence's FP16 tail over all layers, K and V."""
        return self.num_layers * self.tail_bytes_per_layer

    # -- totals and capacity ----------------------------------------------------------
    def total_bytes(self, num_blocks: int, max_seqs: int) -> int:
        """Device bytes of a cache with ``num_blocks`` sealed blocks and ``max_seqs`` tails.

        Both are ints >= 1 (else HexcoreInvalidArgumentError naming the argument).
        """
        num_blocks, max_seqs = as_int("num_blocks", num_blocks, low=1), as_int("max_seqs", max_seqs, low=1)
        return num_blocks * self.block_bytes + max_seqs * self.tail_bytes

    def blocks_for_budget(self, budget_bytes: int, max_seqs: int) -> int:
        """Sealed blocks that fit ``budget_bytes`` after ``max_seqs`` tails (0 if none).

        Both are ints >= 1 (else HexcoreInvalidArgumentError naming the argument).
        """
        budget_bytes, max_seqs = as_int("budget_bytes", budget_bytes, low=1), as_int("max_seqs", max_seqs, low=1)
        return max(0, (budget_bytes - max_seqs * self.tail_bytes) // self.block_bytes)

    def tokens_for_budget(self, budget_bytes: int, max_seqs: int) -> int:
        """Tokens the sealed blocks that fit ``budget_bytes`` hold (tails not counted)."""
        return self.blocks_for_budget(budget_bytes, max_seqs) * self.block_size

    @property
    def compression_ratio(self) -> float:
        """FP16 sealed-block bytes over this config's sealed-block bytes."""
        fp16 = dataclasses.replace(self, kv_dtype=KVDtype.FP16)
        return fp16.block_bytes / self.block_bytes

    # -- array shapes (the store allocates exactly these) -----------------------------
    def code_shape(self, num_blocks: int) -> tuple[int, ...]:
        """Shape of a sealed K or V pool: float16 for FP16, uint8 codes otherwise."""
        num_blocks = as_int("num_blocks", num_blocks, low=1)
        last = self.head_dim if not self.kv_dtype.is_quantized else self.row_bytes
        return (self.num_layers, num_blocks, self.num_kv_heads, self.block_size, last)

    def key_meta_shape(self, num_blocks: int) -> tuple[int, ...]:
        """Shape of the float16 key scale/min array (per channel over a block)."""
        num_blocks = as_int("num_blocks", num_blocks, low=1)
        return (self.num_layers, num_blocks, self.num_kv_heads, 2, self.head_dim)

    def value_meta_shape(self, num_blocks: int) -> tuple[int, ...]:
        """Shape of the float16 value scale/min array (per token and channel group)."""
        num_blocks = as_int("num_blocks", num_blocks, low=1)
        return (self.num_layers, num_blocks, self.num_kv_heads, self.block_size, 2, self.num_groups)

    def tail_shape(self, max_seqs: int) -> tuple[int, ...]:
        """Shape of a float16 K or V tail pool."""
        max_seqs = as_int("max_seqs", max_seqs, low=1)
        return (self.num_layers, max_seqs, self.num_kv_heads, self.block_size, self.head_dim)

    # -- presets ------------------------------------------------------------------------
    @classmethod
    def from_preset(cls, name: str, kv_dtype: KVDtype | str = KVDtype.FP16, block_size: int = 32,
                    group_size: int = 64) -> "KVCacheConfig":
        """Config for a named public model (see ``PRESETS``)."""
        preset = PRESETS.get(name) if isinstance(name, str) else None
        if preset is None:
            raise HexcoreConfigError(f"preset: expected one of {sorted(PRESETS)}, got {name!r}")
        return cls(num_layers=preset.num_layers, num_kv_heads=preset.num_kv_heads,
                   head_dim=preset.head_dim, block_size=block_size, kv_dtype=kv_dtype,
                   group_size=group_size)
