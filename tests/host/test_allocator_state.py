"""PagedKVCache against a plain-Python model: a hypothesis state machine over every call."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from hexcore import HexcoreError, HexcoreInvalidArgumentError, HexcoreInvalidSequenceError, KVCacheConfig, Status
from hexcore.errors import HexcoreOOMError
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
        self.quarantined = set()  # blocks never handed out again

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
            if self.refs[block] == 0 and block not in self.quarantined:
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

    def truncate(self, s, n):
        """Shrink s to n tokens: (status, sealed blocks dropped); n inside the tail or on a
        block boundary, the dropped blocks released leaves first as in a free."""
        if s not in self.seqs:
            return Status.INVALID_SEQUENCE, 0
        seq = self.seqs[s]
        tail_start = seq["len"] // self.bs * self.bs
        if not 0 <= n <= seq["len"] or (n < tail_start and n % self.bs):
            return Status.INVALID_ARGUMENT, 0
        dropped, seq["blocks"] = seq["blocks"][n // self.bs:], seq["blocks"][:n // self.bs]
        for block in reversed(dropped):
            self.refs[block] -= 1
            if self.refs[block] == 0 and block not in self.quarantined:
                self.release_block(block)
        seq["len"] = n
        return Status.OK, len(dropped)

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

    def available(self):
        """Blocks an allocation can take (the prefix model adds evictable ones)."""
        return len(self.free)

    def take(self):
        return self.free.pop()

    def reserve(self, ids):
        if any(s not in self.seqs for s in ids):
            return None
        for s in ids:
            if self.seqs[s]["pref"] < 0 and self.available():
                self.seqs[s]["pref"] = self.take()
        return [self.seqs[s]["pref"] for s in ids]

    def reserve_predictions(self, rows, floor, max_reserved):
        """Reserve for rows (seq_id, generation); returns the outcome counts."""
        counts = {"reserved": 0, "stale": 0, "duplicate": 0, "unfilled": 0}
        for s, g in rows:
            if s not in self.seqs or (g >= 0 and g != self.gen[s]):
                counts["stale"] += 1
            elif self.seqs[s]["pref"] >= 0:
                counts["duplicate"] += 1
            elif self.available() <= floor or self.num_reserved() >= max_reserved:
                counts["unfilled"] += 1
            else:
                self.seqs[s]["pref"] = self.take()
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

    # quarantine and migration
    def quarantine(self, block):
        """The block leaves the free stack or its prefetched slot; tables keep it."""
        if block in self.quarantined:
            return False
        if block in self.free:
            self.free.remove(block)
        for seq in self.seqs.values():
            if seq["pref"] == block:
                seq["pref"] = -1
        self.quarantined.add(block)
        return True

    def release_block(self, block):
        self.free.append(block)

    def prepare(self, n):
        """The n blocks the next pops give (the prefix model evicts first)."""
        return self.free[len(self.free) - n:][::-1]

    def replace(self, s, new):
        seq = self.seqs[s]
        del self.free[len(self.free) - len(new):]
        old, seq["blocks"] = seq["blocks"], list(new)
        for block in new:
            self.refs[block] = 1
        for block in reversed(old):
            self.refs[block] -= 1
            if self.refs[block] == 0 and block not in self.quarantined:
                self.release_block(block)

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
    assert cache.num_active_blocks == sum(r > 0 and b not in model.quarantined for b, r in enumerate(model.refs))
    assert cache.quarantined_blocks().tolist() == sorted(model.quarantined)
    assert cache.num_quarantined_blocks == len(model.quarantined)
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
    """Random add / grow / try_grow / step / fork / truncate / free / reserve / release, valid or not."""

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

    @rule(pick=picks, cut=st.integers(-2, 2 * BLOCK_SIZE + 2), boundary=st.booleans())
    def truncate(self, pick, cut, boundary):
        """A rollback: ``cut`` tokens off, or to a block boundary ``cut % 4`` blocks down
        (some cuts land inside a sealed block, past the length or below 0)."""
        s = self._seq(pick)
        length = self._length(s, 0)
        n = (length // BLOCK_SIZE - cut % 4) * BLOCK_SIZE if boundary else length - cut
        status, dropped = self.model.truncate(s, n)
        if status == Status.OK:
            assert self.cache.truncate_sequence(s, n) == dropped
        else:
            with pytest.raises(type(self._error(status))):
                self.cache.truncate_sequence(s, n)

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

    @rule(block=st.integers(-1, NUM_BLOCKS), pick=st.none() | picks)
    def quarantine(self, block, pick):
        # pick: a block in use instead -- indexed (prefix model) or in a table -- whose
        # quarantine has the most to undo
        used = sorted(getattr(self.model, "content", {})) or sorted(
            {b for q in self.model.seqs.values() for b in q["blocks"]})
        if pick is not None and used:
            block = used[pick % len(used)]
        if not 0 <= block < NUM_BLOCKS:
            with pytest.raises(HexcoreInvalidArgumentError, match="block_id"):
                self.cache.quarantine_block(block)
        elif len(self.model.quarantined) < 3 or block in self.model.quarantined:  # (keep most of the pool)
            assert self.cache.quarantine_block(block) == self.model.quarantine(block)

    @rule(pick=picks)
    def migrate(self, pick):
        """What FaultTolerantKVCache.migrate_sequence does to the block manager."""
        s = self._seq(pick)
        if not self.model.live(s):
            with pytest.raises(HexcoreInvalidSequenceError):
                self.cache.replace_blocks(s, np.zeros(0, np.int32))
            return
        n = len(self.model.seqs[s]["blocks"])
        if n > self.model.available():
            with pytest.raises(HexcoreOOMError):
                self.cache.prepare_free_blocks(n)
            return
        new = self.cache.prepare_free_blocks(n)
        assert new.tolist() == self.model.prepare(n)
        self.cache.replace_blocks(s, new)
        self.model.replace(s, new.tolist())

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


# == the prefix cache ===============================================================================
# The same calls, and admissions, token-carrying growth and steps, pins and clears, on a
# cache with prefix_cache=True, against a model that keys blocks by their exact content
# (namespace, every token up to the block's end): no hashing, so the model also checks
# that the cache's hash + token check finds exactly what exact matching finds.
NUM_LEVELS, DEFAULT_PRIORITY = 8, 4
PIECES = [list(range(p * 100, p * 100 + BLOCK_SIZE)) for p in range(3)]  # prompts share these blocks


class PrefixModel(Model):
    """The prefix-caching block manager in plain Python: content-keyed dict, LRU lists per level."""

    def __init__(self, num_blocks, max_seqs, block_size, max_seq_len):
        super().__init__(num_blocks, max_seqs, block_size, max_seq_len)
        self.index = {}  # (namespace, tokens up to the block's end) -> block
        self.content = {}  # block -> its index key
        self.parent, self.prio, self.pins, self.pin_ends = {}, {}, [0] * num_blocks, [0] * num_blocks
        self.lru = [[] for _ in range(NUM_LEVELS)]  # level -> evictable blocks, oldest first
        self.cached = set()  # indexed blocks no table references
        self.stats = {"queries": 0, "hits": 0, "evicted": 0, "stored": 0}

    # blocks
    def available(self):
        return len(self.free) + sum(map(len, self.lru))

    def _evict(self):
        level = next(lv for lv in range(NUM_LEVELS) if self.lru[lv])
        block = self.lru[level].pop(0)
        del self.index[self.content.pop(block)]
        del self.parent[block], self.prio[block]
        self.cached.discard(block)
        self.stats["evicted"] += 1
        return block

    def take(self):
        return self.free.pop() if self.free else self._evict()

    def prepare(self, n):
        while len(self.free) < n:
            self.free.append(self._evict())
        return super().prepare(n)

    def replace(self, s, new):
        super().replace(s, new)
        self.seqs[s]["tracked"] = False

    def quarantine(self, block):
        """Unindex the block and its descendants first (pins through it end at its parent)."""
        if block in self.content and block not in self.quarantined:
            under = {block}
            for other in sorted(self.content):
                chain, c = [], other
                while c >= 0 and c not in under:
                    chain.append(c)
                    c = self.parent[c]
                if c >= 0:
                    under.update(chain)
            if self.parent[block] >= 0:
                self.pin_ends[self.parent[block]] += self.pins[block]
            for x in sorted(under):
                if x in self.cached:
                    self.cached.discard(x)
                    if self.pins[x] == 0:
                        self.lru[self.prio[x]].remove(x)
                    if x != block:
                        self.free.append(x)
                del self.index[self.content.pop(x)]
                del self.parent[x], self.prio[x]
                self.pins[x] = self.pin_ends[x] = 0
            for seq in self.seqs.values():
                if under & set(seq["blocks"]):
                    seq["tracked"] = False
        return super().quarantine(block)

    def release_block(self, block):
        if block in self.content:
            self.cached.add(block)
            if self.pins[block] == 0:
                self.lru[self.prio[block]].append(block)
        else:
            self.free.append(block)

    def acquire(self, block, prio):
        if self.refs[block] == 0:
            self.cached.remove(block)
            if self.pins[block] == 0:
                self.lru[self.prio[block]].remove(block)
        self.refs[block] += 1
        self.prio[block] = max(self.prio[block], prio)

    def walk(self, tokens, ns, limit):
        blocks = []
        for j in range(limit):
            block = self.index.get((ns, tuple(tokens[:(j + 1) * self.bs])))
            if block is None:
                break
            blocks.append(block)
        return blocks

    # sequences
    def add(self, s, ns=0, prio=DEFAULT_PRIORITY):
        status, got = super().add(s)
        if status == Status.OK and s is not None:
            self.seqs[s].update(tracked=True, tokens=[], prio=prio, ns=ns)
        return status, got

    def admit(self, s, tokens, ns, prio, leave_last):
        """After the cache admitted ``tokens`` into slot ``s``: the cached token count."""
        self.add(s, ns, prio)
        limit = max(0, len(tokens) - 1 if leave_last else len(tokens)) // self.bs
        blocks = self.walk(tokens, ns, limit)
        for block in blocks:
            self.acquire(block, prio)
        seq = self.seqs[s]
        seq.update(len=len(blocks) * self.bs, blocks=blocks, tokens=list(tokens[:len(blocks) * self.bs]))
        self.stats["queries"] += len(tokens)
        self.stats["hits"] += len(blocks) * self.bs
        return len(blocks) * self.bs

    def grow(self, s, n, tokens=None):
        if s not in self.seqs:
            return Status.INVALID_SEQUENCE, []
        seq = self.seqs[s]
        if n < seq["len"] or n > self.max_len:
            return Status.INVALID_SEQUENCE, []
        if tokens is not None and len(tokens) != n - seq["len"]:
            return Status.INVALID_ARGUMENT, []
        first, end = seq["len"] // self.bs, n // self.bs
        if end > first and end - first > self.available() + (seq["pref"] >= 0):
            return Status.OUT_OF_MEMORY, []
        if n > seq["len"]:
            if tokens is None:
                seq["tracked"] = False
            elif seq["tracked"]:
                seq["tokens"] += list(tokens)
        new = []
        for j in range(first, end):
            if seq["pref"] >= 0:
                block, seq["pref"] = seq["pref"], -1
            else:
                block = self.take()
            self.refs[block] = 1
            seq["blocks"].append(block)
            new.append(block)
            if seq["tracked"]:
                key = (seq["ns"], tuple(seq["tokens"][:(j + 1) * self.bs]))
                if key in self.index:
                    seq["tracked"] = False  # cached by another sequence first
                else:
                    self.index[key], self.content[block] = block, key
                    self.parent[block] = seq["blocks"][j - 1] if j else -1
                    self.prio[block] = seq["prio"]
                    self.stats["stored"] += 1
        seq["len"] = n
        return Status.OK, new

    def step(self, ids, lens, tokens=None, starts=None):
        statuses, sealed, seen = [], [], set()
        for i, s in enumerate(ids):
            if s not in self.seqs:
                statuses.append(Status.INVALID_SEQUENCE)
                continue
            if s in seen:
                statuses.append(Status.INVALID_ARGUMENT)
                continue
            seen.add(s)
            old = self.seqs[s]["len"]
            n = old + 1 if lens is None else lens[i]
            span = None
            if tokens is not None:
                span = [tokens[i]] if lens is None else list(tokens[starts[i]:starts[i + 1]])
                if lens is not None and old <= n <= self.max_len and not (
                        0 <= starts[i] and starts[i + 1] <= len(tokens) and starts[i + 1] - starts[i] == n - old):
                    statuses.append(Status.INVALID_ARGUMENT)
                    continue
            status, new = self.grow(s, n, span)
            sealed += [(s, old // self.bs + k, b) for k, b in enumerate(new)]
            statuses.append(status)
        return statuses, sealed

    def free_seq(self, s):
        if s not in self.seqs:
            return Status.INVALID_SEQUENCE
        seq = self.seqs.pop(s)
        for block in reversed(seq["blocks"]):
            self.refs[block] -= 1
            if self.refs[block] == 0 and block not in self.quarantined:
                self.release_block(block)
        if seq["pref"] >= 0:
            self.free.append(seq["pref"])
        self.gen[s] += 1
        return Status.OK

    def truncate(self, s, n):
        """A tracked sequence stays tracked, with its first n token ids."""
        status, dropped = super().truncate(s, n)
        if status == Status.OK:
            self.seqs[s]["tokens"] = self.seqs[s]["tokens"][:n]
        return status, dropped

    def fork(self, parent, child):
        status = super().fork(parent, child)
        if status == Status.OK:
            src = self.seqs[parent]
            self.seqs[child].update(tracked=src["tracked"], tokens=list(src["tokens"]), prio=src["prio"],
                                    ns=src["ns"])
        return status

    # reservations take blocks as seals do (Model.reserve* call available() and take() above)

    # pins, clear
    def pin(self, tokens, ns):
        blocks = self.walk(tokens, ns, len(tokens) // self.bs)
        for block in blocks:
            if self.pins[block] == 0 and self.refs[block] == 0:
                self.lru[self.prio[block]].remove(block)
            self.pins[block] += 1
        if blocks:
            self.pin_ends[blocks[-1]] += 1
        return len(blocks) * self.bs

    def unpin(self, tokens, ns):
        blocks = self.walk(tokens, ns, len(tokens) // self.bs)
        last = -1
        for j, block in enumerate(blocks):
            if self.pins[block] == 0:
                break
            if self.pin_ends[block]:
                last = j
        if last < 0:
            return 0
        self.pin_ends[blocks[last]] -= 1
        for block in reversed(blocks[:last + 1]):
            self.pins[block] -= 1
            if self.pins[block] == 0 and self.refs[block] == 0:
                self.lru[self.prio[block]].append(block)
        return (last + 1) * self.bs

    def clear(self):
        evicted = 0
        while any(self.lru):
            self.free.append(self._evict())
            evicted += 1
        return evicted


def lru_lists(cache) -> list:
    """The cache's LRU lists, level by level, oldest first (read from its arrays)."""
    from hexcore.host import _prefix as pcore

    pb, pc = cache._prefix.pblocks, cache._prefix.pc
    lists = []
    for level in range(NUM_LEVELS):
        blocks, b = [], pc[pcore.C_HEAD + level]
        while b >= 0:
            blocks.append(int(b))
            b = pb[b, pcore.P_NEXT]
        lists.append(blocks)
    return lists


