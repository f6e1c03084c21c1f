"""Prefill over a cached prefix against a float64 reference over the dequantized cache.

Every check: fresh random inputs (seed shown on failure), the output poisoned with NaN
before the launch, the store poisoned (NaN / 0xFF) outside the sequence's blocks and tail
slots, table entries past the prefix pointing at a never-written block; relative L2 error
at most 2e-3 (the scratch holds dequantized keys rounded to float16).
"""

import math

import numpy as np
import pytest
from numba import cuda

from hexcore import HexcoreInvalidArgumentError, KVCacheConfig
from hexcore.cuda import BatchRows, dequantize_blocks, gather_prefix, prefill_attention, prefill_attention_batch
from tests import reference as ref
from tests.cuda.fill import random_cache

TOLERANCE = 2e-3


def extend_reference(q, keys, values, k_new, v_new, scale):
    """float64 causal extend attention: ``q`` [n, Hq, D]; ``keys``, ``values`` [H, P, D] float64
    (the cached prefix); ``k_new``, ``v_new`` [n, H, D]. Query i sees the prefix and new 0..i."""
    n, Hq, D = q.shape
    k = np.concatenate([keys, k_new.transpose(1, 0, 2).astype(np.float64)], axis=1)
    v = np.concatenate([values, v_new.transpose(1, 0, 2).astype(np.float64)], axis=1)
    group, P = Hq // k.shape[0], keys.shape[1]
    out = np.zeros((n, Hq, D))
    for i in range(n):
        for hq in range(Hq):
            s = k[hq // group, :P + i + 1] @ q[i, hq].astype(np.float64) * scale
            p = np.exp(s - s.max())
            out[i, hq] = (p / p.sum()) @ v[hq // group, :P + i + 1]
    return out


def make_case(cfg, prefix_len, n_new, group, rng, layer=0):
    """A poisoned store holding one sequence's prefix (and another sequence, which must not be
    read); (store, table, slot, keys, values, q, k_new, v_new)."""
    store, tables, tails, keys, values = random_cache(cfg, [prefix_len, cfg.block_size + 3], rng, layer=layer)
    H, D = cfg.num_kv_heads, cfg.head_dim
    q = rng.standard_normal((n_new, H * group, D)).astype(np.float16)
    k_new = rng.standard_normal((n_new, H, D)).astype(np.float16)
    v_new = rng.standard_normal((n_new, H, D)).astype(np.float16)
    return store, tables[0], int(tails[0]), keys[0], values[0], q, k_new, v_new


def check_prefill(cfg, prefix_len, n_new, group, rng, backend="numba"):
    store, table, slot, keys, values, q, k_new, v_new = make_case(cfg, prefix_len, n_new, group, rng)
    out = cuda.to_device(np.full(q.shape, np.nan, np.float16))
    prefill_attention(q, k_new, v_new, store, 0, table, prefix_len, slot, out=out, backend=backend)
    got = out.copy_to_host()
    assert not np.isnan(got).any(), "an output element was not written (or NaN was read)"
    expect = extend_reference(q, keys, values, k_new, v_new, 1 / math.sqrt(cfg.head_dim))
    err = ref.relative_l2(got, expect)
    assert err <= TOLERANCE, f"relative L2 error {err:.2e}"


SIM_CASES = [  # (kv_dtype, head_dim, group_size, group, prefix_len, n_new)
    ("fp16", 64, 64, 1, 32, 5),  # whole blocks
    ("fp16", 64, 64, 3, 37, 9),  # a partial tail
    ("int4", 64, 32, 4, 16, 20),  # more new tokens than prefix; two CTAs of rows
    ("int4", 64, 16, 1, 21, 3),
    ("int2", 64, 64, 3, 48, 7),
    ("int2", 64, 32, 4, 5, 4),  # the prefix is a tail alone
    ("int4", 64, 64, 3, 0, 6),  # no prefix: plain causal attention
]


@pytest.mark.parametrize("dtype,head_dim,group_size,group,prefix_len,n_new", SIM_CASES)
def test_prefill_matches_reference(dtype, head_dim, group_size, group, prefix_len, n_new, rng):
    cfg = KVCacheConfig(num_layers=1, num_kv_heads=2, head_dim=head_dim, block_size=16, kv_dtype=dtype,
                        group_size=group_size)
    check_prefill(cfg, prefix_len, n_new, group, rng)


@pytest.mark.parametrize("dtype", ["fp16", "int4", "int2"])
def test_gather_gives_the_dequantized_prefix_then_the_new_tokens(dtype, rng):
    cfg = KVCacheConfig(num_layers=2, num_kv_heads=2, head_dim=64, block_size=16, kv_dtype=dtype, group_size=32)
    store, table, slot, keys, values, _, k_new, v_new = make_case(cfg, 35, 3, 1, rng, layer=1)  # layer 0: poison
    k_out = cuda.to_device(np.full((2, 38, 64), np.nan, np.float16))
    v_out = cuda.to_device(np.full((2, 38, 64), np.nan, np.float16))
    gather_prefix(store, 1, table, 35, slot, k_new, v_new, k_out=k_out, v_out=v_out)
    for got, prefix, new in ((k_out, keys, k_new), (v_out, values, v_new)):
        got = got.copy_to_host()
        np.testing.assert_array_equal(got[:, 35:], new.transpose(1, 0, 2))
        np.testing.assert_allclose(got[:, :35].astype(np.float64), prefix, rtol=1e-3, atol=1e-3)
        np.testing.assert_array_equal(got[:, 32:35], prefix[:, 32:35].astype(np.float16))  # the tail, exact
    # the sealed rows are dequantize_blocks' float16, bit for bit
    k_blocks, v_blocks = (x.copy_to_host() for x in dequantize_blocks(store, 1, np.ascontiguousarray(table[:2])))
    for got, blocks in ((k_out, k_blocks), (v_out, v_blocks)):
        want = blocks.transpose(1, 0, 2, 3).reshape(2, 32, 64)  # [H, 2 blocks x 16 tokens, D]
        np.testing.assert_array_equal(got.copy_to_host()[:, :32].view(np.uint16), want.view(np.uint16))


@pytest.mark.parametrize("dtype", ["fp16", "int4"])
def test_gather_gives_nan_rows_for_device_block_ids_out_of_range(dtype, rng):
    cfg = KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=64, block_size=16, kv_dtype=dtype, group_size=32)
    store, table, slot, *_ = make_case(cfg, 32, 0, 1, rng)
    bad = cuda.to_device(np.array([table[0], store.num_blocks], np.int32))  # device ids are not read back
    k_out, v_out = (x.copy_to_host() for x in gather_prefix(store, 0, bad, 32))
    for out in (k_out, v_out):
        assert not np.isnan(out[:, :16]).any() and np.isnan(out[:, 16:]).all()


def test_device_arrays_give_what_host_arrays_give(rng):
    cfg = KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=64, block_size=16, kv_dtype="int4", group_size=64)
    store, table, slot, keys, values, q, k_new, v_new = make_case(cfg, 32, 2, 2, rng)
    host = prefill_attention(q, k_new, v_new, store, 0, table, 32, backend="numba").copy_to_host()
    device = prefill_attention(cuda.to_device(q), cuda.to_device(k_new), cuda.to_device(v_new), store, 0,
                               cuda.to_device(table), 32, backend="numba").copy_to_host()
    np.testing.assert_array_equal(host, device)


