"""The paged decode kernel: split-K over a sequence's blocks, tensor cores, one launch.

Grid ``(splits, num_kv_heads * head_groups, batch)``; a CTA of four warps takes one
split (a run of ``split_blocks`` virtual blocks of one sequence) for one KV head and up to
8 of its query heads, so every K/V byte of the split is read once for all of them.

1. Each warp takes the split's virtual blocks ``w, w+4, ...`` (a virtual block is a
   sealed block, or the tail when it is the sequence's last) and runs an online softmax
   over them in registers, 16 tokens at a time (``fragments.py``).
2. The CTA combines its four warps through shared memory.
3. A sequence with one split writes ``out`` directly. Otherwise each CTA writes its
   partial (unnormalised output, max, sum) to the workspace and counts itself done in
   ``counters``; the last CTA of the (sequence, KV head, head group) merges every split
   into ``out`` and resets the counter for the next launch (Flash-Decoding, without a
   second launch).

The work of one CTA is ``decode_item``, a device function of the item's (split, KV head,
head group, sequence): the grid kernel calls it once with its block indices, the
persistent kernel (``persistent_kernels.py``) once per item it takes from its queue.

Device index arrays are trusted by the launcher (reading them back would synchronise),
so the item keeps its reads inside its arrays: a ``seq_lens`` entry is clamped to
``(table width + 1) * block_size - 1`` and to the tokens the grid and workspace were sized
for (``max_splits * split_blocks * block_size``), and a block id outside
``[0, num_blocks)`` or a tail slot outside ``[0, max_seqs)`` is skipped (its tokens do not
count), as the append, seal and copy kernels skip such ids. A wrong id gives a wrong
output, never a read outside the store.
"""

from __future__ import annotations

import functools
import inspect
import math

import numpy as np
from numba import cuda, float32, int32, uint32

from ..device import (SHARED_ALIGN16, SIMULATOR, add_acq_rel_i32, allow_dependent_grids, cluster_sync,
                      cluster_sync_relaxed, cp_async_commit, cp_async_wait_all, cp_async_wait_one, device_function,
                      exp2, load_cg_f32, load_cg_f32x4, load_cluster_f32, load_where, prefetch_l2,
                      shfl_idx, shfl_idx_int, shfl_xor, syncwarp, thread_index_volatile, wait_prior_grids, warp_ballot)
from ..device_layout import code_offset, key_meta_offset, tail_offset, value_meta_offset
from ..integrity import (dense_chunk_function, dense_close, dense_table_functions, dense_table_words, staged_load4,
                         warp_sum_u32)
from ..launch import MAX_CLUSTER  # the portable cluster size: a cluster merge's most splits
from .fragments import NEG_INF, warp_functions
from .shape import HEADS_PER_CTA, THREADS, WARPS, DecodeShape

LOG2E = 1.4426950408889634
MERGE_ROUND = 16  # splits a merge round has in flight per thread (merge_function)
# bytes of static shared memory a kernel may declare: ptxas 13 (sm_90) refuses more; the H100's
# toolchain compiled INT2's D=128 value-group-16 kernels at 59,716 (benchmarks/RESULTS.md, fifty-third session)
STATIC_SHARED = 48 * 1024
# bytes the decode item's kernels may declare beside the ring: the warps' (m, l), a flag, the
# cluster's (m, l) per head, a persistent slice's ten queue words and the ring's 16-byte
# alignment; an upper bound, counted by hand and checked by ``python -m benchmarks.ptx_report``
# (ptxas 13.5, sm_90: 260 bytes beside the ring in every plain grid kernel it compiles). The
# split merge staged 2,112 bytes in shared memory until the sixty-third session (4 bytes x 8
# heads x (2 + 64)), and this bound kept them for a while after; releasing them gave the verify
# kernel's weight table to INT4 at D=128, block 32, value groups of 16.
BESIDE_RING = 4 * (WARPS * HEADS_PER_CTA * 2 + 1 + 2 * HEADS_PER_CTA) + 8 * 10 + 16
GRID_REGISTERS = 128  # the grid kernel's default register cap (DecodeOptions.max_registers)
# the verify kernel's highest cap: three CTAs of 128 threads an SM, as its uncapped plain twin
# holds (ptxas sm_90, INT2 D=128 BS=32 G=4: uncapped verify 172 registers, two CTAs an SM,
# plain 156; at 168, 163 and no spill; FP16 and INT4 verify 158-166, no spill either)
VERIFY_MAX_REGISTERS = 168


def compiled_cap(max_registers: int | None, verify: bool) -> int:
    """The register cap ``decode_kernel(max_registers=..., verify=...)`` compiles with: the
    given one (None: ``GRID_REGISTERS``), for ``verify`` at most ``VERIFY_MAX_REGISTERS``."""
    cap = GRID_REGISTERS if max_registers is None else max_registers
    return min(cap, VERIFY_MAX_REGISTERS) if verify else cap


if SIMULATOR:
    @cuda.jit(device=True)
    def in_range(index, count):
        """``0 <= index < count`` for a device-supplied id."""
        return 0 <= index < count
else:
    @device_function
    def in_range(index, count):
        """``0 <= index < count`` for a device-supplied id (one unsigned compare)."""
        return uint32(index) < uint32(count)


def _cached_by_arguments(fn):
    """``functools.cache`` of ``fn`` keyed by its bound arguments, defaults applied, so a
    call by position and one by name share an entry (and the same kernel object). Each
    spelling of a call is remembered as given, so only its first use binds the arguments
    (binding costs ~10 us, and launches look kernels up several times each)."""
    signature = inspect.signature(fn)
    cached = functools.cache(fn)
    spellings: dict = {}

    @functools.wraps(fn)
    def call(*args, **kwargs):
        key = (args, tuple(kwargs.items()))
        found = spellings.get(key)
        if found is None:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            found = spellings[key] = cached(*bound.args, **bound.kwargs)
        return found

    return call


