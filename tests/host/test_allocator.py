"""PagedKVCache unit tests, one group per method: results, errors and their messages."""

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
from hexcore.host import LockFreeRingBuffer, MetricsCollector, PagedKVCache, StepResult
from hexcore.host.allocator import PREDICTION_OUTCOMES

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


@pytest.mark.parametrize("kw, match", [
    ({"num_blocks": 0}, r"num_blocks: expected an int in \[1, 2147483647\], got 0"),
    ({"max_seqs": True}, "max_seqs: expected an int, got True"),
    ({"max_seq_len": 0}, r"max_seq_len: expected an int in \[1, \d+\], got 0"),
    ({"num_blocks": 2.0}, "num_blocks: expected an int, got float 2.0"),
    ({"max_seqs": "4"}, "max_seqs: expected an int, got str '4'"),
    ({"num_blocks": 2**31}, r"num_blocks: expected an int in \[1, 2147483647\], got 2147483648"),
])
def test_construction_rejects(kw, match):
    with pytest.raises(HexcoreInvalidArgumentError, match=match):
        make(**kw)


def test_construction_rejects_a_non_config():
    with pytest.raises(HexcoreInvalidArgumentError, match="KVCacheConfig"):
        PagedKVCache("config", 4, 4)


@pytest.mark.parametrize("kind", [int, np.int64, np.int32, np.uint16])
def test_construction_accepts_numpy_ints(kind):
    cache = make(num_blocks=kind(8), max_seqs=kind(4), max_seq_len=kind(64))
    assert (cache.num_blocks, cache.max_seqs, cache.max_seq_len) == (8, 4, 64)
    assert type(cache.num_blocks) is int and type(cache.max_seq_len) is int


# -- add / free -----------------------------------------------------------------------
def test_add_sequence_ids():
    cache = make(max_seqs=3)
    assert [cache.add_sequence(), cache.add_sequence(np.int64(2))] == [0, 2]
    assert cache.add_sequence() == 1 and cache.num_sequences == 3
    with pytest.raises(HexcoreOOMError, match="max_seqs=3"):
        cache.add_sequence()
    with pytest.raises(HexcoreInvalidSequenceError, match="seq_id: sequence 1 is already live"):
        cache.add_sequence(1)
    cache.check_invariants()


@pytest.mark.parametrize("bad", [3, -1, 99, 10**30, np.int64(-7)])
def test_add_sequence_out_of_range_names_the_range(bad):
    cache = make(max_seqs=3)
    before = state(cache)
    with pytest.raises(HexcoreInvalidSequenceError, match=rf"^seq_id: expected an int in \[0, 2\], got {bad}$"):
        cache.add_sequence(bad)
    assert_unchanged(cache, before)


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


@pytest.mark.parametrize("bad, error, match", [
    (0, HexcoreInvalidSequenceError, r"seq_id: sequence 0 is not live \(double free\?\)"),
    (3, HexcoreInvalidSequenceError, "seq_id: sequence 3 is not live"),
    (17, HexcoreInvalidSequenceError, r"seq_id: expected an int in \[0, 3\], got 17"),
    (-5, HexcoreInvalidSequenceError, r"seq_id: expected an int in \[0, 3\], got -5"),
    (2**70, HexcoreInvalidSequenceError, rf"seq_id: expected an int in \[0, 3\], got {2**70}"),
    ("0", HexcoreInvalidArgumentError, "seq_id: expected an int, got str '0'"),
    (False, HexcoreInvalidArgumentError, "seq_id: expected an int, got False"),
])
def test_free_sequence_rejects(bad, error, match):
    cache = make()
    cache.free_sequence(cache.add_sequence())
    before = state(cache)
    with pytest.raises(error, match=match):
        cache.free_sequence(bad)
    assert_unchanged(cache, before)


# -- grow -----------------------------------------------------------------------------
def test_grow_reports_sealed_blocks():
    cache = make()
    s = cache.add_sequence()
    assert cache.grow_sequence(s, BS - 1).tolist() == []
    assert cache.grow_sequence(s, BS).tolist() == [0]  # the tail filled: one seal
    assert cache.grow_sequence(s, 4 * BS + 1).tolist() == [1, 2, 3]  # a prefill seals several
    assert cache.seq_len(s) == 4 * BS + 1 and cache.block_table(s).tolist() == [0, 1, 2, 3]
    sealed = cache.grow_sequence(np.int64(s), np.int32(5 * BS))
    assert sealed.tolist() == [4] and sealed.dtype == np.int32 and not sealed.flags.writeable
    cache.check_invariants()