def test_sdpa_extend_matches_reference_on_cpu(rng):
    """The SDPA path's mask and GQA on torch's CPU kernels (the gather is tested above)."""
    torch = pytest.importorskip("torch")
    n, H, group, D, P = 5, 2, 3, 64, 21
    q = rng.standard_normal((n, H * group, D))
    k, v = rng.standard_normal((H, P + n, D)), rng.standard_normal((H, P + n, D))
    from hexcore.cuda.attention.prefill import sdpa_extend

    got = sdpa_extend(*(torch.from_numpy(x) for x in (q, k, v))).numpy()
    expect = extend_reference(q, k[:, :P], v[:, :P], k[:, P:].transpose(1, 0, 2), v[:, P:].transpose(1, 0, 2),
                              1 / math.sqrt(D))
    assert ref.relative_l2(got, expect) <= 1e-10


def test_bad_arguments_raise_and_leave_out_unwritten(rng):
    cfg = KVCacheConfig(num_layers=2, num_kv_heads=2, head_dim=64, block_size=16, kv_dtype="int4", group_size=32)
    store, table, slot, _, _, q, k_new, v_new = make_case(cfg, 20, 3, 2, rng)
    out = cuda.to_device(np.full(q.shape, np.nan, np.float16))
    good = dict(q=q, k_new=k_new, v_new=v_new, store=store, layer=0, block_table=table, prefix_len=20, tail_slot=slot,
                out=out, backend="numba")
    cases = [
        (dict(layer=2), r"layer: expected an int in \[0, 2\), got 2"),
        (dict(prefix_len=-1), r"prefix_len: expected an int >= 0, got -1"),
        (dict(prefix_len=2.0), "prefix_len: expected an int, got float"),
        (dict(prefix_len=16 * len(table) + 16), r"block_table: expected shape \(>= \d+,\) for prefix_len"),
        (dict(block_table=np.array([store.num_blocks], np.int32)), r"block_table\[0\] = .* is outside"),
        (dict(block_table=table.astype(np.int64)), "block_table: expected dtype int32, got int64"),
        (dict(tail_slot=None), "tail_slot: prefix_len 20 ends inside a tail"),
        (dict(tail_slot=store.max_seqs), "tail_slot: expected an int in"),
        (dict(q=q.astype(np.float32)), "q: expected dtype float16, got float32"),
        (dict(q=q[:, :3]), "q: num_q_heads 3 is not a positive multiple of num_kv_heads 2"),
        (dict(q=q[:2]), r"q: expected shape \(3, '\*', 64\), got \(2, 4, 64\)"),
        (dict(v_new=v_new[:2]), r"v_new: expected shape \(3, 2, 64\)"),
        (dict(k_new=k_new[..., :32]), r"k_new: expected shape \('\*', 2, 64\)"),
        (dict(out=np.zeros(q.shape, np.float16)), "out: an output must be a device array"),
        (dict(out=cuda.to_device(np.zeros((3, 4, 32), np.float16))), r"out: expected shape \(3, 4, 64\)"),
        (dict(scale=0.0), "scale: expected a positive finite number"),
        (dict(backend="flash"), "backend: expected one of"),
        (dict(backend="sdpa"), "backend: 'sdpa' needs torch with CUDA"),
        (dict(store=store.config), "store: expected a DeviceKVStore, got KVCacheConfig"),
    ]
    for change, message in cases:
        with pytest.raises(HexcoreInvalidArgumentError, match=message):
            prefill_attention(**{**good, **change})
    assert np.isnan(out.copy_to_host()).all()
    bad_out = store.v_tails.reshape(store.v_tails.size)[:q.size].reshape(q.shape)
    with pytest.raises(HexcoreInvalidArgumentError, match="out: lies inside the store's memory"):
        prefill_attention(**{**good, "out": bad_out})


