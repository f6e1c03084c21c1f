"""PagedKVCache: the block manager. Free stack, reference counts, block tables, tails.

A sequence of length ``n`` holds ``n // block_size`` sealed blocks (its block table)
and ``n % block_size`` tokens in its open tail. **A sequence id is also its tail
slot**: ids are slots in ``[0, max_seqs)``, and the device side keeps sequence
``s``'s tail at tail slot ``s``. State lives in numpy arrays; the logic is one njit
call per public method (``_blocks.py``); this class validates and raises.
"""

from __future__ import annotations

from time import perf_counter_ns

import numpy as np

from ..config import KVCacheConfig
from ..errors import HexcoreInvalidArgumentError, Status
from . import _blocks as core
from ._accessors import CacheAccessors
from ._event_ops import ALLOCATED, FORKED, FREED
from ._step import OUT_LEN, OUT_STATUS, OUT_TAIL, StepResult, new_outputs, step
from ._validation import as_index, check_ids

_STATUSES = tuple(Status)
_NO_BLOCKS = np.empty(0, np.int32)
_NO_BLOCKS.flags.writeable = False
DEFAULT_MAX_SEQ_LEN = 131072


def _frozen(view: np.ndarray) -> np.ndarray:
    view.flags.writeable = False
    return view


class PagedKVCache(CacheAccessors):
    """Block manager of a paged KV cache: sequences, their sealed blocks and tails.

    ``num_blocks`` sealed blocks and ``max_seqs`` sequence slots (= tail slots);
    ``max_seq_len`` (rounded up to a multiple of ``block_size``; default
    ``min(131072, num_blocks * block_size)``) sizes the block tables
    ``[max_seqs, max_seq_len // block_size]``. With ``metrics=None`` no timing is done.
    Not thread-safe: one thread drives a cache (the MetricsCollector is thread-safe).
    """

    def __init__(self, config: KVCacheConfig, num_blocks: int, max_seqs: int, metrics=None,
                 *, max_seq_len: int | None = None):
        if not isinstance(config, KVCacheConfig):
            raise HexcoreInvalidArgumentError(f"config: expected KVCacheConfig, got {type(config).__name__}")
        bs = config.block_size
        num_blocks = as_index("num_blocks", num_blocks, low=1, high=2**31 - 1)
        max_seqs = as_index("max_seqs", max_seqs, low=1, high=2**31 - 1)
        if max_seq_len is None:
            max_seq_len = min(DEFAULT_MAX_SEQ_LEN, num_blocks * bs)
        max_seq_len = as_index("max_seq_len", max_seq_len, low=1, high=2**31 - bs)
        self.config, self.block_size, self.num_blocks, self.max_seqs = config, bs, num_blocks, max_seqs
        self.max_blocks_per_seq = -(-max_seq_len // bs)
        self.max_seq_len = self.max_blocks_per_seq * bs
        # state arrays, their mappings documented in _blocks.py and _step.py
        self._blocks, self._seqs, self._tables, self._counters = core.new_state(
            num_blocks, max_seqs, self.max_blocks_per_seq)
        self._out_rows, self._out_tables, self._sealed = new_outputs(
            num_blocks, max_seqs, self.max_blocks_per_seq)
        self._views: dict[int, tuple] = {}  # batch size -> read-only output views
        self._no_lens = np.zeros(0, np.int32)
        self._metrics = metrics
        self._events = None  # an events.EventPublisher while an event ring is attached
        if metrics is not None:
            active, free, reserved, sequences, _ = self._gauges()
            metrics.set_gauges(active_blocks=active, free_blocks=free, reserved_blocks=reserved,
                               sequences=sequences, num_blocks=num_blocks)

    # -- sequences ------------------------------------------------------------------
    def add_sequence(self, seq_id: int | None = None) -> int:
        """Start an empty sequence in slot ``seq_id`` (default: the next free slot); its id."""
        t0 = 0 if self._metrics is None else perf_counter_ns()
        sid = -1 if seq_id is None else self._slot("seq_id", seq_id)
        status, sid = core.add_sequence(self._seqs, self._counters, sid)
        if status:
            self._fail(status, "add", None if seq_id is None else sid)
        if self._events is not None:
            self._events.one(ALLOCATED, sid, 0, -1)
        if t0:
            self._record("add_sequence", t0)
        return sid

    def free_sequence(self, seq_id: int) -> None:
        """Release ``seq_id``'s tail and reserved block; drop one reference from each block."""
        t0 = 0 if self._metrics is None else perf_counter_ns()
        if type(seq_id) is not int or not -(2**62) < seq_id < 2**62:
            seq_id = as_index("seq_id", seq_id)
        status, freed = core.free_sequence(self._blocks, self._seqs, self._counters, self._tables,
                                           seq_id, self.block_size)
        if status:
            self._fail(status, "free", seq_id)
        if self._events is not None:
            self._events.one(FREED, seq_id, 0, -1)
        if t0:
            self._record("free_sequence", t0, freed=freed)

    def fork_sequence(self, parent: int, child: int | None = None) -> int:
        """New sequence sharing ``parent``'s sealed blocks; returns the child id.

        The device side must copy tail slot ``parent`` to tail slot ``child`` (the
        returned id): tails are private, sealed blocks are shared by reference count.
        """
        t0 = 0 if self._metrics is None else perf_counter_ns()
        parent = as_index("parent", parent)
        cid = -1 if child is None else self._slot("child", child)
        status, cid = core.fork_sequence(self._blocks, self._seqs, self._counters, self._tables,
                                         parent, cid, self.block_size)
        if status:
            if not core._is_live(self._seqs, parent):
                self._fail(status, "fork", parent)
            self._fail(status, "add", None if child is None else cid)
        if self._events is not None:
            self._events.one(FORKED, cid, parent, -1)
        if t0:
            self._record("fork_sequence", t0)
        return cid

    # -- growth ---------------------------------------------------------------------
    def grow_sequence(self, seq_id: int, new_len: int) -> np.ndarray:
        """Grow ``seq_id`` to ``new_len`` tokens; returns the block ids it sealed.

        The result (int32, read-only view, valid until the sequence is freed) holds
        the blocks of logical indices ``old_len // block_size`` onward. Raises
        ``HexcoreOOMError`` or ``HexcoreInvalidSequenceError``; a failure changes nothing.
        """
        t0 = 0 if self._metrics is None else perf_counter_ns()
        if type(seq_id) is not int or type(new_len) is not int:
            seq_id, new_len = as_index("seq_id", seq_id), as_index("new_len", new_len)
        try:
            status, first, hits, misses = core.grow_sequence(
                self._blocks, self._seqs, self._counters, self._tables, seq_id, new_len, self.block_size)
        except OverflowError:  # an int past int64: out of every range
            status, first, hits, misses = Status.INVALID_SEQUENCE, 0, 0, 0
        if status:
            if t0:
                self._record("grow_sequence", t0, oom=int(status == Status.OUT_OF_MEMORY))
            self._fail(status, "grow", seq_id, new_len)
        if t0:
            self._record("grow_sequence", t0, hits=hits, misses=misses)
        if hits + misses == 0:
            return _NO_BLOCKS
        sealed = self._tables[seq_id, first:first + hits + misses]
        if self._events is not None:
            self._events.run(seq_id, first, sealed)
        return _frozen(sealed)

    def try_grow_sequence(self, seq_id: int, new_len: int) -> Status:
        """:meth:`grow_sequence` that returns a :class:`Status` instead of raising.

        Sealed blocks are then ``block_table(seq_id)[old_len // block_size:]``.
        """
        t0 = 0 if self._metrics is None else perf_counter_ns()
        if type(seq_id) is not int or type(new_len) is not int:
            try:
                seq_id, new_len = as_index("seq_id", seq_id), as_index("new_len", new_len)
            except HexcoreInvalidArgumentError:
                return Status.INVALID_ARGUMENT
        try:
            status, first, hits, misses = core.grow_sequence(
                self._blocks, self._seqs, self._counters, self._tables, seq_id, new_len, self.block_size)
        except OverflowError:  # an int past int64: out of every range
            return Status.INVALID_SEQUENCE
        if hits + misses and self._events is not None:
            self._events.run(seq_id, first, self._tables[seq_id, first:first + hits + misses])
        if t0:
            self._record("try_grow_sequence", t0, hits=hits, misses=misses,
                         oom=int(status == Status.OUT_OF_MEMORY))
        return _STATUSES[status]

    def step(self, seq_ids: np.ndarray, new_lens: np.ndarray | None = None) -> StepResult:
        """A whole decode (or prefill) step in one njit call; see :class:`StepResult`.

        Parameters
        ----------
        seq_ids : [B] int32, C-contiguous, B <= max_seqs -- sequences to grow.
        new_lens : [B] int32 or None -- their new lengths; None grows each by one token.

        Entries succeed or fail one by one (statuses; a sequence listed twice fails
        with INVALID_ARGUMENT). Malformed arrays raise ``HexcoreInvalidArgumentError``.
        """
        t0 = 0 if self._metrics is None else perf_counter_ns()
        check_ids("seq_ids", seq_ids, self.max_seqs)
        if new_lens is None:
            lens, increment = self._no_lens, True
        else:
            check_ids("new_lens", new_lens, self.max_seqs, like=seq_ids)
            lens, increment = new_lens, False
        num_sealed, num_failed, hits, misses, ooms = step(
            self._blocks, self._seqs, self._counters, self._tables, seq_ids, lens, increment,
            self.block_size, self._out_rows, self._out_tables, self._sealed)
        views = self._views.get(len(seq_ids)) or self._make_views(len(seq_ids))
        if num_sealed == 0:
            sealed = views[4]
        else:
            sealed = self._sealed[:num_sealed]
            if self._events is not None:
                self._events.sealed(sealed)
        if t0:
            self._record("step", t0, hits=hits, misses=misses, oom=ooms)
        return StepResult(views[0], sealed, views[1], views[2], views[3], num_failed)

    # -- speculative prefetch (issue 6 drives it) -------------------------------------
    def reserve_blocks(self, seq_ids: np.ndarray) -> np.ndarray:
        """Park one free block in each sequence's prefetched slot for its next seal.

        Parameters
        ----------
        seq_ids : [B] int32, C-contiguous -- live sequences (else nothing changes and
            ``HexcoreInvalidSequenceError`` is raised).

        Returns [B] int32: each sequence's reserved block, -1 where the pool ran out.
        """
        t0 = 0 if self._metrics is None else perf_counter_ns()
        check_ids("seq_ids", seq_ids, None)
        out = np.empty(len(seq_ids), np.int32)
        bad, reserved = core.reserve_blocks(self._blocks, self._seqs, self._counters, seq_ids, out)
        if bad >= 0:
            self._fail(Status.INVALID_SEQUENCE, "reserve", int(seq_ids[bad]))
        if t0:
            self._record("reserve_blocks", t0, allocated=reserved)
        return out

    def release_reserved(self, seq_ids: np.ndarray) -> int:
        """Return the sequences' reserved blocks to the pool; the number released.

        Parameters
        ----------
        seq_ids : [B] int32, C-contiguous -- live sequences.
        """
        t0 = 0 if self._metrics is None else perf_counter_ns()
        check_ids("seq_ids", seq_ids, None)
        bad, released = core.release_reserved(self._blocks, self._seqs, self._counters, seq_ids)
        if bad >= 0:
            self._fail(Status.INVALID_SEQUENCE, "release", int(seq_ids[bad]))
        if t0:
            self._record("release_reserved", t0, freed=released)
        return released

    # -- block events (hexcore.host.events) ------------------------------------------
    def attach_event_ring(self, ring) -> None:
        """Publish block events into ``ring`` (see ``hexcore.host.events``); None detaches.

        ``ring``: a LockFreeRingBuffer of record_width 4 read by a BlockTableMirror. The
        current tables are published first, so a late mirror starts consistent.
        """
        from .events import EventPublisher, replay_records

        if ring is None:
            self._events = None
            return
        publisher = EventPublisher(ring)
        publisher.records(replay_records(self._tables, self._seqs[core.LEN], self.block_size))
        self._events = publisher

    def flush_events(self, timeout: float | None = 0.0) -> int:
        """Push events staged while the ring was full, waiting up to ``timeout`` s; events left."""
        return 0 if self._events is None else self._events.flush(timeout)

    # -- internals --------------------------------------------------------------------
    def _make_views(self, batch: int) -> tuple:
        rows = self._out_rows
        # block_tables is read-only: its rows are reused, incrementally, by the next step
        views = (rows[OUT_STATUS, :batch], _frozen(self._out_tables[:batch]),
                 rows[OUT_LEN, :batch], rows[OUT_TAIL, :batch], self._sealed[:0])
        self._views[batch] = views
        return views

    def _gauges(self) -> tuple:
        # (active, free, reserved, sequences, num_blocks): MetricsCollector's GAUGES order
        num_free, num_free_seqs, num_live, num_reserved = self._counters.tolist()
        return (num_live, num_free, num_reserved, self.max_seqs - num_free_seqs, self.num_blocks)

    def _record(self, op, t0, *, freed=0, hits=0, misses=0, oom=0, allocated=0):
        latency = perf_counter_ns() - t0
        self._metrics.record(op, latency, (allocated + misses, freed, hits + misses, oom, hits, misses),
                             self._gauges())
