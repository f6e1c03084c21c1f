"""Append and seal on the GPU: GB/s read + written against the 4.27 TB/s copy ceiling.

    python -m benchmarks.bench_write           (or through scripts/gpu-check)
"""

from __future__ import annotations

import numpy as np
import pytest

from hexcore import KVCacheConfig

L, H, D, BS = 32, 8, 128, 32  # llama-3-8b's KV shape


def write_rows():
    from numba import cuda

    from benchmarks.gpu_common import CEILING_COPY_TBS, fill_store, host_seconds_per_call, time_gpu
    from hexcore.cuda import DeviceKVStore, append, seal

    rows = []
    rng = np.random.default_rng(0)
    for dtype in ("fp16", "int4", "int2"):
        cfg = KVCacheConfig(num_layers=L, num_kv_heads=H, head_dim=D, block_size=BS, kv_dtype=dtype)
        seqs = 1024
        store = DeviceKVStore(cfg, num_blocks=seqs, max_seqs=seqs)
        fill_store(store)
        for tokens in (256, 4096):
            k = cuda.to_device(rng.standard_normal((L, tokens, H, D)).astype(np.float16))
            v = cuda.to_device(rng.standard_normal((L, tokens, H, D)).astype(np.float16))
            per_seq = max(1, tokens // seqs)  # tokens each sequence gets, at positions 0..per_seq-1
            slots = cuda.to_device(np.tile(rng.permutation(seqs).astype(np.int32), per_seq)[:tokens])
            pos = cuda.to_device(np.repeat(np.arange(per_seq, dtype=np.int32), seqs)[:tokens])
            seconds = time_gpu(lambda: append(store, k, v, slots, pos))
            nbytes = 2 * 2 * k.nbytes  # K and V, read and written
            rows.append(dict(op=f"append {dtype}", items=f"{tokens} tokens x {L} layers", us=seconds * 1e6,
                             TBs=nbytes / seconds / 1e12, of_copy=nbytes / seconds / 1e12 / CEILING_COPY_TBS,
                             host_us=host_seconds_per_call(lambda: append(store, k, v, slots, pos)) * 1e6))
        for seals in (64, 1024):
            ids = cuda.to_device(rng.permutation(seqs)[:seals].astype(np.int32))
            blocks = cuda.to_device(rng.permutation(seqs)[:seals].astype(np.int32))
            seconds = time_gpu(lambda: seal(store, ids, blocks))
            nbytes = seals * (cfg.tail_bytes + cfg.block_bytes)
            rows.append(dict(op=f"seal {dtype}", items=f"{seals} blocks x {L} layers", us=seconds * 1e6,
                             TBs=nbytes / seconds / 1e12, of_copy=nbytes / seconds / 1e12 / CEILING_COPY_TBS,
                             host_us=host_seconds_per_call(lambda: seal(store, ids, blocks)) * 1e6))
    return rows


@pytest.mark.gpu
def test_write_throughput():
    from benchmarks.gpu_common import save

    rows = write_rows()
    save("write", rows)
    assert rows


if __name__ == "__main__":
    test_write_throughput()
