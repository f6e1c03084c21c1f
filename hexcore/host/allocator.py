"""PagedKVCache: the block manager. Free stack, reference counts, block tables, tails.

A sequence of length ``n`` holds ``n // block_size`` sealed blocks (its block table)
and ``n % block_size`` tokens in its open tail. **A sequence id is also its tail
slot**: ids are slots in ``[0, max_seqs)``, and the device side keeps sequence
``s``'s tail at tail slot ``s``. State lives in numpy arrays; the logic is one njit
call per public method (``_blocks.py``); this class validates and raises.

Arguments follow the integer rule of ``hexcore._checks``: an int argument is a
Python int or a numpy integer, anything else (bools included) raises
``HexcoreInvalidArgumentError``. A sequence id that names no live sequence -- one out
of ``[0, max_seqs)`` included -- is a *sequence* error, as in a batch ``step``:
``HexcoreInvalidSequenceError`` (``Status.INVALID_SEQUENCE`` from ``try_*``), whose
message names the argument (``"parent: expected an int in [0, 63], got -1"``,
``"seq_id: sequence 3 is not live"``). A failed call changes nothing.

With ``prefix_cache=True`` sealed blocks are also cached by their token ids and
shared with later requests (``prefix.py``: :meth:`PagedKVCache.admit`, the ``tokens``
arguments of growth and steps, pins, eviction); the calls then run the njit core of
``_prefix.py``, and with it off they run exactly the code they ran before it existed.

A sequence shrinks with :meth:`PagedKVCache.truncate_sequence` (a rollback, e.g. of rejected
draft tokens): inside its open tail, or to a block boundary, never into a sealed block.

A block found corrupted can be quarantined (``quarantine.py``: :meth:`PagedKVCache.quarantine_block`,
the read methods and table edit ``hexcore.fault`` migrates with); a quarantined block is never
handed out again, and the decode step, which only pops the free stack, never checks for one.
"""

from __future__ import annotations

from time import perf_counter_ns

import numpy as np

from .._checks import INT_LIMIT, as_int, int_value, range_message
from ..config import KVCacheConfig
from ..errors import (HexcoreConfigError, HexcoreInvalidArgumentError, HexcoreInvalidSequenceError, HexcoreOOMError,
                      Status, raise_for_status)
from . import _blocks as core
from . import _prefix as pcore
from ._event_ops import ALLOCATED, FORKED, FREED
from ._step import OUT_LEN, OUT_STATUS, OUT_TAIL, ROW_SEQ, StepResult, check_step, new_outputs, step
from ._validation import (check_counts, check_ids, check_predictions, check_state_size, check_step_tokens,
                          check_truncation, describe_seq_error, state_bytes, verify_state)
from .metrics import as_collector
from .prefix import (DEFAULT_PRIORITY, Admission, PrefixCacheMethods, PrefixState, as_tokens, check_namespace,
                     check_priority)
from ._table_edits import remove_entry
from .quarantine import BlockState, QuarantineMethods
from .ring import LockFreeRingBuffer, check_timeout

__all__ = ["Admission", "BlockState", "PagedKVCache", "StepResult", "PREDICTION_OUTCOMES", "DEFAULT_MAX_SEQ_LEN"]

# The order of reserve_predictions' counts: [outcome] -> predictions (core.PREDICTION_* indices)
PREDICTION_OUTCOMES = ("reserved", "stale", "duplicate", "unfilled")
DEFAULT_MAX_SEQ_LEN = 131072
_STATUSES = tuple(Status)
_NO_BLOCKS = np.empty(0, np.int32)
_NO_BLOCKS.flags.writeable = False
_NO_TOKENS = np.empty(0, np.int32)
_NO_TOKENS.flags.writeable = False
_MAX_I32 = 2**31 - 1
_I64 = np.dtype(np.int64)
_COUNTS_SHAPE = (len(PREDICTION_OUTCOMES),)


def _frozen(view: np.ndarray) -> np.ndarray:
    view.flags.writeable = False
    return view


def _reraise_unless_beyond_limit(*values: int) -> None:
    # The hot paths hand Python ints to njit unchecked: one past int64 makes numba raise
    # (OverflowError, or a TypingError before the first compile). Such an int is out of
    # every range -- the caller reports INVALID_SEQUENCE; any other error propagates.
    if all(-INT_LIMIT <= v < INT_LIMIT for v in values):
        raise


