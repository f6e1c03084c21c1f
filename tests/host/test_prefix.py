"""Prefix caching in the block manager: keys, admission, eviction, pins, steps, errors."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from hexcore import (HexcoreInvalidArgumentError, HexcoreInvalidSequenceError, HexcoreOOMError, KVCacheConfig,
                     Status)
from hexcore.host import MetricsCollector, PagedKVCache, SpeculativeAllocator
from hexcore.host import _keys
from hexcore.host import _prefix as pcore
from hexcore.host.prefix import (DEFAULT_PRIORITY, NUM_PRIORITIES, Admission, cache_seed, prefix_keys, root_key,
                                 xxh64)

BS = 16
CONFIG = KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=64, block_size=BS)


def make(num_blocks=16, max_seqs=4, **kw) -> PagedKVCache:
    return PagedKVCache(CONFIG, num_blocks, max_seqs, prefix_cache=True, **kw)


def toks(*values) -> np.ndarray:
    return np.array(values, np.int32)


def prompt(n, start=0) -> np.ndarray:
    return np.arange(start, start + n, dtype=np.int32)


def ids(*values) -> np.ndarray:
    return np.array(values, np.int32)


def serve(cache, tokens, **kw) -> Admission:
    """Admit ``tokens`` and prefill the rest: the sequence ends ``len(tokens)`` long."""
    adm = cache.admit(tokens, **kw)
    cache.grow_sequence(adm.seq_id, len(tokens), tokens=tokens[adm.cached_tokens:])
    return adm


def state(cache):
    arrays = [a.copy() for a in (cache._blocks, cache._seqs, cache._tables, cache._counters,
                                 *cache._prefix.arrays())]
    arrays[-1][pcore.C_LOG] = 0  # scratch: the number of events the last call logged
    return arrays


def assert_unchanged(cache, before):
    for a, b in zip(before, state(cache)):
        np.testing.assert_array_equal(a, b)
    cache.check_invariants()


# -- keys -----------------------------------------------------------------------------------------
def test_xxh64_known_vectors():
    assert xxh64(b"") == 0xEF46DB3751D8E999
    assert xxh64(b"a") == 0xD24EC4F1A98C6E5B
    assert xxh64(b"abc") == 0x44BC2CF5AD770999
    assert xxh64(b"Nobody inspects the spammish repetition") == 0xFBCEA83C8A378BF1  # python-xxhash's example


def signed(x):
    return x - 2**64 if x >= 2**63 else x


@pytest.mark.parametrize("block_size", [16, 32])
def test_keys_are_xxh64_of_the_whole_prefix(rng, block_size):
    config = KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=64, block_size=block_size, kv_dtype="int4")
    tokens = rng.integers(-2**31, 2**31, 4 * block_size + 5).astype(np.int32)
    seed = signed(xxh64(f"hexcore-prefix/v1/int4/{block_size}/64".encode()))
    assert cache_seed(config) == seed
    root = signed(xxh64(struct.pack("<q", 7), seed % 2**64))
    assert root_key(config, 7) == root == _keys.root_key(np.int64(seed), 7)
    keys = prefix_keys(tokens, config, namespace=7)
    assert keys.dtype == np.int64 and len(keys) == 4
    for j in range(4):
        assert keys[j] == signed(xxh64(tokens[:(j + 1) * block_size].astype("<i4").tobytes(), root % 2**64))
    assert prefix_keys(tokens[1:].copy()[:4 * block_size], config, 7)[0] != keys[0]
    assert list(prefix_keys(list(tokens[:2 * block_size]), config, 7)) == list(keys[:2])  # lists accepted
    misaligned = np.concatenate((np.zeros(1, np.int32), tokens))[1:]  # a view 4 bytes off: hashed from a copy
    assert misaligned.ctypes.data % 8 == 4 and list(prefix_keys(misaligned, config, 7)) == list(keys)


def test_namespaces_and_dtypes_key_differently():
    tokens = prompt(2 * BS)
    int4 = KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=64, block_size=BS, kv_dtype="int4")
    a, b, c = prefix_keys(tokens, CONFIG), prefix_keys(tokens, CONFIG, 1), prefix_keys(tokens, int4)
    assert len({a[0], b[0], c[0]}) == 3


def test_the_cache_stores_the_keys_prefix_keys_gives():
    cache = make()
    tokens = prompt(3 * BS + 2)
    adm = serve(cache, tokens, namespace=5)
    table = cache.block_table(adm.seq_id)
    assert [cache.block_key(b) for b in table] == prefix_keys(tokens, CONFIG, 5).tolist()
    assert cache.block_key(15) is None


def test_key_index_insert_find_remove(rng):
    index = _keys.new_index(64)
    assert index.shape == (128, 2)
    live = {}
    for step in range(3000):
        if live and rng.random() < 0.45:
            key = list(live)[int(rng.integers(len(live)))]
            assert _keys.index_remove(index, key)
            del live[key]
        elif len(live) < 64:
            key = int(rng.integers(0, 40)) * 128 + int(rng.integers(0, 3))  # long probe runs
            key = key if rng.random() < 0.5 else int(rng.integers(-2**63, 2**63))
            if key in live:
                continue
            assert _keys.index_find(index, key) == -1
            _keys.index_insert(index, key, step)
            live[key] = step
        if step % 97 == 0:
            assert all(_keys.index_find(index, k) == b for k, b in live.items())
            assert np.count_nonzero(index[:, 1] >= 0) == len(live)
    assert not _keys.index_remove(index, 12345678911)


# -- admission ------------------------------------------------------------------------------------
def test_admission_shares_the_cached_prefix():
    cache = make()
    tokens = prompt(3 * BS + 5)
    first = serve(cache, tokens)
    assert first == Admission(first.seq_id, 0) and first.cached_tokens == 0
    second = cache.admit(tokens)
    assert second.cached_tokens == 3 * BS and cache.seq_len(second.seq_id) == 3 * BS
    assert cache.block_table(second.seq_id).tolist() == cache.block_table(first.seq_id).tolist()
    assert cache.num_active_blocks == 3 and cache._blocks[1, :3].tolist() == [2, 2, 2]
    cache.grow_sequence(second.seq_id, len(tokens), tokens=tokens[3 * BS:])
    assert cache.prefix_cache_stats()["hits"] == 3 * BS
    assert cache.prefix_cache_stats()["queries"] == 2 * len(tokens)
    cache.check_invariants()


def test_leave_last_and_whole_blocks():
    cache = make()
    tokens = prompt(3 * BS)
    serve(cache, tokens)
    assert cache.admit(tokens).cached_tokens == 2 * BS  # the last token is left to compute
    assert cache.admit(tokens, leave_last=False).cached_tokens == 3 * BS
    assert cache.admit(tokens[:2 * BS + 3]).cached_tokens == 2 * BS  # whole blocks only
    assert cache.match_prefix(tokens) == 3 * BS and cache.match_prefix(tokens[:BS - 1]) == 0
    cache.check_invariants()


def test_exact_hits_only():
    cache = make()
    tokens = prompt(3 * BS)
    serve(cache, tokens)
    other = tokens.copy()
    other[BS + 4] += 1  # differs in block 1
    assert cache.admit(other, leave_last=False).cached_tokens == BS
    assert cache.admit(tokens, namespace=1, leave_last=False).cached_tokens == 0
    cache.check_invariants()


def test_a_hash_collision_is_a_miss():
    cache = make()
    a, b = prompt(2 * BS), prompt(2 * BS, 1000)
    serve(cache, a)
    key_b = prefix_keys(b, CONFIG)[0]
    # pretend b's first block hashes to the key under which a's first block sits
    _keys.index_insert(cache._prefix.index, key_b, 0)
    assert cache.match_prefix(b) == 0 and cache.admit(b, leave_last=False).cached_tokens == 0


@pytest.mark.parametrize("tokens, cached", [
    (list(range(2 * BS)), 2 * BS),
    (np.arange(2 * BS, dtype=np.int64), 2 * BS),
    (np.arange(4 * BS, dtype=np.int32)[::2], 2 * BS),  # strided: copied
    (range(2 * BS), 2 * BS),
    ([], 0),
])
def test_tokens_of_any_int_kind(tokens, cached):
    cache = make()
    serve(cache, np.arange(0, 4 * BS, 2, dtype=np.int32))
    serve(cache, prompt(2 * BS))
    assert cache.admit(tokens, leave_last=False).cached_tokens == cached


@pytest.mark.parametrize("kw, error, match", [
    ({"tokens": np.zeros(4, np.float32)}, HexcoreInvalidArgumentError, r"tokens: expected a 1-D array of int"),
    ({"tokens": np.zeros((2, 2), np.int32)}, HexcoreInvalidArgumentError, r"shape \(2, 2\)"),
    ({"tokens": [1, 2**31]}, HexcoreInvalidArgumentError, f"tokens: token ids must fit int32, got {2**31}"),
    ({"tokens": "abc"}, HexcoreInvalidArgumentError, "tokens: expected an int32 .* got str"),
    ({"tokens": [True, False]}, HexcoreInvalidArgumentError, "tokens: expected a 1-D array of int"),
    ({"tokens": np.zeros(8 * BS + 1, np.int32)}, HexcoreInvalidSequenceError, "exceeds max_seq_len 128"),
    ({"namespace": -1}, HexcoreInvalidArgumentError, r"namespace: expected an int in \[0, "),
    ({"namespace": 1.0}, HexcoreInvalidArgumentError, "namespace: expected an int, got float"),
    ({"priority": NUM_PRIORITIES}, HexcoreInvalidArgumentError, r"priority: expected an int in \[0, 7\], got 8"),
    ({"leave_last": 1}, HexcoreInvalidArgumentError, "leave_last: expected a bool"),
    ({"seq_id": 9}, HexcoreInvalidSequenceError, r"seq_id: expected an int in \[0, 3\], got 9"),
    ({"seq_id": 0}, HexcoreInvalidSequenceError, "seq_id: sequence 0 is already live"),
])
def test_admit_rejects_bad_arguments(kw, error, match):
    cache = make(num_blocks=8, max_seq_len=8 * BS)
    serve(cache, prompt(2 * BS))
    before = state(cache)
    with pytest.raises(error, match=match):
        cache.admit(**{"tokens": prompt(2 * BS), **kw})
    assert_unchanged(cache, before)


def test_admit_out_of_slots():
    cache = make(max_seqs=1)
    serve(cache, prompt(BS))
    before = state(cache)
    with pytest.raises(HexcoreOOMError, match="max_seqs=1"):
        cache.admit(prompt(BS))
    assert_unchanged(cache, before)


def test_admit_with_the_cache_off_is_add_sequence():
    cache = PagedKVCache(CONFIG, 8, 2)
    assert cache.admit(prompt(3 * BS), namespace=3, priority=0) == Admission(0, 0)
    assert cache.match_prefix(prompt(3 * BS)) == 0 and cache.pin_prefix(prompt(BS)) == 0
    assert cache.unpin_prefix(prompt(BS)) == 0 and cache.clear_prefix_cache() == 0
    assert not cache.prefix_cache_enabled and cache.num_cached_blocks == 0 and not cache.is_tracked(0)
    cache.grow_sequence(0, 2 * BS, tokens=prompt(2 * BS))  # tokens checked, unused
    with pytest.raises(HexcoreInvalidArgumentError, match=r"tokens: expected 1 token ids"):
        cache.grow_sequence(0, 2 * BS + 1, tokens=prompt(3))
    assert cache.prefix_cache_stats()["queries"] == 0
    cache.check_invariants()
    with pytest.raises(HexcoreInvalidArgumentError, match="prefix_cache: expected a bool"):
        PagedKVCache(CONFIG, 8, 2, prefix_cache=1)


# -- caching, eviction, pins ----------------------------------------------------------------------
def test_freed_blocks_stay_cached_until_needed():
    cache = make(num_blocks=6)
    tokens = prompt(4 * BS)
    a = serve(cache, tokens)
    cache.free_sequence(a.seq_id)
    assert (cache.num_free_blocks, cache.num_cached_blocks, cache.num_available_blocks) == (2, 4, 6)
    b = cache.admit(tokens)  # the cached blocks come back by reference
    assert b.cached_tokens == 3 * BS and cache.num_cached_blocks == 1 and cache.num_active_blocks == 3
    cache.free_sequence(b.seq_id)
    c = cache.add_sequence()
    sealed = cache.grow_sequence(c, 3 * BS, tokens=prompt(3 * BS, 500))  # 2 free, then evictions
    assert sealed.tolist()[:2] == [4, 5] and cache.prefix_cache_stats()["evicted"] == 1
    assert sealed.tolist()[2] == 3  # the leaf of the freed prefix went first
    assert cache.match_prefix(tokens) == 3 * BS
    cache.check_invariants()


def test_eviction_takes_leaves_before_parents_lru():
    cache = make(num_blocks=8)
    x, y = prompt(3 * BS), prompt(3 * BS, 100)
    sx, sy = serve(cache, x).seq_id, serve(cache, y).seq_id
    cache.free_sequence(sy)
    cache.free_sequence(sx)  # x is now the most recently released
    cache.add_sequence(3)
    order = cache.grow_sequence(3, 8 * BS, tokens=prompt(8 * BS, 9000)).tolist()
    assert order == [6, 7, 5, 4, 3, 2, 1, 0]  # free stack, then y leaf-first, then x leaf-first


def test_priority_evicts_low_first_and_blocks_keep_the_highest():
    cache = make(num_blocks=8)
    x, y = prompt(2 * BS), prompt(2 * BS, 100)
    sx = serve(cache, x, priority=6).seq_id
    sy = serve(cache, y, priority=2).seq_id
    cache.free_sequence(sx)
    cache.free_sequence(sy)
    z = cache.admit(y, priority=7, leave_last=False)  # y's blocks are now kept at level 7
    cache.free_sequence(z.seq_id)
    assert cache._prefix.pblocks[[2, 3], pcore.P_PRIO].tolist() == [7, 7]  # y's blocks
    s = cache.add_sequence()
    assert cache.grow_sequence(s, 6 * BS, tokens=prompt(6 * BS, 5000)).tolist() == [4, 5, 6, 7, 1, 0]
    cache.check_invariants()


def test_pins_keep_blocks_until_unpinned():
    cache = make(num_blocks=4)
    tokens = prompt(3 * BS)
    cache.free_sequence(serve(cache, tokens).seq_id)
    assert cache.pin_prefix(tokens[:2 * BS + 3]) == 2 * BS
    assert cache.pin_prefix(tokens[:BS]) == BS
    assert (cache.num_cached_blocks, cache.num_evictable_blocks, cache.num_available_blocks) == (3, 1, 2)
    s = cache.add_sequence()
    with pytest.raises(HexcoreOOMError, match=r"needs 3 blocks, 1 free \+ 1 evictable \+ 0 reserved"):
        cache.grow_sequence(s, 3 * BS, tokens=prompt(3 * BS, 70))
    assert cache.try_grow_sequence(s, 2 * BS, tokens=prompt(2 * BS, 70)) is Status.OK  # evicts the unpinned leaf
    assert cache.match_prefix(tokens) == 2 * BS
    assert cache.unpin_prefix(tokens) == 2 * BS  # the longest pinned prefix first
    assert cache.unpin_prefix(tokens) == BS and cache.unpin_prefix(tokens) == 0
    assert cache.num_evictable_blocks == 2
    cache.check_invariants()
    assert cache.clear_prefix_cache() == 2 and cache.num_cached_blocks == 0 and cache.num_free_blocks == 2


def test_pinning_live_blocks_and_clear_keeps_what_is_used():
    cache = make(num_blocks=8)
    tokens = prompt(3 * BS)
    a = serve(cache, tokens)
    assert cache.pin_prefix(tokens) == 3 * BS
    cache.free_sequence(a.seq_id)
    assert cache.num_evictable_blocks == 0 and cache.clear_prefix_cache() == 0
    b = serve(cache, prompt(2 * BS, 40))
    cache.unpin_prefix(tokens)
    assert cache.clear_prefix_cache() == 3 and cache.match_prefix(prompt(2 * BS, 40)) == 2 * BS
    assert cache.is_live(b.seq_id)
    cache.check_invariants()


# -- growth and steps with tokens -----------------------------------------------------------------
def test_decode_steps_index_the_blocks_they_seal():
    cache = make()
    system = prompt(BS + 4)
    a = serve(cache, system)
    for t in range(BS - 4 + 3):
        res = cache.step(ids(a.seq_id), tokens=toks(500 + t))
        assert res.ok
    history = np.concatenate((system, np.arange(500, 500 + BS - 4 + 3, dtype=np.int32)))
    assert cache.seq_len(a.seq_id) == len(history) == 2 * BS + 3
    cache.free_sequence(a.seq_id)
    # the next turn of the conversation finds the whole history, decode included
    assert cache.admit(np.concatenate((history, prompt(5, 900)))).cached_tokens == 2 * BS
    cache.check_invariants()


def test_step_with_token_spans():
    cache = make()
    a, b, c = (cache.add_sequence() for _ in range(3))
    lens = ids(BS + 2, 3, 2 * BS)
    starts = ids(0, BS + 2, BS + 2 + 3, BS + 5 + 2 * BS)
    tokens = np.arange(starts[-1], dtype=np.int32)
    res = cache.step(ids(a, b, c), lens, tokens=tokens, token_starts=starts)
    assert res.ok and res.num_sealed == 3
    assert cache.match_prefix(tokens[:BS]) == BS
    assert cache.match_prefix(tokens[BS + 5:BS + 5 + 2 * BS]) == 2 * BS
    bad = cache.step(ids(a, b), ids(BS + 3, 5), tokens=toks(1, 2, 3), token_starts=ids(0, 1, 2))
    assert bad.statuses.tolist() == [Status.OK, Status.INVALID_ARGUMENT] and cache.seq_len(b) == 3
    cache.check_invariants()


def test_growth_without_tokens_stops_tracking():
    cache = make()
    s = cache.add_sequence()
    assert cache.is_tracked(s)
    cache.grow_sequence(s, BS, tokens=prompt(BS))
    cache.grow_sequence(s, 2 * BS)
    assert not cache.is_tracked(s) and cache.prefix_cache_stats()["indexed_blocks"] == 1
    cache.grow_sequence(s, 3 * BS, tokens=prompt(BS))  # tokens of an untracked sequence: unused
    t = cache.add_sequence()
    cache.step(ids(t))  # a step without tokens too
    assert not cache.is_tracked(t) and cache.prefix_cache_stats()["indexed_blocks"] == 1
    cache.check_invariants()


def test_the_same_prompt_prefilled_twice_is_indexed_once():
    cache = make()
    tokens = prompt(2 * BS + 1)
    a, b = cache.admit(tokens), cache.admit(tokens)  # both miss: neither was prefilled
    cache.grow_sequence(a.seq_id, len(tokens), tokens=tokens)
    cache.grow_sequence(b.seq_id, len(tokens), tokens=tokens)
    assert not cache.is_tracked(b.seq_id) and cache.is_tracked(a.seq_id)
    assert cache.prefix_cache_stats()["indexed_blocks"] == 2
    cache.free_sequence(a.seq_id)
    cache.free_sequence(b.seq_id)
    assert cache.num_cached_blocks == 2 and cache.num_free_blocks == 14
    cache.check_invariants()


def test_fork_inherits_tail_tokens_and_tracking():
    cache = make()
    a = serve(cache, prompt(BS + 5))
    child = cache.fork_sequence(a.seq_id)
    assert cache.is_tracked(child)
    cache.grow_sequence(child, 2 * BS, tokens=prompt(BS - 5, 200))
    whole = np.concatenate((prompt(BS + 5), prompt(BS - 5, 200)))
    assert cache.match_prefix(whole) == 2 * BS
    cache.check_invariants()


@pytest.mark.parametrize("kw, match", [
    ({"tokens": ids(1)}, r"tokens: expected shape \(2,\) like seq_ids"),
    ({"tokens": np.zeros(2, np.int64)}, "tokens: expected a C-contiguous int32"),
    ({"tokens": ids(1, 2), "token_starts": ids(0, 1, 2)}, "token_starts: only with new_lens"),
    ({"token_starts": ids(0, 1, 2)}, "token_starts: given without tokens"),
    ({"new_lens": ids(1, 1), "tokens": ids(1, 2)}, "token_starts: expected .* got None"),
    ({"new_lens": ids(1, 1), "tokens": ids(1, 2), "token_starts": ids(0, 1)}, r"token_starts: expected shape \(3,\)"),
])
@pytest.mark.parametrize("prefix_cache", [True, False])
def test_step_rejects_malformed_tokens(kw, match, prefix_cache):
    cache = PagedKVCache(CONFIG, 8, 4, prefix_cache=prefix_cache)
    cache.add_sequence(), cache.add_sequence()
    before = [a.copy() for a in (cache._blocks, cache._seqs, cache._tables, cache._counters)]
    with pytest.raises(HexcoreInvalidArgumentError, match=match):
        cache.step(ids(0, 1), **kw)
    for x, y in zip(before, (cache._blocks, cache._seqs, cache._tables, cache._counters)):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("tokens, match", [
    (prompt(3), r"tokens: expected 5 token ids \(new_len 5 - length 0\), got 3"),
    (np.zeros(5, np.float64), "tokens: expected a 1-D array of int"),
])
def test_grow_rejects_bad_tokens(tokens, match):
    cache = make()
    s = cache.add_sequence()
    before = state(cache)
    with pytest.raises(HexcoreInvalidArgumentError, match=match):
        cache.grow_sequence(s, 5, tokens=tokens)
    assert cache.try_grow_sequence(s, 5, tokens=tokens) is Status.INVALID_ARGUMENT
    assert cache.try_grow_sequence(s + 1, 5, tokens=prompt(5)) is Status.INVALID_SEQUENCE
    assert_unchanged(cache, before)


def test_oom_with_tokens_changes_nothing():
    cache = make(num_blocks=2, max_seq_len=4 * BS)
    s = cache.add_sequence()
    before = state(cache)
    with pytest.raises(HexcoreOOMError):
        cache.grow_sequence(s, 3 * BS, tokens=prompt(3 * BS))
    res = cache.step(ids(s), ids(3 * BS), tokens=prompt(3 * BS), token_starts=ids(0, 3 * BS))
    assert res.statuses.tolist() == [Status.OUT_OF_MEMORY]
    assert_unchanged(cache, before)


def test_can_step_counts_evictable_blocks():
    cache = make(num_blocks=2, max_seqs=2)
    cache.free_sequence(serve(cache, prompt(2 * BS)).seq_id)
    s = cache.add_sequence()
    cache.grow_sequence(s, BS - 1, tokens=prompt(BS - 1, 50))
    assert cache.num_free_blocks == 0 and cache.can_step(ids(s)) == (Status.OK, -1)
    cache.pin_prefix(prompt(2 * BS))
    assert cache.can_step(ids(s)) == (Status.OUT_OF_MEMORY, -1)


# -- reservations -------------------------------------------------------------------------------
def test_reservations_evict_and_seal_into_the_reserved_block():
    cache = make(num_blocks=3, max_seqs=2)
    cache.free_sequence(serve(cache, prompt(3 * BS)).seq_id)
    s = cache.add_sequence()
    cache.grow_sequence(s, BS - 1, tokens=prompt(BS - 1, 60))
    assert cache.reserve_blocks(ids(s)).tolist() == [2]  # evicted the leaf
    assert cache.prefix_cache_stats()["evicted"] == 1 and cache.num_reserved_blocks == 1
    res = cache.step(ids(s), tokens=toks(7))
    assert res.seal_blocks.tolist() == [2] and res.num_hits == 1
    counts = np.zeros(4, np.int64)
    assert cache.reserve_predictions(np.array([[s, -1]], np.int64), floor=2, counts=counts) == 0
    assert counts.tolist() == [0, 0, 0, 1]  # 2 available blocks: the floor
    cache.check_invariants()


def test_speculative_allocator_over_a_prefix_cache(rng):
    cache = make(num_blocks=24, max_seqs=4)
    spec = SpeculativeAllocator(cache)
    live = []
    for it in range(300):
        if len(live) < 4 and rng.random() < 0.3:
            tokens = prompt(int(rng.integers(1, 3 * BS)), 100 * int(rng.integers(0, 3)))
            adm = cache.admit(tokens)
            try:
                spec.grow_sequence(adm.seq_id, len(tokens), tokens=tokens[adm.cached_tokens:])
            except HexcoreOOMError:
                pass
            live.append(adm.seq_id)
        elif live and rng.random() < 0.2:
            spec.free_sequence(live.pop(int(rng.integers(len(live)))))
        elif live:
            batch = np.array(live, np.int32)
            spec.predict(batch)
            spec.step(batch, tokens=np.full(len(batch), it, np.int32))
        if it % 50 == 0:
            spec.check_invariants()
    spec.check_invariants()


# -- metrics and invariants -----------------------------------------------------------------------
def test_prefix_metrics():
    metrics = MetricsCollector()
    cache = make(num_blocks=4, metrics=metrics)
    tokens = prompt(2 * BS + 1)
    cache.free_sequence(serve(cache, tokens).seq_id)
    cache.free_sequence(cache.admit(tokens).seq_id)
    s = cache.add_sequence()
    cache.grow_sequence(s, 3 * BS, tokens=prompt(3 * BS, 99))  # two free, one eviction
    snap = metrics.snapshot()
    assert (snap["prefix_queries"], snap["prefix_hits"], snap["prefix_evictions"]) == (2 * len(tokens), 2 * BS, 1)
    assert snap["prefix_hit_rate"] == 2 * BS / (2 * len(tokens)) and snap["cached_blocks"] == 1
    assert snap["calls"]["admit"] == 2
    assert "prefix queries=66 hits=32 evictions=1 cached=1" in metrics.to_string()
    stats = cache.prefix_cache_stats()
    assert (stats["queries"], stats["hits"], stats["evicted"], stats["stored"]) == (66, 32, 1, 5)


def test_prometheus_names():
    pytest.importorskip("prometheus_client")
    from prometheus_client import CollectorRegistry, generate_latest

    metrics = MetricsCollector()
    metrics.observe("admit", 1000, prefix_queries=10, prefix_hits=4, prefix_evictions=1, cached_blocks=3)
    registry = CollectorRegistry()
    metrics.register(registry)
    text = generate_latest(registry).decode()
    for line in ("hexcore_prefix_cache_queries_total 10.0", "hexcore_prefix_cache_hits_total 4.0",
                 "hexcore_prefix_cache_evictions_total 1.0", "hexcore_prefix_cached_blocks 3.0"):
        assert line in text


@pytest.mark.parametrize("corrupt, match", [
    (lambda c: c._prefix.pblocks.__setitem__((1, pcore.P_KEY), 5), "index row's key|not found"),
    (lambda c: c._prefix.ptok.__setitem__((1, 3), 77), "hash of its chain"),
    (lambda c: c._prefix.pblocks.__setitem__((0, pcore.P_PINS), 1), "pins"),
    (lambda c: c._prefix.pblocks.__setitem__((2, pcore.P_PRIO), 7), "lower level|LRU"),
    (lambda c: c._prefix.pc.__setitem__(pcore.C_CACHED, 0), "cached"),
])
def test_check_invariants_sees_prefix_corruption(corrupt, match):
    cache = make()
    cache.free_sequence(serve(cache, prompt(3 * BS)).seq_id)
    cache.check_invariants()
    corrupt(cache)
    with pytest.raises(AssertionError, match=match):
        cache.check_invariants()


def test_default_priority_is_documented():
    assert 0 <= DEFAULT_PRIORITY < NUM_PRIORITIES == 8


@pytest.mark.parametrize("prefix_cache", [True, False])
@pytest.mark.parametrize("kw, match", [
    ({"namespace": -1}, r"namespace: expected an int in \[0, "),
    ({"namespace": "a"}, "namespace: expected an int, got str"),
    ({"priority": 8}, r"priority: expected an int in \[0, 7\], got 8"),
    ({"priority": True}, "priority: expected an int, got True"),
])
def test_add_sequence_checks_namespace_and_priority(prefix_cache, kw, match):
    cache = PagedKVCache(CONFIG, 8, 2, prefix_cache=prefix_cache)
    with pytest.raises(HexcoreInvalidArgumentError, match=match):
        cache.add_sequence(**kw)
    assert cache.num_sequences == 0
    assert cache.add_sequence(namespace=np.int64(3), priority=np.int8(0)) == 0


@pytest.mark.parametrize("call", ["match_prefix", "pin_prefix", "unpin_prefix"])
def test_prefix_queries_check_their_arguments(call):
    cache = make()
    serve(cache, prompt(2 * BS))
    before = state(cache)
    with pytest.raises(HexcoreInvalidArgumentError, match="tokens: expected a 1-D array of int"):
        getattr(cache, call)(np.zeros(3, np.float64))
    with pytest.raises(HexcoreInvalidArgumentError, match="namespace: expected an int"):
        getattr(cache, call)(prompt(BS), namespace=None)
    assert_unchanged(cache, before)


def test_block_key_checks_its_id():
    cache = make()
    with pytest.raises(HexcoreInvalidArgumentError, match=r"block_id: expected an int in \[0, 15\], got 16"):
        cache.block_key(16)


def test_events_are_logged_only_while_a_ring_is_attached():
    from hexcore.host import LockFreeRingBuffer

    cache = make()
    assert len(cache._prefix.plog) == 0
    cache.attach_event_ring(LockFreeRingBuffer(64, 4))
    assert len(cache._prefix.plog) > 0
    serve(cache, prompt(2 * BS))
    cache.attach_event_ring(None)
    assert len(cache._prefix.plog) == 0
    serve(cache, prompt(2 * BS, 50))  # logs nothing, changes the same
    cache.check_invariants()
