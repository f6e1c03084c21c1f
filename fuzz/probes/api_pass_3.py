"""Hostile values into hexcore's public entry points (pass 3): prints every call that
ended in anything but a typed error.  NUMBA_ENABLE_CUDASIM=1 python fuzz/probes/api_pass_3.py"""
import numpy as np
from numba import cuda

from _probe import report, t
from hexcore import *
from hexcore.cuda import *
H = [None, True, 1.5, float("nan"), -1, 10**30, "3", [1], object(), np.array([1]), np.zeros((2, 2))]
cfg = KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=64, block_size=16)
for h in H:
    t(f"Engine(num_q_heads={h!r})", lambda: Engine(cfg, 4, 2, h))
    t(f"Engine(cfg={h!r})", lambda: Engine(h, 4, 2, 1))
    t(f"Engine(num_blocks={h!r})", lambda: Engine(cfg, h, 2, 1))
    e = Engine(cfg, 4, 2, 1)
    for m in ("add", "fork", "finish", "seq_len", "buffers"):
        t(f"engine.{m}({h!r})", lambda: getattr(e, m)(h))
    t(f"engine.step({h!r})", lambda: e.step(h))
    t(f"engine.admit({h!r})", lambda: e.admit(h))
    t(f"engine.prefill(0,{h!r})", lambda: e.prefill(e.add(), h, h))
    t(f"FaultTolerantKVCache({h!r})", lambda: FaultTolerantKVCache(h))
    store = DeviceKVStore(cfg, 4, 2)
    t(f"gather_prefix(layer={h!r})", lambda: gather_prefix(store, h, np.zeros(1, np.int32), 0))
    t(f"gather_prefix(prefix_len={h!r})", lambda: gather_prefix(store, 0, np.zeros(1, np.int32), h))
    t(f"gather_prefix(table={h!r})", lambda: gather_prefix(store, 0, h, 0))
    t(f"gather_prefix(tail_slot={h!r})", lambda: gather_prefix(store, 0, np.zeros(1, np.int32), 3, h))
    q = np.zeros((2, 1, 64), np.float16)
    t(f"prefill_attention(q={h!r})", lambda: prefill_attention(h, q, q, store, 0, np.zeros(1, np.int32), 0))
    t(f"prefill_attention(prefix_len={h!r})", lambda: prefill_attention(q, q, q, store, 0, np.zeros(1, np.int32), h))
    t(f"prefill_attention(scale={h!r})", lambda: prefill_attention(q, q, q, store, 0, np.zeros(1, np.int32), 0, scale=h))
    t(f"prefill_attention(backend={h!r})", lambda: prefill_attention(q, q, q, store, 0, np.zeros(1, np.int32), 0, backend=h))
report()
