"""Device store and write path: append, seal (KIVI quantization), copy, dequantize."""

import numpy as np
import pytest
from numba import cuda

from hexcore import HexcoreError, HexcoreInvalidArgumentError, KVCacheConfig, KVDtype
from hexcore.cuda import (
    DeviceKVStore,
    append,
    copy_blocks,
    copy_tails,
    dequantize_blocks,
    prepare_append,
    prepare_copy_blocks,
    prepare_copy_tails,
    prepare_seal,
    seal,
    seal_rows,
)
from tests import reference as ref

# two heads for INT4 (head offsets), one for the others: the simulator runs a thread per CUDA thread
SIM_CONFIGS = [KVCacheConfig(num_layers=2, num_kv_heads=2 if d is KVDtype.INT4 else 1, head_dim=64, block_size=16,
                             kv_dtype=d, group_size=32) for d in KVDtype]
GPU_CONFIGS = [KVCacheConfig(num_layers=2, num_kv_heads=8, head_dim=128, block_size=b, kv_dtype=d, group_size=64)
               for d in KVDtype for b in (16, 32, 64)] + [  # tails too large to stage in shared memory
    KVCacheConfig(num_layers=2, num_kv_heads=2, head_dim=128, block_size=128, kv_dtype=KVDtype.INT4, group_size=64)]


def ids(cfg):
    return f"{cfg.kv_dtype.value}-bs{cfg.block_size}-d{cfg.head_dim}"


def fill_tails(store, rng, slots, layer=None):
    """Append a full block of fresh random tokens to each slot; returns host K, V [L, S, H, BS, D]."""
    cfg = store.config
    L = cfg.num_layers
    shape = (L, len(slots), cfg.num_kv_heads, cfg.block_size, cfg.head_dim)
    k = rng.standard_normal(shape).astype(np.float16)
    v = rng.standard_normal(shape).astype(np.float16)
    for pos in rng.permutation(cfg.block_size):  # any order of positions
        kt = np.ascontiguousarray(k[:, :, :, pos])
        vt = np.ascontiguousarray(v[:, :, :, pos])
        positions = np.full(len(slots), pos, np.int32)
        if layer is None:
            append(store, kt, vt, np.array(slots, np.int32), positions)
        else:
            for l in range(L):
                append(store, kt[l], vt[l], np.array(slots, np.int32), positions, layer=l)
    return k, v


def snapshot(store):
    return {name: a.copy_to_host() for name, a in store.arrays.items()}


def check_roundtrip(cfg, seed, layer_mode):
    rng = np.random.default_rng(seed)
    store = DeviceKVStore(cfg, num_blocks=5, max_seqs=4)
    store.poison()
    slots, blocks = [2, 0], [3, 1]
    k, v = fill_tails(store, rng, slots, layer=layer_mode)
    host = snapshot(store)
    # appended slots hold exactly the tokens; untouched slots stay NaN
    np.testing.assert_array_equal(host["k_tails"][:, slots], k)
    np.testing.assert_array_equal(host["v_tails"][:, slots], v)
    assert np.isnan(host["k_tails"][:, [1, 3]]).all() and np.isnan(host["v_tails"][:, [1, 3]]).all()

    if layer_mode is None:
        seal(store, np.array(slots, np.int32), np.array(blocks, np.int32))
    else:
        for l in range(cfg.num_layers):
            seal(store, np.array(slots, np.int32), np.array(blocks, np.int32), layer=l)
    host = snapshot(store)
    untouched = [0, 2, 4]
    if cfg.kv_dtype is KVDtype.FP16:
        np.testing.assert_array_equal(host["k_codes"][:, blocks], k)  # bit-exact copy
        np.testing.assert_array_equal(host["v_codes"][:, blocks], v)
        assert np.isnan(host["k_codes"][:, untouched]).all()
    else:
        bits = cfg.kv_dtype.bits
        for l in range(cfg.num_layers):
            for j, b in enumerate(blocks):
                kc, km = ref.quantize_keys(k[l, j], bits)
                vc, vm = ref.quantize_values(v[l, j], bits, cfg.group_size)
                np.testing.assert_array_equal(host["k_codes"][l, b], kc)
                np.testing.assert_array_equal(host["k_meta"][l, b], km)
                np.testing.assert_array_equal(host["v_codes"][l, b], vc)
                np.testing.assert_array_equal(host["v_meta"][l, b], vm)
                dk, dv = (a.copy_to_host()[0] for a in dequantize_blocks(store, l, np.array([b], np.int32)))
                np.testing.assert_allclose(dk, ref.dequantize_keys(kc, km, bits), rtol=2e-3, atol=2e-3)
                np.testing.assert_allclose(dv, ref.dequantize_values(vc, vm, bits, cfg.group_size),
                                           rtol=2e-3, atol=2e-3)
        assert (host["k_codes"][:, untouched] == 0xFF).all() and np.isnan(host["k_meta"][:, untouched]).all()
        assert np.isnan(host["v_meta"][:, untouched]).all()
    return store


