"""A serving loop over the whole cache: the block manager drives the device kernels.

There is no model: each step draws random q, k, v for every live sequence. What is real
is the cache: ``PagedKVCache`` grows, forks and frees sequences in whole-batch calls,
and its outputs (tail slots, positions, sealed blocks, block tables) feed ``append``,
``seal``, ``copy_tails`` and ``paged_decode``. Every step the attention output is
checked against float64 attention over the exact (unquantized) K/V the loop produced,
so the printed error is the cache's quantization error, end to end.
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

from .config import KVCacheConfig
from .host import PagedKVCache


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
    from .cuda import DeviceKVStore, append, copy_tails, paged_decode, seal

    rng = np.random.default_rng(seed)
    L, H, D, BS = cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, cfg.block_size
    cache = PagedKVCache(cfg, num_blocks, max_seqs)
    store = DeviceKVStore(cfg, num_blocks, max_seqs)
    store.poison()
    history: dict[int, list] = {}  # seq -> [k [L, n, H, D], v [...]] exact values appended
    budget: dict[int, int] = {}  # seq -> tokens it still generates
    report = ServeReport(0, 0, 0, 0, 0.0, 0.0)
    start = time.perf_counter()

    def write(seq: int, k: np.ndarray, v: np.ndarray) -> None:
        # append k, v [L, n, H, D] to seq, in tail-sized chunks, sealing full tails
        done = cache.seq_len(seq)
        while k.shape[1]:
            take = min(k.shape[1], BS - done % BS)
            sealed = cache.grow_sequence(seq, done + take)
            slots = np.full(take, seq, np.int32)
            positions = np.arange(done % BS, done % BS + take, dtype=np.int32)
            append(store, np.ascontiguousarray(k[:, :take]), np.ascontiguousarray(v[:, :take]), slots, positions)
            if len(sealed):
                seal(store, np.array([seq], np.int32), np.ascontiguousarray(sealed[-1:], np.int32))
            done += take
            k, v = k[:, take:], v[:, take:]

    def admit() -> None:
        while cache.num_sequences < max_seqs - 1:  # one slot stays free for forks
            seq = cache.add_sequence()
            n = int(rng.integers(*prompt_range))
            k = rng.standard_normal((L, n, H, D)).astype(np.float16)
            v = rng.standard_normal((L, n, H, D)).astype(np.float16)
            write(seq, k, v)
            history[seq], budget[seq] = [k, v], int(rng.integers(3, 13))

    admit()
    for step in range(steps):
        if step % 5 == 2 and cache.num_sequences < max_seqs:
            parent = min(history)
            child = cache.fork_sequence(parent)
            copy_tails(store, np.array([parent], np.int32), np.array([child], np.int32))
            history[child] = [a.copy() for a in history[parent]]
            budget[child] = budget[parent]
            report.forks += 1
        seq_ids = np.array(sorted(history), np.int32)
        old_lens = np.array([cache.seq_len(s) for s in seq_ids], np.int32)
        result = cache.step(seq_ids)
        result.raise_for_status()
        k = rng.standard_normal((L, len(seq_ids), H, D)).astype(np.float16)
        v = rng.standard_normal((L, len(seq_ids), H, D)).astype(np.float16)
        append(store, k, v, result.tail_slots.copy(), old_lens % BS)
        if len(result.sealed):
            seal(store, np.ascontiguousarray(result.sealed[:, 0]), np.ascontiguousarray(result.sealed[:, 2]))
        q = rng.standard_normal((len(seq_ids), num_q_heads, D)).astype(np.float16)
        tables = np.ascontiguousarray(result.block_tables[: len(seq_ids)])
        for j, seq in enumerate(seq_ids):
            history[seq] = [np.concatenate([history[seq][0], k[:, j:j + 1]], axis=1),
                            np.concatenate([history[seq][1], v[:, j:j + 1]], axis=1)]
        worst = 0.0
        for layer in range(L):
            out = paged_decode(q, store, layer, tables, result.seq_lens.copy(), result.tail_slots.copy())
            got = out.copy_to_host().astype(np.float64)
            for j, seq in enumerate(seq_ids):
                keys = history[seq][0][layer].transpose(1, 0, 2).astype(np.float64)
                values = history[seq][1][layer].transpose(1, 0, 2).astype(np.float64)
                expect = _attention(q[j], keys, values, 1 / math.sqrt(D))
                worst = max(worst, float(np.linalg.norm(got[j] - expect) / np.linalg.norm(expect)))
        report.max_rel_error = max(report.max_rel_error, worst)
        report.steps += 1
        report.tokens += len(seq_ids)
        log(f"step {step:3}: {len(seq_ids)} seqs, lengths {int(result.seq_lens[:len(seq_ids)].min())}-"
            f"{int(result.seq_lens[:len(seq_ids)].max())}, {len(result.sealed)} sealed, "
            f"{cache.num_active_blocks}/{num_blocks} blocks live, attention rel. error {worst:.2e}")
        for seq in seq_ids:
            budget[seq] -= 1
            if budget[seq] == 0:
                cache.free_sequence(int(seq))
                del history[seq], budget[seq]
                report.finished += 1
        cache.check_invariants()
        admit()
    report.seconds = time.perf_counter() - start
    return report
