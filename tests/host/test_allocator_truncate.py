"""PagedKVCache.truncate_sequence: shrinking inside the tail and to a block boundary, with
forks, reservations, quarantined blocks, the prefix cache, step output rows, events and
metrics; and every refusal, which changes nothing."""

from __future__ import annotations

import numpy as np
import pytest

from hexcore import KVCacheConfig
from hexcore.errors import HexcoreConfigError, HexcoreInvalidArgumentError, HexcoreInvalidSequenceError
from hexcore.host import LockFreeRingBuffer, MetricsCollector, PagedKVCache
from hexcore.host.quarantine import BlockState
from tests.host.snapshots import assert_unchanged, snapshot

BS = 16
CONFIG = KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=64, block_size=BS)


@pytest.fixture(params=[False, True], ids=["plain", "prefix"])
def cache(request):
    return PagedKVCache(CONFIG, 12, 4, prefix_cache=request.param)


def tokens(n, start=0):
    return np.arange(start, start + n, dtype=np.int32) % 1000


def test_a_cut_inside_the_tail_changes_only_the_length(cache):
    a = cache.add_sequence()
    cache.grow_sequence(a, 2 * BS + 9, tokens(2 * BS + 9))
    table, free = cache.block_table(a), cache.num_free_blocks
    assert cache.truncate_sequence(a, 2 * BS + 3) == 0
    assert cache.seq_len(a) == 2 * BS + 3 and np.array_equal(cache.block_table(a), table)
    assert cache.num_free_blocks == free
    assert cache.truncate_sequence(a, 2 * BS) == 0  # the tail's start: an empty tail, no block goes
    assert cache.seq_len(a) == 2 * BS and np.array_equal(cache.block_table(a), table)
    cache.check_invariants()


def test_a_cut_on_a_boundary_drops_the_later_blocks_leaves_first(cache):
    a = cache.add_sequence()
    cache.grow_sequence(a, 3 * BS + 5, tokens(3 * BS + 5))
    table = cache.block_table(a)
    assert cache.truncate_sequence(a, BS) == 2
    assert cache.seq_len(a) == BS and np.array_equal(cache.block_table(a), table[:1])
    cache.check_invariants()
    if cache.prefix_cache_enabled:  # indexed: they stay cached, matchable
        assert cache.num_cached_blocks == 2 and cache.num_free_blocks == 12 - 3
        assert cache.match_prefix(tokens(3 * BS)) == 3 * BS
    else:  # back on the free stack, so the next seals pop them in table order
        assert cache.num_free_blocks == 12 - 1
        assert np.array_equal(cache.grow_sequence(a, 3 * BS), table[1:3])
    held = cache.seq_len(a) // BS
    assert cache.truncate_sequence(a, 0) == held
    assert cache.seq_len(a) == 0 and cache.block_table(a).size == 0
    cache.check_invariants()


def test_forked_blocks_keep_their_other_references(cache):
    a = cache.add_sequence()
    cache.grow_sequence(a, 3 * BS, tokens(3 * BS))
    b = cache.fork_sequence(a)
    shared = cache.block_table(a)
    cache.truncate_sequence(b, BS)
    assert np.array_equal(cache.block_table(a), shared) and np.array_equal(cache.block_table(b), shared[:1])
    assert len(cache.block_references(shared[0])) == 2 and cache.block_references(shared[2]).tolist() == [[a, 2]]
    assert cache.num_active_blocks == 3
    cache.check_invariants()
    cache.grow_sequence(b, 2 * BS, tokens(BS, 7))  # b seals a block of its own
    assert cache.block_table(b)[1] not in shared
    cache.check_invariants()


def test_a_reservation_stays_and_serves_the_next_seal(cache):
    a = cache.add_sequence()
    cache.grow_sequence(a, 2 * BS + 1, tokens(2 * BS + 1))
    reserved = int(cache.reserve_blocks(np.array([a], np.int32))[0])
    cache.truncate_sequence(a, BS)
    assert cache.prefetched_block(a) == reserved and cache.num_reserved_blocks == 1
    cache.check_invariants()
    assert cache.grow_sequence(a, 2 * BS, tokens(BS, 3))[0] == reserved
    cache.check_invariants()


def test_a_quarantined_block_dropped_by_a_cut_stays_out_of_the_pool(cache):
    a = cache.add_sequence()
    cache.grow_sequence(a, 3 * BS, tokens(3 * BS))
    bad = int(cache.block_table(a)[2])
    cache.quarantine_block(bad)
    cache.truncate_sequence(a, BS)
    assert cache.block_states()[bad] == BlockState.QUARANTINED and cache.block_references(bad).size == 0
    assert cache.num_quarantined_blocks == 1
    cache.check_invariants()
    cache.grow_sequence(a, 4 * BS, tokens(3 * BS, 50))
    assert bad not in cache.block_table(a)
    cache.check_invariants()


