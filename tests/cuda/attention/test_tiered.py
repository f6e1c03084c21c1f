"""A format by age end to end: TieredKVCache's steps run on one store per pool (append,
seal, re-seal: run_tiered_ops), then tiered_decode, against tests/reference.py (tiered_kv,
decode_attention) in float64."""

import dataclasses
import functools
import itertools

import numpy as np
import pytest
from numba import cuda

from hexcore import HexcoreInvalidArgumentError, KVCacheConfig
from hexcore.cuda import (DecodeOptions, DeviceKVStore, TieredDecodePlan, append, copy_tails, run_tiered_ops,
                          tiered_decode)
from hexcore.host import TieredKVCache
from hexcore.quant import AgeTier, KVFormat
from tests import reference as ref

BS, D, H, GROUP = 16, 64, 1, 32
CONFIG = KVCacheConfig(num_layers=1, num_kv_heads=H, head_dim=D, block_size=BS, group_size=GROUP)
# the 2-bit preset's shape at a smaller scale: sink, INT4 when sealed, INT2 (fitted keys) from 64 tokens of age
SMALL2 = KVFormat("small2", (AgeTier(0, 4, 4), AgeTier(64, 2, 2)), sink_blocks=1, fitted_keys=True)
FORMATS = {"int4-aged": "int4-aged", "small2": SMALL2}
# what merges the pools: a merge launch with the FP16 pool its own launch or inside the merge
# launch, the last pool's launch, every pool in one launch, or in one launch of the last pool's
# CTAs (DecodeOptions.tiered_fp16, tiered_merge)
MERGES = {"launch": DecodeOptions(tiered_fp16="launch", tiered_merge="launch"),
          "merge": DecodeOptions(tiered_fp16="merge", tiered_merge="launch"),
          "last": DecodeOptions(tiered_merge="last"),
          "one": DecodeOptions(tiered_merge="one"),
          "packed": DecodeOptions(tiered_merge="packed")}


def run_format(fmt, seed, lengths, fork_at=None, config=CONFIG):
    """Grow sequences token by token to ``lengths`` (one forked from sequence 0 at
    ``fork_at`` tokens, if given) through a TieredKVCache and its stores; returns (cache,
    stores, seq_ids, FP16 K/V rows per sequence [H, n, D])."""
    rng = np.random.default_rng(seed)
    H, D, BS = config.num_kv_heads, config.head_dim, config.block_size
    cache = TieredKVCache(config, fmt, {k.value: 40 for k in _kinds(fmt, BS)}, 4, max_seq_len=1024)
    stores = [DeviceKVStore(dataclasses.replace(config, kv_dtype=kind), num_blocks=pool.num_blocks, max_seqs=4)
              for kind, pool in zip(cache.kinds, cache.pools)]
    for store in stores:
        store.poison()
    seqs = [cache.add_sequence() for _ in lengths]
    rows = {s: (np.zeros((H, 0, D), np.float16), np.zeros((H, 0, D), np.float16)) for s in seqs}
    want = dict(zip(seqs, lengths))
    while True:
        growing = np.array([s for s in want if cache.seq_len(s) < want[s]], np.int32)
        if not len(growing):
            break
        if fork_at is not None and cache.seq_len(seqs[0]) == fork_at:
            child = cache.fork_sequence(seqs[0])
            pool = int(cache.tail_pools(np.array([seqs[0]], np.int32))[0])
            copy_tails(stores[pool], np.array([seqs[0]], np.int32), np.array([child], np.int32))
            rows[child], want[child], fork_at = rows[seqs[0]], want[seqs[0]] + 5, None
            continue
        k, v = (rng.standard_normal((2, len(growing), H, D)) * rng.uniform(0.2, 3, D)).astype(np.float16)
        pools = cache.tail_pools(growing)
        for p in np.unique(pools):  # each new token into the tail of the store its block is sealed in
            mine = pools == p
            positions = np.array([cache.seq_len(int(s)) % BS for s in growing[mine]], np.int32)
            every_layer = (config.num_layers, int(mine.sum()), H, D)  # the same rows in every layer
            append(stores[p], np.ascontiguousarray(np.broadcast_to(k[mine], every_layer)),
                   np.ascontiguousarray(np.broadcast_to(v[mine], every_layer)), growing[mine], positions, layer=None)
        for i, s in enumerate(growing.tolist()):
            rows[s] = tuple(np.concatenate([r, x[i][:, None]], axis=1) for r, x in zip(rows[s], (k, v)))
        run_tiered_ops(stores, cache.step(growing).ops, cache.format.fitted_keys)
    cache.check_invariants()
    return cache, stores, list(want), rows


def _kinds(fmt, block_size):
    from hexcore.host.tiered import pool_kinds as kinds
    from hexcore.quant import kv_format

    return kinds(kv_format(fmt), block_size)


def expected_block(fmt, k, v, j, BS, GROUP):
    """Block ``j`` as the format's store holds it: its FP16 rows (k, v) for an FP16 block,
    else the reference chain's sealed (kc, km, vc, vm)."""
    rows = slice(j * BS, (j + 1) * BS)
    levels = fmt.block_tiers(k.shape[1], BS)
    if levels[j] < 0:
        return k[:, rows], v[:, rows]
    bk, bv = k[:, rows], v[:, rows]
    for i, tier in enumerate(fmt.tiers[:levels[j] + 1]):
        if i:
            bk, bv = ref.unseal_rows(*sealed, fmt.tiers[i - 1], GROUP)
        sealed = ref.seal_tier_block(bk, bv, tier, GROUP, fmt.fitted_keys)
    return sealed


