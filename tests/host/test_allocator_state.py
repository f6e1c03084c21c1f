"""PagedKVCache against a plain-Python model: a hypothesis state machine over every call."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from hexcore import HexcoreError, HexcoreInvalidSequenceError, KVCacheConfig, Status
from hexcore.host import PagedKVCache
from hexcore.host.allocator import PREDICTION_OUTCOMES

BLOCK_SIZE, NUM_BLOCKS, MAX_SEQS, MAX_SEQ_LEN = 16, 12, 4, 128
CONFIG16 = KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=64, block_size=16)


class Model:
    """The block manager in plain Python: a list as free stack, dicts for sequences."""

    def __init__(self, num_blocks, max_seqs, block_size, max_seq_len):
        self.bs, self.max_seqs, self.max_len = block_size, max_seqs, max_seq_len
        self.free = list(range(num_blocks - 1, -1, -1))  # pop() gives block 0 first
        self.refs = [0] * num_blocks
        self.seqs = {}  # seq_id -> {"len": int, "blocks": [block ids], "pref": block id or -1}
        self.gen = [0] * max_seqs  # slot -> frees so far

    def live(self, s):
        return s in self.seqs

    def add(self, s):
        if s is None:
            free = [i for i in range(self.max_seqs) if i not in self.seqs]
            return (Status.OUT_OF_MEMORY, None) if not free else (Status.OK, free)
        if not 0 <= s < self.max_seqs or s in self.seqs:
            return Status.INVALID_SEQUENCE, None
        self.seqs[s] = {"len": 0, "blocks": [], "pref": -1}
        return Status.OK, s

    def grow(self, s, n):
        if s not in self.seqs:
            return Status.INVALID_SEQUENCE, []
        seq = self.seqs[s]
        if n < seq["len"] or n > self.max_len:
            return Status.INVALID_SEQUENCE, []
        need = n // self.bs - seq["len"] // self.bs
        if need > len(self.free) + (seq["pref"] >= 0):
            return Status.OUT_OF_MEMORY, []
        new = []
        for _ in range(need):
            if seq["pref"] >= 0:
                block, seq["pref"] = seq["pref"], -1
            else:
                block = self.free.pop()
            self.refs[block] = 1
            new.append(block)
        seq["blocks"] += new
        seq["len"] = n
        return Status.OK, new

    def free_seq(self, s):
        if s not in self.seqs:
            return Status.INVALID_SEQUENCE
        seq = self.seqs.pop(s)
        for block in reversed(seq["blocks"]):
            self.refs[block] -= 1
            if self.refs[block] == 0:
                self.free.append(block)
        if seq["pref"] >= 0:
            self.free.append(seq["pref"])
        self.gen[s] += 1
        return Status.OK

    def fork(self, parent, child):
        if parent not in self.seqs:
            return Status.INVALID_SEQUENCE
        status, child = self.add(child)
        if status == Status.OK:
            src = self.seqs[parent]
            self.seqs[child] = {"len": src["len"], "blocks": list(src["blocks"]), "pref": -1}
            for block in src["blocks"]:
                self.refs[block] += 1
        return status

    def step(self, ids, lens):
        statuses, sealed, seen = [], [], set()
        for i, s in enumerate(ids):
            if s not in self.seqs:
                statuses.append(Status.INVALID_SEQUENCE)
                continue
            if s in seen:
                statuses.append(Status.INVALID_ARGUMENT)
                continue
            seen.add(s)
            first = self.seqs[s]["len"] // self.bs
            status, new = self.grow(s, self.seqs[s]["len"] + 1 if lens is None else lens[i])
            sealed += [(s, first + k, b) for k, b in enumerate(new)]
            statuses.append(status)
        return statuses, sealed

    def reserve(self, ids):
        if any(s not in self.seqs for s in ids):
            return None
        for s in ids:
            if self.seqs[s]["pref"] < 0 and self.free:
                self.seqs[s]["pref"] = self.free.pop()
        return [self.seqs[s]["pref"] for s in ids]

    def reserve_predictions(self, rows, floor, max_reserved):
        """Reserve for rows (seq_id, generation); returns the outcome counts."""
        counts = {"reserved": 0, "stale": 0, "duplicate": 0, "unfilled": 0}
        for s, g in rows:
            if s not in self.seqs or (g >= 0 and g != self.gen[s]):
                counts["stale"] += 1
            elif self.seqs[s]["pref"] >= 0:
                counts["duplicate"] += 1
            elif len(self.free) <= floor or self.num_reserved() >= max_reserved:
                counts["unfilled"] += 1
            else:
                self.seqs[s]["pref"] = self.free.pop()
                counts["reserved"] += 1
        return counts

    def num_reserved(self):
        return sum(q["pref"] >= 0 for q in self.seqs.values())

    def release_all(self):
        released = 0
        for s in sorted(self.seqs):
            if self.seqs[s]["pref"] >= 0:
                self.free.append(self.seqs[s]["pref"])
                self.seqs[s]["pref"] = -1
                released += 1
        return released

    def release(self, ids):
        if any(s not in self.seqs for s in ids):
            return None
        released = 0
        for s in ids:
            if self.seqs[s]["pref"] >= 0:
                self.free.append(self.seqs[s]["pref"])
                self.seqs[s]["pref"] = -1
                released += 1
        return released


def assert_same(cache: PagedKVCache, model: Model) -> None:
    """Every observable of ``cache`` equals the model's, and the invariants hold."""
    cache.check_invariants()
    assert cache.num_free_blocks == len(model.free)
    assert cache.num_sequences == len(model.seqs)
    assert cache.num_active_blocks == sum(r > 0 for r in model.refs)
    assert cache.num_reserved_blocks == model.num_reserved()
    for s in range(-1, model.max_seqs + 1):
        assert cache.is_live(s) == model.live(s)
        if model.live(s):
            seq = model.seqs[s]
            assert cache.seq_len(s) == seq["len"] and cache.generation(s) == model.gen[s]
            assert cache.block_table(s).tolist() == seq["blocks"]
            assert cache.prefetched_block(s) == seq["pref"]
    assert sorted(cache._blocks[0, : cache.num_free_blocks]) == sorted(model.free)