def assert_same_prefix(cache: PagedKVCache, model: PrefixModel) -> None:
    """assert_same, and the prefix cache's observables: indexed blocks and their keys,
    cached and evictable blocks, the exact eviction order, tracking, counts."""
    from hexcore.host.prefix import prefix_keys

    assert_same(cache, model)
    assert cache.num_cached_blocks == len(model.cached)
    assert cache.num_evictable_blocks == sum(map(len, model.lru))
    assert lru_lists(cache) == model.lru
    for block in range(cache.num_blocks):
        key = model.content.get(block)
        if key is None:
            assert cache.block_key(block) is None
        else:
            ns, tokens = key
            assert cache.block_key(block) == prefix_keys(list(tokens), CONFIG16, ns)[-1]
    for s, seq in model.seqs.items():
        assert cache.is_tracked(s) == seq["tracked"]
    stats = cache.prefix_cache_stats()
    assert {k: stats[k] for k in model.stats} == model.stats


def piece_tokens(pieces, tail) -> list:
    """A prompt: the listed PIECES, then ``tail`` tokens of a partial block."""
    return [t for p in pieces for t in PIECES[p]] + list(range(900, 900 + tail))


prompts = st.builds(piece_tokens, st.lists(st.integers(0, 2), max_size=4), st.integers(0, BLOCK_SIZE - 1))
# mostly piece 0 first: prompts share a "system prompt" more often than not
shared_prompts = st.builds(piece_tokens, st.lists(st.sampled_from([0, 0, 1, 2]), min_size=1, max_size=4),
                           st.integers(0, BLOCK_SIZE - 1))