def check_format(fmt, seed, lengths, fork_at, config=CONFIG):
    """run_format, then every block of every sequence byte for byte against the reference
    chain, and tiered_decode against float64 attention over tiered_kv, merged each way
    (``MERGES``): the FP16 pool decoded by its own launch and inside the merge launch
    bit-identical (the same items); the last pool's launch merging, and every pool in one
    launch (or in the last pool's CTAs), sum the same partials in another order; so does the
    default's choice."""
    print(f"seed {seed}")
    cache, stores, seqs, rows = run_format(fmt, seed, lengths, fork_at, config)
    fmt, BS, D, GROUP = cache.format, config.block_size, config.head_dim, config.group_size
    held = [{name: a.copy_to_host()[0] for name, a in store.arrays.items() if "tails" not in name}
            for store in stores]  # layer 0 of each pool's blocks
    for s in seqs:  # the stores' blocks, byte for byte
        k, v = rows[s]
        kinds, places = cache.block_kinds(s), [0] * len(stores)
        for j, kind in enumerate(kinds.tolist()):
            block = int(cache.pools[kind].block_table(s)[places[kind]])
            places[kind] += 1
            names = ("k_codes", "v_codes") if len(held[kind]) == 2 else ("k_codes", "k_meta", "v_codes", "v_meta")
            for name, want in zip(names, expected_block(fmt, k, v, j, BS, GROUP)):
                got = held[kind][name][block]
                assert np.array_equal(got.view(np.uint8), np.ascontiguousarray(want).view(np.uint8)), (s, j, name)
    # the decode over every pool and the tails, against float64 attention over tiered_kv
    ids = np.array(seqs, np.int32)
    rng = np.random.default_rng(seed + 1)
    q = rng.standard_normal((len(ids), 4 * config.num_kv_heads, D)).astype(np.float16)
    tables = cache.block_tables(ids)
    lens = np.array([cache.seq_len(int(s)) for s in ids])
    args = ([t for t, _ in tables], [c for _, c in tables], (lens % BS).astype(np.int32), cache.tail_pools(ids), ids)
    outs = [tiered_decode(q, stores, *args, layer=config.num_layers - 1, options=options,
                          out=cuda.to_device(np.full(q.shape, np.nan, np.float16))).copy_to_host()
            for options in [*MERGES.values(), DecodeOptions()]]  # (and the default's choice among them)
    keys, values = zip(*(ref.tiered_kv(*rows[int(s)], fmt, BS, GROUP) for s in ids))
    want = ref.decode_attention(q, list(keys), list(values), D ** -0.5)
    assert all(ref.relative_l2(outs[i], want) < 2e-3 for i in (0, 2, 3, 4, 5))
    assert any(np.array_equal(outs[5].view(np.uint16), outs[i].view(np.uint16)) for i in range(5))  # one of them
    assert np.array_equal(outs[0].view(np.uint16), outs[1].view(np.uint16))


@pytest.mark.parametrize("name", list(FORMATS))
def test_every_block_holds_the_reference_chain_and_decode_matches(name, seed):
    check_format(FORMATS[name], seed, lengths=[100, 61, 23], fork_at=50)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["int4-aged", "int2-aged"])
def test_every_block_holds_the_reference_chain_and_decode_matches_gpu(name, seed):
    config = KVCacheConfig(num_layers=2, num_kv_heads=8, head_dim=128, block_size=32, group_size=64)
    check_format(name, seed, lengths=[450, 300, 33], fork_at=200, config=config)


@pytest.mark.gpu
@pytest.mark.parametrize("where", ["last", "one", "packed"])
def test_overlapped_pool_launches_give_the_eager_bits_layer_after_layer(where, seed):
    """``tiered_merge`` "last" as a plan runs it on sm_90: the pools' launches overlapping
    (programmatic dependent launches: each lets the next start as it starts, the last pool's
    merging CTA waits for the one before it); "one": each layer's one launch overlapping the
    last layer's (it waits for it first), "packed" too; twenty layers enqueued back to back with no
    synchronisation, each against the plain (eager) launches' bits, the workspace poisoned
    (NaN) between: a merge that read a slot before its pool wrote it, or the next layer's
    first pool overwriting slots a merge still reads, would differ. (On a GPU older than
    sm_90 the launches are plain ones.)"""
    from hexcore.cuda.attention import tiered

    config = KVCacheConfig(num_layers=2, num_kv_heads=8, head_dim=128, block_size=32, group_size=64)
    cache, stores, seqs, _ = run_format("int2-aged", seed, lengths=[900, 300, 33], config=config)
    ids = np.array(seqs, np.int32)
    tables = cache.block_tables(ids)
    lens = np.array([cache.seq_len(int(s)) for s in ids])
    args = ([t for t, _ in tables], [c for _, c in tables], (lens % 32).astype(np.int32), cache.tail_pools(ids), ids)
    q = np.random.default_rng(seed).standard_normal((20, len(ids), 32, 128)).astype(np.float16)
    want = [tiered_decode(q[i], stores, *args, layer=i % 2, options=MERGES[where]).copy_to_host() for i in range(20)]
    for part_o, part_ml, _ in tiered._workspace._arrays.values():  # every slot a merge reads: written in its run
        part_o.copy_to_device(np.full(part_o.shape, np.nan, np.float32))
        part_ml.copy_to_device(np.full(part_ml.shape, np.nan, np.float32))
    plan = TieredDecodePlan(stores, *args, options=MERGES[where])
    q_dev, outs = cuda.to_device(q), cuda.to_device(np.full(q.shape, np.nan, np.float16))
    for i in range(20):
        plan.run(i % 2, q_dev[i], outs[i])
    got = outs.copy_to_host()
    for i in range(20):
        assert np.array_equal(got[i].view(np.uint16), want[i].view(np.uint16)), i


def two_layer_index(seed):
    """(stores, the index arrays of ``tiered_decode`` after ``q, stores``) of an int4-aged
    two-layer cache grown to 52 and 21 tokens."""
    config = KVCacheConfig(num_layers=2, num_kv_heads=H, head_dim=D, block_size=BS, group_size=GROUP)
    cache, stores, seqs, rows = run_format("int4-aged", seed, lengths=[52, 21], config=config)
    ids = np.array(seqs, np.int32)
    tables = cache.block_tables(ids)
    lens = np.array([cache.seq_len(int(s)) for s in ids])
    return stores, ([t for t, _ in tables], [c for _, c in tables], (lens % BS).astype(np.int32),
                    cache.tail_pools(ids), ids)