class PagedKVCache(PrefixCacheMethods, QuarantineMethods):
    """Block manager of a paged KV cache: sequences, their sealed blocks and tails.

    ``num_blocks`` sealed blocks and ``max_seqs`` sequence slots (= tail slots);
    ``max_seq_len`` (rounded up to a multiple of ``block_size``; default
    ``min(131072, num_blocks * block_size)``) sizes the block tables
    ``[max_seqs, max_seq_len // block_size]``. With ``metrics=None`` no timing is done.
    ``prefix_cache=True`` caches sealed blocks by their token ids (``hexcore.host.prefix``;
    it costs ``num_blocks * (64 + 4 * block_size)`` bytes, plus a key index of 32 bytes
    a block or so). Quarantined blocks (:meth:`quarantine_block`) are never handed out
    again. Not thread-safe: one thread drives a cache (the MetricsCollector is thread-safe).
    """

    def __init__(self, config: KVCacheConfig, num_blocks: int, max_seqs: int, metrics=None,
                 *, max_seq_len: int | None = None, prefix_cache: bool = False):
        if not isinstance(config, KVCacheConfig):
            raise HexcoreInvalidArgumentError(f"config: expected KVCacheConfig, got {type(config).__name__}")
        bs = config.block_size
        num_blocks = as_int("num_blocks", num_blocks, low=1, high=_MAX_I32)
        max_seqs = as_int("max_seqs", max_seqs, low=1, high=_MAX_I32)
        if max_seq_len is None:
            max_seq_len = min(DEFAULT_MAX_SEQ_LEN, num_blocks * bs)
        max_seq_len = as_int("max_seq_len", max_seq_len, low=1, high=_MAX_I32 + 1 - bs)
        if type(prefix_cache) is not bool:
            raise HexcoreInvalidArgumentError(f"prefix_cache: expected a bool, got {type(prefix_cache).__name__}")
        metrics = as_collector("metrics", metrics)
        check_state_size(num_blocks, max_seqs, -(-max_seq_len // bs), bs, prefix_cache)
        self.config, self.block_size, self.num_blocks, self.max_seqs = config, bs, num_blocks, max_seqs
        self.max_blocks_per_seq = -(-max_seq_len // bs)
        self.max_seq_len = self.max_blocks_per_seq * bs
        # state arrays, their mappings documented in _blocks.py and _step.py
        try:
            self._blocks, self._seqs, self._tables, self._counters = core.new_state(
                num_blocks, max_seqs, self.max_blocks_per_seq)
            self._out_rows, self._out_tables, self._seals = new_outputs(
                num_blocks, max_seqs, self.max_blocks_per_seq)
            # the prefix cache's arrays (_prefix.py), None when it is off
            self._prefix = (PrefixState(config, num_blocks, max_seqs, self.max_blocks_per_seq) if prefix_cache
                            else None)
        except MemoryError:  # within physical memory (checked above), but not free now
            need = state_bytes(num_blocks, max_seqs, self.max_blocks_per_seq, bs, prefix_cache)
            raise HexcoreOOMError(f"PagedKVCache: no free host memory for its {need} bytes of state") from None
        self._views: dict[int, tuple] = {}  # batch size -> read-only output views
        self._no_lens = np.zeros(0, np.int32)
        self._prediction_counts = np.zeros(len(PREDICTION_OUTCOMES), np.int64)  # when none are asked for
        self._ring_scratch = np.empty((1024, 2), np.int64)  # [row] -> a prediction popped from a ring
        self._metrics = metrics
        self._events = None  # an events.EventPublisher while an event ring is attached
        self._prefix_seen = [0, 0, 0]  # prefix (queries, hits, evictions) already recorded in metrics
        if metrics is not None:
            active, free, reserved, sequences, _, cached, quarantined = self._gauges()
            metrics.set_gauges(active_blocks=active, free_blocks=free, reserved_blocks=reserved,
                               sequences=sequences, num_blocks=num_blocks, cached_blocks=cached,
                               quarantined_blocks=quarantined)

    # -- sequences ------------------------------------------------------------------
    def add_sequence(self, seq_id: int | None = None, *, namespace: int = 0,
                     priority: int = DEFAULT_PRIORITY) -> int:
        """Start an empty sequence in slot ``seq_id`` (default: the next free slot); its id.

        With the prefix cache on, the sequence is tracked (its blocks are indexed as it
        seals them, while its token ids are given) in ``namespace`` (int in [0, 2**62))
        at eviction ``priority`` (int in [0, 7]); see :meth:`admit` to reuse a cached
        prefix. With it off both are checked and unused.
        """
        t0 = 0 if self._metrics is None else perf_counter_ns()
        sid = -1 if seq_id is None else self._slot("seq_id", seq_id)
        prefix = self._prefix
        if type(namespace) is not int or type(priority) is not int or namespace or priority != DEFAULT_PRIORITY:
            namespace, priority = check_namespace(namespace), check_priority(priority)  # (else the defaults)
        if prefix is None:
            status, sid = core.add_sequence(self._seqs, self._counters, sid)
        else:
            status, sid = pcore.add(self._seqs, self._counters, prefix.pseqs, prefix.pc, sid, namespace, priority)
        if status:
            self._fail(status, "add", "seq_id", None if seq_id is None else sid)
        if self._events is not None:
            self._events.one(ALLOCATED, sid, 0, -1)
        if t0:
            self._record("add_sequence", t0)
        return sid

    def free_sequence(self, seq_id: int) -> None:
        """Release ``seq_id``'s tail and reserved block; drop one reference from each block.

        With the prefix cache on, an indexed block whose last reference goes stays
        cached (evictable) instead of going back to the free stack.
        """
        t0 = 0 if self._metrics is None else perf_counter_ns()
        if type(seq_id) is not int:
            seq_id = int_value("seq_id", seq_id)
        try:
            if self._prefix is None:
                status, freed = core.free_sequence(self._blocks, self._seqs, self._counters, self._tables,
                                                   seq_id, self.block_size)
            else:
                status, freed = pcore.free(self._blocks, self._seqs, self._counters, self._tables,
                                           self._prefix.pblocks, self._prefix.pc, seq_id, self.block_size)
        except Exception:
            _reraise_unless_beyond_limit(seq_id)
            status, freed = Status.INVALID_SEQUENCE, 0
        if status:
            self._fail(status, "free", "seq_id", seq_id)
        if self._events is not None:
            self._events.one(FREED, seq_id, 0, -1)
        if t0:
            self._record("free_sequence", t0, freed=freed)

    def fork_sequence(self, parent: int, child: int | None = None) -> int:
        """New sequence sharing ``parent``'s sealed blocks; returns the child id.

        The device side must copy tail slot ``parent`` to tail slot ``child`` (the
        returned id): tails are private, sealed blocks are shared by reference count.
        With the prefix cache on, the child inherits the parent's tracking, namespace,
        priority and tail token ids.
        """
        t0 = 0 if self._metrics is None else perf_counter_ns()
        parent = self._live("parent", parent)
        cid = -1 if child is None else self._slot("child", child)
        if self._prefix is None:
            status, cid = core.fork_sequence(self._blocks, self._seqs, self._counters, self._tables,
                                             parent, cid, self.block_size)
        else:
            status, cid = pcore.fork(self._blocks, self._seqs, self._counters, self._tables, self._prefix.pseqs,
                                     self._prefix.ptok, parent, cid, self.block_size)
        if status:
            self._fail(status, "add", "child", None if child is None else cid)
        if self._events is not None:
            self._events.one(FORKED, cid, parent, -1)
        if t0:
            self._record("fork_sequence", t0)
        return cid

    # -- growth ---------------------------------------------------------------------
    def grow_sequence(self, seq_id: int, new_len: int, tokens=None) -> np.ndarray:
        """Grow ``seq_id`` to ``new_len`` tokens; returns the block ids it sealed.

        The result (int32, read-only view, valid until the sequence is freed) holds
        the blocks of logical indices ``old_len // block_size`` onward. ``tokens``:
        the new token ids, int32 [new_len - old_len] (lists and other int arrays are
        converted), so the prefix cache indexes the blocks sealed; without them a
        tracked sequence stops being tracked (with the cache off they are checked and
        unused). Raises ``HexcoreOOMError``, ``HexcoreInvalidSequenceError`` or
        ``HexcoreInvalidArgumentError`` (tokens of the wrong length); a failure changes nothing.
        """
        if tokens is not None or self._prefix is not None:
            return self._grow_with_tokens(seq_id, new_len, tokens)
        # the prefix-cache-off path: the code it ran before the prefix cache existed
        t0 = 0 if self._metrics is None else perf_counter_ns()
        if type(seq_id) is not int or type(new_len) is not int:
            seq_id, new_len = int_value("seq_id", seq_id), int_value("new_len", new_len)
        try:
            status, first, hits, misses = core.grow_sequence(
                self._blocks, self._seqs, self._counters, self._tables, seq_id, new_len, self.block_size)
        except Exception:
            _reraise_unless_beyond_limit(seq_id, new_len)
            status, first, hits, misses = Status.INVALID_SEQUENCE, 0, 0, 0
        if status:
            if t0:
                self._record("grow_sequence", t0, oom=int(status == Status.OUT_OF_MEMORY))
            self._fail(status, "grow", "seq_id", seq_id, new_len)
        if t0:
            self._record("grow_sequence", t0, hits=hits, misses=misses)
        if hits + misses == 0:
            return _NO_BLOCKS
        sealed = self._tables[seq_id, first:first + hits + misses]
        if self._events is not None:
            self._events.run(seq_id, first, sealed)
        return _frozen(sealed)

    def try_grow_sequence(self, seq_id: int, new_len: int, tokens=None) -> Status:
        """:meth:`grow_sequence` that returns a :class:`Status` instead of raising.

        INVALID_ARGUMENT for a non-int argument, or bad ``tokens``. Sealed blocks are then
        ``block_table(seq_id)[old_len // block_size:]``.
        """
        if tokens is not None or self._prefix is not None:
            return self._grow_with_tokens(seq_id, new_len, tokens, raising=False)
        t0 = 0 if self._metrics is None else perf_counter_ns()
        if type(seq_id) is not int or type(new_len) is not int:
            try:
                seq_id, new_len = int_value("seq_id", seq_id), int_value("new_len", new_len)
            except HexcoreInvalidArgumentError:
                return Status.INVALID_ARGUMENT
        try:
            status, first, hits, misses = core.grow_sequence(
                self._blocks, self._seqs, self._counters, self._tables, seq_id, new_len, self.block_size)
        except Exception:
            _reraise_unless_beyond_limit(seq_id, new_len)
            return Status.INVALID_SEQUENCE
        if hits + misses and self._events is not None:
            self._events.run(seq_id, first, self._tables[seq_id, first:first + hits + misses])
        if t0:
            self._record("try_grow_sequence", t0, hits=hits, misses=misses,
                         oom=int(status == Status.OUT_OF_MEMORY))
        return _STATUSES[status]

    def truncate_sequence(self, seq_id: int, new_len: int) -> int:
        """Shrink ``seq_id`` to ``new_len`` tokens (a rollback); returns the sealed blocks it dropped.

        ``new_len`` inside the open tail (``>= seq_len // block_size * block_size``) changes
        only the length; on a block boundary (a multiple of ``block_size``) the references
        to the later sealed blocks go as in :meth:`free_sequence` (shared blocks keep their
        other references; indexed ones stay cached, quarantined ones out of the pool) and
        the tail is empty. A reserved block stays reserved. With the prefix cache on, a
        tracked sequence stays tracked (its hash state rolls back to the blocks it keeps).

        On the device nothing moves: the tail slot's rows past the new length are stale
        but never read (decode reads ``seq_len`` rows) and the next append overwrites them.

        Raises HexcoreInvalidSequenceError (not live), HexcoreInvalidArgumentError
        (``new_len`` not an int, outside ``[0, seq_len]``, or inside a sealed block that it
        does not end), HexcoreConfigError (sealed blocks would go while an event ring is
        attached: a mirror follows seals, not rollbacks); a failed call changes nothing.
        """
        t0 = 0 if self._metrics is None else perf_counter_ns()
        seq_id = self._live("seq_id", seq_id)
        new_len = as_int("new_len", new_len)
        old_len, bs = int(self._seqs[core.LEN, seq_id]), self.block_size
        check_truncation(seq_id, old_len, new_len, bs)
        dropped = old_len // bs - new_len // bs
        if dropped and self._events is not None:
            raise HexcoreConfigError(f"new_len: {new_len} would drop {dropped} sealed blocks of sequence {seq_id} "
                                     f"while an event ring is attached (a mirror cannot follow it; detach it first)")
        if self._prefix is None:
            status, released = core.truncate_sequence(self._blocks, self._seqs, self._counters, self._tables, seq_id,
                                                      new_len, bs)
        else:
            p = self._prefix
            status, released = pcore.truncate(self._blocks, self._seqs, self._counters, self._tables, p.pblocks,
                                              p.ptok, p.pseqs, p.pc, seq_id, new_len, bs)
        assert status == Status.OK, status  # checked above
        if dropped:  # a step's output row copies only blocks sealed since: rewrite this sequence's whole
            self._out_rows[ROW_SEQ, self._out_rows[ROW_SEQ] == seq_id] = -1
        if t0:
            self._record("truncate_sequence", t0, freed=released)
        return dropped

    def remove_block(self, seq_id: int, index: int) -> bool:
        """Take sealed block ``index`` (its logical index) out of ``seq_id``'s table: the
        later blocks move down one place and the sequence is ``block_size`` tokens shorter
        (its tail untouched). The sequence's reference to the block goes as in a free;
        True if that was the last one (the block is free again). For block managers that
        move a block to another pool (``hexcore.host.tiered``).

        Raises HexcoreInvalidSequenceError (not live), HexcoreInvalidArgumentError
        (``index`` not an int in ``[0, sealed blocks)``), HexcoreConfigError (the prefix
        cache is on, or an event ring is attached: neither follows such an edit); a
        failed call changes nothing.
        """
        t0 = self._clock()
        seq_id = self._live("seq_id", seq_id)
        sealed = int(self._seqs[core.LEN, seq_id]) // self.block_size
        if sealed == 0:
            raise HexcoreInvalidArgumentError(f"index: sequence {seq_id} holds no sealed block")
        index = as_int("index", index, low=0, high=sealed - 1)
        if self._prefix is not None or self._events is not None:
            raise HexcoreConfigError("remove_block: not with the prefix cache on or an event ring attached "
                                     "(neither follows a block taken out of a table)")
        freed = remove_entry(self, seq_id, index)
        if t0:
            self._record("remove_block", t0, freed=freed)
        return bool(freed)

    def step(self, seq_ids: np.ndarray, new_lens: np.ndarray | None = None, tokens: np.ndarray | None = None,
             token_starts: np.ndarray | None = None) -> StepResult:
        """A whole decode (or prefill) step in one njit call; see :class:`StepResult`.

        Parameters
        ----------
        seq_ids : [B] int32, C-contiguous, B <= max_seqs -- sequences to grow.
        new_lens : [B] int32 or None -- their new lengths; None grows each by one token.
        tokens : int32, C-contiguous, or None -- the new token ids, for the prefix cache:
            [B] (one per entry) when ``new_lens`` is None; else [T], entry ``i``'s
            ``new_lens[i] - old length`` ids at ``tokens[token_starts[i]:token_starts[i + 1]]``
            (a span of another length fails that entry with INVALID_ARGUMENT). Without
            tokens the sequences that grow stop being tracked. With the cache off their
            dtype and shape are checked, and they are unused.
        token_starts : [B + 1] int32, C-contiguous, or None -- with ``new_lens`` and
            ``tokens`` only: where each entry's tokens start (cumulative, like cu_seqlens).

        Entries succeed or fail one by one (statuses; a sequence listed twice fails
        with INVALID_ARGUMENT). Malformed arrays raise ``HexcoreInvalidArgumentError``.
        """
        if tokens is not None or token_starts is not None or self._prefix is not None:
            return self._step_with_tokens(seq_ids, new_lens, tokens, token_starts)
        # the prefix-cache-off path: the code it ran before the prefix cache existed
        t0 = 0 if self._metrics is None else perf_counter_ns()
        check_ids("seq_ids", seq_ids, self.max_seqs)
        if new_lens is None:
            lens, increment = self._no_lens, True
        else:
            check_ids("new_lens", new_lens, self.max_seqs, like=seq_ids)
            lens, increment = new_lens, False
        num_sealed, num_failed, hits, misses, ooms = step(
            self._blocks, self._seqs, self._counters, self._tables, seq_ids, lens, increment,
            self.block_size, self._out_rows, self._out_tables, self._seals)
        views = self._views.get(len(seq_ids)) or self._make_views(len(seq_ids))
        if num_sealed == 0:
            seals = views[4]
        else:
            seals = self._seals[:, :num_sealed]
            if self._events is not None:
                self._events.sealed(seals)
        if t0:
            self._record("step", t0, hits=hits, misses=misses, oom=ooms)
        return StepResult(views[0], seals, views[1], views[2], views[3], seq_ids, num_failed, num_sealed, hits)

    def can_step(self, seq_ids: np.ndarray) -> tuple:
        """Whether :meth:`step` would grow every one of ``seq_ids`` by one token, without
        changing anything: ``(Status, index of the first failing entry or -1)``.

        Parameters
        ----------
        seq_ids : [B] int32, C-contiguous -- the sequences of a decode step.
        """
        check_ids("seq_ids", seq_ids, self.max_seqs)
        evictable = 0 if self._prefix is None else self._prefix.pc[pcore.C_EVICTABLE]
        status, index = check_step(self._seqs, self._counters, self.max_seq_len, seq_ids, self.block_size,
                                   evictable)
        return Status(status), int(index)

    # -- speculative prefetch: reservations ----------------------------------------------
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
        prefix = self._prefix
        if prefix is None:
            bad, reserved = core.reserve_blocks(self._blocks, self._seqs, self._counters, seq_ids, out)
        else:  # a reservation may evict a cached block, as the seal it is for would
            bad, reserved = pcore.reserve_blocks(self._blocks, self._seqs, self._counters, prefix.pblocks,
                                                 prefix.index, prefix.pc, prefix.plog, seq_ids, out)
            self._publish_prefix_events()
        if bad >= 0:
            self._fail(Status.INVALID_SEQUENCE, "reserve", f"seq_ids[{bad}]", int(seq_ids[bad]))
        if t0:
            self._record("reserve_blocks", t0, allocated=reserved)
        return out

    def reserve_predictions(self, predictions, floor: int = 0, max_reserved: int | None = None,
                            counts: np.ndarray | None = None) -> int:
        """Park a free block for each sequence predicted to seal next; the number parked.

        Parameters
        ----------
        predictions : [n, 2] int64 rows (seq_id, generation), or a LockFreeRingBuffer
            of record_width 2 carrying such records, drained here (this thread is its
            consumer; at most ``capacity`` records per call). Generation -1 matches any
            (see :meth:`generation`). Rows never raise: a row whose sequence is not
            live, or lives in another generation, is *stale*.
        floor : int in [0, num_blocks] -- free blocks a reservation never takes (with
            the prefix cache on: available blocks, free or evictable).
        max_reserved : int in [0, max_seqs] or None -- cap on parked blocks (default max_seqs).
        counts : [4] int64 or None -- if given, incremented by the rows' outcomes in
            ``PREDICTION_OUTCOMES`` order: reserved, stale, duplicate (the sequence
            already holds a block), unfilled (``floor`` or ``max_reserved`` reached).
        """
        # (inline fast checks: an owner calls this before every step; the full ones raise)
        t0 = 0 if self._metrics is None else perf_counter_ns()
        if type(floor) is not int or not 0 <= floor <= self.num_blocks:
            floor = as_int("floor", floor, 0, self.num_blocks)
        if max_reserved is None:
            max_reserved = self.max_seqs
        elif type(max_reserved) is not int or not 0 <= max_reserved <= self.max_seqs:
            max_reserved = as_int("max_reserved", max_reserved, 0, self.max_seqs)
        if counts is None:
            counts = self._prediction_counts
        elif (type(counts) is not np.ndarray or counts.dtype is not _I64 or counts.shape != _COUNTS_SHAPE
              or not counts.flags.writeable):
            check_counts("counts", counts, len(PREDICTION_OUTCOMES))
        prefix = self._prefix
        if isinstance(predictions, LockFreeRingBuffer) and predictions.record_width == 2:
            if prefix is None:
                reserved = core.reserve_ring_predictions(self._blocks, self._seqs, self._counters,
                                                         predictions.buffer, self._ring_scratch, floor,
                                                         max_reserved, counts)
            else:
                reserved = pcore.reserve_ring_predictions(
                    self._blocks, self._seqs, self._counters, prefix.pblocks, prefix.index, prefix.pc, prefix.plog,
                    predictions.buffer, self._ring_scratch, floor, max_reserved, counts)
        else:
            if (type(predictions) is not np.ndarray or predictions.dtype is not _I64 or predictions.ndim != 2
                    or predictions.shape[1] != 2):
                check_predictions("predictions", predictions)
            if prefix is None:
                reserved = core.reserve_predictions(self._blocks, self._seqs, self._counters, predictions,
                                                    floor, max_reserved, counts)
            else:
                reserved = pcore.reserve_predictions(self._blocks, self._seqs, self._counters, prefix.pblocks,
                                                     prefix.index, prefix.pc, prefix.plog, predictions, floor,
                                                     max_reserved, counts)
        if prefix is not None:
            self._publish_prefix_events()
        if t0:
            self._record("reserve_predictions", t0, allocated=reserved)
        return reserved

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
            self._fail(Status.INVALID_SEQUENCE, "release", f"seq_ids[{bad}]", int(seq_ids[bad]))
        if t0:
            self._record("release_reserved", t0, freed=released)
        return released

    def release_all_reserved(self) -> int:
        """Return every reserved block to the pool (e.g. before retrying an OOM); the number released."""
        t0 = 0 if self._metrics is None else perf_counter_ns()
        released = core.release_all_reserved(self._blocks, self._seqs, self._counters)
        if t0:
            self._record("release_all_reserved", t0, freed=released)
        return released

    # -- block events (hexcore.host.events) ------------------------------------------
    def attach_event_ring(self, ring) -> None:
        """Publish block events into ``ring`` (see ``hexcore.host.events``); None detaches.

        ``ring``: a LockFreeRingBuffer of record_width 4 read by a BlockTableMirror. The
        current tables (and, with the prefix cache on, the indexed blocks, parents
        first) are published first, so a late mirror starts consistent.
        """
        from .events import EventPublisher, replay_records

        if ring is None:
            self._events = None
            if self._prefix is not None:
                self._prefix.plog = pcore.new_log(0, 0)
            return
        publisher = EventPublisher(ring)
        publisher.records(replay_records(self._tables, self._seqs[core.LEN], self.block_size, self._prefix))
        self._events = publisher
        if self._prefix is not None and not len(self._prefix.plog):  # the prefix calls log their events
            self._prefix.plog = pcore.new_log(self.num_blocks, self.max_blocks_per_seq)

    def flush_events(self, timeout: float | None = 0.0) -> int:
        """Push events staged while the ring was full, waiting up to ``timeout`` s; events left.

        ``timeout``: a finite number of seconds >= 0, or None to wait for room as long as
        it takes (``ring.check_timeout``; anything else raises HexcoreInvalidArgumentError)."""
        timeout = check_timeout("timeout", timeout)
        return 0 if self._events is None else self._events.flush(timeout)

    # -- queries ------------------------------------------------------------------------
    def block_table(self, seq_id: int) -> np.ndarray:
        """A copy of ``seq_id``'s sealed block ids, in logical order (int32 [n])."""
        seq_id = self._live("seq_id", seq_id)
        return self._tables[seq_id, : self._seqs[core.LEN, seq_id] // self.block_size].copy()

    def seq_len(self, seq_id: int) -> int:
        """Length of ``seq_id`` in tokens (sealed blocks plus tail)."""
        return int(self._seqs[core.LEN, self._live("seq_id", seq_id)])

    def seq_lens(self, seq_ids: np.ndarray) -> np.ndarray:
        """Lengths of many sequences in one call (int32 [B]), for per-step host logic.

        Parameters
        ----------
        seq_ids : [B] int32, C-contiguous -- live sequences (the first one that is not
            raises HexcoreInvalidSequenceError naming its index).
        """
        check_ids("seq_ids", seq_ids, None)
        inside = (seq_ids >= 0) & (seq_ids < self.max_seqs)
        lens = np.where(inside, self._seqs[core.LEN, np.where(inside, seq_ids, 0)], -1)
        dead = np.flatnonzero(lens < 0)
        if len(dead):
            self._fail(Status.INVALID_SEQUENCE, "use", f"seq_ids[{dead[0]}]", int(seq_ids[dead[0]]))
        return lens.astype(np.int32)

    def generation(self, seq_id: int) -> int:
        """``seq_id``'s generation: how many times its slot was freed (tags predictions)."""
        return int(self._seqs[core.GEN, self._live("seq_id", seq_id)])

    def prefetched_block(self, seq_id: int) -> int:
        """Block reserved for ``seq_id``'s next seal, -1 if none."""
        return int(self._seqs[core.PREFETCHED, self._live("seq_id", seq_id)])

    def is_live(self, seq_id) -> bool:
        """True if ``seq_id`` is a live sequence (False for any other value, non-ints included)."""
        try:
            seq_id = int_value("seq_id", seq_id)
        except HexcoreInvalidArgumentError:
            return False
        return 0 <= seq_id < self.max_seqs and bool(self._seqs[core.LEN, seq_id] >= 0)

    @property
    def num_free_blocks(self) -> int:
        """Blocks on the free stack."""
        return int(self._counters[core.NUM_FREE])

    @property
    def num_active_blocks(self) -> int:
        """Blocks referenced by at least one block table (quarantined ones not counted)."""
        return int(self._counters[core.NUM_LIVE])

    @property
    def num_reserved_blocks(self) -> int:
        """Blocks parked in a sequence's prefetched slot."""
        return int(self._counters[core.NUM_RESERVED])

    @property
    def num_sequences(self) -> int:
        """Live sequences."""
        return self.max_seqs - int(self._counters[core.NUM_FREE_SEQS])

    def check_invariants(self) -> None:
        """Raise AssertionError if the state is inconsistent (for tests; O(state size))."""
        verify_state(self._blocks, self._seqs, self._tables, self._counters, self.block_size, self._prefix)

    # -- internals --------------------------------------------------------------------
    def _clock(self) -> int:
        return 0 if self._metrics is None else perf_counter_ns()

    def _grow_with_tokens(self, seq_id, new_len, tokens, raising: bool = True):
        # grow_sequence (raising) / try_grow_sequence with tokens, or with the prefix cache on
        t0 = 0 if self._metrics is None else perf_counter_ns()
        op = "grow_sequence" if raising else "try_grow_sequence"
        try:
            if type(seq_id) is not int or type(new_len) is not int:
                seq_id, new_len = int_value("seq_id", seq_id), int_value("new_len", new_len)
            if tokens is not None:
                tokens = as_tokens("tokens", tokens)
        except HexcoreInvalidArgumentError:
            if raising:
                raise
            return Status.INVALID_ARGUMENT
        try:
            status, first, hits, misses = self._grow(seq_id, new_len, tokens)
        except Exception:
            _reraise_unless_beyond_limit(seq_id, new_len)
            status, first, hits, misses = Status.INVALID_SEQUENCE, 0, 0, 0
            if self._prefix is not None:  # the njit call raised before it reset the event log
                self._prefix.pc[pcore.C_LOG] = 0
        if status and raising:
            if t0:
                self._record(op, t0, oom=int(status == Status.OUT_OF_MEMORY))
            if status == Status.INVALID_ARGUMENT:
                raise HexcoreInvalidArgumentError(
                    f"tokens: expected {new_len - self.seq_len(seq_id)} token ids (new_len {new_len} - length "
                    f"{self.seq_len(seq_id)}), got {len(tokens)}")
            self._fail(status, "grow", "seq_id", seq_id, new_len)
        if self._prefix is not None:
            self._publish_prefix_events()
        elif hits + misses and self._events is not None:
            self._events.run(seq_id, first, self._tables[seq_id, first:first + hits + misses])
        if t0:
            self._record(op, t0, hits=hits, misses=misses, oom=int(status == Status.OUT_OF_MEMORY))
        if not raising:
            return _STATUSES[status]
        if hits + misses == 0:
            return _NO_BLOCKS
        return _frozen(self._tables[seq_id, first:first + hits + misses])

    def _step_with_tokens(self, seq_ids, new_lens, tokens, token_starts) -> StepResult:
        # step with tokens, or with the prefix cache on
        t0 = 0 if self._metrics is None else perf_counter_ns()
        check_ids("seq_ids", seq_ids, self.max_seqs)
        if new_lens is None:
            lens, increment = self._no_lens, True
        else:
            check_ids("new_lens", new_lens, self.max_seqs, like=seq_ids)
            lens, increment = new_lens, False
        tokens, starts = check_step_tokens(seq_ids, new_lens, tokens, token_starts)
        prefix = self._prefix
        if prefix is None:  # tokens checked, unused
            num_sealed, num_failed, hits, misses, ooms = step(
                self._blocks, self._seqs, self._counters, self._tables, seq_ids, lens, increment,
                self.block_size, self._out_rows, self._out_tables, self._seals)
        else:
            has_tokens = tokens is not None
            num_sealed, num_failed, hits, misses, ooms = pcore.step(
                self._blocks, self._seqs, self._counters, self._tables, seq_ids, lens, increment,
                self.block_size, self._out_rows, self._out_tables, self._seals, prefix.pblocks, prefix.ptok,
                prefix.pseqs, prefix.index, prefix.pc, prefix.plog, tokens if has_tokens else _NO_TOKENS,
                starts, has_tokens)
        views = self._views.get(len(seq_ids)) or self._make_views(len(seq_ids))
        seals = views[4] if num_sealed == 0 else self._seals[:, :num_sealed]
        if prefix is not None:
            self._publish_prefix_events()  # seals included, in order with evictions and stores
        elif num_sealed and self._events is not None:
            self._events.sealed(seals)
        if t0:
            self._record("step", t0, hits=hits, misses=misses, oom=ooms)
        return StepResult(views[0], seals, views[1], views[2], views[3], seq_ids, num_failed, num_sealed, hits)

    def _grow(self, seq_id: int, new_len: int, tokens) -> tuple:
        # (status, first, hits, misses) of growing seq_id to new_len with tokens (or None)
        prefix = self._prefix
        if prefix is None:
            if tokens is not None and self.is_live(seq_id):
                old_len = int(self._seqs[core.LEN, seq_id])
                if old_len <= new_len <= self.max_seq_len and len(tokens) != new_len - old_len:
                    return Status.INVALID_ARGUMENT, 0, 0, 0
            return core.grow_sequence(self._blocks, self._seqs, self._counters, self._tables, seq_id, new_len,
                                      self.block_size)
        has_tokens = tokens is not None
        return pcore.grow(self._blocks, self._seqs, self._counters, self._tables, prefix.pblocks, prefix.ptok,
                          prefix.pseqs, prefix.index, prefix.pc, prefix.plog, seq_id, new_len, self.block_size,
                          tokens if has_tokens else _NO_TOKENS, has_tokens)

    def _publish_prefix_events(self) -> None:
        # the events the last _prefix call logged, if a ring is attached
        if self._events is not None and self._prefix.pc[pcore.C_LOG]:
            self._events.records(self._prefix.events())

    def _live(self, name: str, seq_id) -> int:
        # seq_id as the int id of a live sequence, or raise naming argument `name`
        seq_id = int_value(name, seq_id)
        if not 0 <= seq_id < self.max_seqs or self._seqs[core.LEN, seq_id] < 0:
            self._fail(Status.INVALID_SEQUENCE, "use", name, seq_id)
        return seq_id

    def _slot(self, name: str, seq_id) -> int:
        # seq_id as an int slot in [0, max_seqs) (live or not), or raise naming `name`
        seq_id = int_value(name, seq_id)
        if not 0 <= seq_id < self.max_seqs:
            raise HexcoreInvalidSequenceError(range_message(name, seq_id, 0, self.max_seqs - 1))
        return seq_id

    def _fail(self, status, action: str, name: str, seq_id, new_len=None):
        raise_for_status(status, describe_seq_error(self, int(status), action, name, seq_id, new_len))

    def _make_views(self, batch: int) -> tuple:
        rows = self._out_rows
        # block_tables is read-only: its rows are reused, incrementally, by the next step
        views = (rows[OUT_STATUS, :batch], _frozen(self._out_tables[:batch]),
                 rows[OUT_LEN, :batch], rows[OUT_TAIL, :batch], self._seals[:, :0])
        self._views[batch] = views
        return views

    def _gauges(self) -> tuple:
        # (active, free, reserved, sequences, num_blocks, cached, quarantined): MetricsCollector's GAUGES order
        num_free, num_free_seqs, num_live, num_reserved, num_quarantined = self._counters.tolist()
        cached = 0 if self._prefix is None else int(self._prefix.pc[pcore.C_CACHED])
        return (num_live, num_free, num_reserved, self.max_seqs - num_free_seqs, self.num_blocks, cached,
                num_quarantined)

    def _record(self, op, t0, *, freed=0, hits=0, misses=0, oom=0, allocated=0):
        latency = perf_counter_ns() - t0
        if self._prefix is None:
            queries = found = evicted = 0
        else:  # the prefix cache's counts since the last record
            pc, seen = self._prefix.pc, self._prefix_seen
            now = (int(pc[pcore.C_QUERIES]), int(pc[pcore.C_HITS]), int(pc[pcore.C_EVICTIONS]))
            queries, found, evicted = now[0] - seen[0], now[1] - seen[1], now[2] - seen[2]
            seen[:] = now
        self._metrics.record(op, latency, (allocated + misses, freed, hits + misses, oom, hits, misses, queries,
                                           found, evicted), self._gauges())
