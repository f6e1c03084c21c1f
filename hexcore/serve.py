"""Continuous batching over the Engine: a synthetic serving workload through the whole cache.

There is no model: a token's K/V is a row of a fixed random table chosen by (request,
position), so a recomputed prefix has the same K/V as the first time and the exact
reference of any sequence can be rebuilt; queries are fresh random rows each step.
What is real is the cache, driven the way a serving engine drives it:

- **arrivals**: request ``i`` arrives at step ``workload.arrivals[i]`` with a prompt and
  an output length drawn from a distribution (:mod:`hexcore.serve_workload`);
- **admission by free blocks**: a waiting request is prefilled (``Engine.prefill``:
  append and seal) when the free stack holds its prompt's blocks plus one for its next
  seal, a sequence slot is free, and the step's prefill budget allows;
- **the step**: ``Engine.step`` on an Engine built with ``speculative=True``: it predicts
  the sequences whose new token seals, reserves their blocks and runs the block manager's
  batch step; then fork copies, append, seal and attention for every layer
  (``EngineStep.run``: one CUDA graph replay on a GPU, eager launches on the simulator);
- **preemption by recompute**: when the step's seals need more blocks than are free (the
  Engine refuses the step, changing nothing), the most recently admitted request is freed
  and re-queued at the front, to be prefilled again with its prompt and the tokens it had
  generated, and the step is tried again;
- **block events**: the cache publishes table changes into a ring read by a
  ``BlockTableMirror``, compared with the cache's own tables on checked steps;
- **checks**: on every ``check_every``-th step, the attention output of up to
  ``check_seqs`` sequences is compared with float64 attention over their exact FP16 K/V;
- **faults** (``fault_tolerance=True``): sampled verification, one injected corruption,
  its detection and repair (:class:`hexcore.serve_faults.FaultDrill`).

With ``format`` (a format by age, e.g. ``"int2-aged"``, ``docs/formats.md``) the Engine holds
blocks in a pool per kind, sized by ``hexcore.host.pool_blocks_for`` so that ``max_seqs``
sequences always fit the bounded pools and ``num_blocks`` is the last pool's: admission
counts the last pool's free blocks; a step seals and re-seals as blocks age; there is no
speculative allocation, event ring or fault drill (the Engine refuses them with a format),
and the step runs eagerly (no CUDA graph yet).
"""

from __future__ import annotations

import collections
import dataclasses
import math
import time
import warnings

import numpy as np

from ._checks import as_int
from .config import KVCacheConfig
from .errors import HexcoreInvalidArgumentError
from .serve_workload import TokenTable, Workload, exact_attention, synthetic_workload

__all__ = ["Request", "ServeReport", "Server", "TokenTable", "Workload", "exact_attention", "synthetic_workload"]

@dataclasses.dataclass
class Request:
    """One request's progress: ``generated`` tokens so far; ``seq`` its sequence while running."""

    req_id: int
    prompt_len: int
    output_len: int
    generated: int = 0
    seq: int = -1
    preempted: int = 0


@dataclasses.dataclass
class ServeReport:
    """What a serving run did. Times in seconds; errors are relative L2 norms."""

    requests: int = 0
    requests_finished: int = 0
    steps: int = 0
    reseals: int = 0
    decode_tokens: int = 0
    prefill_tokens: int = 0
    recomputed_tokens: int = 0
    preemptions: int = 0
    peak_batch: int = 0
    peak_active_blocks: int = 0
    peak_tokens: int = 0
    peak_kv_bytes: int = 0
    peak_kv_bytes_fp16: int = 0
    step_seconds: list = dataclasses.field(default_factory=list)
    prefill_seconds: float = 0.0
    wall_seconds: float = 0.0
    seals: int = 0
    seal_hits: int = 0
    mispredicted: int = 0
    events_applied: int = 0
    mirror_mismatches: int = 0
    corruptions_injected: int = 0
    corruptions_detected: int = 0
    sequences_migrated: int = 0
    blocks_verified: int = 0
    checked_outputs: int = 0
    errors: list = dataclasses.field(default_factory=list)

    @property
    def max_error(self) -> float:
        return max(self.errors, default=math.nan)

    @property
    def mean_error(self) -> float:
        return float(np.mean(self.errors)) if self.errors else math.nan


