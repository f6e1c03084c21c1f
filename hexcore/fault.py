"""FaultTolerantKVCache: checksums, canaries, verification, scrubbing, migration, quarantine.

A sealed block never changes, so the digests taken when it is sealed (one per layer,
``hexcore.host.checksum``) hold for its whole life. This class keeps them on the device
and checks blocks against them; it detects and contains corruption, it does not repair
it: the error says which tokens of which sequences to recompute. ::

    ft = FaultTolerantKVCache(cache, store, policy="sampled", sample_every=16)
    result = cache.step(seq_ids)           # the block manager's step (or engine.step(...).result)
    ...                                    # the device step appends and seals (DecodeGraph.step)
    ft.record_seals(result)                # digests of the step's sealed blocks: one launch
    ft.verify(seq_ids)                     # before attention reads them (policy: always, sampled, off)
    ft.scrub()                             # a bounded slice of the whole cache, and the canaries
    # on HexcoreCorruptionError as err: err.report.token_ranges = {seq_id: [(start, end), ...]}
    moved = ft.migrate_sequence(seq_id)    # healthy blocks to fresh ones; bad ones quarantined
    ft.refill(seq_id, logical, k, v)       # the recomputed K/V of a lost block: [L, block_size, H, D]

In a step graph (``hexcore.cuda.DecodeGraph`` made by :meth:`FaultTolerantKVCache.decode_graph`)
the record and the verification ride inside the captured step, no launch of their own::

    graph = ft.decode_graph(num_q_heads=32, max_verify_blocks=1024)
    result = cache.step(seq_ids)
    out = ft.graph_step(graph, result)     # samples blocks by the policy; the step records its
    ...                                    # seals' digests and checks the sample on the device
    ft.check_graph(graph)                  # after reading out: one 8-byte read; raises as verify

With ``decode_layers=k`` the cache also records per-head digests at seal, and its graphs
check whole layers in turn inside the decode itself (k layers a step, every sealed block
each of them reads), instead of sending a sample to a checksum launch: every (block,
layer) is checked once in ``ceil(L / k)`` steps by the kernel that reads it anyway.

Rules: records and checks run on the stream given (default: the default stream), after
the seals they follow; the results are read back, so ``verify``, ``scrub``,
``check_graph`` and ``migrate_sequence`` synchronise. ``prepare_verify`` gives the
capture-safe launch alone (a ``PreparedLaunch`` over fixed device buffers). A block found
corrupted is quarantined in the block manager at once (``PagedKVCache.quarantine_block``): never handed
out again, and -- with the prefix cache on -- out of the key index with its descendants, so
no later admission reuses it; the sequences holding it keep it until migrated. This class
uses only the block manager's public methods. No event ring may be attached while a
sequence migrates (its table is edited in place).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numba
import numpy as np

from ._checks import as_int, shown
from .errors import (HexcoreConfigError, HexcoreCorruptionError, HexcoreInvalidArgumentError,
                     HexcoreInvalidSequenceError, HexcoreOOMError, Status)
from .host.allocator import PagedKVCache
from .host.checksum import block_checksum
from .host.quarantine import BlockState

POLICIES = ("always", "sampled", "off")
GRAPH_OPTIONS = ("batch_buckets", "scale", "backend", "options")  # DecodeGraph's keywords decode_graph passes on
# Prometheus names of FaultTolerantKVCache.stats(), in the style of host/_prometheus.py;
# blocks_quarantined is the block manager's gauge (its MetricsCollector exports it)
PROMETHEUS_NAMES = {
    "blocks_verified": "hexcore_blocks_verified_total",
    "corruptions_found": "hexcore_corruptions_found_total",
    "canary_violations": "hexcore_canary_violations_total",
    "blocks_quarantined": "hexcore_quarantined_blocks",
    "sequences_migrated": "hexcore_sequences_migrated_total",
    "migration_seconds": "hexcore_migration_latency_seconds_sum",
}


@dataclass
class CorruptionReport:
    """What a failed check found.

    ``block_ids``: corrupted (or lost, awaiting ``refill``) blocks; ``layers``: block id ->
    the layers whose digest differs; ``token_ranges``: seq_id -> ``[(start, end), ...]``
    token ranges to recompute (every live sequence holding a bad block, forks included);
    ``guards``: the store arrays whose trailing guard region was overwritten.
    """

    block_ids: list = field(default_factory=list)
    layers: dict = field(default_factory=dict)
    token_ranges: dict = field(default_factory=dict)
    guards: list = field(default_factory=list)

    @property
    def seq_ids(self) -> list:
        """Sequences that lost tokens, ascending."""
        return sorted(self.token_ranges)

    @property
    def ok(self) -> bool:
        """True when nothing was found."""
        return not self.block_ids and not self.guards

    def message(self) -> str:
        """One line naming blocks, layers, sequences, token ranges and guards."""
        parts = []
        if self.block_ids:
            blocks = ", ".join(f"{b} (layers {self.layers.get(b, 'all')})" for b in self.block_ids)
            parts.append(f"corrupted blocks {blocks}")
            lost = "; ".join(f"seq {s} tokens " + ", ".join(f"[{a}, {e})" for a, e in r)
                             for s, r in sorted(self.token_ranges.items()))
            parts.append(f"lost: {lost or 'no live sequence'}")
        if self.guards:
            parts.append(f"guard regions overwritten after {', '.join(self.guards)}")
        return "; ".join(parts)


class FaultTolerantKVCache:
    """Corruption detection and containment over a :class:`PagedKVCache` and its ``DeviceKVStore``.

    Parameters
    ----------
    cache : the block manager (prefix cache on or off); ``store`` : its device store (same
        config, ``num_blocks`` and ``max_seqs``).
    policy : ``"always"`` (verify every block asked for), ``"sampled"`` (the blocks with
        ``(block_id + call) % sample_every == 0``: every block once in ``sample_every``
        calls), or ``"off"``.
    sample_every : int in [1, 2**20].
    scrub_blocks : int >= 1, blocks checked by one :meth:`scrub` call.
    metrics : an optional ``MetricsCollector``: ``migrate_sequence`` is recorded as an op.
    decode_layers : int in [0, L]: layers each graph step checks inside its decode, in turn
        (0: graph steps send the policy's sample to a checksum launch instead). With it,
        every record also takes the per-head digests ``head_sums`` (device uint32
        ``[num_blocks, L, H]``) the decode checks against.
    """

    def __init__(self, cache: PagedKVCache, store, *, policy: str = "always", sample_every: int = 16,
                 scrub_blocks: int = 1024, metrics=None, decode_layers: int = 0):
        from numba import cuda

        from .cuda.store import DeviceKVStore
        from .host.metrics import as_collector

        if not isinstance(cache, PagedKVCache):
            raise HexcoreInvalidArgumentError(f"cache: expected PagedKVCache, got {type(cache).__name__}")
        if not isinstance(store, DeviceKVStore):
            raise HexcoreInvalidArgumentError(f"store: expected DeviceKVStore, got {type(store).__name__}")
        if (store.config, store.num_blocks, store.max_seqs) != (cache.config, cache.num_blocks, cache.max_seqs):
            raise HexcoreConfigError(
                f"store: expected the cache's config, num_blocks {cache.num_blocks} and max_seqs {cache.max_seqs}, "
                f"got num_blocks {store.num_blocks}, max_seqs {store.max_seqs}"
                f"{'' if store.config == cache.config else ' and another config'}")
        self.policy, self.sample_every = _checked_policy(policy), as_int("sample_every", sample_every, 1, 1 << 20)
        self.scrub_blocks = as_int("scrub_blocks", scrub_blocks, 1)
        self.decode_layers = as_int("decode_layers", decode_layers, 0, cache.config.num_layers)
        self.metrics = as_collector("metrics", metrics)
        self.cache, self.store, self.config = cache, store, cache.config
        L = self.config.num_layers
        # sums: [block_id, layer] -> digest recorded at seal (device); recorded: [block_id] -> bool
        self.sums = cuda.to_device(np.zeros((cache.num_blocks, L), np.uint32))
        self.recorded = np.zeros(cache.num_blocks, bool)
        self.head_sums = None if not self.decode_layers else cuda.to_device(
            np.zeros((cache.num_blocks, L, self.config.num_kv_heads), np.uint32))
        # whole-layer check rounds: missing [block_id, word] -> bit p set while the block's
        # layers of phase p are unchecked this round; round_start [block_id] -> the layered
        # step count when its round began (a graph step runs a phase the block of its tables
        # whose round began first still misses; every block it reads is credited)
        words = -(-self.phases // 64)
        self._full_round = np.array([_bits(self.phases - 64 * w) for w in range(words)], np.uint64)
        self._missing = np.tile(self._full_round, (cache.num_blocks, 1))
        self._round_start = np.zeros(cache.num_blocks, np.int64)
        self._layered_steps = 0
        self._layer_checks = 0  # (block, layer) checks inside decodes not yet counted as whole blocks
        self._table_count = 0  # distinct blocks of the last graph step's tables (less its seals)
        self._out = cuda.device_array((cache.num_blocks, L), np.uint32)  # [item, layer] launch results
        self._guard_bad = cuda.device_array(len(store.guard_offsets), np.uint32)
        self._bad: dict[int, list] = {}  # block_id -> layers: found corrupted (quarantined), not yet migrated
        self._lost: dict[int, tuple] = {}  # block_id -> (seq_id, logical): replaced a bad block, awaits refill
        self._calls = 0
        self._stamps = np.full(cache.num_blocks, -1, np.int64)  # [block_id] -> last sampling that saw it
        self._stamp = 0
        self._sampled = np.empty(cache.num_blocks, np.int32)  # _sample_tables' output (distinct blocks)
        self._graph_known: set = set()  # sampled by graph steps, known bad (reported by check_graph)
        self._scrub_at = 0
        self._stats = dict.fromkeys(PROMETHEUS_NAMES, 0)
        self.last_report = CorruptionReport()

    # -- recording ------------------------------------------------------------------
    def record_seals(self, result, stream=None) -> None:
        """Record the digests of a step's sealed blocks (``result``: a ``StepResult``), one
        launch, after the step's seal on ``stream``."""
        if _step_result(result).num_sealed:
            self.record(np.ascontiguousarray(result.seal_blocks), stream)

    def record(self, block_ids, stream=None) -> None:
        """Record the digests of sealed blocks (int32 ``[n]`` host array), one launch."""
        ids = self._block_ids(block_ids)
        if ids.size:
            self._launch(ids, "record", stream)
            self._record_heads(ids, stream)
            self._mark_recorded(ids)

    def _record_heads(self, ids, stream) -> None:
        """The head digests of ``ids`` (host int32, in range), with ``decode_layers`` only."""
        if self.head_sums is not None and ids.size:
            from .cuda.integrity import record_head_sums

            record_head_sums(self.store, np.ascontiguousarray(ids, np.int32), self.head_sums, stream)

    def _mark_recorded(self, ids) -> None:
        self.recorded[ids] = True
        if self.decode_layers:  # new contents: a new round of whole-layer checks
            self._missing[ids] = self._full_round
            self._round_start[ids] = self._layered_steps
        for b in ids.tolist():
            self._bad.pop(b, None)
            self._lost.pop(b, None)

    # -- checking -------------------------------------------------------------------
    def verify(self, seq_ids, stream=None) -> int:
        """Check the sealed blocks of ``seq_ids`` (int32 ``[B]``, live sequences) by the policy,
        and the canaries; the number of blocks checked. Raises HexcoreCorruptionError (its
        ``report``: a :class:`CorruptionReport`) on a mismatch, a lost block or a canary."""
        report, checked = self._verify(seq_ids, _resolved(stream))
        _raise_if_bad(report)
        return checked

    def try_verify(self, seq_ids, stream=None) -> Status:
        """:meth:`verify` returning a Status: OK, CORRUPTED (``last_report`` says what),
        INVALID_SEQUENCE or INVALID_ARGUMENT."""
        return _try(lambda: _raise_if_bad(self._verify(seq_ids, _resolved(stream))[0]))

    def scrub(self, max_blocks: int | None = None, stream=None) -> int:
        """Check the next ``max_blocks`` (default ``scrub_blocks``) recorded blocks in use (in a
        table, or kept by the prefix cache), going round the whole cache over successive
        calls, and the canaries; the number checked.
        Raises HexcoreCorruptionError like :meth:`verify`."""
        budget = self.scrub_blocks if max_blocks is None else as_int("max_blocks", max_blocks, 1)
        stream = _resolved(stream)  # (bad input raises before the scrub position moves)
        live = self._candidates()
        order = np.concatenate([live[live >= self._scrub_at], live[live < self._scrub_at]])
        ids = order[:budget].astype(np.int32)
        self._scrub_at = int(ids[-1]) + 1 if ids.size and ids.size < order.size else 0
        report = self._check(ids, stream)
        _raise_if_bad(report)
        return int(ids.size)

    def try_scrub(self, max_blocks: int | None = None, stream=None) -> Status:
        """:meth:`scrub` returning a Status (CORRUPTED: see ``last_report``)."""
        return _try(lambda: self.scrub(max_blocks, stream))

    def prepare_verify(self, block_ids, out):
        """The capture-safe verify launch over fixed device buffers (``hexcore.cuda.integrity``):
        ``block_ids`` int32 ``[n]`` (-1 rows are padding), ``out`` uint32 ``[n, L]``, zero
        where a block matches its recorded digests. Read ``out`` after the step and pass it to
        :meth:`check_results`."""
        from .cuda.integrity import prepare_checksum

        return prepare_checksum(self.store, block_ids, self.sums, out, self._guard_bad, "verify")

    def check_results(self, block_ids, out) -> None:
        """Raise HexcoreCorruptionError for the rows of a prepared verify's ``out`` (host
        uint32 ``[n, L]``) that are not zero; ``block_ids``: its host int32 ``[n]``."""
        ids, out = self._prepared_results(block_ids, out)
        report = self._report(ids, out, np.zeros(0, np.uint32))
        _raise_if_bad(report)

    def _prepared_results(self, block_ids, out) -> tuple:
        """``(block_ids, out)`` of :meth:`check_results` checked: host int32 ``[n]`` ids in
        ``[-1, num_blocks)`` and host uint32 ``[n, L]`` results, or HexcoreInvalidArgumentError
        (so a malformed pair is never taken for corruption)."""
        from .cuda.arrays import check_dtype_shape, check_id_range

        for name, x in (("block_ids", block_ids), ("out", out)):
            if not isinstance(x, np.ndarray):
                raise HexcoreInvalidArgumentError(f"{name}: expected a host numpy array, got {type(x).__name__}")
        check_id_range(block_ids, "block_ids", None, self.cache.num_blocks, lower=-1)
        check_dtype_shape("out", out.dtype, out.shape, np.uint32, (block_ids.shape[0], self.config.num_layers))
        return block_ids, out

    # -- inside a step graph ----------------------------------------------------------
    def decode_graph(self, num_q_heads: int, max_verify_blocks: int = 1024, **kwargs):
        """A ``hexcore.cuda.DecodeGraph`` over this cache's store that records its seals'
        digests and verifies sampled blocks inside each step (``verify_sums=self.sums``).
        ``max_verify_blocks``: block ids one step may verify (at least the policy's sample
        of the largest batch: about ``B * blocks_per_seq / sample_every``, all of them with
        ``"always"``); ``kwargs``: DecodeGraph's others (``batch_buckets``, ``backend``...).
        With ``decode_layers`` the graph checks that many layers a step inside its decode
        (``verify_heads=self.head_sums``) and its steps sample no blocks."""
        from .cuda.steps import DecodeGraph

        unknown = sorted(str(key) for key in kwargs if key not in GRAPH_OPTIONS)
        if unknown:
            raise HexcoreInvalidArgumentError(f"decode_graph: unknown option(s) {unknown}; expected some of "
                                              f"{list(GRAPH_OPTIONS)}")
        return DecodeGraph(self.store, num_q_heads, self.cache.max_blocks_per_seq, verify_sums=self.sums,
                           max_verify_blocks=max_verify_blocks, verify_heads=self.head_sums,
                           verify_layers=self.decode_layers, **kwargs)

    def sample_step(self, result) -> np.ndarray:
        """The block ids a graph step of ``result`` (a ``StepResult``) would verify now by the
        policy, as :meth:`verify` picks them from the step's tables (``"sampled"``: the
        blocks with ``(block_id + call) % sample_every == 0``), less the step's own seals
        (their digests are recorded by that step), blocks never recorded and blocks known
        bad (:meth:`graph_step` reports those): int32 ``[n]``, distinct. Changes nothing
        (:meth:`graph_step` counts the call). None with ``decode_layers`` (whole layers are
        checked inside the decode; ``policy`` and ``sample_every`` then apply to
        :meth:`verify` only)."""
        if self.decode_layers:
            return np.zeros(0, np.int32)
        return self._sample(result, self._calls + 1)[0]

    @property
    def phases(self) -> int:
        """Graph steps in a round of whole-layer checks, ``ceil(L / decode_layers)`` (0 without)."""
        return -(-self.config.num_layers // self.decode_layers) if self.decode_layers else 0

    def step_phase(self, result) -> int | None:
        """The phase of whole-layer checks a graph step of ``result`` (a ``StepResult``) would
        run now: the first phase still unchecked this round of the step's block whose round
        began first (each block's round: every phase once, credited by any step that reads
        the block, whatever batch it is in; a block re-recorded starts a new one). With
        none, the step count's turn. None without ``decode_layers``. Changes nothing."""
        if not self.decode_layers:
            return None
        self._table_blocks(result)
        return self._phase_of(self._sampled[:self._table_count])

    def _phase_of(self, blocks) -> int:
        """The phase a step of ``blocks`` (its distinct table blocks) runs (``step_phase``)."""
        return int(_needed_phase(self._missing, self._round_start, blocks, self._layered_steps % self.phases))

    def graph_step(self, graph, result, fork_src=None, fork_dst=None, stream=None):
        """``graph.step`` for ``result`` (a ``StepResult`` of the block manager), with the
        blocks :meth:`sample_step` picks as ``verify_blocks``; returns the step's ``out``.

        The step records the digests of its seals and checks the sample on the device;
        :meth:`check_graph` reads the outcome (after the step's outputs are read, each step
        or every few). Sampled blocks already known bad (quarantined, or lost awaiting a
        refill) are not checked again: :meth:`check_graph` reports them, as :meth:`verify`
        does. ``graph``: made by :meth:`decode_graph` (verifying against ``self.sums``).
        Bad input raises HexcoreInvalidArgumentError and changes nothing.
        """
        self._own_graph(graph)
        return self._graph_call(graph.step, graph, result, fork_src, fork_dst, stream, load=False)

    def graph_load(self, graph, result, fork_src=None, fork_dst=None, stream=None):
        """:meth:`graph_step` through ``graph.load``: the step's indices (sampled blocks
        included) copied and its forks run; returns the ``DecodeStep`` whose
        ``enqueue(layer, stream)`` an engine captures in its own graph (layer 0 carries the
        verification, the last layer the record of the seals)."""
        self._own_graph(graph)
        return self._graph_call(graph.load, graph, result, fork_src, fork_dst, stream, load=True)

    def _graph_call(self, call, graph, result, fork_src, fork_dst, stream, load):
        layered = None
        if graph.phases:  # whole layers in the decode: no sample
            ids, known, layered = self._layered_step(graph, result, fork_src, fork_dst, stream, load)
        else:
            ids, known = self._sample(result, self._calls + 1)
        if ids.size > graph.max_verify_blocks:
            raise HexcoreInvalidArgumentError(
                f"graph: the policy samples {ids.size} blocks, more than its max_verify_blocks "
                f"{graph.max_verify_blocks}; make the graph with a larger max_verify_blocks")
        extra = {"seal_slots": result.seal_slots, "seal_blocks": result.seal_blocks} if result.num_sealed else {}
        if layered is not None:
            extra["phase"] = layered[2]
        done = call(result.block_tables, result.seq_lens, result.tail_slots, fork_src=fork_src, fork_dst=fork_dst,
                    stream=stream, verify_blocks=ids, **extra)
        self._calls += 1  # (after the call: bad input changed nothing)
        self._graph_known.update(known)
        if layered is not None:
            self._layers_checked(graph, *layered)
        else:
            self._stats["blocks_verified"] += int(ids.size) + len(known)
        if result.num_sealed:
            self._mark_recorded(result.seal_blocks)
        return done

    def _layered_step(self, graph, result, fork_src, fork_dst, stream, load) -> tuple:
        """Before a step that checks whole layers: (no ids, known-bad ids, (unrecorded
        blocks, the step's table blocks, its phase)); the unrecorded blocks' records
        launched on the step's stream once the step's input is checked (bad input changes
        nothing)."""
        ids, known, unrecorded = self._table_blocks(result)
        blocks = self._sampled[:self._table_count].copy()
        phase = self._phase_of(blocks)
        if unrecorded.size:
            sealed = result.num_sealed > 0
            graph._checked(result.block_tables, result.seq_lens, result.tail_slots, None,
                           result.seal_slots if sealed else None, result.seal_blocks if sealed else None,
                           fork_src, fork_dst, None, load)
            self._record_now(unrecorded, graph._resolve(stream))
        return ids, known, (unrecorded, blocks, phase)

    def _layers_checked(self, graph, unrecorded, blocks, phase) -> None:
        """After a step of ``phase``: its unrecorded blocks recorded, the phase credited to
        every block it read, ``blocks_verified`` counted (one block per L checks)."""
        self._mark_recorded(unrecorded)
        self._layered_steps += 1
        _credit_phase(self._missing, self._round_start, blocks, phase, self._full_round, self._layered_steps)
        self._layer_checks += self._table_count * len(graph.checked_layers(phase))
        self._stats["blocks_verified"] += self._layer_checks // self.config.num_layers
        self._layer_checks %= self.config.num_layers

    def check_graph(self, graph, stream=None) -> None:
        """Raise HexcoreCorruptionError (``report`` as :meth:`verify`'s) for what the graph
        steps since the last call found: blocks whose digests differ (quarantined at once),
        sampled blocks already known bad, overwritten canaries. Synchronises ``stream``;
        one 8-byte read when all is well. The device lists the first 1024 mismatches between
        two calls (with ``decode_layers``, one per decode item that read a bad block: a
        shared block fills many rows); when more were counted, every recorded block in use
        is checked again (one checksum launch), so every bad block is named."""
        self._own_graph(graph)
        results = graph.verify_results(stream)
        known, self._graph_known = sorted(self._graph_known), set()
        L = self.config.num_layers
        ids = np.unique(results.found[:, 0]).astype(np.int32)
        out = np.zeros((ids.size, L), np.uint32)
        out[np.searchsorted(ids, results.found[:, 0]), results.found[:, 1]] = 1
        report = self._report(ids, out, results.guard_bad)
        if results.mismatches > results.found.shape[0]:  # the list overflowed: the rest found by a whole check
            self._add_blocks(report, self._check(self._candidates(), stream, raise_guards=False).block_ids)
        self._add_blocks(report, [b for b in known if b not in report.block_ids])
        _raise_if_bad(report)

    def try_check_graph(self, graph, stream=None) -> Status:
        """:meth:`check_graph` returning a Status (CORRUPTED: see ``last_report``)."""
        return _try(lambda: self.check_graph(graph, stream))

    # -- containment ----------------------------------------------------------------
    def migrate_sequence(self, seq_id: int, stream=None) -> dict:
        """Move ``seq_id``'s healthy blocks to fresh ones (one device copy, its table changed
        in one edit, ``PagedKVCache.replace_blocks``); its bad blocks stay quarantined.

        Returns ``{"moved": n, "lost": [(logical, block, (start, end)), ...]}``: each lost
        logical block (corrupted, or still awaiting a refill) has a fresh block that
        :meth:`refill` must fill (until then :meth:`verify` reports it). Other sequences
        sharing a bad block keep it (they are reported) until migrated too. Raises
        HexcoreOOMError without enough available blocks and HexcoreConfigError with an event
        ring attached (nothing changed), HexcoreCorruptionError when the copies do not
        verify (the table unchanged; cached blocks evicted to make room stay evicted).
        """
        from .cuda.blocks import copy_blocks

        t0 = time.perf_counter_ns()
        cache = self.cache
        old = cache.block_table(seq_id)  # (raises for a sequence that is not live)
        stream = _resolved(stream)
        seq_id = int(seq_id)
        if cache.event_ring_attached:
            raise HexcoreConfigError("migrate_sequence: detach the cache's event ring first (tables change in place)")
        if cache.num_available_blocks < len(old):
            raise HexcoreOOMError(f"migrate_sequence: seq {seq_id} needs {len(old)} free blocks, "
                                  f"have {cache.num_available_blocks}; nothing changed")
        self._check(old[self.recorded[old]], stream, raise_guards=False)  # fresh digests: finds are quarantined
        quarantined = cache.block_states()[old] == BlockState.QUARANTINED
        healthy = ~quarantined & ~np.isin(old, list(self._lost))  # (unrecorded blocks move unchecked)
        new = cache.prepare_free_blocks(len(old))
        if healthy.any():
            src, dst = old[healthy], new[healthy]
            before = self._launch(src, "compute", stream)  # (the recorded ones were just verified)
            copy_blocks(self.store, src, dst, stream=stream)
            if not np.array_equal(self._launch(dst, "record", stream), before):  # the copies' digests
                raise HexcoreCorruptionError(f"migrate_sequence: the copy of seq {seq_id}'s blocks did not verify; "
                                             "its table is unchanged")
            self._record_heads(dst, stream)
            self.recorded[dst] = self.recorded[src]
        self._record_heads(new[~healthy], stream)  # (what a lost block holds until its refill: no false alarm)
        cache.replace_blocks(seq_id, new)
        for b in old[~healthy].tolist():
            self._bad.pop(b, None)
            self._lost.pop(b, None)
            self.recorded[b] = False
        bs = self.config.block_size
        lost = []
        for j in np.flatnonzero(~healthy).tolist():
            self._lost[int(new[j])] = (seq_id, j)
            lost.append((j, int(new[j]), (j * bs, (j + 1) * bs)))
        elapsed = time.perf_counter_ns() - t0
        self._stats["sequences_migrated"] += 1
        self._stats["migration_seconds"] += elapsed / 1e9
        if self.metrics is not None:
            self.metrics.observe("migrate_sequence", elapsed, allocated=len(old))
        return {"moved": int(healthy.sum()), "lost": lost}

    def refill(self, seq_id: int, logical: int, k, v, stream=None) -> None:
        """Write recomputed K/V into a lost block of ``seq_id`` (see :meth:`migrate_sequence`)
        through ``seq_id``'s own tail slot and a seal, then record it; the tail's contents are
        saved to the host first and put back after (``2 * L`` small copies each way), so
        no sequence slot is needed.

        ``k``, ``v``: float16 ``[L, block_size, H, D]``: the block's tokens, in every layer.
        """
        from .cuda import append, seal
        from .cuda.streams import resolve_stream

        table = self.cache.block_table(seq_id)  # (raises for a sequence that is not live)
        seq_id, logical = int(seq_id), as_int("logical", logical, 0)
        block = int(table[logical]) if logical < len(table) else -1
        if self._lost.get(block) != (seq_id, logical):
            raise HexcoreInvalidArgumentError(f"logical: block {logical} of seq {seq_id} is not awaiting a refill")
        stream = resolve_stream(stream)
        tails = [self.store.k_tails, self.store.v_tails]
        saved = [[t[layer, seq_id].copy_to_host(stream=stream.numba) for layer in range(t.shape[0])] for t in tails]
        try:
            bs = self.config.block_size
            append(self.store, k, v, np.full(bs, seq_id, np.int32), np.arange(bs, dtype=np.int32), stream=stream)
            seal(self.store, np.array([seq_id], np.int32), np.array([block], np.int32), stream=stream)
        finally:
            for t, rows in zip(tails, saved):
                for layer, row in enumerate(rows):
                    t[layer, seq_id].copy_to_device(row, stream=stream.numba)
        self.record(np.array([block], np.int32), stream)

    # -- fault injection (tests, demos) ------------------------------------------------
    def flip_bit(self, name: str, layer: int, unit: int, byte: int, bit: int = 0) -> None:
        """Flip one bit of the store: ``name`` an array (``"k_codes"``, ``"v_meta"``, ``"k_tails"``...),
        ``unit`` its block id or tail slot, ``byte`` the offset in that (layer, unit)'s run."""
        from .cuda.integrity import flip_bits

        flip_bits(self.store, name, layer, unit, byte, 1 << as_int("bit", bit, 0, 7))

    def flip_byte(self, name: str, layer: int, unit: int, byte: int) -> None:
        """Invert one byte of the store (see :meth:`flip_bit`)."""
        from .cuda.integrity import flip_bits

        flip_bits(self.store, name, layer, unit, byte, 0xFF)

    def flip_word(self, name: str, layer: int, unit: int, word: int) -> None:
        """Invert one 32-bit word of the store (``word``: its index in the run)."""
        from .cuda.integrity import flip_bits

        word = as_int("word", word, 0)
        for i in range(4):
            flip_bits(self.store, name, layer, unit, 4 * word + i, 0xFF)

    def clobber_canary(self, region: int, index: int = 0, value: int = 0) -> None:
        """Overwrite one guard word (``region``: index in ``store.guard_names``)."""
        from .cuda.integrity import clobber_guard

        clobber_guard(self.store, region, index, value)

    # -- state ----------------------------------------------------------------------
    @property
    def quarantined(self) -> list:
        """The cache's quarantined block ids, ascending."""
        return self.cache.quarantined_blocks().tolist()

    def stats(self) -> dict:
        """Counters: blocks_verified, corruptions_found, canary_violations, sequences_migrated,
        migration_seconds, and the cache's blocks_quarantined (names in ``PROMETHEUS_NAMES``)."""
        return dict(self._stats, blocks_quarantined=self.cache.num_quarantined_blocks)

    def prometheus_collector(self):
        """A ``prometheus_client`` collector over :meth:`stats`: counters ``*_total`` and the
        ``hexcore_migration_latency_seconds`` summary (its ``_sum`` and ``_count``); the
        quarantine gauge is the block manager's (``hexcore_quarantined_blocks``, exported by
        its ``MetricsCollector``). HexcoreConfigError without prometheus_client."""
        try:
            from prometheus_client.core import CounterMetricFamily, SummaryMetricFamily
        except ImportError:
            raise HexcoreConfigError("prometheus_collector: prometheus_client is not installed") from None
        return _FaultCollector(self, CounterMetricFamily, SummaryMetricFamily)

    def check_invariants(self) -> None:
        """The cache's invariants (quarantined blocks included), and: every block found
        corrupted and not yet migrated away is quarantined. AssertionError if not."""
        self.cache.check_invariants()
        states = self.cache.block_states()
        found = np.array(sorted(self._bad), np.int64)
        assert np.all(states[found] == BlockState.QUARANTINED), ("found corrupted, not quarantined", found)

    # -- internals --------------------------------------------------------------------
    def _verify(self, seq_ids, stream) -> tuple:
        ids = self._tables_of(seq_ids)
        self._calls += 1
        if self.policy == "off":
            ids = ids[:0]
        elif self.policy == "sampled":
            ids = ids[(ids.astype(np.int64) + self._calls) % self.sample_every == 0]
        held = self.cache.block_states()[ids] == BlockState.QUARANTINED
        lost = [b for b, q in zip(ids.tolist(), held.tolist()) if q or b in self._lost or b in self._bad]
        report = self._check(ids[self.recorded[ids]], stream)
        if lost:
            self._add_blocks(report, lost)
        return report, int(ids.size)

    def _sample(self, result, call: int) -> tuple:
        """(ids to check on the device, known-bad ids) of a step's tables at ``call``."""
        _step_result(result)
        every = {"always": 1, "sampled": self.sample_every, "off": 0}[self.policy]
        if not every:
            return np.zeros(0, np.int32), []
        self._stamp += 1
        n = _sample_tables(result.block_tables, result.seq_lens, self.config.block_size,
                           np.ascontiguousarray(result.seal_blocks), self._stamps, self._stamp, call, every,
                           self._sampled)
        ids = self._sampled[:n].copy()
        known = self._known(ids)
        return ids[~known & self.recorded[ids]], ids[known].tolist()

    def _table_blocks(self, result) -> tuple:
        """(no ids, known-bad ids, unrecorded ids) of a step's tables, less its own seals;
        ``_table_count``: how many distinct blocks that is."""
        _step_result(result)
        self._stamp += 1
        n = _sample_tables(result.block_tables, result.seq_lens, self.config.block_size,
                           np.ascontiguousarray(result.seal_blocks), self._stamps, self._stamp, 0, 1, self._sampled)
        ids = self._sampled[:n]
        self._table_count = n
        known = self._known(ids)
        return ids[:0].copy(), ids[known].tolist(), ids[~known & ~self.recorded[ids]].copy()

    def _known(self, ids) -> np.ndarray:
        """bool ``[n]``: which of ``ids`` are known bad (quarantined, found, or lost awaiting a refill)."""
        if not (self.cache.num_quarantined_blocks or self._lost or self._bad):
            return np.zeros(ids.size, bool)
        known = self.cache.block_states()[ids] == BlockState.QUARANTINED
        return known | np.isin(ids, list(self._lost) + list(self._bad))

    def _record_now(self, ids, stream) -> None:
        """Launch the records of ``ids`` (digests and head digests) without marking them
        recorded (the caller does, once its step is accepted)."""
        if ids.size:
            self._launch(ids, "record", stream)
            self._record_heads(ids, stream)

    def _own_graph(self, graph) -> None:
        """Raise unless ``graph`` is a DecodeGraph verifying against ``self.sums`` (and
        ``self.head_sums``, checking ``decode_layers`` layers a step, or none)."""
        from .cuda.steps import DecodeGraph

        if not isinstance(graph, DecodeGraph) or graph.verify_sums is not self.sums:
            raise HexcoreInvalidArgumentError(f"graph: expected a DecodeGraph verifying against this cache's sums "
                                              f"(FaultTolerantKVCache.decode_graph), got {type(graph).__name__}")
        layers, heads = graph.verify_layers, graph.verify_heads
        if heads is not self.head_sums or layers != self.decode_layers:
            against = "no" if heads is None else ("this cache's" if heads is self.head_sums else "other")
            raise HexcoreInvalidArgumentError(
                f"graph: checks {layers} layer(s) a step against {against} head digests; this cache checks "
                f"decode_layers {self.decode_layers} against its own (FaultTolerantKVCache.decode_graph)")

    def _tables_of(self, seq_ids) -> np.ndarray:
        """The distinct block ids of the tables of ``seq_ids`` (int32 [B] of live sequences)."""
        _step_check(seq_ids, self.cache.max_seqs)
        cache = self.cache
        rows = []
        for i, s in enumerate(seq_ids.tolist()):
            if not cache.is_live(s):
                raise HexcoreInvalidSequenceError(f"seq_ids[{i}]: sequence {s} is not live")
            rows.append(cache.block_table(s))
        return np.unique(np.concatenate(rows)) if rows else np.zeros(0, np.int32)

    def _candidates(self) -> np.ndarray:
        """Recorded blocks a table references or the prefix cache keeps, not quarantined (ascending)."""
        states = self.cache.block_states()
        return np.flatnonzero(((states == BlockState.LIVE) | (states == BlockState.CACHED)) & self.recorded)

    def _check(self, ids, stream, raise_guards: bool = True) -> CorruptionReport:
        ids = np.ascontiguousarray(ids, np.int32)
        out = self._launch(ids, "verify", stream)
        bad_guards = self._guard_bad.copy_to_host()
        report = self._report(ids, out, bad_guards if raise_guards else np.zeros(0, np.uint32))
        self._stats["blocks_verified"] += int(ids.size)
        return report

    def _report(self, ids, out, bad_guards) -> CorruptionReport:
        report = CorruptionReport()
        rows = np.flatnonzero(out.any(axis=1)) if out.size else np.zeros(0, np.int64)
        for r in rows.tolist():
            b = int(ids[r])
            if b < 0:
                continue
            layers = np.flatnonzero(out[r]).tolist()
            if b not in self._bad:
                self._stats["corruptions_found"] += 1
            self._bad[b] = sorted(set(self._bad.get(b, [])) | set(layers))
            self.cache.quarantine_block(b)  # never handed out again, nor matched by a later admission
            self._record_heads(np.array([b], np.int32), None)  # (known now: decodes stop re-finding it)
        self._add_blocks(report, [int(ids[r]) for r in rows.tolist() if ids[r] >= 0])
        report.guards = [self.store.guard_names[g] for g in np.flatnonzero(bad_guards).tolist()]
        self._stats["canary_violations"] += len(report.guards)
        self.last_report = report
        return report

    def _add_blocks(self, report: CorruptionReport, blocks) -> None:
        cache, bs = self.cache, self.config.block_size
        for b in blocks:
            if b in report.block_ids:
                continue
            report.block_ids.append(b)
            report.layers[b] = self._bad.get(b, "quarantined" if cache.is_quarantined(b) else "lost")
            for s, j in cache.block_references(b).tolist():
                report.token_ranges.setdefault(s, []).append((j * bs, (j + 1) * bs))
        self.last_report = report

    def _launch(self, ids, mode: str, stream) -> np.ndarray:
        """Run a checksum launch over host ids; ``out[:n]`` on the host."""
        from .cuda.integrity import checksum_launch, to_host
        from .cuda.streams import resolve_stream

        stream = resolve_stream(stream)
        out = self._out[:ids.size]
        checksum_launch(self.store, ids, self.sums, out, self._guard_bad, mode).run(stream)
        return to_host(out, stream) if ids.size else np.zeros((0, self.config.num_layers), np.uint32)

    def _block_ids(self, block_ids) -> np.ndarray:
        _step_check(block_ids, None, "block_ids")
        bad = np.flatnonzero((block_ids < 0) | (block_ids >= self.cache.num_blocks))
        if bad.size:
            raise HexcoreInvalidArgumentError(f"block_ids[{bad[0]}] = {block_ids[bad[0]]} is outside "
                                              f"[0, {self.cache.num_blocks})")
        return block_ids


class _FaultCollector:
    """``collect()`` yields the fault-tolerance metric families from a stats snapshot."""

    _DOCS = {"blocks_verified": "Sealed blocks whose checksum was verified.",
             "corruptions_found": "Blocks found corrupted.",
             "canary_violations": "Guard words found overwritten.",
             "sequences_migrated": "Sequences moved to fresh blocks."}

    def __init__(self, cache, counter, summary):
        self.cache, self.counter, self.summary = cache, counter, summary

    def collect(self):
        stats = self.cache.stats()
        for key, doc in self._DOCS.items():
            yield self.counter(PROMETHEUS_NAMES[key].removesuffix("_total"), doc, value=stats[key])
        yield self.summary("hexcore_migration_latency_seconds", "Host time of migrate_sequence calls.",
                           count_value=stats["sequences_migrated"], sum_value=stats["migration_seconds"])


@numba.njit(cache=True)
def _sample_tables(tables, seq_lens, block_size, exclude, stamps, stamp, call, every, out):
    """Write into ``out`` the distinct blocks of the tables (row ``i``: its first
    ``seq_lens[i] // block_size`` entries), not in ``exclude``, with ``(block + call) %
    every == 0``; their count. ``stamps[b] == stamp`` marks block ``b`` as seen."""
    for b in exclude:
        if 0 <= b < stamps.shape[0]:
            stamps[b] = stamp
    n = 0
    for i in range(seq_lens.shape[0]):
        for j in range(min(seq_lens[i] // block_size, tables.shape[1])):
            b = tables[i, j]
            if b < 0 or b >= stamps.shape[0] or stamps[b] == stamp:
                continue
            stamps[b] = stamp
            if (b + call) % every == 0:
                out[n] = b
                n += 1
    return n


def _bits(n: int) -> int:
    """A 64-bit word with its lowest ``min(n, 64)`` bits set."""
    return (1 << min(n, 64)) - 1


@numba.njit(cache=True)
def _needed_phase(missing, round_start, blocks, default):
    """The lowest phase still missing this round (``missing`` uint64 ``[num_blocks, W]``,
    bit ``p % 64`` of word ``p // 64``) of the block among ``blocks`` whose round began
    first (``round_start``; the first such in ``blocks``); ``default`` for no blocks."""
    if blocks.shape[0] == 0:
        return default
    oldest = blocks[0]
    for b in blocks:
        if round_start[b] < round_start[oldest]:
            oldest = b
    for w in range(missing.shape[1]):
        word = missing[oldest, w]
        for bit in range(64):
            if (word >> np.uint64(bit)) & np.uint64(1):
                return 64 * w + bit
    return default  # (unreachable: a finished round starts the next at once)


@numba.njit(cache=True)
def _credit_phase(missing, round_start, blocks, phase, full, now):
    """A step of ``phase`` read ``blocks``: their bit of ``phase`` cleared; a block whose
    round is complete starts the next (every bit set, ``round_start`` = ``now``)."""
    w, bit = phase // 64, np.uint64(1) << np.uint64(phase % 64)
    for b in blocks:
        missing[b, w] &= ~bit
        if not missing[b].any():
            missing[b] = full
            round_start[b] = now


def _step_check(ids, max_len, name: str = "seq_ids") -> None:
    from .host._validation import check_ids

    check_ids(name, ids, max_len)


def _checked_policy(policy) -> str:
    if not isinstance(policy, str) or policy not in POLICIES:
        raise HexcoreInvalidArgumentError(f"policy: expected one of {POLICIES}, got {shown(policy)}")
    return policy


def _step_result(result):
    """``result`` if it is a block manager's ``StepResult``, else HexcoreInvalidArgumentError."""
    from .host._step import StepResult

    if not isinstance(result, StepResult):
        raise HexcoreInvalidArgumentError(f"result: expected a StepResult, got {type(result).__name__}")
    return result


def _resolved(stream):
    """``stream`` resolved (``hexcore.cuda.streams``), so a bad one raises before any state changes."""
    from .cuda.streams import resolve_stream

    return resolve_stream(stream)


def _raise_if_bad(report: CorruptionReport) -> None:
    if not report.ok:
        err = HexcoreCorruptionError(report.message())
        err.report = report
        raise err


def _try(call) -> Status:
    try:
        call()
    except HexcoreCorruptionError:
        return Status.CORRUPTED
    except HexcoreInvalidSequenceError:
        return Status.INVALID_SEQUENCE
    except HexcoreInvalidArgumentError:
        return Status.INVALID_ARGUMENT
    return Status.OK


__all__ = ["POLICIES", "PROMETHEUS_NAMES", "CorruptionReport", "FaultTolerantKVCache", "block_checksum"]