# -- a batch of sequences at once ---------------------------------------------------------
def batch_case(cfg, prefix_lens, n_new, group, rng):
    """Sequences with ``prefix_lens`` cached tokens and ``n_new`` new ones, padded to the
    longest: (store, tables, tails, q, k_new, v_new, per-row expected outputs)."""
    store, tables, tails, keys, values = random_cache(cfg, prefix_lens, rng)
    B, n_max, H, D = len(prefix_lens), max(n_new), cfg.num_kv_heads, cfg.head_dim
    q = rng.standard_normal((B, n_max, H * group, D)).astype(np.float16)
    k_new = rng.standard_normal((B, n_max, H, D)).astype(np.float16)
    v_new = rng.standard_normal((B, n_max, H, D)).astype(np.float16)
    expect = [extend_reference(q[r, :n], keys[r], values[r], k_new[r, :n], v_new[r, :n], 1 / math.sqrt(D))
              for r, n in enumerate(n_new)]
    return store, tables, tails, q, k_new, v_new, expect


@pytest.mark.parametrize("dtype", ["fp16", "int4", "int2"])
def test_a_batch_attends_as_its_rows_do_one_by_one(dtype, rng):
    # prefixes ending inside a tail, on a block boundary and empty; a row with no new token
    cfg = KVCacheConfig(num_layers=1, num_kv_heads=2, head_dim=64, block_size=16, kv_dtype=dtype, group_size=32)
    prefix_lens, n_new = [35, 32, 0, 7], [3, 5, 4, 0]
    store, tables, tails, q, k_new, v_new, expect = batch_case(cfg, prefix_lens, n_new, 2, rng)
    out = cuda.to_device(np.full(q.shape, np.nan, np.float16))
    prefill_attention_batch(q, k_new, v_new, store, 0, tables, np.array(prefix_lens, np.int32), tails,
                            np.array(n_new, np.int32), out=out, backend="numba")
    got = out.copy_to_host()
    for r, n in enumerate(n_new):
        assert not np.isnan(got[r]).any() and (got[r, n:] == 0).all()  # padding rows: zeros
        if n:
            one = prefill_attention(q[r, :n], k_new[r, :n], v_new[r, :n], store, 0, tables[r], prefix_lens[r],
                                    int(tails[r]), backend="numba").copy_to_host()
            np.testing.assert_array_equal(got[r, :n], one)  # the same scratch values, the same kernel
            assert ref.relative_l2(got[r, :n], expect[r]) <= TOLERANCE