def _engine(cfg: KVCacheConfig, num_blocks: int, max_seqs: int, num_q_heads: int, batch_buckets, format,
            fault_tolerance: bool):
    """The run's Engine: speculative allocation over one pool, or a format by age's pools."""
    from .engine import Engine

    if format is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the simulator runs graphs eagerly, and says so
            return Engine(cfg, num_blocks, max_seqs, num_q_heads, batch_buckets=batch_buckets, speculative=True)
    from .host import pool_blocks_for

    if fault_tolerance:
        from .errors import HexcoreConfigError

        raise HexcoreConfigError(f"fault_tolerance: not with a format by age (format={format!r:.40})")
    return Engine(cfg, num_blocks, max_seqs, num_q_heads, format=format,
                  pool_blocks=pool_blocks_for(format, cfg.block_size, num_blocks, max_seqs))


def _check_kinds(cfg, workload, on_step, fault_tolerance) -> None:
    """Server's arguments that are not ints: of the kind it takes, or HexcoreInvalidArgumentError."""
    if not isinstance(cfg, KVCacheConfig):
        raise HexcoreInvalidArgumentError(f"cfg: expected KVCacheConfig, got {type(cfg).__name__}")
    if not isinstance(workload, Workload):
        raise HexcoreInvalidArgumentError(f"workload: expected a Workload, got {type(workload).__name__}")
    if on_step is not None and not callable(on_step):
        raise HexcoreInvalidArgumentError(f"on_step: expected a callable or None, got {type(on_step).__name__}")
    if not isinstance(fault_tolerance, (bool, np.bool_)):
        raise HexcoreInvalidArgumentError(f"fault_tolerance: expected a bool, got {fault_tolerance!r:.60}")


def _synchronize() -> None:
    from numba import cuda

    cuda.synchronize()


