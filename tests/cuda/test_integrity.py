"""Block checksums on the device against the CPU definition; bit flips and canaries found."""

from __future__ import annotations

import re

import numpy as np
import pytest
from numba import cuda

from hexcore import KVCacheConfig
from hexcore.cuda import integrity, seal
from hexcore.cuda.store import GUARD_WORDS, DeviceKVStore
from hexcore.errors import HexcoreInvalidArgumentError
from hexcore.host.checksum import HEAD_K1, HEAD_K2, layer_digests
from tests.cuda.fill import host_block, random_store


def cpu_digests(store, block) -> np.ndarray:
    """The CPU checksum of a host copy of ``block`` (uint32 [L])."""
    return layer_digests(*host_block(store, block))


def config(kv_dtype, num_layers=2):
    return KVCacheConfig(num_layers=num_layers, num_kv_heads=2, head_dim=64, block_size=16, kv_dtype=kv_dtype)


@pytest.mark.parametrize("kv_dtype", ["fp16", "int4", "int2"])
def test_gpu_checksum_matches_cpu(rng, kv_dtype):
    store = random_store(config(kv_dtype, num_layers=3), rng)
    ids = np.array([4, 0, 2], np.int32)
    got = integrity.checksum_blocks(store, ids)
    assert got.shape == (3, 3) and got.dtype == np.uint32
    for row, block in enumerate(ids):
        assert np.array_equal(got[row], cpu_digests(store, block)), (kv_dtype, block)


def test_record_then_verify_finds_planted_flips(rng):
    cfg = config("int4")
    store = random_store(cfg, rng)
    L = cfg.num_layers
    ids = np.arange(5, dtype=np.int32)
    sums = cuda.to_device(np.zeros((5, L), np.uint32))
    out = cuda.to_device(np.full((5, L), 0xDEAD, np.uint32))
    bad = cuda.to_device(np.full(len(store.guard_offsets), 7, np.uint32))
    integrity.checksum_launch(store, ids, sums, out, bad, "record").run()
    assert np.array_equal(sums.copy_to_host(), np.stack([cpu_digests(store, b) for b in ids]))
    # one flip in each of four blocks, one per segment, random layer and position
    planted = {}
    for block, name in zip((0, 1, 3, 4), ("k_codes", "v_codes", "k_meta", "v_meta")):
        array = store.arrays[name]
        run = array.nbytes // (L * array.shape[1])
        layer, byte, bit = int(rng.integers(L)), int(rng.integers(run)), int(rng.integers(8))
        integrity.flip_bits(store, name, layer, block, byte, 1 << bit)
        planted[block] = layer
    integrity.checksum_launch(store, ids, sums, out, bad, "verify").run()
    delta = out.copy_to_host()
    found = {int(b): int(np.flatnonzero(delta[b])[0]) for b in np.flatnonzero(delta.any(axis=1))}
    assert found == planted
    assert (delta != 0).sum() == 4  # one layer each
    assert not bad.copy_to_host().any()


