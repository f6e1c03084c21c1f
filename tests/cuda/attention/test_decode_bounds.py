"""The decode kernel never reads outside its arrays for bad device index arrays.

Device arrays are not range-checked by the launcher (it would synchronise), so the
kernel clamps a sequence length to what its table row describes and what the grid was
sized for, and skips block ids and tail slots outside the store. On the simulator an
out-of-bounds read raises; the outputs below are what the clamped or skipped inputs
mean, against the float64 reference.
"""

import math

import numpy as np
import pytest
from numba import cuda

from hexcore import KVCacheConfig
from hexcore.cuda import DeviceKVStore, paged_decode
from tests import reference as ref
from tests.cuda.fill import random_cache

TOLERANCE = 2e-3


def _decode(q, store, tables, lens, slots, **kwargs):
    """paged_decode over device index arrays into a NaN-poisoned output; the host result."""
    out = cuda.to_device(np.full(q.shape, np.nan, np.float16))
    paged_decode(q, store, 0, cuda.to_device(np.ascontiguousarray(tables)), cuda.to_device(np.array(lens, np.int32)),
                 cuda.to_device(np.array(slots, np.int32)), out=out, **kwargs)
    got = out.copy_to_host()
    assert not np.isnan(got).any(), "an output element was not written"
    return got


def _check(got, q, keys, values):
    err = ref.relative_l2(got, ref.decode_attention(q, keys, values, 1 / math.sqrt(q.shape[-1])))
    assert err <= TOLERANCE, f"relative L2 error {err:.2e}"


def test_seq_len_past_an_empty_table_reads_only_the_tail(rng):
    """The issue's reproducer: a zero-width table and seq_len 40 at block_size 16 attend over
    the 15 tail tokens the table can describe (it read block_tables[0, 0] before)."""
    cfg = KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=64, block_size=16, kv_dtype="fp16")
    store, _, tails, keys, values = random_cache(cfg, [15], rng)
    q = rng.standard_normal((1, 1, 64)).astype(np.float16)
    got = _decode(q, store, np.zeros((1, 0), np.int32), [40], tails)
    _check(got, q, keys, values)


def test_reproducer_runs(rng):
    """The exact call of the finding: zero queries, an empty FP16 store of block_size 16."""
    cfg = KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=64, block_size=16, kv_dtype="fp16")
    store = DeviceKVStore(cfg, num_blocks=2, max_seqs=1)
    store.pool.copy_to_device(np.zeros(store.pool.shape, np.uint32))
    out = paged_decode(np.zeros((1, 1, 64), np.float16), store, 0, cuda.to_device(np.zeros((1, 0), np.int32)),
                       cuda.to_device(np.array([40], np.int32)), cuda.to_device(np.array([0], np.int32)))
    assert np.array_equal(out.copy_to_host(), np.zeros((1, 1, 64), np.float16))


@pytest.mark.parametrize("dtype", ["fp16", "int4"])
@pytest.mark.parametrize("bad", [-1, 10**6])
def test_block_ids_outside_the_store_are_skipped(dtype, bad, rng):
    """A device table entry outside [0, num_blocks): that block's tokens are left out."""
    cfg = KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=64, block_size=16, kv_dtype=dtype, group_size=32)
    store, tables, tails, keys, values = random_cache(cfg, [53], rng)  # three sealed blocks and a tail of 5
    q = rng.standard_normal((1, 2, 64)).astype(np.float16)
    tables[0, 1] = bad
    got = _decode(q, store, tables, [53], tails)
    keep = np.r_[0:16, 32:53]
    _check(got, q, [keys[0][:, keep]], [values[0][:, keep]])


def test_tail_slot_outside_the_store_is_skipped(rng):
    """A device tail slot outside [0, max_seqs): the tail's tokens are left out."""
    cfg = KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=64, block_size=16, kv_dtype="int2", group_size=64)
    store, tables, tails, keys, values = random_cache(cfg, [37, 20], rng)
    q = rng.standard_normal((2, 1, 64)).astype(np.float16)
    slots = tails.copy()
    slots[0] = store.max_seqs
    got = _decode(q, store, tables, [37, 20], slots)
    _check(got, q, [keys[0][:, :32], keys[1]], [values[0][:, :32], values[1]])


def test_seq_len_above_the_sized_grid_is_clamped(rng):
    """max_seq_len 16 sizes a one-block grid; a device seq_len of 40 then reads one block
    (before, its splits past the grid never merged and the output stayed unwritten)."""
    cfg = KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=64, block_size=16, kv_dtype="fp16")
    store, tables, tails, keys, values = random_cache(cfg, [40], rng)
    q = rng.standard_normal((1, 1, 64)).astype(np.float16)
    got = _decode(q, store, tables, [40], tails, max_seq_len=16)
    _check(got, q, [keys[0][:, :16]], [values[0][:, :16]])
