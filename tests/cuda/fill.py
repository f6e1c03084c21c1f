"""Filled stores for kernel tests: random sequences in a poisoned store, with the exact
(dequantized) keys and values a float64 reference attends over."""

from __future__ import annotations

import numpy as np

from hexcore import KVDtype
from hexcore.cuda import DeviceKVStore
from tests import reference as ref


def _random_values(rng, shape, value_range):
    """float16 values of ``shape``: standard normal, or uniform in +-value_range."""
    if value_range is None:
        return rng.standard_normal(shape).astype(np.float16)
    return rng.uniform(-value_range, value_range, shape).astype(np.float16)


def random_cache(cfg, seq_lens, rng, spare: int = 2, layer: int = 0, value_range: float | None = None):
    """A poisoned store holding random sequences in ``layer``: (store, tables, tails, keys, values).

    Block ids are shuffled; the first sealed block of the last sequence is shared with the
    first sequence (as after a fork); table entries past a sequence's blocks point at a
    never-written (NaN / 0xFF) block, so a read past the end shows. ``keys[b]``,
    ``values[b]``: float64 ``[H, seq_lens[b], D]`` as the cache holds them (sealed blocks
    dequantized, the tail exact). Quantization is vectorised over all blocks. Values are
    standard normal, or with ``value_range`` uniform in ``[-value_range, value_range]``.
    """
    B, H, BS, D = len(seq_lens), cfg.num_kv_heads, cfg.block_size, cfg.head_dim
    sealed = [n // BS for n in seq_lens]
    shared = B > 1 and sealed[0] > 0 and sealed[-1] > 0
    owned = sum(sealed) - (1 if shared else 0)
    num_blocks = owned + spare
    store = DeviceKVStore(cfg, num_blocks=num_blocks, max_seqs=B + 1)
    store.poison()
    host = {name: a.copy_to_host() for name, a in store.arrays.items()}
    perm = rng.permutation(num_blocks).astype(np.int32)
    scales = rng.uniform(0.5, 2, size=(max(owned, 1), 1, 1, 1))
    k = (rng.standard_normal((owned, H, BS, D)) * scales).astype(np.float16)
    v = _random_values(rng, (owned, H, BS, D), value_range)
    dk, dv = _store_blocks(host, layer, perm[:owned], k, v, cfg)
    tables = np.full((B, max(max(sealed), 1) + 1), perm[-1], np.int32)
    tails = rng.permutation(B + 1)[:B].astype(np.int32)
    keys, values, used = [], [], 0
    for b, n in enumerate(seq_lens):
        index = []
        for j in range(sealed[b]):
            if shared and b == B - 1 and j == 0:
                index.append(0)  # sequence 0's first block
            else:
                index.append(used)
                used += 1
        tables[b, :sealed[b]] = perm[index]
        r = n % BS
        tk = rng.standard_normal((H, r, D)).astype(np.float16)
        tv = _random_values(rng, (H, r, D), value_range)
        host["k_tails"][layer, tails[b], :, :r], host["v_tails"][layer, tails[b], :, :r] = tk, tv
        keys.append(np.concatenate([*(dk[i] for i in index), tk.astype(np.float64)], axis=1))
        values.append(np.concatenate([*(dv[i] for i in index), tv.astype(np.float64)], axis=1))
    for name, array in store.arrays.items():
        array.copy_to_device(host[name])
    return store, tables, tails, keys, values


def _store_blocks(host, layer, ids, k, v, cfg):
    """Write blocks k, v ``[n, H, BS, D]`` into the host copies; returns them as the cache
    holds them (float64, dequantized when quantized)."""
    n, H, BS, D = k.shape
    if n == 0:  # nothing sealed: no codes to write
        return k.astype(np.float64), v.astype(np.float64)
    if cfg.kv_dtype is KVDtype.FP16:
        host["k_codes"][layer, ids], host["v_codes"][layer, ids] = k, v
        return k.astype(np.float64), v.astype(np.float64)
    bits, gs = cfg.kv_dtype.bits, cfg.group_size
    kc, km = ref.quantize_keys(k.reshape(n * H, BS, D), bits)
    vc, vm = ref.quantize_values(v.reshape(n * H, BS, D), bits, gs)
    host["k_codes"][layer, ids] = kc.reshape(n, H, BS, -1)
    host["k_meta"][layer, ids] = km.reshape(n, H, 2, D)
    host["v_codes"][layer, ids] = vc.reshape(n, H, BS, -1)
    host["v_meta"][layer, ids] = vm.reshape(n, H, BS, 2, -1)
    dk = ref.dequantize_keys(kc, km, bits).reshape(n, H, BS, D)
    dv = ref.dequantize_values(vc, vm, bits, gs).reshape(n, H, BS, D)
    return dk, dv


def random_store(cfg, rng, num_blocks=5, max_seqs=2) -> DeviceKVStore:
    """A store whose arrays hold random words (guards intact)."""
    store = DeviceKVStore(cfg, num_blocks, max_seqs)
    store.pool.copy_to_device(rng.integers(0, 1 << 32, store.pool.shape[0], dtype=np.uint32))
    store.fill_guards()
    return store


def host_block(store, block) -> tuple:
    """A host copy of ``block``'s sealed arrays: (k_codes, v_codes, k_meta, v_meta), each
    ``[L, ...]`` (the metadata None for FP16), as the CPU digests take them."""
    a = {name: array.copy_to_host()[:, block] for name, array in store.arrays.items() if "tails" not in name}
    return a["k_codes"], a["v_codes"], a.get("k_meta"), a.get("v_meta")