def test_rows_made_once_give_what_each_call_gives(rng):
    # BatchRows: the rows checked and copied once, reused by every layer of a forward
    cfg = KVCacheConfig(num_layers=2, num_kv_heads=2, head_dim=64, block_size=16, kv_dtype="int4", group_size=32)
    prefix_lens, n_new = [35, 16, 0], [3, 0, 2]
    store, tables, tails, q, k_new, v_new, _ = batch_case(cfg, prefix_lens, n_new, 1, rng)
    args = (tables, np.array(prefix_lens, np.int32), tails, np.array(n_new, np.int32))
    rows = BatchRows(store, 3, 3, *args)
    assert rows.S_max == 38 and rows.tables.shape == (3, 3)
    device = [cuda.to_device(x) for x in (q, k_new, v_new)]  # the same buffers every layer
    got = {}
    for layer in (0, 1, 0):  # the rows' prepared gather serves every layer
        want = prefill_attention_batch(q, k_new, v_new, store, layer, *args, backend="numba").copy_to_host()
        got[layer] = prefill_attention_batch(*device, store, layer, None, None, None, None, backend="numba",
                                             rows=rows).copy_to_host()
        np.testing.assert_array_equal(got[layer], want)
    assert not np.array_equal(got[0], got[1])  # the layers differ: a gather of the wrong layer fails
    k_other = rng.standard_normal(k_new.shape).astype(np.float16)  # another buffer: prepared again
    want = prefill_attention_batch(q, k_other, v_new, store, 1, *args, backend="numba").copy_to_host()
    np.testing.assert_array_equal(prefill_attention_batch(
        device[0], cuda.to_device(k_other), device[2], store, 1, None, None, None, None, backend="numba",
        rows=rows).copy_to_host(), want)


@pytest.mark.parametrize("make,match", [
    (lambda store, args: BatchRows(store, 2, 3, *args), r"rows: made for another store or for batch 2 x n_max 3"),
    (lambda store, args: "rows", r"rows: expected a BatchRows or None, got str"),
])
def test_rows_of_another_batch_are_refused(make, match, rng):
    cfg = KVCacheConfig(num_layers=1, num_kv_heads=2, head_dim=64, block_size=16, kv_dtype="int4", group_size=32)
    store, tables, tails, q, k_new, v_new, _ = batch_case(cfg, [35, 16], [3, 3], 1, rng)
    args = (tables, np.array([35, 16], np.int32), tails, np.array([3, 3], np.int32))
    out = cuda.to_device(np.full((2, 2, 2, 64), np.nan, np.float16))
    with pytest.raises(HexcoreInvalidArgumentError, match=match):
        prefill_attention_batch(q[:, :2], k_new[:, :2], v_new[:, :2], store, 0, None, None, None, None, out=out,
                                backend="numba", rows=make(store, args))
    with pytest.raises(HexcoreInvalidArgumentError, match="rows: given with block_tables"):
        prefill_attention_batch(q, k_new, v_new, store, 0, *args, backend="numba",
                                rows=BatchRows(store, 2, 3, *args))
    assert np.isnan(out.copy_to_host()).all()