def test_a_tracked_sequence_stays_tracked_and_indexes_its_new_blocks():
    cache = PagedKVCache(CONFIG, 12, 4, prefix_cache=True)
    a = cache.add_sequence()
    cache.grow_sequence(a, 3 * BS, tokens(3 * BS))
    cache.truncate_sequence(a, BS)  # the hash state rolls back to block 0
    other = tokens(2 * BS, 500)
    cache.grow_sequence(a, 3 * BS, other)
    cache.check_invariants()  # verifies the tracked sequence's hash state and chains
    assert cache.match_prefix(np.concatenate([tokens(BS), other])) == 3 * BS
    assert cache.match_prefix(tokens(3 * BS)) == 3 * BS  # the dropped chain is still cached


def test_the_tail_rolls_back_and_grows_with_other_tokens():
    cache = PagedKVCache(CONFIG, 12, 4, prefix_cache=True)
    a = cache.add_sequence()
    cache.grow_sequence(a, BS + 10, tokens(BS + 10))
    cache.truncate_sequence(a, BS + 4)
    new = tokens(BS - 4, 700)
    cache.grow_sequence(a, 2 * BS, new)
    cache.check_invariants()
    assert cache.match_prefix(np.concatenate([tokens(BS + 4), new])) == 2 * BS
    assert cache.match_prefix(tokens(2 * BS)) == BS


def test_a_step_after_a_cut_reports_the_shorter_table(cache):
    a, b = cache.add_sequence(), cache.add_sequence()
    cache.grow_sequence(a, 3 * BS - 1)
    cache.grow_sequence(b, BS - 1)
    seqs = np.array([a, b], np.int32)
    result = cache.step(seqs)
    assert result.block_tables[0, :3].tolist() == cache.block_table(a).tolist()
    cache.truncate_sequence(a, BS)
    result = cache.step(seqs)
    assert result.seq_lens.tolist() == [BS + 1, BS + 1]
    assert result.block_tables[0].tolist() == cache.block_table(a).tolist() + [-1] * (cache.max_blocks_per_seq - 1)
    cache.check_invariants()


@pytest.mark.parametrize("new_len, error, match", [
    (-1, HexcoreInvalidArgumentError, r"new_len: expected an int in \[0, 50\], got -1 \(sequence 0 holds 50"),
    (51, HexcoreInvalidArgumentError, r"new_len: expected an int in \[0, 50\], got 51"),
    (20, HexcoreInvalidArgumentError, r"new_len: 20 falls inside sealed block 1 \(tokens \[16, 32\)\) of sequence 0"),
    (47, HexcoreInvalidArgumentError, r"new_len: 47 falls inside sealed block 2 .* shrink to \[48, 50\]"),
    (True, HexcoreInvalidArgumentError, "new_len: expected an int, got True"),
    (3.0, HexcoreInvalidArgumentError, "new_len: expected an int, got float 3.0"),
])
def test_a_bad_length_is_refused_and_changes_nothing(cache, new_len, error, match):
    a = cache.add_sequence()
    cache.grow_sequence(a, 50, tokens(50))
    before = snapshot(cache)
    with pytest.raises(error, match=match):
        cache.truncate_sequence(a, new_len)
    assert_unchanged(cache, before)


@pytest.mark.parametrize("seq_id, match", [(1, "seq_id: sequence 1 is not live"),
                                           (4, r"seq_id: expected an int in \[0, 3\], got 4"),
                                           ("0", "seq_id: expected an int, got str '0'")])
def test_a_bad_sequence_is_refused(cache, seq_id, match):
    cache.grow_sequence(cache.add_sequence(), 20, tokens(20))
    before = snapshot(cache)
    with pytest.raises((HexcoreInvalidSequenceError, HexcoreInvalidArgumentError), match=match):
        cache.truncate_sequence(seq_id, 0)
    assert_unchanged(cache, before)


def test_an_event_ring_refuses_dropping_blocks_but_not_a_tail_cut(cache):
    a = cache.add_sequence()
    cache.grow_sequence(a, 2 * BS + 5, tokens(2 * BS + 5))
    cache.attach_event_ring(LockFreeRingBuffer(64, record_width=4))
    cache.truncate_sequence(a, 2 * BS + 1)
    before = snapshot(cache)
    with pytest.raises(HexcoreConfigError, match="new_len: 16 would drop 1 sealed blocks of sequence 0"):
        cache.truncate_sequence(a, BS)
    assert_unchanged(cache, before)


def test_metrics_count_the_blocks_a_cut_releases():
    metrics = MetricsCollector()
    cache = PagedKVCache(CONFIG, 12, 4, metrics=metrics)
    a = cache.add_sequence()
    cache.grow_sequence(a, 3 * BS)
    cache.truncate_sequence(a, BS)
    snap = metrics.snapshot()
    assert snap["calls"]["truncate_sequence"] == 1 and snap["blocks_freed"] == 2
    assert snap["active_blocks"] == 1 and snap["free_blocks"] == 11


def test_no_timing_without_metrics(monkeypatch):
    from hexcore.host import allocator as allocator_module

    def boom():
        raise AssertionError("perf_counter_ns called without metrics")

    cache = PagedKVCache(CONFIG, 12, 4)
    a = cache.add_sequence()
    cache.grow_sequence(a, 3 * BS)
    monkeypatch.setattr(allocator_module, "perf_counter_ns", boom)
    cache.truncate_sequence(a, 2 * BS)
    cache.truncate_sequence(a, BS)