def test_seq_lens_reads_many_lengths_and_names_a_dead_entry():
    cache = make()
    a, b = cache.add_sequence(), cache.add_sequence()
    cache.grow_sequence(a, 5)
    cache.grow_sequence(b, BS + 3)
    got = cache.seq_lens(ids(b, a, b))
    assert got.tolist() == [BS + 3, 5, BS + 3] and got.dtype == np.int32
    assert cache.seq_lens(ids()).tolist() == []
    before = state(cache)
    for bad, match in ((ids(a, 3), r"seq_ids\[1\].*3"), (ids(a, 9), r"seq_ids\[1\].*9"), (ids(-1), r"seq_ids\[0\]")):
        with pytest.raises(HexcoreInvalidSequenceError, match=match):
            cache.seq_lens(bad)
    for bad in ([a], ids(a, dtype=np.int64)):
        with pytest.raises(HexcoreInvalidArgumentError, match="seq_ids"):
            cache.seq_lens(bad)
    assert_unchanged(cache, before)


@pytest.mark.parametrize("new_len", [10, -1, 8 * BS + 1, 2**70])
def test_grow_bad_lengths_name_the_range_and_change_nothing(new_len):
    cache = make()
    s = cache.add_sequence()
    cache.grow_sequence(s, 40)
    before = state(cache)
    match = (rf"^new_len: expected an int in \[40, {8 * BS}\], got {new_len} "
             rf"\(sequence 0 holds 40 tokens; max_seq_len {8 * BS}\)$")
    with pytest.raises(HexcoreInvalidSequenceError, match=match):
        cache.grow_sequence(s, new_len)
    assert cache.try_grow_sequence(s, new_len) is Status.INVALID_SEQUENCE
    assert_unchanged(cache, before)


@pytest.mark.parametrize("seq_id, new_len, error, match", [
    (1, 5, HexcoreInvalidSequenceError, "seq_id: sequence 1 is not live"),
    (9, 5, HexcoreInvalidSequenceError, r"seq_id: expected an int in \[0, 3\], got 9"),
    (2**70, 5, HexcoreInvalidSequenceError, r"seq_id: expected an int in \[0, 3\]"),
    (0, 5.0, HexcoreInvalidArgumentError, "new_len: expected an int, got float 5.0"),
    (True, 5, HexcoreInvalidArgumentError, "seq_id: expected an int, got True"),
    (None, 5, HexcoreInvalidArgumentError, "seq_id: expected an int, got NoneType None"),
])
def test_grow_rejects_bad_arguments(seq_id, new_len, error, match):
    cache = make()
    cache.add_sequence()
    before = state(cache)
    with pytest.raises(error, match=match):
        cache.grow_sequence(seq_id, new_len)
    expected = Status.INVALID_ARGUMENT if error is HexcoreInvalidArgumentError else Status.INVALID_SEQUENCE
    assert cache.try_grow_sequence(seq_id, new_len) is expected
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
    assert_unchanged(cache, before)
    assert cache.try_grow_sequence(a, 5 * BS - 1) is Status.OK  # a tail still fills freely
    cache.free_sequence(a)
    assert cache.try_grow_sequence(b, 3 * BS) is Status.OK


def test_oom_prefill_is_all_or_nothing():
    cache = make(num_blocks=4, max_seq_len=16 * BS)
    s = cache.add_sequence()
    before = state(cache)
    with pytest.raises(HexcoreOOMError):
        cache.grow_sequence(s, 5 * BS)  # needs 5 of 4 blocks: takes none
    assert_unchanged(cache, before)
    assert cache.grow_sequence(s, 4 * BS).tolist() == [0, 1, 2, 3]


def test_try_grow_sequence():
    cache = make()
    s = cache.add_sequence()
    assert cache.try_grow_sequence(s, 3) is Status.OK
    assert cache.try_grow_sequence(np.int32(s), np.int64(BS)) is Status.OK and cache.seq_len(s) == BS
    assert cache.block_table(s).tolist() == [0]


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


