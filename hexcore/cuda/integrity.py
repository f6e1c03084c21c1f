"""Integrity on the GPU: block checksums of many sealed blocks in one launch, canary checks,
and fault injection for tests and demos.

One launch, ``grid (num_items + 1, ceil(L / W))``, ``W = min(WARPS, L)`` warps a CTA: warp
``w`` of CTA ``(i, y)`` computes the digest of block ``block_ids[i]`` in layer ``y * W + w``
exactly as ``hexcore.host.checksum`` defines it (lane ``j`` of the warp runs FNV-1a chain
``j`` over 16-byte chunks ``j, j + 32, ...`` of each segment; lane 0 folds the 32 chains).
The last CTA of the grid checks the store's guard regions (``DeviceKVStore.guard_offsets``).

Modes (what ``out[i, layer]`` receives; ``sums`` is ``[num_blocks, L]`` uint32):

- ``COMPUTE``: the digest;
- ``RECORD``: the digest, also stored in ``sums[block, layer]`` (at seal);
- ``VERIFY``: the digest XOR ``sums[block, layer]``: zero where the block is intact.

``guard_bad[g]`` receives the number of words of guard region ``g`` that differ from
their canary pattern. Items whose block id is out of range (-1 padding) are skipped and
their ``out`` rows left as they were.

Optional flags (a verification inside a step graph, whose ``out`` nobody reads unless
something is wrong): ``flags`` uint32 ``[2]`` accumulates, with atomics, the number of
``VERIFY`` mismatches (``flags[0]``, one per (item, layer)) and of bad guard words
(``flags[1]``); mismatch ``k`` (the value ``flags[0]`` had) also writes ``(block, layer)``
into row ``k`` of ``found`` int32 ``[F, 2]`` when ``k < F``. The kernel never clears them:
the reader does, after reading a non-zero count. Empty ``flags`` (the default) turn this off.

Head digests (``hexcore.host.checksum``, "The head digest": per (block, layer, KV head),
order-free): ``head_record_launch`` records them into ``head_sums`` uint32 ``[num_blocks, L,
H]``, grid ``(n, L, ceil(H / W))`` (or ``(n, 1, ...)`` for one layer), ``W = min(WARPS, H)`` warps
a CTA, warp ``w`` of CTA ``(i, layer, y)`` taking head ``y * W + w`` of block ``block_ids[i]``
(lane ``j`` sums the terms of
16-byte chunks ``j, j + 32, ...`` of each segment, the warp adds the lanes' sums). The
decode kernel checks sampled blocks against them as it reads them (``attention/kernel.py``,
``verify``); ``head_key``, ``head_key_opaque``, ``head_key_ahead``, ``head_term``, ``head_mix`` and
``head_add`` are the device functions both use. For INT4/INT2 caches the recorded digest is
the tensor-core head digest (``hexcore/host/tensor_digest.py``): the warp stages each chunk's
words as the decode's ring holds them and runs them through the integer mma
(``dense_chunk_function``, ``dense_lane_words``, ``dense_weight``, ``dense_close``: the
device functions the record kernel and the decode's verify share).
"""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda, uint32, uint64

from ..config import KVCacheConfig
from ..errors import HexcoreInvalidArgumentError
from .._checks import as_int, shown
from ..host.checksum import FNV32_BASIS, FNV32_PRIME, HEAD_K1, HEAD_K2, HEAD_M1, HEAD_M2, LANES, canary_word
from ..host.tensor_digest import (DENSE_C1, DENSE_C2, DENSE_C3, DENSE_SALT, EVEN_BYTES, MAX_STEPS, ODD_BYTES,
                                  STEP_WORDS, chunk_tokens, chunk_words)
from .arrays import check_writes, checked, checked_ids, checked_layer, checked_store, device_only
from .mma import mma_u8s8
from .device import SIMULATOR, add_u32, load_u32x2, load_u32x4, mad_u32, shfl_xor_u32, xor_rotl_and_u32, xorshift_u32
from .device_layout import code_offset, key_meta_offset, value_meta_offset
from .launch import Launch, PreparedLaunch
from .store import GUARD_WORDS, DeviceKVStore
from .streams import resolve_stream

