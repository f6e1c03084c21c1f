"""Continuous batching over the Engine: a synthetic serving workload through the whole cache.

There is no model: a token's K/V is a row of a fixed random table chosen by (request,
position), so a recomputed prefix has the same K/V as the first time and the exact
reference of any sequence can be rebuilt; queries are fresh random rows each step.
What is real is the cache, driven the way a serving engine drives it:

- **arrivals**: request ``i`` arrives at step ``workload.arrivals[i]`` with a prompt and
  an output length drawn from a distribution (:func:`synthetic_workload`);
- **admission by free blocks**: a waiting request is prefilled (``Engine.prefill``:
  append and seal) when the free stack holds its prompt's blocks plus one for its next
  seal, a sequence slot is free, and the step's prefill budget allows;
- **speculative allocation**: each step a producer predicts the sequences whose next
  token seals (``next_sealers``) and pushes them into a ring; the owner reserves their
  blocks (``SpeculativeAllocator.apply``) before the block manager's batch step;
- **preemption by recompute**: when the step's seals need more blocks than are free,
  reservations go back, then the most recently admitted request is freed and re-queued
  at the front, to be prefilled again with its prompt and the tokens it had generated;
- **the step**: ``Engine.step`` (the block manager's batch step), then fork copies,
  append, seal and attention for every layer (``EngineStep.run``: one CUDA graph replay
  on a GPU, eager launches on the simulator);
- **block events**: the cache publishes table changes into a ring read by a
  ``BlockTableMirror``, compared with the cache's own tables on checked steps;
- **checks**: on every ``check_every``-th step, the attention output of up to
  ``check_seqs`` sequences is compared with float64 attention over their exact FP16 K/V.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import time
import warnings

import numpy as np

from .config import KVCacheConfig

TABLE_ROWS = 997  # rows of the K/V table (prime, so (request, position) spreads over it)


@dataclasses.dataclass(frozen=True)
class Workload:
    """Requests of a serving run: ``arrivals`` (steps, non-decreasing), ``prompt_lens``,
    ``output_lens``: int64 [num_requests] each."""

    arrivals: np.ndarray
    prompt_lens: np.ndarray
    output_lens: np.ndarray

    @property
    def num_requests(self) -> int:
        return len(self.arrivals)


def synthetic_workload(num_requests: int, rng: np.random.Generator, prompt_mean: float, prompt_max: int,
                       output_mean: float, output_max: int, arrivals_per_step: float) -> Workload:
    """Log-normal prompt and output lengths (sigma 0.6, clipped to [1, max]) around their
    means, Poisson arrivals at ``arrivals_per_step`` (exponential gaps, in steps)."""

    def lengths(mean, high):
        drawn = rng.lognormal(math.log(mean) - 0.18, 0.6, num_requests)
        return np.clip(np.rint(drawn), 1, high).astype(np.int64)

    prompts, outputs = lengths(prompt_mean, prompt_max), lengths(output_mean, output_max)
    arrivals = np.floor(np.cumsum(rng.exponential(1.0 / arrivals_per_step, num_requests))).astype(np.int64)
    return Workload(arrivals - arrivals[0], prompts, outputs)


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
    decode_tokens: int = 0
    prefill_tokens: int = 0
    recomputed_tokens: int = 0
    preemptions: int = 0
    peak_batch: int = 0
    peak_active_blocks: int = 0
    peak_tokens: int = 0
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


class TokenTable:
    """The K/V of token (request, position): rows of two fixed float16 tables
    ``[TABLE_ROWS, L, H, D]`` (standard normal)."""

    def __init__(self, cfg: KVCacheConfig, seed: int):
        rng = np.random.default_rng([seed, 1])
        shape = (TABLE_ROWS, cfg.num_layers, cfg.num_kv_heads, cfg.head_dim)
        self.k = rng.standard_normal(shape, np.float32).astype(np.float16)
        self.v = rng.standard_normal(shape, np.float32).astype(np.float16)

    @staticmethod
    def rows(req_id: int, positions: np.ndarray) -> np.ndarray:
        return (req_id * 7919 + positions * 104729) % TABLE_ROWS

    def span(self, req_id: int, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """K, V of positions [start, stop): float16 [L, n, H, D], C-contiguous."""
        rows = self.rows(req_id, np.arange(start, stop))
        return (np.ascontiguousarray(self.k[rows].transpose(1, 0, 2, 3)),
                np.ascontiguousarray(self.v[rows].transpose(1, 0, 2, 3)))


def exact_attention(q: np.ndarray, keys: np.ndarray, values: np.ndarray, scale: float) -> np.ndarray:
    """float64 attention of one layer: q [Hq, D]; keys, values [n, H, D] -> [Hq, D]."""
    group = q.shape[0] // keys.shape[1]
    k64, v64 = keys.astype(np.float64), values.astype(np.float64)
    out = np.empty(q.shape)
    for hq in range(q.shape[0]):
        s = k64[:, hq // group] @ q[hq].astype(np.float64) * scale
        p = np.exp(s - s.max())
        out[hq] = p / p.sum() @ v64[:, hq // group]
    return out


def _synchronize() -> None:
    from numba import cuda

    cuda.synchronize()


class Server:
    """A continuous-batching serving run over an :class:`~hexcore.engine.Engine` (see the
    module docstring). ``run()`` serves the workload and returns a :class:`ServeReport`."""

    def __init__(self, cfg: KVCacheConfig, num_q_heads: int, num_blocks: int, max_seqs: int,
                 workload: Workload, seed: int = 0, max_prefill_tokens: int = 4096, check_every: int = 8,
                 check_seqs: int = 2, batch_buckets=(1, 2, 4, 8, 16, 32, 64), on_step=None,
                 fault_tolerance: bool = False, sample_every: int = 4, inject_at: int | None = None):
        from .engine import Engine
        from .errors import HexcoreInvalidArgumentError
        from .host import BlockTableMirror, LockFreeRingBuffer, SpeculativeAllocator

        longest = int((workload.prompt_lens + workload.output_lens).max())
        if longest // cfg.block_size + 1 > num_blocks:
            raise HexcoreInvalidArgumentError(f"num_blocks: a request of {longest} tokens needs "
                                              f"{longest // cfg.block_size + 1} blocks, got {num_blocks}")

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the simulator runs graphs eagerly, and says so
            self.engine = Engine(cfg, num_blocks, max_seqs, num_q_heads, batch_buckets=batch_buckets)
        self.cfg, self.num_q_heads, self.workload = cfg, num_q_heads, workload
        self.cache = self.engine.cache
        self.spec = SpeculativeAllocator(self.cache)
        self.ring = LockFreeRingBuffer(1 << 16, 4)
        self.cache.attach_event_ring(self.ring)
        self.mirror = BlockTableMirror.like(self.cache, self.ring)
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
        self.ft = None  # a FaultTolerantKVCache: sampled verification, one injected corruption at inject_at
        if fault_tolerance:
            from .fault import FaultTolerantKVCache

            self.ft = FaultTolerantKVCache(self.cache, self.engine.store, policy="sampled", sample_every=sample_every)
        self.inject_at, self.sample_every = inject_at, sample_every

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
            if self.cache.num_free_blocks < n // bs + 1:
                if not self.running and self.cache.num_free_blocks + self.cache.num_reserved_blocks < n // bs + 1:
                    from .errors import HexcoreOOMError

                    raise HexcoreOOMError(f"request {req.req_id} needs {n // bs + 1} blocks and nothing runs: "
                                          f"{self.cache.num_free_blocks} free")
                break  # admission by free blocks: its prompt, and a block for its next seal
            self.waiting.popleft()
            t0 = time.perf_counter()
            req.seq = self.engine.add()
            k, v = self.tokens.span(req.req_id, 0, n)
            self.engine.prefill(req.seq, k, v)
            if self.ft is not None and n >= bs:
                self.ft.record(self.cache.block_table(req.seq))
            _synchronize()
            self.report.prefill_seconds += time.perf_counter() - t0
            self.report.prefill_tokens += n
            self.report.recomputed_tokens += req.generated
            budget -= n
            self.running.append(req)

    def _predict(self, seq_ids: np.ndarray) -> None:
        from .host.speculative import next_sealers

        lens = np.array([self.cache.seq_len(int(s)) for s in seq_ids], np.int64)
        out = np.empty(len(seq_ids), np.int64)
        count = next_sealers(seq_ids.astype(np.int64), lens, 1, self.cfg.block_size, out)
        if count:
            self.spec.predict(out[:count])
        self.spec.apply()

    def _preempt_until_step_fits(self) -> np.ndarray:
        from .errors import Status

        while True:
            seq_ids = np.array([r.seq for r in self.running], np.int32)
            status, _ = self.cache.can_step(seq_ids)
            if status is not Status.OUT_OF_MEMORY:
                return seq_ids
            if self.spec.release_all():
                continue
            self._preempt(self.running[-1])  # reservations are all back: freeing it mispredicts nothing

    # -- a step ---------------------------------------------------------------------------
    def _decode(self, step_no: int, seq_ids: np.ndarray, verify_seconds: float = 0.0) -> None:
        cfg, B = self.cfg, len(seq_ids)
        L, H, D = cfg.num_layers, cfg.num_kv_heads, cfg.head_dim
        positions = [self.cache.seq_len(int(s)) for s in seq_ids]  # the new token's position
        k = np.empty((L, B, H, D), np.float16)
        v = np.empty_like(k)
        for j, req in enumerate(self.running):
            row = self.tokens.rows(req.req_id, np.int64(positions[j]))
            k[:, j], v[:, j] = self.tokens.k[row], self.tokens.v[row]
        q = self.rng.standard_normal((L, B, self.num_q_heads, D), np.float32).astype(np.float16)
        t0 = time.perf_counter()
        step = self.engine.step(seq_ids)
        step.write(q, k, v)
        step.run()
        if self.ft is not None:
            self.ft.record_seals(step.result)
        _synchronize()
        self.report.step_seconds.append(time.perf_counter() - t0 + verify_seconds)
        result = step.result
        self.report.seals += result.num_sealed
        self.report.seal_hits += result.num_hits
        self.report.events_applied += self.mirror.poll()
        if step_no % self.check_every == 0:
            self._check(step, q, positions)

    # -- fault tolerance ------------------------------------------------------------------
    def _inject(self, step_no: int) -> None:
        """Flip one bit of a sealed block of the running request with the most tokens still to
        go (enough for sampled verification to reach it), once, at or after ``inject_at``."""
        if self.ft is None or self.inject_at is None or step_no < self.inject_at or self.report.corruptions_injected:
            return
        cands = [r for r in self.running if len(self.cache.block_table(r.seq))
                 and r.output_len - r.generated > self.sample_every]
        if cands:
            req = max(cands, key=lambda r: r.output_len - r.generated)
            block = int(self.cache.block_table(req.seq)[0])
            self.ft.flip_bit("k_codes", 0, block, 0, 3)
            self.report.corruptions_injected += 1

    def _verify(self, seq_ids: np.ndarray) -> float:
        """Sampled verification of the step's blocks; a corrupted sequence is migrated (the
        event ring detached meanwhile) and its lost block recomputed from its exact K/V."""
        from .errors import Status
        from .host import BlockTableMirror, LockFreeRingBuffer

        t0 = time.perf_counter()
        if self.ft.try_verify(seq_ids) is not Status.CORRUPTED:
            return time.perf_counter() - t0
        found = self.ft.last_report
        self.report.corruptions_detected += len(found.block_ids)
        by_seq = {r.seq: r for r in self.running}
        self.report.events_applied += self.mirror.poll()
        self.cache.attach_event_ring(None)  # migration edits tables in place
        for seq in found.seq_ids:
            moved = self._migrate(seq)
            for logical, _, (start, stop) in moved["lost"]:
                k, v = self.tokens.span(by_seq[seq].req_id, start, stop)
                self.ft.refill(seq, logical, k, v)
            self.report.sequences_migrated += 1
        self.ring = LockFreeRingBuffer(1 << 16, 4)  # a fresh mirror from the current tables
        self.cache.attach_event_ring(self.ring)
        self.mirror = BlockTableMirror.like(self.cache, self.ring)
        self.ft.verify(np.array([r.seq for r in self.running], np.int32))  # clean now
        return time.perf_counter() - t0

    def _migrate(self, seq: int) -> dict:
        """``migrate_sequence``, preempting the latest other requests while the pool is short."""
        from .errors import HexcoreOOMError

        while True:
            try:
                return self.ft.migrate_sequence(seq)
            except HexcoreOOMError:
                others = [r for r in self.running if r.seq != seq]
                if not others:
                    raise
                self._preempt(others[-1])

    def _preempt(self, victim: Request) -> None:
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
        for req in self.running:
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
        """Serve until every request finished (or ``max_steps`` steps); the report."""
        report, start = self.report, time.perf_counter()
        step_no = 0
        while (report.requests_finished < report.requests and (max_steps is None or step_no < max_steps)):
            self._arrive(step_no)
            self._admit()
            if self.running:
                self._inject(step_no)
                seq_ids = np.array([r.seq for r in self.running], np.int32)
                verify_seconds = 0.0 if self.ft is None else self._verify(seq_ids)
                self._predict(np.array([r.seq for r in self.running], np.int32))
                seq_ids = self._preempt_until_step_fits()
            if self.running:
                self._decode(step_no, seq_ids, verify_seconds)
                report.steps += 1
                report.decode_tokens += len(seq_ids)
                report.peak_batch = max(report.peak_batch, len(seq_ids))
                report.peak_active_blocks = max(report.peak_active_blocks, self.cache.num_active_blocks)
                report.peak_tokens = max(report.peak_tokens, sum(self.cache.seq_len(r.seq) for r in self.running))
                self._retire()
            step_no += 1
            self.on_step(report, self)
        report.events_applied += self.mirror.poll()
        report.mispredicted = self.spec.mispredicted()
        if self.ft is not None:
            report.blocks_verified = self.ft.stats()["blocks_verified"]
            self.ft.check_invariants()
        report.wall_seconds = time.perf_counter() - start
        self.check_invariants()
        return report

    def check_invariants(self) -> None:
        """The cache's invariants; every reservation a hit, mispredicted or pending."""
        self.cache.check_invariants()
        made, pending = self.spec.stats()["reserved"], self.cache.num_reserved_blocks
        assert made == self.report.seal_hits + self.spec.mispredicted() + pending, (made, self.report, pending)