ROUNDTRIPS = [(cfg, None) for cfg in SIM_CONFIGS] + [(SIM_CONFIGS[1], "each")]


@pytest.mark.parametrize("cfg,layer_mode", ROUNDTRIPS, ids=[f"{ids(c)}-{m or 'all'}" for c, m in ROUNDTRIPS])
def test_append_seal_roundtrip(cfg, layer_mode, seed):
    check_roundtrip(cfg, seed, None if layer_mode is None else 0)


def test_seal_without_staging_in_shared_memory(monkeypatch, seed):
    """The quantizing seal reads a head's tail from global memory when it is too large to
    stage: the same round trip."""
    from hexcore.cuda import write

    monkeypatch.setattr(write, "STAGE_BYTES", 0)
    write._seal_quantized_kernel.cache_clear()
    try:
        check_roundtrip(SIM_CONFIGS[1], seed, None)
    finally:
        write._seal_quantized_kernel.cache_clear()


def check_seal_rows(cfg, seed, layer=None, nan=False):
    """seal_rows of a prompt's full blocks writes the bytes that appending those rows into
    tails and sealing them writes, and touches no tail; with a NaN, the same flags."""
    rng = np.random.default_rng(seed)
    L, BS, first_row, blocks = cfg.num_layers, cfg.block_size, 3, np.array([4, 1], np.int32)
    n = first_row + len(blocks) * BS + 5
    shape = (L, n, cfg.num_kv_heads, cfg.head_dim)
    k, v = rng.standard_normal(shape).astype(np.float16), rng.standard_normal(shape).astype(np.float16)
    if nan:
        k[-1, first_row + BS + 2, 0, 1] = np.nan  # block 1 of the last layer
    layers = range(L) if layer is None else [layer]
    src = (k, v) if layer is None else (np.ascontiguousarray(k[layer]), np.ascontiguousarray(v[layer]))
    flags = {}
    stores = {}
    for path in ("tails", "rows"):
        store = DeviceKVStore(cfg, num_blocks=6, max_seqs=len(blocks))
        store.poison()
        flags[path] = cuda.to_device(np.full((len(layers), len(blocks)), 7, np.int32))
        if path == "tails":
            for i in range(len(blocks)):
                append(store, *src, np.full(BS, i, np.int32), np.arange(BS, dtype=np.int32), layer=layer,
                       rows=(first_row + i * BS, BS))
            seal(store, np.arange(len(blocks), dtype=np.int32), blocks, layer=layer, nonfinite=flags[path])
        else:
            seal_rows(store, *src, first_row, blocks, layer=layer, nonfinite=flags[path])
        stores[path] = snapshot(store)
    tails, rows = stores["tails"], stores["rows"]
    for name in rows:  # every block, layer and guard word alike: only the tails differ
        if not name.endswith("tails"):
            np.testing.assert_array_equal(rows[name].view(np.uint8), tails[name].view(np.uint8), err_msg=name)
    assert np.isnan(rows["k_tails"]).all() and np.isnan(rows["v_tails"]).all()  # no tail touched
    np.testing.assert_array_equal(flags["rows"].copy_to_host(), flags["tails"].copy_to_host())
    assert flags["rows"].copy_to_host().sum() == (1 if nan and (layer is None or layer == L - 1) else 0)


