"""Seal latency on the prefetch hit and miss paths; the cost of applying predictions and
of publishing and mirroring block events.

Run: ``.venv/bin/python -m benchmarks.bench_speculative`` (prints a table; minimum over
rounds, each round on fresh state). ``pytest benchmarks/bench_speculative.py`` runs it once.
"""

from __future__ import annotations


import numpy as np

from benchmarks.per_unit import min_ns
from hexcore import KVCacheConfig
from hexcore.host import LockFreeRingBuffer, PagedKVCache, SpeculativeAllocator
from hexcore.host.events import BlockTableMirror

BS, NUM_SEQS, NUM_BLOCKS, ROUNDS = 16, 256, 65536, 200
CONFIG = KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=64, block_size=BS)
IDS = np.arange(NUM_SEQS, dtype=np.int32)


def _fresh(cache, length=BS - 1):
    """Every sequence live at ``length`` tokens: the next token seals each tail."""
    for s in range(NUM_SEQS):
        if cache.is_live(s):
            cache.free_sequence(s)
        cache.add_sequence(s)
        cache.grow_sequence(s, length)


def seal_step(hit: bool, events: bool = False) -> float:
    """ns per seal: one step of NUM_SEQS sequences, every one sealing (hit: all reserved)."""
    cache = PagedKVCache(CONFIG, NUM_BLOCKS, NUM_SEQS, max_seq_len=64 * BS)
    if events:
        ring = LockFreeRingBuffer(1024, 4)
        cache.attach_event_ring(ring)
        mirror = BlockTableMirror.like(cache, ring)

    def setup():
        _fresh(cache)
        if hit:
            cache.reserve_blocks(IDS)
        if events:
            cache.flush_events(), mirror.poll(), cache.flush_events(), mirror.poll()

    return min_ns(setup, lambda: cache.step(IDS), ROUNDS) / NUM_SEQS


def seal_call(hit: bool) -> float:
    """ns per sealing ``grow_sequence`` call from Python (hit: the sequence holds a reservation)."""
    cache = PagedKVCache(CONFIG, NUM_BLOCKS, NUM_SEQS, max_seq_len=64 * BS)
    grow = cache.grow_sequence

    def setup():
        _fresh(cache)
        if hit:
            cache.reserve_blocks(IDS)

    def run():
        for s in range(NUM_SEQS):
            grow(s, BS)

    return min_ns(setup, run, ROUNDS) / NUM_SEQS


def apply_predictions() -> float:
    """ns per prediction: SpeculativeAllocator.apply reserving NUM_SEQS predicted blocks."""
    cache = PagedKVCache(CONFIG, NUM_BLOCKS, NUM_SEQS, max_seq_len=64 * BS)
    spec = SpeculativeAllocator(cache, capacity=1024)

    def setup():
        _fresh(cache)
        spec.predict(IDS)

    return min_ns(setup, spec.apply, ROUNDS) / NUM_SEQS


def spec_step_hit() -> float:
    """ns per seal: SpeculativeAllocator.step (apply of NUM_SEQS predictions + a step of hits)."""
    cache = PagedKVCache(CONFIG, NUM_BLOCKS, NUM_SEQS, max_seq_len=64 * BS)
    spec = SpeculativeAllocator(cache, capacity=1024)

    def setup():
        _fresh(cache)
        spec.predict(IDS)

    return min_ns(setup, lambda: spec.step(IDS), ROUNDS) / NUM_SEQS


def mirror_rate() -> float:
    """Events/s a BlockTableMirror applies (SEALED events, batches of 1024)."""
    ring = LockFreeRingBuffer(4096, 4)
    mirror = BlockTableMirror(ring, NUM_BLOCKS, NUM_SEQS, 64)
    n = 4096 - NUM_SEQS
    alloc = np.array([[0, s, 0, -1] for s in range(NUM_SEQS)], np.int64)
    seals = np.array([[1, i % NUM_SEQS, i // NUM_SEQS, i] for i in range(n)], np.int64)
    frees = np.array([[2, s, 0, -1] for s in range(NUM_SEQS)], np.int64)

    def setup():
        ring.push_batch(alloc), mirror.poll(), ring.push_batch(seals)

    best = min_ns(setup, lambda: (mirror.poll(), ring.push_batch(frees), mirror.poll()), rounds=50)
    return (n + NUM_SEQS) / (best * 1e-9)


def run_all() -> list[tuple[str, str]]:
    """(what, figure) rows, every figure measured now."""
    hit, miss = seal_step(True), seal_step(False)
    call_hit, call_miss = seal_call(True), seal_call(False)
    ev_on = seal_step(False, events=True)
    return [
        ("seal in a 256-seq step, hit (reserved block)", f"{hit:.1f} ns/seal"),
        ("seal in a 256-seq step, miss (free stack)", f"{miss:.1f} ns/seal"),
        ("sealing grow_sequence call, hit", f"{call_hit:.0f} ns/call"),
        ("sealing grow_sequence call, miss", f"{call_miss:.0f} ns/call"),
        ("SpeculativeAllocator.apply, 256 predictions", f"{apply_predictions():.1f} ns/prediction"),
        ("SpeculativeAllocator.step, 256 predicted seals (apply + step)", f"{spec_step_hit():.1f} ns/seal"),
        ("seal in a 256-seq step, miss, event ring attached", f"{ev_on:.1f} ns/seal "
         f"(+{ev_on - miss:.1f} ns/event)"),
        ("BlockTableMirror.poll applying events", f"{mirror_rate() / 1e6:.0f} M events/s"),
    ]


def test_bench_speculative_smoke():
    for what, figure in run_all():
        print(f"{what}: {figure}")


if __name__ == "__main__":
    print("| operation | figure |\n| --- | --- |")
    for what, figure in run_all():
        print(f"| {what} | {figure} |")
