"""A serving loop over the whole cache, through the Engine: the block manager drives the kernels.

There is no model: each step draws random q, k, v for every live sequence. What is real
is the cache: the :class:`~hexcore.engine.Engine` grows, forks and frees sequences and
runs each step's fork copies, appends, seals and attention (a CUDA graph replay on a GPU).
Every step the attention output is checked against float64 attention over the exact
(unquantized) K/V the loop produced, so the printed error is the cache's quantization
error, end to end.
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings

import numpy as np

from .config import KVCacheConfig


@dataclasses.dataclass
class ServeReport:
    """What one serving run did."""

    steps: int
    tokens: int
    forks: int
    finished: int
    max_rel_error: float
    seconds: float


def _attention(q, keys, values, scale):
    # q [Hq, D]; keys, values [H, n, D] float64 -> [Hq, D]
    group = q.shape[0] // keys.shape[0]
    out = np.empty(q.shape)
    for hq in range(q.shape[0]):
        s = keys[hq // group] @ q[hq].astype(np.float64) * scale
        p = np.exp(s - s.max())
        out[hq] = p / p.sum() @ values[hq // group]
    return out


def serve(cfg: KVCacheConfig, num_q_heads: int, max_seqs: int, num_blocks: int, steps: int,
          prompt_range: tuple[int, int], seed: int = 0, log=print) -> ServeReport:
    """Run ``steps`` decode steps over ``max_seqs`` sequences with random prompts.

    ``max_seqs - 1`` sequences are live; one finishes after 3-12 generated tokens and is
    replaced by a new prompt; every fifth step the first sequence is forked into the
    free slot.
    """
    from .engine import Engine

    rng = np.random.default_rng(seed)
    L, H, D = cfg.num_layers, cfg.num_kv_heads, cfg.head_dim
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the simulator runs graphs eagerly, and says so
        engine = Engine(cfg, num_blocks, max_seqs, num_q_heads, batch_buckets=(1, 2, 4, 8, 16))
    engine.store.poison()
    history: dict[int, list] = {}  # seq -> [k [L, n, H, D], v [...]] exact values appended
    budget: dict[int, int] = {}  # seq -> tokens it still generates
    report = ServeReport(0, 0, 0, 0, 0.0, 0.0)
    start = time.perf_counter()

    def admit() -> None:
        while engine.cache.num_sequences < max_seqs - 1:  # one slot stays free for forks
            seq = engine.add()
            n = int(rng.integers(*prompt_range))
            k = rng.standard_normal((L, n, H, D)).astype(np.float16)
            v = rng.standard_normal((L, n, H, D)).astype(np.float16)
            engine.prefill(seq, k, v)
            history[seq], budget[seq] = [k, v], int(rng.integers(3, 13))

    admit()
    for step_no in range(steps):
        if step_no % 5 == 2 and engine.cache.num_sequences < max_seqs:
            parent = min(history)
            child = engine.fork(parent)
            history[child] = [a.copy() for a in history[parent]]
            budget[child] = budget[parent]
            report.forks += 1
        seq_ids = np.array(sorted(history), np.int32)
        step = engine.step(seq_ids)
        B = len(seq_ids)
        q = rng.standard_normal((L, B, num_q_heads, D)).astype(np.float16)
        k = rng.standard_normal((L, B, H, D)).astype(np.float16)
        v = rng.standard_normal((L, B, H, D)).astype(np.float16)
        step.write(q, k, v)
        step.run()
        got = step.output().astype(np.float64)
        for j, seq in enumerate(seq_ids):
            history[seq] = [np.concatenate([history[seq][0], k[:, j:j + 1]], axis=1),
                            np.concatenate([history[seq][1], v[:, j:j + 1]], axis=1)]
        worst = 0.0
        for layer in range(L):
            for j, seq in enumerate(seq_ids):
                keys = history[seq][0][layer].transpose(1, 0, 2).astype(np.float64)
                values = history[seq][1][layer].transpose(1, 0, 2).astype(np.float64)
                expect = _attention(q[layer, j], keys, values, 1 / math.sqrt(D))
                worst = max(worst, float(np.linalg.norm(got[layer, j] - expect) / np.linalg.norm(expect)))
        report.max_rel_error = max(report.max_rel_error, worst)
        report.steps += 1
        report.tokens += B
        lens = step.result.seq_lens[:B]
        log(f"step {step_no:3}: {B} seqs, lengths {int(lens.min())}-{int(lens.max())}, "
            f"{step.result.num_sealed} sealed, {engine.cache.num_active_blocks}/{num_blocks} blocks live, "
            f"attention rel. error {worst:.2e}")
        for seq in seq_ids:
            budget[seq] -= 1
            if budget[seq] == 0:
                engine.finish(int(seq))
                del history[seq], budget[seq]
                report.finished += 1
        engine.cache.check_invariants()
        admit()
    report.seconds = time.perf_counter() - start
    return report
