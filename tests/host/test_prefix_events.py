"""Prefix cache events: STORED / REMOVED / REUSED records, and a BlockTableMirror that knows
which prefixes a cache holds, in process and across a process boundary."""

from __future__ import annotations

import multiprocessing

import numpy as np
import pytest

from hexcore import HexcoreCorruptionError, HexcoreInvalidArgumentError, HexcoreOOMError, KVCacheConfig
from hexcore.host import BlockTableMirror, LockFreeRingBuffer, PagedKVCache
from hexcore.host import events as ev
from hexcore.host.prefix import prefix_keys, root_key
from hexcore.host.ring import TAIL

BS = 16
CONFIG = KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=64, block_size=BS)
NUM_BLOCKS, MAX_SEQS = 40, 6
# prompts share prefixes: each is a few of these 16-token pieces, and a partial one
PIECES = np.arange(6 * BS, dtype=np.int32).reshape(6, BS)


def make(**kw):
    return PagedKVCache(CONFIG, NUM_BLOCKS, MAX_SEQS, max_seq_len=12 * BS, prefix_cache=True, **kw)


def random_prompt(rng) -> np.ndarray:
    pieces = [PIECES[int(rng.integers(0, 3 if j == 0 else 6))] for j in range(int(rng.integers(0, 4)))]
    tail = np.arange(int(rng.integers(0, BS)), dtype=np.int32) + 1000
    return np.concatenate(pieces + [tail]).astype(np.int32)


def prefix_workload(cache, rng, steps):
    """Yield after each of ``steps`` random calls: admissions of prompts with shared prefixes,
    prefills and decode steps with tokens, forks, frees, pins, clears and reservations."""
    pinned = []
    for _ in range(steps):
        live = [s for s in range(cache.max_seqs) if cache.is_live(s)]
        op = int(rng.integers(9))
        s = int(rng.choice(live)) if live else -1
        if op == 0 and len(live) < cache.max_seqs or not live:
            tokens = random_prompt(rng)
            adm = cache.admit(tokens, priority=int(rng.integers(0, 8)))
            try:
                cache.grow_sequence(adm.seq_id, len(tokens), tokens=tokens[adm.cached_tokens:])
            except HexcoreOOMError:
                cache.free_sequence(adm.seq_id)
        elif op in (1, 2):
            batch = np.array(rng.choice(live, rng.integers(1, len(live) + 1), replace=False), np.int32)
            cache.step(batch, tokens=rng.integers(0, 3, len(batch)).astype(np.int32))  # may fail (OOM)
        elif op == 3 and len(live) < cache.max_seqs:
            cache.fork_sequence(s)
        elif op == 4 and (len(live) > 3 or cache.num_available_blocks < 8):
            cache.free_sequence(s)
        elif op == 5:
            tokens = random_prompt(rng)
            if cache.pin_prefix(tokens):
                pinned.append(tokens)
        elif op == 6 and pinned:
            cache.unpin_prefix(pinned.pop(int(rng.integers(len(pinned)))))
        elif op == 7 and rng.random() < 0.2:
            cache.clear_prefix_cache()
        elif op == 8:
            cache.reserve_blocks(np.array([s], np.int32))
        yield


def indexed_keys(cache) -> dict:
    return {b: cache.block_key(b) for b in range(cache.num_blocks) if cache.block_key(b) is not None}


def source_tables(cache) -> dict:
    return {s: cache.block_table(s).tolist() for s in range(cache.max_seqs) if cache.is_live(s)}


def assert_mirrors(mirror, tables, keys):
    assert mirror.live_seq_ids().tolist() == sorted(tables)
    for s, blocks in tables.items():
        assert mirror.block_table(s).tolist() == blocks
    assert mirror.stored_keys() == keys and mirror.num_stored_blocks == len(keys)
    for block, key in keys.items():
        assert mirror.block_of(key) == block


def test_events_are_exact_records():
    cache, ring = make(), LockFreeRingBuffer(64, 4)
    cache.attach_event_ring(ring)
    tokens = np.arange(2 * BS + 3, dtype=np.int32)
    k0, k1 = prefix_keys(tokens, CONFIG).tolist()
    a = cache.admit(tokens)
    cache.grow_sequence(a.seq_id, len(tokens), tokens=tokens)
    b = cache.admit(tokens)
    records = ring.pop_batch(64).tolist()
    root = root_key(CONFIG)
    assert records == [
        [ev.ALLOCATED, a.seq_id, 0, -1],
        [ev.SEALED, a.seq_id, 0, 0], [ev.STORED, 0, k0, root],
        [ev.SEALED, a.seq_id, 1, 1], [ev.STORED, 1, k1, k0],
        [ev.ALLOCATED, b.seq_id, 0, -1], [ev.REUSED, b.seq_id, 0, 0], [ev.REUSED, b.seq_id, 1, 1]]
    cache.free_sequence(a.seq_id), cache.free_sequence(b.seq_id)
    assert cache.clear_prefix_cache() == 2
    assert ring.pop_batch(64).tolist() == [[ev.FREED, a.seq_id, 0, -1], [ev.FREED, b.seq_id, 0, -1],
                                           [ev.REMOVED, 1, k1, 0], [ev.REMOVED, 0, k0, 0]]


