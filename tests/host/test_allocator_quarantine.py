"""PagedKVCache's QUARANTINED block state: quarantine_block, the read methods and the
migration edit (prepare_free_blocks, replace_blocks), with the prefix cache off and on."""

from __future__ import annotations

import numpy as np
import pytest

from hexcore import KVCacheConfig
from hexcore.errors import (HexcoreConfigError, HexcoreInvalidArgumentError, HexcoreInvalidSequenceError,
                            HexcoreOOMError)
from hexcore.host import LockFreeRingBuffer, MetricsCollector, PagedKVCache
from hexcore.host.quarantine import BlockState
from tests.host.snapshots import assert_unchanged, snapshot

BS = 16
CONFIG = KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=64, block_size=BS)


@pytest.fixture(params=[False, True], ids=["plain", "prefix"])
def cache(request):
    return PagedKVCache(CONFIG, 12, 4, prefix_cache=request.param)


def test_a_quarantined_block_survives_free_and_fork_and_is_never_handed_out(cache):
    a = cache.add_sequence()
    cache.grow_sequence(a, 3 * BS)
    bad = int(cache.block_table(a)[1])
    assert cache.quarantine_block(bad) is True and cache.quarantine_block(np.int64(bad)) is False
    assert cache.is_quarantined(bad) and cache.block_states()[bad] == BlockState.QUARANTINED
    assert cache.num_quarantined_blocks == 1 and cache.num_active_blocks == 2
    b = cache.fork_sequence(a)
    assert cache.block_references(bad).tolist() == [[a, 1], [b, 1]]
    cache.free_sequence(a)
    cache.free_sequence(b)
    cache.check_invariants()
    assert cache.block_references(bad).tolist() == [] and cache.is_quarantined(bad)
    assert cache.num_free_blocks + cache.num_cached_blocks == 11
    handed_out = set()
    for _ in range(50):  # steps, reservations, predictions, evictions: every other block, never `bad`
        seqs = np.array([cache.add_sequence() for _ in range(3)], np.int32)
        handed_out |= set(cache.reserve_blocks(seqs[:1]).tolist())
        handed_out |= set(cache.step(seqs, np.full(3, BS, np.int32)).seal_blocks.tolist())
        cache.reserve_predictions(np.array([[seqs[1], -1], [seqs[2], -1]], np.int64))
        handed_out |= {cache.prefetched_block(int(s)) for s in seqs}
        handed_out |= set(cache.grow_sequence(int(seqs[2]), cache.num_available_blocks * BS + BS).tolist())
        for s in seqs.tolist():
            cache.free_sequence(s)
    s = cache.add_sequence()
    handed_out |= set(cache.grow_sequence(s, cache.num_available_blocks * BS).tolist())  # the whole pool
    cache.check_invariants()
    assert bad not in handed_out and handed_out - {-1} == set(range(12)) - {bad}


def test_quarantine_takes_a_block_from_every_state(cache):
    a = cache.add_sequence()
    cache.grow_sequence(a, BS)
    live = int(cache.block_table(a)[0])
    reserved = int(cache.reserve_blocks(np.array([a], np.int32))[0])
    free = 7
    assert cache.block_states()[[live, reserved, free]].tolist() == [BlockState.LIVE, BlockState.RESERVED,
                                                                     BlockState.FREE]
    order = [int(x) for x in cache._blocks[0, :cache.num_free_blocks] if x != free]
    for block in (live, reserved, free):
        cache.quarantine_block(block)
        cache.check_invariants()
    assert cache.prefetched_block(a) == -1 and cache.num_reserved_blocks == 0
    assert cache._blocks[0, :cache.num_free_blocks].tolist() == order  # the free stack keeps its order
    assert cache.quarantined_blocks().tolist() == sorted([live, reserved, free])


def test_quarantine_of_an_indexed_prefix_block_unindexes_its_descendants():
    cache = PagedKVCache(CONFIG, 12, 4, prefix_cache=True)
    ring = LockFreeRingBuffer(256, record_width=4)
    cache.attach_event_ring(ring)
    prompt = np.arange(4 * BS, dtype=np.int32)
    a = cache.admit(prompt).seq_id
    cache.grow_sequence(a, 4 * BS, prompt)
    table = cache.block_table(a).tolist()
    keys = [cache.block_key(b) for b in table]
    other = cache.admit(np.arange(500, 500 + 2 * BS, dtype=np.int32)).seq_id  # an unrelated prefix stays
    cache.grow_sequence(other, 2 * BS, np.arange(500, 500 + 2 * BS, dtype=np.int32))
    cache.free_sequence(a)  # its four blocks stay cached
    assert cache.pin_prefix(prompt) == 4 * BS and cache.num_cached_blocks == 4
    ring.pop_batch(256, timeout=0)
    assert cache.quarantine_block(table[1])
    cache.check_invariants()
    events = ring.pop_batch(256, timeout=0)
    assert [tuple(e) for e in events.tolist()] == [(5, b, k, 0) for b, k in zip(table[1:], keys[1:])]
    assert cache.match_prefix(prompt) == BS and cache.match_prefix(np.arange(500, 500 + 2 * BS)) == 2 * BS
    assert cache.num_cached_blocks == 1 and [cache.block_key(b) for b in table[1:]] == [None] * 3
    assert cache.block_states()[table].tolist() == [BlockState.CACHED, BlockState.QUARANTINED, BlockState.FREE,
                                                    BlockState.FREE]
    assert cache.unpin_prefix(prompt) == BS  # the pin through the bad block now ends at its parent
    assert cache.num_evictable_blocks == 1
    again = cache.admit(prompt)
    assert again.cached_tokens == BS  # the rest is recomputed
    ring.pop_batch(256, timeout=0)
    free = int(cache._blocks[0, 0])
    assert cache.quarantine_block(free) and len(cache.prepare_free_blocks(1)) == 1
    assert ring.try_pop_batch(np.empty((8, 4), np.int64)) == 0  # no event: nothing was unindexed or evicted
    cache.check_invariants()