# Drawn as picks: most name a live sequence (see AllocatorMachine._seq), some any id.
picks = st.integers(0, 255)


class AllocatorMachine(RuleBasedStateMachine):
    """Random add / grow / try_grow / step / fork / free / reserve / release, valid or not."""

    def __init__(self):
        super().__init__()
        config = KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=64, block_size=BLOCK_SIZE)
        self.cache = PagedKVCache(config, NUM_BLOCKS, MAX_SEQS, max_seq_len=MAX_SEQ_LEN)
        self.model = Model(NUM_BLOCKS, MAX_SEQS, BLOCK_SIZE, MAX_SEQ_LEN)

    @initialize()
    def start(self):
        for s in (0, 1):
            assert self.cache.add_sequence(s) == s
            self.model.add(s)

    def _seq(self, pick):
        # 7 of 8 picks name a live sequence (when there is one); the rest any id in
        # [-2, MAX_SEQS + 2), so unknown, freed and out-of-range ids come up too.
        live = sorted(self.model.seqs)
        if pick % 8 == 7 or not live:
            return pick // 8 % (MAX_SEQS + 4) - 2
        return live[pick // 8 % len(live)]

    def _length(self, s, delta):
        return (self.model.seqs[s]["len"] if s in self.model.seqs else 0) + delta

    @rule(s=st.none() | st.integers(-2, MAX_SEQS + 1))
    def add(self, s):
        status, expected = self.model.add(s)
        if status != Status.OK:
            with pytest.raises(HexcoreError) as info:
                self.cache.add_sequence(s)
            assert isinstance(info.value, type(self._error(status)))
            return
        got = self.cache.add_sequence(s)
        if s is None:
            assert got in expected
            self.model.add(got)
        else:
            assert got == s

    @rule(pick=picks, delta=st.integers(-3, 5 * BLOCK_SIZE), use_try=st.booleans())
    def grow(self, pick, delta, use_try):
        s = self._seq(pick)
        n = self._length(s, delta)
        first = self.model.seqs[s]["len"] // BLOCK_SIZE if s in self.model.seqs else 0
        status, new = self.model.grow(s, n)
        if use_try:
            assert self.cache.try_grow_sequence(s, n) == status
        elif status == Status.OK:
            assert self.cache.grow_sequence(s, n).tolist() == new
            assert self.cache.block_table(s)[first:].tolist() == new
        else:
            with pytest.raises(type(self._error(status))):
                self.cache.grow_sequence(s, n)

    @rule(picks=st.lists(picks, max_size=MAX_SEQS), deltas=st.none() | st.lists(
        st.integers(-2, 2 * BLOCK_SIZE + 4), min_size=MAX_SEQS, max_size=MAX_SEQS))
    def step(self, picks, deltas):
        ids = [self._seq(p) for p in picks]
        lens = None if deltas is None else [self._length(s, d) for s, d in zip(ids, deltas)]
        statuses, sealed = self.model.step(ids, lens)
        arr = np.array(ids, np.int32)
        res = self.cache.step(arr, None if lens is None else np.array(lens, np.int32))
        assert res.statuses.tolist() == statuses
        assert res.num_failed == sum(x != Status.OK for x in statuses)
        assert [tuple(r) for r in res.sealed.tolist()] == sealed
        assert list(zip(res.seal_slots.tolist(), res.seal_logical.tolist(), res.seal_blocks.tolist())) == sealed
        assert res.num_sealed == len(sealed)
        for i, s in enumerate(ids):
            live = self.model.live(s)
            blocks = self.model.seqs[s]["blocks"] if live else []
            assert res.seq_lens[i] == (self.model.seqs[s]["len"] if live else 0)
            assert res.tail_slots[i] == (s if live else -1)
            row = res.block_tables[i]
            assert row[: len(blocks)].tolist() == blocks and np.all(row[len(blocks):] == -1)

    @rule(pick=picks, child=st.none() | st.integers(-2, MAX_SEQS + 1))
    def fork(self, pick, child):
        parent = self._seq(pick)
        if child is None:  # any free slot: the model checks the cache's choice
            status, free = self.model.add(None)
            status = Status.INVALID_SEQUENCE if not self.model.live(parent) else status
            if status == Status.OK:
                child = self.cache.fork_sequence(parent)
                assert child in free
                assert self.model.fork(parent, child) == Status.OK
                return
        else:
            status = self.model.fork(parent, child)
            if status == Status.OK:
                assert self.cache.fork_sequence(parent, child) == child
                return
        with pytest.raises(type(self._error(status))):
            self.cache.fork_sequence(parent, child)

    @rule(pick=picks)
    def free(self, pick):
        s = self._seq(pick)
        if self.model.free_seq(s) == Status.OK:
            self.cache.free_sequence(s)
        else:
            with pytest.raises(HexcoreInvalidSequenceError):
                self.cache.free_sequence(s)

    @rule(picks=st.lists(picks, max_size=3), release=st.booleans())
    def prefetch(self, picks, release):
        ids = [self._seq(p) for p in picks]
        arr = np.array(ids, np.int32)
        expected = self.model.release(ids) if release else self.model.reserve(ids)
        call = self.cache.release_reserved if release else self.cache.reserve_blocks
        if expected is None:
            with pytest.raises(HexcoreInvalidSequenceError):
                call(arr)
        else:
            got = call(arr)
            assert (got if release else got.tolist()) == expected

    @rule(picks=st.lists(st.tuples(picks, st.integers(-1, 2)), max_size=6),
          floor=st.integers(0, NUM_BLOCKS), max_reserved=st.integers(0, MAX_SEQS))
    def reserve_predictions(self, picks, floor, max_reserved):
        rows = [(self._seq(p), g) for p, g in picks]
        expected = self.model.reserve_predictions(rows, floor, max_reserved)
        counts = np.zeros(4, np.int64)
        got = self.cache.reserve_predictions(np.array(rows, np.int64).reshape(-1, 2), floor, max_reserved, counts)
        assert got == expected["reserved"]
        assert dict(zip(PREDICTION_OUTCOMES, counts.tolist())) == expected

    @rule()
    def release_all(self):
        assert self.cache.release_all_reserved() == self.model.release_all()

    @invariant()
    def same_as_model(self):
        assert_same(self.cache, self.model)

    @staticmethod
    def _error(status):
        from hexcore.errors import _ERROR_FOR_STATUS

        return _ERROR_FOR_STATUS[status]("")


AllocatorMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestAllocatorMachine = AllocatorMachine.TestCase


# -- seeded random workloads ------------------------------------------------------------
def test_seeded_random_workload(rng):
    cache, model = PagedKVCache(CONFIG16, 24, 6), Model(24, 6, 16, 24 * 16)
    for it in range(600):
        op, live = rng.integers(6), sorted(model.seqs)
        s = int(rng.choice(live)) if live and rng.random() < 0.9 else int(rng.integers(-1, 7))
        if op == 0 and len(live) < 6:
            t = cache.add_sequence()
            assert model.add(t) == (Status.OK, t)
        elif op == 1:
            n = (model.seqs[s]["len"] if s in model.seqs else 0) + int(rng.integers(0, 3 * 16))
            assert cache.try_grow_sequence(s, n) == model.grow(s, n)[0]
        elif op == 2 and live:
            batch = [int(x) for x in rng.choice(live, size=rng.integers(1, len(live) + 1), replace=False)]
            statuses, sealed = model.step(batch, None)
            res = cache.step(np.array(batch, np.int32))
            assert res.statuses.tolist() == statuses and res.sealed.tolist() == [list(x) for x in sealed]
        elif op == 3 and model.live(s):
            assert cache.free_sequence(s) is None and model.free_seq(s) == Status.OK
        elif op == 4 and model.live(s) and len(live) < 6:
            child = cache.fork_sequence(s)
            assert model.fork(s, child) == Status.OK
        elif op == 5 and model.live(s):
            assert cache.reserve_blocks(np.array([s], np.int32)).tolist() == model.reserve([s])
        if it % 50 == 0:
            assert_same(cache, model)
    assert_same(cache, model)