def test_verify_flags_count_and_list_mismatches_and_guard_words(rng):
    """The optional flags: a count and a (block, layer) list of mismatches, bad guard words
    counted, accumulated over launches until the reader clears them; off by default."""
    cfg = config("int4", num_layers=3)
    store = random_store(cfg, rng)
    L = cfg.num_layers
    ids = np.array([4, 1, 2], np.int32)
    sums = cuda.to_device(np.zeros((5, L), np.uint32))
    out = cuda.device_array((3, L), np.uint32)
    bad = cuda.device_array(len(store.guard_offsets), np.uint32)
    integrity.checksum_launch(store, ids, sums, out, bad, "record").run()
    flags = cuda.to_device(np.zeros(2, np.uint32))
    found = cuda.to_device(np.full((2, 2), -7, np.int32))  # room for two
    device_ids = cuda.to_device(ids)
    verify = integrity.prepare_checksum(store, device_ids, sums, out, bad, "verify", flags, found)
    verify.run(0)
    assert flags.copy_to_host().tolist() == [0, 0] and (found.copy_to_host() == -7).all()  # intact: untouched
    planted = {(4, int(rng.integers(L))), (2, int(rng.integers(L)))}
    for block, layer in planted:
        integrity.flip_bits(store, "v_meta", layer, block, int(rng.integers(64)), 1 << int(rng.integers(8)))
    integrity.clobber_guard(store, 2, 5, 1)
    verify.run(0)
    assert flags.copy_to_host().tolist() == [2, 1]
    assert {tuple(r) for r in found.copy_to_host().tolist()} == planted
    verify.run(0)  # not cleared by the kernel: counts go on, the list is full
    assert flags.copy_to_host().tolist() == [4, 2]
    assert {tuple(r) for r in found.copy_to_host().tolist()} == planted
    plain = cuda.to_device(np.zeros(2, np.uint32))
    integrity.checksum_launch(store, ids, sums, out, bad, "verify").run()  # no flags: only out and bad
    assert (out.copy_to_host() != 0).sum() == 2 and bad.copy_to_host()[2] == 1
    for kwargs, text in (({"flags": plain}, "both or neither"), ({"found": found}, "both or neither"),
                         ({"flags": cuda.device_array(3, np.uint32), "found": found}, "flags: expected shape (2,)"),
                         ({"flags": plain, "found": cuda.device_array((2, 3), np.int32)}, "found: expected shape"),
                         ({"flags": np.zeros(2, np.uint32), "found": found}, "flags: an output must be")):
        with pytest.raises(HexcoreInvalidArgumentError, match=re.escape(text)):
            integrity.checksum_launch(store, ids, sums, out, bad, "verify", **kwargs)


def test_padding_rows_are_skipped(rng):
    cfg = config("fp16")
    store = random_store(cfg, rng)
    ids = cuda.to_device(np.array([-1, 3, 99], np.int32))
    out = cuda.to_device(np.full((3, cfg.num_layers), 0xDEAD, np.uint32))
    sums = cuda.device_array((5, cfg.num_layers), np.uint32)
    bad = cuda.device_array(len(store.guard_offsets), np.uint32)
    integrity.prepare_checksum(store, ids, sums, out, bad, "compute").run(0)
    got = out.copy_to_host()
    assert (got[[0, 2]] == 0xDEAD).all()
    assert np.array_equal(got[1], cpu_digests(store, 3))


def test_canaries_catch_a_write_past_each_array(rng):
    store = random_store(config("int2"), rng)
    assert not integrity.check_guards(store).any()
    # the word just past the end of the tails (the last array), and the last word of another guard
    integrity.clobber_guard(store, len(store.guard_offsets) - 1, 0, 0x12345678)
    integrity.clobber_guard(store, 1, GUARD_WORDS - 1, 0)
    bad = integrity.check_guards(store)
    assert bad.tolist() == [0, 1, 0, 0, 0, 1]
    assert store.guard_names == ("k_codes", "v_codes", "k_meta", "v_meta", "k_tails", "v_tails")
    assert store.guard_offsets[0] == store.word_offsets["k_codes"] + store.k_codes.nbytes // 4


def test_kernels_stay_inside_their_arrays(rng):
    # a seal of every tail into the first and last blocks leaves every guard intact
    store = random_store(config("int4"), rng)
    for tails in (store.k_tails, store.v_tails):
        tails.copy_to_device(rng.standard_normal(tails.shape).astype(np.float16))
    seal(store, np.array([0, 1], np.int32), np.array([0, 4], np.int32))
    assert not integrity.check_guards(store).any()


def test_store_checks_its_config():
    with pytest.raises(HexcoreInvalidArgumentError, match="config: expected KVCacheConfig, got NoneType"):
        DeviceKVStore(None, 4, 2)


