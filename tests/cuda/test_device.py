"""Warp and intrinsic helpers (hexcore/cuda/device.py) against numpy: on the simulator
the twins, with ``-m gpu`` the shuffles and inline PTX."""

import numpy as np
import pytest
from numba import cuda

from hexcore.cuda.device import (add_acq_rel, add_acq_rel_i32, add_u32, exp2, load_cg_f32, load_relaxed, load_where,
                                 load_words, mad_u32, prefetch_l2, shfl_idx, shfl_xor, xorshift_u32)


@cuda.jit
def _warp_kernel(values, src, masks, idx_out, xor_out, exp_out, cg_out, words, loaded):
    lane = cuda.threadIdx.x
    idx_out[lane] = shfl_idx(values[lane], src[lane])
    for k in range(masks.shape[0]):
        xor_out[k, lane] = shfl_xor(values[lane], masks[k])
    exp_out[lane] = exp2(values[lane])
    cg_out[lane] = load_cg_f32(values, 31 - lane)
    if lane == 0:
        prefetch_l2(words, 0, 64)
    if lane < 4:
        load_words(words, 4 * lane, 4, loaded, 4 * lane)


def check_warp(rng):
    values = rng.uniform(-30, 30, 32).astype(np.float32)
    src = rng.integers(0, 32, 32).astype(np.int32)
    masks = np.array([1, 2, 4, 8, 16], np.int32)
    words = rng.integers(0, 1 << 32, 16, dtype=np.uint64).astype(np.uint32)
    idx, exp_, cg = (cuda.to_device(np.full(32, np.nan, np.float32)) for _ in range(3))
    xor = cuda.to_device(np.full((5, 32), np.nan, np.float32))
    loaded = cuda.to_device(np.zeros(16, np.uint32))
    _warp_kernel[1, 32](values, src, masks, idx, xor, exp_, cg, words, loaded)
    np.testing.assert_array_equal(idx.copy_to_host(), values[src])
    lanes = np.arange(32)
    np.testing.assert_array_equal(xor.copy_to_host(), np.stack([values[lanes ^ m] for m in masks]))
    np.testing.assert_allclose(exp_.copy_to_host(), np.exp2(values.astype(np.float64)), rtol=3e-7)
    np.testing.assert_array_equal(cg.copy_to_host(), values[::-1])
    np.testing.assert_array_equal(loaded.copy_to_host(), words)


def test_warp_helpers_match_numpy(rng):
    check_warp(rng)


@pytest.mark.gpu
def test_warp_helpers_on_gpu(rng):
    check_warp(rng)


@cuda.jit
def _last_one_out_kernel(data, count, olds, total):
    """Each CTA's thread 0 writes its word of ``data`` (a plain store), then counts itself out
    with ``add_acq_rel``; the last one out sums every CTA's word with ``load_relaxed``: the
    persistent slice's close (its release/acquire pair) in miniature."""
    if cuda.threadIdx.x == 0:
        block = cuda.blockIdx.x
        data[block] = 3 * block + 1
        old = add_acq_rel(count, 0, 1)
        olds[block] = old
        if old == cuda.gridDim.x - 1:
            acc = 0
            for j in range(cuda.gridDim.x):
                acc += load_relaxed(data, j)
            total[0] = acc


def check_last_one_out(blocks):
    data, count, olds, total = (cuda.to_device(np.zeros(n, np.int64)) for n in (blocks, 1, blocks, 1))
    _last_one_out_kernel[blocks, 32](data, count, olds, total)
    assert sorted(olds.copy_to_host()) == list(range(blocks))  # each got the old count, once
    assert count.copy_to_host()[0] == blocks
    assert total.copy_to_host()[0] == sum(3 * b + 1 for b in range(blocks))  # every word seen by the last


def test_add_acq_rel_counts_and_the_last_sees_every_word():
    check_last_one_out(7)


@pytest.mark.gpu
def test_add_acq_rel_counts_and_the_last_sees_every_word_on_gpu():
    for _ in range(20):  # many CTAs at once: a missing release or acquire shows as a short sum
        check_last_one_out(2048)


@cuda.jit
def _split_k_kernel(data, count, sums):
    """The decode merge's handshake in miniature: every thread of a CTA writes its word, the
    CTA meets at a barrier, thread 0 alone counts the CTA out (``add_acq_rel_i32``, no
    threadfence anywhere), and every thread of the last CTA, after a second barrier, sums
    one word of each CTA from L2 (``load_cg_f32``)."""
    tid, block = cuda.threadIdx.x, cuda.blockIdx.x
    flag = cuda.shared.array(1, np.int32)
    data[block * cuda.blockDim.x + tid] = block + 1
    cuda.syncthreads()
    if tid == 0:
        flag[0] = add_acq_rel_i32(count, 0, 1) == cuda.gridDim.x - 1
    cuda.syncthreads()
    if flag[0]:
        acc = np.float32(0)
        for j in range(cuda.gridDim.x):
            acc += load_cg_f32(data, j * cuda.blockDim.x + tid)
        sums[tid] = acc


def check_split_k(blocks, threads=128):
    data = cuda.to_device(np.full(blocks * threads, np.nan, np.float32))
    count, sums = cuda.to_device(np.zeros(1, np.int32)), cuda.to_device(np.full(threads, np.nan, np.float32))
    _split_k_kernel[blocks, threads](data, count, sums)
    assert count.copy_to_host()[0] == blocks
    assert (sums.copy_to_host() == blocks * (blocks + 1) / 2).all()  # every thread saw every CTA's word