class PrefixMachine(AllocatorMachine):
    """AllocatorMachine's rules on a prefix-caching cache, and admissions, prefills and
    decode steps with token ids, pins, unpins and clears: block for block as the model."""

    def __init__(self):
        RuleBasedStateMachine.__init__(self)
        self.cache = PagedKVCache(CONFIG16, NUM_BLOCKS, MAX_SEQS, max_seq_len=MAX_SEQ_LEN, prefix_cache=True)
        self.model = PrefixModel(NUM_BLOCKS, MAX_SEQS, BLOCK_SIZE, MAX_SEQ_LEN)

    @rule(tokens=prompts, ns=st.sampled_from([0, 0, 1]), prio=st.integers(0, NUM_LEVELS - 1),
          leave_last=st.booleans(), prefill=st.booleans())
    def admit(self, tokens, ns, prio, leave_last, prefill):
        if len(self.model.seqs) == MAX_SEQS:
            with pytest.raises(HexcoreError):
                self.cache.admit(tokens, namespace=ns, priority=prio)
            return
        adm = self.cache.admit(np.array(tokens, np.int32), namespace=ns, priority=prio, leave_last=leave_last)
        assert adm.seq_id not in self.model.seqs
        assert adm.cached_tokens == self.model.admit(adm.seq_id, tokens, ns, prio, leave_last)
        if prefill:  # the rest of the prompt, with its token ids
            rest = tokens[adm.cached_tokens:]
            status, _ = self.model.grow(adm.seq_id, len(tokens), rest)
            assert self.cache.try_grow_sequence(adm.seq_id, len(tokens), np.array(rest, np.int32)) == status

    @rule(tokens=shared_prompts, prio=st.integers(0, NUM_LEVELS - 1), done=st.booleans())
    def serve(self, tokens, prio, done):
        """Admit and prefill a prompt that likely shares a prefix, then maybe finish it."""
        if len(self.model.seqs) == MAX_SEQS:
            victim = sorted(self.model.seqs)[0]
            self.cache.free_sequence(victim)
            self.model.free_seq(victim)
        self.admit(tokens, 0, prio, True, True)
        if done:
            s = max(self.model.seqs, key=lambda q: self.model.seqs[q]["len"] if q != 0 else -1)
            self.cache.free_sequence(s)
            self.model.free_seq(s)

    @rule(pick=picks, piece=st.integers(0, 2), count=st.integers(0, 2 * BLOCK_SIZE + 3),
          skew=st.sampled_from([0, 0, 0, 1]))
    def grow_tokens(self, pick, piece, count, skew):
        s = self._seq(pick)
        start = self.model.seqs[s]["len"] if s in self.model.seqs else 0
        tokens = [PIECES[piece][(start + k) % BLOCK_SIZE] for k in range(count)]
        n = start + count + skew  # skew: tokens of the wrong length
        status, new = self.model.grow(s, n, tokens)
        if status == Status.OK:
            assert self.cache.grow_sequence(s, n, np.array(tokens, np.int32)).tolist() == new
        else:
            with pytest.raises(type(self._error(status))):
                self.cache.grow_sequence(s, n, np.array(tokens, np.int32))

    @rule(picks=st.lists(picks, max_size=MAX_SEQS), values=st.lists(st.integers(0, 1), min_size=MAX_SEQS,
                                                                      max_size=MAX_SEQS))
    def decode_tokens(self, picks, values):
        ids = [self._seq(p) for p in picks]
        tokens = values[:len(ids)]
        statuses, sealed = self.model.step(ids, None, tokens)
        res = self.cache.step(np.array(ids, np.int32), tokens=np.array(tokens, np.int32))
        assert res.statuses.tolist() == statuses
        assert list(zip(res.seal_slots.tolist(), res.seal_logical.tolist(), res.seal_blocks.tolist())) == sealed

    @rule(picks=st.lists(picks, max_size=MAX_SEQS), counts=st.lists(st.integers(0, BLOCK_SIZE + 3),
                                                                      min_size=MAX_SEQS, max_size=MAX_SEQS),
          piece=st.integers(0, 2), short=st.booleans())
    def prefill_step(self, picks, counts, piece, short):
        ids = [self._seq(p) for p in picks]
        lens = [self._length(s, c) for s, c in zip(ids, counts)]
        starts, tokens = [0], []
        for s, c in zip(ids, counts):
            start = self.model.seqs[s]["len"] if s in self.model.seqs else 0
            tokens += [PIECES[piece][(start + k) % BLOCK_SIZE] for k in range(c)]
            starts.append(len(tokens))
        if short and ids:  # one span too short: that entry fails alone
            tokens, starts[-1] = tokens[:-1], starts[-1] - 1 if starts[-1] else 0
        statuses, sealed = self.model.step(ids, lens, tokens, starts)
        res = self.cache.step(np.array(ids, np.int32), np.array(lens, np.int32), np.array(tokens, np.int32),
                              np.array(starts, np.int32))
        assert res.statuses.tolist() == statuses
        assert list(zip(res.seal_slots.tolist(), res.seal_logical.tolist(), res.seal_blocks.tolist())) == sealed

    @rule(tokens=shared_prompts, ns=st.sampled_from([0, 0, 1]), unpin=st.booleans())
    def pin(self, tokens, ns, unpin):
        arr = np.array(tokens, np.int32)
        if unpin:
            assert self.cache.unpin_prefix(arr, namespace=ns) == self.model.unpin(tokens, ns)
        else:
            assert self.cache.pin_prefix(arr, namespace=ns) == self.model.pin(tokens, ns)

    @rule(tokens=prompts, ns=st.sampled_from([0, 1]))
    def match(self, tokens, ns):
        expected = len(self.model.walk(tokens, ns, len(tokens) // BLOCK_SIZE)) * BLOCK_SIZE
        assert self.cache.match_prefix(np.array(tokens, np.int32), namespace=ns) == expected

    @rule()
    def clear(self):
        assert self.cache.clear_prefix_cache() == self.model.clear()

    @rule(pick=picks, unpin=st.booleans())
    def pin_then_quarantine(self, pick, unpin):
        """Pin the prefix that ends at an indexed block with a parent, quarantine that block
        (its pin then ends at the parent), and maybe unpin the same tokens."""
        chains = [b for b in sorted(self.model.content) if self.model.parent[b] >= 0]
        if not chains or len(self.model.quarantined) >= 3:
            return
        block = chains[pick % len(chains)]
        ns, tokens = self.model.content[block]
        tokens = np.array(tokens, np.int32)
        assert self.cache.pin_prefix(tokens, namespace=ns) == self.model.pin(list(tokens), ns)
        assert self.cache.quarantine_block(block) == self.model.quarantine(block)
        if unpin:
            assert self.cache.unpin_prefix(tokens, namespace=ns) == self.model.unpin(list(tokens), ns)

    @invariant()
    def same_as_model(self):
        assert_same_prefix(self.cache, self.model)


PrefixMachine.TestCase.settings = settings(
    max_examples=80, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestPrefixMachine = PrefixMachine.TestCase


def test_seeded_prefix_workload(rng):
    """A long random workload on a prefix-caching cache, step for step as the model:
    shared prompts, prefills, decode steps with tokens, forks, frees, pins, clears."""
    cache = PagedKVCache(CONFIG16, 24, 6, max_seq_len=24 * 16, prefix_cache=True)
    model = PrefixModel(24, 6, 16, 24 * 16)
    pinned = []
    for it in range(800):
        op, live = int(rng.integers(9)), sorted(model.seqs)
        s = int(rng.choice(live)) if live else -1
        if op <= 1 and len(live) < 6:
            tokens = piece_tokens([int(rng.choice([0, 0, 1, 2])) for _ in range(rng.integers(0, 5))],
                                  int(rng.integers(0, 16)))
            prio, ns = int(rng.integers(0, NUM_LEVELS)), int(rng.random() < 0.2)
            adm = cache.admit(np.array(tokens, np.int32), namespace=ns, priority=prio)
            assert adm.cached_tokens == model.admit(adm.seq_id, tokens, ns, prio, True)
            rest = tokens[adm.cached_tokens:]
            status, _ = model.grow(adm.seq_id, len(tokens), rest)
            assert cache.try_grow_sequence(adm.seq_id, len(tokens), np.array(rest, np.int32)) == status
        elif op == 2 and live:
            batch = [int(x) for x in rng.choice(live, size=rng.integers(1, len(live) + 1), replace=False)]
            values = [int(v) for v in rng.integers(0, 2, len(batch))]
            statuses, sealed = model.step(batch, None, values)
            res = cache.step(np.array(batch, np.int32), tokens=np.array(values, np.int32))
            assert res.statuses.tolist() == statuses and res.sealed.tolist() == [list(x) for x in sealed]
        elif op == 3 and live and len(live) < 6:
            child = cache.fork_sequence(s)
            assert model.fork(s, child) == Status.OK
        elif op in (4, 5) and live and (len(live) > 3 or rng.random() < 0.3):
            cache.free_sequence(s)
            model.free_seq(s)
        elif op == 6:
            tokens = piece_tokens([0] * int(rng.integers(1, 3)), 0)
            got = cache.pin_prefix(np.array(tokens, np.int32))
            assert got == model.pin(tokens, 0)
            if got:
                pinned.append(tokens)
        elif op == 7 and pinned:
            tokens = pinned.pop(int(rng.integers(len(pinned))))
            assert cache.unpin_prefix(np.array(tokens, np.int32)) == model.unpin(tokens, 0)
        elif op == 8:
            if rng.random() < 0.1:
                assert cache.clear_prefix_cache() == model.clear()
            elif live:
                assert cache.reserve_blocks(np.array([s], np.int32)).tolist() == model.reserve([s])
        if it % 40 == 0:
            assert_same_prefix(cache, model)
    assert_same_prefix(cache, model)
    stats = cache.prefix_cache_stats()
    assert stats["hits"] > 0 and stats["evicted"] > 0  # min over 100 seeds: 1056 hit tokens, 77 evictions


def test_seeded_prefix_workload_with_quarantine(rng):
    """Admissions, prefills, decode steps, forks, frees, pins and reservations with
    quarantines (of free, live, reserved and cached blocks, chain roots included) and
    migrations in between, step for step as the model."""
    cache = PagedKVCache(CONFIG16, 32, 6, max_seq_len=24 * 16, prefix_cache=True)
    model = PrefixModel(32, 6, 16, 24 * 16)
    roots = 0  # quarantines of an indexed block with an indexed child
    for it in range(500):
        op, live = int(rng.integers(8)), sorted(model.seqs)
        s = int(rng.choice(live)) if live else -1
        if op <= 1 and len(live) < 6:
            tokens = piece_tokens([int(rng.choice([0, 0, 1, 2])) for _ in range(rng.integers(0, 5))],
                                  int(rng.integers(0, 16)))
            adm = cache.admit(np.array(tokens, np.int32))
            assert adm.cached_tokens == model.admit(adm.seq_id, tokens, 0, DEFAULT_PRIORITY, True)
            rest = tokens[adm.cached_tokens:]
            status, _ = model.grow(adm.seq_id, len(tokens), rest)
            assert cache.try_grow_sequence(adm.seq_id, len(tokens), np.array(rest, np.int32)) == status
        elif op == 2 and live:
            values = [int(v) for v in rng.integers(0, 2, len(live))]
            statuses, sealed = model.step(live, None, values)
            res = cache.step(np.array(live, np.int32), tokens=np.array(values, np.int32))
            assert res.statuses.tolist() == statuses and res.sealed.tolist() == [list(x) for x in sealed]
        elif op == 3 and live and len(live) < 6:
            assert model.fork(s, cache.fork_sequence(s)) == Status.OK
        elif op == 4 and live and (len(live) > 3 or rng.random() < 0.3):
            cache.free_sequence(s)
            model.free_seq(s)
        elif op == 5 and len(model.quarantined) < 8 and rng.random() < 0.4:
            chains = [q for q in live if len(model.seqs[q]["blocks"]) > 1
                      and model.seqs[q]["blocks"][0] in model.content]
            if chains and (roots == 0 or rng.random() < 0.5):  # a chain's root: its descendants leave the index
                block = model.seqs[chains[int(rng.integers(len(chains)))]]["blocks"][0]
            else:
                block = int(rng.integers(32))
            roots += block in model.content and block in model.parent.values()
            assert cache.quarantine_block(block) == model.quarantine(block)
        elif op == 6 and live and len(model.seqs[s]["blocks"]) <= model.available():
            new = cache.prepare_free_blocks(len(model.seqs[s]["blocks"]))
            assert new.tolist() == model.prepare(len(new))
            cache.replace_blocks(s, new)
            model.replace(s, new.tolist())
        elif op == 7:
            tokens = piece_tokens([0] * int(rng.integers(1, 3)), 0)
            if rng.random() < 0.5:
                assert cache.pin_prefix(np.array(tokens, np.int32)) == model.pin(tokens, 0)
            elif live:
                assert cache.reserve_blocks(np.array([s], np.int32)).tolist() == model.reserve([s])
        if it % 25 == 0:
            assert_same_prefix(cache, model)
    assert_same_prefix(cache, model)
    assert model.quarantined and cache.prefix_cache_stats()["hits"] > 0 and roots > 0