@_cached_by_arguments
def decode_kernel(shape: DecodeShape, max_registers: int | None = None, l2_prefetch: str = "none",
                  joint_softmax: bool = True, partials: bool = False, verify: bool = False, dependent: bool = False,
                  cluster: bool = False):
    """The decode kernel of ``shape``, compiled on first launch (cached: the same arguments,
    by position or by name, give the same kernel object); the other arguments are
    DecodeOptions fields of the same names (``max_registers`` None: 128; a verify kernel
    compiles with at most ``VERIFY_MAX_REGISTERS``: ``compiled_cap``). One CTA per work
    item: the grid ``(splits, num_kv_heads * head_groups, batch)`` names the item's split, KV head and head
    group, and sequence (``decode_item_function``). ``partials``: the kernel of one pool of a
    format by age (``decode_item_function``). ``verify``: the variant that checks sampled
    sealed blocks against their head digests as it reads them, with four more arguments
    (``head_sums, vctl, flags, found``: ``decode_item_function``). ``dependent``: the kernel
    for a programmatic dependent launch (``DecodeOptions.dependent_launch``): every CTA first
    waits for the grid before it on the stream (``wait_prior_grids``), then lets the next
    dependent launch start (``allow_dependent_grids``); the kernel's
    ``waits_for_prior_grids`` says which it is. ``cluster``: the kernel for a launch whose
    clusters are the splits of one item (``launch.PreparedLaunch``, ``cluster`` = the grid's
    ``splits``, 2 to ``MAX_CLUSTER``): the splits merge through distributed shared memory
    (``decode_item_function``), not the workspace; not with ``partials``. Every grid kernel
    but a cluster one has ``cluster_twin()``, itself with ``cluster``; a plain one has
    ``verify_twin()``, itself with ``verify`` (same ``max_registers``, dependence and
    merge), and a verify one ``plain_twin()``: the launcher gives a verify launch its plain
    twin's grid, splits and merge, so checking a layer never changes its output by a bit."""
    if cluster and partials:
        raise ValueError("decode_kernel: cluster is for the grid kernel (not with partials)")
    decode_item = decode_item_function(shape, l2_prefetch, joint_softmax, partials, verify=verify, cluster=cluster)
    HG = shape.head_groups
    options = {} if SIMULATOR else {"max_registers": compiled_cap(max_registers, verify)}

    if verify:
        @cuda.jit(**options)
        def kernel(pool, k_codes, v_codes, k_meta, v_meta, k_tails, v_tails, q, block_tables, seq_lens, tail_slots,
                   out, part_o, part_ml, counters, layer, num_blocks, max_seqs, split_blocks, max_splits, scale,
                   head_sums, vctl, flags, found):
            if dependent:
                wait_prior_grids()
            decode_item(pool, k_codes, v_codes, k_meta, v_meta, k_tails, v_tails, q, block_tables, seq_lens,
                        tail_slots, out, part_o, part_ml, counters, layer, num_blocks, max_seqs, split_blocks,
                        max_splits, scale, cuda.blockIdx.x, cuda.blockIdx.y // HG, cuda.blockIdx.y % HG,
                        cuda.blockIdx.z, head_sums, vctl, flags, found)
            if dependent:
                allow_dependent_grids()
    else:
        @cuda.jit(**options)
        def kernel(pool, k_codes, v_codes, k_meta, v_meta, k_tails, v_tails, q, block_tables, seq_lens, tail_slots,
                   out, part_o, part_ml, counters, layer, num_blocks, max_seqs, split_blocks, max_splits, scale):
            if dependent:
                wait_prior_grids()
            decode_item(pool, k_codes, v_codes, k_meta, v_meta, k_tails, v_tails, q, block_tables, seq_lens,
                        tail_slots, out, part_o, part_ml, counters, layer, num_blocks, max_seqs, split_blocks,
                        max_splits, scale, cuda.blockIdx.x, cuda.blockIdx.y // HG, cuda.blockIdx.y % HG,
                        cuda.blockIdx.z)
            if dependent:
                allow_dependent_grids()

    kernel.waits_for_prior_grids = dependent  # launcher.prepare_decode launches it as a dependent launch
    kernel.merges_in_cluster = cluster  # launcher.prepare_decode launches it with clusters of its splits
    twin = functools.partial(decode_kernel, shape, max_registers, l2_prefetch, joint_softmax, partials,
                             dependent=dependent)
    if not cluster and not partials:
        kernel.cluster_twin = functools.partial(twin, verify=verify, cluster=True)
    if not partials and verify:
        kernel.plain_twin = functools.partial(twin, verify=False, cluster=cluster)
    elif not partials:
        kernel.verify_twin = functools.partial(twin, verify=True, cluster=cluster)
    return kernel


VERIFY_ARGS = 4  # the verify kernel's arguments after the plain kernel's: head_sums, vctl, flags, found


