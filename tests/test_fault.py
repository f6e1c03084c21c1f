"""FaultTolerantKVCache: record at seal, verify, scrub, canaries, migrate, quarantine, refill."""

from __future__ import annotations

import numpy as np
import pytest

from hexcore import FaultTolerantKVCache, KVCacheConfig, PagedKVCache, Status
from hexcore.cuda import DeviceKVStore, paged_decode, seal
from hexcore.errors import (HexcoreConfigError, HexcoreCorruptionError, HexcoreInvalidArgumentError,
                            HexcoreInvalidSequenceError, HexcoreOOMError)

CFG = KVCacheConfig(num_layers=2, num_kv_heads=1, head_dim=64, block_size=16, kv_dtype="int4")
BS = CFG.block_size
CFG1 = KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=64, block_size=16, kv_dtype="fp16")  # cheap steps


class Rig:
    """A cache, its store and a FaultTolerantKVCache; grows sequences a sealed block at a time
    with random tails, keeping each sealed block's FP16 source for refills."""

    def __init__(self, rng, num_blocks=12, max_seqs=4, prefix_cache=False, metrics=None, **kwargs):
        self.rng = rng
        self.cache = PagedKVCache(CFG, num_blocks, max_seqs, metrics, prefix_cache=prefix_cache)
        self.store = DeviceKVStore(CFG, num_blocks, max_seqs)
        self.store.poison()
        self.ft = FaultTolerantKVCache(self.cache, self.store, **kwargs)
        self.sources = {}  # (seq_id, logical) -> (k, v) float16 [L, BS, H, D] sealed there

    def grow(self, seq_id, blocks=1, tokens=None):
        """Seal ``blocks`` blocks onto ``seq_id``; ``tokens``: their token ids (prefix cache)."""
        for i in range(blocks):
            shape = self.store.k_tails.shape  # [L, max_seqs, H, BS, D]
            k = self.rng.standard_normal(shape).astype(np.float16)
            v = self.rng.standard_normal(shape).astype(np.float16)
            self.store.k_tails.copy_to_device(k)
            self.store.v_tails.copy_to_device(v)
            ids = np.array([seq_id], np.int32)
            old_len = self.cache.seq_len(seq_id)
            new_len = np.array([old_len // BS * BS + BS], np.int32)
            if tokens is None:
                result = self.cache.step(ids, new_len)
            else:
                span = np.ascontiguousarray(tokens[i * BS:(i + 1) * BS][old_len % BS:], np.int32)
                result = self.cache.step(ids, new_len, span, np.array([0, len(span)], np.int32))
            result.raise_for_status()
            seal(self.store, result.seal_slots, result.seal_blocks)
            self.ft.record_seals(result)
            logical = int(result.seal_logical[0])
            self.sources[(seq_id, logical)] = tuple(x[:, seq_id].transpose(0, 2, 1, 3).copy() for x in (k, v))

    def block(self, block_id):
        """Host copies of every sealed array of ``block_id`` (name -> [L, ...])."""
        return {n: a.copy_to_host()[:, block_id] for n, a in self.store.arrays.items() if "tails" not in n}


def seqs(*ids):
    return np.array(ids, np.int32)


def test_verify_names_every_sequence_block_and_token_range(rng):
    rig = Rig(rng)
    a = rig.cache.add_sequence()
    rig.grow(a, 3)
    b = rig.cache.fork_sequence(a)
    rig.grow(b, 1)
    assert rig.ft.verify(seqs(a, b)) == 4
    bad = int(rig.cache.block_table(a)[1])
    rig.ft.flip_bit("k_meta", 1, bad, 5, 3)
    with pytest.raises(HexcoreCorruptionError, match=rf"blocks {bad} \(layers \[1\]\).*seq {a} tokens \[16, 32\)") \
            as info:
        rig.ft.verify(seqs(a))
    report = info.value.report
    assert report.block_ids == [bad] and report.layers == {bad: [1]}
    assert report.token_ranges == {a: [(16, 32)], b: [(16, 32)]}  # the fork shares it: reported too
    assert rig.ft.try_verify(seqs(b)) is Status.CORRUPTED
    assert rig.ft.stats()["corruptions_found"] == 1


@pytest.mark.parametrize("name, byte", [("k_codes", 0), ("v_codes", 511), ("v_meta", 63)])
def test_a_flipped_byte_or_word_is_found_by_scrub(rng, name, byte):
    rig = Rig(rng, scrub_blocks=2)
    a = rig.cache.add_sequence()
    rig.grow(a, 3)
    target = int(rig.cache.block_table(a)[2])
    rig.ft.flip_byte(name, 0, target, byte)
    assert rig.ft.scrub() == 2  # blocks 0, 1: clean
    with pytest.raises(HexcoreCorruptionError, match=f"corrupted blocks {target} "):
        rig.ft.scrub()
    rig.ft.flip_byte(name, 0, target, byte)  # undone: the scrub goes round again, clean
    assert rig.ft.try_scrub(3) is Status.OK


def test_a_clobbered_canary_is_found_by_verify_and_scrub(rng):
    rig = Rig(rng)
    a = rig.cache.add_sequence()
    rig.grow(a, 1)
    rig.ft.clobber_canary(4, 0, 1)  # the word after the last K tail
    with pytest.raises(HexcoreCorruptionError, match="guard regions overwritten after k_tails"):
        rig.ft.verify(seqs(a))
    assert rig.ft.try_scrub() is Status.CORRUPTED
    assert rig.ft.last_report.guards == ["k_tails"] and rig.ft.last_report.seq_ids == []


def test_policies(rng):
    rig = Rig(rng, policy="sampled", sample_every=4)
    a = rig.cache.add_sequence()
    rig.grow(a, 4)
    assert [rig.ft.verify(seqs(a)) for _ in range(4)] == [1, 1, 1, 1]  # each block once in 4 calls
    rig.ft.policy = "off"
    assert rig.ft.verify(seqs(a)) == 0


def test_migrate_moves_healthy_blocks_and_quarantines_the_bad(rng):
    rig = Rig(rng, num_blocks=8, max_seqs=4)
    cache, ft = rig.cache, rig.ft
    a = cache.add_sequence()
    rig.grow(a, 3)
    b = cache.fork_sequence(a)
    q = rng.standard_normal((1, 1, CFG.head_dim)).astype(np.float16)

    def attend(seq_id, layer):
        table = np.full((1, 4), -1, np.int32)
        row = cache.block_table(seq_id)
        table[0, :len(row)] = row
        return paged_decode(q, rig.store, layer, table, seqs(cache.seq_len(seq_id)), seqs(seq_id)).copy_to_host()

    before = attend(a, 1)
    old = cache.block_table(a)
    copies = [rig.block(x) for x in old]
    rig.ft.flip_bit("v_codes", 0, int(old[1]), 100, 6)
    with pytest.raises(HexcoreCorruptionError):
        ft.verify(seqs(a))
    moved = ft.migrate_sequence(a)
    new = cache.block_table(a)
    assert moved == {"moved": 2, "lost": [(1, int(new[1]), (16, 32))]}
    assert not set(new.tolist()) & set(old.tolist())
    for j in (0, 2):  # healthy tokens bit-identical in their new blocks
        for name, data in rig.block(int(new[j])).items():
            assert np.array_equal(data.view(np.uint8), copies[j][name].view(np.uint8)), (j, name)
    assert ft.quarantined == [int(old[1])]
    ft.check_invariants()
    with pytest.raises(HexcoreCorruptionError, match=rf"seq {a} tokens \[16, 32\)"):
        ft.verify(seqs(a))  # the lost block awaits its refill
    ft.refill(a, 1, *rig.sources[(a, 1)])
    assert ft.verify(seqs(a)) == 3
    assert np.array_equal(attend(a, 1).view(np.uint16), before.view(np.uint16))  # bit-identical
    # the fork still holds the bad block until it goes; the block never comes back
    assert ft.try_verify(seqs(b)) is Status.CORRUPTED
    assert ft.last_report.layers == {int(old[1]): "quarantined"}
    cache.free_sequence(b)
    ft.check_invariants()
    assert ft.stats()["blocks_quarantined"] == 1
    allocated = 0
    while allocated < 10_000:
        s = cache.add_sequence()
        got = cache.grow_sequence(s, cache.num_free_blocks * BS)
        assert int(old[1]) not in got.tolist()
        allocated += len(got)
        child = cache.fork_sequence(s)
        cache.free_sequence(s)
        cache.free_sequence(child)
    ft.check_invariants()


def test_bad_input_is_refused_and_changes_nothing(rng):
    rig = Rig(rng, num_blocks=4, max_seqs=2)
    cache, ft = rig.cache, rig.ft
    a = cache.add_sequence()
    rig.grow(a, 3)
    state = (cache._blocks.copy(), cache._tables.copy(), ft.recorded.copy())
    with pytest.raises(HexcoreInvalidArgumentError, match="seq_ids: expected a C-contiguous int32 1-D array"):
        ft.verify([a])
    with pytest.raises(HexcoreInvalidSequenceError, match="sequence 1 is not live"):
        ft.verify(seqs(a, 1))
    assert ft.try_verify(seqs(3)) is Status.INVALID_SEQUENCE
    with pytest.raises(HexcoreInvalidSequenceError):
        ft.migrate_sequence(1)
    with pytest.raises(HexcoreOOMError, match="nothing changed"):
        ft.migrate_sequence(a)  # 3 blocks to move, 1 free
    with pytest.raises(HexcoreInvalidArgumentError, match=r"block_ids\[0\] = 4 is outside \[0, 4\)"):
        ft.record(seqs(4))
    with pytest.raises(HexcoreInvalidArgumentError, match="max_blocks"):
        ft.scrub(0)
    with pytest.raises(HexcoreInvalidArgumentError, match="logical"):
        ft.refill(a, 0, None, None)
    with pytest.raises(HexcoreInvalidArgumentError, match="bit"):
        ft.flip_bit("k_codes", 0, 0, 0, 8)
    assert all(np.array_equal(x, y) for x, y in zip(state, (cache._blocks, cache._tables, ft.recorded)))
    store = rig.store
    with pytest.raises(HexcoreInvalidArgumentError, match="policy: expected one of"):
        FaultTolerantKVCache(cache, store, policy="never")
    with pytest.raises(HexcoreInvalidArgumentError, match="sample_every"):
        FaultTolerantKVCache(cache, store, sample_every=0)
    with pytest.raises(HexcoreInvalidArgumentError, match="store: expected DeviceKVStore, got NoneType"):
        FaultTolerantKVCache(cache, None)
    with pytest.raises(HexcoreConfigError, match="num_blocks 4"):
        FaultTolerantKVCache(cache, DeviceKVStore(CFG, 5, 2))
    for policy in (np.zeros((2, 2)), ["always"], b"off"):  # a 2-D array was ValueError: truth value ambiguous
        with pytest.raises(HexcoreInvalidArgumentError, match="policy: expected one of"):
            FaultTolerantKVCache(cache, store, policy=policy)


@pytest.mark.parametrize("result", [None, [1], np.array([0], np.int32), 3])
def test_record_seals_refuses_what_is_not_a_step_result(rng, result):
    """Was AttributeError: 'list' object has no attribute 'num_sealed'."""
    rig = Rig(rng, num_blocks=4, max_seqs=2)
    with pytest.raises(HexcoreInvalidArgumentError, match="result: expected a StepResult, got"):
        rig.ft.record_seals(result)
    assert not rig.ft.recorded.any()


@pytest.mark.parametrize("stream", ["x", -1, 1.5, [1]])
def test_a_bad_stream_is_refused_before_anything_changes(rng, stream):
    """verify counted the call (shifting the sampled policy's sample) and scrub moved its
    position before the bad stream raised."""
    rig = Rig(rng, num_blocks=6, max_seqs=2, policy="sampled", sample_every=2)
    a = rig.cache.add_sequence()
    rig.grow(a, 3)
    ft = rig.ft
    state = (ft._calls, ft._scrub_at, dict(ft.stats()))
    with pytest.raises(HexcoreInvalidArgumentError, match="stream"):
        ft.verify(seqs(a), stream=stream)
    assert ft.try_verify(seqs(a), stream=stream) is Status.INVALID_ARGUMENT
    with pytest.raises(HexcoreInvalidArgumentError, match="stream"):
        ft.scrub(1, stream=stream)
    assert ft.try_scrub(1, stream=stream) is Status.INVALID_ARGUMENT
    with pytest.raises(HexcoreInvalidArgumentError, match="stream"):
        ft.migrate_sequence(a, stream=stream)
    assert (ft._calls, ft._scrub_at, ft.stats()) == state
    assert ft.scrub(1) == 1 and ft._scrub_at == int(rig.cache.block_table(a).min()) + 1


def test_check_results_refuses_malformed_results_and_quarantines_nothing(rng):
    """``out`` of another shape was AxisError, or (2-D, wrong width or rows) read as
    corruption: its blocks quarantined."""
    rig = Rig(rng, num_blocks=4, max_seqs=2)
    a = rig.cache.add_sequence()
    rig.grow(a, 2)
    ft, ids = rig.ft, rig.cache.block_table(a)
    L = CFG.num_layers
    for block_ids, out, text in ((ids, np.ones((1, 2 * L), np.uint32), r"out: expected shape \(2, 2\)"),
                                 (ids, np.ones((2, L), np.int32), "out: expected dtype uint32"),
                                 (ids, np.ones(2, np.uint32), "out: expected shape"),
                                 (ids, None, "out: expected a host numpy array, got NoneType"),
                                 (ids, 3, "out: expected a host numpy array"),
                                 (list(ids), np.ones((2, L), np.uint32), "block_ids: expected a host numpy array"),
                                 (ids.astype(np.int64), np.ones((2, L), np.uint32), "block_ids: expected dtype int32"),
                                 (np.array([0, 9], np.int32), np.ones((2, L), np.uint32),
                                  r"block_ids\[1\] = 9 is outside \[-1, 4\)")):
        with pytest.raises(HexcoreInvalidArgumentError, match=text):
            ft.check_results(block_ids, out)
    assert ft.quarantined == [] and ft.stats()["corruptions_found"] == 0
    ft.check_results(np.array([-1, ids[1]], np.int32), np.zeros((2, L), np.uint32))  # padding and a clean row
    with pytest.raises(HexcoreCorruptionError, match=rf"blocks {ids[1]} \(layers \[1\]\)"):
        ft.check_results(ids, np.array([[0, 0], [0, 7]], np.uint32))
    assert ft.quarantined == [int(ids[1])]


def test_migrate_refuses_an_attached_event_ring_and_refill_keeps_every_tail(rng):
    from hexcore.host import LockFreeRingBuffer

    rig = Rig(rng, num_blocks=8, max_seqs=2)
    cache, ft = rig.cache, rig.ft
    a = cache.add_sequence()
    rig.grow(a, 2)
    bad = int(cache.block_table(a)[0])
    rig.ft.flip_bit("k_codes", 0, bad, 0, 0)
    assert ft.try_verify(seqs(a)) is Status.CORRUPTED and cache.is_quarantined(bad)
    cache.attach_event_ring(LockFreeRingBuffer(64, record_width=4))
    state = (cache._blocks.copy(), cache._tables.copy(), ft.recorded.copy())
    with pytest.raises(HexcoreConfigError, match="detach the cache's event ring"):
        ft.migrate_sequence(a)
    assert all(np.array_equal(x, y) for x, y in zip(state, (cache._blocks, cache._tables, ft.recorded)))
    cache.attach_event_ring(None)
    lost = ft.migrate_sequence(a)["lost"]
    assert [x[0] for x in lost] == [0]
    b = cache.add_sequence()  # every slot live: refill goes through a's own tail
    tails = [t.copy_to_host() for t in (rig.store.k_tails, rig.store.v_tails)]
    with pytest.raises(HexcoreInvalidArgumentError, match="logical: block 1 of seq"):
        ft.refill(a, 1, *rig.sources[(a, 1)])
    ft.refill(a, 0, *rig.sources[(a, 0)])
    for before, t in zip(tails, (rig.store.k_tails, rig.store.v_tails)):  # every tail as it was
        assert np.array_equal(before.view(np.uint16), t.copy_to_host().view(np.uint16))
    assert ft.verify(seqs(a)) == 2 and cache.num_sequences == 2
    ft.check_invariants()


def test_a_corrupted_cached_prefix_block_is_never_served_again(rng):
    """Prefix cache on: a bad shared prefix block is reported for every sequence holding it,
    leaves the key index with its descendants at once, and a later admission of the same
    tokens recomputes them; the recomputed blocks are shared again, the bad one never."""
    rig = Rig(rng, num_blocks=16, max_seqs=6, prefix_cache=True)
    cache, ft = rig.cache, rig.ft
    prompt = np.arange(1000, 1000 + 3 * BS, dtype=np.int32)
    a = cache.admit(prompt).seq_id
    rig.grow(a, 3, prompt)
    first = cache.admit(prompt)  # leave_last: two of the three blocks are shared
    b = first.seq_id
    c = cache.fork_sequence(a)
    assert first.cached_tokens == 2 * BS and cache.match_prefix(prompt) == 3 * BS
    table = cache.block_table(a)
    assert cache.block_table(b).tolist() == table[:2].tolist()
    bad = int(table[0])
    rig.ft.flip_bit("v_meta", 1, bad, 3, 7)
    with pytest.raises(HexcoreCorruptionError) as info:
        ft.verify(seqs(b))
    assert info.value.report.token_ranges == {a: [(0, BS)], b: [(0, BS)], c: [(0, BS)]}
    assert cache.is_quarantined(bad) and cache.num_quarantined_blocks == 1
    assert cache.match_prefix(prompt) == 0  # its descendants' keys chain on it: gone too
    assert all(cache.block_key(int(x)) is None for x in table)
    assert not cache.is_tracked(a) and not cache.is_tracked(b)
    cache.check_invariants()
    d = cache.admit(prompt)
    assert d.cached_tokens == 0  # recompute: the bad block is not served
    rig.grow(d.seq_id, 3, prompt)
    again = cache.admit(prompt)
    assert again.cached_tokens == 2 * BS and bad not in cache.block_table(again.seq_id).tolist()
    assert ft.verify(seqs(d.seq_id, again.seq_id)) == 3
    for s in (again.seq_id, d.seq_id):
        cache.free_sequence(s)
    moved = ft.migrate_sequence(a)  # a's healthy blocks 1, 2 move; block 0 awaits its refill
    assert moved["moved"] == 2 and [x[0] for x in moved["lost"]] == [0]
    ft.refill(a, 0, *rig.sources[(a, 0)])
    assert ft.verify(seqs(a)) == 3
    for s in (b, c, a):
        cache.free_sequence(s)
    ft.check_invariants()
    assert cache.quarantined_blocks().tolist() == [bad] and ft.stats()["blocks_quarantined"] == 1
    assert ft.scrub(64) == cache.num_cached_blocks  # cached blocks are scrubbed too
    allocated = 0
    while allocated < 10_000:  # admissions, prefills, evictions: the bad block never comes back
        adm = cache.admit(prompt)
        got = cache.grow_sequence(adm.seq_id, 3 * BS, prompt[adm.cached_tokens:])
        fill = cache.grow_sequence(adm.seq_id, cache.num_available_blocks * BS + 3 * BS)
        assert bad not in cache.block_table(adm.seq_id).tolist()
        allocated += len(got) + len(fill)
        cache.free_sequence(adm.seq_id)
    ft.check_invariants()


def test_a_corrupted_cached_block_found_by_scrub_leaves_the_index(rng):
    rig = Rig(rng, num_blocks=8, max_seqs=2, prefix_cache=True, scrub_blocks=8)
    cache, ft = rig.cache, rig.ft
    prompt = np.arange(2 * BS, dtype=np.int32)
    a = cache.admit(prompt).seq_id
    rig.grow(a, 2, prompt)
    child = int(cache.block_table(a)[1])
    cache.free_sequence(a)  # both blocks stay cached, unreferenced
    assert cache.num_cached_blocks == 2 and cache.pin_prefix(prompt) == 2 * BS
    rig.ft.flip_word("k_codes", 0, child, 2)
    with pytest.raises(HexcoreCorruptionError, match=f"corrupted blocks {child} .*no live sequence"):
        ft.scrub()
    assert cache.is_quarantined(child) and cache.match_prefix(prompt) == BS
    assert cache.num_cached_blocks == 1 and cache.unpin_prefix(prompt) == BS  # the pin now ends at the parent
    cache.check_invariants()


def test_metrics_export_in_prometheus_style(rng):
    from hexcore.host import MetricsCollector

    metrics = MetricsCollector()
    rig = Rig(rng, num_blocks=8, max_seqs=4, metrics=metrics)
    rig.cache_metrics = metrics
    a = rig.cache.add_sequence()
    rig.grow(a, 2)
    rig.ft.verify(seqs(a))
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        with pytest.raises(HexcoreConfigError, match="prometheus_client is not installed"):
            rig.ft.prometheus_collector()
        return
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry()
    registry.register(rig.ft.prometheus_collector())
    registry.register(rig.cache_metrics.prometheus_collector())  # one registry: no name twice
    rig.ft.flip_bit("k_codes", 1, int(rig.cache.block_table(a)[1]), 9)
    assert rig.ft.try_verify(seqs(a)) is Status.CORRUPTED
    text = generate_latest(registry).decode()
    assert f"hexcore_blocks_verified_total {float(rig.ft.stats()['blocks_verified'])}" in text
    for name in ("hexcore_corruptions_found_total 1.0", "hexcore_quarantined_blocks 1.0",
                 "hexcore_migration_latency_seconds_count 0.0"):
        assert name in text


# -- verification inside a DecodeGraph step -------------------------------------------
class GraphRig:
    """Sequences prefilled to ``lens`` (eager seals, digests recorded), then decode steps
    through a DecodeGraph: ``verify`` one made by ``ft.decode_graph`` (seals recorded and
    sampled blocks checked inside the step), else a plain one and ``ft.record_seals``."""

    def __init__(self, seed, verify, lens=(31, 20), cfg=CFG, num_q_heads=1, buckets=(2,), backend="eager",
                 num_blocks=16, max_seqs=4, max_verify_blocks=8, **kwargs):
        import warnings

        from hexcore.cuda import DecodeGraph
        from tests.cuda.steps.test_graph import prefill

        self.rng, self.verify, self.cfg = np.random.default_rng(seed), verify, cfg
        self.cache = PagedKVCache(cfg, num_blocks, max_seqs)
        self.store = DeviceKVStore(cfg, num_blocks, max_seqs)
        self.store.poison()
        self.ft = FaultTolerantKVCache(self.cache, self.store, **kwargs)
        self.seq_ids = []
        for n in lens:
            s = self.cache.add_sequence()
            prefill(self.cache, self.store, s, n, self.rng)
            self.ft.record(self.cache.block_table(s))
            self.seq_ids.append(s)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the simulator runs graphs eagerly
            if verify:
                self.graph = self.ft.decode_graph(num_q_heads, max_verify_blocks, batch_buckets=buckets,
                                                  backend=backend)
            else:
                self.graph = DecodeGraph(self.store, num_q_heads, self.cache.max_blocks_per_seq,
                                         batch_buckets=buckets, backend=backend)

    def step(self, seq_ids=None):
        """One decode step of ``seq_ids`` (default: all) with random q, k, v; out on the host."""
        from tests.cuda.steps.test_graph import fill, to_host

        ids = np.array(self.seq_ids if seq_ids is None else seq_ids, np.int32)
        result = self.cache.step(ids)
        result.raise_for_status()
        for view in self.graph.buffers(len(ids))[:3]:
            fill(view, self.rng.standard_normal(view.shape).astype(np.float16))
        if self.verify == "load":  # the engine path: indices loaded, then each layer enqueued
            launches = self.ft.graph_load(self.graph, result)
            for layer in range(self.cfg.num_layers):
                launches.enqueue(layer)
            out = self.graph.buffers(len(ids)).out
        elif self.verify:
            out = self.ft.graph_step(self.graph, result)
        else:
            out = self.graph.step(result.block_tables, result.seq_lens, result.tail_slots,
                                  seal_slots=result.seal_slots, seal_blocks=result.seal_blocks)
            self.ft.record_seals(result)
        return to_host(out), result


def test_graph_verification_changes_no_output_and_records_like_record_seals(seed):
    """The same steps with verification ("always": through graph_step, and through
    graph_load and per-layer enqueue) and without: outputs and store bytes identical; the
    digests the graph records of its seals equal record_seals'."""
    runs = []
    for verify in (False, True, "load"):
        rig = GraphRig(seed, verify, cfg=CFG1, policy="always")
        outs = [rig.step()[0] for _ in range(2)]  # step 1 seals a's tail; step 2 verifies that block
        if verify:
            rig.ft.check_graph(rig.graph)  # no false alarm
            assert rig.ft.stats()["blocks_verified"] == 2 + 3
        runs.append((outs, rig.store.pool.copy_to_host(), rig.ft.sums.copy_to_host(), rig.ft.recorded.copy()))
    (outs_off, pool_off, sums_off, rec_off) = runs[0]
    assert np.isfinite(np.stack(outs_off)).all() and rec_off.sum() == 3
    for outs_on, pool_on, sums_on, rec_on in runs[1:]:
        for a, b in zip(outs_off, outs_on):
            assert np.array_equal(a.view(np.uint16), b.view(np.uint16))
        assert np.array_equal(pool_off, pool_on)
        assert np.array_equal(rec_off, rec_on)
        assert np.array_equal(sums_off[rec_off], sums_on[rec_on])


def test_graph_step_finds_a_flipped_bit_in_a_sampled_block(seed):
    rig = GraphRig(seed, True, lens=(40, 20), policy="sampled", sample_every=2)
    cache, ft = rig.cache, rig.ft
    a, b = rig.seq_ids
    c = cache.fork_sequence(a)  # shares a's blocks, not in the batch
    result = cache.step(np.array([a, b], np.int32))
    blocks = sorted(set(cache.block_table(a).tolist() + cache.block_table(b).tolist()))
    call = ft._calls + 1
    assert ft.sample_step(result).tolist() == [x for x in blocks if (x + call) % 2 == 0]
    assert ft.sample_step(result).tolist() == ft.sample_step(result).tolist()  # changes nothing
    from tests.cuda.steps.test_graph import fill

    # that step through the graph: clean
    for view in rig.graph.buffers(2)[:3]:
        fill(view, rig.rng.standard_normal(view.shape).astype(np.float16))
    ft.graph_step(rig.graph, result)
    assert ft.try_check_graph(rig.graph) is Status.OK
    # a bit flip in a's block sampled at the next call
    logical = next(j for j, x in enumerate(cache.block_table(a).tolist()) if (x + call + 1) % 2 == 0)
    bad = int(cache.block_table(a)[logical])
    ft.flip_bit("k_meta", 1, bad, 7, 5)
    rig.step([a, b])
    with pytest.raises(HexcoreCorruptionError, match=rf"blocks {bad} \(layers \[1\]\)") as info:
        ft.check_graph(rig.graph)
    span = (logical * BS, (logical + 1) * BS)
    assert info.value.report.token_ranges == {a: [span], c: [span]}  # the fork is named too
    assert cache.is_quarantined(bad) and ft.stats()["corruptions_found"] == 1
    ft.check_invariants()
    # the next calls: a canary overwrite; then the quarantined block reported when sampled again
    ft.clobber_canary(4, 3, 7)
    rig.step([a, b])
    assert ft.try_check_graph(rig.graph) is Status.CORRUPTED
    assert ft.last_report.guards == ["k_tails"] and ft.last_report.block_ids == []
    rig.store.fill_guards()
    rig.step([a, b])
    assert ft.try_check_graph(rig.graph) is Status.CORRUPTED
    assert ft.last_report.layers == {bad: [1]} and ft.stats()["corruptions_found"] == 1  # known: not re-counted


def test_graph_verification_above_the_largest_bucket_runs_eagerly(seed):
    rig = GraphRig(seed, True, lens=(31, 20), cfg=CFG1, buckets=(1,), policy="always")
    bad = int(rig.cache.block_table(rig.seq_ids[1])[0])
    rig.ft.flip_bit("v_codes", 0, bad, 130, 0)
    rig.step()  # batch 2 > bucket 1: the eager launchers, with record and verify
    assert rig.graph.prepared == ()
    with pytest.raises(HexcoreCorruptionError, match=rf"seq {rig.seq_ids[1]} tokens \[0, 16\)"):
        rig.ft.check_graph(rig.graph)
    assert rig.ft.recorded[rig.cache.block_table(rig.seq_ids[0])].all()  # a's seal recorded by the step


def test_graph_verification_refuses_bad_input_and_changes_nothing(seed):
    from hexcore.cuda import DecodeGraph

    rig = GraphRig(seed, True, cfg=CFG1, policy="always", max_verify_blocks=1)
    cache, ft, store = rig.cache, rig.ft, rig.store
    result = cache.step(np.array(rig.seq_ids, np.int32))
    state = (store.pool.copy_to_host(), ft._calls, dict(ft.stats()), ft.recorded.copy())
    plain = DecodeGraph(store, 1, cache.max_blocks_per_seq, batch_buckets=(2,), backend="eager")
    other = FaultTolerantKVCache(cache, store).decode_graph(1, batch_buckets=(2,), backend="eager")
    for graph, text in ((plain, "DecodeGraph verifying against this cache's sums"), (other, "this cache's sums"),
                        (None, "got NoneType"), (rig.graph, "samples 2 blocks, more than its max_verify_blocks 1")):
        with pytest.raises(HexcoreInvalidArgumentError, match=text):
            ft.graph_step(graph, result)
    with pytest.raises(HexcoreInvalidArgumentError, match="result: expected a StepResult, got dict"):
        ft.graph_step(rig.graph, {})
    with pytest.raises(HexcoreInvalidArgumentError, match="this cache's sums"):
        ft.check_graph(plain)
    assert ft.try_check_graph(plain) is Status.INVALID_ARGUMENT
    with pytest.raises(HexcoreInvalidArgumentError, match="max_verify_blocks"):
        ft.decode_graph(1, max_verify_blocks=0)
    for kwargs in ({"bogus": 1}, {"verify_sums": None}, {"max_blocks_per_seq": 2}):  # were TypeError
        with pytest.raises(HexcoreInvalidArgumentError, match=r"decode_graph: unknown option\(s\)"):
            ft.decode_graph(1, **kwargs)
    assert np.array_equal(store.pool.copy_to_host(), state[0])
    assert (ft._calls, ft.stats(), ft.recorded.tolist()) == (state[1], state[2], state[3].tolist())
    assert rig.graph.prepared == ()


# -- whole layers in turn, checked inside the decode (decode_layers) -------------------
@pytest.mark.parametrize("path", [True, "load"])
def test_layers_in_turn_change_no_output_and_find_a_flip_in_its_layers_turn(seed, path):
    """decode_layers=1 over 2 layers: outputs and store bytes equal a plain graph's over
    steps that seal (graph_step and the per-layer engine path, whose checked layer records
    its own seals' head digests first); no false alarm; a flip in layer 1 is found by the
    next step of phase 1, not by one of phase 0."""
    runs = []
    for verify in (False, path):
        rig = GraphRig(seed, verify, lens=(31, 20), decode_layers=1 if verify else 0)
        outs = [rig.step()[0] for _ in range(3)]  # step 1 seals a's tail (phase 0 checks layer 0 of it)
        if verify:
            assert rig.graph.phases == 2 and rig.graph.phase == 1
            rig.ft.check_graph(rig.graph)  # no false alarm
            assert rig.ft.stats()["blocks_verified"] == (2 + 3 + 3) // 2  # blocks read (less the step's seal) / L
        runs.append((outs, rig.store.pool.copy_to_host(), rig))
    for x, y in zip(runs[0][0], runs[1][0]):
        assert np.array_equal(x.view(np.uint16), y.view(np.uint16))
    assert np.array_equal(runs[0][1], runs[1][1])
    rig = runs[1][2]
    a, b = rig.seq_ids
    bad = int(rig.cache.block_table(a)[1])  # sealed by the graph's step 1
    rig.ft.flip_bit("k_codes", 1, bad, 40, 3)
    rig.step()  # phase 1: layer 1 checked
    with pytest.raises(HexcoreCorruptionError, match=rf"blocks {bad} \(layers \[1\]\)"):
        rig.ft.check_graph(rig.graph)
    assert rig.cache.is_quarantined(bad)
    other = int(rig.cache.block_table(b)[0])
    rig.ft.flip_bit("v_meta", 1, other, 2, 0)
    rig.step()  # phase 0: layer 1 not checked (block bad still reported: known)
    assert rig.ft.try_check_graph(rig.graph) is Status.CORRUPTED
    assert rig.ft.last_report.block_ids == [bad]
    rig.step()  # phase 1
    assert rig.ft.try_check_graph(rig.graph) is Status.CORRUPTED
    assert sorted(rig.ft.last_report.block_ids) == sorted([bad, other])
    assert rig.ft.stats()["corruptions_found"] == 2
    rig.ft.check_invariants()


def test_layers_in_turn_record_unrecorded_blocks_and_lost_ones_raise_no_alarm(seed):
    """A sequence sealed outside the cache's records is recorded by the first graph step
    that reads it (no false alarm); after a migration the lost block's replacement is
    reported as lost, not found corrupted, until its refill."""
    from tests.cuda.steps.test_graph import prefill

    rig = GraphRig(seed, True, lens=(40,), cfg=CFG, decode_layers=2, max_seqs=4)
    c = rig.cache.add_sequence()
    prefill(rig.cache, rig.store, c, 33, rig.rng)  # two blocks, never recorded
    rig.seq_ids.append(c)
    assert not rig.ft.recorded[rig.cache.block_table(c)].any()
    rig.step()
    rig.ft.check_graph(rig.graph)
    assert rig.ft.recorded[rig.cache.block_table(c)].all()
    a = rig.seq_ids[0]
    bad = int(rig.cache.block_table(a)[0])
    rig.ft.flip_byte("k_meta", 0, bad, 5)
    rig.step()
    with pytest.raises(HexcoreCorruptionError, match=rf"blocks {bad}"):
        rig.ft.check_graph(rig.graph)
    moved = rig.ft.migrate_sequence(a)
    (_, lost, _), = moved["lost"]
    for _ in range(2):
        rig.step()
        assert rig.ft.try_check_graph(rig.graph) is Status.CORRUPTED
        assert rig.ft.last_report.block_ids == [lost] and rig.ft.last_report.layers == {lost: "lost"}
    assert not rig.cache.is_quarantined(lost) and rig.ft.stats()["corruptions_found"] == 1
    k, v = (rig.rng.standard_normal((CFG.num_layers, BS, 1, 64)).astype(np.float16) for _ in range(2))
    rig.ft.refill(a, 0, k, v)  # (its recomputed K/V: here any)
    rig.step()
    rig.ft.check_graph(rig.graph)


def test_layers_in_turn_refuse_bad_input(seed):
    from hexcore.cuda import DecodeGraph
    from numba import cuda

    rig = GraphRig(seed, True, cfg=CFG, decode_layers=1)
    store, cache = rig.store, rig.cache
    for value in (3, -1, 1.5, "1"):
        with pytest.raises(HexcoreInvalidArgumentError, match="decode_layers"):
            FaultTolerantKVCache(cache, store, decode_layers=value)
    heads = cuda.to_device(np.zeros((store.num_blocks, 2, 1), np.uint32))
    sums = cuda.to_device(np.zeros((store.num_blocks, 2), np.uint32))
    for kwargs, text in (({"verify_heads": heads, "verify_layers": 1}, "needs verify_sums"),
                         ({"verify_sums": sums, "verify_heads": heads}, "verify_layers: expected an int in \\[1, 2\\]"),
                         ({"verify_sums": sums, "verify_layers": 1}, "verify_layers: expected an int in \\[1, 2\\]"),
                         ({"verify_sums": sums, "verify_heads": heads, "verify_layers": 3}, "verify_layers"),
                         ({"verify_sums": sums, "verify_heads": heads.copy_to_host(), "verify_layers": 1},
                          "verify_heads: expected a device array"),
                         ({"verify_sums": sums, "verify_heads": sums, "verify_layers": 1}, "verify_heads")):
        with pytest.raises(HexcoreInvalidArgumentError, match=text):
            DecodeGraph(store, 1, cache.max_blocks_per_seq, backend="eager", **kwargs)
    rig.step()
    result = cache.step(np.array(rig.seq_ids, np.int32))
    phase = rig.graph.phase
    with pytest.raises(HexcoreInvalidArgumentError, match="takes no verify_blocks"):
        rig.graph.step(result.block_tables, result.seq_lens, result.tail_slots, verify_blocks=np.array([0], np.int32))
    assert rig.graph.phase == phase and rig.ft.sample_step(result).size == 0
    step = rig.graph._steps[next(iter(rig.graph._steps))]
    for phase in (2, -1, None, 0.5):
        with pytest.raises(HexcoreInvalidArgumentError, match="phase"):
            step.enqueue_all(0, phase=phase)
    plain = DecodeGraph(store, 1, cache.max_blocks_per_seq, batch_buckets=(2,), backend="eager")
    plain.warmup(2, 40)
    with pytest.raises(HexcoreInvalidArgumentError, match="checks no layers in turn"):
        plain._steps[next(iter(plain._steps))].at(0)
    assert plain.phase is None and plain.checked_layers(None) == range(0)


def test_layers_in_turn_follow_each_block_when_batches_take_turns(seed, monkeypatch):
    """Two batches stepped in turn ([a], [b], [a], ...: pipelined micro-batches) over 2
    phases: each batch's blocks still get every phase (a step count alone would give [a]
    phase 0 forever), so a flip in layer 1 of a's block is found by a's second step."""
    rig = GraphRig(seed, True, lens=(40, 40), cfg=CFG, decode_layers=1, buckets=(2,))
    a, b = rig.seq_ids
    bad = int(rig.cache.block_table(a)[0])
    rig.ft.flip_bit("k_codes", 1, bad, 40, 3)
    phases, graph_step = [], rig.ft.graph_step

    def spied(graph, result, *args, **kwargs):  # the phase step_phase promises, then the step
        phases.append(rig.ft.step_phase(result))
        return graph_step(graph, result, *args, **kwargs)

    monkeypatch.setattr(rig.ft, "graph_step", spied)
    for batch in ([a], [b], [a]):
        rig.step(batch)
        status = rig.ft.try_check_graph(rig.graph)
        if len(phases) < 3:
            assert status is Status.OK, rig.ft.last_report
    assert phases == [0, 0, 1] and rig.graph.phase == 1  # (the graph's own count: 3 steps)
    assert status is Status.CORRUPTED and rig.ft.last_report.layers == {bad: [1]}
    assert rig.ft.phases == 2 and FaultTolerantKVCache(rig.cache, rig.store).step_phase(None) is None


def test_layers_in_turn_reach_a_block_whose_shared_neighbour_other_batches_move(seed):
    """a = [y, x] and its fork b = [y], stepped in turn [b], [a], ...: b's steps credit y's
    phases, so a step of a must still serve x (a rule by the blocks' next phase alone gave
    every a-step phase 0 here, and x's layer 1 was never checked)."""
    from tests.cuda.steps.test_graph import prefill

    rig = GraphRig(seed, True, lens=(16,), cfg=CFG, decode_layers=1, buckets=(2,))
    ft, cache = rig.ft, rig.cache
    a = rig.seq_ids[0]
    b = cache.fork_sequence(a)
    prefill(cache, rig.store, a, 16, rig.rng)
    ft.record(cache.block_table(a)[:2].astype(np.int32))
    y, x = (int(v) for v in cache.block_table(a)[:2])
    assert cache.block_table(b).tolist() == [y]
    ft.flip_bit("k_codes", 1, x, 5, 3)
    rig.step([b])  # phase 0: y's layer 0
    ft.check_graph(rig.graph)
    rig.step([a])  # y and x began their rounds together: the first's first phase missing (y's 1)
    with pytest.raises(HexcoreCorruptionError, match=rf"blocks {x} \(layers \[1\]\)"):
        ft.check_graph(rig.graph)


@pytest.mark.parametrize("phases, shared, per_seal", [(2, 1, 1), (16, 32, 4), (16, 256, 8), (32, 64, 16)])
def test_the_phase_rule_checks_every_block_within_a_round_of_its_steps(seed, phases, shared, per_seal):
    """The rule alone (host, no store): two micro-batches stepped in turn share a prefix of
    ``shared`` blocks and each seals ``per_seal`` private blocks every 16 of its steps
    (rounds of leftover blocks at random); every private block has had every phase within
    ``phases`` of its batch's steps after its seal, and every shared block is checked."""
    from hexcore.fault import _bits, _credit_phase, _needed_phase

    rng, steps = np.random.default_rng(seed), 1000 + 40 * phases
    num_blocks = shared + per_seal * (steps // 16 + 2)
    full = np.array([_bits(phases - 64 * w) for w in range(-(-phases // 64))], np.uint64)
    missing, start = np.tile(full, (num_blocks, 1)), rng.integers(0, 50, num_blocks).astype(np.int64)
    missing[:, 0] &= rng.integers(1, 1 << phases, num_blocks, dtype=np.uint64) & full[0]
    checked = np.zeros((num_blocks, phases), bool)
    own, sealed_at, fresh = ([], []), {}, shared
    for t in range(steps):
        batch = own[t % 2]
        if (t // 2) % 16 == 15:
            for b in range(fresh, fresh + per_seal):
                batch.append(b)
                sealed_at[b], missing[b], start[b] = t, full, t
            fresh += per_seal
        blocks = np.array(list(range(shared)) + batch, np.int32)
        phase = int(_needed_phase(missing, start, blocks, t % phases))
        _credit_phase(missing, start, blocks, phase, full, t + 1)
        checked[blocks, phase] = True
        for b in batch:
            if (t - sealed_at[b]) // 2 + 1 == phases:  # its batch's phases-th step since its seal
                assert checked[b].all(), (b, np.flatnonzero(~checked[b]))
    assert checked[:shared].all() and len(sealed_at) > 40


def test_layers_in_turn_refuse_a_graph_of_other_head_digests_and_change_nothing_on_bad_input(seed):
    from hexcore.cuda import DecodeGraph
    from numba import cuda

    rig = GraphRig(seed, True, cfg=CFG, decode_layers=1)
    ft, cache, store = rig.ft, rig.cache, rig.store
    heads = cuda.to_device(np.zeros_like(ft.head_sums.copy_to_host()))
    plain_ft = FaultTolerantKVCache(cache, store)
    for owner, kwargs in ((ft, dict(verify_heads=heads, verify_layers=1)),
                          (ft, dict(verify_heads=ft.head_sums, verify_layers=2)),
                          (plain_ft, dict(verify_heads=heads, verify_layers=1))):
        graph = DecodeGraph(store, 1, cache.max_blocks_per_seq, backend="eager", verify_sums=owner.sums, **kwargs)
        with pytest.raises(HexcoreInvalidArgumentError, match="head digests"):
            owner.graph_step(graph, cache.step(np.array(rig.seq_ids, np.int32)))
    assert rig.graph.verify_heads is ft.head_sums
    c = cache.add_sequence()
    from tests.cuda.steps.test_graph import prefill

    prefill(cache, store, c, 33, rig.rng)  # unrecorded: a graph step would record it first
    result = cache.step(np.array(rig.seq_ids + [c], np.int32))
    before = (ft.sums.copy_to_host(), ft.head_sums.copy_to_host(), ft.recorded.copy(), ft._missing.copy(),
              ft._round_start.copy())
    with pytest.raises(HexcoreInvalidArgumentError, match="fork_src"):
        ft.graph_step(rig.graph, result, fork_src=np.array([99], np.int32), fork_dst=np.array([0], np.int32))
    with pytest.raises(HexcoreInvalidArgumentError, match="batch 3 exceeds the largest bucket 2"):
        ft.graph_load(rig.graph, result)  # (graph_step would run it eagerly)
    after = (ft.sums.copy_to_host(), ft.head_sums.copy_to_host(), ft.recorded, ft._missing, ft._round_start)
    assert all(np.array_equal(x, y) for x, y in zip(before, after))
    for value in (False, 0.0, None, "0", True):
        with pytest.raises(HexcoreInvalidArgumentError, match="verify_layers"):
            DecodeGraph(store, 1, cache.max_blocks_per_seq, backend="eager", verify_layers=value)
    with pytest.raises(HexcoreInvalidArgumentError, match="checks no layers in turn"):
        plain_ft.decode_graph(1, backend="eager").step(result.block_tables, result.seq_lens, result.tail_slots, phase=0)
    for value in (2, -1, True, 0.5):
        with pytest.raises(HexcoreInvalidArgumentError, match="phase"):
            rig.graph.step(result.block_tables, result.seq_lens, result.tail_slots, phase=value)


def test_a_layered_step_refused_for_its_bucket_records_nothing():
    """A step whose seals outnumber its batch bucket's rows was refused by the graph only
    after the fault cache had launched the records of the step's unrecorded blocks (their
    digests and head digests written); the graph's input check now refuses it first."""
    from hexcore.host._step import StepResult

    cache, store = PagedKVCache(CFG, 12, 4), DeviceKVStore(CFG, 12, 4)
    ft = FaultTolerantKVCache(cache, store, decode_layers=1)
    a, b = cache.add_sequence(), cache.add_sequence()
    cache.step(np.array([a, b], np.int32), np.array([20, 17], np.int32)).raise_for_status()  # unrecorded
    result = cache.step(np.array([a, b], np.int32))
    seals = np.array([[0, 1, 3], [0, 0, 0], [7, 8, 9]], np.int32)  # (slot, logical, block) rows: 3 seals
    forged = StepResult(result.statuses, seals, result.block_tables, result.seq_lens, result.tail_slots,
                        result.seq_ids, 0, 3, 0)
    graph = ft.decode_graph(1, batch_buckets=(2,), backend="eager")
    before = ft.sums.copy_to_host(), ft.head_sums.copy_to_host()
    for call in (ft.graph_step, ft.graph_load):
        with pytest.raises(HexcoreInvalidArgumentError, match="seal_slots: 3 entries exceed the batch bucket of 2"):
            call(graph, forged)
    assert np.array_equal(ft.sums.copy_to_host(), before[0]) and np.array_equal(ft.head_sums.copy_to_host(), before[1])
    assert not ft.recorded.any() and graph.phase == 0


def test_layers_in_turn_name_every_bad_block_when_the_found_list_overflows(seed, monkeypatch):
    """One bad block read by every item of four forks fills the device's found list (cut to
    2 rows here); check_graph then checks every recorded block and names the second bad
    block too."""
    from hexcore.cuda.steps import verify

    monkeypatch.setattr(verify, "FOUND", 2)
    rig = GraphRig(seed, True, lens=(40,), cfg=CFG, decode_layers=2, buckets=(4,), max_seqs=6)
    a = rig.seq_ids[0]
    rig.seq_ids += [rig.cache.fork_sequence(a) for _ in range(3)]
    first, second = (int(x) for x in rig.cache.block_table(a)[:2])
    rig.ft.flip_bit("v_codes", 0, first, 7, 2)
    rig.ft.flip_bit("k_codes", 1, second, 9, 0)
    rig.step()
    assert rig.graph._verify.found.shape[0] == 2
    with pytest.raises(HexcoreCorruptionError) as caught:
        rig.ft.check_graph(rig.graph)
    assert sorted(caught.value.report.block_ids) == [first, second]
    assert rig.ft.last_report.layers == {first: [0], second: [1]}
    assert sorted(caught.value.report.seq_ids) == sorted(rig.seq_ids)
    rig.ft.check_invariants()


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["torch", "driver"])
@pytest.mark.parametrize("dtype", ["fp16", "int4", "int2"])
def test_layers_in_turn_in_captured_graphs_gpu(dtype, backend, seed):
    """Captured per phase and replayed: outputs and store bytes equal a plain graph's, no
    false alarm over two rounds with seals; then a flip in layer 2 is found within a round,
    named with its layer, and only at the step of that layer's phase."""
    if backend == "torch":
        pytest.importorskip("torch")
    cfg = KVCacheConfig(num_layers=4, num_kv_heads=8, head_dim=128, block_size=16, kv_dtype=dtype)
    kwargs = dict(lens=(95, 40, 300), cfg=cfg, num_q_heads=32, buckets=(4,), backend=backend, num_blocks=64,
                  max_seqs=8, max_verify_blocks=64)
    runs = []
    for layers in (0, 2):
        rig = GraphRig(seed, bool(layers), decode_layers=layers, **kwargs)
        outs = [rig.step()[0] for _ in range(8)]  # a seals at step 1; phases 0, 1 captured, then replayed
        if layers:
            assert len(rig.graph.captured) == 2, rig.graph.captured
            rig.ft.check_graph(rig.graph)
        runs.append((outs, rig.store.pool.copy_to_host(), rig))
    for x, y in zip(runs[0][0], runs[1][0]):
        assert np.array_equal(x.view(np.uint16), y.view(np.uint16))
    assert np.array_equal(runs[0][1], runs[1][1])
    rig = runs[1][2]
    bad = int(rig.cache.block_table(rig.seq_ids[2])[4])
    rig.ft.flip_bit("v_codes", 2, bad, 1000, 1)
    assert rig.graph.phase == 0
    rig.step()  # layers 0, 1
    assert rig.ft.try_check_graph(rig.graph) is Status.OK
    rig.step()  # layers 2, 3
    with pytest.raises(HexcoreCorruptionError, match=rf"blocks {bad} \(layers \[2\]\)"):
        rig.ft.check_graph(rig.graph)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["torch", "driver"])
@pytest.mark.parametrize("dtype", ["fp16", "int4"])
def test_graph_verification_in_captured_graphs_gpu(dtype, backend, seed):
    """Captured and replayed steps: outputs and store bytes identical with verification on
    and off, record equal to record_seals, no false alarm; then a flipped bit is found by a
    replayed graph."""
    if backend == "torch":
        pytest.importorskip("torch")
    cfg = KVCacheConfig(num_layers=4, num_kv_heads=8, head_dim=128, block_size=16, kv_dtype=dtype)
    kwargs = dict(lens=(95, 40, 300), cfg=cfg, num_q_heads=32, buckets=(4,), backend=backend, num_blocks=64,
                  max_seqs=8, max_verify_blocks=64, policy="sampled", sample_every=3)
    runs = []
    for verify in (False, True):
        rig = GraphRig(seed, verify, **kwargs)
        outs = [rig.step()[0] for _ in range(6)]  # a seals at step 1; replays after the first step
        if verify:
            assert rig.graph.captured, "no graph captured"
            rig.ft.check_graph(rig.graph)
        runs.append((outs, rig.store.pool.copy_to_host(), rig.ft.sums.copy_to_host(), rig.ft.recorded.copy(), rig))
    for a, b in zip(runs[0][0], runs[1][0]):
        assert np.array_equal(a.view(np.uint16), b.view(np.uint16))
    assert np.array_equal(runs[0][1], runs[1][1]) and np.array_equal(runs[0][3], runs[1][3])
    assert np.array_equal(runs[0][2][runs[0][3]], runs[1][2][runs[1][3]])
    rig = runs[1][4]
    table = rig.cache.block_table(rig.seq_ids[2])
    for bad in table[:3].tolist():  # each is sampled in one of the next three calls
        rig.ft.flip_bit("v_codes", 3, bad, 1000, 1)
    found = set()
    for _ in range(3):
        rig.step()
        if rig.ft.try_check_graph(rig.graph) is Status.CORRUPTED:
            found |= set(rig.ft.last_report.block_ids)
    assert found == set(table[:3].tolist())
