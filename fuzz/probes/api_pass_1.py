"""Hostile values into hexcore's public entry points (pass 1): prints every call that
ended in anything but a typed error.  NUMBA_ENABLE_CUDASIM=1 python fuzz/probes/api_pass_1.py"""
import itertools

import numpy as np
from numba import cuda

from _probe import report, t
import hexcore
from hexcore import *
from hexcore.host import *
from hexcore.host import prefix_keys
H = [None, True, np.bool_(True), 1.5, float("nan"), float("inf"), -1, 2**31, 10**30, 10**400, "3", b"3", [1], (1,), {}, object(), np.float64("nan"), np.array([1]), np.uint64(2**64-1), complex(1,1), np.array(["a"]), np.zeros((2,2))]
cfg = KVCacheConfig(num_layers=2, num_kv_heads=1, head_dim=64, block_size=16, kv_dtype="int4", group_size=32)
for h in H:
    t(f"raise_for_status({h!r})", lambda: raise_for_status(h))
    t(f"raise_for_status(0, {h!r})", lambda: raise_for_status(0, h))
    t(f"Status({h!r})", lambda: Status(h))
    t(f"prefix_keys({h!r})", lambda: prefix_keys(h, cfg))
    t(f"prefix_keys(ns={h!r})", lambda: prefix_keys([1]*16, cfg, h))
    t(f"prefix_keys(cfg={h!r})", lambda: prefix_keys([1]*16, h))
    for m in ("total_bytes", "blocks_for_budget", "tokens_for_budget"):
        t(f"cfg.{m}({h!r})", lambda: getattr(cfg, m)(h, 4))
        t(f"cfg.{m}(4,{h!r})", lambda: getattr(cfg, m)(4, h))
    t(f"ModelPreset({h!r})", lambda: hexcore.ModelPreset(h, 1, 1))
    c = PagedKVCache(cfg, 8, 4)
    ring = LockFreeRingBuffer(8, 4)
    for kw in ("num_blocks", "max_seqs", "max_blocks_per_seq"):
        args = dict(num_blocks=8, max_seqs=4, max_blocks_per_seq=4); args[kw] = h
        t(f"BlockTableMirror({kw}={h!r})", lambda: BlockTableMirror(ring, **args))
    t(f"BlockTableMirror(ring={h!r})", lambda: BlockTableMirror(h, 8, 4, 4))
    mir = BlockTableMirror(ring, 8, 4, 4)
    for meth in ("is_live", "block_table", "block_of", "match_keys"):
        t(f"mirror.{meth}({h!r})", lambda: getattr(mir, meth)(h))
    t(f"mirror.like({h!r})", lambda: BlockTableMirror.like(h, ring))
    t(f"attach_event_ring({h!r})", lambda: c.attach_event_ring(h))
    t(f"LockFreeRingBuffer({h!r})", lambda: LockFreeRingBuffer(h, 4))
    t(f"LockFreeRingBuffer(4,{h!r})", lambda: LockFreeRingBuffer(4, h))
    m = MetricsCollector()
    t(f"MetricsCollector({h!r})", lambda: MetricsCollector(h))
    t(f"metrics.observe({h!r})", lambda: m.observe(h, 1))
    t(f"metrics.set_gauges({h!r})", lambda: m.set_gauges(active_blocks=h))
    for meth in ("admit", "match_prefix", "pin_prefix", "unpin_prefix"):
        t(f"cache.{meth}({h!r})", lambda: getattr(c, meth)(h))
    t(f"SpeculativeAllocator({h!r})", lambda: SpeculativeAllocator(h))
    t(f"SpeculativeAllocator(c, {h!r})", lambda: SpeculativeAllocator(c, h))
report()