def test_bad_arguments_raise_typed_errors(rng):
    cfg = config("int4")
    store = random_store(cfg, rng)
    sums = cuda.device_array((5, cfg.num_layers), np.uint32)
    out = cuda.device_array((1, cfg.num_layers), np.uint32)
    bad = cuda.device_array(len(store.guard_offsets), np.uint32)
    ids = np.array([0], np.int32)
    with pytest.raises(HexcoreInvalidArgumentError, match="mode: expected one of"):
        integrity.checksum_launch(store, ids, sums, out, bad, "check")
    with pytest.raises(HexcoreInvalidArgumentError, match="sums"):
        integrity.checksum_launch(store, ids, cuda.device_array((4, cfg.num_layers), np.uint32), out, bad)
    with pytest.raises(HexcoreInvalidArgumentError, match="block_ids"):
        integrity.checksum_launch(store, np.array([5], np.int32), sums, out, bad)
    with pytest.raises(HexcoreInvalidArgumentError, match="name: expected one of"):
        integrity.flip_bits(store, "codes", 0, 0, 0)
    with pytest.raises(HexcoreInvalidArgumentError, match=r"byte: expected an int in \[0, 1023\], got 1024"):
        integrity.flip_bits(store, "k_codes", 0, 0, 1024)
    with pytest.raises(HexcoreInvalidArgumentError, match="region"):
        integrity.clobber_guard(store, 6)
    with pytest.raises(HexcoreInvalidArgumentError, match="block_ids"):
        integrity.prepare_checksum(store, ids, sums, out, bad)  # a host array: prepared launches take device ones
    for unhashable in ([1], np.array([1]), {}):  # were TypeError: unhashable type (a dict lookup)
        with pytest.raises(HexcoreInvalidArgumentError, match="mode: expected one of"):
            integrity.checksum_launch(store, ids, sums, out, bad, unhashable)
        with pytest.raises(HexcoreInvalidArgumentError, match="name: expected one of"):
            integrity.flip_bits(store, unhashable, 0, 0, 0)


@pytest.mark.gpu
@pytest.mark.parametrize("kv_dtype", ["fp16", "int4", "int2"])
def test_gpu_checksum_matches_cpu_on_hardware(kv_dtype):
    # a real-size config on the GPU: many blocks, sampled bit flips, all found
    rng = np.random.default_rng(14)
    cfg = KVCacheConfig.from_preset("llama-3-8b", kv_dtype=kv_dtype, block_size=32)
    store = random_store(cfg, rng, num_blocks=64, max_seqs=4)
    ids = np.arange(64, dtype=np.int32)
    got = integrity.checksum_blocks(store, ids)
    for block in rng.choice(64, 6, replace=False):
        assert np.array_equal(got[block], cpu_digests(store, block)), block
    sums = cuda.to_device(got)
    out = cuda.device_array((64, cfg.num_layers), np.uint32)
    bad = cuda.device_array(len(store.guard_offsets), np.uint32)
    flipped = rng.choice(64, 16, replace=False)
    for block in flipped:
        name = rng.choice(list(k for k in store.arrays if "tails" not in k))
        run = store.arrays[name].nbytes // (cfg.num_layers * 64)
        integrity.flip_bits(store, str(name), int(rng.integers(cfg.num_layers)), int(block), int(rng.integers(run)),
                            1 << int(rng.integers(8)))
    integrity.checksum_launch(store, ids, sums, out, bad, "verify").run()
    assert sorted(np.flatnonzero(out.copy_to_host().any(axis=1)).tolist()) == sorted(flipped.tolist())
    assert not bad.copy_to_host().any()


_AHEAD_ROW = 64  # the kernel's output row: a compile-time stride (see check_key_ahead)


@cuda.jit
def _key_ahead_kernel(first, out):
    i = cuda.grid(1)
    if i < first.shape[0]:
        key = integrity.head_key_opaque(first[i])  # (every lane of the launch's two warps calls it)
        out[i] = integrity.head_key_ahead(key, 3)  # a constant step, as head_chunk's
        for j in range(4):  # an unrolled loop's index, as fragments.key_terms' and kernel.ring_terms'
            out[(1 + j) * _AHEAD_ROW + i] = integrity.head_key_ahead(key, 32 * j)


