"""The serving run's fault drill: sampled verification, one injected corruption, its repair.

A :class:`FaultDrill` puts a :class:`~hexcore.fault.FaultTolerantKVCache` beside a
:class:`~hexcore.serve.Server`'s cache and, each step:

- **records** the checksum of every block the step's prefills and seals wrote;
- **injects**, once (at or after step ``inject_at``), one flipped bit in a sealed block of
  the running request with the most tokens still to go, so sampled verification reaches it;
- **verifies** a sample of the running sequences' blocks (each block once in
  ``sample_every`` steps); a sequence holding a corrupted block is **migrated** to fresh
  blocks (preempting the latest other requests while the pool is short) and its lost block
  recomputed from the request's exact K/V. The event ring is detached meanwhile, because a
  migration edits block tables in place, and a fresh mirror follows the tables afterwards.

The time verification takes is part of the step's latency (returned by :meth:`verify`).
"""

from __future__ import annotations

import time

import numpy as np

from ._checks import as_int
from .errors import HexcoreInvalidArgumentError


class FaultDrill:
    """Sampled verification and one injected corruption for a Server (see the module docstring).

    Parameters
    ----------
    server : the :class:`~hexcore.serve.Server` whose cache, running requests and report it
        uses (one without a format by age: the drill needs its single store).
    sample_every : each block is verified once in this many steps (an int >= 1).
    inject_at : the first step at which one bit may be flipped (an int >= 0; None: no injection).

    A bad argument raises HexcoreInvalidArgumentError naming it.
    """

    def __init__(self, server, sample_every: int, inject_at: int | None):
        from .fault import FaultTolerantKVCache
        from .serve import Server

        if not isinstance(server, Server) or server.engine.store is None:
            got = "one in a format by age" if isinstance(server, Server) else type(server).__name__
            raise HexcoreInvalidArgumentError(f"server: expected a Server without a format by age, got {got}")
        sample_every = as_int("sample_every", sample_every, low=1)
        inject_at = None if inject_at is None else as_int("inject_at", inject_at, low=0)

        self.server, self.sample_every, self.inject_at = server, sample_every, inject_at
        self.ft = FaultTolerantKVCache(server.cache, server.engine.store, policy="sampled", sample_every=sample_every)

    def record_prefill(self, seq_id: int) -> None:
        """Checksums of the blocks a prefill of ``seq_id`` sealed."""
        table = self.server.cache.block_table(seq_id)
        if len(table):
            self.ft.record(table)

    def record_step(self, result) -> None:
        """Checksums of the blocks a step sealed (``result``: its StepResult)."""
        self.ft.record_seals(result)

    def inject(self, step_no: int) -> None:
        """Flip one bit of a sealed block of the running request with the most tokens still to
        go (enough for sampled verification to reach it), once, at or after ``inject_at``."""
        server = self.server
        if self.inject_at is None or step_no < self.inject_at or server.report.corruptions_injected:
            return
        cands = [r for r in server.running if len(server.cache.block_table(r.seq))
                 and r.output_len - r.generated > self.sample_every]
        if cands:
            req = max(cands, key=lambda r: r.output_len - r.generated)
            block = int(server.cache.block_table(req.seq)[0])
            self.ft.flip_bit("k_codes", 0, block, 0, 3)
            server.report.corruptions_injected += 1

    def verify(self, seq_ids: np.ndarray) -> float:
        """Sampled verification of the blocks of ``seq_ids`` (int32 [B]); a corrupted sequence
        is migrated and its lost block recomputed. The seconds it took."""
        from .errors import Status

        t0 = time.perf_counter()
        if self.ft.try_verify(seq_ids) is not Status.CORRUPTED:
            return time.perf_counter() - t0
        server, found = self.server, self.ft.last_report
        server.report.corruptions_detected += len(found.block_ids)
        by_seq = {r.seq: r for r in server.running}
        server.pause_events()  # migration edits tables in place
        for seq in found.seq_ids:
            moved = self._migrate(seq)
            for logical, _, (start, stop) in moved["lost"]:
                k, v = server.tokens.span(by_seq[seq].req_id, start, stop)
                self.ft.refill(seq, logical, k, v)
            server.report.sequences_migrated += 1
        server.resume_events()
        self.ft.verify(np.array([r.seq for r in server.running], np.int32))  # clean now
        return time.perf_counter() - t0

    def _migrate(self, seq: int) -> dict:
        """``migrate_sequence``, preempting the latest other requests while the pool is short."""
        from .errors import HexcoreOOMError

        while True:
            try:
                return self.ft.migrate_sequence(seq)
            except HexcoreOOMError:
                others = [r for r in self.server.running if r.seq != seq]
                if not others:
                    raise
                self.server.preempt(others[-1])

    def finish(self, report) -> None:
        """Blocks verified over the run into ``report``; the fault-tolerance invariants."""
        report.blocks_verified = self.ft.stats()["blocks_verified"]
        self.ft.check_invariants()