def test_rows_go_to_the_device_in_one_copy(rng, monkeypatch):
    # BatchRows' tables and packed (prefix_lens, tail_slots, n_new) share one upload: a copy
    # per forward (before: one each, two synchronous copies)
    cfg = KVCacheConfig(num_layers=1, num_kv_heads=2, head_dim=64, block_size=16, kv_dtype="fp16")
    store, tables, tails, *_ = batch_case(cfg, [35, 16], [3, 2], 1, rng)
    copies = []
    to_device = cuda.to_device
    monkeypatch.setattr(cuda, "to_device", lambda x, *a, **k: copies.append(x) or to_device(x, *a, **k))
    rows = BatchRows(store, 2, 3, tables, np.array([35, 16], np.int32), tails, np.array([3, 2], np.int32))
    assert len(copies) == 1
    np.testing.assert_array_equal(rows.packed.copy_to_host(), [[35, 16], tails, [3, 2]])
    np.testing.assert_array_equal(rows.tables.copy_to_host()[0, :2], tables[0, :2])
    assert (rows.tables.copy_to_host()[1, 1:] == 0).all()  # entries past a row's sealed blocks: zeroed


def rows_case(rng):
    """Two rows (one padded) of a 2-layer int4 store: (store, rows' host args, q, k_new, v_new)."""
    cfg = KVCacheConfig(num_layers=2, num_kv_heads=2, head_dim=64, block_size=16, kv_dtype="int4", group_size=32)
    store, tables, tails, q, k_new, v_new, _ = batch_case(cfg, [35, 16], [3, 2], 2, rng)
    return store, (tables, np.array([35, 16], np.int32), tails, np.array([3, 2], np.int32)), q, k_new, v_new


def test_rows_check_the_same_device_buffers_once(rng, monkeypatch):
    # every layer of a forward passes the same buffers: the first call checks them, the rest reuse
    import hexcore.cuda.attention.prefill as prefill

    store, args, q, k_new, v_new = rows_case(rng)
    rows = BatchRows(store, 2, 3, *args)
    device = [cuda.to_device(x) for x in (q, k_new, v_new)]
    out = cuda.to_device(np.full(q.shape, np.nan, np.float16))
    seen, checked = [], prefill.checked
    monkeypatch.setattr(prefill, "checked", lambda x, name, *a, **k: seen.append(name) or checked(x, name, *a, **k))
    want = {layer: prefill_attention_batch(q, k_new, v_new, store, layer, *args, backend="numba").copy_to_host()
            for layer in (0, 1)}  # (a call without rows checks all of its arguments)
    for call, layer in enumerate((0, 1, 0)):
        del seen[:]
        prefill_attention_batch(*device, store, layer, None, None, None, None, out=out, backend="numba", rows=rows)
        assert seen == ([] if call else ["k_new", "v_new", "q", "out"])
        np.testing.assert_array_equal(out.copy_to_host(), want[layer])
    prefill_attention_batch(*device, store, 0, None, None, None, None, backend="numba", rows=rows)  # out made here
    assert seen == []
    other = cuda.to_device(np.full(q.shape, np.nan, np.float16))  # another out: checked, the rest reused
    prefill_attention_batch(*device, store, 0, None, None, None, None, out=other, backend="numba", rows=rows)
    assert seen == ["out"]


def test_rows_still_refuse_bad_arguments_after_a_good_call(rng):
    store, args, q, k_new, v_new = rows_case(rng)
    rows = BatchRows(store, 2, 3, *args)

    def device(x):
        return cuda.to_device(np.ascontiguousarray(x))

    q_d, k_d, v_d = (device(x) for x in (q, k_new, v_new))
    out = device(np.full(q.shape, np.nan, np.float16))
    good = dict(q=q_d, k_new=k_d, v_new=v_d, store=store, layer=0, block_tables=None, prefix_lens=None,
                tail_slots=None, n_new=None, out=out, backend="numba", rows=rows)
    want = prefill_attention_batch(**good).copy_to_host()
    inside = store.v_tails.reshape(store.v_tails.size)[:q.size].reshape(q.shape)
    cases = [
        (dict(layer=2), r"layer: expected an int in \[0, 2\), got 2"),
        (dict(k_new=device(k_new.astype(np.float32))), "k_new: expected dtype float16, got float32"),
        (dict(v_new=device(v_new[:, :2])), r"v_new: expected shape \(2, 3, 2, 64\)"),
        (dict(q=device(q[:, :, :3])), "q: num_q_heads 3 is not a positive multiple of num_kv_heads 2"),
        (dict(out=device(np.zeros((2, 3, 4, 32), np.float16))), r"out: expected shape \(2, 3, 4, 64\)"),
        (dict(out=np.zeros(q.shape, np.float16)), "out: an output must be a device array"),
        (dict(out=inside), "out: lies inside the store's memory"),
        (dict(scale=-1.0), "scale: expected a positive finite number"),
        (dict(backend="flash"), "backend: expected one of"),
        (dict(n_new=args[3]), "rows: given with block_tables"),
    ]
    for change, message in cases:
        for _ in range(2):  # a failed check keeps nothing: the same call fails again
            with pytest.raises(HexcoreInvalidArgumentError, match=message):
                prefill_attention_batch(**{**good, **change})
    np.testing.assert_array_equal(prefill_attention_batch(**good).copy_to_host(), want)


