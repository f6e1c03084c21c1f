"""The Engine facade: prefill, fork, steps (whole or per layer), finish, all-or-nothing errors."""

import math
import warnings

import numpy as np
import pytest
from numba import cuda

from hexcore import HexcoreInvalidArgumentError, HexcoreInvalidSequenceError, HexcoreOOMError, KVCacheConfig
from hexcore.engine import Engine
from tests import reference as ref
from tests.cuda.attention.test_prefill import extend_reference


def make_engine(dtype="int4", layers=2, num_blocks=12, max_seqs=4, block_size=16, heads=1, q_heads=2, head_dim=64,
                **kwargs):
    cfg = KVCacheConfig(num_layers=layers, num_kv_heads=heads, head_dim=head_dim, block_size=block_size,
                        kv_dtype=dtype, group_size=32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the simulator's eager graphs
        engine = Engine(cfg, num_blocks, max_seqs, q_heads, batch_buckets=(1, 2, 4), **kwargs)
    engine.store.poison()
    return engine


class Mirror:
    """The exact K/V an engine was given, per sequence: [L, n, H, D] float16."""

    def __init__(self):
        self.k, self.v = {}, {}

    def add(self, seq, k, v):
        self.k[seq] = np.concatenate([self.k[seq], k], axis=1) if seq in self.k else k
        self.v[seq] = np.concatenate([self.v[seq], v], axis=1) if seq in self.v else v

    def cached(self, engine, seq, layer):
        """``seq``'s K, V of ``layer`` as the cache holds them: float64 [H, n, D], sealed
        blocks quantized and dequantized, the tail exact."""
        cfg = engine.config
        k = self.k[seq][layer].transpose(1, 0, 2)  # [H, n, D]
        v = self.v[seq][layer].transpose(1, 0, 2)
        n_sealed = (k.shape[1] // cfg.block_size) * cfg.block_size
        if cfg.kv_dtype.is_quantized and n_sealed:
            ks, vs = [], []
            for start in range(0, n_sealed, cfg.block_size):
                blk_k, blk_v = k[:, start:start + cfg.block_size], v[:, start:start + cfg.block_size]
                kc, km, vc, vm = ref.quantize_block(blk_k, blk_v, cfg.kv_dtype.bits, cfg.group_size)
                ks.append(ref.dequantize_keys(kc, km, cfg.kv_dtype.bits))
                vs.append(ref.dequantize_values(vc, vm, cfg.kv_dtype.bits, cfg.group_size))
            k = np.concatenate(ks + [k[:, n_sealed:].astype(np.float64)], axis=1)
            v = np.concatenate(vs + [v[:, n_sealed:].astype(np.float64)], axis=1)
        return np.asarray(k, np.float64), np.asarray(v, np.float64)

    def expect(self, engine, seqs, q, layer):
        """Attention over the cache as it holds it: sealed blocks dequantized, tails exact."""
        keys, values = zip(*(self.cached(engine, seq, layer) for seq in seqs))
        return ref.decode_attention(q, list(keys), list(values), 1 / math.sqrt(engine.config.head_dim))


def random_kv(rng, engine, n):
    cfg = engine.config
    shape = (cfg.num_layers, n, cfg.num_kv_heads, cfg.head_dim)
    return rng.standard_normal(shape).astype(np.float16), rng.standard_normal(shape).astype(np.float16)


def poison_output(step):
    """NaN in every entry of the step's output buffer, so an entry the step misses shows."""
    out = step.buffers.out
    if hasattr(out, "fill_"):  # a torch view
        out.fill_(float("nan"))
    else:
        for layer in range(out.shape[0]):
            out[layer].copy_to_device(np.full(out.shape[1:], np.nan, np.float16))


def run_steps(engine, mirror, seqs, rng, steps, per_layer=False):
    """Decode steps for ``seqs``; asserts each step's output equals the reference; the
    outputs, float16 [L, B, num_q_heads, D] per step."""
    cfg = engine.config
    outputs = []
    for _ in range(steps):
        step = engine.step(seqs)
        q = rng.standard_normal((cfg.num_layers, len(seqs), engine.num_q_heads, cfg.head_dim)).astype(np.float16)
        k, v = random_kv(rng, engine, len(seqs))  # [L, B, H, D]: one new token per sequence
        step.write(q, k, v)
        poison_output(step)
        if per_layer:
            for layer in range(cfg.num_layers):
                step.attend(layer)
        else:
            step.run()
        got = step.output()
        for j, seq in enumerate(seqs):
            mirror.add(seq, k[:, j:j + 1], v[:, j:j + 1])
        assert not np.isnan(got).any()
        for layer in range(cfg.num_layers):
            expect = mirror.expect(engine, seqs, q[layer], layer)
            assert ref.relative_l2(got[layer], expect) <= 2e-3
        outputs.append(got)
    return outputs


@pytest.mark.parametrize("dtype,per_layer", [("fp16", False), ("int4", True)], ids=["fp16-whole", "int4-per-layer"])
def test_prefill_fork_steps_and_finish(dtype, per_layer, rng):
    engine, mirror = make_engine(dtype), Mirror()
    a = engine.add()
    k, v = random_kv(rng, engine, 37)  # two sealed blocks and 5 tail tokens, in three appends
    engine.prefill(a, k, v)
    mirror.add(a, k, v)
    assert engine.seq_len(a) == 37 and len(engine.cache.block_table(a)) == 2
    b = engine.fork(a)  # its tail copy rides in the next step
    mirror.add(b, mirror.k[a], mirror.v[a])
    run_steps(engine, mirror, [a, b], rng, 2, per_layer)
    engine.finish(a)
    run_steps(engine, mirror, [b], rng, 1, per_layer)
    engine.cache.check_invariants()


def test_prefill_onto_a_partial_tail_and_after_a_fork(rng):
    engine, mirror = make_engine("int2"), Mirror()
    a = engine.add()
    for n in (5, 27):  # 5 into the tail, then 11 to fill it (a seal), then 16 more: a second seal
        k, v = random_kv(rng, engine, n)
        engine.prefill(a, k, v)
        mirror.add(a, k, v)
    b = engine.fork(a)
    mirror.add(b, mirror.k[a], mirror.v[a])
    k, v = random_kv(rng, engine, 3)
    engine.prefill(b, k, v)  # the fork's tail is copied first
    mirror.add(b, k, v)
    run_steps(engine, mirror, [a, b], rng, 1)


def test_a_prefill_copies_its_ids_to_the_device_once(rng, monkeypatch):
    # a prefill that completes the tail (append, seal), seals whole blocks from its rows and
    # leaves a rest (append): every id array of its four launches in one copy (before: seven)
    engine, mirror = make_engine("int4"), Mirror()
    engine.prefill(engine.add(), *random_kv(rng, engine, 16))  # a seal first (its one-time constants made)
    a = engine.add()
    k, v = random_kv(rng, engine, 5)
    engine.prefill(a, k, v)
    mirror.add(a, k, v)
    ids = []
    to_device = cuda.to_device
    monkeypatch.setattr(cuda, "to_device", lambda x, *args, **kw: (
        ids.append(x) if np.asarray(x).dtype.kind in "iu" else None) or to_device(x, *args, **kw))
    k, v = random_kv(rng, engine, 11 + 2 * 16 + 4)
    engine.prefill(a, k, v)
    mirror.add(a, k, v)
    assert len(ids) == 1 and engine.seq_len(a) == 52
    monkeypatch.undo()
    run_steps(engine, mirror, [a], rng, 1)  # what it stored is what the reference holds


@pytest.mark.parametrize("dtype", ["fp16", "int4"])
def test_prefill_in_pieces_stores_what_token_by_token_stores(dtype, rng):
    # pieces that start mid-tail, seal whole blocks from the rows and leave a remainder
    # (at most four launches each) against one token at a time (append, and a seal from
    # the tail when it fills): the same bytes in every sealed block and tail
    engines = [make_engine(dtype, num_blocks=16), make_engine(dtype, num_blocks=16)]
    k, v = random_kv(rng, engines[0], 5 + 40 + 3 + 70)
    seqs = [engine.add() for engine in engines]
    start = 0
    for n in (5, 40, 3, 70):
        engines[0].prefill(seqs[0], k[:, start:start + n], v[:, start:start + n])
        start += n
    for t in range(start):
        engines[1].prefill(seqs[1], k[:, t:t + 1], v[:, t:t + 1])
    tables = [engine.cache.block_table(seq) for engine, seq in zip(engines, seqs)]
    np.testing.assert_array_equal(*tables)
    got, want = ({name: a.copy_to_host() for name, a in engine.store.arrays.items()} for engine in engines)
    live = start % engines[0].config.block_size  # a tail's rows past its length are stale by design
    for name in got:
        a, b = (x[:, seqs[0], :, :live] if name.endswith("tails") else x for x in (got[name], want[name]))
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8), err_msg=name)