@pytest.mark.parametrize("where", list(MERGES))
def test_a_plan_equals_tiered_decode_on_every_layer(where, seed):
    """TieredDecodePlan (index arrays checked and copied once, launches reused with each
    layer's q, out and layer number) against a tiered_decode per layer, bit for bit, both
    layers of a two-layer cache; a q of another shape is refused."""
    stores, args = two_layer_index(seed)
    options = MERGES[where]
    q = np.random.default_rng(seed).standard_normal((2, 2, 2, D)).astype(np.float16)  # [layer, B, Hq, D]
    plan, want = TieredDecodePlan(stores, *args, options=options), {}
    for layer in (1, 0):
        out = cuda.to_device(np.full(q.shape[1:], np.nan, np.float16))
        got = plan.run(layer, cuda.to_device(q[layer]), out).copy_to_host()
        want[layer] = tiered_decode(q[layer], stores, *args, layer=layer, options=options).copy_to_host()
        assert np.array_equal(got.view(np.uint16), want[layer].view(np.uint16)), layer
    with pytest.raises(HexcoreInvalidArgumentError, match="q: expected shape"):
        plan.run(0, cuda.to_device(q[0, :1]), out)
    with pytest.raises(HexcoreInvalidArgumentError, match="q: needed by a plan made without buffers"):
        plan.run(0)
    if where == "launch":
        return  # the Engine's form below with the default FP16 pool in the merge and the last pool merging
    # the Engine's form: the step's [L, B, Hq, D] buffers checked once, run(layer) reads and writes them
    q_all, out_all = cuda.to_device(q), cuda.to_device(np.full(q.shape, np.nan, np.float16))
    plan = TieredDecodePlan(stores, *args, options=options, buffers=(q_all, out_all))
    for layer in (1, 0):
        plan.run(layer)
        assert np.array_equal(out_all.copy_to_host()[layer].view(np.uint16), want[layer].view(np.uint16)), layer
    # a later plan over other buffers takes the launches over (rebound to its arrays); the old one is spent
    q_next, out_next = cuda.to_device(q), cuda.to_device(np.full(q.shape, np.nan, np.float16))
    taken = TieredDecodePlan(stores, *args, options=options, buffers=(q_next, out_next), reuse=plan)
    for layer in (0, 1):
        taken.run(layer)
        assert np.array_equal(out_next.copy_to_host()[layer].view(np.uint16), want[layer].view(np.uint16)), layer
    with pytest.raises(HexcoreInvalidArgumentError, match="taken over by a later plan"):
        plan.run(0)
    # launches that do not match (another batch) are made afresh; the plan offered stays usable
    first_row = ([t[:1] for t in args[0]], [c[:1] for c in args[1]], *(a[:1] for a in args[2:]))
    one = TieredDecodePlan(stores, *first_row, options=options, reuse=taken)
    one.run(0, cuda.to_device(q[0, :1]), cuda.to_device(np.full((1, 2, D), np.nan, np.float16)))
    taken.run(1)
    for bad, message in (((q_all,), "buffers: expected"), ((q_all[0], out_all), r"buffers\[0\]: expected shape"),
                         ((q_all, out_all[:, :1]), r"buffers\[1\]: expected shape")):
        with pytest.raises(HexcoreInvalidArgumentError, match=message):
            TieredDecodePlan(stores, *args, buffers=bad)


def test_a_sequence_with_no_token_gives_zeros_and_bad_pools_are_refused(seed):
    cache, stores, seqs, rows = run_format("int4-aged", seed, lengths=[40, 0])
    ids = np.array(seqs, np.int32)
    tables = cache.block_tables(ids)
    lens = np.array([cache.seq_len(int(s)) for s in ids])
    args = ([t for t, _ in tables], [c for _, c in tables], (lens % BS).astype(np.int32), cache.tail_pools(ids), ids)
    q = np.random.default_rng(seed).standard_normal((2, 2, D)).astype(np.float16)
    for options in (MERGES["merge"], MERGES["last"], MERGES["one"]):  # (an empty sequence's row: zeros)
        out = tiered_decode(q, stores, *args, options=options,
                            out=cuda.to_device(np.full(q.shape, np.nan, np.float16))).copy_to_host()
        assert not out[1].any() and np.isfinite(out[0]).all() and out[0].any()
    with pytest.raises(HexcoreInvalidArgumentError, match=r"tables, counts: expected one per store \(2\)"):
        tiered_decode(q, stores, args[0][:1], args[1][:1], *args[2:])
    with pytest.raises(HexcoreInvalidArgumentError, match=r"tail_pool\[1\] = 2 is outside \[0, 2\)"):
        tiered_decode(q, stores, *args[:3], np.array([0, 2], np.int32), ids)
    with pytest.raises(HexcoreInvalidArgumentError, match=r"stores\[1\]: its shape differs"):
        other = DeviceKVStore(dataclasses.replace(CONFIG, head_dim=128, kv_dtype="int4"), num_blocks=4, max_seqs=4)
        tiered_decode(q, [stores[0], other], *args)
    # every argument of the wrong kind is typed, naming it (these once raised AttributeError,
    # TypeError, IndexError or numpy's ValueError/UFuncTypeError), and a valid call still works
    i32 = np.int32
    bad_index = {2: [np.array(["a", "b"]), np.array([1.0, 2.0]), None],  # tail_lens
                 3: ["3", None, object(), np.array(["a", "b"]), np.zeros(0, i32), np.array([0, 1])],  # tail_pool
                 0: [[np.zeros(2, np.float32)] * 2, [np.zeros((3, 1), i32)] * 2],  # tables
                 1: [[np.zeros(2, np.float32)] * 2, [np.zeros((2, 1), i32)] * 2]}  # counts
    names = {0: "tables", 1: "counts", 2: "tail_lens", 3: "tail_pool"}
    for at, values in bad_index.items():
        for value in values:
            with pytest.raises(HexcoreInvalidArgumentError, match=names[at]):
                tiered_decode(q, stores, *args[:at], value, *args[at + 1:])
    for value in (None, "3", 1.5, np.float32(2.0), np.zeros(2, np.float16), np.zeros((2, 64), np.float16)):
        with pytest.raises(HexcoreInvalidArgumentError, match="q: expected"):
            tiered_decode(value, stores, *args)
    for value in ("3", 1, np.zeros((2, 2)), object()):
        with pytest.raises(HexcoreInvalidArgumentError, match="options: expected DecodeOptions or None"):
            tiered_decode(q, stores, *args, options=value)
        for name in ("options", "upload", "reuse"):
            with pytest.raises(HexcoreInvalidArgumentError, match=f"{name}: expected"):
                TieredDecodePlan(stores, *args, **{name: value})
    again = tiered_decode(q, stores, *args, options=MERGES["last"]).copy_to_host()
    assert np.array_equal(again.view(np.uint16), out.view(np.uint16))