def test_rows_copy_host_arrays_on_every_call(rng):
    # a host array is copied by each call: what it holds now is what is read, never a stale copy
    store, args, q, k_new, v_new = rows_case(rng)
    rows = BatchRows(store, 2, 3, *args)
    for _ in range(2):
        want = prefill_attention_batch(q, k_new, v_new, store, 0, *args, backend="numba").copy_to_host()
        got = prefill_attention_batch(q, k_new, v_new, store, 0, None, None, None, None, backend="numba", rows=rows)
        np.testing.assert_array_equal(got.copy_to_host(), want)
        q[...], k_new[...] = rng.standard_normal(q.shape), rng.standard_normal(k_new.shape)


def test_fingerprints_reuse_device_arrays_and_plain_objects_only():
    from hexcore.cuda.attention.prefill import _fingerprint

    assert _fingerprint(cuda.to_device(np.zeros(2, np.float16))) == ()
    assert _fingerprint("auto") == () and _fingerprint(None) == ()
    assert _fingerprint(np.zeros(2, np.float16)) is None  # copied by each call
    torch = pytest.importorskip("torch")
    assert _fingerprint(torch.zeros(2, dtype=torch.float16)) is None  # a host tensor


def test_sdpa_extend_batch_matches_the_rows_on_cpu(rng):
    torch = pytest.importorskip("torch")
    from hexcore.cuda.attention.prefill import sdpa_extend, sdpa_extend_batch

    prefix_lens, n_new, n_max, S_max = [5, 0, 9], [3, 2, 0], 3, 12
    q = torch.from_numpy(rng.standard_normal((3, n_max, 4, 16)).astype(np.float32))
    k = torch.from_numpy(rng.standard_normal((3, 2, S_max, 16)).astype(np.float32))
    v = torch.from_numpy(rng.standard_normal((3, 2, S_max, 16)).astype(np.float32))
    got = sdpa_extend_batch(q, k, v, torch.tensor(prefix_lens), torch.tensor(n_new))
    assert torch.isfinite(got).all()
    for r, (start, n) in enumerate(zip(prefix_lens, n_new)):
        if n:
            want = sdpa_extend(q[r, :n], k[r, :, :start + n], v[r, :, :start + n])
            torch.testing.assert_close(got[r, :n], want)


@pytest.mark.parametrize("prefix_lens,n_new", [([20, 20], [3, 3]), ([20, 4], [3, 3]), ([20, 20], [3, 1])])
def test_rows_mask_is_a_causal_bias_where_rows_are_alike(prefix_lens, n_new, rng):
    """BatchRows.mask: torch's lower-right causal bias where every row has the same prefix
    and n_max new tokens, else the boolean mask; SDPA gives the same rows either way."""
    torch = pytest.importorskip("torch")
    from torch.nn.attention.bias import CausalBias

    from hexcore.cuda import DeviceKVStore
    from hexcore.cuda.attention.prefill import _sdpa_masked, extend_mask

    cfg = KVCacheConfig(num_layers=1, num_kv_heads=2, head_dim=64, block_size=16)
    store = DeviceKVStore(cfg, num_blocks=2, max_seqs=2)
    rows = BatchRows(store, 2, 3, np.zeros((2, 2), np.int32), np.array(prefix_lens, np.int32), np.zeros(2, np.int32),
                     np.array(n_new, np.int32))
    alike = len(set(prefix_lens)) == 1 and set(n_new) == {3}
    assert isinstance(rows.mask("cpu"), CausalBias) == alike
    q = torch.from_numpy(rng.standard_normal((2, 3, 4, 64)).astype(np.float32))
    k, v = (torch.from_numpy(rng.standard_normal((2, 2, rows.S_max, 64)).astype(np.float32)) for _ in range(2))
    got = _sdpa_masked(q, k, v, rows.mask("cpu"), None)
    want = _sdpa_masked(q, k, v, extend_mask(*rows.lengths("cpu"), 3, rows.S_max), None)
    for r, n in enumerate(n_new):
        torch.testing.assert_close(got[r, :n], want[r, :n])