def test_a_step_is_all_or_nothing():
    engine = make_engine(num_blocks=2)
    a, b = engine.add(), engine.add()
    k, v = np.zeros((2, 31, 1, 64), np.float16), np.zeros((2, 31, 1, 64), np.float16)
    engine.prefill(a, k, v)  # one sealed block, 15 tail tokens: the next token seals
    engine.prefill(b, k, v)  # the last free block
    before = engine.cache.seq_len(a), engine.cache.seq_len(b), engine.cache.num_free_blocks
    with pytest.raises(HexcoreOOMError, match="short of blocks"):
        engine.step([a, b])
    with pytest.raises(HexcoreInvalidSequenceError, match=r"seq_ids\[1\] = 3"):
        engine.step([a, 3])
    with pytest.raises(HexcoreInvalidArgumentError, match=r"seq_ids\[1\] = 0"):
        engine.step([a, a])
    assert (engine.cache.seq_len(a), engine.cache.seq_len(b), engine.cache.num_free_blocks) == before
    engine.cache.check_invariants()


def test_bad_prefill_changes_nothing():
    engine = make_engine()
    a = engine.add()
    for k, v, text in ((np.zeros((2, 4, 1, 64), np.float32), np.zeros((2, 4, 1, 64), np.float32), "dtype"),
                       (np.zeros((2, 4, 1, 32), np.float16), np.zeros((2, 4, 1, 32), np.float16), "shape"),
                       (np.zeros((2, 4, 1, 64), np.float16), np.zeros((2, 5, 1, 64), np.float16), "like k"),
                       (np.zeros((2, 500, 1, 64), np.float16), np.zeros((2, 500, 1, 64), np.float16), "max_seq_len")):
        with pytest.raises((HexcoreInvalidArgumentError, HexcoreInvalidSequenceError), match=text):
            engine.prefill(a, k, v)
    assert engine.seq_len(a) == 0 and engine.cache.num_free_blocks == 12


