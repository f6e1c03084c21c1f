"""Head digests on the device: the RECORD kernel against the CPU reference (every dtype),
and the decode kernel's verify variant (outputs unchanged, flips in sampled blocks found
with their (block, layer), unsampled blocks not checked, no false alarm, typed errors)."""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda

from hexcore import KVCacheConfig
from hexcore.cuda import integrity
from hexcore.cuda.attention.shape import DecodeShape
from hexcore.cuda.store import DeviceKVStore
from hexcore.errors import HexcoreInvalidArgumentError
from hexcore.host.checksum import head_digests
from hexcore.host.tensor_digest import chunk_words
from tests.cuda.fill import host_block, random_store


@pytest.mark.parametrize("bits", [4, 2])
def test_the_decode_ring_stage_holds_the_digest_staged_chunk(bits):
    """The decode digests an INT block's chunks as its ring stages hold them
    (``DecodeShape.stage_words``), the record kernel and the CPU as ``chunk_words`` lays them
    out: the same number of words at every layout the decode runs."""
    for D in (64, 128):
        for BS in (16, 32, 64, 128, 256):
            for group_size in (16, 32, 64, 128):
                if D % group_size == 0:
                    stage = DecodeShape(bits, 1, D, BS, 1, group_size).stage_words
                    assert stage == chunk_words(BS, D, bits, D // group_size), (D, BS, group_size)


def cpu_head_digests(store, block) -> np.ndarray:
    """The CPU head digests of a host copy of ``block``: uint32 [L, H]."""
    return head_digests(*host_block(store, block))


@pytest.mark.parametrize("kv_dtype", ["fp16", "int4", "int2"])
def test_record_kernel_matches_cpu(rng, kv_dtype):
    cfg = KVCacheConfig(num_layers=2, num_kv_heads=2, head_dim=64, block_size=16, kv_dtype=kv_dtype)
    store = random_store(cfg, rng)
    head_sums = cuda.to_device(np.full((5, 2, 2), 7, np.uint32))
    ids = cuda.to_device(np.array([3, -1, 0, 9], np.int32))  # -1 and 9 (outside the store) skipped
    integrity.prepare_head_record(store, ids, head_sums).run(0)
    got = head_sums.copy_to_host()
    for block in range(5):
        want = cpu_head_digests(store, block) if block in (0, 3) else np.full((2, 2), 7, np.uint32)
        assert np.array_equal(got[block], want), (kv_dtype, block)


@pytest.mark.parametrize("kv_dtype", ["fp16", "int2"])
def test_record_of_one_layer_leaves_the_others(rng, kv_dtype):
    cfg = KVCacheConfig(num_layers=3, num_kv_heads=2, head_dim=64, block_size=16, kv_dtype=kv_dtype)
    store = random_store(cfg, rng)
    head_sums = cuda.to_device(np.full((5, 3, 2), 7, np.uint32))
    integrity.prepare_head_record(store, cuda.to_device(np.array([4, -1, 1], np.int32)), head_sums, layer=2).run(0)
    got = head_sums.copy_to_host()
    for block in range(5):
        want = np.full((3, 2), 7, np.uint32)
        if block in (1, 4):
            want[2] = cpu_head_digests(store, block)[2]
        assert np.array_equal(got[block], want), (kv_dtype, block)


def test_record_bad_arguments_raise_typed_errors(rng):
    cfg = KVCacheConfig(num_layers=2, num_kv_heads=2, head_dim=64, block_size=16, kv_dtype="int4")
    store = DeviceKVStore(cfg, 5, 2)
    good = cuda.device_array((5, 2, 2), np.uint32)
    for ids, sums, text in ((np.array([5], np.int32), good, "block_ids"),
                            (np.array([0], np.int32), cuda.device_array((5, 2), np.uint32), "head_sums: expected shape"),
                            (np.array([0], np.int32), cuda.device_array((5, 2, 2), np.int32), "head_sums: expected dtype")):
        with pytest.raises(HexcoreInvalidArgumentError, match=text):
            integrity.head_record_launch(store, ids, sums)
    with pytest.raises(HexcoreInvalidArgumentError, match="head_sums"):
        integrity.prepare_head_record(store, cuda.to_device(np.zeros(1, np.int32)), np.zeros((5, 2, 2), np.uint32))
    for layer in (2, -1, True, 0.5):
        with pytest.raises(HexcoreInvalidArgumentError, match="layer"):
            integrity.head_record_launch(store, np.array([0], np.int32), good, layer=layer)


# -- the decode kernel's verify variant -----------------------------------------------
from hexcore.cuda import DecodePlan, paged_decode  # noqa: E402
from hexcore.cuda.attention import DecodeVerify  # noqa: E402
from tests.cuda.fill import random_cache  # noqa: E402

LAYER = 1  # the decoded layer (of two): a flip in layer 0 of the same block is not this launch's
SEGMENTS = {"fp16": ("k_codes", "v_codes"), "int4": ("k_codes", "v_codes", "k_meta", "v_meta"),
            "int2": ("k_codes", "v_codes", "k_meta", "v_meta")}


def verify_case(rng, kv_dtype, block_size, group_size=64, head_dim=64):
    """A 2-layer cache (layer 1 filled, one KV head), every block's head digests recorded;
    a verifying DecodePlan over device buffers, the plain kernel's output, the verify
    buffers, and four sealed blocks that only one sequence reads."""
    cfg = KVCacheConfig(num_layers=2, num_kv_heads=1, head_dim=head_dim, block_size=block_size, kv_dtype=kv_dtype,
                        group_size=group_size)
    seq_lens = [3 * block_size + 5, 3 * block_size]
    store, tables, tails, _, _ = random_cache(cfg, seq_lens, rng, layer=LAYER)
    head_sums = cuda.to_device(np.zeros((store.num_blocks, 2, 1), np.uint32))
    integrity.record_head_sums(store, np.arange(store.num_blocks, dtype=np.int32), head_sums)
    q = rng.standard_normal((2, 4, head_dim)).astype(np.float16)
    lens = np.array(seq_lens, np.int32)
    plain = paged_decode(q, store, LAYER, tables, lens, tails).copy_to_host()
    verify = DecodeVerify(head_sums, cuda.to_device(np.array([1, 0], np.int32)),
                          cuda.to_device(np.zeros(1, np.uint32)), cuda.to_device(np.full((8, 2), -1, np.int32)))
    d = [cuda.to_device(a) for a in (q, tables, lens, tails)]
    plan = DecodePlan(d[0], store, d[1], d[2], d[3], int(lens.max()), verify=verify)
    own = [int(tables[0, 1]), int(tables[0, 2]), int(tables[1, 1]), int(tables[1, 2])]  # (block 0 is shared)
    return store, plan, plain, verify, own


def run_verify(plan, verify, every, phase):
    """One verifying decode with (every, phase) written into vctl: (out, flags[0], found rows)."""
    verify.vctl.copy_to_device(np.array([every, phase], np.int32))
    verify.flags.copy_to_device(np.zeros(1, np.uint32))
    verify.found.copy_to_device(np.full((8, 2), -1, np.int32))
    out = plan.run(LAYER).copy_to_host()
    n = int(verify.flags.copy_to_host()[0])
    return out, n, sorted(tuple(r) for r in verify.found.copy_to_host()[:min(n, 8)].tolist())


def flip(store, rng, name, layer, block):
    """One random bit of (layer, block)'s run of ``name`` flipped; returns how to undo it."""
    array = store.arrays[name]
    run = array.nbytes // (array.shape[0] * array.shape[1])
    byte, mask = int(rng.integers(run)), 1 << int(rng.integers(8))
    integrity.flip_bits(store, name, layer, block, byte, mask)
    return name, layer, block, byte, mask


# (fp16 at D 64, block 16: one k-step, one value chunk a row, and at D 128, block 32: two
# k-steps and two chunks, so FP16's in-loop terms index by k-step and chunk; int4 with two
# chunks per block: the sum carried across chunks, and with one: the weights from the CTA's
# table; int2 with 16 words of value metadata per chunk, fewer than the warp's lanes, in the
# pair loop, and at D 128 with value groups of 32: a paired ring that leaves no room for the
# table, so its weights are made as they go)
@pytest.mark.parametrize("kv_dtype,block_size,head_dim,group_size", [
    ("fp16", 16, 64, 64), ("fp16", 32, 128, 64), ("int4", 64, 64, 64), ("int4", 16, 64, 64), ("int2", 16, 64, 64),
    ("int2", 32, 128, 32)])
def test_decode_verify_finds_flips_in_sampled_blocks_only(rng, kv_dtype, block_size, head_dim, group_size):
    """Outputs equal the plain kernel's; every block checked and clean: no alarm; a bit
    flipped in each segment of four blocks (key codes, value codes, key and value metadata)
    is found with its (block, layer), a flip in layer 0 (not decoded) is not; sampling one
    block finds its flip only (the sample is honoured); every 0 checks nothing."""
    store, plan, plain, verify, own = verify_case(rng, kv_dtype, block_size, group_size, head_dim)
    out, n, _ = run_verify(plan, verify, 1, 0)  # every sealed block checked
    assert np.array_equal(out.view(np.uint16), plain.view(np.uint16)) and n == 0
    segments = SEGMENTS[kv_dtype]
    flips = [flip(store, rng, segments[i % len(segments)], LAYER, block) for i, block in enumerate(own)]
    flip(store, rng, "k_codes", 0, own[0])  # layer 0 of a flipped block: not this launch's
    _, n, found = run_verify(plan, verify, 1, 0)
    assert (n, found) == (4, sorted((block, LAYER) for block in own)), flips
    # (no claim on `out`: a flipped exponent bit of a metadata scale can make it inf or NaN,
    # which is what the alarm is for; seed 1083692207636696137 flips one, int2 block 16)
    if block_size > 32 or group_size != 64:
        return  # (sampling and every = 0 are the same code for every dtype, checked by the other
        # cases; a 64-token block, or INT2 at D 128, costs the simulator 7-15 s a decode: CI time)
    every = 64  # above every block id: (block + phase) % 64 == 0 for one block only
    _, n, found = run_verify(plan, verify, every, every - own[1])
    assert (n, found) == (1, [(own[1], LAYER)]), flips
    _, n, _ = run_verify(plan, verify, 0, 0)  # every 0: nothing checked
    assert n == 0


def test_decode_verify_bad_arguments_raise_typed_errors(rng):
    cfg = KVCacheConfig(num_layers=2, num_kv_heads=1, head_dim=64, block_size=16, kv_dtype="int4")
    store = DeviceKVStore(cfg, 4, 2)
    q = np.zeros((1, 2, 64), np.float16)
    tables, lens, tails = np.zeros((1, 2), np.int32), np.array([20], np.int32), np.zeros(1, np.int32)
    good = dict(head_sums=cuda.device_array((4, 2, 1), np.uint32), vctl=cuda.to_device(np.array([16, 3], np.int32)),
                flags=cuda.device_array(1, np.uint32), found=cuda.device_array((4, 2), np.int32))
    cases = [(dict(head_sums=cuda.device_array((4, 2), np.uint32)), r"verify\.head_sums: expected shape \(4, 2, 1\)"),
             (dict(head_sums=cuda.device_array((4, 2, 1), np.int32)), r"verify\.head_sums: expected dtype uint32"),
             (dict(vctl=cuda.device_array(3, np.int32)), r"verify\.vctl: expected shape \(2,\)"),
             (dict(vctl=np.array([16.0, 0.0])), r"verify\.vctl: expected dtype int32"),
             (dict(vctl=np.array([-1, 0], np.int32)), r"verify\.vctl: expected \(every >= 0, phase >= 0\), got \(-1, 0\)"),
             (dict(vctl=np.array([16, -2], np.int32)), r"got \(16, -2\)"),
             (dict(flags=cuda.device_array(0, np.uint32)), r"verify\.flags: expected shape \(n >= 1,\), got \(0,\)"),
             (dict(flags=np.zeros(1, np.uint32)), r"verify\.flags: an output must be"),
             (dict(found=cuda.device_array((4, 3), np.int32)), r"verify\.found: expected shape"),
             (dict(found=store.pool[:8].view(np.int32).reshape(4, 2)), r"verify\.found")]
    for change, text in cases:
        with pytest.raises(HexcoreInvalidArgumentError, match=text):
            paged_decode(q, store, 0, tables, lens, tails, verify=DecodeVerify(**{**good, **change}))
    with pytest.raises(HexcoreInvalidArgumentError, match="verify: expected a DecodeVerify or None, got tuple"):
        paged_decode(q, store, 0, tables, lens, tails, verify=tuple(good.values()))
    d = [cuda.to_device(a) for a in (q, tables, lens, tails)]
    with pytest.raises(HexcoreInvalidArgumentError, match="verify: expected a DecodeVerify or None, got dict"):
        DecodePlan(d[0], store, d[1], d[2], d[3], 20, verify=good)
    with pytest.raises(HexcoreInvalidArgumentError, match=r"verify\.vctl"):  # a plan takes device arrays only
        DecodePlan(d[0], store, d[1], d[2], d[3], 20, verify=DecodeVerify(**{**good, "vctl": np.array([1, 0], np.int32)}))


@pytest.mark.gpu
@pytest.mark.parametrize("kv_dtype,block_size,head_dim,group_size", [
    ("int4", 32, 128, 64), ("int2", 32, 128, 64), ("int4", 64, 128, 64), ("int2", 16, 64, 64), ("fp16", 32, 128, 64),
    ("int2", 32, 128, 32), ("int4", 32, 128, 16)])
def test_record_and_decode_verify_on_gpu(rng, kv_dtype, block_size, head_dim, group_size):
    """On the hardware (the tensor-core digest's fragments are the mma's, not a twin's): the
    record kernel against the CPU digest of every block, then the verifying decode finds a
    flip in each of four blocks' segments and raises no false alarm. (INT2 with value groups
    of 32 leaves no room for the weight table under 48 KB: its paired ring of 48 KB is past
    what ptxas 13 on the CPU compiles. INT4 with value groups of 16 is the tightest layout
    with the table: 48,132 bytes of static shared memory under ptxas 13.5.)"""
    store, plan, plain, verify, own = verify_case(rng, kv_dtype, block_size, group_size, head_dim)
    recorded = verify.head_sums.copy_to_host()
    for block in range(store.num_blocks):
        assert np.array_equal(recorded[block], cpu_head_digests(store, block)), block
    out, n, _ = run_verify(plan, verify, 1, 0)
    assert np.array_equal(out.view(np.uint16), plain.view(np.uint16)) and n == 0
    segments = SEGMENTS[kv_dtype]
    flips = [flip(store, rng, segments[i % len(segments)], LAYER, block) for i, block in enumerate(own)]
    _, n, found = run_verify(plan, verify, 1, 0)
    assert (n, found) == (4, sorted((block, LAYER) for block in own)), flips