def check_key_ahead(rng):
    """``head_key_ahead(key(i), n) == key(i + n) mod 2**32``, across the wrap of ``i`` too, from
    the key as the decode's verify loops take it (``head_key_opaque``: on the GPU a shuffle).

    The output is 1-D with a compile-time row stride. Written to a 2-D array (a row stride
    known only at run time), NVVM misplaces the loop's stores: on the lent H100 row 2 read 0
    with the key hidden by a shuffle, and rows 2-4 landed at rows 3, 6 and 10 with it hidden by
    an inline-assembly move; CUDA 13.5's NVVM on a CPU emits those addresses for the shuffle's
    kernel too (``benchmarks/experiments/2026-12-05-s43/ahead_probe.py --cpu``). The decode's
    verify loops step values, not addresses, by these keys."""
    first = rng.integers(0, 1 << 32, _AHEAD_ROW, dtype=np.uint64).astype(np.uint32)
    first[:2] = [0xFFFFFFFF, 0xFFFFFFE0]
    out = cuda.to_device(np.zeros(5 * _AHEAD_ROW, np.uint32))
    _key_ahead_kernel[1, _AHEAD_ROW](first, out)
    got = out.copy_to_host().reshape(5, _AHEAD_ROW)
    key = [[(int(i) + n) % (1 << 32) * HEAD_K1 + HEAD_K2 & 0xFFFFFFFF for i in first] for n in (3, 0, 32, 64, 96)]
    assert got.tolist() == key


def test_head_key_ahead_steps_the_word_index(rng):
    check_key_ahead(rng)


@pytest.mark.gpu
def test_head_key_ahead_steps_the_word_index_on_gpu():
    check_key_ahead(np.random.default_rng(19))


def test_checksum_and_head_record_outputs_lie_outside_the_store_and_apart():
    """Outputs given as views of the store (the launch reads it: a race that writes into the
    cache) or of another array of the launch are refused before any launch; ``sums`` only
    where ``record`` writes them (``verify`` reads them)."""
    store = DeviceKVStore(config("int4"), num_blocks=6, max_seqs=2)
    ids, L, H = cuda.to_device(np.array([0, 1], np.int32)), 2, store.config.num_kv_heads
    pool = store.pool

    def words(n, dtype=np.uint32, shape=None):  # the store's first words as an array
        return pool[:n].view(dtype).reshape(shape or (n,))

    args = dict(sums=cuda.device_array((6, L), np.uint32), out=cuda.device_array((2, L), np.uint32),
                guard_bad=cuda.device_array(len(store.guard_offsets), np.uint32),
                flags=cuda.device_array(2, np.uint32), found=cuda.device_array((4, 2), np.int32))
    inside = dict(sums=words(6 * L, shape=(6, L)), out=words(2 * L, shape=(2, L)),
                  guard_bad=words(len(store.guard_offsets)), flags=words(2), found=words(8, np.int32, (4, 2)))
    for name, view in inside.items():
        for mode in ("record", "verify"):
            call = lambda: integrity.checksum_launch(store, ids, mode=mode, **{**args, name: view})  # noqa: E731
            if (name, mode) == ("sums", "verify"):
                call()
                continue
            with pytest.raises(HexcoreInvalidArgumentError, match=f"^{name}: lies inside the store's memory"):
                call()
    sums = args["sums"]
    for changes, text in (({"out": sums[:2]}, "out: shares memory with sums"),  # verify reads sums, writes out
                          ({"flags": args["out"].reshape(2 * L)[:2]}, "flags: shares memory with out"),
                          ({"found": args["out"].view(np.int32)}, "found: shares memory with out")):
        with pytest.raises(HexcoreInvalidArgumentError, match=re.escape(text)):
            integrity.checksum_launch(store, ids, mode="verify", **{**args, **changes})
    with pytest.raises(HexcoreInvalidArgumentError, match="^head_sums: lies inside the store's memory"):
        integrity.record_head_sums(store, np.array([0, 1], np.int32), words(6 * L * H, shape=(6, L, H)), layer=0)
    record = integrity.head_record_launch(store, ids, cuda.device_array((6, L, H), np.uint32), layer=1)
    assert record.grid[1] == 1 and integrity.checksum_launch(store, ids, mode="verify", **args).grid == (3, 1)
