"""Checksum verification riding inside a decode step: captured launches, flags read later.

A :class:`StepVerify` belongs to one ``DecodeGraph`` made with ``verify_sums``. Each batch
bucket's index buffer then holds a row of ``capacity`` block ids (``StepBuffers``), which
a step's ``verify_blocks`` fill (-1 padding after them). After its seal, the step runs a
``RECORD`` checksum launch over its ``seal_blocks`` row (the digests of the blocks it
sealed go into ``sums``: no separate ``record_seals`` launch), then one ``VERIFY`` launch
over the verify row (``hexcore.cuda.integrity``), then its decodes. Both are prepared
launches (``PreparedLaunch``), captured with the step: no launch of their own from the
host. Nothing is read back then: the kernel counts mismatches and
bad guard words into ``flags`` and lists the first ``FOUND`` mismatches as (block, layer)
in ``found``; :meth:`StepVerify.read` (``DecodeGraph.verify_results``) reads the two
counts, and the list and guard counts only when a count is not zero, then clears them.
Counts accumulate over steps until read, so nothing is lost between reads; the list
holds the first ``FOUND`` mismatches since the last read.

Whole layers in turn (``head_sums`` and ``layers_per_step`` k > 0): the step also records
its seals' head digests (``integrity.prepare_head_record``, beside the RECORD launch),
and a step of phase ``p`` (of ``phases = ceil(L / k)``: the caller's choice, or the graph's
count of steps ``n % phases``) decodes layers ``[p * k, (p + 1) * k)`` with the decode
kernel's verify variant checking every sealed block it reads against them
(``decode_verify``: ``vctl = (1, 0)``, the same ``flags`` and ``found``), the other layers
with the plain kernel: each (block, layer) is checked by the decode that reads it anyway,
once in a round of ``phases`` steps. A captured graph per phase. Each decode item that
reads a bad block lists it, so one block read by many sequences and heads can fill the
list (``FaultTolerantKVCache.check_graph`` then checks every block).

Device buffers (L layers, C = capacity, G guard regions)::

    sums      uint32 [num_blocks, L]   the recorded digests (the caller's, e.g. FaultTolerantKVCache.sums)
    out       uint32 [C, L]            digest XOR recorded, per row (shared by every bucket)
    flags     uint32 [2]               mismatches, bad guard words
    found     int32  [FOUND, 2]        (block, layer) of the first mismatches
    guard_bad uint32 [G]               bad words per guard region, of the last launch
    head_sums uint32 [num_blocks, L, H] the recorded head digests (whole layers in turn only)
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import cuda

from ..._checks import as_int
from ...errors import HexcoreInvalidArgumentError
from ..arrays import check_writes, checked, checked_ids, checked_store, device_only
from ..attention.launcher import DecodeVerify
from ..integrity import checksum_launch, prepare_checksum, prepare_head_record, record_head_sums, to_host
from ..launch import PreparedLaunch
from ..streams import resolve_stream

FOUND = 1024  # (block, layer) mismatches listed between two reads
MAX_CAPACITY = 1 << 20  # block ids one step may verify


class VerifyResults(NamedTuple):
    """What the step verifications since the last read found (host arrays).

    ``mismatches``: (block, layer) digests that differed (a count; from the checksum launch
    each at most once per step, from whole layers checked in the decode once per decode
    item that read the block); ``found``: int32 ``[min(mismatches, FOUND), 2]`` rows (block, layer), in no
    particular order; ``guard_words``: bad guard words counted; ``guard_bad``: uint32
    ``[G]`` bad words per guard region (all zero when ``guard_words`` is 0).
    """

    mismatches: int
    found: np.ndarray
    guard_words: int
    guard_bad: np.ndarray

    @property
    def ok(self) -> bool:
        """True when nothing was found."""
        return not self.mismatches and not self.guard_words


class StepVerify:
    """The device buffers of a DecodeGraph's in-step verification (module docstring).

    ``sums``: device uint32 ``[num_blocks, L]``; ``capacity``: block ids one step may
    verify, an int in [1, 2**20]; ``head_sums``: device uint32 ``[num_blocks, L, H]`` or
    None; ``layers_per_step``: layers each step checks inside its decode, an int in [1, L]
    with ``head_sums``, 0 without. ``sums`` and ``head_sums`` (written by the step's
    records) lie outside the store and share no memory.
    """

    def __init__(self, store, sums, capacity: int, head_sums=None, layers_per_step: int = 0):
        L = checked_store(store).config.num_layers
        self.store, self.capacity = store, as_int("capacity", capacity, 1, MAX_CAPACITY)
        self.sums, self.head_sums, self.layers_per_step = _checked_digests(store, sums, head_sums, layers_per_step)
        self.phases = -(-L // self.layers_per_step) if self.layers_per_step else 0
        self.out = cuda.device_array((self.capacity, L), np.uint32)
        self.flags = cuda.to_device(np.zeros(2, np.uint32))
        self.found = cuda.to_device(np.full((FOUND, 2), -1, np.int32))
        self.guard_bad = cuda.to_device(np.zeros(len(store.guard_offsets), np.uint32))
        self.decode_verify = None if head_sums is None else DecodeVerify(
            self.head_sums, cuda.to_device(np.array([1, 0], np.int32)), self.flags, self.found)

    def checked_layers(self, phase: int | None) -> range:
        """The layers step phase ``phase`` (an int in [0, phases), or None) decodes with the
        verify variant: ``[phase * k, (phase + 1) * k)`` clipped to L; none for None."""
        if phase is None or not self.phases:
            return range(0)
        phase = as_int("phase", phase, 0, self.phases - 1)
        k = self.layers_per_step
        return range(phase * k, min((phase + 1) * k, self.store.config.num_layers))

    def prepare_head_record(self, seal_blocks, layer: int | None = None) -> PreparedLaunch:
        """The capture-safe head-digest record of a step's sealed blocks (a device int32
        row, -1 padding), of every layer or one; only with ``head_sums``."""
        return prepare_head_record(self.store, seal_blocks, self.head_sums, layer)

    def prepare(self, block_ids) -> PreparedLaunch:
        """The capture-safe VERIFY launch over ``block_ids`` (a device int32 row of at most
        ``capacity`` ids)."""
        device_only(block_ids=block_ids)
        n = checked_ids(block_ids, "block_ids", None, self.store.num_blocks).shape[0]
        if n > self.capacity:
            raise HexcoreInvalidArgumentError(f"block_ids: {n} ids exceed the capacity {self.capacity}")
        return prepare_checksum(self.store, block_ids, self.sums, self.out[:n], self.guard_bad, "verify",
                                self.flags, self.found)

    def prepare_record(self, seal_blocks, out) -> PreparedLaunch:
        """The capture-safe RECORD launch of a step's sealed blocks (a device int32 row,
        -1 padding): ``sums[block] = digest``, after the step's seal; ``out``: uint32
        ``[len(seal_blocks), L]`` scratch."""
        return prepare_checksum(self.store, seal_blocks, self.sums, out, self.guard_bad, "record")

    def run_eager(self, seal_blocks: np.ndarray, verify_blocks: np.ndarray, stream) -> None:
        """Both launches over host ids (a batch above the largest bucket)."""
        n, L = seal_blocks.shape[0], self.store.config.num_layers
        if n:
            out = cuda.device_array((n, L), np.uint32)
            checksum_launch(self.store, seal_blocks, self.sums, out, self.guard_bad, "record").run(stream)
            if self.head_sums is not None:
                record_head_sums(self.store, seal_blocks, self.head_sums, stream)
        n = verify_blocks.shape[0]
        if n:
            checksum_launch(self.store, verify_blocks, self.sums, self.out[:n], self.guard_bad, "verify", self.flags,
                            self.found).run(stream)

    def read(self, stream) -> VerifyResults:
        """The counts (and, when not zero, the list and guard counts) since the last read,
        once the work queued on ``stream`` (resolved or not) is done; clears them (synchronises)."""
        stream = resolve_stream(stream)
        flags = to_host(self.flags, stream)
        mismatches, guard_words = int(flags[0]), int(flags[1])
        found = np.zeros((0, 2), np.int32)
        guard_bad = np.zeros(len(self.store.guard_offsets), np.uint32)
        if mismatches:
            found = to_host(self.found, stream)[:min(mismatches, FOUND)].copy()
        if guard_words:
            guard_bad = to_host(self.guard_bad, stream)
        if mismatches or guard_words:
            self.flags.copy_to_device(np.zeros(2, np.uint32))  # synchronous; the stream is idle now
        return VerifyResults(mismatches, found, guard_words, guard_bad)


def _checked_digests(store, sums, head_sums, layers_per_step) -> tuple:
    """StepVerify's ``(sums, head_sums, layers_per_step)`` checked: device arrays of their
    shapes, outside the store (the step's records write them) and apart; an int in [1, L]
    with ``head_sums``, 0 without."""
    cfg = store.config
    L = cfg.num_layers
    for name, a in (("verify_sums", sums), ("verify_heads", head_sums)):
        if isinstance(a, np.ndarray):
            raise HexcoreInvalidArgumentError(f"{name}: expected a device array (the recorded digests), "
                                              "got a host numpy array")
    sums = checked(sums, "verify_sums", np.uint32, (store.num_blocks, L), output=False)
    layers = as_int("verify_layers", layers_per_step, 0, L)
    if (head_sums is None) != (layers == 0):
        raise HexcoreInvalidArgumentError(f"verify_layers: expected an int in [1, {L}] with verify_heads and 0 "
                                          f"without, got {layers} with verify_heads "
                                          f"{'None' if head_sums is None else 'given'}")
    if head_sums is not None:
        head_sums = checked(head_sums, "verify_heads", np.uint32, (store.num_blocks, L, cfg.num_kv_heads), align=4,
                            output=True)
    check_writes(store, {"verify_sums": sums, "verify_heads": head_sums})
    return sums, head_sums, layers


__all__ = ["FOUND", "MAX_CAPACITY", "StepVerify", "VerifyResults"]