@functools.cache
def decode_item_function(shape: DecodeShape, l2_prefetch: str = "none", joint_softmax: bool = True,
                         partials: bool = False, volatile_tid: bool = False, verify: bool = False,
                         cluster: bool = False, ring_arg: bool = False):
    """``decode_item(<the decode kernel's arguments>, split, h, hg, b)``: one work item, done by
    the whole CTA (every thread calls it, and every thread returns from it together): the
    split ``split`` of sequence ``b`` for KV head ``h`` and its query heads of head group
    ``hg``, with the fused merge when it is the sequence's last split to finish. Shared by
    the grid kernel (``decode_kernel``) and the persistent kernel (``persistent_kernels.py``).

    With ``partials`` (a specialisation; the kernels above do not contain it) every item
    writes its partial to the workspace and nothing else, not ``out``, no merge, and an
    item past its sequence's splits writes an empty one (``m`` -inf, ``l`` 0, ``o`` 0): the
    launch of one pool of a format by age, whose partials ``tiered.py`` merges with the
    other pools' (its ``part_o``/``part_ml`` start at the pool's first split slot).

    ``volatile_tid``: the item reads its thread index with ``thread_index_volatile``, for a
    caller that runs items in a loop with the item inlined (``persistent_kernels.py``, the FP16
    pool in ``tiered.py``'s merge): what the item derives from the index is then recomputed
    per item, not held across the loop.

    ``verify`` (a specialisation; without it the item's code is the plain one): the item
    takes four more arguments, ``head_sums`` uint32 ``[num_blocks, L, H]`` (the head digests
    of ``hexcore.host.checksum``), ``vctl`` int32 ``[2]`` = (every, phase), ``flags`` uint32
    ``[>= 1]`` and ``found`` int32 ``[F, 2]``, and checks each sealed block ``block`` it reads
    with ``every > 0`` and ``(block + phase) % every == 0`` (``0 <= phase``): the warp that
    reads the block sums the terms of the KV head's words (the quantized path from the
    shared ring once each chunk's copies have landed, the FP16 path from the registers each
    k-step loaded its rows into: ``fragments.key_terms`` / ``value_terms``), then lane 0
    compares the sum with ``head_sums[block, layer, h]``; a mismatch adds 1 to ``flags[0]``
    (atomic) and, as mismatch ``k < F``, writes (block, layer) into ``found[k]``. Nothing
    else changes: the outputs are the plain item's. Tails are never checked (they are not
    sealed).

    ``cluster`` (the grid kernel of a cluster launch, ``decode_kernel``): the CTAs of a
    cluster are the splits of one (sequence, KV head, head group), cluster rank = ``split``.
    A sequence of more than one split merges in the cluster: each CTA leaves its partial in
    its own shared memory (an item past the sequence's splits an empty one, ``m`` -inf),
    then ``cluster_merge_function``'s merge: no workspace, no count, no last CTA. A sequence
    of one split (or none) writes as the plain kernel does; the choice is the same in every
    CTA of the cluster.

    ``ring_arg`` (with ``partials``): the item's shared ring, uint32 ``[>= ring_words(shape)]``
    16-byte aligned, is its last argument instead of its own shared array, for a kernel
    that runs items of several shapes (``tiered_kernels.one_launch_kernel``): each item's
    own array would take its own shared memory, their sum more than a CTA may have."""
    if ring_arg and (verify or cluster or not partials):
        raise ValueError("decode_item_function: ring_arg is for the partials item (not verify or cluster)")
    VERIFY, CLUSTER = verify, cluster
    STAT_WORDS = 2 * HEADS_PER_CTA if cluster else 1  # the cluster's (m, l) per head
    (load_q_words, scale_q, unscale_q, issue_chunk, fold_keys, chunk_codes, kstep_rows, finish, pair_codes,
     unscale_values) = warp_functions(shape, joint_softmax)
    H, D, BS, G = shape.H, shape.D, shape.BS, shape.G
    HG, NG, MT = shape.head_groups, shape.num_groups, shape.m_tiles
    QUANTIZED, RW = shape.quantized, shape.D * shape.bits // 32
    KREGS, KSB = shape.key_regs, shape.ksteps_per_block
    CK, CPB = shape.chunk_ksteps, shape.ksteps_per_block // shape.chunk_ksteps  # chunks per block
    STAGE, KMETA = shape.stage_words, sum(shape.ring_regions[:2])  # ring stage; its key metadata
    # INT2 with one chunk per block: two blocks per softmax update (pair_codes), a ring of two
    # stages of two blocks per warp (INT4's stages would take 80 KB per CTA)
    PAIR = pairs_blocks(shape)
    RING_WORDS, RING_ARG = ring_words(shape), ring_arg
    KWORDS, VWORDS = 2 * shape.key_regs, shape.row_value_words  # FP16 rows (tails, FP16 blocks)
    HPC, CW = HEADS_PER_CTA, shape.chunk
    SCORES, O_REGS = (8 if PAIR else 4) * CK, 4 * shape.m_tiles  # local array sizes
    merge_splits = merge_function(D)
    cluster_merge = cluster_merge_function(D)
    PREFETCH = l2_prefetch == "all" or (l2_prefetch == "quantized" and QUANTIZED)
    RUN_BYTES, META_BYTES = BS * RW * 4, (4 * D, 4 * BS * NG)  # a block's code run; key, value metadata
    # VERIFY of INT blocks: the tensor-core head digest of each staged chunk as it lies in
    # the ring (hexcore/host/tensor_digest.py: the ring stage is the digest's staged chunk)
    dense_chunk = dense_chunk_function(STAGE, staged_load4) if QUANTIZED else None
    # blocks of one chunk (CPB 1: every pair-loop block, and a block of at most 32 tokens):
    # their weights from a table in shared memory that warp 0 fills once an item (one 8-byte
    # load a step instead of making them every block); one for the CTA, since a table a warp
    # would take INT2 past STATIC_SHARED; none where the ring leaves no room for it under
    # STATIC_SHARED (at D=128 block 32: INT2 with value groups of 32 or 16)
    TABLED = (VERIFY and QUANTIZED and CPB == 1
              and 4 * (ring_words(shape) + dense_table_words(STAGE)) + BESIDE_RING <= STATIC_SHARED)
    TABLE, fill_weights, dense_chunk0 = dense_table_functions(STAGE, staged_load4) if TABLED else (0, None, None)

    @cuda.jit(device=True)
    def sampled(block, vctl):
        # whether the launch checks sealed block `block` (in range): every > 0 and
        # (block + phase) % every == 0, in unsigned arithmetic (phase >= 0); vctl read here
        # (L1 hits) for each block, not held across the block loop (the FP16 path keeps the
        # one answer for its block's k-steps, in dg[1])
        every = vctl[0]
        return every > 0 and uint32(block + vctl[1]) % uint32(every) == 0

    @cuda.jit(device=True)
    def warp_block_sampled(block_tables, b, first, count, c, lane, ids, picks, num_blocks, vctl):
        # warp_block, and whether the launch checks that block: when the ids are read (once
        # per 32 blocks) each lane tests its own block and a ballot keeps the 32 answers in
        # picks[0], so a block's test is a shift, not a division
        if c & 31 == 0:
            i = c + lane
            block = block_tables[b, first + WARPS * i] if i < count else -1
            ids[0] = block
            picks[0] = warp_ballot(in_range(block, num_blocks) and sampled(block, vctl))
        return shfl_idx_int(ids[0], c & 31), (picks[0] >> uint32(c & 31)) & uint32(1) != 0

    @cuda.jit(device=True)
    def check_block(total, head_sums, block, layer, h, flags, found, lane):
        # the warp's lane sums added up; lane 0 compares with the recorded head digest
        total = warp_sum_u32(total)
        if lane == 0 and total != head_sums[uint32(block), uint32(layer), uint32(h)]:
            k = cuda.atomic.add(flags, 0, uint32(1))
            if k < found.shape[0]:
                found[k, 0] = block
                found[k, 1] = layer

    @cuda.jit(device=True)
    def check_staged(ring, stage, block, layer, h, check, weights, at, lane):
        # VERIFY: the head digest of a one-chunk block staged at `stage` compared with the
        # recorded one (check: head_sums, vctl, flags, found; with TABLED, the weight table
        # at weights[at:])
        z = uint32(0)
        if TABLED:
            c0, c1, c2, c3 = dense_chunk0(z, z, z, z, ring, stage, weights, at, lane)
        else:
            c0, c1, c2, c3 = dense_chunk(z, z, z, z, ring, stage, 0, lane)
        check_block(dense_close(c0, c1, c2, c3, lane), check[0], block, layer, h, check[2], check[3], lane)

    @cuda.jit(device=True)
    def pick_block(block_tables, b, first, count, c, lane, ids, picks, num_blocks, check):
        # (the id of the warp's c-th sealed block, whether the launch checks it; False
        # without VERIFY); (-1, False) for c >= count. The pair loop's reads of the ids.
        if c >= count:
            return -1, False
        if VERIFY:
            return warp_block_sampled(block_tables, b, first, count, c, lane, ids, picks, num_blocks, check[1])
        return warp_block(block_tables, b, first, count, c, lane, ids), False

    @cuda.jit(device=True)
    def prefetch_block(pool, offsets, block, h, layer, num_blocks, lane):
        # lane 0..3 asks L2 for the block's key codes, value codes, key meta, value meta
        if not in_range(block, num_blocks):
            return
        if lane < 2:
            run = code_offset(layer, block, h, 0, num_blocks, H, BS, RW * 4) // 4
            prefetch_l2(pool, offsets[lane] + run, RUN_BYTES)
        elif lane == 2 and QUANTIZED:
            prefetch_l2(pool, offsets[2] + key_meta_offset(layer, block, h, num_blocks, H, D) // 4, META_BYTES[0])
        elif lane == 3 and QUANTIZED:
            at = offsets[3] + value_meta_offset(layer, block, h, 0, num_blocks, H, BS, NG) // 4
            prefetch_l2(pool, at, META_BYTES[1])

    @cuda.jit(device=True)
    def warp_block(block_tables, b, first, count, c, lane, ids):
        # the block id of the warp's c-th sealed block (virtual block first + 4c), 0 < c <
        # count: lane i holds the id of the warp's block 32 * (c // 32) + i in ids[0], read
        # from the table once per 32 blocks, so no chunk waits on a table read before its
        # copies; the first 32 ids are the item's early read (`seed_blocks`, c = 0 and 1 from
        # `first_blocks`)
        if c & 31 == 0:
            i = c + lane
            ids[0] = block_tables[b, first + WARPS * i] if i < count else -1
        return shfl_idx_int(ids[0], c & 31)

    @cuda.jit(device=True)
    def seed_blocks(early, count, lane, ids):
        # ids[0]: the ids of the warp's first 32 sealed blocks (lane i: block i), from the
        # item's early table read (lanes past `count` -1)
        ids[0] = early if lane < count else -1

    @cuda.jit(device=True)
    def first_blocks(count, ids):
        # the ids of the warp's sealed blocks 0 and 1 (-1 past `count`) after seed_blocks
        return (shfl_idx_int(ids[0], 0) if count > 0 else -1), (shfl_idx_int(ids[0], 1) if count > 1 else -1)

    @cuda.jit(device=True)
    def issue(pool, ring, stage, sub, block, head_row, vb, last, b, h, layer, num_blocks, block_tables, k_codes,
              v_codes, k_meta, v_meta, lane):
        # start the copies of chunk `sub` of the warp's sealed block `block` (virtual block vb)
        # into the ring stage at word `stage`; `head_row` = (layer * num_blocks) * H + h, so
        # the block's (layer, block, h) row is head_row + block * H (layout.code_offset and its
        # siblings, in words); with PREFETCH, a block's first chunk also asks L2 for the
        # warp's block after it
        if not in_range(block, num_blocks):
            return  # a block id outside the store: skipped (its chunks are not computed either)
        if PREFETCH and sub == 0 and vb + WARPS < last:
            prefetch_block(pool, (k_codes, v_codes, k_meta, v_meta), block_tables[b, vb + WARPS], h, layer,
                           num_blocks, lane)
        row = head_row + block * H
        issue_chunk(pool, ring, stage, k_codes + row * (BS * RW), v_codes + row * (BS * RW), k_meta + row * D,
                    v_meta + row * (BS * NG), sub * CK, lane)

    @device_function
    def decode_item(pool, k_codes, v_codes, k_meta, v_meta, k_tails, v_tails, q, block_tables, seq_lens, tail_slots,
                    out, part_o, part_ml, counters, layer, num_blocks, max_seqs, split_blocks, max_splits, scale,
                    split, h, hg, b, *check):
        # check: (head_sums, vctl, flags, found) with VERIFY, (ring,) with RING_ARG, empty otherwise.
        # pool: every store array as uint32 words; k_codes..v_tails: their word offsets.
        # q: [B, Hq, D] f16 as words; out: [B, Hq, D] f16 flat; part_o: [B*Hq, max_splits, D]
        # f32 flat; part_ml: [B*Hq, max_splits, 2] f32 flat; counters: [B * H * HG] int32
        tid = thread_index_volatile() if volatile_tid else cuda.threadIdx.x
        warp, lane = tid >> 5, tid & 31
        qh = cuda.local.array(KREGS, np.uint32)
        early = int32(-1)
        if QUANTIZED:
            gid = (lane >> 2)
            q_valid = hg * HPC + gid < G  # rows past the group's heads stay zero
            q_row = b * H * G + h * G + hg * HPC + (gid if q_valid else 0)
            # the item's first global reads in one round trip: its sequence length, the ids
            # of the warp's first 32 blocks (lane i: virtual block split * split_blocks + warp
            # + 4i, clamped into the table; used only below the sequence's sealed count) and
            # q's raw words; before, each waited for the one before it. On the H200 1-5%
            # faster for INT4/INT2 at B=1 and 0.4-2.4% at larger shapes, but FP16 0.2-0.8%
            # slower at 32k-128k and B >= 16 (twenty-sixth session), so FP16 reads as before
            load_q_words(q, q_row, lane, qh)
            width = block_tables.shape[1]
            early = load_where(block_tables, b, min(split * split_blocks + warp + WARPS * lane, max(width, 1) - 1),
                               width > 0)
        # device index arrays are not checked by the launcher: a length is clamped to what
        # the table describes and what the grid and workspace were sized for
        seq_len = max(0, min(seq_lens[b], (block_tables.shape[1] + 1) * BS - 1, max_splits * split_blocks * BS))
        n_sealed = seq_len // BS
        n_virtual = (seq_len + BS - 1) // BS
        n_splits = (n_virtual + split_blocks - 1) // split_blocks
        head0 = h * G + hg * HPC  # first query head of the CTA
        if split >= n_splits and not (CLUSTER and n_splits > 1):  # (in a cluster: an empty partial below)
            if partials:  # an empty partial: weight 0 in the merge
                for i in range(tid, HPC * D, THREADS):
                    if hg * HPC + i // D < G:
                        at = (b * H * G + head0 + i // D) * max_splits + split
                        part_o[at * D + i % D] = 0
                        if i % D == 0:
                            part_ml[at * 2] = NEG_INF
                            part_ml[at * 2 + 1] = 0
            elif split == 0:  # an empty sequence: zeros
                for i in range(tid, HPC * D, THREADS):
                    if hg * HPC + i // D < G:
                        out[(b * H * G + head0 + i // D) * D + i % D] = 0
            return
        vb0 = min(split * split_blocks, n_virtual) if CLUSTER else split * split_blocks
        vb1 = min(vb0 + split_blocks, n_virtual)

        qs = cuda.local.array(KREGS, np.uint32)
        kw = cuda.local.array(KWORDS, np.uint32)
        vw = cuda.local.array(VWORDS, np.uint32)
        dg = cuda.local.array(2, np.uint32)  # an FP16 block's digest so far, whether it is checked
        no_digest = cuda.local.array(2, np.uint32)  # (tails: never checked)
        no_digest[1] = 0
        sc = cuda.local.array(SCORES, float32)
        o = cuda.local.array(O_REGS, float32)
        stats = cuda.local.array(4, float32)
        state = cuda.local.array(4, float32)  # softmax maxima and alphas of heads 2tig, 2tig+1
        for i in range(O_REGS):
            o[i] = 0
        for i in range(4):
            stats[i] = 0
        state[0] = state[1] = NEG_INF
        factor = float32(scale * LOG2E)
        gid = (lane >> 2)
        q_valid = hg * HPC + gid < G  # rows past the group's heads stay zero
        if not QUANTIZED:  # (FP16: q read after the length, as before the early reads)
            load_q_words(q, b * H * G + head0 + (gid if q_valid else 0), lane, qh)
            scale_q(qh, q_valid, factor)

        if RING_ARG:
            ring = check[0]
        else:  # per warp: two stages of sealed chunks
            ring = cuda.shared.array(RING_WORDS, uint32, alignment=SHARED_ALIGN16)
        if QUANTIZED:
            # sealed blocks: a two-stage cp.async pipeline per warp (the next chunk's copies
            # fly while this one is computed)
            # the chunk being computed is (c, sub) of the warp's c-th block; counters, not
            # divisions of the chunk index, keep signed 64-bit arithmetic out of the loop
            first = vb0 + warp
            last = min(vb1, n_sealed)
            count = max(0, (last - first + WARPS - 1) // WARPS)  # the warp's sealed blocks
            head_row = (layer * num_blocks) * H + h
            ids = cuda.local.array(1, int32)
            seed_blocks(early, count, lane, ids)
            if TABLED:  # (every thread of the CTA is here: the early return above is the CTA's)
                weights = cuda.shared.array(TABLE, uint32, alignment=SHARED_ALIGN16)
                if warp == 0:
                    fill_weights(weights, 0, lane)
                cuda.syncthreads()  # the table written
            else:
                weights = ring  # (no table: check_staged makes the weights; INT2 with a ring too large for one)
            if PAIR:  # two blocks per iteration (`block`, `block2`), one softmax update over both
                picks = cuda.local.array(1, uint32)
                stage, spare = warp * 4 * STAGE, warp * 4 * STAGE + 2 * STAGE  # pairs of stages: computed, being filled
                if VERIFY:
                    block, checking = pick_block(block_tables, b, first, count, 0, lane, ids, picks, num_blocks, check)
                    block2, checking2 = pick_block(block_tables, b, first, count, 1, lane, ids, picks, num_blocks,
                                                   check)
                else:
                    (block, block2), checking, checking2 = first_blocks(count, ids), False, False
                if count > 0:
                    issue(pool, ring, stage, 0, block, head_row, first, last, b, h, layer, num_blocks, block_tables,
                          k_codes, v_codes, k_meta, v_meta, lane)
                if count > 1:
                    issue(pool, ring, stage + STAGE, 0, block2, head_row, first + WARPS, last, b, h, layer, num_blocks,
                          block_tables, k_codes, v_codes, k_meta, v_meta, lane)
                cp_async_commit()
                scale_q(qh, q_valid, factor)  # (its words came with the length; the copies fly)
                c = 0
                while c < count:
                    c_next = c + 2
                    up, up_checked = pick_block(block_tables, b, first, count, c_next, lane, ids, picks, num_blocks,
                                                check)
                    up2, up2_checked = pick_block(block_tables, b, first, count, c_next + 1, lane, ids, picks,
                                                  num_blocks, check)
                    if c_next < count:
                        issue(pool, ring, spare, 0, up, head_row, first + WARPS * c_next, last, b, h,
                              layer, num_blocks, block_tables, k_codes, v_codes, k_meta, v_meta, lane)
                    if c_next + 1 < count:
                        issue(pool, ring, spare + STAGE, 0, up2, head_row, first + WARPS * (c_next + 1), last, b, h,
                              layer, num_blocks, block_tables, k_codes, v_codes, k_meta, v_meta, lane)
                    cp_async_commit()
                    cp_async_wait_one()
                    syncwarp()  # this pair is in the ring, every lane's copies
                    ok = in_range(block, num_blocks)
                    ok2 = c + 1 < count and in_range(block2, num_blocks)
                    if VERIFY:  # (the ids and samples are warp-uniform)
                        if ok and checking:
                            check_staged(ring, stage, block, layer, h, check, weights, 0, lane)
                        if ok2 and checking2:
                            check_staged(ring, stage + STAGE, block2, layer, h, check, weights, 0, lane)
                    if ok and ok2:
                        pair_codes(ring, stage, stage + STAGE, KMETA, qh, qs, sc, o, stats, state, lane)
                    else:
                        if ok:
                            corr_lo, corr_hi = fold_keys(ring, stage + KMETA, lane, qh, qs)
                            chunk_codes(ring, stage, qs, corr_lo, corr_hi, sc, o, stats, state, lane)
                        if ok2:
                            corr_lo, corr_hi = fold_keys(ring, stage + STAGE + KMETA, lane, qh, qs)
                            chunk_codes(ring, stage + STAGE, qs, corr_lo, corr_hi, sc, o, stats, state, lane)
                    syncwarp()  # every lane has read the stages before they are refilled
                    stage, spare = spare, stage
                    block, block2, c = up, up2, c_next
                    checking, checking2 = up_checked, up2_checked
            else:
                stage, spare = warp * 2 * STAGE, warp * 2 * STAGE + STAGE  # computed, being filled
                if VERIFY:  # the blocks' ids, and whether each is checked (`checking`: block's)
                    picks = cuda.local.array(1, uint32)
                    block, checking = warp_block_sampled(block_tables, b, first, count, 0, lane, ids, picks, num_blocks,
                                                         check[1]) if count > 0 else (-1, False)
                    d0 = d1 = d2 = d3 = uint32(0)  # the checked block's accumulators so far
                else:
                    block, _ = first_blocks(count, ids)
                if count > 0:
                    issue(pool, ring, stage, 0, block, head_row, first, last, b, h, layer, num_blocks, block_tables,
                          k_codes, v_codes, k_meta, v_meta, lane)
                cp_async_commit()
                scale_q(qh, q_valid, factor)  # (its words came with the length; the copies fly)
                corr_lo = corr_hi = float32(0)
                c, sub = 0, 0
                while c < count:
                    upcoming, c_next, sub_next = block, c, sub + 1  # the next chunk
                    if VERIFY:
                        upcoming_checked = checking
                    if sub_next == CPB:
                        c_next, sub_next = c + 1, 0
                        if c_next < count:
                            if VERIFY:
                                upcoming, upcoming_checked = warp_block_sampled(block_tables, b, first, count, c_next,
                                                                                lane, ids, picks, num_blocks, check[1])
                            else:
                                upcoming = warp_block(block_tables, b, first, count, c_next, lane, ids)
                    if c_next < count:
                        issue(pool, ring, spare, sub_next, upcoming, head_row, first + WARPS * c_next, last, b, h,
                              layer, num_blocks, block_tables, k_codes, v_codes, k_meta, v_meta, lane)
                    cp_async_commit()
                    cp_async_wait_one()
                    syncwarp()  # this chunk is in the ring, every lane's copies
                    if in_range(block, num_blocks):
                        if VERIFY:  # (block, sub and the sample are warp-uniform)
                            if checking:
                                if sub == 0:
                                    d0 = d1 = d2 = d3 = uint32(0)
                                if TABLED:  # (sub is 0)
                                    d0, d1, d2, d3 = dense_chunk0(d0, d1, d2, d3, ring, stage, weights, 0, lane)
                                else:
                                    d0, d1, d2, d3 = dense_chunk(d0, d1, d2, d3, ring, stage, sub, lane)
                                if sub == CPB - 1:
                                    check_block(dense_close(d0, d1, d2, d3, lane), check[0], block, layer, h,
                                                check[2], check[3], lane)
                        if sub == 0:
                            corr_lo, corr_hi = fold_keys(ring, stage + KMETA, lane, qh, qs)
                        chunk_codes(ring, stage, qs, corr_lo, corr_hi, sc, o, stats, state, lane)
                    syncwarp()  # every lane has read the stage before it is refilled
                    stage, spare = spare, stage
                    block, c, sub = upcoming, c_next, sub_next
                    if VERIFY:
                        checking = upcoming_checked
            cp_async_wait_all()
        else:
            for vb in range(vb0 + warp, min(vb1, n_sealed), WARPS):
                if PREFETCH and vb + WARPS < min(vb1, n_sealed):  # the warp's next block, one block ahead
                    prefetch_block(pool, (k_codes, v_codes, k_meta, v_meta), block_tables[b, vb + WARPS], h, layer,
                                   num_blocks, lane)
                block = block_tables[b, vb]
                if not in_range(block, num_blocks):
                    continue  # a block id outside the store: skipped
                rows = code_offset(layer, block, h, 0, num_blocks, H, BS, RW * 4) // 4
                dg[0], dg[1] = 0, 0
                if VERIFY:
                    dg[1] = sampled(block, check[1])  # (the block id is warp-uniform)
                for k in range(KSB):
                    kstep_rows(pool, k_codes + rows, v_codes + rows, k, BS, lane, qh, kw, vw, sc, o, stats, state,
                               dg)
                if VERIFY:
                    if dg[1] != 0:  # the digest of the words the k-steps loaded
                        check_block(dg[0], check[0], block, layer, h, check[2], check[3], lane)
        unscale_values(o)  # (a quantized kernel's sealed outputs were in the subnormal codes' units)
        tail = n_virtual - 1  # the tail, when there is one, is the sequence's last virtual block
        slot = tail_slots[b]
        if tail >= n_sealed and vb0 <= tail < vb1 and (tail - vb0) % WARPS == warp and in_range(slot, max_seqs):
            unscale_q(qh)  # (a quantized kernel's q was scaled for raw codes)
            ntail = seq_len - n_sealed * BS
            rows = tail_offset(layer, slot, h, 0, max_seqs, H, BS, D) // 4
            for k in range((ntail + 15) // 16):
                kstep_rows(pool, k_tails + rows, v_tails + rows, k, ntail, lane, qh, kw, vw, sc, o, stats, state,
                           no_digest)
        m_lo, l_lo, m_hi, l_hi = finish(o, stats, state, lane)

        # ---- the CTA's four warps -> one partial per head --------------------------------
        s_o = ring.view(np.float32)  # [WARPS, HPC, D], once every warp is done with the ring
        s_ml = cuda.shared.array((WARPS, HPC, 2), float32)
        s_flag = cuda.shared.array(1, int32)
        s_stat = cuda.shared.array(STAT_WORDS, float32)  # per head (m, l): read by the cluster
        tig = (lane & 3)
        cuda.syncthreads()  # every warp is done with the ring
        for t in range(MT):
            for k in range(4):
                c, i = t // (CW // 2), t % (CW // 2)  # shape.dim_of(t, k // 2, gid)
                s_o[(warp * HPC + 2 * tig + k % 2) * D + CW * (8 * c + gid) + 2 * i + k // 2] = o[4 * t + k]
        if gid == 0:
            s_ml[warp, 2 * tig, 0], s_ml[warp, 2 * tig, 1] = m_lo, l_lo
            s_ml[warp, 2 * tig + 1, 0], s_ml[warp, 2 * tig + 1, 1] = m_hi, l_hi
        cuda.syncthreads()  # every warp's partial in shared memory
        if tid < HPC:  # per head: the warps' weights 2**(m_w - m), then (m, sum of l) in s_ml[0]
            m = max(max(s_ml[0, tid, 0], s_ml[1, tid, 0]), max(s_ml[2, tid, 0], s_ml[3, tid, 0]))
            total = float32(0)
            for w in range(WARPS):
                weight = exp2(s_ml[w, tid, 0] - m) if s_ml[w, tid, 0] > NEG_INF else float32(0)
                total += weight * s_ml[w, tid, 1]
                s_ml[w, tid, 1] = weight
            s_ml[0, tid, 0] = m
            s_ml[1, tid, 0] = total
            if CLUSTER:
                s_stat[2 * tid] = m
                s_stat[2 * tid + 1] = total
        cuda.syncthreads()  # weights ready
        row0 = b * H * G + head0  # row of the CTA's first head in out / part_*
        for i in range(tid, HPC * D, THREADS):
            j, d = i // D, i % D
            if hg * HPC + j >= G:
                continue
            acc = float32(0)
            for w in range(WARPS):
                acc += s_ml[w, j, 1] * s_o[(w * HPC + j) * D + d]
            if n_splits == 1 and not partials:
                out[(row0 + j) * D + d] = acc / s_ml[1, j, 0]
            elif CLUSTER:  # warp 0's slot of (j, d): only this thread reads or writes it here
                s_o[j * D + d] = acc
            else:
                part_o[((row0 + j) * max_splits + split) * D + d] = acc
                if d == 0:
                    part_ml[((row0 + j) * max_splits + split) * 2] = s_ml[0, j, 0]
                    part_ml[((row0 + j) * max_splits + split) * 2 + 1] = s_ml[1, j, 0]
        if n_splits == 1 or partials:
            return
        if CLUSTER:
            cluster_merge(s_o, s_stat, out, row0, min(HPC, G - hg * HPC), cuda.gridDim.x, split)
            return

        # ---- the last CTA of this (sequence, KV head, head group) merges the splits -------
        # thread 0's count releases the CTA's partial (every thread's writes are ordered
        # before it by the barrier) and, in the last CTA, acquires the other splits' partials
        # for the reads after the next barrier (CUTLASS's split-K semaphore; one fence by one
        # thread instead of a sequentially consistent threadfence in all of them)
        cuda.syncthreads()  # every thread's partial written
        item = (b * H + h) * HG + hg
        if tid == 0:
            s_flag[0] = add_acq_rel_i32(counters, item, 1) == n_splits - 1
        cuda.syncthreads()  # s_flag set
        if s_flag[0] == 0:
            return
        merge_splits(part_o, part_ml, out, row0, min(HPC, G - hg * HPC), n_splits, max_splits)
        if tid == 0:
            counters[item] = 0  # ready for the next launch

    return decode_item


def pairs_blocks(shape: DecodeShape) -> bool:
    """Whether the decode item of ``shape`` takes two sealed blocks per softmax update (INT2
    with one chunk per block)."""
    return shape.quantized and shape.ksteps_per_block // shape.chunk_ksteps == 1 and shape.bits == 2


def ring_words(shape: DecodeShape) -> int:
    """uint32 words of the decode item's shared ring for ``shape``: per warp two stages of
    sealed chunks (two pairs of blocks where it pairs them, ``pairs_blocks``), at least the
    ``[WARPS, HEADS_PER_CTA, D]`` float32 partials the CTA's warps combine through it."""
    stages = 4 if pairs_blocks(shape) else 2
    return max(WARPS * stages * shape.stage_words if shape.quantized else 0, WARPS * HEADS_PER_CTA * shape.D)


def merge_function(D: int):
    """``merge_splits(part_o, part_ml, out, row0, heads, n_splits, max_splits)``: ``out[row0 + j]
    = sum_s 2**(m_s - M) o_s / sum_s 2**(m_s - M) l_s`` for ``j < heads``, every thread of the
    CTA taking part; partials are read from L2 (``load_cg_f32``): other CTAs wrote them.

    The merge is the tail of a decode's critical path (at B=1 the last CTA of each item runs it
    alone), so it waits for L2 as few times as it can: each thread owns a run of 4 output
    channels of one head and folds the splits into an online ``(M, L, acc)`` in rounds of
    ``MERGE_ROUND``, all of a round's loads issued before any is used, so a run waits
    ``ceil(n_splits / MERGE_ROUND)`` times, with no statistics pass first and no barrier. In a
    round, lane ``k`` of each half warp loads split ``s + k``'s ``(m, l)`` and makes its weight
    (a half warp is one head's lanes at D=64; at D=128 a head takes the whole warp and both
    halves load the same 16); the half warp's shuffles give the round's maximum, the sum of
    weighted ``l`` and each split's weight to the lanes weighing that split's 16 bytes of
    partial. Past the last split a lane loads the last split again and weighs it 0, so no slot
    past ``n_splits`` is read; lanes past ``heads`` (a half warp at D=64) merge the last head
    again and write nothing, so every lane of a warp shuffles together."""
    LANES = D // 4  # the threads of one head's output row, one run of 4 channels each
    assert MERGE_ROUND == 16 and LANES % 16 == 0, "a half warp takes one round's statistics"

    @cuda.jit(device=True)
    def outs(part_o, at, s, last, d):
        # 4 channels at d of splits s..s+3 of the row whose split 0 is slot ``at`` (past the
        # last split: the last one), loaded together
        a0, a1, a2, a3 = load_cg_f32x4(part_o, (at + min(s, last)) * D + d)
        b0, b1, b2, b3 = load_cg_f32x4(part_o, (at + min(s + 1, last)) * D + d)
        c0, c1, c2, c3 = load_cg_f32x4(part_o, (at + min(s + 2, last)) * D + d)
        e0, e1, e2, e3 = load_cg_f32x4(part_o, (at + min(s + 3, last)) * D + d)
        return a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3, e0, e1, e2, e3

    @cuda.jit(device=True)
    def weighed(acc, g, w0, w1, w2, w3):
        # acc (4 channels) + the weighted sum of an ``outs`` group of 4 splits
        return (acc[0] + ((w0 * g[0] + w1 * g[4]) + (w2 * g[8] + w3 * g[12])),
                acc[1] + ((w0 * g[1] + w1 * g[5]) + (w2 * g[9] + w3 * g[13])),
                acc[2] + ((w0 * g[2] + w1 * g[6]) + (w2 * g[10] + w3 * g[14])),
                acc[3] + ((w0 * g[3] + w1 * g[7]) + (w2 * g[11] + w3 * g[15])))

    @cuda.jit(device=True)
    def half_sum(x):
        # x summed over this lane's half warp
        for mask in (1, 2, 4, 8):
            x += shfl_xor(x, mask)
        return x

    @cuda.jit(device=True)
    def merged_run(part_o, part_ml, at, n_splits, d, lane):
        # the run of 4 channels at d of one row (split 0 at slot ``at``): (acc0..3) / L
        k, half = lane & 15, lane & 16
        m, total = NEG_INF, float32(0)
        acc = (float32(0), float32(0), float32(0), float32(0))
        last = n_splits - 1
        for s in range(0, n_splits, MERGE_ROUND):
            stat = at + min(s + k, last)
            mk, lk = load_cg_f32(part_ml, 2 * stat), load_cg_f32(part_ml, 2 * stat + 1)
            g0, g1 = outs(part_o, at, s, last, d), outs(part_o, at, s + 4, last, d)
            g2, g3 = outs(part_o, at, s + 8, last, d), outs(part_o, at, s + 12, last, d)
            mk = mk if s + k <= last else NEG_INF
            top = max(m, mk)
            for mask in (1, 2, 4, 8):
                top = max(top, shfl_xor(top, mask))
            ref = top if top > NEG_INF else float32(0)  # (every split so far empty: weights 0)
            wk = exp2(mk - ref)
            scale = exp2(m - ref)  # 0 while m is -inf
            total = total * scale + half_sum(wk * lk)
            acc = (acc[0] * scale, acc[1] * scale, acc[2] * scale, acc[3] * scale)
            acc = weighed(acc, g0, shfl_idx(wk, half), shfl_idx(wk, half + 1), shfl_idx(wk, half + 2),
                          shfl_idx(wk, half + 3))
            acc = weighed(acc, g1, shfl_idx(wk, half + 4), shfl_idx(wk, half + 5), shfl_idx(wk, half + 6),
                          shfl_idx(wk, half + 7))
            acc = weighed(acc, g2, shfl_idx(wk, half + 8), shfl_idx(wk, half + 9), shfl_idx(wk, half + 10),
                          shfl_idx(wk, half + 11))
            acc = weighed(acc, g3, shfl_idx(wk, half + 12), shfl_idx(wk, half + 13), shfl_idx(wk, half + 14),
                          shfl_idx(wk, half + 15))
            m = top
        inverse = float32(1) / total
        return acc[0] * inverse, acc[1] * inverse, acc[2] * inverse, acc[3] * inverse

    @cuda.jit(device=True)
    def merge_splits(part_o, part_ml, out, row0, heads, n_splits, max_splits):
        tid = cuda.threadIdx.x
        lane = tid & 31
        for first in range(tid - lane, HEADS_PER_CTA * LANES, THREADS):  # this warp's first thread, each round
            if first // LANES >= heads:
                break  # (warp-uniform) the warp's runs are past the CTA's heads
            i = first + lane
            j, d = min(i // LANES, heads - 1), 4 * (i % LANES)
            x0, x1, x2, x3 = merged_run(part_o, part_ml, (row0 + j) * max_splits, n_splits, d, lane)
            if i // LANES < heads:
                at = (row0 + j) * D + d
                out[at], out[at + 1], out[at + 2], out[at + 3] = x0, x1, x2, x3

    return merge_splits


def cluster_merge_function(D: int):
    """``cluster_merge(s_o, s_stat, out, row0, heads, splits, rank)``: the merge of a cluster
    of ``splits`` CTAs (2 to ``MAX_CLUSTER``), called by every thread of rank ``rank``:
    ``out[row0 + j][d] = sum_c 2**(m_c - M) o_c[j, d] / sum_c 2**(m_c - M) l_c[j]`` for the
    outputs ``i = j * D + d`` (``j < heads``) of this rank's share (``i = rank * THREADS +
    tid``, step ``splits * THREADS``), where CTA ``c``'s partial is ``o_c[j, d]`` = its
    ``s_o[j * D + d]`` and ``(m_c, l_c)`` = its ``s_stat[2j], s_stat[2j + 1]``. A
    ``cluster_sync`` before (every CTA's partial visible) and a relaxed one after (each CTA's
    shared memory alive until the others have read it; no fence to wait for ``out``'s
    stores). The loads of an output from the cluster's CTAs are issued together: one round of
    distributed shared memory latency per output."""

    assert MAX_CLUSTER == 8, "remote8 reads eight ranks"

    @device_function
    def remote8(array, at, splits, empty):
        # array[at] of the cluster's CTAs 0..7 (empty past `splits`; a cluster has at least 2)
        v2 = load_cluster_f32(array, at, 2) if splits > 2 else empty
        v3 = load_cluster_f32(array, at, 3) if splits > 3 else empty
        v4 = load_cluster_f32(array, at, 4) if splits > 4 else empty
        v5 = load_cluster_f32(array, at, 5) if splits > 5 else empty
        v6 = load_cluster_f32(array, at, 6) if splits > 6 else empty
        v7 = load_cluster_f32(array, at, 7) if splits > 7 else empty
        return load_cluster_f32(array, at, 0), load_cluster_f32(array, at, 1), v2, v3, v4, v5, v6, v7

    @device_function
    def weight(m, top):
        return exp2(m - top) if m > NEG_INF else float32(0)

    @device_function
    def cluster_merge(s_o, s_stat, out, row0, heads, splits, rank):
        tid = cuda.threadIdx.x
        cluster_sync()  # every CTA's partial in its shared memory, visible to the cluster
        i = rank * THREADS + tid
        while i < heads * D:  # (a range here would divide for its trip count)
            j = i // D
            m0, m1, m2, m3, m4, m5, m6, m7 = remote8(s_stat, 2 * j, splits, NEG_INF)
            l0, l1, l2, l3, l4, l5, l6, l7 = remote8(s_stat, 2 * j + 1, splits, float32(0))
            o0, o1, o2, o3, o4, o5, o6, o7 = remote8(s_o, i, splits, float32(0))
            top = max(max(max(m0, m1), max(m2, m3)), max(max(m4, m5), max(m6, m7)))
            w0, w1, w2, w3 = weight(m0, top), weight(m1, top), weight(m2, top), weight(m3, top)
            w4, w5, w6, w7 = weight(m4, top), weight(m5, top), weight(m6, top), weight(m7, top)
            total = ((w0 * l0 + w1 * l1) + (w2 * l2 + w3 * l3)) + ((w4 * l4 + w5 * l5) + (w6 * l6 + w7 * l7))
            acc = ((w0 * o0 + w1 * o1) + (w2 * o2 + w3 * o3)) + ((w4 * o4 + w5 * o5) + (w6 * o6 + w7 * o7))
            out[(row0 + j) * D + i % D] = acc / total
            i += splits * THREADS
        cluster_sync_relaxed()  # no CTA leaves while another may still read its shared memory

    return cluster_merge


def softmax_scale(head_dim: int, scale: float | None) -> float:
    """The softmax scale: ``1/sqrt(head_dim)`` unless given."""
    return 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