COMPUTE, RECORD, VERIFY = 0, 1, 2
MODES = {"compute": COMPUTE, "record": RECORD, "verify": VERIFY}
WARPS = 4  # layers per CTA, a warp each
_canary = cuda.jit(device=True)(canary_word)
_PRIME = np.uint64(FNV32_PRIME)
_MASK = np.uint64(0xFFFFFFFF)


@cuda.jit(device=True, inline=True)
def _step(h, w):
    # in 64 bits then truncated (LLVM narrows it to one 32-bit multiply; the simulator's
    # numpy scalars would warn on a uint32 overflow)
    return uint32((uint64(h ^ w) * _PRIME) & _MASK)


@cuda.jit(device=True, inline=True)
def _absorb(h, pool, start, words, lane):
    # chunks lane, lane + 32, ... of pool[start:start + words] into chain h, two loads in flight
    chunks = words // 4
    c = lane
    while c + LANES < chunks:
        a0, a1, a2, a3 = load_u32x4(pool, start + 4 * c)
        b0, b1, b2, b3 = load_u32x4(pool, start + 4 * (c + LANES))
        h = _step(_step(_step(_step(h, a0), a1), a2), a3)
        h = _step(_step(_step(_step(h, b0), b1), b2), b3)
        c += 2 * LANES
    if c < chunks:
        a0, a1, a2, a3 = load_u32x4(pool, start + 4 * c)
        h = _step(_step(_step(_step(h, a0), a1), a2), a3)
    return h


@cuda.jit(device=True, inline=True)
def head_key(i):
    """``key(i) = (i * HEAD_K1 + HEAD_K2) mod 2**32`` of word index ``i`` (``0 <= i < 2**32``)."""
    return mad_u32(i, HEAD_K1, HEAD_K2)


@cuda.jit(device=True, inline=True)
def head_key_opaque(i):
    """``head_key(i)`` passed through a shuffle from the lane itself (every lane of the warp
    calls it), so that LLVM cannot see the index's multiply: ``head_term(w,
    head_key_ahead(k, n))`` with a compile-time ``n`` is then one IADD3 ``w + k + n *
    HEAD_K1`` a word, where LLVM folds the multiply into every word (an IMAD and a VIADD).
    (An inline-assembly move was dropped for a wrong store address in its test kernel; that
    was NVVM's optimizer, which misplaces a loop's stores into a 2-D array whose row length is
    known only at run time with no shuffle or assembly in sight:
    ``benchmarks/experiments/2026-12-05-s43/ahead_probe.py``.) The simulator,
    where a shuffle is a warp barrier in Python and there is no LLVM to hide from, returns
    ``head_key(i)`` as it is (the same value)."""
    if SIMULATOR:
        return head_key(i)
    return shfl_xor_u32(head_key(i), 0)


@cuda.jit(device=True, inline=True)
def head_key_ahead(key, n):
    """``key(i + n)`` from ``key = key(i)`` (uint32): ``key + n * HEAD_K1 mod 2**32``, one add
    where ``n`` is a compile-time constant (an unrolled loop's index too)."""
    return add_u32(key, mad_u32(n, HEAD_K1, 0))


@cuda.jit(device=True, inline=True)
def head_mix(x):
    """The term of a word whose ``w + key(i)`` is ``x`` (uint32; ``checksum.head_term``), in
    32-bit instructions (``device.mad_u32``, ``xorshift_u32``)."""
    x = mad_u32(xorshift_u32(x, 16), HEAD_M1, 0)
    x = mad_u32(xorshift_u32(x, 13), HEAD_M2, 0)
    return xorshift_u32(x, 16)


@cuda.jit(device=True, inline=True)
def head_term(w, key):
    """The term of word ``w`` (uint32) whose index has key ``key`` (``checksum.head_term``):
    the mixer of ``w + key mod 2**32`` (``key`` from ``head_key``, ``head_key_ahead``)."""
    return head_mix(add_u32(w, key))


@cuda.jit(device=True, inline=True)
def head_add(total, x):
    """``total + x mod 2**32`` (uint32, one 32-bit add)."""
    return add_u32(total, x)


@cuda.jit(device=True, inline=True)
def head_chunk(total, a0, a1, a2, a3, key):
    """``total`` plus the terms of four consecutive words whose first index has ``key``."""
    total = head_add(total, head_term(a0, key))
    total = head_add(total, head_term(a1, head_key_ahead(key, 1)))
    total = head_add(total, head_term(a2, head_key_ahead(key, 2)))
    return head_add(total, head_term(a3, head_key_ahead(key, 3)))