def test_a_refused_prefill_leaves_tables_store_and_pending_forks_alone(rng):
    """A bad stream raised at the first launch, after the sequence had grown (its length
    and tables changed, nothing written); a pending fork's tail copy ran before tokens or
    the pool were checked. Neither may change anything, and the next prefill still works."""
    engine = make_engine()
    a = engine.add()
    k, v = random_kv(rng, engine, 20)
    engine.prefill(a, k, v)
    child = engine.fork(a)
    state = (engine.seq_len(a), engine.cache.num_free_blocks, engine.store.pool.copy_to_host(), list(engine._forks))
    few, many = random_kv(rng, engine, 3), random_kv(rng, engine, 500)
    for args, kwargs, text in ((few, {"stream": "x"}, "stream"), (few, {"stream": 1.5}, "stream"),
                               (few, {"tokens": np.zeros(2, np.int32)}, "tokens"),
                               (few, {"tokens": "abc"}, "tokens"), (many, {}, "max_seq_len")):
        with pytest.raises((HexcoreInvalidArgumentError, HexcoreInvalidSequenceError), match=text):
            engine.prefill(a, *args, **kwargs)
        assert engine.seq_len(a) == state[0] and engine.cache.num_free_blocks == state[1]
        assert np.array_equal(engine.store.pool.copy_to_host(), state[2]) and engine._forks == state[3]
    engine.cache.check_invariants()
    engine.prefill(a, *few)
    assert engine.seq_len(a) == 23 and engine._forks == [] and engine.seq_len(child) == 20
    with pytest.raises(HexcoreInvalidArgumentError, match="allow_empty: expected a bool, got ndarray"):
        engine.live_seq_ids([a], np.zeros((2, 2)))  # was ValueError: truth value of an array is ambiguous


def test_the_speculative_hook_changes_no_table_and_no_output(seed):
    """The same prefill, fork and steps on an engine with the hook off and one with it on:
    the same block tables and bit-identical outputs (both checked against the reference);
    with the hook on every step's seal is served by a block reserved before the step."""
    runs = {}
    for speculative in (False, True):
        engine, mirror, rng = make_engine("fp16", layers=1, speculative=speculative), Mirror(), np.random.default_rng(seed)
        seqs = [engine.add(), engine.add()]
        for seq, n in zip(seqs, (31, 15)):  # both seal in the first step
            k, v = random_kv(rng, engine, n)
            engine.prefill(seq, k, v)
            mirror.add(seq, k, v)
        seqs.append(engine.fork(seqs[0]))  # seals with its parent, into a block of its own
        mirror.add(seqs[2], mirror.k[seqs[0]], mirror.v[seqs[0]])
        outputs = run_steps(engine, mirror, seqs, rng, 2)  # the second attends over the blocks sealed
        runs[speculative] = engine, [engine.cache.block_table(s).tolist() for s in seqs], outputs
    (off, tables_off, out_off), (on, tables_on, out_on) = runs[False], runs[True]
    assert off.speculative is None and tables_on == tables_off and [len(t) for t in tables_on] == [2, 1, 2]
    assert all(np.array_equal(a, b) for a, b in zip(out_on, out_off))
    stats = on.speculative.stats()
    assert (stats["hits"], stats["misses"], stats["mispredicted"], stats["pending"]) == (3, 1, 0, 0)  # 1: prefill's
    on.speculative.check_invariants()
    assert on.cache.num_free_blocks == off.cache.num_free_blocks


def test_a_mispredicted_reservation_goes_back_to_the_pool():
    """A producer predicts two sequences seal next: one is finished before its step (its
    block is released, mispredicted), the other seals into its reserved block."""
    engine = make_engine("fp16", layers=1, num_blocks=3, speculative=True)
    a, b = engine.add(), engine.add()
    zeros = np.zeros((1, 15, 1, 64), np.float16)  # the next token of each fills its tail
    for seq in (a, b):
        engine.prefill(seq, zeros, zeros)
    assert engine.speculative.predict([a, b]) == 2
    engine.finish(b)  # applies the predictions (two blocks parked), then frees b's
    assert engine.speculative.mispredicted() == 1 and engine.cache.num_reserved_blocks == 1
    assert engine.cache.num_free_blocks == 2
    engine.step([a]).run()
    stats = engine.speculative.stats()
    assert (stats["hits"], stats["mispredicted"], stats["pending"], stats["duplicate"]) == (1, 1, 0, 1)
    assert engine.cache.num_free_blocks == 2 and engine.seq_len(a) == 16
    engine.speculative.check_invariants()


