"""DecodeStep: one decode step's launches, bound to a batch bucket's static buffers.

A bucket of ``Bb`` rows owns these device buffers (L layers)::

    q, out : float16 [L, Bb, num_q_heads, D]        k, v : float16 [L, Bb, H, D]
    index  : int32, one buffer, read by every launch of a step:
        seq_lens | tail_slots | positions | seal_slots | seal_blocks | fork_src | fork_dst
        (each [Bb]), then, only with in-step verification, verify_blocks [C] (C: the
        ``StepVerify`` capacity), then block_tables [Bb, width] (width = sealed blocks of
        the context bucket)

Rows past the batch are padding: seq_len 0 (the decode writes zeros), slot and block
ids -1 (append, seal, copy and checksum skip them). Without verification the buffer and
the step's launches are exactly those of a graph that never heard of it. Every launch
is a :class:`PreparedLaunch` made once, so ``enqueue`` and ``enqueue_all`` are
capture-safe: no allocation, no synchronisation, no device-to-host read.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from ..._checks import as_int, shown
from ...errors import HexcoreInvalidArgumentError, HexcoreOOMError
from ..arrays import checked_layer, checked_store
from ..attention.launcher import Workspace, check_q_heads, decode_launch, prepare_decode
from ..attention.options import DEFAULT_OPTIONS, DecodeOptions
from ..blocks import prepare_copy_tails
from ..launch import PreparedLaunch
from ..write import prepare_append, prepare_seal
from .verify import StepVerify

# The index buffer, described once: row k of ROWS is entries [k * Bb, (k + 1) * Bb), its
# padding value PADDING[k]; the block tables follow at TABLES_ROW * Bb.
ROWS = ("seq_lens", "tail_slots", "positions", "seal_slots", "seal_blocks", "fork_src", "fork_dst")
SEQ_LENS, TAIL_SLOTS, POSITIONS, SEAL_SLOTS, SEAL_BLOCKS, FORK_SRC, FORK_DST = range(len(ROWS))
TABLES_ROW = len(ROWS)
PADDING = (0, -1, -1, -1, -1, -1, -1)  # the value of a padding row in each of ROWS
MAX_BATCH = 65535  # the decode grid's z dimension is the batch: a CUDA grid's y and z stop there
MAX_TABLE_WIDTH = 2**31 - 1  # block ids and table widths are int32


class StepBuffers:
    """The static device buffers of one batch bucket (see the module docstring).

    Attributes: ``q``, ``k``, ``v``, ``out`` (numba device arrays), ``index`` (the int32
    buffer), ``rows`` (name -> its ``[Bb]`` view), ``bucket`` (Bb), ``verify`` (the
    graph's ``StepVerify`` or None), ``verify_ids`` (its ``[C]`` row of ``index``, or
    None), ``tables_at`` (where the block tables start in ``index``).
    """

    def __init__(self, store, num_q_heads: int, bucket: int, max_blocks_per_seq: int, verify=None):
        cfg = checked_store(store).config
        L, H, D = cfg.num_layers, cfg.num_kv_heads, cfg.head_dim
        num_q_heads = as_int("num_q_heads", num_q_heads, 1, MAX_TABLE_WIDTH)
        check_q_heads(num_q_heads, H)
        bucket = as_int("bucket", bucket, 1, MAX_BATCH)
        max_blocks_per_seq = as_int("max_blocks_per_seq", max_blocks_per_seq, 1, MAX_TABLE_WIDTH)
        if verify is not None and (not isinstance(verify, StepVerify) or verify.store is not store):
            raise HexcoreInvalidArgumentError(f"verify: expected None or a StepVerify of this store, got "
                                              f"{_which(verify, StepVerify)}")
        self.store, self.bucket, self.max_blocks_per_seq, self.verify = store, bucket, max_blocks_per_seq, verify
        capacity = 0 if verify is None else verify.capacity
        self.tables_at = TABLES_ROW * bucket + capacity
        self.q = _zeros((L, bucket, num_q_heads, D), np.float16, "q")
        self.out = _zeros((L, bucket, num_q_heads, D), np.float16, "out")
        self.k = _zeros((L, bucket, H, D), np.float16, "k")
        self.v = _zeros((L, bucket, H, D), np.float16, "v")
        host = _host_index(self.tables_at + bucket * max_blocks_per_seq)
        for i, value in enumerate(PADDING):
            host[i * bucket:(i + 1) * bucket] = value
        self.index = cuda.to_device(host)  # all padding until the first step is loaded
        self.rows = {name: self.index[i * bucket:(i + 1) * bucket] for i, name in enumerate(ROWS)}
        self.verify_ids = self.index[TABLES_ROW * bucket:self.tables_at] if capacity else None
        self._launches: dict = {}

    def tables(self, width: int):
        """The ``[Bb, width]`` block-table view of the index buffer (``width``: an int in
        [1, max_blocks_per_seq])."""
        width = as_int("width", width, 1, self.max_blocks_per_seq)
        base = self.tables_at
        return self.index[base:base + self.bucket * width].reshape(self.bucket, width)

    def record_launch(self, count: int) -> PreparedLaunch:
        """The checksum RECORD launch of the first ``count`` seal rows (their digests into
        the verification's sums), made once; a graph records all ``bucket`` rows.
        ``count``: an int in [1, bucket]; only with a ``verify``."""
        count = self._count(count, self.bucket, "record_launch")
        key = ("record", count)
        if key not in self._launches:
            out = cuda.device_array((count, self.store.config.num_layers), np.uint32)
            self._launches[key] = self.verify.prepare_record(self.rows["seal_blocks"][:count], out)
        return self._launches[key]

    def head_record_launch(self, count: int, layer: int | None = None) -> PreparedLaunch:
        """The head-digest record of the first ``count`` seal rows (of every layer, or
        one), made once; ``count``: an int in [1, bucket]; only with a ``verify`` that
        checks whole layers in turn (``head_sums``)."""
        count = self._count(count, self.bucket, "head_record_launch")
        if self.verify.head_sums is None:
            raise HexcoreInvalidArgumentError("head_record_launch: these buffers' StepVerify has no head_sums")
        if layer is not None:
            layer = checked_layer(layer, self.store.config.num_layers)[0]
        key = ("heads", count, layer)
        if key not in self._launches:
            self._launches[key] = self.verify.prepare_head_record(self.rows["seal_blocks"][:count], layer)
        return self._launches[key]

    def verify_launch(self, count: int) -> PreparedLaunch:
        """The checksum VERIFY launch of the first ``count`` verify rows, made once (a graph
        verifies all ``C`` rows: padding rows are skipped by the kernel). ``count``: an int
        in [1, C]; only with a ``verify``."""
        count = self._count(count, 0 if self.verify is None else self.verify.capacity, "verify_launch")
        key = ("verify", count)
        if key not in self._launches:
            self._launches[key] = self.verify.prepare(self.verify_ids[:count])
        return self._launches[key]

    def fork(self, count: int) -> PreparedLaunch:
        """The tail copy of the first ``count`` fork rows (fork_src -> fork_dst), made once;
        ``count``: an int in [1, bucket]."""
        count = self._count(count, self.bucket)
        key = ("fork", count)
        if key not in self._launches:
            rows = self.rows
            self._launches[key] = prepare_copy_tails(self.store, rows["fork_src"][:count], rows["fork_dst"][:count])
        return self._launches[key]

    def seal(self, count: int, layer: int | None = None) -> PreparedLaunch:
        """The seal of the first ``count`` seal rows (of every layer, or one), made once.
        A graph seals all ``bucket`` rows (padding rows are skipped by the kernel).
        ``count``: an int in [1, bucket]; ``layer``: an int in [0, L) or None."""
        count = self._count(count, self.bucket)
        if layer is not None:
            layer = checked_layer(layer, self.store.config.num_layers, allow_all=True)[0]
        key = ("seal", count, layer)
        if key not in self._launches:
            rows = self.rows
            self._launches[key] = prepare_seal(self.store, rows["seal_slots"][:count], rows["seal_blocks"][:count],
                                               layer)
        return self._launches[key]

    def _count(self, count, high: int, needs_verify: str | None = None) -> int:
        """``count`` as an int in [1, high]; HexcoreInvalidArgumentError, or for ``needs_verify``
        (a method's name) without a StepVerify, that it needs one."""
        if needs_verify and self.verify is None:
            raise HexcoreInvalidArgumentError(f"{needs_verify}: these buffers were made without a StepVerify")
        return as_int("count", count, 1, high)


def _which(value, kind) -> str:
    """What ``value`` is, for a message refusing it: "one of another store" when it is a
    ``kind`` (whose ``store`` is not the one given), else its type."""
    return "one of another store" if isinstance(value, kind) else type(value).__name__


def _zeros(shape: tuple, dtype, name: str):
    """A zeroed device array, or HexcoreOOMError naming ``name`` and its shape."""
    try:
        return cuda.to_device(np.zeros(shape, dtype))
    except (MemoryError, ValueError):  # (numpy: "array is too big" past the address space)
        raise HexcoreOOMError(f"{name}: no memory for a {np.dtype(dtype)} buffer of shape {shape}") from None


def _host_index(size: int) -> np.ndarray:
    """The host image of an index buffer of ``size`` int32 entries, all -1."""
    try:
        return np.full(size, -1, np.int32)
    except (MemoryError, ValueError):
        raise HexcoreOOMError(f"index: no host memory for {size} int32 entries (bucket * max_blocks_per_seq "
                              f"table entries)") from None


class DecodeStep:
    """The launches of a decode step for one batch bucket and one context bucket.

    ``max_seq_len`` (the context bucket) bounds every ``seq_lens`` entry and sizes the
    decode grid; the block tables are ``max_seq_len // block_size`` wide. ``key`` is
    ``(bucket, max_seq_len)``. Its buffers are ``self.buffers`` (a :class:`StepBuffers`).
    With a verify that checks whole layers in turn (``phases`` > 0), ``phase`` (an int in
    [0, phases)) picks the layers decoded by the verify variant; :meth:`at` binds one.
    """

    def __init__(self, store, buffers: StepBuffers, max_seq_len: int, scale: float | None, workspace: Workspace,
                 options: DecodeOptions = DEFAULT_OPTIONS):
        cfg = checked_store(store).config
        if not isinstance(buffers, StepBuffers) or buffers.store is not store:
            raise HexcoreInvalidArgumentError(f"buffers: expected the StepBuffers of this store, got "
                                              f"{_which(buffers, StepBuffers)}")
        if not isinstance(workspace, Workspace):
            raise HexcoreInvalidArgumentError(f"workspace: expected a Workspace, got {type(workspace).__name__}")
        bs = cfg.block_size
        max_seq_len = as_int("max_seq_len", max_seq_len, bs, (buffers.max_blocks_per_seq + 1) * bs - 1)
        self.store, self.buffers, self.max_seq_len = store, buffers, max_seq_len
        self._decode_args = (scale, options, workspace)
        self.key = (buffers.bucket, max_seq_len)
        self.width = max_seq_len // cfg.block_size
        self.block_tables = buffers.tables(self.width)
        rows = buffers.rows
        self._append = prepare_append(store, buffers.k, buffers.v, rows["tail_slots"], rows["positions"])
        self._seal = buffers.seal(buffers.bucket)
        verify = buffers.verify is not None
        self._record = buffers.record_launch(buffers.bucket) if verify else None
        self.phases = buffers.verify.phases if verify else 0
        # (whole layers in turn send no ids to the checksum VERIFY launch: none is made)
        self._verify = buffers.verify_launch(buffers.verify.capacity) if verify and not self.phases else None
        self._heads = buffers.head_record_launch(buffers.bucket) if self.phases else None
        self._checked: dict = {}  # layer -> its decode launch with the verify variant (made at first use)
        self._at: dict = {}  # phase -> PhaseStep
        self._decode = [self._layer_decode(layer) for layer in range(cfg.num_layers)]
        self._layers: dict = {}

    def at(self, phase: int | None) -> DecodeStep | PhaseStep:
        """This step bound to ``phase`` (a :class:`PhaseStep`, key ``(bucket, max_seq_len,
        phase)``); itself for None (a step that checks no layer)."""
        phase = self._phase(phase)
        if phase is None:
            return self
        if phase not in self._at:
            self._at[phase] = PhaseStep(self, phase)
        return self._at[phase]

    def enqueue_all(self, stream=0, num_seals: int | None = None, num_verify: int | None = None,
                    phase: int | None = None) -> None:
        """Enqueue the whole step on ``stream``: append and seal for every layer (one
        launch each), with a ``StepVerify`` the record of the seals' digests (and head
        digests) and the verification (a checksum launch each), then one decode launch per
        layer (the verify variant for ``phase``'s layers). Capture-safe once each of its
        launches has run. ``num_seals`` and ``num_verify`` (an eager step) launch over only
        that many rows, not at all when 0; None: the bucket's (ints in [0, bucket] and
        [0, verify capacity])."""
        num_seals = self._rows("num_seals", num_seals, self.buffers.bucket)
        num_verify = self._rows("num_verify", num_verify, 0 if self._verify is None else self.buffers.verify.capacity)
        checked = self._checked_layers(phase)
        self._append.run(stream)
        if num_seals is None:
            self._seal.run(stream)
            for launch in (self._record, self._heads):
                if launch is not None:
                    launch.run(stream)
        elif num_seals:
            self.buffers.seal(num_seals).run(stream)
            if self._record is not None:
                self.buffers.record_launch(num_seals).run(stream)
            if self._heads is not None:
                self.buffers.head_record_launch(num_seals).run(stream)
        if self._verify is not None:
            if num_verify is None:
                self._verify.run(stream)
            elif num_verify:
                self.buffers.verify_launch(num_verify).run(stream)
        for layer, launch in enumerate(self._decode):
            (self._checked_decode(layer) if layer in checked else launch).run(stream)

    def _phase(self, phase) -> int | None:
        # phase as None (no phases) or an int in [0, phases)
        if not self.phases:
            if phase is not None:
                raise HexcoreInvalidArgumentError(f"phase: this step checks no layers in turn; expected None, "
                                                  f"got {shown(phase, 40)}")
            return None
        return as_int("phase", phase, 0, self.phases - 1)

    def _checked_layers(self, phase) -> range:
        return self.buffers.verify.checked_layers(self._phase(phase)) if self.phases else range(0)

    def _checked_decode(self, layer: int) -> PreparedLaunch:
        """Layer ``layer``'s decode with the verify variant (every sealed block it reads
        checked against the head digests), made at first use."""
        found = self._checked.get(layer)
        if found is None:
            found = self._checked[layer] = self._layer_decode(layer, self.buffers.verify.decode_verify)
        return found

    def _layer_decode(self, layer: int, verify=None) -> PreparedLaunch:
        """Layer ``layer``'s prepared decode over the buffers (the verify variant with a
        ``DecodeVerify``)."""
        scale, options, workspace = self._decode_args
        b = self.buffers
        launch, _ = decode_launch(b.q[layer], self.store, layer, self.block_tables, b.rows["seq_lens"],
                                  b.rows["tail_slots"], b.out[layer], scale, self.max_seq_len, options, workspace,
                                  verify, prepared=True)
        return prepare_decode(launch, options)

    @staticmethod
    def _rows(name: str, value, high: int) -> int | None:
        # None, or an int in [0, high]
        return None if value is None else as_int(name, value, 0, high)

    def enqueue(self, layer: int, stream=0, phase: int | None = None) -> None:
        """Enqueue one layer's part of the step: append its new K/V, seal, decode.

        For an engine that captures hexcore inside its own model graph: call it once per
        layer after writing ``buffers.k[layer]``, ``buffers.v[layer]`` and
        ``buffers.q[layer]``; the output lands in ``buffers.out[layer]``. With a verifying
        graph, layer 0 also runs the verification (of all layers) and the last layer,
        after its seal, the record of the sealed blocks' digests (and head digests); a
        layer ``phase`` checks records its own seals' head digests before its decode (the
        verify variant). Capture-safe once a layer has run in that phase: its first call
        prepares (and loads) its kernels, so run a step eagerly before capturing, as every
        CUDA graph capture needs.
        """
        layer = checked_layer(layer, len(self._decode))[0]
        checked = layer in self._checked_layers(phase)
        launches = self._layers.get(layer)
        if launches is None:
            rows, b = self.buffers.rows, self.buffers
            launches = self._layers[layer] = [
                prepare_append(self.store, b.k[layer], b.v[layer], rows["tail_slots"], rows["positions"], layer),
                b.seal(b.bucket, layer)]
            if layer == len(self._decode) - 1:  # every layer of the seals is sealed by now
                launches += [launch for launch in (self._record, self._heads) if launch is not None]
            if layer == 0 and self._verify is not None:
                launches.append(self._verify)
        for launch in launches:
            launch.run(stream)
        if checked:
            if layer != len(self._decode) - 1:
                self.buffers.head_record_launch(self.buffers.bucket, layer).run(stream)
            self._checked_decode(layer).run(stream)
        else:
            self._decode[layer].run(stream)


class PhaseStep:
    """A :class:`DecodeStep` bound to one phase of whole-layer checking, an int in [0,
    ``step.phases``) (HexcoreInvalidArgumentError otherwise, or for a step that checks no
    layers in turn): ``key`` is ``(bucket, max_seq_len, phase)``; ``enqueue(layer,
    stream)`` and ``enqueue_all(stream, num_seals, num_verify)`` are the step's with that
    phase; ``buffers``, ``width`` and ``block_tables`` are the step's."""

    def __init__(self, step: DecodeStep, phase: int):
        if not isinstance(step, DecodeStep):
            raise HexcoreInvalidArgumentError(f"step: expected a DecodeStep, got {type(step).__name__}")
        if not step.phases:
            raise HexcoreInvalidArgumentError("step: checks no layers in turn; a PhaseStep binds a phase of a step "
                                              "that does (verify_layers > 0)")
        phase = step._phase(phase)
        self.step, self.phase = step, phase
        self.key = (*step.key, phase)
        self.buffers, self.width, self.block_tables = step.buffers, step.width, step.block_tables

    def enqueue_all(self, stream=0, num_seals: int | None = None, num_verify: int | None = None) -> None:
        """``DecodeStep.enqueue_all`` with this phase."""
        self.step.enqueue_all(stream, num_seals, num_verify, self.phase)

    def enqueue(self, layer: int, stream=0) -> None:
        """``DecodeStep.enqueue`` with this phase."""
        self.step.enqueue(layer, stream, self.phase)
