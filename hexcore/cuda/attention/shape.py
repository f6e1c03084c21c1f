"""DecodeShape: the compile-time sizes of one decode kernel, derived once and named.

Terms (docs/design-notes.md, "Decode kernel"): a warp works on 16-token **k-steps**.
Scores ``S^T[token, head] = K Q^T`` are mma tiles of the k-step's 16 tokens by the 8
query heads of the CTA over ``D`` channels; the output ``O^T[channel, head] = V^T P^T``
is mma tiles of 16 channels (an **m-tile**) by 8 heads over the k-step's 16 tokens.
Lane ``4 * gid + tig`` holds:

- of the key rows of tokens ``gid`` and ``gid + 8``: the channels
  ``[tig * D/4, (tig+1) * D/4)``, as ``D/8`` fragment registers of two channels each
  (``key_regs``; q's B fragments of head ``gid`` have the same channel order);
- of the value rows of tokens ``2tig, 2tig+1, 2tig+8, 2tig+9``: for m-tile ``t`` the
  channels of rows ``gid`` and ``gid + 8`` (``layout.value_code_field``), ``4 * D/16``
  registers (``value_regs``) of two tokens each.
"""

from __future__ import annotations

import dataclasses

from ...layout import value_chunk_dims

WARPS = 4
THREADS = 32 * WARPS
HEADS_PER_CTA = 8  # query heads of one CTA: the mma's N (columns past the group's heads stay zero)
KSTEP = 16  # tokens per mma k-step of the output product
HEAD_DIMS = (64, 128)


@dataclasses.dataclass(frozen=True)
class DecodeShape:
    """Sizes of one decode kernel: ``bits`` of the sealed blocks (16 = FP16), KV heads
    ``H``, ``head_dim`` ``D``, ``block_size`` ``BS``, query heads per KV head ``G``,
    value ``group_size`` ``GS``."""

    bits: int
    H: int
    D: int
    BS: int
    G: int
    GS: int

    @property
    def quantized(self) -> bool:
        """True for INT4/INT2 sealed blocks (tails are FP16 either way)."""
        return self.bits < 16

    @property
    def head_groups(self) -> int:
        """CTAs per (sequence, KV head, split): groups of 8 query heads."""
        return -(-self.G // HEADS_PER_CTA)

    @property
    def num_groups(self) -> int:
        """Value quantization groups per row (1 for FP16)."""
        return self.D // self.GS if self.quantized else 1

    @property
    def ksteps_per_block(self) -> int:
        """16-token k-steps per block."""
        return self.BS // KSTEP

    @property
    def chunk_ksteps(self) -> int:
        """k-steps of a sealed block loaded together and sharing one softmax update (at most
        two: 32 tokens)."""
        return min(self.ksteps_per_block, 2)

    @property
    def ring_regions(self) -> tuple[int, int, int]:
        """Words of a ring stage's key codes, value codes and value metadata (one chunk; the
        block's key metadata, ``D`` words, follows the value codes)."""
        rows = 16 * self.chunk_ksteps
        return rows * self.D * self.bits // 32, self.chunk_ksteps * 32 * self.value_words, rows * self.num_groups

    @property
    def stage_words(self) -> int:
        """Words of one ring stage: a chunk of a sealed INT block, staged by cp.async."""
        k, v, vm = self.ring_regions
        return k + v + self.D + vm

    @property
    def key_regs(self) -> int:
        """Fragment registers of one key row a lane holds (= q registers)."""
        return self.D // 8

    @property
    def key_words(self) -> int:
        """32-bit words of one key row a lane loads: D/4 channels of ``bits`` each."""
        return self.D * self.bits // 128

    @property
    def key_load(self) -> int:
        """Words per key load instruction (4 = 16 bytes)."""
        return min(4, self.key_words)

    @property
    def m_tiles(self) -> int:
        """m-tiles of 16 channels in the output product (4 accumulators each per lane)."""
        return self.D // 16

    @property
    def value_regs(self) -> int:
        """Fragment registers of a k-step's values per lane (4 per m-tile)."""
        return 4 * self.m_tiles

    @property
    def regs_per_word(self) -> int:
        """Fragment registers one code word yields (two codes each)."""
        return 16 // self.bits

    @property
    def value_words(self) -> int:
        """Code words of a k-step's values per lane (quantized blocks)."""
        return self.value_regs // self.regs_per_word

    @property
    def chunk(self) -> int:
        """Channels of an FP16 value row a lane loads contiguously (layout.value_chunk_dims)."""
        return value_chunk_dims(self.GS) if self.quantized else 8

    @property
    def chunks(self) -> int:
        """Such chunks per row and lane."""
        return self.D // (8 * self.chunk)

    @property
    def row_value_words(self) -> int:
        """Words of the four FP16 value rows a lane loads per k-step."""
        return 4 * self.chunks * self.chunk // 2

    @property
    def meta_words(self) -> int:
        """Value scale/min words of two consecutive tokens (2 * NG halves each)."""
        return 2 * self.num_groups

    def group_of_tile(self, tile: int) -> int:
        """The value group of m-tile ``tile`` (every channel of a tile is in one group)."""
        c = tile // (self.chunk // 2)
        return (8 * c * self.chunk) // self.GS if self.quantized else 0

    def dim_of(self, tile: int, row: int, gid: int) -> int:
        """The channel of row ``gid`` (``row`` 0) or ``gid + 8`` (``row`` 1) of m-tile ``tile``."""
        c, i = tile // (self.chunk // 2), tile % (self.chunk // 2)
        return self.chunk * (8 * c + gid) + 2 * i + row


def unsupported_reason(bits: int, D: int, BS: int, GS: int) -> str | None:
    """Why paged decode cannot run this layout, or None when it can."""
    if D not in HEAD_DIMS:
        return f"head_dim {D} (paged_decode supports {HEAD_DIMS})"
    if BS % KSTEP:
        return f"block_size {BS} (paged_decode needs a multiple of {KSTEP})"
    if bits < 16 and not (GS in (16, 32) or GS % 64 == 0):
        return f"group_size {GS} (quantized decode needs 16, 32 or a multiple of 64)"
    if bits < 16 and D // GS > 8:
        return f"group_size {GS} (at most 8 value groups per row, got {D // GS})"
    return None