def test_a_short_pool_releases_reservations_before_refusing_a_step():
    """A block parked for a predicted sequence goes back when a step needs it; a step
    that still does not fit raises and changes nothing."""
    engine = make_engine("fp16", layers=1, num_blocks=1, speculative=True)
    a, b = engine.add(), engine.add()
    zeros = np.zeros((1, 15, 1, 64), np.float16)
    for seq in (a, b):
        engine.prefill(seq, zeros, zeros)
    engine.speculative.predict([b])
    engine.step([a]).run()  # b's reservation took the only block: released, then a seals into it
    assert engine.speculative.mispredicted() == 1 and engine.speculative.confirmed_hits() == 1
    with pytest.raises(HexcoreOOMError, match="short of blocks"):
        engine.step([b])
    assert engine.seq_len(b) == 15 and engine.seq_len(a) == 16 and engine.cache.num_free_blocks == 0
    engine.speculative.check_invariants()


@pytest.mark.parametrize("value,text", [("yes", "speculative: expected True, False"), (1, "got 1"),
                                        (None, "got None"), ({"bogus": 1}, r"unknown option\(s\) \['bogus'\]"),
                                        ({"reserve_floor": -1}, "reserve_floor")])
def test_bad_speculative_values_raise_typed_errors(value, text):
    with pytest.raises(HexcoreInvalidArgumentError, match=text):
        make_engine(layers=1, speculative=value)


@pytest.mark.parametrize("check", [{"policy": "always"}, {"decode_layers": 1}], ids=["sample", "layers"])
@pytest.mark.parametrize("per_layer", [False, True], ids=["whole", "per-layer"])
def test_fault_tolerance_changes_no_output_and_finds_a_flipped_bit(per_layer, check, seed):
    """The same prefill and steps with fault tolerance off and on (every block verified in
    each step, or one whole layer of two a step inside the decode): bit-identical outputs,
    both checked against the reference, no false alarm; then one flipped bit of a sealed
    block's layer 1 is reported by ``check`` after the next step (layer 1's turn), naming
    the block and the sequence's token range, and the block is quarantined."""
    from hexcore import HexcoreConfigError, HexcoreCorruptionError

    runs = {}
    for faults in (False, {**check, "max_verify_blocks": 8}):
        engine, mirror, rng = make_engine("int4", fault_tolerance=faults), Mirror(), np.random.default_rng(seed)
        seqs = [engine.add(), engine.add()]
        for seq, n in zip(seqs, (40, 17)):
            k, v = random_kv(rng, engine, n)
            engine.prefill(seq, k, v)
            mirror.add(seq, k, v)
        runs[bool(faults)] = engine, seqs, run_steps(engine, mirror, seqs, rng, 1, per_layer)
    (off, _, out_off), (on, seqs, out_on) = runs[False], runs[True]
    assert all(np.array_equal(a, b) for a, b in zip(out_on, out_off))
    assert off.faults is None
    with pytest.raises(HexcoreConfigError, match="without fault_tolerance"):
        off.check()
    on.check()  # a clean step: no false alarm
    assert on.faults.stats()["blocks_verified"] > 0
    bad = int(on.cache.block_table(seqs[0])[1])
    on.faults.flip_bit("k_codes", 1, bad, 3, 2)
    step = on.step(seqs)
    step.write(*(np.zeros(view.shape, np.float16) for view in step.buffers[:3]))
    if per_layer:
        for layer in range(on.config.num_layers):
            step.attend(layer)
    else:
        step.run()
    with pytest.raises(HexcoreCorruptionError, match=rf"blocks {bad} \(layers \[1\]\)") as info:
        on.check()
    assert info.value.report.token_ranges == {seqs[0]: [(16, 32)]}
    assert on.cache.is_quarantined(bad)


@pytest.mark.parametrize("value,text", [("yes", "fault_tolerance: expected True, False"), (1, "got 1"),
                                        ({"bogus": 1}, r"unknown option\(s\) \['bogus'\]")])
def test_bad_fault_tolerance_values_raise_typed_errors(value, text):
    with pytest.raises(HexcoreInvalidArgumentError, match=text):
        make_engine(layers=1, fault_tolerance=value)


def test_a_step_runs_once():
    engine = make_engine()
    a = engine.add()
    engine.prefill(a, np.zeros((2, 3, 1, 64), np.float16), np.zeros((2, 3, 1, 64), np.float16))
    step = engine.step([a])
    step.run()
    with pytest.raises(HexcoreInvalidArgumentError, match="already"):
        step.attend(0)
    with pytest.raises(HexcoreInvalidArgumentError, match="float16"):
        engine.step([a]).write(np.zeros(3), np.zeros(3), np.zeros(3))


