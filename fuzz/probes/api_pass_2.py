"""Hostile values into hexcore's public entry points (pass 2): prints every call that
ended in anything but a typed error.  NUMBA_ENABLE_CUDASIM=1 python fuzz/probes/api_pass_2.py"""
import numpy as np
from numba import cuda

from _probe import report, t
from hexcore import *
from hexcore.cuda import *
from hexcore.cuda.write import nonfinite_flags
from hexcore.cuda.attention.options import DecodeOptions
H = [None, True, np.bool_(True), 1.5, float("nan"), float("inf"), -1, 2**31, 10**30, 10**400, "3", b"3", [1], (1,), {}, object(), np.float64("nan"), np.array([1]), np.uint64(2**64-1), complex(1,1), np.array(["a"])]
cfg = KVCacheConfig(num_layers=2, num_kv_heads=1, head_dim=64, block_size=16, kv_dtype="int4", group_size=32)
store = DeviceKVStore(cfg, 4, 3)
one = np.array([0], np.int32); two = np.array([1], np.int32)
import inspect
for h in H:
    for f in ("max_registers", "ctas_per_sm", "min_split_blocks", "split_blocks", "split_overhead", "split_costs",
              "l2_prefetch", "joint_softmax", "launch_path"):
        t(f"DecodeOptions({f}={h!r})", lambda: DecodeOptions(**{f: h}))
    for i in range(5):
        t(f"SplitCosts(field {i}={h!r})", lambda: SplitCosts(*[h if j == i else 0.5 for j in range(5)]))
    t(f"nonfinite_flags({h!r})", lambda: nonfinite_flags(store, h))
    t(f"nonfinite_flags(layer={h!r})", lambda: nonfinite_flags(store, 1, h))
    t(f"seal(nonfinite={h!r})", lambda: seal(store, one, two, nonfinite=h))
    t(f"seal(stream={h!r})", lambda: seal(store, one, two, stream=h))
    t(f"append(rows={h!r})", lambda: append(store, np.zeros((1,1,64),np.float16), np.zeros((1,1,64),np.float16), one, one, layer=0, rows=h))
    t(f"append(rows=(0,{h!r}))", lambda: append(store, np.zeros((1,1,64),np.float16), np.zeros((1,1,64),np.float16), one, one, layer=0, rows=(0, h)))
    t(f"dequantize_blocks(layer={h!r})", lambda: dequantize_blocks(store, h, one))
    t(f"dequantize_blocks(ids={h!r})", lambda: dequantize_blocks(store, 0, h))
    t(f"copy_tails({h!r})", lambda: copy_tails(store, h, one))
    t(f"DecodeGraph(max_batch={h!r})", lambda: DecodeGraph(store, h, 4))
    t(f"DecodeGraph(max_blocks={h!r})", lambda: DecodeGraph(store, 1, h))
    t(f"DecodeGraph(options={h!r})", lambda: DecodeGraph(store, 1, 4, options=h))
    t(f"DecodeGraph(backend={h!r})", lambda: DecodeGraph(store, 1, 4, backend=h))
    t(f"paged_decode(options={h!r})", lambda: paged_decode(np.zeros((1,1,64),np.float16), store, 0, np.zeros((1,1),np.int32), one, one, options=h))
    t(f"paged_decode(q={h!r})", lambda: paged_decode(h, store, 0, np.zeros((1,1),np.int32), one, one))
    t(f"paged_decode(tables={h!r})", lambda: paged_decode(np.zeros((1,1,64),np.float16), store, 0, h, one, one))
    t(f"paged_decode(lens={h!r})", lambda: paged_decode(np.zeros((1,1,64),np.float16), store, 0, np.zeros((1,1),np.int32), h, one))
    t(f"layout_agrees({h!r})", lambda: layout_agrees(h))
    t(f"device_layout_offsets({h!r})", lambda: device_layout_offsets(h))
    t(f"host_layout_offsets({h!r})", lambda: host_layout_offsets(h))
report()
