"""PagedKVCache unit tests, one group per method, plus seeded random workloads."""

from __future__ import annotations

import numpy as np
import pytest

from hexcore import (
    HexcoreInvalidArgumentError,
    HexcoreInvalidSequenceError,
    HexcoreOOMError,
    KVCacheConfig,
    Status,
)
from hexcore.host import MetricsCollector, PagedKVCache

BS = 16


def make(num_blocks=8, max_seqs=4, **kw) -> PagedKVCache:
    config = KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=64, block_size=BS)
    return PagedKVCache(config, num_blocks, max_seqs, **kw)


def state(cache):
    return [a.copy() for a in (cache._blocks, cache._seqs, cache._tables, cache._counters)]


def assert_unchanged(cache, before):
    for a, b in zip(before, state(cache)):
        np.testing.assert_array_equal(a, b)
    cache.check_invariants()


def ids(*values, dtype=np.int32):
    return np.array(values, dtype)


# -- construction ---------------------------------------------------------------------
def test_construction_sizes():
    cache = make(num_blocks=8, max_seqs=4)
    assert (cache.num_free_blocks, cache.num_active_blocks, cache.num_sequences) == (8, 0, 0)
    assert cache.max_seq_len == 8 * BS and cache.max_blocks_per_seq == 8
    assert make(max_seq_len=100).max_seq_len == 112  # rounded up to blocks
    cache.check_invariants()


@pytest.mark.parametrize("kw", [{"num_blocks": 0}, {"max_seqs": True}, {"max_seq_len": 0},
                                {"num_blocks": 2.0}])
def test_construction_rejects(kw):
    with pytest.raises(HexcoreInvalidArgumentError):
        make(**kw)
    with pytest.raises(HexcoreInvalidArgumentError, match="KVCacheConfig"):
        PagedKVCache("config", 4, 4)


# -- add / free -----------------------------------------------------------------------
def test_add_sequence_ids_and_errors():
    cache = make(max_seqs=3)
    assert [cache.add_sequence(), cache.add_sequence(2)] == [0, 2]
    assert cache.add_sequence() == 1
    with pytest.raises(HexcoreOOMError, match="max_seqs=3"):
        cache.add_sequence()
    with pytest.raises(HexcoreInvalidSequenceError, match="already live"):
        cache.add_sequence(1)
    for bad in (3, -1, 99):
        with pytest.raises(HexcoreInvalidSequenceError, match=f"seq_id {bad} out of range"):
            cache.add_sequence(bad)
    with pytest.raises(HexcoreInvalidArgumentError):
        cache.add_sequence(1.5)
    assert cache.num_sequences == 3
    cache.check_invariants()


def test_free_then_reallocate_hands_blocks_back():
    cache = make(num_blocks=8)
    s = cache.add_sequence()
    first = cache.grow_sequence(s, 5 * BS + 3).tolist()
    assert first == [0, 1, 2, 3, 4] and cache.num_free_blocks == 3
    cache.free_sequence(s)
    assert cache.num_free_blocks == 8 and cache.num_active_blocks == 0 and not cache.is_live(s)
    t = cache.add_sequence()
    assert cache.grow_sequence(t, 5 * BS).tolist() == first
    cache.check_invariants()


def test_double_free_and_unknown_ids():
    cache = make()
    s = cache.add_sequence()
    cache.free_sequence(s)
    before = state(cache)
    for bad, match in ((s, "double free"), (3, "not live"), (17, "out of range"), (-5, "out of range")):
        with pytest.raises(HexcoreInvalidSequenceError, match=match):
            cache.free_sequence(bad)
    with pytest.raises(HexcoreInvalidArgumentError):
        cache.free_sequence("0")
    assert_unchanged(cache, before)


# -- grow -----------------------------------------------------------------------------
def test_grow_reports_sealed_blocks():
    cache = make()
    s = cache.add_sequence()
    assert cache.grow_sequence(s, BS - 1).tolist() == []
    assert cache.grow_sequence(s, BS).tolist() == [0]  # the tail filled: one seal
    assert cache.grow_sequence(s, 4 * BS + 1).tolist() == [1, 2, 3]  # a prefill seals several
    assert cache.seq_len(s) == 4 * BS + 1 and cache.block_table(s).tolist() == [0, 1, 2, 3]
    sealed = cache.grow_sequence(s, 5 * BS)
    assert sealed.dtype == np.int32 and not sealed.flags.writeable
    cache.check_invariants()


@pytest.mark.parametrize("new_len, match", [
    (10, "new_len 10 < current length 40 for seq 0"),
    (-1, "new_len -1 is negative"),
    (8 * BS + 1, f"new_len {8 * BS + 1} > max_seq_len {8 * BS}"),
])
def test_grow_bad_lengths_change_nothing(new_len, match):
    cache = make()
    s = cache.add_sequence()
    cache.grow_sequence(s, 40)
    before = state(cache)
    with pytest.raises(HexcoreInvalidSequenceError, match=match):
        cache.grow_sequence(s, new_len)
    assert cache.try_grow_sequence(s, new_len) is Status.INVALID_SEQUENCE
    assert_unchanged(cache, before)