@pytest.mark.parametrize("faults", [False, {"policy": "always", "max_verify_blocks": 4}], ids=["plain", "faults"])
def test_a_refused_run_or_attend_leaves_the_step_to_run(faults):
    """run() with a bad stream marked the step as run (later: "already loaded by
    attend()"); attend() with a bad layer loaded the step's indices (and, with faults,
    counted a verification) before refusing the layer."""
    engine = make_engine(layers=2, fault_tolerance=faults)
    a = engine.add()
    engine.prefill(a, np.zeros((2, 20, 1, 64), np.float16), np.zeros((2, 20, 1, 64), np.float16))
    step = engine.step([a])
    calls = None if engine.faults is None else engine.faults._calls
    for stream in ("x", 1.5, [0]):
        with pytest.raises(HexcoreInvalidArgumentError, match="stream"):
            step.run(stream)
    for layer in (2, -1, True, 0.0, None):
        with pytest.raises(HexcoreInvalidArgumentError, match="layer"):
            step.attend(layer)
    with pytest.raises(HexcoreInvalidArgumentError, match="stream"):
        step.attend(0, "x")
    assert step._loaded is None and (engine.faults is None or engine.faults._calls == calls)
    step.run()
    with pytest.raises(HexcoreInvalidArgumentError, match="run: this step already ran"):
        step.run()
    second = engine.step([a])
    second.attend(0)
    with pytest.raises(HexcoreInvalidArgumentError, match="run: this step already was started by attend"):
        second.run()
    second.attend(1)
    if faults:
        engine.check()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "int4", "int2"])
def test_engine_on_gpu(dtype, rng):
    """llama-3-8b attention heads, 3 layers: prefill, fork, graph-replayed and per-layer steps."""
    engine, mirror = make_engine(dtype, layers=3, num_blocks=64, max_seqs=8, block_size=32, heads=8, q_heads=32,
                                 head_dim=128), Mirror()
    seqs = []
    for n in (300, 95, 31):
        seq = engine.add()
        k, v = random_kv(rng, engine, n)
        engine.prefill(seq, k, v)
        mirror.add(seq, k, v)
        seqs.append(seq)
    child = engine.fork(seqs[0])
    mirror.add(child, mirror.k[seqs[0]], mirror.v[seqs[0]])
    run_steps(engine, mirror, seqs + [child], rng, 3)
    run_steps(engine, mirror, seqs + [child], rng, 1, per_layer=True)
    assert engine.graph.captured  # a step was replayed from a graph


def test_a_fork_of_a_pending_fork_copies_from_the_first_parent(rng):
    """fork(fork(a)) before a step: both copies read a's tail (one launch, no tail both read
    and written); a child in the slot of a finished pending parent is copied after it."""
    engine, mirror = make_engine("fp16", num_blocks=16, max_seqs=6), Mirror()
    a, x = engine.add(), engine.add()
    for seq in (a, x):
        k, v = random_kv(rng, engine, 21)
        engine.prefill(seq, k, v)
        mirror.add(seq, k, v)
    b = engine.fork(a)
    c = engine.fork(b)
    for child in (b, c):
        mirror.add(child, mirror.k[a], mirror.v[a])
    run_steps(engine, mirror, [a, b, c], rng, 1)
    d = engine.fork(x)  # pending copy x -> d
    engine.finish(x)    # x's slot is free, its tail still to be copied to d
    e = engine.fork(a)  # takes x's slot: x's tail must reach d before a's overwrites it
    assert e == x, "the test needs the child in the finished parent's slot"
    mirror.add(d, mirror.k[x], mirror.v[x])
    mirror.k[e], mirror.v[e] = mirror.k[a], mirror.v[a]
    run_steps(engine, mirror, [a, d, e], rng, 1)
    engine.cache.check_invariants()


def prefill_layers(engine, mirror, seq, k, v, rng, tokens=None):
    """``prefill_attention`` for every layer (checked against the float64 reference over the
    cache as it holds ``seq`` plus the new tokens), then ``prefill``."""
    cfg = engine.config
    n = k.shape[1]
    q = rng.standard_normal((cfg.num_layers, n, engine.num_q_heads, cfg.head_dim)).astype(np.float16)
    for layer in range(cfg.num_layers):
        out = cuda.to_device(np.full(q.shape[1:], np.nan, np.float16))
        engine.prefill_attention(seq, layer, q[layer], k[layer], v[layer], out=out)
        if seq in mirror.k:
            keys, values = mirror.cached(engine, seq, layer)
        else:
            keys = values = np.zeros((cfg.num_kv_heads, 0, cfg.head_dim))
        expect = extend_reference(q[layer], keys, values, k[layer], v[layer], 1 / math.sqrt(cfg.head_dim))
        got = out.copy_to_host()
        assert not np.isnan(got).any()
        assert ref.relative_l2(got, expect) <= 2e-3
    engine.prefill(seq, k, v, tokens=tokens)
    mirror.add(seq, k, v)