def test_migration_edit_moves_a_table_through_the_prefix_aware_path():
    metrics = MetricsCollector()
    cache = PagedKVCache(CONFIG, 8, 4, metrics, prefix_cache=True)
    prompt = np.arange(3 * BS, dtype=np.int32)
    a = cache.admit(prompt).seq_id
    cache.grow_sequence(a, 3 * BS, prompt)
    b = cache.admit(np.arange(100, 100 + 3 * BS, dtype=np.int32)).seq_id
    cache.grow_sequence(b, 3 * BS, np.arange(100, 100 + 3 * BS, dtype=np.int32))
    cache.free_sequence(b)  # 3 cached blocks, 2 free
    old = cache.block_table(a)
    cache.quarantine_block(int(old[2]))
    assert cache.num_available_blocks == 5
    new = cache.prepare_free_blocks(3)  # evicts one cached block (the leaf of b's chain)
    assert cache.num_free_blocks == 3 and cache.num_cached_blocks == 2
    assert cache._blocks[0, :3][::-1].tolist() == new.tolist()
    cache.replace_blocks(a, new)
    cache.check_invariants()
    assert cache.block_table(a).tolist() == new.tolist() and not cache.is_tracked(a)
    assert cache.block_states()[old].tolist() == [BlockState.CACHED, BlockState.CACHED, BlockState.QUARANTINED]
    assert cache.admit(prompt).cached_tokens == 2 * BS  # old healthy blocks stay shared
    snap = metrics.snapshot()
    assert snap["quarantined_blocks"] == 1 and snap["calls"]["replace_blocks"] == 1
    assert "quarantined=1" in metrics.to_string()


def test_bad_input_is_refused_and_changes_nothing(cache):
    a = cache.add_sequence()
    cache.grow_sequence(a, 2 * BS)
    idle = cache.add_sequence()
    before = snapshot(cache)
    for bad, what in ((-1, "got -1"), (12, "got 12"), (True, "bool"), (1.0, "float"), ("3", "str")):
        for call in (cache.quarantine_block, cache.is_quarantined, cache.block_references):
            with pytest.raises(HexcoreInvalidArgumentError, match="block_id"):
                call(bad)
    with pytest.raises(HexcoreInvalidArgumentError, match="count"):
        cache.prepare_free_blocks(-1)
    with pytest.raises(HexcoreInvalidArgumentError, match="count"):
        cache.prepare_free_blocks(np.float64(2))
    with pytest.raises(HexcoreOOMError, match="11 blocks asked for, 10 free"):
        cache.prepare_free_blocks(11)
    good = cache.prepare_free_blocks(2)
    with pytest.raises(HexcoreInvalidSequenceError, match="seq_id: sequence 3 is not live"):
        cache.replace_blocks(3, good)
    with pytest.raises(HexcoreInvalidSequenceError, match="seq_id"):
        cache.replace_blocks(7, good)
    cases = [(good.astype(np.int64), "C-contiguous int32"), (good[:1], "expected 2 block ids"),
             (np.array([good[0], 12], np.int32), r"block_ids\[1\]: expected an int in \[0, 11\], got 12"),
             (np.array([good[0], int(cache.block_table(a)[0])], np.int32), r"block_ids\[1\]: .* is not free \(LIVE\)"),
             (np.array([good[0], good[0]], np.int32), "distinct"), (good.tolist(), "int32 1-D array")]
    for ids, message in cases:
        with pytest.raises(HexcoreInvalidArgumentError, match=message):
            cache.replace_blocks(a, ids)
    cache.attach_event_ring(LockFreeRingBuffer(64, record_width=4))
    with pytest.raises(HexcoreConfigError, match="detach the event ring"):
        cache.replace_blocks(a, good)
    cache.attach_event_ring(None)
    assert idle >= 0
    assert_unchanged(cache, before)
    cache.check_invariants()
