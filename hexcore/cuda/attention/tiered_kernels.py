"""The kernels of a format by age's decode (``tiered.py`` makes their launches).

Every pool's launch runs the decode kernel's item with ``partials`` (its split slots of
every query head's row: ``[base_p, base_p + splits_p)`` of ``total``). What combines the
slots of a row into ``out`` is one of:

- ``merge_kernel``: a launch of its own after the pools' (``DecodeOptions.tiered_merge``
  "launch"), each CTA one (sequence, KV head, head group); ``fused_merge_kernel`` is it with
  an FP16 first pool's items computed first in the same CTA (``tiered_fp16`` "merge").
- ``pool_kernel(..., last=True)``: the last pool's launch itself (``tiered_merge`` "last"):
  every CTA of it counts itself done in ``counters`` (an item past its sequence's splits
  too: its empty partial is one of the slots merged), and the last of a (sequence, KV head,
  head group) merges every pool's slots. With programmatic dependent launches the pools'
  launches then overlap: each but the last lets the next one start as soon as it starts
  (``allow_dependent_grids``), the first waits for what ran before it (the step's ``q``, the
  last layer's merge still reading the workspace), every later one but the last waits for
  the one before it before it exits, so that a grid's end implies every earlier pool's; the
  last pool's merging CTA waits for the one before it, then reads every slot. The later
  pools read ``q`` and the stores without waiting: every CTA of the first pool passed its
  wait (the grids before it had ended) before the second could start.
- ``one_launch_kernel`` (``tiered_merge`` "one"): no launch per pool: one grid whose CTAs
  of a row are every pool's splits (the item of the pool its slot falls in), the last of
  the row merging as above. Its items share one shared-memory ring (``decode_item_function
  (ring_arg=True)``): each item's own would add up to more than a CTA may have (ptxas,
  sm_90, int2-aged D128: 103 KB against 48 KB). With ``packed`` (``tiered_merge``
  "packed") the grid is the last pool's splits only and each CTA also runs the younger
  pools' slots that fall to it (slot ``x``, ``x + W``, ... for a grid ``W`` wide), one
  after the other: no CTA per young item.
"""

from __future__ import annotations

import functools

from numba import cuda, int32, uint32

from ..device import (SHARED_ALIGN16, SIMULATOR, add_acq_rel_i32, allow_dependent_grids, device_function,
                      wait_prior_grids)
from .kernel import GRID_REGISTERS, decode_item_function, merge_function, ring_words
from .shape import HEADS_PER_CTA, THREADS, DecodeShape


