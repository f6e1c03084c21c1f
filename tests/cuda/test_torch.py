"""torch interop on a GPU: tensors in and out, zero-copy store views, the caller's stream."""

import math

import numpy as np
import pytest

from hexcore import KVCacheConfig
from hexcore.cuda import DeviceKVStore, append, paged_decode, seal
from tests import reference as ref

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", ["fp16", "int4"])
def test_torch_tensors_on_a_side_stream(dtype, rng):
    cfg = KVCacheConfig(num_layers=1, num_kv_heads=2, head_dim=128, block_size=16, kv_dtype=dtype)
    store = DeviceKVStore(cfg, num_blocks=4, max_seqs=2)
    store.poison()
    k = rng.standard_normal((19, 2, 128)).astype(np.float16)  # 16 tokens seal, 3 stay in the tail
    v = rng.standard_normal((19, 2, 128)).astype(np.float16)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # every launch below must follow torch's current stream
        kt, vt = torch.from_numpy(k).cuda(), torch.from_numpy(v).cuda()
        slots = torch.zeros(19, dtype=torch.int32, device="cuda")
        positions = (torch.arange(19, dtype=torch.int32, device="cuda") % 16).contiguous()
        append(store, kt[:16], vt[:16], slots[:16], positions[:16], layer=0)
        seal(store, torch.zeros(1, dtype=torch.int32, device="cuda"), torch.full((1,), 2, dtype=torch.int32,
                                                                               device="cuda"))
        append(store, kt[16:], vt[16:], slots[16:], positions[16:], layer=0)
        q = torch.from_numpy(rng.standard_normal((1, 4, 128)).astype(np.float16)).cuda()
        out = torch.full((1, 4, 128), float("nan"), dtype=torch.float16, device="cuda")
        tables = torch.tensor([[2]], dtype=torch.int32, device="cuda")
        lens = torch.tensor([19], dtype=torch.int32, device="cuda")
        paged_decode(q, store, 0, tables, lens, slots[:1], out=out, max_seq_len=19)
        result = out.cpu()  # ordered after the kernels on this stream
    host = {name: a.copy_to_host() for name, a in store.arrays.items()}
    if dtype == "fp16":
        keys, values = host["k_codes"][0, 2].astype(np.float64), host["v_codes"][0, 2].astype(np.float64)
    else:
        keys = ref.dequantize_keys(host["k_codes"][0, 2], host["k_meta"][0, 2], 4)
        values = ref.dequantize_values(host["v_codes"][0, 2], host["v_meta"][0, 2], 4, cfg.group_size)
    keys = np.concatenate([keys, k[16:].transpose(1, 0, 2)], axis=1)
    values = np.concatenate([values, v[16:].transpose(1, 0, 2)], axis=1)
    expect = ref.decode_attention(q.cpu().numpy(), [keys], [values], 1 / math.sqrt(128))
    assert ref.relative_l2(result.numpy(), expect) <= 2e-3


def test_as_torch_is_zero_copy():
    cfg = KVCacheConfig(num_layers=1, num_kv_heads=2, head_dim=64, block_size=16, kv_dtype="int2")
    store = DeviceKVStore(cfg, num_blocks=2, max_seqs=1)
    views = store.as_torch()
    assert set(views) == set(store.arrays)
    views["k_tails"].fill_(1.5)
    torch.cuda.synchronize()
    assert (store.k_tails.copy_to_host() == 1.5).all()
    assert views["k_codes"].data_ptr() == store.pool.device_ctypes_pointer.value + 0
