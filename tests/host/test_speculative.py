"""SpeculativeAllocator: hit / miss / mispredict counts against a model, invariants under
mispredictions and OOM, predictions from a nogil producer thread and from another process."""

from __future__ import annotations

import multiprocessing
import threading
import time

import numba
import numpy as np
import pytest

from hexcore import HexcoreInvalidArgumentError, HexcoreInvalidSequenceError, KVCacheConfig, Status
from hexcore.host import LockFreeRingBuffer, MetricsCollector, PagedKVCache, SpeculativeAllocator
from hexcore.host._atomics import load_acquire, store_release
from hexcore.host.ring import ring_close
from hexcore.host.speculative import next_sealers, push_predictions

BS = 16
CONFIG = KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=64, block_size=BS)


def make(num_blocks=64, max_seqs=6, metrics=None, **kw):
    cache = PagedKVCache(CONFIG, num_blocks, max_seqs, metrics=metrics, max_seq_len=32 * BS)
    return cache, SpeculativeAllocator(cache, **kw)


def ids(*values):
    return np.array(values, np.int32)


class Model:
    """Sequences as {seq_id: [len, reserved?]}, generations per slot, and the expected counts."""

    def __init__(self, max_seqs):
        self.seqs, self.gen, self.pending = {}, [0] * max_seqs, []
        self.counts = dict(hits=0, misses=0, mispredicted=0, reserved=0, stale=0, duplicate=0)

    def apply(self):
        for s, g in self.pending:
            if s not in self.seqs or (g >= 0 and g != self.gen[s]):
                self.counts["stale"] += 1
            elif self.seqs[s][1]:
                self.counts["duplicate"] += 1
            else:
                self.seqs[s][1] = True
                self.counts["reserved"] += 1
        self.pending = []

    def step(self, batch):
        self.apply()
        for s in batch:
            length, reserved = self.seqs[s]
            if (length + 1) % BS == 0:
                self.counts["hits" if reserved else "misses"] += 1
                self.seqs[s][1] = False
            self.seqs[s][0] = length + 1

    def free(self, s):
        self.apply()
        self.counts["mispredicted"] += self.seqs.pop(s)[1]
        self.gen[s] += 1

    def release(self, batch):
        for s in batch:
            self.counts["mispredicted"] += self.seqs[s][1]
            self.seqs[s][1] = False


def test_counts_match_a_model(rng):
    cache, spec = make()
    model = Model(cache.max_seqs)
    for it in range(600):
        op, live = int(rng.integers(6)), sorted(model.seqs)
        if op == 0 and len(live) < cache.max_seqs:
            s = spec.add_sequence()
            model.seqs[s] = [0, False]
        elif op == 1 and live:  # predict: the real sealers, some others, stale and dead ids
            lens = np.array([model.seqs[s][0] for s in live])
            out = np.empty(len(live), np.int64)
            n = next_sealers(np.array(live), lens, 1, BS, out)
            guess = out[:n].tolist() + [int(x) for x in rng.integers(-1, cache.max_seqs + 1, 2)]
            gens = [model.gen[s] - int(rng.random() < 0.2) if 0 <= s < cache.max_seqs else -1
                    for s in guess]
            assert spec.predict(guess, gens) == len(guess)
            model.pending += list(zip(guess, gens))
        elif op in (2, 3) and live:
            batch = sorted(int(x) for x in rng.choice(live, rng.integers(1, len(live) + 1), replace=False))
            assert spec.step(np.array(batch, np.int32)).ok
            model.step(batch)
        elif op == 4 and live and rng.random() < 0.3:
            s = int(rng.choice(live))
            spec.free_sequence(s)
            model.free(s)
        elif op == 5 and live:
            batch = [int(rng.choice(live))]
            spec.apply(), model.apply()
            spec.release(np.array(batch, np.int32))
            model.release(batch)
        stats = spec.stats()
        assert {k: stats[k] for k in model.counts} == model.counts, it
        for s, (length, reserved) in model.seqs.items():
            assert cache.seq_len(s) == length and (cache.prefetched_block(s) >= 0) == reserved
        spec.check_invariants()
    # the workload reached every path (minima over 300 seeds: 9 hits, 38 mispredicted, 56 stale)
    assert stats["hits"] >= 3 and stats["mispredicted"] >= 10 and stats["stale"] >= 20


