"""Paged decode attention against a float64 numpy reference: dequantize, then attend."""

import math

import numpy as np
import pytest
from numba import cuda

from hexcore import HexcoreInvalidArgumentError, KVCacheConfig, KVDtype
from hexcore.cuda import DecodePlan, DeviceKVStore, paged_decode
from tests import reference as ref


def build_cache(cfg, seq_lens, rng, num_spare=2):
    """A poisoned store holding random sequences; returns (store, tables, tails, keys, values).

    Block ids are shuffled; the first sealed block of the last sequence is shared with
    the first sequence (as after a fork); unused table entries point at a poisoned block.
    """
    B, H, BS, D = len(seq_lens), cfg.num_kv_heads, cfg.block_size, cfg.head_dim
    sealed = [n // BS for n in seq_lens]
    num_blocks = sum(sealed) + num_spare
    store = DeviceKVStore(cfg, num_blocks=num_blocks, max_seqs=B + 1)
    store.poison()
    host = {name: a.copy_to_host() for name, a in store.arrays.items()}
    perm = rng.permutation(num_blocks).astype(np.int32)
    spare = perm[-1]  # never written: NaN / 0xFF everywhere
    tables = np.full((B, max(max(sealed), 1) + 1), spare, np.int32)
    tails = rng.permutation(B + 1)[:B].astype(np.int32)
    keys, values, used = [], [], 0
    bits = cfg.kv_dtype.bits
    for b, n in enumerate(seq_lens):
        ks, vs = [], []
        for j in range(sealed[b]):
            if b == B - 1 and j == 0 and sealed[0] > 0 and B > 1:
                block = tables[0, 0]  # shared with sequence 0
            else:
                block = perm[used]
                used += 1
                k = (rng.standard_normal((H, BS, D)) * rng.uniform(0.5, 2)).astype(np.float16)
                v = rng.standard_normal((H, BS, D)).astype(np.float16)
                if cfg.kv_dtype is KVDtype.FP16:
                    host["k_codes"][0, block], host["v_codes"][0, block] = k, v
                else:
                    kc, km, vc, vm = ref.quantize_block(k, v, bits, cfg.group_size)
                    host["k_codes"][0, block], host["k_meta"][0, block] = kc, km
                    host["v_codes"][0, block], host["v_meta"][0, block] = vc, vm
            tables[b, j] = block
            ks.append(_dequantized(host, "k", block, cfg))
            vs.append(_dequantized(host, "v", block, cfg))
        r = n % BS
        tk = rng.standard_normal((H, r, D)).astype(np.float16)
        tv = rng.standard_normal((H, r, D)).astype(np.float16)
        host["k_tails"][0, tails[b], :, :r], host["v_tails"][0, tails[b], :, :r] = tk, tv
        keys.append(np.concatenate(ks + [tk.astype(np.float64)], axis=1))
        values.append(np.concatenate(vs + [tv.astype(np.float64)], axis=1))
    for name, array in store.arrays.items():
        array.copy_to_device(host[name])
    return store, tables, tails, keys, values


def _dequantized(host, kv, block, cfg):
    if cfg.kv_dtype is KVDtype.FP16:
        return host[f"{kv}_codes"][0, block].astype(np.float64)
    codes, meta = host[f"{kv}_codes"][0, block], host[f"{kv}_meta"][0, block]
    if kv == "k":
        return ref.dequantize_keys(codes, meta, cfg.kv_dtype.bits)
    return ref.dequantize_values(codes, meta, cfg.kv_dtype.bits, cfg.group_size)


def check_decode(cfg, group, seq_lens, seed):
    rng = np.random.default_rng(seed)
    store, tables, tails, keys, values = build_cache(cfg, seq_lens, rng)
    B = len(seq_lens)
    q = rng.standard_normal((B, cfg.num_kv_heads * group, cfg.head_dim)).astype(np.float16)
    out = cuda.to_device(np.full(q.shape, np.nan, np.float16))
    paged_decode(q, store, 0, tables, np.array(seq_lens, np.int32), tails, out=out)
    got = out.copy_to_host()
    expect = ref.decode_attention(q, keys, values, 1 / math.sqrt(cfg.head_dim))
    assert not np.isnan(got).any()
    err = ref.relative_l2(got, expect)
    assert err <= 2e-3, f"relative L2 error {err:.2e} (seed {seed})"
    return err


SIM_CASES = [  # (kv_dtype, head_dim, block_size, group, seq_lens)
    ("fp16", 64, 8, 1, [37, 8]),
    ("fp16", 64, 16, 2, [0, 70]),
    ("int4", 64, 8, 1, [45, 16]),
    ("int4", 64, 16, 2, [33, 5]),
    ("int2", 64, 8, 2, [40, 1]),
    ("int2", 64, 16, 1, [64, 19]),
]


@pytest.mark.parametrize("dtype,head_dim,block_size,group,seq_lens", SIM_CASES)
def test_decode_matches_reference(dtype, head_dim, block_size, group, seq_lens):
    cfg = KVCacheConfig(num_layers=1, num_kv_heads=2, head_dim=head_dim, block_size=block_size, kv_dtype=dtype,
                        group_size=32)
    check_decode(cfg, group, seq_lens, np.random.SeedSequence().entropy)


SIM_TENSOR_CORE_CASES = [  # (kv_dtype, head_dim, block_size, group, seq_lens, group_size): attention_tc layouts
    ("int2", 128, 16, 8, [37, 16], 64),
    ("int4", 128, 32, 3, [70, 5], 8),  # several value groups inside one lane's dims
    ("fp16", 128, 16, 5, [20, 49], 64),
]


@pytest.fixture
def tensor_cores(request, monkeypatch):
    """Choose the kernel family (attention_tc or the CUDA-core kernel) for one test."""
    from hexcore.cuda import attention

    monkeypatch.setattr(attention, "TENSOR_CORES", request.param)
    attention.decode_kernel.cache_clear()
    yield request.param
    attention.decode_kernel.cache_clear()


@pytest.mark.parametrize("tensor_cores", [True], indirect=True)
@pytest.mark.parametrize("dtype,head_dim,block_size,group,seq_lens,group_size", SIM_TENSOR_CORE_CASES)
def test_tensor_core_decode_matches_reference(tensor_cores, dtype, head_dim, block_size, group, seq_lens, group_size):
    from hexcore.cuda import attention_tc

    cfg = KVCacheConfig(num_layers=1, num_kv_heads=2, head_dim=head_dim, block_size=block_size, kv_dtype=dtype,
                        group_size=group_size)
    assert attention_tc.supported(cfg.kv_dtype.bits, head_dim, block_size, group)
    check_decode(cfg, group, seq_lens, np.random.SeedSequence().entropy)


@pytest.mark.parametrize("tensor_cores", [False], indirect=True)
@pytest.mark.parametrize("dtype", ["fp16", "int4"])
def test_cuda_core_decode_matches_reference(tensor_cores, dtype):
    cfg = KVCacheConfig(num_layers=1, num_kv_heads=2, head_dim=64, block_size=16, kv_dtype=dtype, group_size=32)
    check_decode(cfg, 2, [33, 5], np.random.SeedSequence().entropy)


GPU_SHAPES = [(64, 16, 1), (64, 32, 4), (64, 64, 8), (128, 16, 8), (128, 32, 1), (128, 64, 4)]


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim,block_size,group", GPU_SHAPES)
@pytest.mark.parametrize("dtype", ["fp16", "int4", "int2"])
def test_decode_matches_reference_gpu(dtype, head_dim, block_size, group):
    rng = np.random.default_rng()
    cfg = KVCacheConfig(num_layers=1, num_kv_heads=4, head_dim=head_dim, block_size=block_size, kv_dtype=dtype,
                        group_size=64)
    lens = [int(rng.integers(1, 32768)), 0, int(rng.integers(1, 300)), block_size * 7, 32768]
    check_decode(cfg, group, lens, int(rng.integers(1 << 62)))


@pytest.mark.gpu
@pytest.mark.parametrize("tensor_cores", [False], indirect=True)
@pytest.mark.parametrize("dtype", ["fp16", "int4", "int2"])
def test_cuda_core_decode_matches_reference_gpu(tensor_cores, dtype):
    rng = np.random.default_rng()
    cfg = KVCacheConfig(num_layers=1, num_kv_heads=4, head_dim=128, block_size=32, kv_dtype=dtype, group_size=64)
    check_decode(cfg, 4, [int(rng.integers(1, 32768)), 0, 31, 32768], int(rng.integers(1 << 62)))


def test_bad_arguments_raise_before_launch():
    cfg = KVCacheConfig(num_layers=1, num_kv_heads=2, head_dim=64, block_size=8, kv_dtype="int4", group_size=32)
    store = DeviceKVStore(cfg, num_blocks=4, max_seqs=2)
    q = np.zeros((1, 2, 64), np.float16)
    ok = dict(block_tables=np.zeros((1, 3), np.int32), seq_lens=np.array([9], np.int32),
              tail_slots=np.array([0], np.int32))
    bad = [
        dict(q=np.zeros((1, 3, 64), np.float16)),
        dict(q=np.zeros((1, 2, 64), np.float32)),
        dict(q=np.zeros((1, 2, 32), np.float16)),
        dict(layer=1),
        dict(block_tables=np.full((1, 3), 4, np.int32)),
        dict(block_tables=np.zeros((2, 3), np.int32)),
        dict(seq_lens=np.array([40], np.int32)),
        dict(seq_lens=np.array([-1], np.int32)),
        dict(tail_slots=np.array([2], np.int32)),
        dict(seq_lens=np.array([9], np.int64)),
    ]
    for case in bad:
        args = {"q": q, "layer": 0, **ok, **case}
        with pytest.raises(HexcoreInvalidArgumentError):
            paged_decode(args.pop("q"), store, args.pop("layer"), **args)


def test_decode_plan_equals_eager_and_follows_new_inputs():
    """A plan is marshalled once; new contents of its buffers give new, correct results."""
    cfg = KVCacheConfig(num_layers=2, num_kv_heads=2, head_dim=64, block_size=8, kv_dtype="int4", group_size=32)
    rng = np.random.default_rng()
    store, tables, tails, keys, values = build_cache(cfg, [21, 9], rng)
    q_host = rng.standard_normal((2, 2, 64)).astype(np.float16)
    q, d_tables = cuda.to_device(q_host), cuda.to_device(tables)
    lens, slots = cuda.to_device(np.array([21, 9], np.int32)), cuda.to_device(tails)
    plan = DecodePlan(q, store, d_tables, lens, slots, max_seq_len=21)
    scale = 1 / math.sqrt(64)
    assert ref.relative_l2(plan.run(0).copy_to_host(), ref.decode_attention(q_host, keys, values, scale)) <= 2e-3
    q_host = rng.standard_normal((2, 2, 64)).astype(np.float16)
    q.copy_to_device(q_host)
    lens.copy_to_device(np.array([16, 9], np.int32))  # sequence 0 shrinks to its two sealed blocks
    keys[0], values[0] = keys[0][:, :16], values[0][:, :16]
    got = plan.run(0).copy_to_host()
    assert ref.relative_l2(got, ref.decode_attention(q_host, keys, values, scale)) <= 2e-3


@pytest.mark.gpu
def test_decode_plan_and_cached_eager_gpu():
    """On a GPU the plan and the repeated eager call take the prepared-launch path."""
    test_decode_plan_equals_eager_and_follows_new_inputs()
    cfg = KVCacheConfig(num_layers=1, num_kv_heads=4, head_dim=128, block_size=32, kv_dtype="int2")
    rng = np.random.default_rng()
    store, tables, tails, keys, values = build_cache(cfg, [300, 64, 5], rng)
    q_host = rng.standard_normal((3, 16, 128)).astype(np.float16)
    q, d_tables, lens, slots = (cuda.to_device(a) for a in (q_host, tables, np.array([300, 64, 5], np.int32), tails))
    out = cuda.device_array(q_host.shape, np.float16)
    for _ in range(3):  # the 2nd and 3rd calls replay the cached launches
        q_host = rng.standard_normal(q_host.shape).astype(np.float16)
        q.copy_to_device(q_host)
        out.copy_to_device(np.full(q_host.shape, np.nan, np.float16))
        got = paged_decode(q, store, 0, d_tables, lens, slots, out=out, max_seq_len=300).copy_to_host()
        expect = ref.decode_attention(q_host, keys, values, 1 / math.sqrt(128))
        assert ref.relative_l2(got, expect) <= 2e-3


def test_small_value_groups_fall_back_to_cuda_cores():
    """A group size the tensor-core kernel does not take (64 groups a row) still decodes."""
    from hexcore.cuda import attention_tc

    cfg = KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=128, block_size=16, kv_dtype="int4", group_size=2)
    assert not attention_tc.supported(4, 128, 16, 2, 2)
    check_decode(cfg, 2, [21], np.random.SeedSequence().entropy)
