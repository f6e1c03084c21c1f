"""Host time of ``Engine.step`` (the block manager's part, no kernels) with the speculative
hook off and on: a step in which no sequence seals, and one in which every sequence seals.

Run: ``NUMBA_ENABLE_CUDASIM=1 .venv/bin/python -m benchmarks.bench_engine`` (prints a
table; minimum over rounds, each round on fresh state; the simulator only builds the
store, nothing runs on it). ``pytest benchmarks/bench_engine.py`` runs it once.
"""

from __future__ import annotations

import time
import warnings

import numpy as np

from hexcore import KVCacheConfig

BS, BATCH, NUM_BLOCKS, ROUNDS = 16, 64, 4096, 200
CONFIG = KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=64, block_size=BS)
IDS = np.arange(BATCH, dtype=np.int32)


def make_engine(speculative: bool):
    from hexcore.engine import Engine

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the simulator's eager graphs
        return Engine(CONFIG, NUM_BLOCKS, BATCH, 2, batch_buckets=(BATCH,), speculative=speculative)


def step_us(speculative: bool, sealing: bool, rounds: int = ROUNDS) -> float:
    """Minimum microseconds of one ``engine.step(IDS)`` over ``rounds`` fresh rounds;
    ``sealing``: every sequence's new token fills its tail (else none does)."""
    engine = make_engine(speculative)
    length = 2 * BS - 1 if sealing else 2 * BS + 3
    best = float("inf")
    for _ in range(rounds):
        for s in IDS.tolist():
            if engine.cache.is_live(s):
                engine.finish(s)
            engine.add(s)
            engine.cache.grow_sequence(s, length)  # host only: the store is not read here
        t0 = time.perf_counter_ns()
        engine.step(IDS)
        best = min(best, time.perf_counter_ns() - t0)
    if speculative and sealing:
        stats = engine.speculative.stats()
        assert stats["hits"] == rounds * BATCH and stats["misses"] == 0, stats
    return best / 1e3


def main(rounds: int = ROUNDS) -> dict:
    figures = {(spec, seal): step_us(spec, seal, rounds) for spec in (False, True) for seal in (False, True)}
    print(f"Engine.step host time, batch {BATCH}, block_size {BS} (min of {rounds} rounds, us)")
    print(f"{'step':<22}{'hook off':>10}{'hook on':>10}{'added':>10}")
    for seal, what in ((False, "no sequence seals"), (True, "every sequence seals")):
        off, on = figures[False, seal], figures[True, seal]
        print(f"{what:<22}{off:>10.1f}{on:>10.1f}{on - off:>10.1f}")
    return figures


def test_engine_step_bench_runs():
    figures = main(rounds=2)
    assert all(value > 0 for value in figures.values())


if __name__ == "__main__":
    main()