def test_fork_into_a_chosen_slot_then_out_of_slots():
    cache = make(max_seqs=2)
    p = cache.add_sequence()
    assert cache.fork_sequence(p, np.int64(1)) == 1
    with pytest.raises(HexcoreOOMError, match="max_seqs=2"):
        cache.fork_sequence(p)


@pytest.mark.parametrize("parent, child, error, match", [
    (-1, None, HexcoreInvalidSequenceError, r"^parent: expected an int in \[0, 2\], got -1$"),
    (5, None, HexcoreInvalidSequenceError, r"^parent: expected an int in \[0, 2\], got 5$"),
    (1, None, HexcoreInvalidSequenceError, "^parent: sequence 1 is not live$"),
    (0, 0, HexcoreInvalidSequenceError, r"^child: sequence 0 is already live \(length 0\)$"),
    (0, 3, HexcoreInvalidSequenceError, r"^child: expected an int in \[0, 2\], got 3$"),
    (0, -1, HexcoreInvalidSequenceError, r"^child: expected an int in \[0, 2\], got -1$"),
    (0.0, None, HexcoreInvalidArgumentError, "^parent: expected an int, got float 0.0$"),
    (0, True, HexcoreInvalidArgumentError, "^child: expected an int, got True$"),
])
def test_fork_errors_name_the_argument(parent, child, error, match):
    cache = make(max_seqs=3)
    cache.add_sequence()
    before = state(cache)
    with pytest.raises(error, match=match):
        cache.fork_sequence(parent, child)
    assert_unchanged(cache, before)


# -- batch step -----------------------------------------------------------------------
def test_step_decode_and_kernel_arrays():
    cache = make(num_blocks=16, max_seqs=4)
    seqs = ids(*(cache.add_sequence() for _ in range(3)))
    cache.grow_sequence(1, BS - 1)
    res = cache.step(seqs)
    assert isinstance(res, StepResult) and res.ok and res.statuses.tolist() == [0, 0, 0]
    assert res.seq_lens.tolist() == [1, BS, 1] and res.tail_slots.tolist() == [0, 1, 2]
    assert res.sealed.tolist() == [[1, 0, 0]] and res.num_sealed == 1 and res.num_hits == 0
    assert res.block_tables.shape == (3, cache.max_blocks_per_seq)
    assert res.block_tables[:, :2].tolist() == [[-1, -1], [0, -1], [-1, -1]]
    arrays = {"statuses": res.statuses, "seq_lens": res.seq_lens, "tail_slots": res.tail_slots,
              "block_tables": res.block_tables, "sealed": res.sealed, "seal_slots": res.seal_slots}
    assert {k: a.dtype for k, a in arrays.items()} == {k: np.int32 for k in arrays}
    assert not res.block_tables.flags.writeable
    res = cache.step(seqs, ids(2 * BS, BS + 1, 0))
    assert res.sealed.tolist() == [[0, 0, 1], [0, 1, 2]]
    assert res.statuses.tolist() == [0, 0, Status.INVALID_SEQUENCE]  # 0 < length 1
    assert res.seq_lens.tolist() == [2 * BS, BS + 1, 1]
    with pytest.raises(HexcoreInvalidSequenceError, match=r"entry 2 \(seq_id 2\)"):
        res.raise_for_status()
    cache.check_invariants()


def test_step_seal_views_are_named_contiguous_columns():
    cache = make(num_blocks=16, max_seqs=4)
    a, b, c = (cache.add_sequence() for _ in range(3))
    res = cache.step(ids(c, a, b), ids(2 * BS, 1, BS + 3))  # c seals 2 blocks, b one
    assert res.num_sealed == 3
    assert res.seal_slots.tolist() == [c, c, b]
    assert res.seal_logical.tolist() == [0, 1, 0]
    assert res.seal_blocks.tolist() == [0, 1, 2]
    for view in (res.seal_slots, res.seal_logical, res.seal_blocks):
        assert view.ndim == 1 and view.dtype == np.int32 and view.flags.c_contiguous
    assert res.sealed.shape == (3, 3)
    np.testing.assert_array_equal(res.sealed[:, 0], res.seal_slots)
    np.testing.assert_array_equal(res.sealed[:, 1], res.seal_logical)
    np.testing.assert_array_equal(res.sealed[:, 2], res.seal_blocks)
    empty = cache.step(ids(a))
    assert empty.num_sealed == 0 and empty.seal_slots.shape == (0,) and empty.sealed.shape == (0, 3)


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