def test_a_cached_prefix_is_shared_and_only_the_rest_prefilled(rng):
    engine, mirror = make_engine("int4", num_blocks=12, max_seqs=4, prefix_cache=True), Mirror()
    tokens_a = rng.integers(0, 50000, 40).astype(np.int32)
    first = engine.admit(tokens_a)
    assert first.cached_tokens == 0
    k_a, v_a = random_kv(rng, engine, 40)
    prefill_layers(engine, mirror, first.seq_id, k_a, v_a, rng, tokens_a)
    # a second request: a's first two blocks (32 tokens), then its own 7 tokens
    tokens_b = np.concatenate([tokens_a[:32], rng.integers(0, 50000, 7).astype(np.int32)])
    second = engine.admit(tokens_b)
    assert second.cached_tokens == 32 and engine.seq_len(second.seq_id) == 32
    assert list(engine.cache.block_table(second.seq_id)) == list(engine.cache.block_table(first.seq_id))
    mirror.add(second.seq_id, k_a[:, :32], v_a[:, :32])  # the model's K/V of the shared tokens
    k_b, v_b = random_kv(rng, engine, 7)
    prefill_layers(engine, mirror, second.seq_id, k_b, v_b, rng, tokens_b[32:])
    run_steps(engine, mirror, [first.seq_id, second.seq_id], rng, 1)
    engine.finish(first.seq_id)
    engine.finish(second.seq_id)
    assert engine.cache.num_cached_blocks == 2  # a's two blocks stay cached; b sealed none
    third = engine.admit(tokens_a)  # a again: its blocks from the cache (the last token is computed)
    assert third.cached_tokens == 32 and engine.cache.num_cached_blocks == 0
    engine.cache.check_invariants()


def test_prefill_attention_of_a_batch_is_its_rows_one_by_one(rng):
    engine = make_engine("int4", layers=1)
    seqs, news = [engine.add(), engine.add(), engine.add()], [3, 0, 5]
    for seq, n in zip(seqs, (21, 16, 0)):  # a partial tail, a whole block, nothing yet
        if n:
            engine.prefill(seq, *random_kv(rng, engine, n))
    cfg, n_max = engine.config, max(news)
    q = rng.standard_normal((3, n_max, 2, cfg.head_dim)).astype(np.float16)
    k, v = (rng.standard_normal((3, n_max, cfg.num_kv_heads, cfg.head_dim)).astype(np.float16) for _ in range(2))
    got = engine.prefill_attention_batch(seqs, 0, q, k, v, np.array(news, np.int32), backend="numba").copy_to_host()
    for r, (seq, n) in enumerate(zip(seqs, news)):
        if n:
            one = engine.prefill_attention(seq, 0, q[r, :n], k[r, :n], v[r, :n], backend="numba").copy_to_host()
            np.testing.assert_array_equal(got[r, :n], one)
        assert (got[r, n:] == 0).all()
    rows = engine.batch_rows(seqs, np.array(news, np.int32), n_max)  # made once for every layer of a forward
    again = engine.prefill_attention_batch(seqs, 0, q, k, v, None, backend="numba", rows=rows).copy_to_host()
    np.testing.assert_array_equal(again, got)
    with pytest.raises(HexcoreInvalidArgumentError, match="rows: made for other sequences"):
        engine.prefill_attention_batch(seqs[::-1], 0, q, k, v, None, rows=rows)
    for other in (np.array(seqs, np.int32), tuple(np.int64(s) for s in seqs)):  # the same ids in another form
        again = engine.prefill_attention_batch(other, 0, q, k, v, None, backend="numba", rows=rows).copy_to_host()
        np.testing.assert_array_equal(again, got)
    for bad, match in (([True] + seqs[1:], r"seq_ids\[0\]: expected an int, got True"),
                       (seqs[:2] + [2**40], r"seq_ids\[2\]: expected an int in \[-2147483648, 2147483647\]")):
        with pytest.raises(HexcoreInvalidArgumentError, match=match):  # named, as without rows
            engine.prefill_attention_batch(bad, 0, q, k, v, None, rows=rows)
    with pytest.raises(HexcoreInvalidArgumentError, match=r"seq_ids\[1\]: sequence \d+ is listed twice"):
        engine.prefill_attention_batch([seqs[0], seqs[0], seqs[1]], 0, q, k, v, np.array(news, np.int32))
    with pytest.raises(HexcoreInvalidSequenceError):
        engine.prefill_attention_batch([seqs[0], seqs[1], 3], 0, q, k, v, np.array(news, np.int32))


def test_chunked_prefill_attends_over_a_partial_tail(rng):
    engine, mirror = make_engine("int2", layers=1), Mirror()
    seq = engine.add()
    for n in (21, 14):  # the second chunk sees one sealed block and 5 tail tokens
        k, v = random_kv(rng, engine, n)
        prefill_layers(engine, mirror, seq, k, v, rng)
    assert engine.seq_len(seq) == 35
    run_steps(engine, mirror, [seq], rng, 1)