class Server:
    """A continuous-batching serving run over an :class:`~hexcore.engine.Engine` (see the
    module docstring). ``run()`` serves the workload and returns a :class:`ServeReport`.

    ``cfg`` a KVCacheConfig, ``workload`` a Workload; ints: ``num_blocks``,
    ``max_prefill_tokens``, ``check_every`` and ``sample_every`` >= 1, ``seed`` and
    ``check_seqs`` >= 0, ``inject_at`` >= 0 or None; ``on_step`` a callable or None,
    ``fault_tolerance`` a bool; the Engine checks the rest. A bad one raises
    HexcoreInvalidArgumentError (HexcoreConfigError from the Engine) naming it, before
    anything is made.
    """

    def __init__(self, cfg: KVCacheConfig, num_q_heads: int, num_blocks: int, max_seqs: int,
                 workload: Workload, seed: int = 0, max_prefill_tokens: int = 4096, check_every: int = 8,
                 check_seqs: int = 2, batch_buckets=(1, 2, 4, 8, 16, 32, 64), on_step=None,
                 fault_tolerance: bool = False, sample_every: int = 4, inject_at: int | None = None,
                 format=None):
        _check_kinds(cfg, workload, on_step, fault_tolerance)
        num_blocks, seed, max_prefill_tokens = (as_int("num_blocks", num_blocks, low=1), as_int("seed", seed, low=0),
                                                as_int("max_prefill_tokens", max_prefill_tokens, low=1))
        check_every, check_seqs = as_int("check_every", check_every, low=1), as_int("check_seqs", check_seqs, low=0)
        sample_every = as_int("sample_every", sample_every, low=1)
        inject_at = None if inject_at is None else as_int("inject_at", inject_at, low=0)
        longest = int((workload.prompt_lens + workload.output_lens).max(initial=0))
        if longest // cfg.block_size + 1 > num_blocks:
            raise HexcoreInvalidArgumentError(f"num_blocks: a request of {longest} tokens needs "
                                              f"{longest // cfg.block_size + 1} blocks, got {num_blocks}")

        self.engine = _engine(cfg, num_blocks, max_seqs, num_q_heads, batch_buckets, format, fault_tolerance)
        self.cfg, self.num_q_heads, self.workload = cfg, num_q_heads, workload
        self.cache, self.tiered = self.engine.cache, self.engine.format is not None
        self.ring = self.mirror = None  # the block event ring and its mirror (none with a format)
        kinds = self.cache.kinds if self.tiered else [cfg.kv_dtype]  # bytes of a block of each pool, all layers
        self._block_bytes = [dataclasses.replace(cfg, kv_dtype=kind).block_bytes for kind in kinds]
        self._fp16_block_bytes = dataclasses.replace(cfg, kv_dtype="fp16").block_bytes
        if not self.tiered:
            self.resume_events()
        self.tokens = TokenTable(cfg, seed)
        self.rng = np.random.default_rng([seed, 2])
        self.max_prefill_tokens, self.check_every, self.check_seqs = max_prefill_tokens, check_every, check_seqs
        self.on_step = on_step or (lambda report, server: None)
        self.requests = [Request(i, int(p), int(o)) for i, (p, o) in
                         enumerate(zip(workload.prompt_lens, workload.output_lens))]
        self.waiting: collections.deque = collections.deque()
        self.running: list[Request] = []  # in admission order (the last is preempted first)
        self.report = ServeReport(requests=workload.num_requests)
        self._next_arrival = 0
        self.faults = None  # a FaultDrill: sampled verification, one injected corruption at inject_at
        if fault_tolerance:
            from .serve_faults import FaultDrill

            self.faults = FaultDrill(self, sample_every, inject_at)

    # -- the block event mirror -------------------------------------------------------------
    def pause_events(self) -> None:
        """Apply the events published so far, then detach the ring (for in-place table edits)."""
        self._poll_events()
        self.cache.attach_event_ring(None)

    def _poll_events(self) -> None:
        if self.mirror is not None:
            self.report.events_applied += self.mirror.poll()

    def resume_events(self) -> None:
        """A fresh event ring, and a mirror that starts from the cache's tables as they are."""
        from .host import BlockTableMirror, LockFreeRingBuffer

        self.ring = LockFreeRingBuffer(1 << 16, 4)
        self.cache.attach_event_ring(self.ring)
        self.mirror = BlockTableMirror.like(self.cache, self.ring)

    # -- scheduling -----------------------------------------------------------------------
    def _arrive(self, step_no: int) -> None:
        arrivals = self.workload.arrivals
        while self._next_arrival < len(arrivals) and arrivals[self._next_arrival] <= step_no:
            self.waiting.append(self.requests[self._next_arrival])
            self._next_arrival += 1

    def _admit(self) -> None:
        budget, bs = self.max_prefill_tokens, self.cfg.block_size
        while self.waiting and self.cache.num_sequences < self.cache.max_seqs:
            req = self.waiting[0]
            n = req.prompt_len + req.generated  # a preempted request recomputes what it had
            if n > budget and budget < self.max_prefill_tokens:
                break  # this step's prefill budget is spent
            if self._free_blocks() < n // bs + 1:
                if not self.running and self._free_blocks() + self._reserved_blocks() < n // bs + 1:
                    from .errors import HexcoreOOMError

                    raise HexcoreOOMError(f"request {req.req_id} needs {n // bs + 1} blocks and nothing runs: "
                                          f"{self._free_blocks()} free")
                break  # admission by free blocks: its prompt, and a block for its next seal
            self.waiting.popleft()
            t0 = time.perf_counter()
            req.seq = self.engine.add()
            k, v = self.tokens.span(req.req_id, 0, n)
            self.engine.prefill(req.seq, k, v)
            if self.faults is not None:
                self.faults.record_prefill(req.seq)
            _synchronize()
            self.report.prefill_seconds += time.perf_counter() - t0
            self.report.prefill_tokens += n
            self.report.recomputed_tokens += req.generated
            budget -= n
            self.running.append(req)

    def _free_blocks(self) -> int:
        """Blocks free for a request's sealed blocks: the cache's free stack, or with a format
        the last pool's (the pools before it always hold ``max_seqs`` sequences)."""
        return self.cache.pools[-1].num_free_blocks if self.tiered else self.cache.num_free_blocks

    @property
    def active_blocks(self) -> int:
        """Blocks in use now (sealed and open tails), summed over every pool of a format by age."""
        return sum(pool.num_active_blocks for pool in self._pools)

    @property
    def _pools(self) -> list:
        """The block managers: a format by age's pools, or the one cache."""
        return self.cache.pools if self.tiered else [self.cache]

    def _reserved_blocks(self) -> int:
        return 0 if self.tiered else self.cache.num_reserved_blocks

    def _kv_bytes(self) -> tuple[int, int]:
        """(bytes of the sealed blocks in use, what FP16 blocks would take), all layers."""
        used = [pool.num_active_blocks for pool in self._pools]
        return sum(n * size for n, size in zip(used, self._block_bytes)), sum(used) * self._fp16_block_bytes

    def _step_preempting(self):
        """``Engine.step`` over the running requests, preempting the latest admitted while the
        pool is short: ``(EngineStep, start time)``, or ``(None, 0.0)`` when none is left."""
        from .errors import HexcoreOOMError

        while self.running:
            t0 = time.perf_counter()
            try:
                return self.engine.step(np.array([r.seq for r in self.running], np.int32)), t0
            except HexcoreOOMError:  # the step changed nothing
                self.preempt(self.running[-1])
        return None, 0.0

    # -- a step ---------------------------------------------------------------------------
    def _decode(self, step_no: int, step, t0: float, verify_seconds: float = 0.0) -> None:
        """Fill and run ``step`` (an EngineStep begun at ``t0``); its latency counts the
        Engine's calls and the verification before it, not making up the tokens."""
        cfg, B = self.cfg, step.batch
        L, H, D = cfg.num_layers, cfg.num_kv_heads, cfg.head_dim
        host_seconds = time.perf_counter() - t0
        positions = (step.result.seq_lens - 1).tolist()  # the new token's position
        k = np.empty((L, B, H, D), np.float16)
        v = np.empty_like(k)
        for j, req in enumerate(self.running):
            row = self.tokens.rows(req.req_id, np.int64(positions[j]))
            k[:, j], v[:, j] = self.tokens.k[row], self.tokens.v[row]
        q = self.rng.standard_normal((L, B, self.num_q_heads, D), np.float32).astype(np.float16)
        t1 = time.perf_counter()
        step.write(q, k, v)
        step.run()
        if self.faults is not None:
            self.faults.record_step(step.result)
        _synchronize()
        self.report.step_seconds.append(host_seconds + time.perf_counter() - t1 + verify_seconds)
        self._count_seals(step.result)
        self._poll_events()
        if step_no % self.check_every == 0:
            self._check(step, q, positions)

    def _count_seals(self, result) -> None:
        if self.tiered:  # a TieredStep: its operations, seals (source kind SEAL) and re-seals
            from .host.tiered import OP_SRC_KIND, SEAL

            sealed = int((result.ops[:, OP_SRC_KIND] == SEAL).sum())
            self.report.seals += sealed
            self.report.reseals += len(result.ops) - sealed
        else:
            self.report.seals += result.num_sealed
            self.report.seal_hits += result.num_hits

    def preempt(self, victim: Request) -> None:
        """Free ``victim``'s sequence and queue it first, to be recomputed when admitted again."""
        self.running.remove(victim)
        self.engine.finish(victim.seq)
        victim.seq, victim.preempted = -1, victim.preempted + 1
        self.waiting.appendleft(victim)
        self.report.preemptions += 1

    def _check(self, step, q: np.ndarray, positions: list) -> None:
        """Attention of up to ``check_seqs`` sequences against float64 over their exact K/V;
        the event mirror's tables against the cache's."""
        out = step.output().astype(np.float64)
        scale = 1.0 / math.sqrt(self.cfg.head_dim)
        picks = self.rng.choice(len(self.running), min(self.check_seqs, len(self.running)), replace=False)
        for j in picks:
            req = self.running[j]
            keys, values = self.tokens.span(req.req_id, 0, positions[j] + 1)
            for layer in range(self.cfg.num_layers):
                expect = exact_attention(q[layer, j], keys[layer], values[layer], scale)
                self.report.errors.append(float(np.linalg.norm(out[layer, j] - expect) / np.linalg.norm(expect)))
                self.report.checked_outputs += 1
        for req in self.running if self.mirror is not None else ():
            if not np.array_equal(self.mirror.block_table(req.seq), self.cache.block_table(req.seq)):
                self.report.mirror_mismatches += 1

    def _retire(self) -> None:
        still = []
        for req in self.running:
            req.generated += 1
            if req.generated >= req.output_len:
                self.engine.finish(req.seq)
                req.seq = -1
                self.report.requests_finished += 1
            else:
                still.append(req)
        self.running = still

    def run(self, max_steps: int | None = None) -> ServeReport:
        """Serve until every request finished (or ``max_steps`` steps, an int >= 0 or None); the report."""
        max_steps = None if max_steps is None else as_int("max_steps", max_steps, low=0)
        report, start = self.report, time.perf_counter()
        step_no = 0
        while (report.requests_finished < report.requests and (max_steps is None or step_no < max_steps)):
            self._arrive(step_no)
            self._admit()
            step, t0, verify_seconds = None, 0.0, 0.0
            if self.running and self.faults is not None:
                self.faults.inject(step_no)
                verify_seconds = self.faults.verify(np.array([r.seq for r in self.running], np.int32))
            if self.running:
                step, t0 = self._step_preempting()
            if step is not None:
                self._decode(step_no, step, t0, verify_seconds)
                report.steps += 1
                report.decode_tokens += step.batch
                report.peak_batch = max(report.peak_batch, step.batch)
                if not self.tiered:
                    report.peak_active_blocks = max(report.peak_active_blocks, self.cache.num_active_blocks)
                kv_bytes, fp16_bytes = self._kv_bytes()
                if kv_bytes > report.peak_kv_bytes:
                    report.peak_kv_bytes, report.peak_kv_bytes_fp16 = kv_bytes, fp16_bytes
                report.peak_tokens = max(report.peak_tokens, sum(self.cache.seq_len(r.seq) for r in self.running))
                self._retire()
            step_no += 1
            self.on_step(report, self)
        self._poll_events()
        if self.engine.speculative is not None:
            report.mispredicted = self.engine.speculative.mispredicted()
        if self.faults is not None:
            self.faults.finish(report)
        report.wall_seconds = time.perf_counter() - start
        self.check_invariants()
        return report

    def check_invariants(self) -> None:
        """The cache's invariants; every reservation a hit, mispredicted or pending; every
        seal that hit a reserved block was a step's (a prefill never finds one)."""
        if self.tiered:
            self.cache.check_invariants()
            return
        spec = self.engine.speculative
        spec.check_invariants()
        assert spec.confirmed_hits() == self.report.seal_hits, (spec.stats(), self.report.seal_hits)