def test_mispredicted_blocks_return_to_the_pool():
    cache, spec = make(num_blocks=8)
    a, b, c = (spec.add_sequence() for _ in range(3))
    spec.predict([a, b, c])
    assert spec.apply() == 3 and cache.num_free_blocks == 5 and cache.num_reserved_blocks == 3
    spec.free_sequence(b)
    assert spec.release(ids(c)) == 1 and spec.mispredicted() == 2
    assert cache.num_free_blocks == 7 and cache.num_reserved_blocks == 1
    spec.grow_sequence(a, BS)  # the one right prediction
    assert (spec.confirmed_hits(), spec.misses(), spec.hit_rate()) == (1, 0, 1.0)
    spec.check_invariants()


def test_oom_releases_reservations_so_a_retry_succeeds():
    cache, spec = make(num_blocks=4, max_seqs=4)
    seqs = [spec.add_sequence() for _ in range(4)]
    spec.predict(seqs[1:])
    spec.apply()
    cache.grow_sequence(seqs[0], BS - 1)
    # 1 block free, 3 parked: a prefill of 3 blocks fits only without the reservations
    assert len(spec.grow_sequence(seqs[0], 3 * BS)) == 3 and spec.mispredicted() == 3
    spec.predict(seqs[1:2])
    spec.apply()  # takes the last free block
    res = spec.step(ids(seqs[2]), ids(BS))
    assert res.statuses.tolist() == [Status.OUT_OF_MEMORY] and cache.num_reserved_blocks == 0
    assert spec.step(ids(seqs[2]), ids(BS)).ok  # the retry
    spec.check_invariants()


def test_floor_and_cap_leave_predictions_unfilled():
    cache, spec = make(num_blocks=6, reserve_floor=3, max_reserved=2)
    seqs = [spec.add_sequence() for _ in range(5)]
    spec.predict(seqs)
    assert spec.apply() == 2 and spec.stats()["unfilled"] == 3 and cache.num_free_blocks == 4
    cache2, spec2 = make(num_blocks=6, reserve_floor=4)
    spec2.predict([spec2.add_sequence() for _ in range(5)])
    assert spec2.apply() == 2 and cache2.num_free_blocks == 4


def test_hit_rate_reaches_metrics_collector():
    metrics = MetricsCollector()
    cache, spec = make(metrics=metrics)
    seqs = np.array([spec.add_sequence() for _ in range(4)], np.int32)
    out = np.empty(4, np.int64)
    predicted_steps = 0
    for t in range(3 * BS):
        if t % 3:  # predict on two steps of three
            n = next_sealers(seqs, np.array([t] * 4), 1, BS, out)
            predicted_steps += spec.predict(out[:n]) > 0
        spec.step(seqs)
    snap = metrics.snapshot()
    assert (snap["hits"], snap["misses"]) == (spec.confirmed_hits(), spec.misses())
    assert snap["hit_rate"] == spec.hit_rate() and 0 < spec.hit_rate() < 1
    assert snap["calls"]["reserve_predictions"] == predicted_steps  # an empty ring costs no call


@pytest.mark.parametrize("call, error, match", [
    (lambda s: SpeculativeAllocator("cache"), HexcoreInvalidArgumentError, "PagedKVCache"),
    (lambda s: SpeculativeAllocator(s.cache, LockFreeRingBuffer(8, 4)), HexcoreInvalidArgumentError,
     "record_width 2"),
    (lambda s: SpeculativeAllocator(s.cache, reserve_floor=-1), HexcoreInvalidArgumentError, "-1"),
    (lambda s: SpeculativeAllocator(s.cache, max_reserved=99), HexcoreInvalidArgumentError, "99"),
    (lambda s: s.predict([0.5]), HexcoreInvalidArgumentError, "float64"),
    (lambda s: s.predict([0, 1], [3]), HexcoreInvalidArgumentError, r"\(1,\)"),
    (lambda s: SpeculativeAllocator(s.cache, reserve_floor=True), HexcoreInvalidArgumentError,
     "reserve_floor: expected an int, got True"),
    (lambda s: SpeculativeAllocator(s.cache, max_reserved=2.0), HexcoreInvalidArgumentError,
     "max_reserved: expected an int, got float"),
    (lambda s: SpeculativeAllocator(s.cache, capacity=6), HexcoreInvalidArgumentError, "capacity: .*power of two"),
    (lambda s: SpeculativeAllocator(s.cache, capacity="8"), HexcoreInvalidArgumentError,
     "capacity: expected an int, got str"),
    (lambda s: s.release(ids(0, 5)), HexcoreInvalidSequenceError, r"^seq_ids\[1\]: sequence 5 is not live$"),
    (lambda s: s.free_sequence(5), HexcoreInvalidSequenceError, "^seq_id: sequence 5 is not live"),
    (lambda s: s.free_sequence(6), HexcoreInvalidSequenceError, r"^seq_id: expected an int in \[0, 5\], got 6$"),
    (lambda s: s.generation(5), HexcoreInvalidSequenceError, "^seq_id: sequence 5 is not live$"),
    (lambda s: s.generation(-1), HexcoreInvalidSequenceError, r"^seq_id: expected an int in \[0, 5\], got -1$"),
    (lambda s: s.grow_sequence(0, 1.5), HexcoreInvalidArgumentError, "^new_len: expected an int, got float 1.5$"),
])
def test_bad_input_raises_and_changes_nothing(call, error, match):
    cache, spec = make()
    spec.add_sequence()
    spec.predict([0])
    spec.apply()
    before = [a.copy() for a in (cache._blocks, cache._seqs, cache._counters)]
    with pytest.raises(error, match=match):
        call(spec)
    for a, b in zip(before, (cache._blocks, cache._seqs, cache._counters)):
        np.testing.assert_array_equal(a, b)
    spec.check_invariants()


