"""Whole-block operations: copy blocks or tails in pairs (fork, migration), dequantize."""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda

from .._checks import as_int
from ..errors import HexcoreInvalidArgumentError
from .. import layout
from .arrays import (check_disjoint, check_distinct, check_outside_store, checked_ids, checked_layer, checked_store,
                     device_only)
from .device_layout import code_offset, key_meta_offset, value_meta_offset
from .launch import Launch, PreparedLaunch
from .store import DeviceKVStore
from .streams import resolve_stream

key_code_field = cuda.jit(device=True)(layout.key_code_field)
value_code_field = cuda.jit(device=True)(layout.value_code_field)
THREADS = 256


@cuda.jit
def _copy_runs_kernel(a, b, c, d, run_words, src_ids, dst_ids, units_per_layer):
    # a..d: flat uint32 arrays laid out [layer, unit, run]; run_words[k]: run length of
    # array k (0 = skip); grid (pairs, layers, arrays copied)
    pair = cuda.blockIdx.x
    layer = cuda.blockIdx.y
    which = cuda.blockIdx.z
    run = run_words[which]
    src = src_ids[pair]
    dst = dst_ids[pair]
    if run == 0 or src < 0 or dst < 0 or src >= units_per_layer or dst >= units_per_layer:
        return
    arr = a if which == 0 else (b if which == 1 else (c if which == 2 else d))
    s0 = (layer * units_per_layer + src) * run
    d0 = (layer * units_per_layer + dst) * run
    for w in range(cuda.threadIdx.x, run, cuda.blockDim.x):
        arr[d0 + w] = arr[s0 + w]


_COPIED = {"blocks": ("k_codes", "v_codes", "k_meta", "v_meta"), "tails": ("k_tails", "v_tails", None, None)}


def _copy_launch(store, what, src, dst) -> Launch:
    """Validate a copy's ids; the launch that does it.

    Host id arrays are range-checked, destinations must be distinct, and no id may be
    both a source and a destination (one launch would read and write it: a race).
    Device id arrays are checked for dtype and shape only (``arrays`` module).
    """
    store = checked_store(store)
    units = store.num_blocks if what == "blocks" else store.max_seqs
    ids = "blocks" if what == "blocks" else "slots"  # the parameter names: src_blocks, src_slots
    host = src, dst
    src = checked_ids(src, f"src_{ids}", None, units)
    dst = checked_ids(dst, f"dst_{ids}", src.shape[0], units)
    check_distinct(host[1], f"dst_{ids}")
    check_disjoint(*host, f"src_{ids}", f"dst_{ids}")
    check_outside_store(store, **{f"src_{ids}": src, f"dst_{ids}": dst})
    arrays = _copy_arrays(store, what)
    # grid z: one per copied array (FP16 blocks and tails have no metadata arrays)
    copied = sum(1 for name in _COPIED[what] if name and name in store.words)
    return Launch(_copy_runs_kernel, (src.shape[0], store.config.num_layers, copied), THREADS, (*arrays, src, dst,
                                                                                                  units))