def test_engine_prefix_cache_errors_change_nothing(rng):
    engine = make_engine(prefix_cache=True)
    adm = engine.admit(np.arange(20, dtype=np.int32))
    k, v = random_kv(rng, engine, 20)
    with pytest.raises(HexcoreInvalidArgumentError, match="tokens"):
        engine.prefill(adm.seq_id, k, v, tokens=np.arange(19, dtype=np.int32))  # one short
    assert engine.seq_len(adm.seq_id) == 0 and engine.cache.num_free_blocks == 12
    engine.prefill(adm.seq_id, k, v, tokens=np.arange(20, dtype=np.int32))
    with pytest.raises(HexcoreInvalidArgumentError, match="tokens: expected one token id per sequence"):
        engine.step([adm.seq_id], tokens=np.array([1, 2], np.int32))
    with pytest.raises(HexcoreInvalidArgumentError, match="tokens"):
        engine.admit(np.zeros((2, 2), np.int32))
    assert engine.seq_len(adm.seq_id) == 20
    with pytest.raises(HexcoreInvalidArgumentError, match="q: expected dtype float16"):
        engine.prefill_attention(adm.seq_id, 0, np.zeros((2, 2, 64)), k[0, :2], v[0, :2])
    engine.step([adm.seq_id], tokens=np.array([7], np.int32)).run()
    assert engine.seq_len(adm.seq_id) == 21 and engine.cache.is_tracked(adm.seq_id)
    engine.cache.check_invariants()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "int4", "int2"])
def test_prefix_cached_prefill_on_gpu(dtype, rng):
    """llama-3-8b attention heads: a request sharing 256 cached tokens prefills 50 over them
    (SDPA when torch is installed, else the numba kernel), then decodes."""
    engine, mirror = make_engine(dtype, layers=2, num_blocks=64, max_seqs=8, block_size=32, heads=8, q_heads=32,
                                 head_dim=128, prefix_cache=True), Mirror()
    tokens_a = rng.integers(0, 50000, 300).astype(np.int32)
    a = engine.admit(tokens_a).seq_id
    k_a, v_a = random_kv(rng, engine, 300)
    prefill_layers(engine, mirror, a, k_a, v_a, rng, tokens_a)
    tokens_b = np.concatenate([tokens_a[:256], rng.integers(0, 50000, 50).astype(np.int32)])
    b, cached = engine.admit(tokens_b)
    assert cached == 256
    mirror.add(b, k_a[:, :256], v_a[:, :256])
    k_b, v_b = random_kv(rng, engine, 50)
    prefill_layers(engine, mirror, b, k_b, v_b, rng, tokens_b[256:])
    run_steps(engine, mirror, [a, b], rng, 2)


@pytest.mark.parametrize("seq_ids,error,match", [
    ([0, 1, 0], HexcoreInvalidArgumentError, r"seq_ids\[2\]: sequence 0 is listed twice \(also seq_ids\[0\]\)"),
    ([1, 3], HexcoreInvalidSequenceError, r"seq_ids\[1\]: 3 is not a live sequence"),
    ([1, -1], HexcoreInvalidSequenceError, r"seq_ids\[1\]: -1 is not a live sequence"),
    ([], HexcoreInvalidArgumentError, "seq_ids: expected at least one sequence"),
    (np.array(1), HexcoreInvalidArgumentError, "seq_ids: expected a 1-D sequence of ints"),
    ("01", HexcoreInvalidArgumentError, "seq_ids: expected a 1-D sequence of ints"),
    ([0, 1.5], HexcoreInvalidArgumentError, r"seq_ids\[1\]: expected an int"),
], ids=["twice", "not-live", "negative", "empty", "0-d-array", "string", "float"])
def test_live_seq_ids_names_the_bad_entry(seq_ids, error, match):
    engine = make_engine(layers=1)
    live = [engine.add(), engine.add()]
    assert live == [0, 1] and engine.live_seq_ids(np.array([1, 0], np.int32)) == [1, 0]
    with pytest.raises(error, match=match):
        engine.live_seq_ids(seq_ids)
    assert engine.live_seq_ids([], allow_empty=True) == [] and engine.cache.num_sequences == 2


# -- a format by age (Engine(format=...), hexcore/engine_tiered.py) ---------------------------------
class TieredMirror(Mirror):
    """The K/V an engine in a format by age was given; ``cached`` is tests/reference.tiered_kv."""

    def cached(self, engine, seq, layer):
        cfg = engine.config
        k = self.k[seq][layer].transpose(1, 0, 2)  # [H, n, D]
        v = self.v[seq][layer].transpose(1, 0, 2)
        return ref.tiered_kv(k, v, engine.cache.format, cfg.block_size, cfg.group_size)