@cuda.jit(device=True, inline=True)
def warp_sum_u32(x):
    """The sum mod 2**32 of ``x`` over the warp's 32 lanes, in every lane (every lane calls it)."""
    for mask in (16, 8, 4, 2, 1):
        x = head_add(x, shfl_xor_u32(x, mask))
    return x


# -- the tensor-core head digest of quantized blocks (hexcore/host/tensor_digest.py) ---------
@cuda.jit(device=True, inline=True)
def dense_lane_words(sub, lane):
    """(base_0, base_1, r_0, r_1): the words lane ``lane``'s weights of chunk ``sub`` are made
    from (``tensor_digest.lane_weights``)."""
    m = head_term(uint32(DENSE_SALT), head_key(32 * sub + lane))
    return (_opaque(uint32(m | uint32(ODD_BYTES))), uint32(mad_u32(m, DENSE_C1, 0) | uint32(ODD_BYTES)),
            _opaque(mad_u32(m, DENSE_C2, 0)), _opaque(mad_u32(m, DENSE_C3, 0)))


@cuda.jit(device=True, inline=True)
def _opaque(x):
    # x through a shuffle from the lane itself (every lane calls it): ptxas then keeps it in a
    # register and rotates it in one funnel shift a step, where it rebuilt rotl(m * C, n) from
    # m in a shift and a multiply-add (head_key_opaque's reason too)
    if SIMULATOR:
        return x
    return shfl_xor_u32(x, 0)


@cuda.jit(device=True, inline=True)
def dense_weight(base, r, step):
    """Weight word ``b_j`` of step ``step`` (< ``MAX_STEPS``) from its lane's ``base_j``, ``r_j``:
    ``base ^ (rotl(r, 2 step + 1) & 0xFEFEFEFE)``."""
    return xor_rotl_and_u32(base, r, 2 * step + 1, EVEN_BYTES)


@cuda.jit(device=True, inline=True)
def dense_close(c0, c1, c2, c3, lane):
    """The lane's share of the digest: its accumulator entries ``2 lane``, ``2 lane + 1``,
    ``2 lane + 64``, ``2 lane + 65`` through ``head_term`` with their indices' keys (every
    lane of the warp calls it; ``warp_sum_u32`` adds the shares)."""
    key = head_key_opaque(2 * lane)
    total = head_add(head_term(c0, key), head_term(c1, head_key_ahead(key, 1)))
    return head_add(total, head_add(head_term(c2, head_key_ahead(key, 64)), head_term(c3, head_key_ahead(key, 65))))