def test_add_acq_rel_i32_hands_every_ctas_writes_to_the_last():
    check_split_k(5, threads=32)


@pytest.mark.gpu
def test_add_acq_rel_i32_hands_every_ctas_writes_to_the_last_on_gpu():
    for _ in range(20):  # a missing release or acquire shows as a short sum in some thread
        check_split_k(1024)


def test_every_cp_async16_destination_is_declared_16_byte_aligned():
    """Source check: each shared array that ``cp_async16`` or ``cp_async16_at`` writes (16 bytes a copy) is
    declared with ``alignment=SHARED_ALIGN16``. numba gives a shared array its dtype's
    alignment and ptxas places it where it likes: the H200 faulted on a ring at an address
    that was not a multiple of 16 (2026-12-01). The simulator cannot see this."""
    import ast
    import pathlib

    package = pathlib.Path(__file__).resolve().parents[2] / "hexcore"
    destinations, declared = set(), {}
    for path in package.rglob("*.py"):
        if path.name == "device.py":  # the helper's own definitions and twin
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("cp_async16", "cp_async16_at"):
                destinations.add(node.args[0].id)
            if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                    and ast.unparse(node.value.func) == "cuda.shared.array"):
                aligned = any(k.arg == "alignment" and ast.unparse(k.value) == "SHARED_ALIGN16"
                              for k in node.value.keywords)
                for target in node.targets:
                    declared.setdefault(getattr(target, "id", None), []).append((f"{path.name}:{node.lineno}", aligned))
    assert destinations >= {"ring", "s_k", "s_v"}, destinations
    for name in destinations:
        assert declared.get(name), f"{name}: cp_async16's destination has no cuda.shared.array declaration"
        assert all(aligned for _, aligned in declared[name]), \
            f"{name}: declared without 16-byte alignment: {declared[name]}"


@cuda.jit
def _load_where_kernel(table, rows, cols, oks, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = load_where(table, rows[i], cols[i], oks[i])


def check_load_where():
    """``load_where(a, i, j, ok)``: ``a[i, j]`` where ``ok``, else -1 (the address is not read:
    an out-of-range (i, j) with ``ok`` false is allowed)."""
    table = np.arange(12, dtype=np.int32).reshape(3, 4) + 100
    rows = np.array([0, 2, 1, 2, 0, 7], np.int64)  # (7, 9): far outside the table, not read
    cols = np.array([0, 3, 2, 3, 1, 9], np.int64)
    oks = np.array([1, 1, 0, 1, 0, 0], np.uint32)
    out = cuda.to_device(np.zeros(6, np.int32))
    _load_where_kernel[1, 32](cuda.to_device(table), cuda.to_device(rows), cuda.to_device(cols),
                              cuda.to_device(oks), out)
    assert out.copy_to_host().tolist() == [100, 111, -1, 111, -1, -1]


def test_load_where_reads_only_where_asked():
    check_load_where()


@pytest.mark.gpu
def test_load_where_reads_only_where_asked_on_gpu():
    check_load_where()


@cuda.jit
def _u32_kernel(a, b, c, shifts, wide, out):
    i = cuda.grid(1)
    if i < a.shape[0]:
        out[0, i] = mad_u32(a[i], b[i], c[i])
        out[1, i] = add_u32(a[i], b[i])
        out[2, i] = xorshift_u32(a[i], shifts[i])
        out[3, i] = mad_u32(a[i], 0x85EBCA6B, 0)  # a constant operand above 2**31 (an int64 literal)
        out[4, i] = mad_u32(wide[i], 0x9E3779B1, 0x7F4A7C15)  # int64 operands, negative and >= 2**32


def check_u32(rng):
    """mad_u32, add_u32 and xorshift_u32 wrap mod 2**32 and shift logically, the top bit too;
    int64 operands (negative, above 2**32) are taken mod 2**32."""
    n = 256
    a, b, c = (rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32) for _ in range(3))
    a[:4] = [0xFFFFFFFF, 0x80000000, 0, 1]
    shifts = rng.integers(0, 32, n).astype(np.uint32)
    wide_in = rng.integers(-(1 << 40), 1 << 40, n, dtype=np.int64)
    out = cuda.to_device(np.zeros((5, n), np.uint32))
    _u32_kernel[2, 128](a, b, c, shifts, wide_in, out)
    got, wide = out.copy_to_host(), a.astype(np.uint64)
    mask = np.uint64(0xFFFFFFFF)
    assert np.array_equal(got[0], ((wide * b + c) & mask).astype(np.uint32))
    assert np.array_equal(got[1], ((wide + b) & mask).astype(np.uint32))
    assert np.array_equal(got[2], a ^ (a >> shifts))
    assert np.array_equal(got[3], ((wide * np.uint64(0x85EBCA6B)) & mask).astype(np.uint32))
    keys = [(int(x) * 0x9E3779B1 + 0x7F4A7C15) & 0xFFFFFFFF for x in wide_in]  # Python ints: exact mod 2**32
    assert got[4].tolist() == keys


def test_u32_arithmetic_wraps_like_numpy(rng):
    check_u32(rng)


@pytest.mark.gpu
def test_u32_arithmetic_wraps_like_numpy_on_gpu(rng):
    check_u32(rng)