def test_an_eviction_comes_before_the_seal_that_reuses_the_block():
    cache, ring = PagedKVCache(CONFIG, 2, 2, prefix_cache=True), LockFreeRingBuffer(64, 4)
    tokens = np.arange(2 * BS, dtype=np.int32)
    s = cache.add_sequence()
    cache.grow_sequence(s, 2 * BS, tokens=tokens)
    cache.free_sequence(s)
    cache.attach_event_ring(ring)
    assert len(ring.pop_batch(64)) == 2  # replay: the two cached blocks
    t = cache.add_sequence()
    cache.step(np.array([t], np.int32), np.array([BS], np.int32), tokens=tokens[::-1].copy()[:BS],
               token_starts=np.array([0, BS], np.int32))
    kinds = [r[0] for r in ring.pop_batch(64).tolist()]
    assert kinds == [ev.ALLOCATED, ev.REMOVED, ev.SEALED, ev.STORED]


def test_mirror_follows_a_prefix_workload(rng):
    cache, ring = make(), LockFreeRingBuffer(16, 4)  # small: events back up and get staged
    cache.attach_event_ring(ring)
    mirror = BlockTableMirror.like(cache, ring)
    for i, _ in enumerate(prefix_workload(cache, rng, 400)):
        if rng.random() < 0.3:
            mirror.poll()
        if i % 40 == 0:
            while cache.flush_events() or len(ring):
                mirror.poll()
            assert_mirrors(mirror, source_tables(cache), indexed_keys(cache))
            cache.check_invariants()
    while cache.flush_events() or len(ring):
        mirror.poll()
    assert_mirrors(mirror, source_tables(cache), indexed_keys(cache))
    stats = cache.prefix_cache_stats()
    assert stats["hits"] > 0 and stats["evicted"] > 0  # the workload reuses and evicts


def test_late_attach_replays_the_stored_keys(rng):
    cache = make()
    for _ in prefix_workload(cache, rng, 150):
        pass
    ring = LockFreeRingBuffer(1024, 4)
    cache.attach_event_ring(ring)
    mirror = BlockTableMirror.like(cache, ring)
    mirror.poll()
    assert_mirrors(mirror, source_tables(cache), indexed_keys(cache))


def test_a_router_asks_the_mirror_which_prefix_is_held():
    cache, ring = make(), LockFreeRingBuffer(256, 4)
    cache.attach_event_ring(ring)
    mirror = BlockTableMirror.like(cache, ring)
    tokens = np.arange(3 * BS + 4, dtype=np.int32)
    s = cache.admit(tokens).seq_id
    cache.grow_sequence(s, len(tokens), tokens=tokens)
    mirror.poll()
    keys = prefix_keys(tokens, CONFIG)
    assert mirror.match_keys(keys) == 3
    assert mirror.match_keys(keys[[0, 2]]) == 1  # block 2 is not block 0's child
    assert mirror.match_keys(prefix_keys(tokens, CONFIG, namespace=1)) == 0
    assert mirror.match_keys(np.zeros(0, np.int64)) == 0
    with pytest.raises(HexcoreInvalidArgumentError, match="keys: expected an int64"):
        mirror.match_keys(keys.astype(np.int32))
    assert mirror.block_of(keys[1]) == 1 and mirror.block_of(12345) == -1


def test_corrupt_key_events_raise_naming_the_event():
    ring = LockFreeRingBuffer(8, 4)
    mirror = BlockTableMirror(ring, 8, 2, 4)
    ring.push_batch([[ev.STORED, 3, 77, 5], [ev.STORED, 4, 77, 5]])  # the same key twice
    with pytest.raises(HexcoreCorruptionError, match=r"event 1 \(STORED, block_id 4, key 77, parent key 5\)"):
        mirror.poll()
    ring.push_batch([[ev.REMOVED, 3, 78, 0]])  # block 3 stores key 77
    with pytest.raises(HexcoreCorruptionError, match=r"REMOVED, block_id 3, key 78"):
        mirror.poll()
    ring.push_batch([[ev.REMOVED, 3, 77, 0], [ev.STORED, 9, 1, 0]])  # block 9 is out of range
    with pytest.raises(HexcoreCorruptionError, match="STORED, block_id 9"):
        mirror.poll()
    assert mirror.num_stored_blocks == 0


# -- across a process boundary ------------------------------------------------------------------
def _source_process(name, seed, results):
    ring = LockFreeRingBuffer.attach(name)
    cache = make()
    cache.attach_event_ring(ring)
    for _ in prefix_workload(cache, np.random.default_rng(seed), 600):
        pass
    left = cache.flush_events(timeout=30)
    pushed = int(ring.buffer[TAIL])  # the producer's index: every record ever pushed
    results.put((left, pushed, source_tables(cache), indexed_keys(cache)))
    ring.close()


def test_prefix_mirror_across_processes(seed):
    ring = LockFreeRingBuffer.create_shared(64, 4)
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    proc = ctx.Process(target=_source_process, args=(ring.name, seed, results))
    proc.start()
    mirror = BlockTableMirror(ring, NUM_BLOCKS, MAX_SEQS, 12)
    mirror.drain(timeout=60)
    left, pushed, tables, keys = results.get(timeout=60)
    proc.join(60)
    assert proc.exitcode == 0 and left == 0
    assert_mirrors(mirror, tables, keys)
    # every record the source pushed was applied, and there were enough to wrap the ring
    assert mirror.events_applied == pushed > ring.capacity
    ring.close()
