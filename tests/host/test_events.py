"""Block events: a BlockTableMirror rebuilt from a PagedKVCache's event ring equals the
source after seeded random workloads, in process and across a process boundary."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys

import numpy as np
import pytest

from hexcore import (HexcoreCorruptionError, HexcoreInvalidArgumentError, HexcoreInvalidSequenceError,
                     HexcoreOOMError, KVCacheConfig)
from hexcore.host import BlockTableMirror, LockFreeRingBuffer, PagedKVCache, SpeculativeAllocator
from hexcore.host import events as ev

BS = 16
CONFIG = KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=64, block_size=BS)
NUM_BLOCKS, MAX_SEQS = 48, 6


def make(**kw):
    return PagedKVCache(CONFIG, NUM_BLOCKS, MAX_SEQS, max_seq_len=24 * BS, **kw)


def assert_mirrors(mirror: BlockTableMirror, tables: dict) -> None:
    """``mirror`` holds exactly ``tables`` ({seq_id: [block ids]}), reference counts included."""
    assert mirror.live_seq_ids().tolist() == sorted(tables)
    for s, blocks in tables.items():
        assert mirror.block_table(s).tolist() == blocks
    refs = np.zeros(mirror.num_blocks, np.int64)
    for blocks in tables.values():
        np.add.at(refs, blocks, 1)
    np.testing.assert_array_equal(mirror.ref_counts(), refs)


def source_tables(cache: PagedKVCache) -> dict:
    return {s: cache.block_table(s).tolist() for s in range(cache.max_seqs) if cache.is_live(s)}


def random_workload(cache, rng, steps, spec=None):
    """Yield after each of ``steps`` random calls (add, grow, try_grow, step, fork, free, reserve);
    through ``spec`` (a SpeculativeAllocator over ``cache``) where it has the call."""
    driver = spec or cache
    for _ in range(steps):
        live = [s for s in range(cache.max_seqs) if cache.is_live(s)]
        op = int(rng.integers(8))
        s = int(rng.choice(live)) if live else -1
        if op == 0 and len(live) < cache.max_seqs or not live:
            cache.add_sequence()
        elif op == 1 and spec is None:
            cache.try_grow_sequence(s, cache.seq_len(s) + int(rng.integers(0, 3 * BS)))
        elif op in (1, 2):
            try:  # a failed call changes nothing and publishes nothing
                driver.grow_sequence(s, cache.seq_len(s) + int(rng.integers(0, 2 * BS)))
            except (HexcoreOOMError, HexcoreInvalidSequenceError):
                pass
        elif op in (3, 4):
            batch = np.array(rng.choice(live, rng.integers(1, len(live) + 1), replace=False), np.int32)
            lens = None if op == 3 else np.array([cache.seq_len(int(x)) + int(rng.integers(0, 20))
                                                  for x in batch], np.int32)
            driver.step(batch, lens)  # entries may fail (OOM): they change nothing
        elif op == 5 and len(live) < cache.max_seqs:
            cache.fork_sequence(s)
        elif op == 6 and (len(live) > 3 or cache.num_free_blocks < 8):
            driver.free_sequence(s)
        elif op == 7:
            if spec is None:
                cache.reserve_blocks(np.array([s], np.int32))
            else:
                spec.predict([s])
        yield


def test_mirror_follows_random_workload(rng):
    cache, ring = make(), LockFreeRingBuffer(16, 4)  # small: events back up and get staged
    cache.attach_event_ring(ring)
    mirror = BlockTableMirror.like(cache, ring)
    for i, _ in enumerate(random_workload(cache, rng, 500)):
        if rng.random() < 0.3:
            mirror.poll()
        if i % 25 == 0:
            while cache.flush_events() or len(ring):
                mirror.poll()
            assert_mirrors(mirror, source_tables(cache))
            assert mirror.num_active_blocks == cache.num_active_blocks
            assert mirror.num_sequences == cache.num_sequences
    cache.flush_events(), mirror.poll(), cache.flush_events(), mirror.poll()
    assert_mirrors(mirror, source_tables(cache))
    assert cache._events.dropped == 0 and mirror.events_applied > 150  # min over 200 seeds: 262


def test_late_attach_replays_current_tables():
    cache, ring = make(), LockFreeRingBuffer(256, 4)
    a = cache.add_sequence()
    cache.grow_sequence(a, 3 * BS + 1)
    b = cache.fork_sequence(a)
    cache.grow_sequence(b, 5 * BS)
    cache.attach_event_ring(ring)
    mirror = BlockTableMirror.like(cache, ring)
    assert mirror.poll() == 2 + 3 + 5
    assert_mirrors(mirror, source_tables(cache))
    cache.free_sequence(a)
    mirror.poll()
    assert_mirrors(mirror, source_tables(cache))


def test_speculative_allocator_and_events_together(rng):
    cache, ring = make(), LockFreeRingBuffer(1024, 4)
    spec = SpeculativeAllocator(cache)
    cache.attach_event_ring(ring)
    mirror = BlockTableMirror.like(cache, ring)
    for _ in random_workload(cache, rng, 800, spec):
        if rng.random() < 0.5:
            live = [s for s in range(MAX_SEQS) if cache.is_live(s)]
            spec.step(np.array(live, np.int32))
    mirror.poll()
    assert_mirrors(mirror, source_tables(cache))
    spec.check_invariants()
    assert spec.confirmed_hits() > 0 and spec.mispredicted() > 0  # min over 300 seeds: 33 and 5


def test_events_are_exact_records():
    cache, ring = make(), LockFreeRingBuffer(64, 4)
    cache.attach_event_ring(ring)
    a = cache.add_sequence()
    cache.grow_sequence(a, 2 * BS)
    c = cache.fork_sequence(a)
    cache.step(np.array([c], np.int32), np.array([3 * BS], np.int32))
    cache.free_sequence(a)
    assert ring.pop_batch(64).tolist() == [
        [ev.ALLOCATED, a, 0, -1], [ev.SEALED, a, 0, 0], [ev.SEALED, a, 1, 1],
        [ev.FORKED, c, a, -1], [ev.SEALED, c, 2, 2], [ev.FREED, a, 0, -1]]


def test_corrupt_stream_raises_naming_the_event():
    ring = LockFreeRingBuffer(8, 4)
    mirror = BlockTableMirror(ring, 8, 2, 4)
    ring.push_batch([[ev.ALLOCATED, 1, 0, -1], [ev.SEALED, 1, 1, 3]])  # logical 0 missing
    with pytest.raises(HexcoreCorruptionError, match=r"event 1 \(SEALED, seq_id 1, arg 1, block_id 3\)"):
        mirror.poll()
    assert mirror.block_table(1).tolist() == [] and mirror.events_applied == 1
    ring.push([9, 0, 0, 0])
    with pytest.raises(HexcoreCorruptionError, match="kind 9"):
        mirror.poll()
    with pytest.raises(HexcoreInvalidSequenceError, match="seq_id: sequence 0 is not live in the mirror"):
        mirror.block_table(0)


def test_host_exports_the_mirror_lazily():
    assert BlockTableMirror is ev.BlockTableMirror
    script = ("import sys, hexcore.host as h; assert 'hexcore.host.events' not in sys.modules; "
              "h.BlockTableMirror; assert 'hexcore.host.events' in sys.modules")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("kw, match", [
    ({"num_blocks": 0}, r"num_blocks: expected an int in \[1, 2147483647\], got 0"),
    ({"max_seqs": 2.0}, "max_seqs: expected an int, got float 2.0"),
    ({"max_blocks_per_seq": True}, "max_blocks_per_seq: expected an int, got True"),
    ({"batch": 0}, r"batch: expected an int in \[1, 16777216\], got 0"),
])
def test_mirror_rejects_bad_sizes(kw, match):
    with pytest.raises(HexcoreInvalidArgumentError, match=match):
        BlockTableMirror(LockFreeRingBuffer(8, 4), **{"num_blocks": 8, "max_seqs": 2, "max_blocks_per_seq": 4, **kw})


def test_mirror_accepts_numpy_ints():
    mirror = BlockTableMirror(LockFreeRingBuffer(8, 4), np.int64(8), np.int32(2), np.uint8(4), batch=np.int64(16))
    assert (mirror.num_blocks, mirror.max_seqs) == (8, 2) and type(mirror.max_seqs) is int
    assert not mirror.is_live(np.int64(0)) and not mirror.is_live("0") and not mirror.is_live(2**70)


def test_bad_rings_are_rejected_and_change_nothing():
    cache = make()
    with pytest.raises(HexcoreInvalidArgumentError, match="record_width 4"):
        cache.attach_event_ring(LockFreeRingBuffer(8, 2))
    closed = LockFreeRingBuffer(8, 4)
    closed.close()
    with pytest.raises(HexcoreInvalidArgumentError, match="closed"):
        cache.attach_event_ring(closed)
    with pytest.raises(HexcoreInvalidArgumentError, match="record_width 4"):
        BlockTableMirror(LockFreeRingBuffer(8, 3), 8, 2, 4)
    with pytest.raises(HexcoreInvalidArgumentError, match="max_seqs"):
        BlockTableMirror(LockFreeRingBuffer(8, 4), 8, 0, 4)
    assert cache._events is None and cache.flush_events() == 0


def test_a_closed_consumer_does_not_stop_the_cache():
    cache, ring = make(), LockFreeRingBuffer(2, 4)
    cache.attach_event_ring(ring)
    s = cache.add_sequence()
    ring.close()  # the consumer went away
    cache.grow_sequence(s, 3 * BS)
    cache.free_sequence(s)
    assert cache._events.dropped == 4 and cache.num_active_blocks == 0
    cache.attach_event_ring(None)
    cache.add_sequence()
    cache.check_invariants()


# -- across a process boundary ------------------------------------------------------------------
def _source_process(name, seed, results):
    ring = LockFreeRingBuffer.attach(name)
    cache = make()
    cache.attach_event_ring(ring)
    for _ in random_workload(cache, np.random.default_rng(seed), 600):
        pass
    left = cache.flush_events(timeout=30)
    results.put((left, source_tables(cache)))
    ring.close()


def test_mirror_across_processes(seed):
    ring = LockFreeRingBuffer.create_shared(64, 4)
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    proc = ctx.Process(target=_source_process, args=(ring.name, seed, results))
    proc.start()
    mirror = BlockTableMirror(ring, NUM_BLOCKS, MAX_SEQS, 24)
    mirror.drain(timeout=60)
    left, tables = results.get(timeout=60)
    proc.join(60)
    assert proc.exitcode == 0 and left == 0
    assert_mirrors(mirror, tables)
    assert mirror.events_applied > 150  # a 600-call workload: ~430 events
    ring.close()