def test_oom_exactly_at_capacity():
    cache = make(num_blocks=6, max_seqs=2)
    a, b = cache.add_sequence(), cache.add_sequence()
    cache.grow_sequence(a, 4 * BS)
    cache.grow_sequence(b, 2 * BS + BS - 1)  # the pool is now exactly full
    assert cache.num_free_blocks == 0
    before = state(cache)
    with pytest.raises(HexcoreOOMError, match="needs 1 blocks, 0 free"):
        cache.grow_sequence(b, 3 * BS)
    assert cache.try_grow_sequence(b, 3 * BS) is Status.OUT_OF_MEMORY
    assert cache.try_grow_sequence(a, 5 * BS - 1) is Status.OK  # a tail still fills freely
    cache.free_sequence(a)
    assert cache.try_grow_sequence(b, 3 * BS) is Status.OK
    del before


def test_oom_prefill_is_all_or_nothing():
    cache = make(num_blocks=4, max_seq_len=16 * BS)
    s = cache.add_sequence()
    before = state(cache)
    with pytest.raises(HexcoreOOMError):
        cache.grow_sequence(s, 5 * BS)  # needs 5 of 4 blocks: takes none
    assert_unchanged(cache, before)
    assert cache.grow_sequence(s, 4 * BS).tolist() == [0, 1, 2, 3]


def test_try_grow_never_raises():
    cache = make()
    s = cache.add_sequence()
    assert cache.try_grow_sequence(s, 3) is Status.OK
    assert cache.try_grow_sequence(99, 3) is Status.INVALID_SEQUENCE
    assert cache.try_grow_sequence(s, "x") is Status.INVALID_ARGUMENT
    assert cache.try_grow_sequence(s, np.int64(BS)) is Status.OK and cache.seq_len(s) == BS
    assert cache.try_grow_sequence(s, 2**70) is Status.INVALID_SEQUENCE
    assert cache.try_grow_sequence(2**70, 20) is Status.INVALID_SEQUENCE
    with pytest.raises(HexcoreInvalidSequenceError):
        cache.grow_sequence(s, 2**70)


# -- fork -----------------------------------------------------------------------------
def test_fork_shares_sealed_blocks():
    cache = make(num_blocks=8)
    p = cache.add_sequence()
    cache.grow_sequence(p, 2 * BS + 5)
    c = cache.fork_sequence(p)  # device copies tail slot p -> tail slot c
    assert c != p and cache.seq_len(c) == 2 * BS + 5
    assert cache.block_table(c).tolist() == cache.block_table(p).tolist() == [0, 1]
    assert cache.num_active_blocks == 2 and cache._blocks[1, :2].tolist() == [2, 2]
    assert cache.grow_sequence(c, 3 * BS).tolist() == [2]  # the child seals its own tail
    assert cache.grow_sequence(p, 3 * BS).tolist() == [3]
    cache.free_sequence(p)
    assert cache.num_active_blocks == 3 and cache.block_table(c).tolist() == [0, 1, 2]
    cache.free_sequence(c)
    assert cache.num_free_blocks == 8
    cache.check_invariants()


def test_fork_errors():
    cache = make(max_seqs=2)
    p = cache.add_sequence()
    with pytest.raises(HexcoreInvalidSequenceError, match="seq_id 1 is not live"):
        cache.fork_sequence(1)
    assert cache.fork_sequence(p, 1) == 1
    with pytest.raises(HexcoreOOMError):
        cache.fork_sequence(p)
    with pytest.raises(HexcoreInvalidSequenceError, match="already live"):
        cache.fork_sequence(p, 1)
    cache.check_invariants()


# -- batch step -----------------------------------------------------------------------
def test_step_decode_and_kernel_arrays():
    cache = make(num_blocks=16, max_seqs=4)
    seqs = ids(*(cache.add_sequence() for _ in range(3)))
    cache.grow_sequence(1, BS - 1)
    res = cache.step(seqs)
    assert res.ok and res.statuses.tolist() == [0, 0, 0]
    assert res.seq_lens.tolist() == [1, BS, 1] and res.tail_slots.tolist() == [0, 1, 2]
    assert res.sealed.tolist() == [[1, 0, 0]]
    assert res.block_tables.shape == (3, cache.max_blocks_per_seq)
    assert res.block_tables[:, :2].tolist() == [[-1, -1], [0, -1], [-1, -1]]
    for arr in (res.statuses, res.seq_lens, res.tail_slots, res.block_tables, res.sealed):
        assert arr.dtype == np.int32
    assert not res.block_tables.flags.writeable
    res = cache.step(seqs, ids(2 * BS, BS + 1, 0))
    assert res.sealed.tolist() == [[0, 0, 1], [0, 1, 2]]
    assert res.statuses.tolist() == [0, 0, Status.INVALID_SEQUENCE]  # 0 < length 1
    assert res.seq_lens.tolist() == [2 * BS, BS + 1, 1]
    with pytest.raises(HexcoreInvalidSequenceError, match="entry 2"):
        res.raise_for_status()
    cache.check_invariants()