def _dense_steps(words: int) -> int:
    """The mma steps of a staged chunk of ``words`` words (a multiple of 4, at most
    ``MAX_STEPS`` steps)."""
    steps = -(-words // STEP_WORDS)
    if steps > MAX_STEPS or words % 4:
        raise ValueError(f"a staged chunk of {words} words: not whole 16-byte groups, or more than {MAX_STEPS} steps")
    return steps


def _dense_steps_function(words: int, load4, weights):
    """``dense_steps(c0, c1, c2, c3, src, at, ws, lane)``: the accumulators after the mma steps
    of one staged chunk of ``words`` words; ``load4(src, at, p)`` returns staged words ``p ..
    p + 3`` (steps past the chunk's end read zeros), ``weights(ws, s, lane)`` the lane's two
    weight words of step ``s``."""
    steps, WHOLE = _dense_steps(words), words % STEP_WORDS == 0

    @cuda.jit(device=True, inline=True)
    def dense_steps(c0, c1, c2, c3, src, at, ws, lane):
        for s in range(steps):
            p = STEP_WORDS * s + 4 * lane
            a0 = a1 = a2 = a3 = uint32(0)
            if WHOLE or p < words:
                a0, a1, a2, a3 = load4(src, at, p)
            b0, b1 = weights(ws, s, lane)
            c0, c1, c2, c3 = mma_u8s8(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3)
        return c0, c1, c2, c3

    return dense_steps


@cuda.jit(device=True, inline=True)
def _computed_weights(ws, s, lane):
    # ws: the lane's (base_0, base_1, r_0, r_1)
    return dense_weight(ws[0], ws[2], s), dense_weight(ws[1], ws[3], s)


@cuda.jit(device=True, inline=True)
def _tabled_weights(ws, s, lane):
    # ws: (table, at): the lane's two words of step s at at + 64 s + 2 lane (dense_table_functions)
    return load_u32x2(ws[0], ws[1] + 64 * s + 2 * lane)


def dense_chunk_function(words: int, load4):
    """``dense_chunk(c0, c1, c2, c3, src, at, sub, lane)``: the accumulators after the mma
    steps of one staged chunk of ``words`` words (a compile-time size, a multiple of 4) of
    chunk index ``sub``. ``load4(src, at, p)`` (a device function) returns staged words ``p ..
    p + 3`` (``p`` a multiple of 4 below ``words``); steps past the chunk's end read zeros.
    Every lane of the warp calls it, with the same ``sub``."""
    dense_steps = _dense_steps_function(words, load4, _computed_weights)

    @cuda.jit(device=True, inline=True)
    def dense_chunk(c0, c1, c2, c3, src, at, sub, lane):
        return dense_steps(c0, c1, c2, c3, src, at, dense_lane_words(sub, lane), lane)

    return dense_chunk


def dense_table_words(words: int) -> int:
    """uint32 words of ``dense_table_functions``' table for a staged chunk of ``words`` words."""
    return 2 * 32 * _dense_steps(words)


def dense_table_functions(words: int, load4):
    """Chunk 0's weights kept in shared memory, for a kernel that digests many one-chunk
    blocks: ``(TABLE, fill, dense_chunk0)``. ``TABLE``: the words a warp's table takes (``2 *
    32 * steps``, uint32, 8-byte aligned at ``at``); ``fill(table, at, lane)``: every lane of
    the warp writes its own weight words of every step (lane ``l``'s two of step ``s`` at
    ``at + 64 s + 2 l``; each lane reads back only its own, so a warp reading its own table
    needs no barrier; the decode shares one table among the CTA's warps, filled by warp 0,
    behind a CTA barrier);
    ``dense_chunk0(c0, c1, c2, c3, src, src_at, table, at, lane)``: ``dense_chunk`` of chunk
    index 0 with one 8-byte shared load a step for its weights, where ``dense_chunk`` makes
    them (two funnel shifts and two logic ops a step, and the lane's words a chunk)."""
    steps = _dense_steps(words)
    dense_steps = _dense_steps_function(words, load4, _tabled_weights)

    @cuda.jit(device=True, inline=True)
    def fill(table, at, lane):
        base0, base1, r0, r1 = dense_lane_words(0, lane)
        for s in range(steps):
            table[at + 64 * s + 2 * lane] = dense_weight(base0, r0, s)
            table[at + 64 * s + 2 * lane + 1] = dense_weight(base1, r1, s)

    @cuda.jit(device=True, inline=True)
    def dense_chunk0(c0, c1, c2, c3, src, src_at, table, at, lane):
        return dense_steps(c0, c1, c2, c3, src, src_at, (table, at), lane)

    return dense_table_words(words), fill, dense_chunk0


@cuda.jit(device=True, inline=True)
def staged_load4(ring, stage, p):
    """Words ``p .. p + 3`` of the chunk staged at ``ring[stage:]`` (one 16-byte shared load)."""
    return load_u32x4(ring, stage + p)


def _record_load4_function(KC: int, KM: int):
    """``load4(pool, at, p)``: staged word ``p`` of a chunk read from the store, ``at`` the
    word offsets in ``pool`` of the chunk's key codes, value codes (``KC`` words each), key
    meta (``KM`` words) and value meta."""

    @cuda.jit(device=True, inline=True)
    def load4(pool, at, p):
        if p < KC:
            return load_u32x4(pool, at[0] + p)
        if p < 2 * KC:
            return load_u32x4(pool, at[1] + p - KC)
        if p < 2 * KC + KM:
            return load_u32x4(pool, at[2] + p - 2 * KC)
        return load_u32x4(pool, at[3] + p - 2 * KC - KM)

    return load4


@cuda.jit(device=True, inline=True)
def _head_segment(total, pool, start, words, first, lane):
    # the terms of chunks lane, lane + 32, ... of pool[start:start + words], word j of the
    # segment at index first + j
    for c in range(lane, words // 4, LANES):
        a0, a1, a2, a3 = load_u32x4(pool, start + 4 * c)
        total = head_chunk(total, a0, a1, a2, a3, head_key(first + 4 * c))
    return total


@functools.cache
def _head_record_kernel(cfg: KVCacheConfig):
    L, H, BS, D, NG, row = cfg.num_layers, cfg.num_kv_heads, cfg.block_size, cfg.head_dim, cfg.num_groups, cfg.row_bytes
    quantized = cfg.kv_dtype.is_quantized
    CODE = BS * row // 4  # words of one (layer, block, head) code run
    W = _head_warps(cfg)
    T = chunk_tokens(BS)  # quantized: the staged chunks of the tensor-core digest
    CHUNKS, CHUNK_CODE, CHUNK_VM = BS // T, T * row // 4, T * NG
    if quantized:
        dense_chunk = dense_chunk_function(chunk_words(BS, D, cfg.kv_dtype.bits, NG),
                                           _record_load4_function(CHUNK_CODE, D))

    @cuda.jit
    def kernel(pool, k_at, v_at, km_at, vm_at, block_ids, num_blocks, head_sums, first_layer):
        # pool: the store's uint32 words; *_at: word offsets of its arrays; block_ids [n]
        # int32 (ids outside [0, num_blocks) skipped); head_sums [num_blocks, L, H] uint32;
        # layers first_layer + blockIdx.y
        layer = first_layer + cuda.blockIdx.y
        h = cuda.blockIdx.z * W + cuda.threadIdx.x // LANES
        lane = cuda.threadIdx.x % LANES
        block = block_ids[cuda.blockIdx.x]
        if block < 0 or block >= num_blocks or h >= H:  # warp-uniform
            return
        at = code_offset(layer, block, h, 0, num_blocks, H, BS, row) // 4
        if quantized:  # the tensor-core digest of the block's staged chunks
            km = km_at + key_meta_offset(layer, block, h, num_blocks, H, D) // 4
            vm = vm_at + value_meta_offset(layer, block, h, 0, num_blocks, H, BS, NG) // 4
            c0 = c1 = c2 = c3 = uint32(0)
            for sub in range(CHUNKS):
                c0, c1, c2, c3 = dense_chunk(c0, c1, c2, c3, pool, (k_at + at + sub * CHUNK_CODE, v_at + at + sub *
                                             CHUNK_CODE, km, vm + sub * CHUNK_VM), sub, lane)
            total = dense_close(c0, c1, c2, c3, lane)
        else:
            total = _head_segment(uint32(0), pool, k_at + at, CODE, 0, lane)
            total = _head_segment(total, pool, v_at + at, CODE, CODE, lane)
        total = warp_sum_u32(total)
        if lane == 0:
            head_sums[block, layer, h] = total

    return kernel


def _head_warps(cfg: KVCacheConfig) -> int:
    """Warps (KV heads) of one CTA of the head-digest kernel."""
    return min(WARPS, cfg.num_kv_heads)


def head_record_launch(store: DeviceKVStore, block_ids, head_sums, layer: int | None = None) -> Launch:
    """Validate a head-digest RECORD launch: ``head_sums[block, layer, h]`` = the head digest
    of every (layer, KV head) of each block of ``block_ids`` (int32 ``[n]``; host ids are
    range-checked, device ids outside the store -- -1 padding -- are skipped).
    ``head_sums``: device uint32 ``[num_blocks, L, H]``, outside the store and apart from
    ``block_ids``; ``layer``: an int in [0, L) to record that layer only (a step sealing
    layer by layer), or None for all."""
    cfg = checked_store(store).config
    ids = checked_ids(block_ids, "block_ids", None, store.num_blocks)
    L, H = cfg.num_layers, cfg.num_kv_heads
    head_sums = checked(head_sums, "head_sums", np.uint32, (store.num_blocks, L, H), align=4, output=True)
    check_writes(store, {"head_sums": head_sums}, {"block_ids": ids})
    first, layers = (0, L) if layer is None else (checked_layer(layer, L)[0], 1)
    offsets = store.word_offsets
    W = _head_warps(cfg)
    return Launch(_head_record_kernel(cfg), (ids.shape[0], layers, -(-H // W)), W * LANES, (
        store.pool, offsets["k_codes"], offsets["v_codes"], offsets.get("k_meta", 0), offsets.get("v_meta", 0), ids,
        store.num_blocks, head_sums, first))


def prepare_head_record(store: DeviceKVStore, block_ids, head_sums, layer: int | None = None) -> PreparedLaunch:
    """``head_record_launch`` bound to fixed device buffers (capture-safe, as
    :func:`prepare_checksum`); rows of ``block_ids`` set to -1 are padding."""
    device_only(block_ids=block_ids, head_sums=head_sums)
    return head_record_launch(store, block_ids, head_sums, layer).prepare()


def record_head_sums(store: DeviceKVStore, block_ids, head_sums, stream=None, layer: int | None = None) -> None:
    """Record the head digests of ``block_ids`` into ``head_sums`` (enqueued on ``stream``;
    ``layer`` as :func:`head_record_launch`)."""
    head_record_launch(store, block_ids, head_sums, layer).run(resolve_stream(stream, block_ids, head_sums))


@functools.cache
def _checksum_kernel(cfg: KVCacheConfig):
    L, H, BS, D, NG, row = cfg.num_layers, cfg.num_kv_heads, cfg.block_size, cfg.head_dim, cfg.num_groups, cfg.row_bytes
    quantized = cfg.kv_dtype.is_quantized
    code_words = cfg.code_bytes_per_block // 4  # one (layer, block) run of codes
    key_meta_words, value_meta_words = cfg.key_meta_bytes_per_block // 4, cfg.value_meta_bytes_per_block // 4
    W = _warps(cfg)
    SHARED = W * LANES  # (a shared array's size must be one constant, not an expression)

    @cuda.jit
    def kernel(pool, k_at, v_at, km_at, vm_at, block_ids, num_blocks, sums, out, mode, guards, guard_bad, flags,
               found):
        # pool: the store's uint32 words; *_at: word offsets of its arrays; block_ids [n] int32;
        # sums [num_blocks, L] uint32; out [n, L] uint32; guards [G] int64; guard_bad [G] uint32;
        # flags [2] or [0] uint32; found [F, 2] int32
        lanes = cuda.shared.array(SHARED, uint32)  # [warp, lane] -> chain state
        item = cuda.blockIdx.x
        warp = cuda.threadIdx.x // LANES
        lane = cuda.threadIdx.x % LANES
        if item == block_ids.shape[0]:  # the guard CTA
            g = cuda.threadIdx.x
            if cuda.blockIdx.y == 0 and g < guards.shape[0]:
                bad = 0
                for i in range(GUARD_WORDS):
                    bad += pool[guards[g] + i] != uint32(_canary(g, i))
                guard_bad[g] = bad
                if bad and flags.shape[0] > 1:
                    cuda.atomic.add(flags, 1, uint32(bad))
            return
        layer = cuda.blockIdx.y * W + warp
        block = block_ids[item]
        valid = block >= 0 and block < num_blocks and layer < L
        if valid:
            h = uint32(FNV32_BASIS)
            h = _absorb(h, pool, k_at + code_offset(layer, block, 0, 0, num_blocks, H, BS, row) // 4, code_words,
                        lane)
            h = _absorb(h, pool, v_at + code_offset(layer, block, 0, 0, num_blocks, H, BS, row) // 4, code_words,
                        lane)
            if quantized:
                h = _absorb(h, pool, km_at + key_meta_offset(layer, block, 0, num_blocks, H, D) // 4,
                            key_meta_words, lane)
                h = _absorb(h, pool, vm_at + value_meta_offset(layer, block, 0, 0, num_blocks, H, BS, NG) // 4,
                            value_meta_words, lane)
            lanes[warp * LANES + lane] = h
        cuda.syncthreads()  # every chain of the CTA's layers in shared memory
        if valid and lane == 0:
            d = uint32(FNV32_BASIS)
            for j in range(LANES):
                d = _step(d, lanes[warp * LANES + j])
            if mode == 2:
                diff = d ^ sums[block, layer]
                out[item, layer] = diff
                if diff and flags.shape[0] > 0:
                    k = cuda.atomic.add(flags, 0, uint32(1))
                    if k < found.shape[0]:
                        found[k, 0] = block
                        found[k, 1] = layer
            else:
                out[item, layer] = d
                if mode == 1:
                    sums[block, layer] = d

    return kernel


def _warps(cfg: KVCacheConfig) -> int:
    """Warps (layers) of one CTA."""
    return min(WARPS, cfg.num_layers)


def checksum_launch(store: DeviceKVStore, block_ids, sums, out, guard_bad, mode: str = "compute", flags=None,
                    found=None) -> Launch:
    """Validate a checksum launch's arguments; the :class:`Launch` that does it.

    Parameters
    ----------
    block_ids : int32 ``[n]`` (host ids are range-checked; device ids out of range are skipped).
    sums : device uint32 ``[num_blocks, L]``: the recorded digests (read by ``verify``,
        written by ``record``; unused by ``compute``).
    out : device uint32 ``[n, L]``: see the module docstring.
    guard_bad : device uint32 ``[len(store.guard_offsets)]``: bad words per guard region.
    mode : ``"compute"``, ``"record"`` or ``"verify"``.
    flags, found : device uint32 ``[2]`` and int32 ``[F, 2]`` (both or neither): the
        mismatch count and list of the module docstring; None turns them off.

    What the launch writes (``out``, ``guard_bad``, ``flags``, ``found``; ``sums`` with
    ``record``) must lie outside the store and share no memory with another of its arrays
    (HexcoreInvalidArgumentError naming it).
    """
    cfg = checked_store(store).config
    if not isinstance(mode, str) or mode not in MODES:
        raise HexcoreInvalidArgumentError(f"mode: expected one of {tuple(MODES)}, got {shown(mode)}")
    ids = checked_ids(block_ids, "block_ids", None, store.num_blocks)
    n, L = ids.shape[0], cfg.num_layers
    sums = checked(sums, "sums", np.uint32, (store.num_blocks, L))
    out = checked(out, "out", np.uint32, (n, L))
    guard_bad = checked(guard_bad, "guard_bad", np.uint32, (len(store.guard_offsets),))
    flags, found = _checked_flags(store, flags, found)
    _check_outputs(store, mode, ids, sums, out=out, guard_bad=guard_bad, flags=flags, found=found)
    offsets = store.word_offsets
    W = _warps(cfg)
    return Launch(_checksum_kernel(cfg), (n + 1, -(-L // W)), W * LANES, (
        store.pool, offsets["k_codes"], offsets["v_codes"], offsets.get("k_meta", 0), offsets.get("v_meta", 0), ids,
        store.num_blocks, sums, out, MODES[mode], _guard_offsets(store), guard_bad, flags, found))


def _check_outputs(store, mode: str, ids, sums, **outputs) -> None:
    """A checksum launch's ``outputs`` (and ``sums`` where ``record`` writes them) outside the
    store it reads and apart from each other and from what it reads (``ids``; ``sums``
    where ``verify`` reads them; ``compute`` never touches them)."""
    if mode == "record":
        outputs["sums"] = sums
    check_writes(store, outputs, {"block_ids": ids, **({"sums": sums} if mode == "verify" else {})})


def _checked_flags(store, flags, found) -> tuple:
    """(flags, found) checked, or the store's empty pair when both are None."""
    if flags is None and found is None:
        empty = store.constants.get("no_flags")
        if empty is None:
            empty = store.constants["no_flags"] = (cuda.device_array(0, np.uint32),
                                                   cuda.device_array((0, 2), np.int32))
        return empty
    if flags is None or found is None:
        raise HexcoreInvalidArgumentError(f"flags, found: expected both or neither, got "
                                          f"{'found' if flags is None else 'flags'} alone")
    return (checked(flags, "flags", np.uint32, (2,), align=4, output=True),
            checked(found, "found", np.int32, (None, 2), align=4, output=True))


def _guard_offsets(store) -> object:
    """The store's guard offsets as a device int64 array, made once per store."""
    found = store.constants.get("guards")
    if found is None:
        found = store.constants["guards"] = cuda.to_device(np.array(store.guard_offsets, np.int64))
    return found


def prepare_checksum(store: DeviceKVStore, block_ids, sums, out, guard_bad, mode: str = "verify", flags=None,
                     found=None) -> PreparedLaunch:
    """``checksum_launch`` bound to fixed device buffers: ``run(stream)`` enqueues it, with
    no allocation, synchronisation or host read (capture-safe: it can ride in a graph).
    Rows of ``block_ids`` set to -1 are padding."""
    device_only(block_ids=block_ids, sums=sums, out=out, guard_bad=guard_bad, flags=flags, found=found)
    return checksum_launch(store, block_ids, sums, out, guard_bad, mode, flags, found).prepare()


def checksum_blocks(store: DeviceKVStore, block_ids, stream=None) -> np.ndarray:
    """The digests of sealed blocks, computed on the device: uint32 ``[n, L]`` on the host
    (synchronises). ``block_ids``: int32 ``[n]`` host array of block ids."""
    ids = checked_ids(block_ids, "block_ids", None, store.num_blocks)
    n, L = ids.shape[0], checked_store(store).config.num_layers
    out = cuda.to_device(np.zeros((n, L), np.uint32))
    bad = cuda.device_array(len(store.guard_offsets), np.uint32)
    stream = resolve_stream(stream, block_ids)
    checksum_launch(store, ids, _unused_sums(store), out, bad, "compute").run(stream)
    return to_host(out, stream)


def check_guards(store: DeviceKVStore, stream=None) -> np.ndarray:
    """Words of each guard region that differ from their canary: uint32 ``[G]`` (synchronises)."""
    L = checked_store(store).config.num_layers
    bad = cuda.to_device(np.zeros(len(store.guard_offsets), np.uint32))
    none = cuda.to_device(np.zeros(0, np.int32))
    stream = resolve_stream(stream)
    checksum_launch(store, none, _unused_sums(store), cuda.device_array((0, L), np.uint32), bad, "compute").run(stream)
    return to_host(bad, stream)


def to_host(array, stream) -> np.ndarray:
    """``array`` copied to the host once the work queued on ``stream`` (a resolved Stream) is done."""
    numba_stream = stream.numba
    if isinstance(numba_stream, int):
        return array.copy_to_host()  # the default stream: a synchronous copy
    host = array.copy_to_host(stream=numba_stream)
    numba_stream.synchronize()
    return host


def _unused_sums(store):
    """A ``sums`` argument for ``compute`` launches (which never read it), made once per store."""
    found = store.constants.get("unused_sums")
    if found is None:
        found = store.constants["unused_sums"] = cuda.device_array((store.num_blocks, store.config.num_layers),
                                                                   np.uint32)
    return found


# -- fault injection ------------------------------------------------------------------
def flip_bits(store: DeviceKVStore, name: str, layer: int, unit: int, byte: int, mask: int = 1) -> None:
    """XOR ``mask`` (1 to 0xFF) into one byte of the store, for tests and demos.

    ``name``: one of ``store.arrays`` (``"k_codes"``, ``"v_meta"``, ``"k_tails"``...);
    ``unit``: the block id (sealed arrays) or tail slot (tails); ``byte``: the offset within
    that (layer, unit)'s run. A bit flip is ``mask = 1 << bit``, a byte ``0xFF``; a word is
    four calls. Synchronous (a read-modify-write of one word through the host).
    """
    arrays = checked_store(store).arrays
    if not isinstance(name, str) or name not in arrays:
        raise HexcoreInvalidArgumentError(f"name: expected one of {tuple(arrays)}, got {shown(name)}")
    array = arrays[name]
    L, units = array.shape[0], array.shape[1]
    run = array.nbytes // (L * units)
    layer = as_int("layer", layer, 0, L - 1)
    unit = as_int("unit", unit, 0, units - 1)
    byte = as_int("byte", byte, 0, run - 1)
    mask = as_int("mask", mask, 1, 0xFF)
    at = store.word_offsets[name] * 4 + (layer * units + unit) * run + byte
    _xor_pool_byte(store, at, mask)


def clobber_guard(store: DeviceKVStore, region: int, index: int = 0, value: int = 0) -> None:
    """Overwrite word ``index`` of guard region ``region`` with ``value`` (a stray write)."""
    region = as_int("region", region, 0, len(checked_store(store).guard_offsets) - 1)
    index = as_int("index", index, 0, GUARD_WORDS - 1)
    value = as_int("value", value, 0, 0xFFFFFFFF)
    at = store.guard_offsets[region] + index
    store.pool[at:at + 1].copy_to_device(np.array([value], np.uint32))


def _xor_pool_byte(store, at: int, mask: int) -> None:
    word = store.pool[at // 4:at // 4 + 1]
    host = word.copy_to_host()
    host[0] ^= np.uint32(mask << (8 * (at % 4)))
    word.copy_to_device(host)


__all__ = ["COMPUTE", "MODES", "RECORD", "VERIFY", "check_guards", "checksum_blocks", "checksum_launch",
           "clobber_guard", "flip_bits", "head_record_launch", "prepare_checksum", "prepare_head_record",
           "record_head_sums"]