def test_bad_operations_and_reseals_are_typed_and_write_nothing():
    from hexcore.cuda import reseal_blocks
    from hexcore.cuda.uploads import upload_once

    stores = [DeviceKVStore(dataclasses.replace(CONFIG, kv_dtype=kind), num_blocks=4, max_seqs=2)
              for kind in ("int4", "int2")]
    for store in stores:
        store.poison()
    before = [{n: a.copy_to_host() for n, a in store.arrays.items()} for store in stores]
    one = np.array([0], np.int32)
    for call, match in [
        (lambda: run_tiered_ops(stores, np.zeros((1, 5), np.int32)), r"ops: expected an int32 \[n, 6\]"),
        (lambda: run_tiered_ops(stores, np.zeros((1, 6), np.int64)), r"ops: expected an int32"),
        (lambda: run_tiered_ops(stores, np.array([[0, 0, -1, -1, 2, 0]], np.int32)), r"ops\[0\]: a pool outside"),
        (lambda: run_tiered_ops([stores[0], "x"], np.zeros((0, 6), np.int32)), r"stores\[1\]: expected a Device"),
        # (seq, logical, src pool, src block, pool, block): a good seal first, nothing runs
        (lambda: run_tiered_ops(stores, np.array([[0, 0, -1, -1, 0, 0], [1, 0, -1, -1, 1, 4]], np.int32)),
         r"ops\[1\]: a block or sequence slot outside its pool's store"),
        (lambda: run_tiered_ops(stores, np.array([[2, 0, -1, -1, 0, 0]], np.int32)), r"ops\[0\]: a block or sequence"),
        (lambda: run_tiered_ops(stores, np.array([[0, 0, 0, 4, 1, 0]], np.int32)), r"ops\[0\]: a block or sequence"),
        (lambda: run_tiered_ops(stores, np.array([[0, 0, 0, 1, 1, 2], [0, 1, 0, 3, 1, 2]], np.int32),
                                upload=upload_once), "ops' destination blocks: expected distinct ids"),
        (lambda: run_tiered_ops(stores, np.array([[0, 0, -1, -1, 0, 0]], np.int32), rows=[1, 2, 0]), "rows"),
        (lambda: run_tiered_ops(stores, np.array([[0, 0, -1, -1, 0, 0]], np.int32), rows=(None, None, -1)),
         r"rows\[2\]"),
        (lambda: reseal_blocks(stores[0], np.array([4], np.int32), stores[1], one), "src_ids"),
        (lambda: reseal_blocks(stores[0], one, stores[1], np.array([0, 1], np.int32)), r"dst_ids: expected shape"),
        (lambda: reseal_blocks(stores[1], one, stores[0], one, fitted_keys=True), "fitted_keys: only INT2"),
        (lambda: reseal_blocks(stores[0], one, DeviceKVStore(dataclasses.replace(CONFIG, head_dim=128,
                                                                                 kv_dtype="int2"), 4, 2), one),
         "dst: its shape differs"),
    ]:
        with pytest.raises(HexcoreInvalidArgumentError, match=match):
            call()
    for store, saved in zip(stores, before):
        for name, array in store.arrays.items():
            assert np.array_equal(array.copy_to_host().view(np.uint8), saved[name].view(np.uint8)), name


@pytest.mark.parametrize("name", list(FORMATS))
def test_a_prompt_grown_at_once_holds_what_token_steps_hold(name, seed):
    """grow + run_tiered_ops(rows=...) + the rest into the tail equals one token a step:
    every block byte for byte, and the decode bit for bit."""
    n, first = 100, 7  # 7 tokens stepped first: the prompt completes the tail's block
    stepped, stores_a, seqs, rows = run_format(FORMATS[name], seed, lengths=[n])
    s = seqs[0]
    k, v = rows[s]
    cache = TieredKVCache(CONFIG, FORMATS[name], {kind.value: 40 for kind in _kinds(FORMATS[name], BS)}, 4,
                          max_seq_len=1024)
    stores = [DeviceKVStore(dataclasses.replace(CONFIG, kv_dtype=kind), num_blocks=40, max_seqs=4)
              for kind in cache.kinds]
    for store in stores:
        store.poison()
    b = cache.add_sequence()
    ids = np.array([b], np.int32)
    for t in range(first):
        pool = stores[int(cache.tail_pools(ids)[0])]
        append(pool, k[None, :, t][:, None], v[None, :, t][:, None], ids, np.array([t], np.int32), layer=None)
        run_tiered_ops(stores, cache.step(ids).ops, cache.format.fitted_keys)
    prompt = [np.ascontiguousarray(x[:, first:].transpose(1, 0, 2)[None]) for x in (k, v)]  # [1, n - first, H, D]
    head = (BS - first % BS) % BS  # the prompt rows that complete the tail's block
    pool = stores[int(cache.tail_pools(ids)[0])]
    append(pool, *prompt, np.full(head, b, np.int32), np.arange(first, first + head, dtype=np.int32), layer=None,
           rows=(0, head))
    run_tiered_ops(stores, cache.grow(b, n).ops, cache.format.fitted_keys, rows=(*prompt, first))
    rest = n % BS
    pool = stores[int(cache.tail_pools(ids)[0])]
    append(pool, *prompt, np.full(rest, b, np.int32), np.arange(rest, dtype=np.int32), layer=None,
           rows=(n - first - rest, rest))
    cache.check_invariants()
    assert cache.block_kinds(b).tolist() == stepped.block_kinds(s).tolist()
    for kind in range(len(stores)):  # the same blocks, in the same logical order, byte for byte
        for name_ in stores[kind].arrays:
            if "tails" in name_:
                continue
            a = stores_a[kind].arrays[name_].copy_to_host()[:, stepped.pools[kind].block_table(s)]
            got = stores[kind].arrays[name_].copy_to_host()[:, cache.pools[kind].block_table(b)]
            assert np.array_equal(a.view(np.uint8), got.view(np.uint8)), (kind, name_)
    q = np.random.default_rng(seed).standard_normal((1, 4 * H, D)).astype(np.float16)
    outs = []
    for c, st, sid in ((stepped, stores_a, s), (cache, stores, b)):
        sid = np.array([sid], np.int32)
        tables = c.block_tables(sid)
        outs.append(tiered_decode(q, st, [t for t, _ in tables], [x for _, x in tables],
                                  np.array([n % BS], np.int32), c.tail_pools(sid), sid).copy_to_host())
    assert np.array_equal(outs[0].view(np.uint16), outs[1].view(np.uint16))