@pytest.mark.parametrize("cfg", SIM_CONFIGS, ids=ids)
@pytest.mark.parametrize("layer", [None, 1], ids=["all", "layer1"])
def test_seal_rows_writes_what_append_and_seal_write(cfg, layer, seed):
    check_seal_rows(cfg, seed, layer, nan=True)


def test_seal_rows_without_staging_in_shared_memory(monkeypatch, seed):
    from hexcore.cuda import write

    monkeypatch.setattr(write, "STAGE_BYTES", 0)
    write._seal_quantized_kernel.cache_clear()
    try:
        check_seal_rows(SIM_CONFIGS[1], seed)
    finally:
        write._seal_quantized_kernel.cache_clear()


@pytest.mark.parametrize("call,match", [
    (dict(first_row=-1), "first_row"), (dict(first_row=30), "first_row"),
    (dict(first_row=5), "need 37 rows, k has 36"), (dict(blocks=[1, 1]), "block_ids"),
    (dict(blocks=[1, 9]), "block_ids"), (dict(rows=35), "v: expected"),
])
def test_seal_rows_refuses_bad_arguments_and_writes_nothing(call, match, seed):
    cfg = SIM_CONFIGS[1]
    store = DeviceKVStore(cfg, num_blocks=6, max_seqs=2)
    store.poison()
    before = snapshot(store)
    rng = np.random.default_rng(seed)
    shape = (cfg.num_layers, 36, cfg.num_kv_heads, cfg.head_dim)
    k = rng.standard_normal(shape).astype(np.float16)
    v = k[:, :call["rows"]].copy() if "rows" in call else k.copy()
    with pytest.raises(HexcoreInvalidArgumentError, match=match):
        seal_rows(store, k, v, call.get("first_row", 0), np.array(call.get("blocks", [1, 2]), np.int32))
    after = snapshot(store)
    for name in before:
        np.testing.assert_array_equal(after[name].view(np.uint8), before[name].view(np.uint8))


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", GPU_CONFIGS, ids=ids)
def test_append_seal_roundtrip_gpu(cfg, seed):
    check_roundtrip(cfg, seed, None)
    check_roundtrip(cfg, seed + 1, 0)


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", GPU_CONFIGS, ids=ids)
def test_seal_rows_writes_what_append_and_seal_write_gpu(cfg, seed):
    check_seal_rows(cfg, seed, None, nan=True)
    check_seal_rows(cfg, seed + 1, 1)


@pytest.mark.parametrize("cfg", SIM_CONFIGS, ids=ids)
def test_store_memory_equals_config(cfg):
    store = DeviceKVStore(cfg, num_blocks=7, max_seqs=3)
    assert store.nbytes == cfg.total_bytes(7, 3)


@pytest.mark.parametrize("cfg", SIM_CONFIGS[:2], ids=ids)
def test_copy_blocks_and_tails(cfg, seed):
    store = check_roundtrip(cfg, seed, None)
    before = snapshot(store)
    copy_blocks(store, np.array([3, 1], np.int32), np.array([0, 4], np.int32))
    copy_tails(store, np.array([2], np.int32), np.array([1], np.int32))
    after = snapshot(store)
    for name in ("k_codes", "v_codes", "k_meta", "v_meta"):
        if name in after:
            np.testing.assert_array_equal(after[name][:, [0, 4]], before[name][:, [3, 1]])
            np.testing.assert_array_equal(after[name][:, [1, 2, 3]], before[name][:, [1, 2, 3]])
    np.testing.assert_array_equal(after["k_tails"][:, 1], before["k_tails"][:, 2])
    np.testing.assert_array_equal(after["v_tails"][:, [0, 2, 3]], before["v_tails"][:, [0, 2, 3]])