def make_tiered_engine(fmt, cfg=None, q_heads=2, **kwargs):
    from hexcore.host.tiered import pool_kinds
    from hexcore.quant import kv_format

    cfg = cfg or KVCacheConfig(num_layers=2, num_kv_heads=1, head_dim=64, block_size=16, group_size=32)
    pools = {kind.value: 24 for kind in pool_kinds(kv_format(fmt), cfg.block_size)}
    engine = Engine(cfg, 0, 4, q_heads, format=fmt, pool_blocks=pools, max_seq_len=768, **kwargs)
    for store in engine.stores:
        store.poison()
    return engine


def test_a_format_by_age_prefills_forks_and_steps_against_the_reference(rng):
    # sink, INT4 when sealed, INT2 from 48 tokens of age (block 16); fitted keys are tested in
    # tests/cuda (their seal is slow on the simulator)
    from hexcore.quant import AgeTier, KVFormat

    fmt = KVFormat("small2", (AgeTier(0, 4, 4), AgeTier(48, 2, 2)), sink_blocks=1)
    engine, mirror = make_tiered_engine(fmt), TieredMirror()
    a, b = engine.add(), engine.add()
    for seq, n in ((a, 94), (b, 9)):  # a: block 1 sealed INT4 and re-sealed INT2 within the prompt
        k, v = random_kv(rng, engine, n)
        engine.prefill(seq, k, v)
        mirror.add(seq, k, v)
    k, v = random_kv(rng, engine, 21)  # b: onto its partial tail, across a block
    engine.prefill(b, k, v)
    mirror.add(b, k, v)
    c = engine.fork(a)
    mirror.add(c, mirror.k[a], mirror.v[a])
    assert engine.cache.block_kinds(a).tolist() == [0, 2, 1, 1, 1]
    run_steps(engine, mirror, [a, b, c], rng, 2)  # a, c seal block 5 and re-seal block 2; b seals block 1
    assert engine.cache.block_kinds(c).tolist() == [0, 2, 2, 1, 1, 1] and engine.seq_len(b) == 32
    engine.finish(a)
    run_steps(engine, mirror, [b, c], rng, 1, per_layer=True)
    # a fork between a step and its run: the child's tail copy waits for the next step, so it
    # holds the token the run appends
    step = engine.step([b, c])
    d = engine.fork(c)
    k, v = random_kv(rng, engine, 2)
    step.write(rng.standard_normal((2, 2, 2, 64)).astype(np.float16), k, v)
    step.run()
    mirror.add(b, k[:, :1], v[:, :1])
    mirror.add(c, k[:, 1:], v[:, 1:])
    mirror.k[d], mirror.v[d] = mirror.k[c], mirror.v[c]  # (d may reuse a's finished slot)
    run_steps(engine, mirror, [d, b], rng, 1)
    engine.cache.check_invariants()


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["int4-aged", "int2-aged"])
def test_a_format_by_age_on_gpu(fmt, rng):
    cfg = KVCacheConfig(num_layers=2, num_kv_heads=8, head_dim=128, block_size=32, group_size=64)
    engine, mirror = make_tiered_engine(fmt, cfg, q_heads=32), TieredMirror()
    a, b = engine.add(), engine.add()
    for seq, n in ((a, 470), (b, 33)):  # a: INT2 blocks re-sealed within the prompt (int2-aged)
        k, v = random_kv(rng, engine, n)
        engine.prefill(seq, k, v)
        mirror.add(seq, k, v)
    c = engine.fork(a)
    mirror.add(c, mirror.k[a], mirror.v[a])
    run_steps(engine, mirror, [a, b, c], rng, 36)  # every sequence seals; a and c re-seal at 480 and 512
    run_steps(engine, mirror, [b, c], rng, 2, per_layer=True)
    engine.cache.check_invariants()


def test_a_format_by_age_refuses_what_it_does_not_do(rng):
    from hexcore import HexcoreConfigError

    for kwargs in (dict(prefix_cache=True), dict(speculative=True), dict(fault_tolerance=True),
                   dict(batch_buckets=(1, 2)), dict(backend="driver"), dict(metrics=object())):
        with pytest.raises(HexcoreConfigError, match=f"^{next(iter(kwargs))}: not with a format by age"):
            make_tiered_engine("int4-aged", **kwargs)
    cfg = KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=64, block_size=16)
    with pytest.raises(HexcoreConfigError, match="^pool_blocks: only with a format by age"):
        Engine(cfg, 8, 2, 1, pool_blocks={"fp16": 8})
    engine = make_tiered_engine("int4-aged")
    a = engine.add()
    k, v = random_kv(rng, engine, 5)
    for call in (lambda: engine.admit(np.arange(3, dtype=np.int32)), lambda: engine.truncate(a, 0),
                 lambda: engine.prefill_attention(a, 0, None, None, None), lambda: engine.check(),
                 lambda: engine.prefill(a, k, v, tokens=np.arange(5, dtype=np.int32))):
        with pytest.raises(HexcoreConfigError, match="not with a format by age|no prefix cache"):
            call()
    assert engine.seq_len(a) == 0