def test_numpy_ints_are_ints():
    cache, spec = make(num_blocks=np.int64(8), max_seqs=np.int32(4), capacity=np.int64(16),
                       reserve_floor=np.int64(1), max_reserved=np.uint8(2))
    assert (spec.reserve_floor, spec.max_reserved, spec.ring.capacity) == (1, 2, 16)
    assert type(spec.reserve_floor) is int and type(spec.max_reserved) is int
    s = spec.add_sequence(np.int64(3))
    spec.predict(np.array([s], np.int16), np.array([spec.generation(np.int32(s))], np.uint8))
    assert spec.apply() == 1 and cache.prefetched_block(s) >= 0
    spec.check_invariants()


def test_predict_on_a_closed_ring_raises():
    _, spec = make()
    spec.ring.close()
    with pytest.raises(HexcoreInvalidArgumentError, match="closed"):
        spec.predict([0])


# -- producers in another thread and another process ------------------------------------------
@numba.njit(cache=True, nogil=True)
def _schedule(buf, starts, steps, progress):
    """A decode scheduler thread: predicts the sequences that seal at step t while the
    owner runs step t - 1. progress: int64 [2] -> (steps the owner finished, steps predicted)."""
    seq_ids = np.arange(starts.shape[0])
    out, gens = np.empty(starts.shape[0], np.int64), np.full(starts.shape[0], -1, np.int64)
    for t in range(steps):
        while load_acquire(progress, 0) < t - 1:  # at most one step ahead of the owner
            pass
        n = next_sealers(seq_ids, starts + t, 1, BS, out)
        pushed = 0
        while pushed < n:
            count = push_predictions(buf, out[pushed:n], gens[pushed:n])
            if count < 0:
                return
            pushed += count
        store_release(progress, 1, t + 1)


def test_nogil_producer_thread(rng):
    cache, spec = make(num_blocks=256, max_seqs=16, capacity=16)
    starts = rng.integers(0, BS, 16)
    seqs = np.array([spec.add_sequence() for _ in range(16)], np.int32)
    for s in seqs:
        cache.grow_sequence(int(s), int(starts[s]))
    steps, progress = 6 * BS, np.zeros(2, np.int64)
    producer = threading.Thread(target=_schedule, args=(spec.ring.buffer, starts, steps, progress))
    producer.start()
    deadline = time.monotonic() + 30
    for t in range(steps):
        while progress[1] <= t and time.monotonic() < deadline:
            time.sleep(0)  # step t's predictions are not all in yet
        spec.step(seqs)
        progress[0] = t + 1
        if t % 8 == 0:
            spec.check_invariants()
    spec.ring.close()
    producer.join(30)
    spec.check_invariants()
    assert spec.confirmed_hits() == cache.num_active_blocks == 16 * 6 and spec.misses() == 0


def _predictor_process(name, seq_ids):
    ring = LockFreeRingBuffer.attach(name)
    push_predictions(ring.buffer, np.array(seq_ids, np.int64), np.full(len(seq_ids), -1, np.int64))
    ring_close(ring.buffer)


def test_predictions_from_another_process():
    ring = LockFreeRingBuffer.create_shared(64, 2)
    cache, spec = make(ring=ring)
    seqs = ids(*(spec.add_sequence() for _ in range(4)))
    proc = multiprocessing.get_context("spawn").Process(target=_predictor_process,
                                                        args=(ring.name, [0, 2, 3]))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0 and ring.closed
    assert spec.step(seqs, ids(BS, BS, BS, BS)).ok
    assert (spec.confirmed_hits(), spec.misses()) == (3, 1)
    spec.check_invariants()
    ring.close()