@pytest.mark.parametrize("cfg", SIM_CONFIGS[:2], ids=ids)
def test_prepared_launches_equal_eager_and_skip_padding_rows(cfg, seed):
    """prepare_* bound to device rows where -1 marks padding: the same bytes as eager calls."""
    stores = [DeviceKVStore(cfg, num_blocks=5, max_seqs=4) for _ in range(2)]
    for store in stores:
        store.poison()
        fill_tails(store, np.random.default_rng(seed), [2, 0])
    token = np.random.default_rng(seed + 1).standard_normal((cfg.num_layers, 3, cfg.num_kv_heads, cfg.head_dim))
    token = token.astype(np.float16)
    eager, prepared = stores
    seal(eager, np.array([2, 0], np.int32), np.array([3, 1], np.int32))
    copy_tails(eager, np.array([2], np.int32), np.array([1], np.int32))
    copy_blocks(eager, np.array([3], np.int32), np.array([4], np.int32))
    append(eager, np.ascontiguousarray(token[:, 1:2]), np.ascontiguousarray(token[:, 1:2]), np.array([2], np.int32),
           np.array([5], np.int32))
    rows = {name: cuda.to_device(np.array(ids, np.int32)) for name, ids in {
        "seal_slots": [2, -1, 0], "seal_blocks": [3, -1, 1], "tail_src": [-1, 2], "tail_dst": [-1, 1], "block_src": [3, -1],
        "block_dst": [4, -1], "slots": [-1, 2, 3], "positions": [4, 5, -1]}.items()}  # slot 3: position -1 is skipped too
    token_d = cuda.to_device(token)
    launches = [prepare_seal(prepared, rows["seal_slots"], rows["seal_blocks"]),
                prepare_copy_tails(prepared, rows["tail_src"], rows["tail_dst"]),
                prepare_copy_blocks(prepared, rows["block_src"], rows["block_dst"]),
                prepare_append(prepared, token_d, token_d, rows["slots"], rows["positions"])]
    for launch in launches:
        launch.run()
    after = snapshot(prepared)
    for name, array in snapshot(eager).items():
        np.testing.assert_array_equal(after[name].view(np.uint8), array.view(np.uint8), err_msg=name)
    with pytest.raises(HexcoreInvalidArgumentError, match="host numpy array"):
        prepare_seal(prepared, np.array([0], np.int32), rows["seal_blocks"][:1])
    with pytest.raises(HexcoreInvalidArgumentError, match="at least one"):
        prepare_copy_tails(prepared, rows["tail_src"][:0], rows["tail_dst"][:0])


def bad_calls(store):
    cfg = store.config
    H, D = cfg.num_kv_heads, cfg.head_dim
    tok = np.zeros((1, H, D), np.float16)
    one = np.array([0], np.int32)
    return {
        "k dtype": lambda: append(store, tok.astype(np.float32), tok, one, one, layer=0),
        "k shape": lambda: append(store, np.zeros((1, H, D + 8), np.float16), tok, one, one, layer=0),
        "v shape": lambda: append(store, tok, np.zeros((2, H, D), np.float16), one, one, layer=0),
        "strides": lambda: append(store, cuda.to_device(np.zeros((1, H, 2 * D), np.float16))[:, :, ::2], tok, one,
                                  one, layer=0),
        "position": lambda: append(store, tok, tok, one, np.array([cfg.block_size], np.int32), layer=0),
        "slot": lambda: append(store, tok, tok, np.array([store.max_seqs], np.int32), one, layer=0),
        "slot dtype": lambda: append(store, tok, tok, one.astype(np.int64), one, layer=0),
        "layer": lambda: append(store, tok, tok, one, one, layer=cfg.num_layers),
        "all layers shape": lambda: append(store, tok, tok, one, one),
        "seal block": lambda: seal(store, one, np.array([store.num_blocks], np.int32)),
        "seal negative": lambda: seal(store, np.array([-1], np.int32), one),
        "seal duplicate": lambda: seal(store, np.array([0, 1], np.int32), np.array([2, 2], np.int32)),
        "copy range": lambda: copy_blocks(store, one, np.array([-3], np.int32)),
        "copy duplicate": lambda: copy_tails(store, np.array([0, 1], np.int32), np.array([2, 2], np.int32)),
        "dequantize layer": lambda: dequantize_blocks(store, -1, one),
        "wrong device": lambda: append(store, [1, 2], tok, one, one, layer=0),
    }