@pytest.mark.parametrize("change,match", [
    (dict(prefix_lens=np.array([35, -1], np.int32)), r"prefix_lens\[1\] = -1"),
    (dict(n_new=np.array([3, 4], np.int32)), r"n_new\[1\] = 4 is outside \[0, 3\]"),
    (dict(n_new=[3, 3]), "n_new: expected a host int32 array"),
    (dict(tail_slots=np.array([9, 0], np.int32)), r"tail_slots\[0\] = 9"),
    (dict(block_tables=np.zeros((2, 1), np.int32)), r"block_tables: expected .* \(2, >= 2\)"),
    (dict(block_tables=np.full((2, 3), 99, np.int32)), r"block_tables\[0, 0\] = 99"),
])
def test_batch_arguments_are_checked_before_anything_runs(change, match, rng):
    cfg = KVCacheConfig(num_layers=1, num_kv_heads=2, head_dim=64, block_size=16, kv_dtype="int4", group_size=32)
    store, tables, tails, q, k_new, v_new, _ = batch_case(cfg, [35, 16], [3, 3], 1, rng)
    args = dict(block_tables=tables, prefix_lens=np.array([35, 16], np.int32), tail_slots=tails,
                n_new=np.array([3, 3], np.int32))
    args.update(change)
    out = cuda.to_device(np.full(q.shape, np.nan, np.float16))
    with pytest.raises(HexcoreInvalidArgumentError, match=match):
        prefill_attention_batch(q, k_new, v_new, store, 0, out=out, backend="numba", **args)
    assert np.isnan(out.copy_to_host()).all()


# -- GPU --------------------------------------------------------------------------------
GPU_CASES = [(dtype, head_dim, group, prefix_len, n_new)
             for dtype in ("fp16", "int4", "int2")
             for head_dim, group, prefix_len, n_new in ((128, 4, 2048, 64), (64, 1, 333, 200), (128, 3, 16, 1))]


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["numba", "sdpa"])
@pytest.mark.parametrize("dtype,head_dim,group,prefix_len,n_new", GPU_CASES)
def test_prefill_matches_reference_gpu(backend, dtype, head_dim, group, prefix_len, n_new, rng):
    if backend == "sdpa":
        pytest.importorskip("torch")
    cfg = KVCacheConfig(num_layers=1, num_kv_heads=2, head_dim=head_dim, block_size=32, kv_dtype=dtype,
                        group_size=64)
    check_prefill(cfg, prefix_len, n_new, group, rng, backend)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["numba", "sdpa"])
@pytest.mark.parametrize("dtype", ["fp16", "int4", "int2"])
@pytest.mark.parametrize("prefix_lens,n_new", [([2048, 333, 0, 64], [64, 200, 17, 0]),  # ragged: the boolean mask
                                               ([700, 700], [48, 48])])  # rows alike: SDPA's causal bias
def test_a_batch_matches_the_reference_gpu(backend, dtype, prefix_lens, n_new, rng):
    if backend == "sdpa":
        pytest.importorskip("torch")
    cfg = KVCacheConfig(num_layers=1, num_kv_heads=2, head_dim=128, block_size=32, kv_dtype=dtype, group_size=64)
    store, tables, tails, q, k_new, v_new, expect = batch_case(cfg, prefix_lens, n_new, 4, rng)
    B = len(n_new)
    out = cuda.to_device(np.full(q.shape, np.nan, np.float16))
    prefill_attention_batch(q, k_new, v_new, store, 0, tables, np.array(prefix_lens, np.int32), tails,
                            np.array(n_new, np.int32), out=out, backend=backend)
    got = out.copy_to_host()
    for r, n in enumerate(n_new):
        assert not np.isnan(got[r, :n]).any()
        if n:
            assert ref.relative_l2(got[r, :n], expect[r]) <= TOLERANCE, r
    # through BatchRows, twice on the same buffers (its scratch, mask and prepared gather reused)
    rows = BatchRows(store, B, max(n_new), tables, np.array(prefix_lens, np.int32), tails, np.array(n_new, np.int32))
    device = [cuda.to_device(x) for x in (q, k_new, v_new)]
    for _ in range(2):
        again = cuda.to_device(np.full(q.shape, np.nan, np.float16))
        prefill_attention_batch(*device, store, 0, None, None, None, None, out=again, backend=backend, rows=rows)
        for r, n in enumerate(n_new):
            np.testing.assert_array_equal(again.copy_to_host()[r, :n], got[r, :n])