def _copy_arrays(store, what: str) -> tuple:
    """The four flat uint32 arrays a copy of ``what`` reads and writes, and their run
    lengths as a device int64 ``[4]`` array: made once per store, so a copy allocates
    nothing (capture-safe once made)."""
    key = ("copy", what)
    found = store.constants.get(key)
    if found is None:
        units = store.num_blocks if what == "blocks" else store.max_seqs
        arrays = [store.words.get(n) if n else None for n in _COPIED[what]]
        runs = np.array([0 if a is None else a.shape[0] // (store.config.num_layers * units) for a in arrays],
                        np.int64)
        placeholder = next(a for a in arrays if a is not None)
        found = store.constants[key] = (*(placeholder if a is None else a for a in arrays), cuda.to_device(runs))
    return found


def _copy(store, what, src, dst, stream):
    _copy_launch(store, what, src, dst).run(resolve_stream(stream, src, dst))


def copy_blocks(store: DeviceKVStore, src_blocks, dst_blocks, stream=None) -> None:
    """Copy sealed blocks (codes and metadata, K and V, all layers) pairwise, one launch.

    ``src_blocks``, ``dst_blocks``: int32 ``[num_pairs]``; destinations distinct and
    none of them a source (checked for host arrays; see ``arrays``).
    """
    _copy(store, "blocks", src_blocks, dst_blocks, stream)


def copy_tails(store: DeviceKVStore, src_slots, dst_slots, stream=None) -> None:
    """Copy FP16 tails (K and V, all layers) pairwise, one launch (a fork copies one).

    ``src_slots``, ``dst_slots``: int32 ``[num_pairs]``; destinations distinct and
    none of them a source (checked for host arrays; see ``arrays``).
    """
    _copy(store, "tails", src_slots, dst_slots, stream)


def prepare_copy_blocks(store: DeviceKVStore, src_blocks, dst_blocks) -> PreparedLaunch:
    """``copy_blocks`` bound to fixed device id arrays (-1 pairs are padding); capture-safe."""
    return _prepared_copy(store, "blocks", src_blocks, dst_blocks)


def prepare_copy_tails(store: DeviceKVStore, src_slots, dst_slots) -> PreparedLaunch:
    """``copy_tails`` bound to fixed device id arrays (-1 pairs are padding); capture-safe."""
    return _prepared_copy(store, "tails", src_slots, dst_slots)


def _prepared_copy(store, what, src, dst) -> PreparedLaunch:
    ids = "blocks" if what == "blocks" else "slots"
    device_only(**{f"src_{ids}": src, f"dst_{ids}": dst})
    launch = _copy_launch(store, what, src, dst)
    if launch.empty:
        raise HexcoreInvalidArgumentError(f"src_{ids}: a prepared copy needs at least one pair, got 0")
    return launch.prepare()


@functools.cache
def _element_function(cfg):
    """``element(k_codes, v_codes, k_meta, v_meta, layer, block, h, t, d, num_blocks)``: the
    float32 (k, v) of one element of a sealed block, ``float32(scale) * code + float32(min)``
    (codes as flat uint32 words, meta flat float16); for an FP16 store the codes arrays are
    its flat float16 blocks and the value is read as stored."""
    H, BS, D, GS = cfg.num_kv_heads, cfg.block_size, cfg.head_dim, cfg.group_size
    bits, row, NG = cfg.kv_dtype.bits, cfg.row_bytes, cfg.num_groups
    mask = (1 << bits) - 1
    chunk = layout.value_chunk_dims(GS)
    quantized = cfg.kv_dtype.is_quantized

    @cuda.jit(device=True)
    def element(k_codes, v_codes, k_meta, v_meta, layer, block, h, t, d, num_blocks):
        if not quantized:
            at = code_offset(layer, block, h, t, num_blocks, H, BS, row) // 2 + d
            return np.float32(k_codes[at]), np.float32(v_codes[at])
        run = code_offset(layer, block, h, 0, num_blocks, H, BS, row) // 4
        word, field = key_code_field(d, bits)
        kq = np.float32((k_codes[run + t * (row // 4) + word] >> np.uint32(field * bits)) & mask)
        kmeta = key_meta_offset(layer, block, h, num_blocks, H, D) // 2
        k = np.float32(k_meta[kmeta + d]) * kq + np.float32(k_meta[kmeta + D + d])
        word, field = value_code_field(t, d, bits, D, chunk)
        vq = np.float32((v_codes[run + word] >> np.uint32(field * bits)) & mask)
        vmeta = value_meta_offset(layer, block, h, t, num_blocks, H, BS, NG) // 2
        return k, np.float32(v_meta[vmeta + d // GS]) * vq + np.float32(v_meta[vmeta + NG + d // GS])

    return element


@functools.cache
def _dequantize_kernel(cfg, rows: bool = False):
    """Sealed blocks ``block_ids`` back to float16, layers ``first_layer + blockIdx.y``:
    into ``[n, H, BS, D]`` (one layer, ``dequantize_blocks``) or, with ``rows``, into token
    rows ``[layers, n * BS, H, D]`` (what ``seal_rows`` reads: the re-seal). Ids out of
    range are skipped."""
    H, BS, D = cfg.num_kv_heads, cfg.block_size, cfg.head_dim
    element = _element_function(cfg)

    @cuda.jit
    def kernel(k_codes, v_codes, k_meta, v_meta, block_ids, first_layer, num_blocks, k_out, v_out):
        # codes: flat uint32 words (FP16: flat float16); meta: flat float16
        i = cuda.grid(1)
        n = block_ids.shape[0]
        if i >= n * H * BS * D:
            return
        d = i % D
        t = (i // D) % BS
        h = (i // (D * BS)) % H
        j = i // (D * BS * H)
        block = block_ids[j]
        if block < 0 or block >= num_blocks:
            return
        k, v = element(k_codes, v_codes, k_meta, v_meta, first_layer + cuda.blockIdx.y, block, h, t, d, num_blocks)
        if rows:
            k_out[cuda.blockIdx.y, j * BS + t, h, d] = k
            v_out[cuda.blockIdx.y, j * BS + t, h, d] = v
        else:
            k_out[j, h, t, d] = k
            v_out[j, h, t, d] = v

    return kernel


def dequantize_blocks(store: DeviceKVStore, layer: int, block_ids, stream=None):
    """Sealed blocks of one layer back to float16, for tests and debugging.

    Returns device arrays ``(k, v)``, each float16 ``[num_ids, H, block_size, D]``; the
    rows of device ids out of range are zeros (host ids are checked, and for FP16 stores
    device ids too).
    """
    cfg = checked_store(store).config
    layer, _ = checked_layer(layer, cfg.num_layers)
    stream = resolve_stream(stream, block_ids).numba
    ids = checked_ids(block_ids, "block_ids", None, store.num_blocks)
    if not cfg.kv_dtype.is_quantized:
        host = ids.copy_to_host()  # (a debugging path: device ids are read back, so checked here)
        bad = np.flatnonzero((host < 0) | (host >= store.num_blocks))
        if bad.size:
            raise HexcoreInvalidArgumentError(
                f"block_ids[{bad[0]}] = {host[bad[0]]} is outside [0, {store.num_blocks})")
        return (cuda.to_device(np.ascontiguousarray(store.k_codes[layer].copy_to_host()[host])),
                cuda.to_device(np.ascontiguousarray(store.v_codes[layer].copy_to_host()[host])))
    shape = (ids.shape[0], cfg.num_kv_heads, cfg.block_size, cfg.head_dim)
    # zeroed: the kernel skips device ids out of range, and those rows must not show stale memory
    k_out = cuda.to_device(np.zeros(shape, np.float16), stream=stream)
    v_out = cuda.to_device(np.zeros(shape, np.float16), stream=stream)
    total = int(np.prod(shape))
    if total:
        f, w = store.flat, store.words
        _dequantize_kernel(cfg)[(total + THREADS - 1) // THREADS, THREADS, stream](
            w["k_codes"], w["v_codes"], f["k_meta"], f["v_meta"], ids, layer, store.num_blocks, k_out, v_out)
    return k_out, v_out


def reseal_blocks(src: DeviceKVStore, src_ids, dst: DeviceKVStore, dst_ids, fitted_keys: bool = False,
                  stream=None, scratch=None, launch=None) -> None:
    """Re-seal blocks of one store into blocks of another kind (formats by age,
    ``docs/formats.md``): every layer of block ``src_ids[i]`` of ``src`` is unsealed to FP16
    rows, ``float16(float32(scale) * code + float32(min))`` (an FP16 block's rows as they
    are), and sealed from them into block ``dst_ids[i]`` of ``dst`` as ``seal_rows`` seals
    rows (``fitted_keys`` as there). Two launches, through a device scratch of the rows.

    ``src_ids``, ``dst_ids``: int32 ``[n]`` (host arrays are range-checked), distinct
    destinations. The two stores must be alike but for their ``kv_dtype``. ``scratch``:
    ``(shape, dtype) -> device array`` for the rows (``Uploads.scratch``; default: allocated).
    ``launch``: how the two launches run, ``launch(Launch, stream)`` (``Relaunch.run``;
    default: eagerly). Both are checked before either runs.
    """
    from .write import seal_rows_launch

    a, b = checked_store(src).config, checked_store(dst).config
    if (a.num_layers, a.num_kv_heads, a.head_dim, a.block_size) != (b.num_layers, b.num_kv_heads, b.head_dim,
                                                                    b.block_size):
        raise HexcoreInvalidArgumentError("dst: its shape differs from src's (only kv_dtype may)")
    stream = resolve_stream(stream, src_ids, dst_ids)
    ids = checked_ids(src_ids, "src_ids", None, src.num_blocks)
    n = ids.shape[0]
    if getattr(dst_ids, "shape", None) != (n,):
        raise HexcoreInvalidArgumentError(f"dst_ids: expected shape ({n},) like src_ids, got "
                                          f"{getattr(dst_ids, 'shape', type(dst_ids).__name__)}")
    if n == 0:
        return
    H, BS, D = a.num_kv_heads, a.block_size, a.head_dim
    rows = (a.num_layers, n * BS, H, D)
    if scratch is None:
        k_rows = cuda.device_array(rows, np.float16, stream=stream.numba)
        v_rows = cuda.device_array(rows, np.float16, stream=stream.numba)
    else:
        k_rows, v_rows = scratch(rows, np.float16), scratch(rows, np.float16)
    f, w = src.flat, src.words
    codes = (w["k_codes"], w["v_codes"], f["k_meta"], f["v_meta"]) if a.kv_dtype.is_quantized else (
        f["k_codes"], f["v_codes"], f["k_codes"], f["v_codes"])  # (FP16: no meta, the slots unused)
    grid = (-(-n * H * BS * D // THREADS), a.num_layers)
    unseal = Launch(_dequantize_kernel(a, rows=True), grid, THREADS, (*codes, ids, 0, src.num_blocks, k_rows, v_rows))
    launches = (unseal, seal_rows_launch(dst, k_rows, v_rows, 0, dst_ids, fitted_keys=fitted_keys))
    for one in launches:
        (launch or Launch.run)(one, stream)


def run_tiered_ops(stores: list, ops: np.ndarray, fitted_keys: bool = False, rows=None, stream=None,
                   upload=None, scratch=None, launch=None) -> None:
    """Run a ``TieredKVCache`` step's operations (``TieredStep.ops``, int32 ``[n, 6]``) on its
    pools' stores (``stores[k]`` for pool ``k``), in order, a run of alike operations at a
    time: a seal seals tail slot ``seq_id`` of ``stores[kind]`` into ``block``; a re-seal is
    :func:`reseal_blocks`. ``fitted_keys``: the format's, applied to 2-bit pools.

    ``rows``: ``(k, v, first)`` for the operations of one sequence's ``TieredKVCache.grow``
    (a prompt): ``k``, ``v`` float16 ``[L, n, H, D]`` hold its tokens ``first ..``; a block
    that starts at or after token ``first`` is sealed from them (``seal_rows``), the one the
    tail was filling from the tail (complete it with ``append`` first). ``stream``: where
    every launch goes (``streams.resolve_stream``; default: torch's current stream when
    ``rows`` are torch tensors, else the default stream). ``upload`` (without ``rows``): the
    runs' id arrays go to the device in one call of it (a list of host int32 arrays ->
    device views, ``Uploads.put``), checked here on the host first; ``scratch``: the
    re-seals' (``reseal_blocks``); ``launch`` (without ``rows``): how the seals' and
    re-seals' launches run, ``launch(Launch, stream)`` (``Relaunch.run``; default: eagerly)."""
    from .write import seal, seal_launch, seal_rows

    from ..host.tiered import OP_BLOCK, OP_LOGICAL, OP_SEQ, OP_SRC_BLOCK

    _check_tiered_ops(stores, ops)
    if rows is not None:
        if not (isinstance(rows, tuple) and len(rows) == 3):
            raise HexcoreInvalidArgumentError(f"rows: expected (k, v, first) or None, got {type(rows).__name__}")
        rows = (rows[0], rows[1], as_int("rows[2]", rows[2], low=0))
    stream = resolve_stream(stream, *(rows[:2] if rows is not None else ()))
    runs = _alike_runs(ops)
    ids = [(np.ascontiguousarray(run[:, OP_SEQ] if src < 0 else run[:, OP_SRC_BLOCK]),
            np.ascontiguousarray(run[:, OP_BLOCK])) for src, _, run in runs]
    if upload is not None and rows is None:  # (device ids are not checked by the launches: done here)
        for _, blocks in ids:
            check_distinct(blocks, "ops' destination blocks")
        staged = upload([a for pair in ids for a in pair])
        ids = list(zip(staged[0::2], staged[1::2]))
    run_launch = launch if launch is not None and rows is None else Launch.run
    for (src, kind, run), (first, blocks) in zip(runs, ids):
        fit = fitted_keys and stores[kind].config.kv_dtype.bits == 2
        bs = stores[kind].config.block_size
        if src < 0 and rows is not None and int(run[0, OP_LOGICAL]) * bs >= rows[2]:
            # a prompt's whole blocks, consecutive in a grow: one seal_rows from their first row
            seal_rows(stores[kind], rows[0], rows[1], int(run[0, OP_LOGICAL]) * bs - rows[2], blocks,
                      fitted_keys=fit, stream=stream)
        elif src < 0 and rows is not None and len(run) > 1:  # the tail's block first, then the prompt's
            seal(stores[kind], first[:1], blocks[:1], fitted_keys=fit, stream=stream)
            seal_rows(stores[kind], rows[0], rows[1], int(run[1, OP_LOGICAL]) * bs - rows[2], blocks[1:],
                      fitted_keys=fit, stream=stream)
        elif src < 0:
            run_launch(seal_launch(stores[kind], first, blocks, fitted_keys=fit), stream)
        else:
            reseal_blocks(stores[src], first, stores[kind], blocks, fitted_keys=fit, stream=stream, scratch=scratch,
                          launch=run_launch)


def _check_tiered_ops(stores: list, ops: np.ndarray) -> None:
    """Raise HexcoreInvalidArgumentError unless ``stores`` are DeviceKVStores and ``ops`` an
    int32 ``[n, 6]`` array whose pools, blocks and sequence slots are within them."""
    from ..host.tiered import OP_BLOCK, OP_KIND, OP_SEQ, OP_SRC_BLOCK, OP_SRC_KIND

    if not isinstance(stores, (list, tuple)) or not stores:
        raise HexcoreInvalidArgumentError(f"stores: expected a non-empty list of DeviceKVStore, got {stores!r:.60}")
    for p, store in enumerate(stores):
        if not isinstance(store, DeviceKVStore):
            raise HexcoreInvalidArgumentError(f"stores[{p}]: expected a DeviceKVStore, got {type(store).__name__}")
    if not (isinstance(ops, np.ndarray) and ops.dtype == np.int32 and ops.ndim == 2 and ops.shape[1] == 6):
        raise HexcoreInvalidArgumentError(f"ops: expected an int32 [n, 6] array (TieredStep.ops), got "
                                          f"{getattr(ops, 'dtype', type(ops).__name__)} {getattr(ops, 'shape', '')}")
    kind, src = ops[:, OP_KIND], ops[:, OP_SRC_KIND]
    bad = np.flatnonzero((kind < 0) | (kind >= len(stores)) | (src < -1) | (src >= len(stores)))
    if bad.size:
        raise HexcoreInvalidArgumentError(f"ops[{bad[0]}]: a pool outside [0, {len(stores)}): {ops[bad[0]].tolist()}")
    blocks = np.array([store.num_blocks for store in stores])
    seqs = np.array([store.max_seqs for store in stores])
    reseal = src >= 0
    first_ok = np.where(reseal, (ops[:, OP_SRC_BLOCK] >= 0) & (ops[:, OP_SRC_BLOCK] < blocks[np.maximum(src, 0)]),
                        (ops[:, OP_SEQ] >= 0) & (ops[:, OP_SEQ] < seqs[kind]))
    bad = np.flatnonzero(~first_ok | (ops[:, OP_BLOCK] < 0) | (ops[:, OP_BLOCK] >= blocks[kind]))
    if bad.size:
        raise HexcoreInvalidArgumentError(f"ops[{bad[0]}]: a block or sequence slot outside its pool's store: "
                                          f"{ops[bad[0]].tolist()}")


def _alike_runs(ops: np.ndarray) -> list:
    """``ops`` cut into runs of one (source pool, pool): ``(src, kind, ops[i:j])`` in order."""
    from ..host.tiered import OP_KIND, OP_SRC_KIND

    runs, i = [], 0
    while i < len(ops):
        src, kind = int(ops[i, OP_SRC_KIND]), int(ops[i, OP_KIND])
        j = i
        while j < len(ops) and int(ops[j, OP_SRC_KIND]) == src and int(ops[j, OP_KIND]) == kind:
            j += 1
        runs.append((src, kind, ops[i:j]))
        i = j
    return runs
