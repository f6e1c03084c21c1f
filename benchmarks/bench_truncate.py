"""``PagedKVCache.truncate_sequence`` on this CPU: a cut inside the open tail, and a cut on a
block boundary that drops 4 sealed blocks (timed around the cut alone; the regrow between
cuts is not timed). Best of 7 rounds, prefix cache off and on.

    python -m benchmarks.bench_truncate
"""

from __future__ import annotations

import time

import numpy as np

from hexcore import KVCacheConfig
from hexcore.host import PagedKVCache


def measure(prefix: bool, rounds: int = 7) -> tuple[float, float]:
    """(tail cut, boundary cut) in us per call, best of ``rounds``."""
    cfg = KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=64, block_size=16)
    cache = PagedKVCache(cfg, 4096, 64, prefix_cache=prefix)
    seq = cache.add_sequence()
    tokens = np.arange(1024, dtype=np.int32)
    cache.grow_sequence(seq, 1000, tokens[:1000])
    cache.truncate_sequence(seq, 999)
    tails, cuts = [], []
    for _ in range(rounds):
        start = time.perf_counter_ns()
        for _ in range(5000):
            cache.truncate_sequence(seq, 999)
        tails.append((time.perf_counter_ns() - start) / 5000)
        total = 0
        for _ in range(1000):
            start = time.perf_counter_ns()
            cache.truncate_sequence(seq, 928)  # 62 -> 58 sealed blocks
            total += time.perf_counter_ns() - start
            cache.grow_sequence(seq, 999, tokens[928:999])
        cuts.append(total / 1000)
    cache.check_invariants()
    return min(tails) / 1000, min(cuts) / 1000


def main() -> None:
    for prefix in (False, True):
        tail, cut = measure(prefix)
        print(f"prefix_cache={prefix}: tail cut {tail:.2f} us/call; boundary cut dropping 4 blocks {cut:.2f} us/call")


if __name__ == "__main__":
    main()
