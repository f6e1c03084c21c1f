"""Prefill over a cached prefix on the GPU: gather + torch SDPA against the numba extend
kernel, against recomputing the whole prompt's attention with SDPA.

    python -m benchmarks.bench_prefill        (or through scripts/gpu-check; needs torch)

llama-3-8b attention shapes (32 query heads, 8 KV heads, head_dim 128, block size 32), one
layer, a 2048-token cached prefix and 16 / 128 / 512 new tokens. Columns: ``us`` device time
per call (median of CUDA-event timings over back-to-back calls), ``host_us`` the host time
of one call, ``TBs`` bytes moved per second (gather: the prefix's codes and metadata read,
the new K/V read, the FP16 scratch written; attention rows: the K/V the attention reads
once), ``TFLOPs`` the attention's useful multiply-adds (x2) per second.

- ``gather``: ``gather_prefix``, one call (dequantize the prefix into the scratch): its time
  is mostly the launcher's host time (the kernel moves a few MB);
- ``gather kernel``: the same kernel alone, 20 prepared launches replayed as one CUDA graph
  (time per launch, so the host does not hide it);
- ``gather+sdpa``: ``prefill_attention(backend="sdpa")``, the whole call;
- ``numba``: ``prefill_attention(backend="numba")`` (gather + extend kernel on CUDA cores);
- ``sdpa over fp16``: the SDPA step alone over a ready contiguous FP16 K/V (a lower bound);
- ``recompute``: causal SDPA over the whole prompt (prefix + new tokens), what a cache
  miss costs in attention alone (the model's other layers over the prefix come on top).
"""

from __future__ import annotations

import numpy as np
import pytest

from hexcore import KVCacheConfig

HQ, H, D, BS = 32, 8, 128, 32  # llama-3-8b
PREFIX = 2048
NEW_TOKENS = (16, 128, 512)


def prefill_rows():
    import torch
    import torch.nn.functional as F
    from numba import cuda

    from benchmarks.gpu_common import fill_store, host_seconds_per_call, time_gpu
    from hexcore.cuda import DeviceKVStore, gather_prefix, prefill_attention
    from hexcore.cuda.attention.prefill import sdpa_extend

    rows = []
    rng = np.random.default_rng(0)
    for dtype in ("fp16", "int4", "int2"):
        cfg = KVCacheConfig(num_layers=1, num_kv_heads=H, head_dim=D, block_size=BS, kv_dtype=dtype)
        store = DeviceKVStore(cfg, num_blocks=PREFIX // BS + 8, max_seqs=4)
        fill_store(store)
        table = cuda.to_device(rng.permutation(store.num_blocks)[:PREFIX // BS].astype(np.int32))
        prefix_bytes = (PREFIX // BS) * cfg.block_bytes_per_layer
        for n in NEW_TOKENS:
            S = PREFIX + n
            q = torch.randn(n, HQ, D, device="cuda", dtype=torch.float16)
            k_new = torch.randn(n, H, D, device="cuda", dtype=torch.float16)
            v_new = torch.randn(n, H, D, device="cuda", dtype=torch.float16)
            out = torch.empty_like(q)
            k_s = torch.empty(H, S, D, device="cuda", dtype=torch.float16)
            v_s = torch.empty_like(k_s)
            kv_bytes = 2 * H * S * D * 2  # the FP16 K and V an attention over the scratch reads
            flops = 4 * HQ * D * (n * PREFIX + n * (n + 1) / 2)  # QK^T and PV over the visible positions
            cases = {
                "gather": (lambda: gather_prefix(store, 0, table, PREFIX, None, k_new, v_new, k_s, v_s),
                           prefix_bytes + 2 * k_new.numel() * 2 + 2 * k_s.numel() * 2, 0),
                "gather+sdpa": (lambda: prefill_attention(q, k_new, v_new, store, 0, table, PREFIX, out=out,
                                                          backend="sdpa"), prefix_bytes + kv_bytes, flops),
                "numba": (lambda: prefill_attention(q, k_new, v_new, store, 0, table, PREFIX, out=out,
                                                    backend="numba"), prefix_bytes + kv_bytes, flops),
                "sdpa over fp16": (lambda: sdpa_extend(q, k_s, v_s), kv_bytes, flops),
            }
            if dtype == "fp16":  # the same for every kv dtype
                full_q = torch.randn(1, HQ, S, D, device="cuda", dtype=torch.float16)
                full_k, full_v = k_s.unsqueeze(0), v_s.unsqueeze(0)
                cases["recompute"] = (lambda: F.scaled_dot_product_attention(full_q, full_k, full_v, is_causal=True,
                                                                               enable_gqa=True),
                                      kv_bytes, 4 * HQ * D * S * (S + 1) / 2)
            for name, (fn, nbytes, work) in cases.items():
                seconds = time_gpu(fn, repeats=5 if name == "numba" else 10)
                rows.append(dict(kv_dtype=dtype, new_tokens=n, op=name, us=seconds * 1e6,
                                 host_us=host_seconds_per_call(fn, calls=50) * 1e6, TBs=nbytes / seconds / 1e12,
                                 TFLOPs=work / seconds / 1e12))
            seconds = kernel_seconds(store, table, k_new, v_new, k_s, v_s)
            rows.append(dict(kv_dtype=dtype, new_tokens=n, op="gather kernel", us=seconds * 1e6, host_us=float("nan"),
                             TBs=cases["gather"][1] / seconds / 1e12, TFLOPs=0.0))
    return rows


def kernel_seconds(store, table, k_new, v_new, k_s, v_s, copies: int = 20) -> float:
    """Device seconds of one gather kernel over layer 0: ``copies`` prepared launches captured
    in one CUDA graph, the replay timed with CUDA events and divided by ``copies``."""
    from numba import cuda

    from benchmarks.gpu_common import time_gpu
    from hexcore.cuda.arrays import checked
    from hexcore.cuda.attention.prefill import gather_launch
    from hexcore.cuda.steps.capture import DriverGraph
    from hexcore.cuda.streams import stream_handle

    n, S = k_new.shape[0], k_s.shape[1]
    new = [checked(x, name, np.float16, (n, H, D)) for x, name in ((k_new, "k_new"), (v_new, "v_new"))]
    out = [checked(x, name, np.float16, (H, S, D), output=True) for x, name in ((k_s, "k_out"), (v_s, "v_out"))]
    launch = gather_launch(store, 0, table, PREFIX, 0, *new, *out).prepare()
    launch.run(0)  # loads the module (a capture cannot)
    cuda.synchronize()
    graph = DriverGraph(lambda stream: [launch.run(stream) for _ in range(copies)], cuda.stream())
    default = stream_handle(0)
    return time_gpu(lambda: graph.replay(default)) / copies


@pytest.mark.gpu
def test_prefill_throughput():
    pytest.importorskip("torch")
    from benchmarks.gpu_common import save

    rows = prefill_rows()
    save("prefill", rows)
    assert rows


if __name__ == "__main__":
    test_prefill_throughput()