@pytest.mark.parametrize("bad", [-1, 9, 3])
def test_step_failure_names_the_id_asked_for(bad):
    cache = make(max_seqs=6)
    a = cache.add_sequence()
    res = cache.step(ids(a, bad))
    assert res.tail_slots.tolist() == [a, -1] and res.seq_ids.tolist() == [a, bad]
    with pytest.raises(HexcoreInvalidSequenceError, match=rf"batch entry 1 \(seq_id {bad}\) failed: INVALID_SEQUENCE"):
        res.raise_for_status()


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


def test_step_counts_hits():
    cache = make(num_blocks=8)
    a, b = cache.add_sequence(), cache.add_sequence()
    cache.reserve_blocks(ids(b))
    res = cache.step(ids(a, b), ids(BS, 2 * BS))
    assert (res.num_sealed, res.num_hits) == (3, 1)
    assert res.seal_blocks.tolist() == [1, 0, 2]  # a: a fresh block; b: its reserved one first


@pytest.mark.parametrize("call", ["reserve_blocks", "release_reserved"])
@pytest.mark.parametrize("bad, match", [(3, r"^seq_ids\[1\]: sequence 3 is not live$"),
                                         (7, r"^seq_ids\[1\]: expected an int in \[0, 3\], got 7$")])
def test_reserve_and_release_reject_dead_ids_atomically(call, bad, match):
    cache = make()
    a = cache.add_sequence()
    cache.reserve_blocks(ids(a))
    before = state(cache)
    with pytest.raises(HexcoreInvalidSequenceError, match=match):
        getattr(cache, call)(ids(a, bad))
    with pytest.raises(HexcoreInvalidArgumentError):
        getattr(cache, call)(ids(a, dtype=np.int64))
    assert_unchanged(cache, before)


def predictions(*rows):
    return np.array(rows, np.int64).reshape(-1, 2)


def test_reserve_predictions_outcomes():
    cache = make(num_blocks=6, max_seqs=6)
    a, b, c, d = (cache.add_sequence() for _ in range(4))
    cache.free_sequence(d)  # its generation is now 1
    counts = np.zeros(len(PREDICTION_OUTCOMES), np.int64)
    rows = predictions((a, -1), (b, 0), (b, -1), (c, 1), (d, -1), (-3, -1), (99, 0), (2**40, 0))
    assert cache.reserve_predictions(rows, counts=counts) == 2
    assert dict(zip(PREDICTION_OUTCOMES, counts.tolist())) == {
        "reserved": 2, "stale": 5, "duplicate": 1, "unfilled": 0}
    assert [cache.prefetched_block(s) for s in (a, b, c)] == [0, 1, -1]
    d = cache.add_sequence(d)
    assert cache.generation(d) == 1 and cache.reserve_predictions(predictions((d, 1), (c, 0))) == 2
    cache.check_invariants()


def test_reserve_predictions_floor_and_cap():
    cache = make(num_blocks=6, max_seqs=5)
    seqs = [cache.add_sequence() for _ in range(5)]
    counts = np.zeros(4, np.int64)
    rows = predictions(*[(s, -1) for s in seqs])
    assert cache.reserve_predictions(rows, floor=3, counts=counts) == 3  # 6 free: stops at 3 left
    assert counts.tolist() == [3, 0, 0, 2] and cache.num_free_blocks == 3
    assert cache.reserve_predictions(rows, max_reserved=np.int64(4), counts=counts) == 1
    assert counts.tolist() == [4, 0, 3, 3] and cache.num_reserved_blocks == 4


def test_reserve_predictions_from_a_ring():
    cache = make(num_blocks=8)
    a, b = cache.add_sequence(), cache.add_sequence()
    ring = LockFreeRingBuffer(4, 2)
    ring.push_batch([[a, -1], [7, -1], [b, 0], [b, 0]])
    counts = np.zeros(4, np.int64)
    assert cache.reserve_predictions(ring, counts=counts) == 2 and len(ring) == 0
    assert counts.tolist() == [2, 1, 1, 0]
    assert cache.reserve_predictions(ring) == 0  # empty
    ring.close()
    assert cache.reserve_predictions(ring) == 0  # closed and drained
    cache.check_invariants()


