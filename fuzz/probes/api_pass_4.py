"""Hostile values into the entry points added in the third session (pass 4): the block
manager's quarantine, migration and truncation edits and seq_lens, each with the prefix
cache off and on, and the Engine's speculative / fault_tolerance options. Prints
every call that ended in anything but a typed error, and every call that raised but left
the block manager's state changed or its invariants broken.
NUMBA_ENABLE_CUDASIM=1 python fuzz/probes/api_pass_4.py"""
import numpy as np

from _probe import RAW, report, t
from hexcore import KVCacheConfig, PagedKVCache
from hexcore.engine import Engine

H = [None, True, 1.5, float("nan"), -1, 10**30, "3", [1], object(), np.array([1]), np.zeros((2, 2)),
     np.int64(2), np.uint8(1), 7, 10**6]
ARRAYS = [np.array([0, 1], np.int32), np.array([-1, 3]), np.array([1.5, 2.0]), np.array([10**9, 2]), np.zeros(0),
          np.array([[1, 2]]), [2, 3], np.array([2, 2], np.int32), np.array([3, 4], np.int64)]


def fresh(prefix: bool) -> PagedKVCache:
    cfg = KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=64, block_size=16)
    cache = PagedKVCache(cfg, num_blocks=16, max_seqs=4, prefix_cache=prefix)
    seq = cache.add_sequence()
    tokens = np.arange(40, dtype=np.int32)
    cache.step(np.array([seq], np.int32), np.array([40], np.int32),  # two sealed blocks and a tail
               tokens=tokens if prefix else None, token_starts=np.array([0, 40], np.int32) if prefix else None)
    return cache


def unchanged(label: str, cache: PagedKVCache, fn) -> None:
    """``fn()`` must leave the state as it found it when it raises."""
    before = (cache.block_states().copy(), cache.num_free_blocks, cache.seq_len(0))
    try:
        fn()
    except Exception:
        after = (cache.block_states(), cache.num_free_blocks, cache.seq_len(0))
        if not (np.array_equal(before[0], after[0]) and before[1:] == after[1:]):
            RAW.append(f"{label}: state changed by a refused call")
        raise
    finally:
        try:
            cache.check_invariants()
        except Exception as e:  # noqa: BLE001
            RAW.append(f"{label}: invariants: {type(e).__name__}: {e}")


for prefix in (False, True):
    for h in H:
        for name in ("quarantine_block", "is_quarantined", "block_references", "prepare_free_blocks"):
            c = fresh(prefix)
            t(f"{name}({h!r}, prefix={prefix})", lambda: unchanged(name, c, lambda: getattr(c, name)(h)))
        c = fresh(prefix)
        t(f"replace_blocks(seq={h!r}, prefix={prefix})",
          lambda: unchanged("replace_blocks", c, lambda: c.replace_blocks(h, np.array([5, 6, 7], np.int32))))
        c = fresh(prefix)
        t(f"truncate_sequence(0, {h!r}, prefix={prefix})",
          lambda: unchanged("truncate_sequence", c, lambda: c.truncate_sequence(0, h)))
        c = fresh(prefix)
        t(f"truncate_sequence({h!r}, 32, prefix={prefix})",
          lambda: unchanged("truncate_sequence", c, lambda: c.truncate_sequence(h, 32)))
        for new_len in (-1, 1, 17, 31, 41, 2**40):  # inside a sealed block, past the end, negative
            c = fresh(prefix)
            t(f"truncate_sequence(0, {new_len}, prefix={prefix})",
              lambda: unchanged("truncate_sequence", c, lambda: c.truncate_sequence(0, new_len)))
    for a in ARRAYS:
        c = fresh(prefix)
        t(f"replace_blocks(0, {a!r}, prefix={prefix})", lambda: unchanged("replace_blocks", c, lambda: c.replace_blocks(0, a)))
        c = fresh(prefix)
        t(f"seq_lens({a!r}, prefix={prefix})", lambda: unchanged("seq_lens", c, lambda: c.seq_lens(a)))
cfg = KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=64, block_size=16)
for h in H + [{"bogus": 1}, {"policy": "x"}, {"sample_every": 0}, {"capacity": -1}, {"max_verify_blocks": 0}]:
    t(f"Engine(speculative={h!r})", lambda: Engine(cfg, 8, 2, 1, speculative=h))
    t(f"Engine(fault_tolerance={h!r})", lambda: Engine(cfg, 8, 2, 1, fault_tolerance=h))
    e = Engine(cfg, 8, 2, 1)
    t(f"engine.truncate({h!r}, 0)", lambda: e.truncate(h, 0))
    t(f"engine.check({h!r})", lambda: e.check(h))
report()