@pytest.mark.parametrize("case", list(bad_calls(DeviceKVStore(SIM_CONFIGS[1], 3, 2))))
def test_bad_input_raises_before_any_write(case):
    store = DeviceKVStore(SIM_CONFIGS[1], num_blocks=3, max_seqs=2)
    store.poison()
    before = snapshot(store)
    with pytest.raises(HexcoreInvalidArgumentError) as info:
        bad_calls(store)[case]()
    assert isinstance(info.value, HexcoreError) and str(info.value)
    after = snapshot(store)
    for name in before:
        np.testing.assert_array_equal(before[name].view(np.uint8), after[name].view(np.uint8))


@pytest.mark.parametrize("bits", [4, 2])
def test_per_channel_keys_beat_per_token_on_outliers(bits, record_property, rng):
    """KIVI's reason for per-channel keys, measured on Gaussian keys with 10x outlier channels."""
    H, BS, D, G = 4, 32, 128, 64
    k = rng.standard_normal((H, BS, D)).astype(np.float32)
    gauss = k.astype(np.float16)
    k[:, :, rng.choice(D, 4, replace=False)] *= 10
    outlier = k.astype(np.float16)
    errors = {}
    for name, data in (("gaussian", gauss), ("outliers", outlier)):
        per_channel = ref.dequantize_keys(*ref.quantize_keys(data, bits), bits)
        per_token = ref.quantize_keys_per_token(data, bits, G)
        errors[name] = (ref.relative_l2(per_channel, data), ref.relative_l2(per_token, data))
        record_property(f"int{bits}_{name}_rel_l2_per_channel_per_token", errors[name])
    assert errors["outliers"][0] < errors["outliers"][1]


def test_size_one_axes_with_odd_strides_are_contiguous():
    from hexcore.cuda.arrays import _c_contiguous

    assert _c_contiguous((1, 128), (0, 4), 4) and _c_contiguous((3, 1, 8), (8, 999, 1), 1)
    assert not _c_contiguous((2, 128), (0, 4), 4) and not _c_contiguous((4, 8), (1, 4), 1)


def test_copy_errors_name_the_parameters():
    store = DeviceKVStore(SIM_CONFIGS[1], num_blocks=3, max_seqs=2)
    one = np.array([0], np.int32)
    with pytest.raises(HexcoreInvalidArgumentError, match=r"src_slots\[0\] = 9"):
        copy_tails(store, np.array([9], np.int32), one)
    with pytest.raises(HexcoreInvalidArgumentError, match=r"dst_blocks\[0\] = 7"):
        copy_blocks(store, one, np.array([7], np.int32))


# -- non-finite K/V: the seal never faults, stores NaN groups and reports them -----------------
def test_quantizer_never_converts_a_non_finite_value():
    """``_quantize`` (called as Python: the simulator's path) on NaN, +-inf and extreme
    finite values: codes in [0, levels], equal to floor-and-clamp wherever that is defined."""
    from hexcore.cuda.write import _quantize

    quantize = _quantize.py_func
    f = np.float32
    for levels in (3, 15):
        assert quantize(f("nan"), f(0.1), f(0), levels) == 0
        assert quantize(f("inf"), f(0.1), f(0), levels) == levels
        assert quantize(f("-inf"), f(0.1), f(0), levels) == 0
        assert quantize(f(1), f("nan"), f(0), levels) == 0
        assert quantize(f(1), f(0.1), f("nan"), levels) == 0
        assert quantize(f(1), f(0), f(0), levels) == 0
        assert quantize(f(65504), f(6e-8), f(-65504), levels) == levels
        x = np.linspace(-2, 3, 1001, dtype=np.float32)
        scale, lo = f(0.25), f(-1)
        want = np.clip(np.floor((x - lo) / scale + f(0.5)), 0, levels)
        assert [quantize(v, scale, lo, levels) for v in x] == want.astype(int).tolist()