def test_the_default_runs_one_launch_then_the_last_pool_merges_where_the_step_is_short():
    """``tiered_merge`` None, with dependent launches: one launch of every pool where the
    step has at most ``TIERED_ONE_MAX_ITEMS[pools]`` items (whatever their length); else the
    last pool's launch merges (no merge launch) where it has at most ``TIERED_LAST_MAX_ITEMS``
    items and they times the longest sequence's blocks come to at most
    ``TIERED_LAST_MAX_BLOCKS`` per SM; else a merge launch. A merge launch with plain
    launches, or where the option says "launch"."""
    from hexcore.cuda.attention.launcher import policy_sms
    from hexcore.cuda.attention.options import TIERED_LAST_MAX_BLOCKS, TIERED_LAST_MAX_ITEMS, TIERED_ONE_MAX_ITEMS
    from hexcore.cuda.attention.tiered import tiered_decode_launches

    def kinds(batch, blocks, options, pools=("fp16", "int4")):  # one KV head and head group: an item a sequence
        stores = [DeviceKVStore(dataclasses.replace(CONFIG, kv_dtype=kind), num_blocks=1, max_seqs=batch)
                  for kind in pools]
        tables = [np.zeros((batch, 1), np.int32)] * (len(pools) - 1) + [np.zeros((batch, blocks), np.int32)]
        counts = [np.zeros(batch, np.int32)] * (len(pools) - 1) + [np.full(batch, blocks, np.int32)]
        zeros = np.zeros(batch, np.int32)
        launches, _ = tiered_decode_launches(np.zeros((batch, 2, D), np.float16), stores, tables, counts,
                                             zeros, zeros, np.arange(batch, dtype=np.int32), options=options)
        return [launch.kernel.py_func.__qualname__.split(".")[0] for launch in launches]

    limit = TIERED_LAST_MAX_BLOCKS * policy_sms()  # items (here 1) times blocks
    one, most, three = TIERED_ONE_MAX_ITEMS[2], TIERED_LAST_MAX_ITEMS, TIERED_ONE_MAX_ITEMS[3]
    assert one < most
    last, launch = ["pool_kernel"] * 2, ["decode_kernel", "fused_merge_kernel"]
    for batch, blocks, options, want in ((1, limit + 1, DecodeOptions(), ["one_launch_kernel"]),
                                         (one, 1, DecodeOptions(), ["one_launch_kernel"]),
                                         (one + 1, 1, DecodeOptions(), last), (most, 1, DecodeOptions(), last),
                                         (one + 1, -(-limit // (one + 1)) + 1, DecodeOptions(), launch),
                                         (most + 1, 1, DecodeOptions(), launch),
                                         (1, 1, DecodeOptions(dependent_launch=False), launch),
                                         (1, 1, DecodeOptions(tiered_merge="launch"), launch),
                                         (most + 1, limit + 1, DecodeOptions(tiered_merge="last"), last)):
        assert kinds(batch, blocks, options) == want, (batch, blocks, options)
    assert kinds(three, 2, DecodeOptions(), ("fp16", "int4", "int2")) == ["one_launch_kernel"]
    assert kinds(three + 1, 2, DecodeOptions(), ("fp16", "int4", "int2"))[-1] == "fused_merge_kernel"  # (> most)


@pytest.mark.parametrize("where", ["last", "one", "packed"])
def test_the_last_pools_merge_reads_only_slots_written_in_this_launch(where, seed):
    """``tiered_merge`` "last" (and "one", "packed") with one-block splits: sequence 0 has six blocks in the last
    pool, sequence 1 none (its five extra splits there are empty partials, which the merge
    reads too); the workspace poisoned (NaN) before: every slot the merge reads must be
    written by this decode, and the output equals a merge launch's to rounding."""
    from hexcore.cuda.attention import tiered
    from hexcore.cuda.store import flat_words

    config = dataclasses.replace(CONFIG, num_layers=1)
    rng = np.random.default_rng(seed)
    stores = [DeviceKVStore(config, num_blocks=8, max_seqs=2) for _ in range(2)]
    for store in stores:  # FP16 pools: every block and tail random rows
        for array in store.arrays.values():
            words = flat_words(array)
            words.copy_to_device(rng.standard_normal(2 * words.shape[0]).astype(np.float16).view(np.uint32))
    tables = [np.array([[0], [1]], np.int32), np.array([[0, 1, 2, 3, 4, 5], [0, 0, 0, 0, 0, 0]], np.int32)]
    counts = [np.array([1, 1], np.int32), np.array([6, 0], np.int32)]
    args = (tables, counts, np.array([3, 5], np.int32), np.zeros(2, np.int32), np.array([0, 1], np.int32))
    q = rng.standard_normal((2, 2, D)).astype(np.float16)
    want = tiered_decode(q, stores, *args, options=DecodeOptions(tiered_merge="launch", split_blocks=1))
    for part_o, part_ml, _ in tiered._workspace._arrays.values():
        part_o.copy_to_device(np.full(part_o.shape, np.nan, np.float32))
        part_ml.copy_to_device(np.full(part_ml.shape, np.nan, np.float32))
    got = tiered_decode(q, stores, *args, options=DecodeOptions(tiered_merge=where, split_blocks=1)).copy_to_host()
    assert np.isfinite(got).all()
    assert np.abs(got.astype(np.float32) - want.copy_to_host()).max() < 2e-3


def test_each_pool_reads_with_its_own_store_sizes(seed):
    """Three FP16 pools of two layers whose stores hold 12, 8 and 5 blocks and tails for 3, 2
    and 6 sequences, the tails in the first and second: every way of merging reads layer 1's
    blocks and tails at each store's own offsets, as a merge launch does (a pool reading
    them with another store's ``num_blocks`` or ``max_seqs`` reads other rows, or past the
    array), with the policy's splits and with one-block ones."""
    rng = np.random.default_rng(seed)
    stores = random_fp16_stores(rng, 2, ((12, 3), (8, 2), (5, 6)))
    tables = [np.array([[0, 1, 2, 3, 4, 5], [11, 0, 0, 0, 0, 0]], np.int32), np.array([[7], [1]], np.int32),
              np.array([[4, 2], [3, 0]], np.int32)]
    counts = [np.array([6, 1], np.int32), np.array([1, 1], np.int32), np.array([2, 1], np.int32)]
    args = (tables, counts, np.array([3, 5], np.int32), np.array([0, 1], np.int32), np.array([1, 0], np.int32))
    q = rng.standard_normal((2, 2, D)).astype(np.float16)
    for split_blocks in (None, 1):
        want = tiered_decode(q, stores, *args, layer=1, options=dataclasses.replace(
            MERGES["launch"], split_blocks=split_blocks)).copy_to_host()
        for where in ("last", "one", "packed"):
            got = tiered_decode(q, stores, *args, layer=1, options=dataclasses.replace(
                MERGES[where], split_blocks=split_blocks)).copy_to_host()
            assert np.abs(got.astype(np.float32) - want).max() < 2e-3, (where, split_blocks)


def random_fp16_stores(rng, layers: int, sizes) -> list:
    """FP16 stores of ``layers`` layers, one per ``(num_blocks, max_seqs)`` of ``sizes``,
    every block and tail random rows."""
    from hexcore.cuda.store import flat_words

    config = dataclasses.replace(CONFIG, num_layers=layers)
    stores = [DeviceKVStore(config, num_blocks=nb, max_seqs=ms) for nb, ms in sizes]
    for store in stores:
        for array in store.arrays.values():
            words = flat_words(array)
            words.copy_to_device(rng.standard_normal(2 * words.shape[0]).astype(np.float16).view(np.uint32))
    return stores


def test_one_launch_runs_every_pools_splits_at_one_cap(monkeypatch):
    """``tiered_merge`` "one": a single launch of ``one_launch_kernel`` over the pools in slot
    order (the last pool first) at one cap (``max_registers``, else 168 where the last pool
    alone would take the uncapped kernel unless 128 makes fewer waves, else 128), its grid's
    x the last pool's splits as a launch of that cap sizes them, plus a younger pool's in
    runs no shorter than the last pool's (here one, where alone it splits in four); a format
    of one pool, or of four, runs the pools' merging launches (``pool_kernel``)."""
    from hexcore.cuda.attention import launcher, tiered
    from hexcore.cuda.attention.kernel import GRID_REGISTERS
    from hexcore.cuda.attention.tiered import tiered_decode_launches

    for cap in (None, launcher.UNCAPPED_REGISTERS):
        launch, young, last = one_launch_case("one", cap)
        assert launch.kernel is one_kernel("one", cap or GRID_REGISTERS), cap
        assert young.grid[0] == 4 and last.grid[0] == 4 and last.args[18] == 16, (young.grid, last.grid)  # alone
        assert launch.grid == (last.grid[0] + 1, *last.grid[1:]), cap
        assert launch.args[22:24] == (last.grid[0], 1)  # n_a (the last pool), n_b
    # one item of one split: the simulator's one-CTA wave takes the uncapped kernel for it, so
    # the one kernel runs at 168 unless 128 makes fewer waves of its two CTAs
    few = long_index(batch=1, fp16_blocks=1, int4_blocks=2)
    q = np.zeros((1, 2, D), np.float16)
    for slots_168, slots_128, cap in ((None, None, tiered.ONE_LAUNCH_UNCAPPED), (2, 2, tiered.ONE_LAUNCH_UNCAPPED),
                                      (1, 1, tiered.ONE_LAUNCH_UNCAPPED), (1, 2, GRID_REGISTERS)):
        if slots_168 is not None:
            slots = {tiered.ONE_LAUNCH_UNCAPPED: slots_168, GRID_REGISTERS: slots_128}
            monkeypatch.setattr(tiered, "resident_slots", lambda launch, options: slots[options.max_registers])
        (launch,), _ = tiered_decode_launches(q, *few[:3], *few[3], options=DecodeOptions(tiered_merge="one"))
        assert launch.kernel is one_kernel("one", cap), slots_168
    monkeypatch.undo()
    _, tables, counts, index = long_index(batch=32, fp16_blocks=16, int4_blocks=64)
    q = np.zeros((32, 2, D), np.float16)
    for kinds in (("int4",), ("fp16", "int4", "int2", "int4")):
        pools = [DeviceKVStore(dataclasses.replace(CONFIG, kv_dtype=kind), num_blocks=1, max_seqs=32) for kind in kinds]
        launches, _ = tiered_decode_launches(q, pools, tables[-1:] * len(kinds), counts[-1:] * len(kinds), *index,
                                             options=DecodeOptions(tiered_merge="one"))
        assert [la.kernel.py_func.__qualname__.split(".")[0] for la in launches] == ["pool_kernel"] * len(kinds)


def test_one_launch_fits_one_wave_where_fewer_last_pool_splits_can(monkeypatch):
    """Where the one grid is more than a wave of resident CTAs and fewer splits of the last
    pool (at least one) make it one, "one" gives the last pool that many; otherwise, or with
    ``split_blocks`` set, the policy's count stands. Here 32 items of 4 INT4 splits (64
    blocks) and one FP16 CTA: 160 CTAs."""
    from hexcore.cuda.attention import tiered
    from hexcore.cuda.attention.tiered import tiered_decode_launches

    stores, tables, counts, index = long_index(batch=32, fp16_blocks=16, int4_blocks=64)
    q = np.zeros((32, 2, D), np.float16)
    options, fixed = DecodeOptions(tiered_merge="one"), DecodeOptions(tiered_merge="one", split_blocks=16)
    # slots -> the one grid's x: 4 + 1 fits 160; 159 fits 3 INT4 splits of 22 blocks (+ 1);
    # 64 one split; 63 not even that (one INT4 split and one FP16 CTA are 64)
    for slots, want in ((160, 5), (159, 4), (64, 2), (63, 5), (1, 5)):
        monkeypatch.setattr(tiered, "resident_slots", functools.partial(one_kernel_slots, slots))
        (launch,), _ = tiered_decode_launches(q, stores, tables, counts, *index, options=options)
        assert launch.grid[0] == want, (slots, launch.grid)
        (launch,), _ = tiered_decode_launches(q, stores, tables, counts, *index, options=fixed)
        assert launch.grid[0] == 4 + 1, (slots, launch.grid)  # (16-block runs: 4 INT4, 1 FP16)
    # the refitted launch computes what a merge launch does: two FP16 pools, 24 and 10 blocks
    # in the last, 6 splits of 4 and one young CTA per item (14 CTAs); 9 slots fit 3 of 8 (8)
    rng = np.random.default_rng(0)
    stores = random_fp16_stores(rng, 1, ((2, 2), (34, 2)))
    tables = [np.array([[0], [1]], np.int32), np.array([np.arange(24), np.arange(24, 48) % 34], np.int32)]
    counts = [np.array([1, 1], np.int32), np.array([24, 10], np.int32)]
    args = (tables, counts, np.array([3, 5], np.int32), np.zeros(2, np.int32), np.array([0, 1], np.int32))
    q = rng.standard_normal((2, 2, D)).astype(np.float16)
    want = tiered_decode(q, stores, *args, options=MERGES["launch"]).copy_to_host()
    for slots, x in ((14, 7), (9, 4)):
        monkeypatch.setattr(tiered, "resident_slots", functools.partial(one_kernel_slots, slots))
        (launch,), _ = tiered_decode_launches(q, stores, *args, options=options)
        got = tiered_decode(q, stores, *args, options=options).copy_to_host()
        assert launch.grid[0] == x and np.abs(got.astype(np.float32) - want).max() < 2e-3, (slots, launch.grid)


def test_packed_runs_the_younger_pools_slots_in_the_last_pools_ctas(seed):
    """``tiered_merge`` "packed": one launch of the packed ``one_launch_kernel`` at 128
    registers (or ``max_registers``) whose grid is the last pool's own launch's at that cap,
    the younger pool's slots (runs no shorter than the last pool's splits) run by those
    CTAs; where they outnumber the CTAs a row (two FP16 pools in runs of two blocks: the
    younger's up to seven blocks with the tail, the last's two), each CTA runs several in
    turn, and the output equals a merge launch's to rounding, the workspace poisoned (NaN)
    before (every slot merged was written by this launch)."""
    from hexcore.cuda.attention import tiered
    from hexcore.cuda.attention.kernel import GRID_REGISTERS
    from hexcore.cuda.attention.tiered import tiered_decode_launches

    for cap in (None, tiered.ONE_LAUNCH_UNCAPPED):
        launch, _, last = one_launch_case("packed", cap)
        assert launch.kernel is one_kernel("packed", cap or GRID_REGISTERS), cap
        assert launch.grid == last.grid and launch.args[22:24] == (last.grid[0], 1), (launch.grid, last.grid)
    rng = np.random.default_rng(seed)
    stores = random_fp16_stores(rng, 1, ((12, 2), (4, 2)))
    tables = [np.array([np.arange(6), np.arange(6, 12)], np.int32), np.array([[0, 1], [2, 3]], np.int32)]
    counts = [np.array([6, 4], np.int32), np.array([2, 1], np.int32)]
    args = (tables, counts, np.array([3, 5], np.int32), np.zeros(2, np.int32), np.array([0, 1], np.int32))
    q = rng.standard_normal((2, 2, D)).astype(np.float16)
    want = tiered_decode(q, stores, *args, options=dataclasses.replace(MERGES["launch"], split_blocks=2))
    for part_o, part_ml, _ in tiered._workspace._arrays.values():
        part_o.copy_to_device(np.full(part_o.shape, np.nan, np.float32))
        part_ml.copy_to_device(np.full(part_ml.shape, np.nan, np.float32))
    packed = DecodeOptions(tiered_merge="packed", split_blocks=2)
    (launch,), _ = tiered_decode_launches(q, stores, *args, options=packed)
    assert launch.grid[0] == launch.args[22] == 1 and launch.args[23] == 4, (launch.grid, launch.args[22:24])
    got = tiered_decode(q, stores, *args, options=packed).copy_to_host()
    assert np.isfinite(got).all()
    assert np.abs(got.astype(np.float32) - want.copy_to_host()).max() < 2e-3


def one_launch_case(merge: str, cap: int | None) -> tuple:
    """``(launch, young, last)`` over ``long_index(32, 16, 64)`` (an FP16 and an INT4 pool,
    32 sequences): the one launch ``tiered_merge`` ``merge`` ("one" or "packed") makes with
    ``max_registers`` ``cap``, and the FP16 and INT4 pools' own partials launches at that
    cap (None: 128)."""
    from hexcore.cuda.attention.kernel import GRID_REGISTERS
    from hexcore.cuda.attention.tiered import tiered_decode_launches

    stores, tables, counts, index = long_index(batch=32, fp16_blocks=16, int4_blocks=64)
    q = np.zeros((32, 2, D), np.float16)
    (launch,), _ = tiered_decode_launches(q, stores, tables, counts, *index,
                                          options=DecodeOptions(tiered_merge=merge, max_registers=cap))
    (young, last, _), _ = tiered_decode_launches(q, stores, tables, counts, *index, options=DecodeOptions(
        tiered_merge="launch", tiered_fp16="launch", max_registers=cap or GRID_REGISTERS))
    return launch, young, last


def one_kernel(merge: str, cap: int):
    """The ``one_launch_kernel`` of ``tiered_merge`` ``merge`` at ``cap`` for this module's
    (INT4, FP16) pools in slot order, with the default's launch kind."""
    from hexcore.cuda.attention import launcher
    from hexcore.cuda.attention.shape import DecodeShape
    from hexcore.cuda.attention.tiered_kernels import one_launch_kernel

    int4, fp16 = (DecodeShape(bits, H, D, BS, 2, GROUP) for bits in (4, 16))
    dependent = launcher.dependent_launches(DecodeOptions())
    return one_launch_kernel((int4, fp16), cap, "none", True, dependent, merge == "packed")


def one_kernel_slots(slots: int, launch, options) -> int:
    """``resident_slots`` standing in for a GPU's: ``slots``, asked only of the one kernel."""
    assert launch.kernel.py_func.__qualname__.startswith("one_launch_kernel"), launch.kernel
    return slots


def long_index(batch: int, fp16_blocks: int, int4_blocks: int) -> tuple:
    """(stores, tables, counts, (tail_lens, tail_pool, tail_slots)) of an FP16 and an INT4
    pool (one block each, every table entry naming it: for launches made, not run), every
    sequence with ``fp16_blocks`` and ``int4_blocks`` blocks and no tail."""
    stores = [DeviceKVStore(dataclasses.replace(CONFIG, kv_dtype=kind), num_blocks=1, max_seqs=batch)
              for kind in ("fp16", "int4")]
    tables = [np.zeros((batch, n), np.int32) for n in (fp16_blocks, int4_blocks)]
    counts = [np.full(batch, n, np.int32) for n in (fp16_blocks, int4_blocks)]
    zeros = np.zeros(batch, np.int32)
    return stores, tables, counts, (zeros, zeros, np.arange(batch, dtype=np.int32))


def test_each_pool_runs_the_register_cap_its_splits_were_sized_for():
    """A pool whose grid launch would take the uncapped kernel (few items; FP16 too, its one
    split being the capped kernel's) runs the uncapped partials kernel, one that would not (an
    explicit cap) the capped one: the split count each pool gets (``launcher._choose_kernel``)
    assumes that kernel's resident CTAs. (FP16 with its own partials launch: by default its
    pool runs inside the merge launch, at the merge kernel's cap.)"""
    from hexcore.cuda.attention import launcher
    from hexcore.cuda.attention.kernel import decode_kernel
    from hexcore.cuda.attention.shape import DecodeShape
    from hexcore.cuda.attention.tiered import tiered_decode_launches
    from hexcore.cuda.attention.tiered_kernels import pool_kernel

    for dtype, merge in itertools.product(("int4", "fp16"), ("launch", "last")):
        cfg = KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=64, block_size=16, kv_dtype=dtype)
        store = DeviceKVStore(cfg, num_blocks=2, max_seqs=1)
        shape = DecodeShape(cfg.kv_dtype.bits, 1, 64, 16, 2, cfg.group_size)
        q = np.zeros((1, 2, 64), np.float16)
        tables, counts = [np.array([[0, 1]], np.int32)], [np.array([2], np.int32)]
        for options, cap in ((DecodeOptions(tiered_merge=merge, tiered_fp16="launch"), launcher.UNCAPPED_REGISTERS),
                             (DecodeOptions(max_registers=128, tiered_merge=merge, tiered_fp16="launch"), 128)):
            launches, _ = tiered_decode_launches(q, [store], tables, counts, np.zeros(1, np.int32),
                                                 np.zeros(1, np.int32), np.zeros(1, np.int32), options=options)
            dependent = launcher.dependent_launches(options)
            want = (decode_kernel(shape, cap, "none", True, partials=True, dependent=dependent) if merge == "launch"
                    else pool_kernel(shape, cap, "none", True, dependent, True, True))
            assert launches[0].kernel is want, (dtype, options)


@pytest.mark.parametrize("where", list(MERGES))
def test_a_plans_launches_are_dependent_launches_where_the_grid_decodes_are(where, seed):
    """``DecodeOptions.dependent_launch``: a TieredDecodePlan's pool and merge launches are
    programmatic dependent launches of kernels that wait for the grid before them, as the
    grid decode's (default: on for sm_90, which the simulator stands for), plain ones with
    False; the outputs are the same bits either way."""
    stores, args = two_layer_index(seed)
    q = np.random.default_rng(seed).standard_normal((2, 2, D)).astype(np.float16)
    outs = []
    for dependent in (None, False):
        options = dataclasses.replace(MERGES[where], dependent_launch=dependent)
        plan = TieredDecodePlan(stores, *args, options=options)
        outs.append(plan.run(1, cuda.to_device(q), cuda.to_device(np.full(q.shape, np.nan, np.float16))).copy_to_host())
        kinds = [(prepared.dependent, prepared.as_launch().kernel.waits_for_prior_grids)
                 for prepared, _ in plan._launches]
        assert (len(kinds) == 1 if where in ("one", "packed") else len(kinds) >= 2), kinds
        assert all(k == (dependent is None,) * 2 for k in kinds), kinds
    assert np.array_equal(outs[0].view(np.uint16), outs[1].view(np.uint16))


@pytest.mark.parametrize("batch", [None, True, 1.5, "3", -1, 0, 5, 10**30, [1], np.zeros(2)])
def test_engine_buffers_of_a_format_by_age_take_a_batch_in_one_to_max_seqs(batch):
    """``Engine.buffers(batch)`` with a format (``TieredParts.buffers``) once took any key:
    numpy's ValueError for -1 or 10**30, TypeError for a float, a list or None."""
    from hexcore import HexcoreInvalidArgumentError as Invalid
    from hexcore.engine import Engine

    engine = Engine(CONFIG, 0, 4, 2, format="int4-aged", pool_blocks={"fp16": 8, "int4": 8}, max_seq_len=128)
    assert engine.buffers(np.int64(4)).q.shape == (1, 4, 2, D)
    with pytest.raises(Invalid, match="batch: expected an int"):
        engine.buffers(batch)


@pytest.mark.parametrize("config,kwargs,match", [
    (CONFIG, dict(scale=float("nan")), "scale: expected a positive finite number"),
    (CONFIG, dict(scale=True), "scale: expected a positive finite number"),
    (CONFIG, dict(options="launch"), "options: expected DecodeOptions or None"),
    (CONFIG, dict(num_q_heads=None), "num_q_heads: expected an int"),
    (dataclasses.replace(CONFIG, num_kv_heads=2), dict(num_q_heads=3), "num_q_heads: 3 is not a positive multiple"),
    (dataclasses.replace(CONFIG, head_dim=192), {}, "fp16 pool: paged_decode does not support head_dim 192"),
])
def test_an_engine_in_a_format_by_age_checks_its_decode_arguments_when_made(config, kwargs, match):
    """They were checked by the first step's decode, after the block manager had grown the
    step's sequences (a refused step that changed the cache), or not at all (a bool scale)."""
    from hexcore.engine import Engine

    kwargs = dict(dict(num_q_heads=2), **kwargs)
    with pytest.raises(HexcoreInvalidArgumentError, match=match):
        Engine(config, 0, 4, kwargs.pop("num_q_heads"), format="int4-aged", pool_blocks={"fp16": 8, "int4": 8},
               **kwargs)


def test_a_tiered_step_run_twice_says_how_it_ran():
    """(a second ``run()`` once said the step "was already loaded by attend()")"""
    from hexcore.engine import Engine

    engine = Engine(CONFIG, 0, 4, 2, format="int4-aged", pool_blocks={"fp16": 8, "int4": 8}, max_seq_len=128)
    seq = engine.add()
    for first, said in (("run()", "ran"), ("attend()", r"was started by attend\(\)")):
        step = engine.step([seq])
        step.write(np.zeros((1, 1, 2, D), np.float16), *np.zeros((2, 1, 1, 1, D), np.float16))
        step.run() if first == "run()" else step.attend(0)
        with pytest.raises(HexcoreInvalidArgumentError, match=f"^run: this step already {said}$"):
            step.run()
    assert engine.seq_len(seq) == 2