@pytest.mark.parametrize("kw, match", [
    ({"predictions": predictions((0, 0)).astype(np.int32)}, "predictions: expected an int64 .*int32"),
    ({"predictions": np.zeros((2, 3), np.int64)}, r"predictions: .*shape \(2, 3\)"),
    ({"predictions": [[0, 0]]}, "predictions: .*got list"),
    ({"predictions": LockFreeRingBuffer(4, 4)}, "predictions: .*record_width 2"),
    ({"floor": -1}, r"floor: expected an int in \[0, 8\], got -1"),
    ({"floor": 1.0}, "floor: expected an int, got float"),
    ({"max_reserved": 5}, r"max_reserved: expected an int in \[0, 4\], got 5"),
    ({"counts": np.zeros(3, np.int64)}, r"counts: expected a writable int64 \[4\] array"),
    ({"counts": np.zeros(4, np.int32)}, "counts: .*int32"),
])
def test_reserve_predictions_rejects_bad_arguments(kw, match):
    cache = make()
    cache.add_sequence()
    kw = {"predictions": predictions((0, -1)), **kw}
    before = state(cache)
    with pytest.raises(HexcoreInvalidArgumentError, match=match):
        cache.reserve_predictions(**kw)
    assert_unchanged(cache, before)


def test_reserve_predictions_takes_strided_arrays():
    cache = make()
    a, b = cache.add_sequence(), cache.add_sequence()
    counts = np.zeros(8, np.int64)
    rows = np.array([[a, -1, 0], [b, -1, 0]], np.int64)[:, :2]  # rows of a wider array
    assert cache.reserve_predictions(rows, counts=counts[::2]) == 2 and counts.tolist() == [2] + [0] * 7


def test_reserve_predictions_rejects_read_only_counts():
    cache = make()
    counts = np.zeros(4, np.int64)
    counts.flags.writeable = False
    with pytest.raises(HexcoreInvalidArgumentError, match="read-only"):
        cache.reserve_predictions(predictions((0, -1)), counts=counts)


def test_release_all_reserved():
    cache = make(num_blocks=8)
    a, _, c = (cache.add_sequence() for _ in range(3))
    cache.reserve_blocks(ids(a, c))
    assert cache.release_all_reserved() == 2 and cache.num_reserved_blocks == 0
    assert cache.num_free_blocks == 8 and cache.release_all_reserved() == 0
    cache.check_invariants()


# -- queries, invariants ---------------------------------------------------------------
@pytest.mark.parametrize("query", ["block_table", "seq_len", "prefetched_block", "generation"])
@pytest.mark.parametrize("bad, error, match", [
    (1, HexcoreInvalidSequenceError, "^seq_id: sequence 1 is not live$"),
    (4, HexcoreInvalidSequenceError, r"^seq_id: expected an int in \[0, 3\], got 4$"),
    (10**30, HexcoreInvalidSequenceError, r"^seq_id: expected an int in \[0, 3\], got 10{30}$"),
    (0.0, HexcoreInvalidArgumentError, "^seq_id: expected an int, got float 0.0$"),
])
def test_queries_reject_bad_ids(query, bad, error, match):
    cache = make()
    cache.add_sequence()
    with pytest.raises(error, match=match):
        getattr(cache, query)(bad)


def test_queries_accept_numpy_ints():
    cache = make()
    s = cache.add_sequence()
    cache.grow_sequence(s, BS + 1)
    for kind in (np.int8, np.int64, np.uint32):
        assert (cache.seq_len(kind(s)), cache.generation(kind(s))) == (BS + 1, 0)
        assert cache.block_table(kind(s)).tolist() == [0] and cache.prefetched_block(kind(s)) == -1


@pytest.mark.parametrize("value, live", [(0, True), (np.int32(0), True), (1, False), (-1, False),
                                         (2**70, False), ("0", False), (True, False), (None, False)])
def test_is_live_never_raises(value, live):
    cache = make()
    cache.add_sequence()
    assert cache.is_live(value) is live


def test_generation_counts_frees():
    cache = make()
    s = cache.add_sequence()
    cache.free_sequence(s)
    cache.add_sequence(s)
    cache.free_sequence(s)
    assert cache.add_sequence() == s and cache.generation(s) == 2


def test_check_invariants_can_fail():
    cache = make()
    s = cache.add_sequence()
    cache.grow_sequence(s, 3 * BS)
    cache._blocks[1, 1] += 1  # a reference count with no table entry behind it
    with pytest.raises(AssertionError, match="reference counts"):
        cache.check_invariants()