def expected_nonfinite_seal(k, v, bits, group_size):
    """The seal's policy for one block ``k``, ``v`` [H, BS, D] float16 that may hold NaN or
    infinities: the reference quantization of every finite group; a group holding a
    non-finite value gets NaN scale and min and codes 0. Returns (kc, km, vc, vm)."""
    H, BS, D = k.shape
    bad_k = ~np.isfinite(k).all(axis=1)  # [H, D]: a key group is a channel over the tokens
    groups = v.reshape(H, BS, D // group_size, group_size)
    bad_v = ~np.isfinite(groups).all(axis=-1)  # [H, BS, NG]
    kc, km = ref.quantize_keys(np.where(np.isfinite(k), k, 0).astype(np.float16), bits)
    vc, vm = ref.quantize_values(np.where(np.isfinite(v), v, 0).astype(np.float16), bits, group_size)
    codes = ref.unpack_key_rows(kc, bits)
    codes[np.broadcast_to(bad_k[:, None, :], codes.shape)] = 0
    kc = ref.pack_key_rows(codes, bits)
    km[np.broadcast_to(bad_k[:, None, :], km.shape)] = np.nan
    codes = ref.unpack_value_block(vc, bits, group_size)
    codes[np.repeat(bad_v, group_size, axis=-1)] = 0
    vc = ref.pack_value_block(codes, bits, group_size)
    vm[np.broadcast_to(bad_v[:, :, None, :], vm.shape)] = np.nan
    return kc, km, vc, vm


def check_nonfinite_seal(cfg, seed):
    """Seal rows with NaN, +inf and -inf in K and V at layer 0 (row 0) and finite ones
    elsewhere, with a padding row: bytes as the policy says, flags 1 exactly where a row
    held a non-finite value, 0 for the padding row (pre-filled with 7)."""
    from hexcore.cuda.write import nonfinite_flags

    rng = np.random.default_rng(seed)
    store = DeviceKVStore(cfg, num_blocks=5, max_seqs=4)
    store.poison()
    H, BS, D = cfg.num_kv_heads, cfg.block_size, cfg.head_dim
    k, v = fill_tails(store, rng, [2, 0])
    k[0, 0, 0, 3, 5], k[0, 0, H - 1, 0, D - 1], v[0, 0, 0, BS - 1, 7] = np.nan, np.inf, -np.inf
    v[0, 0, H - 1, 2, D // 2] = np.nan
    for t in (3, 0, BS - 1, 2):  # rewrite the poisoned tokens of layer 0, row 0 (slot 2)
        append(store, np.ascontiguousarray(k[0, 0, :, t])[None], np.ascontiguousarray(v[0, 0, :, t])[None],
               np.array([2], np.int32), np.array([t], np.int32), layer=0)
    flags = nonfinite_flags(store, 3)
    flags.copy_to_device(np.full((cfg.num_layers, 3), 7, np.int32))
    seal(store, cuda.to_device(np.array([2, 0, -1], np.int32)), cuda.to_device(np.array([3, 1, -1], np.int32)),
         nonfinite=flags)
    want_flags = np.zeros((cfg.num_layers, 3), np.int32)
    want_flags[0, 0] = 1
    np.testing.assert_array_equal(flags.copy_to_host(), want_flags)
    host = snapshot(store)
    for l in range(cfg.num_layers):
        for j, b in enumerate([3, 1]):
            if cfg.kv_dtype is KVDtype.FP16:  # a copy: NaN and infinities kept, bit for bit
                np.testing.assert_array_equal(host["k_codes"][l, b].view(np.uint16), k[l, j].view(np.uint16))
                np.testing.assert_array_equal(host["v_codes"][l, b].view(np.uint16), v[l, j].view(np.uint16))
                continue
            kc, km, vc, vm = expected_nonfinite_seal(k[l, j], v[l, j], cfg.kv_dtype.bits, cfg.group_size)
            np.testing.assert_array_equal(host["k_codes"][l, b], kc)
            np.testing.assert_array_equal(host["k_meta"][l, b], km)
            np.testing.assert_array_equal(host["v_codes"][l, b], vc)
            np.testing.assert_array_equal(host["v_meta"][l, b], vm)
    if cfg.kv_dtype is not KVDtype.FP16:
        assert np.isnan(host["k_meta"][0, 3]).sum() == 4 and np.isnan(host["v_meta"][0, 3]).sum() == 4  # 2 groups each
    # without flags: the same bytes (the report changes nothing else)
    again = DeviceKVStore(cfg, num_blocks=5, max_seqs=4)
    again.poison()
    for name, array in again.arrays.items():
        if "tails" in name:
            array.copy_to_device(store.arrays[name].copy_to_host())
    seal(again, np.array([2, 0], np.int32), np.array([3, 1], np.int32))
    for name, array in snapshot(again).items():
        np.testing.assert_array_equal(array.view(np.uint8), host[name].view(np.uint8), err_msg=name)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the simulator's inf - inf
@pytest.mark.parametrize("cfg", SIM_CONFIGS, ids=ids)
def test_seal_of_non_finite_values_stores_nan_groups_and_reports_them(cfg, seed):
    check_nonfinite_seal(cfg, seed)


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", GPU_CONFIGS, ids=ids)
def test_seal_of_non_finite_values_gpu(cfg, seed):
    check_nonfinite_seal(cfg, seed)


def test_nonfinite_flags_are_checked():
    from hexcore.cuda.write import nonfinite_flags, prepare_seal

    store = DeviceKVStore(SIM_CONFIGS[1], num_blocks=3, max_seqs=2)
    one = np.array([0], np.int32)
    for bad, match in [(np.zeros((2, 1), np.int32), "host numpy array"), (cuda.to_device(np.zeros((1, 1), np.int32)),
                                                                            r"shape \(2, 1\)"),
                       (cuda.to_device(np.zeros((2, 1), np.int64)), "dtype int32"), ("x", "got str")]:
        with pytest.raises(HexcoreInvalidArgumentError, match=f"nonfinite: .*{match}"):
            seal(store, one, one, nonfinite=bad)
    with pytest.raises(HexcoreInvalidArgumentError, match="nonfinite: lies inside"):
        seal(store, one, one, layer=0, nonfinite=store.arrays["k_codes"].reshape(-1).view(np.int32)[:1].reshape(1, 1))
    assert nonfinite_flags(store, 3).shape == (2, 3) and nonfinite_flags(store, 3, layer=1).shape == (1, 3)
    with pytest.raises(HexcoreInvalidArgumentError, match="host numpy array"):
        prepare_seal(store, cuda.to_device(one), cuda.to_device(one), nonfinite=np.zeros((2, 1), np.int32))


# -- fitted keys (hexcore.quant.KVFormat.fitted_keys) ------------------------------------------------
def expected_fitted_seal(k, v, group_size):
    """An INT2 block sealed with fitted keys: ``tests/reference.fit_key_params`` for every
    finite key channel, the non-finite policy's NaN pair and codes 0 for the others; values
    as the plain seal. Returns (kc, km, vc, vm)."""
    bad = ~np.isfinite(k).all(axis=1)  # [H, D]
    finite = np.where(np.isfinite(k), k, 0).astype(np.float16)
    scale, lo = ref.fit_key_params(finite, 2)
    scale, lo = np.where(bad, np.nan, scale).astype(np.float16), np.where(bad, np.nan, lo).astype(np.float16)
    codes = ref.quantize(finite.astype(np.float32), scale[:, None], lo[:, None], 2)
    codes[np.broadcast_to(bad[:, None, :], codes.shape)] = 0
    _, _, vc, vm = expected_nonfinite_seal(k, v, 2, group_size)
    return ref.pack_key_rows(codes, 2), np.stack([scale, lo], axis=1), vc, vm


def half_bits(x):
    """The bits of float16 ``x`` with every NaN as one pattern: a NaN's payload is not part
    of the stored format (a GPU converts a float32 NaN to 0x7FFF, numpy to 0x7E00)."""
    return np.where(np.isnan(x), np.float16(np.nan), x).astype(np.float16).view(np.uint16)


def fitted_test_keys(rng, shape):
    """K [..., H, BS, D] float16: channels of many scales and offsets, a constant channel,
    one spanning float16's range (its fitted min overflows: the extremes' pair is kept),
    and a NaN (its channel keeps the NaN pair)."""
    k = (rng.standard_normal(shape) * rng.uniform(0.01, 30, shape[-1]) + rng.uniform(-5, 5, shape[-1]))
    k[..., 1] = 0.75
    k[..., 2] = np.where(np.arange(shape[-2]) % 2, 60000.0, -60000.0)
    k = k.astype(np.float16)
    k[(0,) * (len(shape) - 2) + (3, 4)] = np.nan
    return k


def check_fitted_seal(cfg, seed):
    """Seal INT2 blocks with fitted keys from tails (layer by layer and all layers) and from
    rows: bytes equal ``expected_fitted_seal``, the same on both paths; 2 of the pairs are
    the extremes' and NaN as the test keys make them."""
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    L, H, BS, D = cfg.num_layers, cfg.num_kv_heads, cfg.block_size, cfg.head_dim
    k = fitted_test_keys(rng, (L, 2, H, BS, D))
    v = rng.standard_normal((L, 2, H, BS, D)).astype(np.float16)
    stores = []
    for path in ("tails", "rows"):
        store = DeviceKVStore(cfg, num_blocks=5, max_seqs=4)
        store.poison()
        if path == "tails":
            for t in range(BS):
                append(store, np.ascontiguousarray(k[:, :, :, t]), np.ascontiguousarray(v[:, :, :, t]),
                       np.array([2, 0], np.int32), np.full(2, t, np.int32))
            seal(store, np.array([2, 0], np.int32), np.array([3, 1], np.int32), fitted_keys=True)
        else:  # rows [L, 2 * BS, H, D]: block j's tokens j * BS ..
            rows = lambda x: np.ascontiguousarray(x.transpose(0, 1, 3, 2, 4).reshape(L, 2 * BS, H, D))  # noqa: E731
            seal_rows(store, rows(k), rows(v), 0, np.array([3, 1], np.int32), fitted_keys=True)
        stores.append(snapshot(store))
    for name in ("k_codes", "k_meta", "v_codes", "v_meta"):
        np.testing.assert_array_equal(stores[0][name].view(np.uint8), stores[1][name].view(np.uint8), err_msg=name)
    host = stores[0]
    for l in range(L):
        for j, b in enumerate([3, 1]):
            kc, km, vc, vm = expected_fitted_seal(k[l, j], v[l, j], cfg.group_size)
            np.testing.assert_array_equal(half_bits(host["k_meta"][l, b]), half_bits(km))
            np.testing.assert_array_equal(host["k_codes"][l, b], kc)
            np.testing.assert_array_equal(host["v_codes"][l, b], vc)
            np.testing.assert_array_equal(half_bits(host["v_meta"][l, b]), half_bits(vm))
    plain_scale, plain_lo = ref.quant_params(np.float32(-60000), np.float32(60000), 2)
    sealed = host["k_meta"][:, [3, 1]]  # [L, 2, H, 2, D]
    assert (sealed[..., 0, 2] == plain_scale).all() and (sealed[..., 1, 2] == plain_lo).all()
    assert np.isnan(host["k_meta"][0, 3, 0, :, 4]).all() and not np.isnan(host["k_meta"][0, 1]).any()


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # float16 meta of the wide channel
def test_seal_with_fitted_keys_is_the_reference_fit():
    cfg = SIM_CONFIGS[2]
    assert cfg.kv_dtype is KVDtype.INT2
    check_fitted_seal(cfg, 20261201)


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [c for c in GPU_CONFIGS if c.kv_dtype is KVDtype.INT2], ids=ids)
def test_seal_with_fitted_keys_is_the_reference_fit_gpu(cfg, seed):
    check_fitted_seal(cfg, seed)


@pytest.mark.parametrize("cfg, value, match", [
    (SIM_CONFIGS[1], True, "fitted_keys: only INT2 stores fit their keys, this store is int4"),
    (SIM_CONFIGS[0], True, "fitted_keys: only INT2 stores .* fp16"),
    (SIM_CONFIGS[2], 1, "fitted_keys: expected a bool, got 1"),
])
def test_fitted_keys_are_checked(cfg, value, match):
    store = DeviceKVStore(cfg, num_blocks=2, max_seqs=2)
    one = np.array([0], np.int32)
    with pytest.raises(HexcoreInvalidArgumentError, match=match):
        seal(store, one, one, fitted_keys=value)
    rows = np.zeros((cfg.num_layers, cfg.block_size, cfg.num_kv_heads, cfg.head_dim), np.float16)
    with pytest.raises(HexcoreInvalidArgumentError, match=match):
        seal_rows(store, rows, rows, 0, one, fitted_keys=value)