@functools.cache
def merge_kernel(H: int, G: int, D: int, dependent: bool = False):
    """``kernel[(H * head_groups, B), THREADS](part_o, part_ml, out, seq_lens, total)``: each
    CTA merges the ``total`` split slots of its (sequence, KV head, head group)'s query heads
    into ``out`` (flat float16), zeros for a sequence of length 0. ``dependent``: for a
    programmatic dependent launch (``kernel.decode_kernel``'s): it waits for the grid before
    it (the pools' partials) before any read."""
    merge_row = merge_row_function(H, G, D)
    HG = -(-G // HEADS_PER_CTA)

    @cuda.jit
    def kernel(part_o, part_ml, out, seq_lens, total):
        if dependent:
            wait_prior_grids()
        h, hg, b = cuda.blockIdx.x // HG, cuda.blockIdx.x % HG, cuda.blockIdx.y
        merge_row(part_o, part_ml, out, seq_lens, total, h, hg, b)
        if dependent:
            allow_dependent_grids()

    kernel.waits_for_prior_grids = dependent
    return kernel


@functools.cache
def merge_row_function(H: int, G: int, D: int):
    """``merge_row(part_o, part_ml, out, seq_lens, total, h, hg, b)``, the whole CTA: the
    ``total`` split slots of (sequence ``b``, KV head ``h``, head group ``hg``)'s query heads
    merged into ``out`` (flat float16), zeros for a sequence of length 0."""
    merge_splits = merge_function(D)

    @cuda.jit(device=True)
    def merge_row(part_o, part_ml, out, seq_lens, total, h, hg, b):
        row0 = (b * H + h) * G + hg * HEADS_PER_CTA
        heads = min(HEADS_PER_CTA, G - hg * HEADS_PER_CTA)
        if seq_lens[b] <= 0:
            for i in range(cuda.threadIdx.x, heads * D, THREADS):
                out[(row0 + i // D) * D + i % D] = 0
            return
        merge_splits(part_o, part_ml, out, row0, heads, total, total)

    return merge_row


@functools.cache
def fused_merge_kernel(shape: DecodeShape, max_registers: int | None = None, l2_prefetch: str = "none",
                       joint_softmax: bool = True, dependent: bool = False):
    """``kernel[(H * head_groups, B), THREADS](<pool 0's partials arguments>, seq_lens,
    pool_splits)``: :func:`merge_kernel` with pool 0 (an FP16 pool of ``shape``) done first
    in the same CTA. Pool 0's arguments are its partials launch's (``_partials``: its slots
    first in every row, ``max_splits`` every pool's ``total``); each CTA runs its (sequence,
    KV head, head group)'s items of splits ``0 .. pool_splits - 1`` (``decode_item_function``
    with ``partials``), then merges the ``total`` slots into ``out`` (the other pools'
    partials were written by the launches before it), zeros where ``seq_lens[b]`` is 0.
    The items read their thread index volatile (``decode_item_function(volatile_tid=True)``):
    without it, what they derive from it was hoisted out of the split loop (sm_90, D128:
    132 bytes of spills at the cap of 128, against 12 with it). ``dependent``: as
    :func:`merge_kernel`'s."""
    item = decode_item_function(shape, l2_prefetch, joint_softmax, partials=True, volatile_tid=True)
    merge_row = merge_row_function(shape.H, shape.G, shape.D)
    HG = shape.head_groups
    cap = GRID_REGISTERS if max_registers is None else max_registers
    options = {} if SIMULATOR else {"max_registers": cap}

    @cuda.jit(**options)
    def kernel(pool, k_codes, v_codes, k_meta, v_meta, k_tails, v_tails, q, block_tables, pool_lens, tail_slots, out,
               part_o, part_ml, counters, layer, num_blocks, max_seqs, split_blocks, total, scale, seq_lens,
               pool_splits):
        if dependent:
            wait_prior_grids()
        h, hg, b = cuda.blockIdx.x // HG, cuda.blockIdx.x % HG, cuda.blockIdx.y
        for split in range(pool_splits):
            item(pool, k_codes, v_codes, k_meta, v_meta, k_tails, v_tails, q, block_tables, pool_lens, tail_slots,
                 out, part_o, part_ml, counters, layer, num_blocks, max_seqs, split_blocks, total, scale, split, h,
                 hg, b)
            cuda.syncthreads()  # the item's shared memory free for the next
        cuda.threadfence()  # the partials written above reach L2, where the merge reads them (ld.cg)
        cuda.syncthreads()
        merge_row(part_o, part_ml, out, seq_lens, total, h, hg, b)
        if dependent:
            allow_dependent_grids()

    kernel.waits_for_prior_grids = dependent
    return kernel


@functools.cache
def pool_kernel(shape: DecodeShape, max_registers: int | None = None, l2_prefetch: str = "none",
                joint_softmax: bool = True, dependent: bool = False, first: bool = True, last: bool = True):
    """``kernel[(splits, H * head_groups, B), THREADS](<the partials kernel's 21 arguments>,
    seq_lens)``: one pool's launch of ``tiered_merge`` "last" (the module's docstring). The
    arguments are the decode kernel's with ``part_o``/``part_ml`` starting at the pool's first
    slot and ``max_splits`` every pool's ``total``; ``seq_lens`` int32 ``[B]`` is each
    sequence's whole length (zeros in ``out`` where it is 0). ``last``: this launch merges
    (``counters``: int32 ``[B * H * head_groups]``, zero before, zero after). ``first``,
    ``dependent``: where it waits and lets the next launch start (the module's docstring).
    ``first`` and ``last`` both: a format of one pool, the grid decode's order of waits."""
    item = decode_item_function(shape, l2_prefetch, joint_softmax, partials=True)
    merge_if_last = last_merge_function(shape.H, shape.G, shape.D, dependent and not first)
    HG = shape.head_groups
    cap = GRID_REGISTERS if max_registers is None else max_registers
    options = {} if SIMULATOR else {"max_registers": cap}

    @cuda.jit(**options)
    def kernel(pool, k_codes, v_codes, k_meta, v_meta, k_tails, v_tails, q, block_tables, pool_lens, tail_slots, out,
               part_o, part_ml, counters, layer, num_blocks, max_seqs, split_blocks, max_splits, scale, seq_lens):
        if dependent and first:
            wait_prior_grids()
        if dependent and not last:
            allow_dependent_grids()
        split, h, hg, b = cuda.blockIdx.x, cuda.blockIdx.y // HG, cuda.blockIdx.y % HG, cuda.blockIdx.z
        item(pool, k_codes, v_codes, k_meta, v_meta, k_tails, v_tails, q, block_tables, pool_lens, tail_slots, out,
             part_o, part_ml, counters, layer, num_blocks, max_seqs, split_blocks, max_splits, scale, split, h, hg, b)
        if last:
            merge_if_last(part_o, part_ml, out, counters, seq_lens, max_splits)
            if dependent:
                allow_dependent_grids()
        elif dependent and not first:
            wait_prior_grids()  # this grid ends after the one before it (the last pool's merge relies on it)

    kernel.waits_for_prior_grids = dependent
    return kernel


def last_merge_function(H: int, G: int, D: int, wait: bool):
    """``merge_if_last(part_o, part_ml, out, counters, seq_lens, max_splits)``, the whole CTA
    after its item, in a grid ``(x, H * head_groups, B)``: each CTA counts itself done in
    ``counters[(b * H + h) * head_groups + hg]`` (an item past its sequence's splits too: its
    empty partial is one of the slots merged), its partial released by thread 0's count after
    the barrier; the last of the row's ``x`` CTAs acquires the others' and merges the row's
    ``max_splits`` slots into ``out`` (``merge_row_function``), then zeroes the counter for
    the next launch. The slots not written by this grid's CTAs were written by the grids
    before it: ``wait``, the merging CTA first waits for them (``wait_prior_grids``:
    ``pool_kernel``'s last pool after the earlier pools' launches)."""
    merge_row = merge_row_function(H, G, D)
    HG = -(-G // HEADS_PER_CTA)

    @cuda.jit(device=True)
    def merge_if_last(part_o, part_ml, out, counters, seq_lens, max_splits):
        # the CTA's indices read again here: none held in registers across the item's loop
        h, hg, b = cuda.blockIdx.y // HG, cuda.blockIdx.y % HG, cuda.blockIdx.z
        s_flag = cuda.shared.array(1, int32)
        cuda.syncthreads()  # every thread's partial written
        slot = (b * H + h) * HG + hg
        if cuda.threadIdx.x == 0:
            s_flag[0] = add_acq_rel_i32(counters, slot, 1) == cuda.gridDim.x - 1
        cuda.syncthreads()
        if s_flag[0] == 0:
            return
        if wait:
            wait_prior_grids()
        merge_row(part_o, part_ml, out, seq_lens, max_splits, h, hg, b)
        if cuda.threadIdx.x == 0:
            counters[slot] = 0  # ready for the next launch

    return merge_if_last


_ONE_LAUNCH_KERNELS: dict = {}  # one_launch_kernel's, by its arguments however they are passed


def one_launch_kernel(shapes: tuple, max_registers: int | None = None, l2_prefetch: str = "none",
                      joint_softmax: bool = True, dependent: bool = False, packed: bool = False):
    """``kernel[(total, H * head_groups, B), THREADS](<pool a's partials arguments>, seq_lens,
    n_a, n_b, <pool b's own arguments>, <pool c's own arguments>)``: ``tiered_merge`` "one",
    every pool's items in one grid, merged by the last CTA of each (sequence, KV head, head
    group) (``last_merge_function``): no merge launch and no pool waiting for another; with
    ``dependent``, every CTA first waits for the grid before it (the last layer's launch).

    ``shapes``: the pools' ``DecodeShape`` in slot order, ``(a, b)`` or ``(a, b, c)``: CTA
    ``x`` of a row takes slot ``x``, pool a's split ``x`` below ``n_a``, pool b's split ``x -
    n_a`` below ``n_a + n_b``, pool c's ``x - n_a - n_b`` after (``total`` = every pool's
    splits). Pool a's arguments are its partials launch's 21, ``part_o``/``part_ml`` the whole
    workspace (its slots first in every row) and ``max_splits`` = ``total``; each further
    pool's own are its ``pool, k_codes, v_codes, k_meta, v_meta, k_tails, v_tails,
    block_tables, pool_lens, part_o, part_ml, num_blocks, max_seqs, split_blocks`` (its
    partial arrays starting at its first slot; ``tiered.OWN_ARGS``); ``q``, ``tail_slots``,
    ``out``, ``counters``, ``layer`` and ``scale`` are shared. Two pools: pass pool b's
    arguments as pool c's too (that branch is compiled out). ``seq_lens`` int32 ``[B]``: each
    sequence's whole length (zeros in ``out`` where it is 0).

    ``packed``: the grid ``(W, H * head_groups, B)`` is ``W`` CTAs a row (the last pool's
    splits, ``n_a``), and CTA ``x`` runs slots ``x, x + W, x + 2W, ...`` below ``total`` in
    turn (its items read their thread index volatile, as in a loop: ``fused_merge_kernel``),
    then counts itself done; the last of the row merges."""
    key = (tuple(shapes), max_registers, l2_prefetch, joint_softmax, dependent, packed)
    if key in _ONE_LAUNCH_KERNELS:
        return _ONE_LAUNCH_KERNELS[key]
    if len(shapes) not in (2, 3):
        raise ValueError(f"one_launch_kernel: expected two or three pools' shapes, got {len(shapes)}")
    three = len(shapes) == 3
    item_a, item_b, item_c = (decode_item_function(s, l2_prefetch, joint_softmax, partials=True, ring_arg=True,
                                                   volatile_tid=packed)
                              for s in (*shapes, shapes[-1])[:3])
    PACKED = packed
    RING_WORDS = max(ring_words(s) for s in shapes)
    merge_if_last = last_merge_function(shapes[0].H, shapes[0].G, shapes[0].D, False)
    HG = shapes[0].head_groups
    cap = GRID_REGISTERS if max_registers is None else max_registers
    options = {} if SIMULATOR else {"max_registers": cap}

    @device_function
    def slot_item(x, n_a, n_b, h, hg, b, ring, args_a, args_b, args_c):
        # slot x of row (b, h, hg): the item of the pool it falls in (args_p: its arguments)
        if x < n_a:
            item_a(*args_a, x, h, hg, b, ring)
        elif not three or x < n_a + n_b:
            item_b(*args_b, x - n_a, h, hg, b, ring)
        else:
            item_c(*args_c, x - n_a - n_b, h, hg, b, ring)

    @cuda.jit(**options)
    def kernel(pool, k_codes, v_codes, k_meta, v_meta, k_tails, v_tails, q, block_tables, pool_lens, tail_slots, out,
               part_o, part_ml, counters, layer, num_blocks, max_seqs, split_blocks, total, scale, seq_lens, n_a, n_b,
               b_pool, b_k_codes, b_v_codes, b_k_meta, b_v_meta, b_k_tails, b_v_tails, b_tables, b_lens, b_part_o,
               b_part_ml, b_num_blocks, b_max_seqs, b_split_blocks,
               c_pool, c_k_codes, c_v_codes, c_k_meta, c_v_meta, c_k_tails, c_v_tails, c_tables, c_lens, c_part_o,
               c_part_ml, c_num_blocks, c_max_seqs, c_split_blocks):
        if dependent:
            wait_prior_grids()
        x, h, hg, b = cuda.blockIdx.x, cuda.blockIdx.y // HG, cuda.blockIdx.y % HG, cuda.blockIdx.z
        ring = cuda.shared.array(RING_WORDS, uint32, alignment=SHARED_ALIGN16)  # every item's, one array
        args_a = (pool, k_codes, v_codes, k_meta, v_meta, k_tails, v_tails, q, block_tables, pool_lens, tail_slots,
                  out, part_o, part_ml, counters, layer, num_blocks, max_seqs, split_blocks, total, scale)
        args_b = (b_pool, b_k_codes, b_v_codes, b_k_meta, b_v_meta, b_k_tails, b_v_tails, q, b_tables, b_lens,
                  tail_slots, out, b_part_o, b_part_ml, counters, layer, b_num_blocks, b_max_seqs, b_split_blocks,
                  total, scale)
        args_c = (c_pool, c_k_codes, c_v_codes, c_k_meta, c_v_meta, c_k_tails, c_v_tails, q, c_tables, c_lens,
                  tail_slots, out, c_part_o, c_part_ml, counters, layer, c_num_blocks, c_max_seqs, c_split_blocks,
                  total, scale)
        if PACKED:
            while x < total:
                slot_item(x, n_a, n_b, h, hg, b, ring, args_a, args_b, args_c)
                x += cuda.gridDim.x
                cuda.syncthreads()  # the ring free for the next item
        else:
            slot_item(x, n_a, n_b, h, hg, b, ring, args_a, args_b, args_c)
        merge_if_last(part_o, part_ml, out, counters, seq_lens, total)
        if dependent:
            allow_dependent_grids()

    kernel.waits_for_prior_grids = dependent
    _ONE_LAUNCH_KERNELS[key] = kernel
    return kernel