def test_step_per_entry_failures_leave_them_unchanged():
    cache = make(num_blocks=2, max_seqs=6)
    a, b = cache.add_sequence(), cache.add_sequence()
    res = cache.step(ids(a, b, a, 3, -1, 9), ids(2 * BS, 2 * BS, 5, 5, 5, 5))
    assert res.statuses.tolist() == [Status.OK, Status.OUT_OF_MEMORY, Status.INVALID_ARGUMENT,
                                     Status.INVALID_SEQUENCE, Status.INVALID_SEQUENCE,
                                     Status.INVALID_SEQUENCE]
    assert res.num_failed == 5 and cache.seq_len(b) == 0 and cache.seq_len(a) == 2 * BS
    assert res.tail_slots.tolist() == [a, b, a, -1, -1, -1]
    cache.check_invariants()


@pytest.mark.parametrize("seq_ids, new_lens, match", [
    (ids(0, 1, dtype=np.int64), None, "got int64 shape"),
    (np.zeros((2, 2), np.int32), None, r"shape \(2, 2\)"),
    (np.arange(4, dtype=np.int32)[::2], None, "strided"),
    ([0, 1], None, "got list"),
    (np.zeros(5, np.int32), None, "at most max_seqs=4"),
    (ids(0, 1), ids(1, 2, 3), r"expected shape \(2,\)"),
    (ids(0, 1), ids(1, 2, dtype=np.int64), "int64"),
])
def test_step_rejects_malformed_arrays(seq_ids, new_lens, match):
    cache = make()
    cache.add_sequence(), cache.add_sequence()
    before = state(cache)
    with pytest.raises(HexcoreInvalidArgumentError, match=match):
        cache.step(seq_ids, new_lens)
    assert_unchanged(cache, before)


# -- prefetch: reserve / release ------------------------------------------------------
def test_reserved_block_is_a_hit():
    metrics = MetricsCollector()
    cache = make(num_blocks=4, metrics=metrics)
    a, b = cache.add_sequence(), cache.add_sequence()
    assert cache.reserve_blocks(ids(a)).tolist() == [0]
    assert cache.reserve_blocks(ids(a, b)).tolist() == [0, 1]  # a keeps its block
    assert (cache.num_reserved_blocks, cache.num_free_blocks) == (2, 2)
    assert cache.grow_sequence(a, 2 * BS).tolist() == [0, 2]  # one hit, then a miss
    snap = metrics.snapshot()
    assert (snap["hits"], snap["misses"], snap["blocks_sealed"]) == (1, 1, 2)
    assert cache.reserve_blocks(ids(a, b)).tolist() == [3, 1]
    assert cache.reserve_blocks(ids(a)).tolist() == [3]
    c = cache.add_sequence()
    assert cache.reserve_blocks(ids(c)).tolist() == [-1]  # the pool is empty
    cache.free_sequence(b)  # its reserved block goes back
    assert cache.num_free_blocks == 1 and cache.release_reserved(ids(a, c)) == 1
    assert cache.num_free_blocks == 2 and cache.prefetched_block(a) == -1
    cache.check_invariants()


def test_reserve_rejects_dead_ids_atomically():
    cache = make()
    a = cache.add_sequence()
    before = state(cache)
    with pytest.raises(HexcoreInvalidSequenceError, match="seq_id 3 is not live"):
        cache.reserve_blocks(ids(a, 3))
    with pytest.raises(HexcoreInvalidSequenceError):
        cache.release_reserved(ids(a, 7))
    with pytest.raises(HexcoreInvalidArgumentError):
        cache.reserve_blocks(ids(a, dtype=np.int64))
    assert_unchanged(cache, before)


# -- accessors, invariants ----------------------------------------------
def test_accessors_reject_dead_ids():
    cache = make()
    for call in (cache.block_table, cache.seq_len, cache.prefetched_block):
        with pytest.raises(HexcoreInvalidSequenceError):
            call(0)
    assert not cache.is_live(0) and not cache.is_live(-1) and not cache.is_live("0")
    cache.add_sequence()
    assert cache.is_live(np.int32(0)) and not cache.is_live(2**70)
    with pytest.raises(HexcoreInvalidArgumentError):
        cache.free_sequence(2**70)


def test_check_invariants_can_fail():
    cache = make()
    s = cache.add_sequence()
    cache.grow_sequence(s, 3 * BS)
    cache._blocks[1, 1] += 1  # a reference count with no table entry behind it
    with pytest.raises(AssertionError, match="reference counts"):
        cache.check_invariants()