@pytest.mark.gpu
def test_a_batch_of_tensors_through_rows_gpu(rng):
    # the transformers integration's path: q a CUDA tensor, k/v numba views of tensors, one
    # BatchRows for every call (checks reused), out None (SDPA's own output where the launch
    # stream is torch's current one, else a new tensor) or given; on a side stream too
    torch = pytest.importorskip("torch")
    cfg = KVCacheConfig(num_layers=1, num_kv_heads=2, head_dim=128, block_size=32, kv_dtype="int4", group_size=64)
    prefix_lens, n_new = [700, 333], [48, 17]
    store, tables, tails, q, k_new, v_new, expect = batch_case(cfg, prefix_lens, n_new, 4, rng)
    rows = BatchRows(store, 2, 48, tables, np.array(prefix_lens, np.int32), tails, np.array(n_new, np.int32))
    tq, tk, tv = (torch.from_numpy(x).cuda() for x in (q, k_new, v_new))
    k_view, v_view = cuda.as_cuda_array(tk), cuda.as_cuda_array(tv)
    side = torch.cuda.Stream()
    for stream in (None, torch.cuda.current_stream(), side, None):
        for out in (None, torch.full_like(tq, float("nan"))):
            torch.cuda.synchronize()
            got = prefill_attention_batch(tq, k_view, v_view, store, 0, None, None, None, None, out=out,
                                          backend="sdpa", stream=stream, rows=rows)
            torch.cuda.synchronize()
            assert got is out if out is not None else (isinstance(got, torch.Tensor) and got.is_contiguous())
            assert got.dtype == torch.float16 and got.shape == tq.shape
            for r, n in enumerate(n_new):
                assert ref.relative_l2(got[r, :n].cpu().numpy(), expect[r]) <= TOLERANCE, (stream, r)


@pytest.mark.gpu
def test_prefill_with_torch_tensors_runs_on_the_current_stream(rng):
    torch = pytest.importorskip("torch")
    cfg = KVCacheConfig(num_layers=1, num_kv_heads=2, head_dim=128, block_size=32, kv_dtype="int4", group_size=64)
    store, table, slot, keys, values, q, k_new, v_new = make_case(cfg, 100, 30, 4, rng)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        tq, tk, tv = (torch.from_numpy(x).cuda() for x in (q, k_new, v_new))
        for backend in ("numba", "sdpa"):
            out = prefill_attention(tq, tk, tv, store, 0, table, 100, slot, backend=backend)
            assert isinstance(out, torch.Tensor)
            got = out.cpu().numpy()
            expect = extend_reference(q, keys, values, k_new, v_new, 1 / math.sqrt(128))
            assert ref.relative_l2(got, expect) <= TOLERANCE


@pytest.mark.gpu
def test_prefill_behind_a_busy_default_stream_gpu(rng):
    # torch's default stream passed explicitly while a long matmul chain is still queued on
    # it: the gather and SDPA must wait for it and for each other. Wrapping handle 0 in
    # torch.cuda.ExternalStream gave garbage here under load (H200, 2026-12-01, session 4).
    torch = pytest.importorskip("torch")
    cfg = KVCacheConfig(num_layers=1, num_kv_heads=2, head_dim=128, block_size=32, kv_dtype="fp16")
    store, table, slot, keys, values, q, k_new, v_new = make_case(cfg, 80, 16, 4, rng)
    tq, tk, tv = (torch.from_numpy(x).cuda() for x in (q, k_new, v_new))
    busy = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    expect = extend_reference(q, keys, values, k_new, v_new, 1 / math.sqrt(128))
    for _ in range(3):
        for _ in range(50):  # tens of ms queued ahead of the prefill
            busy = (busy @ busy).clamp_(-1, 1)
        out = prefill_attention(tq, tk, tv, store, 0, table, 80, slot, backend="sdpa",
                                stream=torch.cuda.current_stream())
        assert ref.relative_l2(out.cpu().numpy(), expect) <= TOLERANCE
