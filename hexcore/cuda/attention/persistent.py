"""Persistent checkpoint-and-yield decode: ``persistent_decode`` and ``PersistentDecode``.

One long attention launch (a 128k context at large batch) can hold every SM for tens of
milliseconds, and a GPU with a kernel-time watchdog kills a launch that runs too long. This
decode runs in *slices*, each a launch that ends within a time budget:

- The work is the decode kernel's items, ``(sequence, KV head, head group, split)``,
  numbered into a queue (split fastest). A slice launches one CTA per resident CTA slot;
  each CTA's thread 0 reads ``%globaltimer`` (``timer.py``) before it takes an item, and
  takes one only while the slice's budget is not spent, measured from the slice's first
  CTA (the first to swap its time into ``START``). A CTA's first item is static (its slot's
  item past the slice's start, no atomic); later ones come from the queue cursor
  (``atomic add``), past the slice's static items. A CTA that starts after the budget owes
  its static item (the owed list), and the next slice, a *repair* slice, takes the owed
  items first. An *eager* first slice of a call (``DecodeOptions.eager_first``) runs its
  static items without waiting for the budget check, and owes none.
  Where that eager slice's grid is one CTA an item, ``run`` and a one-slice ``enqueue`` are
  that one launch (``ONESHOT``): its outcome is known (every item runs), so it runs a
  kernel of its own (``oneshot_kernel``: the grid kernel's grid and item, no loop) that
  skips the slice's state altogether and stores its clock readings in records per item.
  An item is ``kernel.decode_item``, the grid kernel's own work, so the numerics are
  ``paged_decode``'s.
- The checkpoint is the split-K workspace: a finished item has written its partial, and the
  last split of a (sequence, head) to finish merges them (the merge counters live in device
  memory, so this works across slices). The queue cursor is the resume point: an item is
  taken once, and a CTA that took one finishes it, so work is never lost or repeated, and a
  slice runs past its budget by at most its longest item.
- The last CTA to leave a slice logs it (start, end, items, longest item), records how many
  items the call has handed out (``DONE``) and clears the slice's fields for the next one
  (a one-launch call has no last CTA: its CTA 0 leaves the words of a drained call, and its
  log is its CTAs' records).
- No reset launch between calls: the cursor only grows, and a call's items are the cursor
  values from the call's base on. The last CTA of every slice snapshots the cursor
  (``SNAP``); the first slice of a call (flag ``FIRST``) takes the snapshot as its base
  (every one of its CTAs reads it before its last CTA moves it) and its last CTA publishes
  that base (``BASE``) to the call's later slices and restarts the log. So the base lives on
  the device: a CUDA graph of slices replays correctly whatever ran before it. The merge
  counters clear themselves as each merge completes; the last slice of a fixed number (flag
  ``LAST``, the capture-safe form) clears them if the queue was not drained (an abandoned
  call, whose merges never ran). A reset kernel clears everything only after a call cut
  short by an exception or left by bare slices (the plan's own mark for its state, the
  workspace's record for its merge counters, which another plan may share) and, with
  ``count_items``, before every call (its counts are per call).

Host side: ``persistent_decode`` (and ``PersistentDecode.run``) enqueue slices and read the
state back until the queue is drained, so they synchronise with the stream (a one-launch
call reads nothing back and waits for the stream).
``PersistentDecode.enqueue(layer, slices)`` enqueues a fixed number of slices and reads
nothing back: capture-safe (a CUDA graph of a fixed number of slices); a slice that finds
the queue drained returns at once, and ``stats()`` says afterwards whether the slices were
enough (``drained``). See docs/persistent.md.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np
from numba import cuda, int32, int64

from ...errors import HexcoreInvalidArgumentError
from ..._checks import as_int, real_value, shown
from ..arrays import checked_layer, device_only
from ..device import SIMULATOR, add_acq_rel, allow_dependent_grids, load_relaxed, shfl_idx_int, wait_prior_grids
from ..streams import resolve_stream
from ..timer import global_timer_ns
from . import launcher
from .kernel import GRID_REGISTERS, decode_item_function
from .options import DecodeOptions
from .shape import THREADS, DecodeShape

# state: int64 [STATE_WORDS + 3 * grid]: the words, then the owed list (one word per CTA of
# the slice grid), then a one-launch call's starts and ends, one word each per item (its grid
# is the items: ``ONESHOT``); the protocol and who writes what: docs/persistent.md
CURSOR, LAUNCH, START, EXITED, LONGEST, LATEST, DONE, BASE, SNAP, REPAIR, OWED, REPAID, SHOT = range(13)
STATE_WORDS = 13
# a slice's flags: the first of a call; the last of a fixed number (enqueue); with FIRST, its
# CTAs start their static items before they know the slice's start (``DecodeOptions.eager_first``);
# with FIRST | EAGER and a grid of one CTA an item, the call's only launch (``oneshot_kernel``)
FIRST, LAST, EAGER, ONESHOT = 1, 2, 4, 8
# BASE after a one-launch call: a later slice of the call (a bare ``launches`` slice) finds no item
DRAINED_BASE = -(1 << 62)
# log: int64 [MAX_LOGGED, LOG_WORDS]: per slice its start, end, items, longest item and the
# latest time an item was taken (all %globaltimer ns)
LOG_WORDS = 5
MAX_LOGGED = 1 << 15  # slices logged per call; later ones are counted only
MAX_BUDGET_US = 1_000_000.0  # half the 2 s watchdog of a display GPU, room for the one-item overrun
READ_BYTES_PER_US = 4.4e6  # HBM read rate the item-size model assumes (4.4 TB/s, measured on the H200)
ITEM_SHARE = 0.25  # items are sized to at most this share of the budget (by that model)
REGISTERS_PER_SM = 65536  # the register file of an SM (sm_50 through sm_90)


class BudgetError(HexcoreInvalidArgumentError):
    """A time budget that is not a number in (0, MAX_BUDGET_US] or is shorter than one work item."""


class PersistentStats(NamedTuple):
    """What one persistent decode call did.

    ``launches``: slices launched (a slice that found the queue drained counts); ``yields``:
    slices that ended with work left in the queue; ``items``: work items of the call;
    ``items_per_launch``, ``launch_us``: per logged slice, the items it took and its span by
    ``%globaltimer`` (its first CTA's start to its last CTA's end; after a one-launch call
    followed by a bare ``launches`` slice, row 0 is that call's CTA 0's own view); ``longest_launch_us``,
    ``longest_item_us``: maxima over the call; ``latest_take_us``: per logged slice, how long
    after its start its last item was taken (below ``budget_us``: the protocol's
    invariant, except in an eager first slice, ``DecodeOptions.eager_first``); ``drained``: every item was taken (always
    true after ``run``); ``item_counts``: int32 ``[items]``, how often each item was taken
    (with ``count_items``, else None).
    """

    launches: int
    yields: int
    items: int
    items_per_launch: tuple
    launch_us: tuple
    longest_launch_us: float
    longest_item_us: float
    latest_take_us: tuple
    budget_us: float
    drained: bool
    item_counts: np.ndarray | None


@functools.cache
def persistent_kernel(shape: DecodeShape, max_registers: int | None = None, l2_prefetch: str = "none",
                      joint_softmax: bool = True, count_items: bool = False, item_call: str = "inline",
                      dependent: bool = False):
    """The slice kernel of ``shape``: the decode kernel's arguments, then ``state`` int64
    ``[STATE_WORDS + 3 * grid]``, ``log`` int64 ``[MAX_LOGGED * LOG_WORDS]``, ``item_counts`` int32 (``[items]``
    with ``count_items``), ``budget_ns``, ``num_items``, ``flags`` (``FIRST`` | ``LAST`` | ``EAGER``).
    Launched with a 1-D grid. A one-launch call (``ONESHOT``) runs ``oneshot_kernel`` instead.

    ``item_call`` (``DecodeOptions.persistent_item``) "call": the item is a device function
    the loop calls and NVVM may not inline (``call_noinline``):
    inlined, the optimiser hoisted the item's loop-invariant values (shared-memory addresses
    of the thread, 64-bit each) out of the item loop, and they stayed live across every item
    (ptxas, sm_90, INT4 D128 G4: 254 registers; called, 168, as for one item without a loop).
    ptxas reads the kernel's arguments inside the callee from the parameter bank. The item
    is a fresh compilation of ``decode_item_function``, not the cached one the grid kernel
    inlines: the ``noinline`` mark is on the compiled definition, which a grid kernel
    compiled later in the same process would otherwise link and call out of line.

    "inline" (the default): the item inlined into the loop, reading its thread index with a
    volatile move (``decode_item_function(volatile_tid=True)``), so that nothing it derives
    from the index is hoisted out of the loop (ptxas, sm_90, D128 G4: 186-206 registers with
    no cap; at a cap of 128, the grid kernel's and this item's default, 60-144 bytes of spill
    stores against the called item's ~900). On the H200 (eleventh session) it is faster than
    the called item on every grouped-query shape measured, 1.05-1.28x the grid kernel's time
    against 1.20-1.46x.

    ``dependent``: the slice kernel for programmatic dependent launches (as the grid
    kernel's, ``kernel.decode_kernel``): it waits for the grid before it on the stream before
    its first state read, and lets the next slice be scheduled once it is done; its
    ``waits_for_prior_grids`` says which it is."""
    inline = item_call == "inline"
    decode_item = decode_item_function.__wrapped__(shape, l2_prefetch, joint_softmax, volatile_tid=inline)
    HG, YS = shape.head_groups, shape.H * shape.head_groups
    if max_registers is None and inline:
        max_registers = GRID_REGISTERS  # the grid kernel's cap: as many CTAs per SM as it
    options = {} if max_registers is None or SIMULATOR else {"max_registers": max_registers}

    @cuda.jit(device=True)
    def run_item(pool, k_codes, v_codes, k_meta, v_meta, k_tails, v_tails, q, block_tables, seq_lens, tail_slots,
                 out, part_o, part_ml, counters, layer, num_blocks, max_seqs, split_blocks, max_splits, scale, item):
        # item -> (split, KV head, head group, sequence), split fastest; 32-bit like the grid
        # kernel's block indices (fewer registers at a cap). The arrays are global memory: said
        # so (as_global), since a callee cannot see that they are kernel arguments. The item
        # comes from shared memory, the same in every thread; broadcast from lane 0 the
        # compiler knows it is warp-uniform and keeps what derives from it in uniform
        # registers, as the grid kernel does with its block indices (without it, at the cap of
        # 128, the fp16 block loop reloaded its counter and table row from spills every block;
        # ptxas sm_90 D128 G4, spill stores/loads FP16 148/268 -> 108/188 bytes, none left in
        # the block loop; INT4 80/204 -> 44/100)
        split, rest = item % max_splits, item // max_splits
        y, b = rest % YS, rest // YS
        decode_item(as_global(pool), k_codes, v_codes, k_meta, v_meta, k_tails, v_tails, as_global(q),
                    as_global(block_tables), as_global(seq_lens), as_global(tail_slots), as_global(out),
                    as_global(part_o), as_global(part_ml), as_global(counters), layer, num_blocks, max_seqs,
                    split_blocks, max_splits, scale, shfl_idx_int(index(split), 0), shfl_idx_int(index(y // HG), 0),
                    shfl_idx_int(index(y % HG), 0), shfl_idx_int(index(b), 0))

    @cuda.jit(**options)
    def kernel(pool, k_codes, v_codes, k_meta, v_meta, k_tails, v_tails, q, block_tables, seq_lens, tail_slots, out,
               part_o, part_ml, counters, layer, num_blocks, max_seqs, split_blocks, max_splits, scale, state, log,
               item_counts, budget_ns, num_items, flags):
        if dependent:
            wait_prior_grids()  # the previous slice (or kernel) done and its writes visible: I2
        tid = cuda.threadIdx.x
        # thread 0's clock and queue, kept in shared memory so that nothing of it lives in
        # registers across an item: now, start, last read, longest item, items taken, latest
        # take, item, the cursor's offset, the take mode, the call's base (``begin_slice``; 10
        # words: the item's ring, placed after them, stays 16-byte aligned)
        s = cuda.shared.array(10, int64)
        if tid == 0:
            begin_slice(state, s, budget_ns, num_items, flags)
        # the one barrier before the first item: s set, s[6] the first item (or -1). Thread
        # 0's block must end in a barrier of its own (ptxas 13, sm_90, 2026-12-02: merged with
        # a later thread-0 block, lanes 1-31 of warp 0 reached the next barrier without
        # reconverging, and racecheck found thread 0's writes of s racing the reads)
        cuda.syncthreads()
        while True:
            item = s[6]
            if item < 0:
                break
            if count_items and tid == 0:
                cuda.atomic.add(item_counts, item, 1)
            if inline:
                run_item(pool, k_codes, v_codes, k_meta, v_meta, k_tails, v_tails, q, block_tables, seq_lens,
                         tail_slots, out, part_o, part_ml, counters, layer, num_blocks, max_seqs, split_blocks,
                         max_splits, scale, item)
            else:
                call_noinline(run_item, (pool, k_codes, v_codes, k_meta, v_meta, k_tails, v_tails, q, block_tables,
                                         seq_lens, tail_slots, out, part_o, part_ml, counters, layer, num_blocks,
                                         max_seqs, split_blocks, max_splits, scale, item))
            cuda.syncthreads()  # every thread is done with the item's shared memory and has read s[6]
            if tid == 0:
                next_item(state, s, budget_ns, num_items)
            cuda.syncthreads()  # s[6] (the next item, or -1) set
        if tid == 0:
            end_slice(state, log, counters, s[3], s[5], s[4], num_items, s[9], flags)
        if dependent:
            allow_dependent_grids()

    kernel.waits_for_prior_grids = dependent
    return kernel


@functools.cache
def oneshot_kernel(shape: DecodeShape, max_registers: int | None = None, l2_prefetch: str = "none",
                   joint_softmax: bool = True, count_items: bool = False, dependent: bool = False):
    """The kernel of a one-launch call (``ONESHOT``: ``PersistentDecode.one_launch``): the
    slice kernel's arguments (``persistent_kernel``; ``budget_ns`` and ``flags`` unused) and
    the grid kernel's grid, ``(splits, num_kv_heads * head_groups, batch)``: each CTA runs
    its item with the grid kernel's own code (``kernel.decode_item_function``, its indices
    read from ``blockIdx`` as ``decode_kernel`` reads them), between two clock readings of
    thread 0 that ``end_oneshot`` stores under the item's queue number (split fastest: the
    CTA's linear index). No loop, no queue and no slice state (ptxas 13.5, sm_90, D=128 BS=32
    G=4, ``benchmarks.ptx_report --persistent``): uncapped, FP16/INT4/INT2 take 166/162/158
    registers against the grid kernel's 166/156/156 and the slice kernel's 188/168/187, whose
    loop keeps the item's values live across items. At a cap of 128 its spill loads
    (FP16/INT4/INT2 64/60/60 bytes) are the grid kernel's for FP16 and more for INT4 and INT2
    (8 and 52), likely because ``state``'s pointer stays live across the item for the stores
    after it (a variant with no stores after the item has none: RESULTS.md, fifty-seventh
    session).
    ``dependent`` as in ``persistent_kernel``."""
    decode_item = decode_item_function(shape, l2_prefetch, joint_softmax)
    HG = shape.head_groups
    cap = GRID_REGISTERS if max_registers is None else max_registers
    options = {} if SIMULATOR else {"max_registers": cap}

    @cuda.jit(**options)
    def kernel(pool, k_codes, v_codes, k_meta, v_meta, k_tails, v_tails, q, block_tables, seq_lens, tail_slots, out,
               part_o, part_ml, counters, layer, num_blocks, max_seqs, split_blocks, max_splits, scale, state, log,
               item_counts, budget_ns, num_items, flags):
        if dependent:
            wait_prior_grids()
        start = cuda.shared.array(1, int64)  # thread 0's first clock reading
        if cuda.threadIdx.x == 0:
            start[0] = global_timer_ns()
            if count_items:
                cuda.atomic.add(item_counts, linear_block(), 1)
        decode_item(pool, k_codes, v_codes, k_meta, v_meta, k_tails, v_tails, q, block_tables, seq_lens, tail_slots,
                    out, part_o, part_ml, counters, layer, num_blocks, max_seqs, split_blocks, max_splits, scale,
                    cuda.blockIdx.x, cuda.blockIdx.y // HG, cuda.blockIdx.y % HG, cuda.blockIdx.z)
        cuda.syncthreads()  # the item is done in every thread
        if cuda.threadIdx.x == 0:
            end_oneshot(state, log, start[0], global_timer_ns(), linear_block(), num_items)
        if dependent:
            allow_dependent_grids()

    kernel.waits_for_prior_grids = dependent
    return kernel


if SIMULATOR:
    def call_noinline(function, args):
        """``function(*args)`` (the simulator has no NVVM)."""
        return function(*args)

    def as_global(array):
        """``array`` (the simulator has no address spaces)."""
        return array

    index = int  # numpy 2 would keep int32 arithmetic in 32 bits, where the GPU promotes to int64
else:
    from llvmlite import ir
    from numba import types
    from numba.cuda import cgutils
    from numba.cuda.extending import intrinsic

    index = int32

    @intrinsic
    def call_noinline(typingctx, function, args):
        """``function(*args)`` for a ``cuda.jit(device=True)`` function, kept out of line:
        its definition gets LLVM's ``noinline`` (NVVM ignores the attribute on a call site).
        ``function`` must be called only this way (the attribute is on its definition)."""
        if not isinstance(function, types.Dispatcher) or not isinstance(args, types.BaseTuple):
            return None
        inner = typingctx.resolve_function_type(function, tuple(args.types), {})
        if inner is None:
            return None

        def codegen(context, builder, signature, llargs):
            values = cgutils.unpack_tuple(builder, llargs[1], len(args.types))
            result = context.get_function(function, inner)(builder, values)
            compiled = function.dispatcher.overloads[tuple(inner.args)]
            name = compiled.fndesc.mangled_name
            defined = [f for m in compiled.library.modules for f in m.functions if f.name == name and f.blocks]
            if len(defined) != 1:
                raise RuntimeError(f"call_noinline: {len(defined)} definitions of {name}")
            defined[0].attributes.discard("alwaysinline")
            defined[0].attributes.add("noinline")
            return result

        return inner.return_type(function, args), codegen

    @intrinsic
    def as_global(typingctx, array):
        """``array`` with its data pointer marked as global memory, so that loads through it
        are ``ld.global`` (LDG) in a device function, as they are for a kernel's own arguments.
        The mark is a ``cvta.to.global`` (NVVM folds a pair of address-space casts away)."""
        if not isinstance(array, types.Array):
            return None

        def codegen(context, builder, signature, llargs):
            ary = context.make_array(array)(context, builder, value=llargs[0])
            i64 = ir.IntType(64)
            cvta = ir.InlineAsm(ir.FunctionType(i64, [i64]), "cvta.to.global.u64 $0, $1;", "=l,l")
            word = builder.call(cvta, [builder.ptrtoint(ary.data, i64)])
            globl = builder.inttoptr(word, ir.PointerType(ary.data.type.pointee, addrspace=1))
            ary.data = builder.addrspacecast(globl, ary.data.type)
            return ary._getvalue()

        return array(array), codegen


@cuda.jit(device=True)
def begin_slice(state, s, budget_ns, num_items, flags):
    """Thread 0 of a CTA entering its slice: fills ``s`` (now, start, last read, longest
    item, items taken, latest take, item, the cursor's offset, the take mode, the call's
    base) and its first item into ``s[6]`` (-1: none).

    One dependent global round trip: the loads of the slice's start (``SNAP``), the call's
    base and ``REPAIR`` and the ``START`` compare-and-swap are independent (in flight
    together). The CAS is unconditional: it returns the slice's start, or 0 to the CTA whose
    reading starts the slice, which then passes the budget check.

    A *normal* slice (``REPAIR`` 0, or a ``FIRST`` slice) starting at cursor value ``S``:
    CTA ``j``'s first item is static, the call's item ``S - base + j``, taken with no atomic
    if it is an item (below ``num_items``) and the budget is not spent; a CTA that finds the
    budget spent appends its static item to the owed list (``OWED``) instead, to be repaired
    by a later slice. Later takes are dynamic: cursor value ``c`` is item ``c + grid - base``
    (the last CTA out adds the grid's static items to the cursor); a CTA skips them when no
    item lies past the static ones (``S + grid - base >= num_items``: the take mode -1). A
    *repair* slice (``REPAIR`` > 0: owed items) has no static items: every take is dynamic,
    from the owed list first (``REPAID``), then the cursor (``c`` is item ``c - base``).

    An *eager* slice (``FIRST | EAGER``) waits for nothing: CTA ``j`` takes item ``j`` (the
    call's base is the snapshot) and its CAS's result is not awaited; ``s[1]`` is -1 (unknown)
    and ``resolve_start`` reads the slice's start and the base after the item, where a dynamic
    take needs them (the base is -1 until then: ``close_slice`` reads it itself if need be).
    No CTA owes an item: each runs its static one even if it starts after the budget."""
    now = global_timer_ns()
    if flags & EAGER:
        cuda.atomic.cas(state, START, 0, now)  # the slice's start if first; read back after the item
        s[0] = s[2] = now
        s[1] = -1
        s[3] = s[4] = s[5] = 0
        s[6] = s[9] = -1  # (s[7] is set with s[1] by resolve_start, before any read)
        s[8] = 0 if cuda.gridDim.x < num_items else -1
        if cuda.blockIdx.x < num_items:
            s[6] = cuda.blockIdx.x
            s[4] = 1
            s[5] = now
        return
    first = flags & FIRST
    snap = state[SNAP]  # written before this launch: plain loads
    base = snap if first else state[BASE]
    repair = 0 if first else state[REPAIR]
    begun = cuda.atomic.cas(state, START, 0, now)
    s[0] = s[2] = now
    s[1] = now if begun == 0 else begun
    s[3] = s[4] = s[5] = 0
    s[6] = -1
    s[9] = base
    if repair > 0:
        s[7] = base
        s[8] = repair
        take_item(state, s, budget_ns, num_items)
        return
    grid = cuda.gridDim.x
    s[7] = base - grid
    s[8] = 0 if snap + grid - base < num_items else -1
    i = snap - base + cuda.blockIdx.x
    if i < num_items:
        if s[0] - s[1] < budget_ns:
            s[6] = i
            s[4] = 1
            s[5] = now
        else:  # late (the budget spent): owed, for a repair slice to take
            state[STATE_WORDS + cuda.atomic.add(state, OWED, 1)] = i


@cuda.jit(device=True)
def linear_block():
    """The CTA's index in a 3-D grid, x fastest."""
    return cuda.blockIdx.x + cuda.gridDim.x * (cuda.blockIdx.y + cuda.gridDim.y * cuda.blockIdx.z)


@cuda.jit(device=True)
def end_oneshot(state, log, start, end, j, num_items):
    """Thread 0 of a CTA of a one-launch call (``oneshot_kernel``) after its item: its clock
    readings before and after it, ``start`` and ``end``, into the record words of item ``j``
    (its linear index; the grid is ``num_items`` CTAs), plain stores, no atomic, no fence: the
    host reads them after the stream (``PersistentDecode.stats``). CTA 0 also leaves the state
    as a drained call's last CTA out would, without reading it: ``SHOT`` set (the records hold
    the call's log), ``LAUNCH`` 1, ``DONE`` the items, nothing owed, and ``BASE``
    ``DRAINED_BASE``, so that a later non-``FIRST`` slice finds no item; the cursor and ``SNAP``
    stay where they were (the call took no cursor value), so the next call's base is this one's.
    Log row 0 gets CTA 0's own view (its start and end, the items, its item), what a later slice
    of the call would log after."""
    state[STATE_WORDS + num_items + j] = start
    state[STATE_WORDS + 2 * num_items + j] = end
    if j == 0:
        state[SHOT] = 1
        state[LAUNCH] = 1
        state[DONE] = num_items
        state[BASE] = DRAINED_BASE
        state[REPAIR] = 0
        state[OWED] = 0
        state[REPAID] = 0
        log[0], log[1], log[2], log[3], log[4] = start, end, num_items, end - start, start


@cuda.jit(device=True)
def resolve_start(state, s):
    """Thread 0 of an eager slice's CTA (``s[1]`` -1), after its static item: the call's base
    (the snapshot, which only the slice's last CTA out moves) into ``s[9]`` and ``s[7]``, and
    the slice's start (``START``, set by the first CAS: this CTA's own came earlier in program
    order, so a relaxed load sees it or the winner's value) into ``s[1]``."""
    if s[1] < 0:
        base = state[SNAP]
        s[9] = base
        s[7] = base - cuda.gridDim.x
        s[1] = load_relaxed(state, START)


@cuda.jit(device=True)
def next_item(state, s, budget_ns, num_items):
    """Thread 0 after an item: reads the clock, keeps the longest item, takes the next one."""
    s[0] = global_timer_ns()
    s[3] = max(s[3], s[0] - s[2])
    s[2] = s[0]
    if s[8] >= 0:  # a dynamic take may follow: it needs the start and the base
        resolve_start(state, s)
    take_item(state, s, budget_ns, num_items)


@cuda.jit(device=True)
def take_item(state, s, budget_ns, num_items):
    """Thread 0: a dynamic take, the next item into ``s[6]`` (-1: stop), if the take mode
    ``s[8]`` allows one (-1: nothing past the static items; 0: the cursor; ``r`` > 0: a
    repair slice's owed list of ``r`` items first) and the slice's budget is not spent at the
    reading ``s[0]`` (``s`` as in ``begin_slice``; cursor value ``c`` is item ``c - s[7]``)."""
    s[6] = -1
    if s[8] >= 0 and s[0] - s[1] < budget_ns:
        i = num_items
        if s[8] > 0:
            r = cuda.atomic.add(state, REPAID, 1)
            if r < s[8]:
                i = state[STATE_WORDS + r]  # written by an earlier slice: a plain load
            else:
                s[8] = 0  # the owed list is taken: the cursor from now on
        if s[8] == 0:
            i = cuda.atomic.add(state, CURSOR, 1) - s[7]
        if i < num_items:
            s[6] = i
            s[4] += 1
            s[5] = s[0]


@cuda.jit(device=True)
def end_slice(state, log, counters, longest, latest, taken, num_items, base, flags):
    """Thread 0 of a CTA leaving its slice: its longest item and latest take into the slice's
    maxima, then the count of CTAs out (``EXITED``), an acquire-release atomic: it releases
    everything this CTA did to the slice's state (its takes, START, the maxima, its owed
    entry, its reads of SNAP/BASE/REPAIR) and, in the last CTA out, acquires what every other
    CTA released, so that ``close_slice`` reads final values with no fence of its own."""
    if taken > 0:
        cuda.atomic.max(state, LONGEST, longest)
        cuda.atomic.max(state, LATEST, latest)
    if add_acq_rel(state, EXITED, 1) == cuda.gridDim.x - 1:
        close_slice(state, log, counters, num_items, base, flags)


@cuda.jit(device=True)
def close_slice(state, log, counters, num_items, base, flags):
    """The slice's last CTA out, alone on ``state`` from here: logs the slice (start, its own
    end reading, items taken, longest item, latest take), moves the cursor past a normal
    slice's static items and records it (``SNAP``: the next slice's start and the next
    call's base), the items owed (``REPAIR``: the next slice repairs them) and the call's
    items taken (``DONE``: items handed out, clipped to the call's, less those owed), clears
    the slice's fields; for a ``FIRST`` slice it publishes the call's ``base`` and logs at row
    0, for a ``LAST`` one with items left (an abandoned call) it clears the merge counters
    (whose merges never ran) and the owed list. Plain stores: the next slice is a later
    launch on the same stream, which sees them."""
    end = global_timer_ns()
    first = flags & FIRST
    if base < 0:  # an eager slice's CTA that took nothing dynamic: the base is the snapshot
        # (so too a later slice after a one-launch call, which read BASE = DRAINED_BASE: it
        # counts from the snapshot, which that call left where it was, and finds no item)
        base = state[SNAP]
    start, longest, latest = load_relaxed(state, START), load_relaxed(state, LONGEST), load_relaxed(state, LATEST)
    cursor, owed, repaid = load_relaxed(state, CURSOR), load_relaxed(state, OWED), load_relaxed(state, REPAID)
    n = 0 if first else load_relaxed(state, LAUNCH)
    before = 0 if first else load_relaxed(state, DONE)  # the call's items taken before this slice
    repair = 0 if first else load_relaxed(state, REPAIR)
    if repair > 0:  # a repair slice: no static items, owed items left unless REPAID reached REPAIR
        owed = repair - min(repaid, repair)
    else:  # a normal slice: its static items handed out, its late CTAs' ones owed
        cursor += cuda.gridDim.x
    done = min(cursor - base, num_items) - owed
    state[LAUNCH] = n + 1
    state[SHOT] = 0
    if first:
        state[BASE] = base
    state[START] = 0
    state[LONGEST] = 0
    state[LATEST] = 0
    state[EXITED] = 0
    state[CURSOR] = cursor
    state[SNAP] = cursor
    state[DONE] = done
    if owed == 0:
        state[REPAIR] = 0
        state[OWED] = 0
        state[REPAID] = 0
    elif repair == 0:  # owed from this slice: the next repairs them (REPAID is 0)
        state[REPAIR] = owed
    if flags & LAST and done < num_items:
        for j in range(counters.shape[0]):
            counters[j] = 0
        state[REPAIR] = 0
        state[OWED] = 0
        state[REPAID] = 0
    if n < MAX_LOGGED:
        at = LOG_WORDS * n
        log[at], log[at + 1], log[at + 2], log[at + 3], log[at + 4] = start, end, done - before, longest, latest


@cuda.jit
def reset_kernel(state, log, counters, item_counts):
    """Zero the queue state, the merge counters and the item counts (the log is read only
    up to the launch count, so it needs no clearing)."""
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    for j in range(i, state.shape[0], stride):
        state[j] = 0
    for j in range(i, counters.shape[0], stride):
        counters[j] = 0
    for j in range(i, item_counts.shape[0], stride):
        item_counts[j] = 0


_workspace = launcher.Workspace()  # its own: an abandoned call's counters never reach paged_decode's


def registers_keeping(ctas_per_sm: int) -> int:
    """The most registers a thread (a multiple of 8, the allocation unit, at most 255) that
    still let ``ctas_per_sm`` CTAs of ``THREADS`` threads share an SM's register file: 168
    for 3, 128 for 4, 255 for 1 or 2."""
    return min(launcher.UNCAPPED_REGISTERS, REGISTERS_PER_SM // (max(1, ctas_per_sm) * THREADS) // 8 * 8)


class PersistentDecode:
    """``paged_decode`` in slices of at most ``budget_us`` microseconds each (plus one item;
    an eager first slice: see ``DecodeOptions.eager_first``).

    Same arguments as ``DecodePlan`` (device arrays or CUDA tensors that keep their
    addresses; their contents may change between runs), plus ``budget_us``: a slice's time
    budget, a number in (0, 1e6] and at least the model's time of one item (else
    :class:`BudgetError`). ``count_items`` makes every slice count the items it takes
    (``stats().item_counts``). ``options.ctas_per_sm`` sets the slice grid (resident CTAs
    per SM; default: the compiled kernel's occupancy); ``options.dependent_launch`` makes the
    slices programmatic dependent launches (by default on sm_90+ with the raw launch path, as
    ``DecodePlan``'s decode).
    """

    def __init__(self, q, store, block_tables, seq_lens, tail_slots, budget_us, max_seq_len: int | None = None,
                 out=None, scale: float | None = None, options: DecodeOptions | None = None,
                 count_items: bool = False, workspace: launcher.Workspace | None = None):
        device_only(q=q, block_tables=block_tables, seq_lens=seq_lens, tail_slots=tail_slots, out=out)
        self.budget_us = checked_budget(budget_us)
        self.options = launcher.resolved_options(options)
        self._inputs = (q, store, block_tables, seq_lens, tail_slots)
        self._scale, self._max_seq_len, self._count = scale, max_seq_len, checked_count_items(count_items)
        self._workspace = launcher.checked_workspace(workspace, _workspace)
        launch, self.out = launcher.decode_launch(q, store, 0, block_tables, seq_lens, tail_slots, out, scale,
                                                  max_seq_len, self.options, self._workspace)
        self._mid_call = False  # True while this plan's state may hold a call left mid-way
        self._torch = next((a for a in (q, block_tables, seq_lens, tail_slots, self.out)
                            if type(a).__module__.startswith("torch")), None)
        self._layers: dict = {}
        self._first = FIRST | (EAGER if eager_first(self.options) else 0)  # a call's first slice
        self.resets = 0  # reset launches so far (after a call cut short, with count_items, or bare slices)
        self._log = cuda.to_device(np.zeros(LOG_WORDS * MAX_LOGGED, np.int64))
        self._counts = cuda.to_device(np.zeros(1, np.int32))
        self._sized, cap = self._size(launch, store)
        # a call whose eager first slice holds one CTA an item is that one launch (ONESHOT),
        # over the grid kernel's grid: (splits, KV heads * head groups, batch)
        self._oneshot = bool(self._first & EAGER) and self._sized[1] == self._sized[4]
        self._oneshot_kernel = self._one_launch_kernel(store, cap) if self._oneshot else None
        self._oneshot_grid = (self._sized[3], *launch.grid[1:])
        # the owed list (one word per CTA of the slice grid) and, for a one-launch plan, its
        # call's starts and ends (one word each per item: that call's grid is the items, ``_sized[1]``)
        records = 2 * self._sized[1] if self._oneshot else 0
        self._state = cuda.to_device(np.zeros(STATE_WORDS + self._sized[1] + records, np.int64))
        batch, num_q_heads, head_dim = self.out.shape
        heads = launch.grid[1] * batch  # merge counters: (sequence, KV head, head group)
        self._partials = self._workspace.get(batch * num_q_heads, self._sized[3], head_dim, heads)
        if self._count:
            self._counts = cuda.to_device(np.zeros(self.num_items, np.int32))

    def _size(self, launch, store):
        """((kernel, grid, split_blocks, splits, num_items), the kernel's register cap): the grid
        kernel's split choice, cut to items of at most ITEM_SHARE of the budget by the
        READ_BYTES_PER_US model, at the register cap of the grid launch
        (``launcher.register_cap``: uncapped where that launch fits one wave of the uncapped
        kernel: B=1, and FP16 only where that wave keeps its split count or leaves short items
        unsplit, ``ctas_per_sm`` unset; on the H200, thirty-first session, B=1 32/8 32k FP16 was
        1.062x the grid decode's time capped at 128 and 1.009x uncapped, and at B=64, items past
        one wave, 1.01-1.45x uncapped against 1.00-1.05x capped). Uncapped, the slice kernel
        takes more registers than the grid kernel (its own work: INT2 187 and FP16 188 at D=128
        G=4 against 156 / 166), two CTAs an SM against three; where its items then outnumber its
        resident CTAs it is compiled at ``registers_keeping`` the grid kernel's CTAs per SM
        instead (168 for three), so they fit one round as the grid launch's did (H100,
        fifty-first session: at B=1 128k INT2 59.5 -> 47.8 us, FP16 198.5 -> 190.7 us; where the
        items fit, at B=1 32k, the cap cost FP16 3.5% and INT4 and INT2 1.5-1.6%, so it is not
        taken there)."""
        o = self.options
        shape = self._shape(store)
        cap = launcher.register_cap(launch, shape, o)
        sized = self._fit(launch, store, shape, cap)
        if cap == launcher.UNCAPPED_REGISTERS and sized[4] > sized[1]:
            # the items would take two rounds where the grid launch took one wave: the slice
            # kernel's own work takes it past the grid kernel's registers and CTAs per SM
            cap = registers_keeping(launcher.launch_ctas_per_sm(launch, o))
            sized = self._fit(launch, store, shape, cap)
        return sized, cap

    def _shape(self, store) -> DecodeShape:
        """The decode shape of this plan's store and query heads."""
        cfg = store.config
        return DecodeShape(cfg.kv_dtype.bits, cfg.num_kv_heads, cfg.head_dim, cfg.block_size,
                           self.out.shape[1] // cfg.num_kv_heads, cfg.group_size)

    def _one_launch_kernel(self, store, cap):
        """The one-launch call's kernel (``oneshot_kernel``) at the slice kernel's register
        cap ``cap`` (``_size``; None: ``GRID_REGISTERS``), whose occupancy made the call one
        launch: it takes no more registers than the slice kernel, so its CTAs fit as theirs did."""
        o = self.options
        return oneshot_kernel(self._shape(store), GRID_REGISTERS if cap is None else cap, o.l2_prefetch,
                              o.joint_softmax, self._count, launcher.dependent_launches(o))

    def _fit(self, launch, store, shape, cap):
        """``_size`` at register cap ``cap``."""
        cfg, (splits, ys, batch), o = store.config, launch.grid, self.options
        kernel = persistent_kernel(shape, cap, o.l2_prefetch, o.joint_softmax, self._count, o.persistent_item,
                                   launcher.dependent_launches(o))
        split_blocks = launch.args[18]
        max_virtual = split_blocks * splits
        # (the state's size depends on the grid this sizes: the log, also int64 [n], stands in)
        probe = (*launch.args, self._log, self._log, self._counts, np.int64(1), np.int64(1), np.int64(0))
        resident = max(1, launcher.resident_slots(launcher.Launch(kernel, 1, THREADS, probe), o))
        block_us = cfg.block_bytes_per_layer / cfg.num_kv_heads * resident / READ_BYTES_PER_US
        one_item_us = (1 + o.split_overhead) * block_us
        if self.budget_us < one_item_us:
            raise BudgetError(f"budget_us: {self.budget_us} is below one work item (about {one_item_us:.3g} us for "
                              f"one block of {resident} CTAs sharing {READ_BYTES_PER_US / 1e6:g} TB/s)")
        fits = max(1, int(self.budget_us * ITEM_SHARE / block_us - o.split_overhead))
        if split_blocks > fits:
            split_blocks = fits
            splits = -(-max_virtual // split_blocks)
        return kernel, min(resident, splits * ys * batch), split_blocks, splits, splits * ys * batch

    @property
    def one_launch(self) -> bool:
        """Whether ``run`` and a one-slice ``enqueue`` are one launch that touches no slice
        state (``ONESHOT``): the first slice is eager and its grid is one CTA an item."""
        return self._oneshot

    @property
    def num_items(self) -> int:
        """Work items of one call: batch * KV heads * head groups * splits."""
        return self._sized[4]

    def launches(self, layer: int):
        """(reset, slice): the layer's prepared reset launch and its slice launch with no
        flags (a call's later slice), made on first use; ``run`` and ``enqueue`` use them and
        the same slice with other flags (``layer``: an int in ``[0, num_layers)``, numpy
        integers accepted). The reset comes as a :class:`PlanLaunch` (run it, read it; its
        setters would change the plan's own launch), the slice as a :class:`BareSlice`: run
        bare, it may stop with its call undrained, so its ``run`` marks the plan's state and
        merge counters as possibly mid-call, and the next call on either resets first."""
        layer = self._layer(layer)
        return PlanLaunch(self._prepared(layer)[0]), BareSlice(self._slice(layer, 0), self._mark_mid_call)

    def _layer(self, layer) -> int:
        """``layer`` checked (``arrays.checked_layer``) before a call changes any state."""
        if type(layer) is int and layer in self._layers:
            return layer
        return checked_layer(layer, self._inputs[1].config.num_layers)[0]

    def _prepared(self, layer: int):
        """(reset, {flags: slice}) of ``layer``: its reset launch and the slice launches made so far."""
        found = self._layers.get(layer)
        if found is None:
            q, store, tables, lens, slots = self._inputs
            launch, _ = launcher.decode_launch(q, store, layer, tables, lens, slots, self.out, self._scale,
                                               self._max_seq_len, self.options, self._workspace)
            kernel, grid, split_blocks, splits, items = self._sized
            args = list(launch.args)
            args[12:15] = self._partials
            args[18], args[19] = split_blocks, splits
            args += [self._state, self._log, self._counts, np.int64(round(self.budget_us * 1000)), np.int64(items)]
            words = max(self._partials[2].shape[0], self._counts.shape[0], self._state.shape[0])
            reset = launcher.Launch(reset_kernel, min(64, -(-words // 256)), 256,
                                    (self._state, self._log, args[14], self._counts))
            found = self._layers[layer] = (reset.prepare(self.options.launch_path), {},
                                           launcher.Launch(kernel, grid, THREADS, tuple(args)))
        return found

    def _slice(self, layer: int, flags: int):
        """The layer's prepared slice launch with ``flags``."""
        _, slices, launch = self._prepared(layer)
        if flags not in slices:
            kernel, grid = launch.kernel, launch.grid
            if flags & ONESHOT:
                kernel, grid = self._oneshot_kernel, self._oneshot_grid
            slices[flags] = launcher.prepare_decode(launcher.Launch(kernel, grid, launch.block,
                                                                    (*launch.args, np.int64(flags))), self.options)
        return slices[flags]

    def _start_call(self, layer: int, stream) -> None:
        """A reset launch first where one is needed: after this plan's call was cut short or
        its bare slices ran (``BareSlice``: its state may be mid-call), after another plan's
        did so on these merge counters (the workspace's record), and with ``count_items``
        (counts per call)."""
        counters = self._partials[2]
        if self._count or self._mid_call or self._workspace.is_mid_call(counters):
            self._prepared(layer)[0].run(stream)
            self._clear_mid_call()
            self.resets += 1

    def _mark_mid_call(self) -> None:
        """Mark this plan's state and its merge counters as possibly left mid-call."""
        self._mid_call = True
        self._workspace.mark_mid_call(self._partials[2])

    def _clear_mid_call(self) -> None:
        """Clear both marks: this plan's state and merge counters hold no call left mid-way
        (after a reset launch, or a call seen drained)."""
        self._mid_call = False
        self._workspace.clear_mid_call(self._partials[2])

    def enqueue(self, layer: int, slices: int, stream=None) -> None:
        """Enqueue ``slices`` slices (no host read: capture-safe). Whether they were enough
        shows in ``stats().drained``; the last one leaves the queue ready for the next call
        either way."""
        slices = as_int("slices", slices, 1, 1 << 20)
        layer = self._layer(layer)
        stream = resolve_stream(stream, self._torch)
        self._start_call(layer, stream)
        try:
            if slices == 1 and self._oneshot:
                self._slice(layer, self._first | ONESHOT | LAST).run(stream)
                return
            for i in range(slices):
                self._slice(layer, (self._first if i == 0 else 0) | (LAST if i == slices - 1 else 0)).run(stream)
        except BaseException:  # cut short between slices (a launch error, an interrupt): mid-call
            self._mark_mid_call()
            raise

    def run(self, layer: int, stream=None):
        """Decode ``layer`` into ``self.out``: slices until the queue is drained (reads the
        state back: synchronises with the stream; a one-launch call, ``one_launch``, reads
        nothing and waits for the stream). Returns ``self.out``."""
        layer = self._layer(layer)
        stream = resolve_stream(stream, self._torch)
        self._start_call(layer, stream)
        if self._oneshot:  # one launch, drained by construction: nothing to read back
            self._slice(layer, self._first | ONESHOT | LAST).run(stream)
            self._synchronize(stream)
            return self.out
        self._mark_mid_call()  # until the queue is seen drained
        self._slice(layer, self._first).run(stream)
        rest, items, launched, batch = self._slice(layer, 0), self.num_items, 1, 0
        while True:
            for _ in range(batch):
                rest.run(stream)
            launched += batch
            done = min(items, int(self._read(self._state, stream)[DONE]))
            if done >= items:
                break
            batch = min(64, max(1, math.ceil((items - done) * launched / max(done, 1))))  # at the rate so far
        self._clear_mid_call()
        return self.out

    def stats(self, stream=None) -> PersistentStats:
        """What the last ``run`` or ``enqueue`` did (reads the log back: synchronises)."""
        stream = resolve_stream(stream, self._torch)
        state = self._read(self._state, stream)
        launches = int(state[LAUNCH])
        if state[SHOT]:
            log = self._oneshot_log(state)
        else:
            log = self._read(self._log, stream).reshape(MAX_LOGGED, LOG_WORDS)[:min(launches, MAX_LOGGED)]
        done = np.cumsum(log[:, 2])
        spans = (log[:, 1] - log[:, 0]) / 1e3
        return PersistentStats(
            launches=launches, yields=int((done < self.num_items).sum()), items=self.num_items,
            items_per_launch=tuple(int(n) for n in log[:, 2]), launch_us=tuple(float(s) for s in spans),
            longest_launch_us=float(spans.max(initial=0)), longest_item_us=float(log[:, 3].max(initial=0)) / 1e3,
            latest_take_us=tuple(float(t) / 1e3 if n else 0.0 for t, n in zip(log[:, 4] - log[:, 0], log[:, 2])),
            budget_us=self.budget_us, drained=int(state[DONE]) >= self.num_items,
            item_counts=self._read(self._counts, stream)[:self.num_items] if self._count else None)

    def _oneshot_log(self, state):
        """A one-launch call's log row from its CTAs' records (``end_oneshot``): the first
        start, the last end, the items, the longest item, the latest start."""
        grid = self._sized[1]
        starts = state[STATE_WORDS + grid:STATE_WORDS + 2 * grid]
        ends = state[STATE_WORDS + 2 * grid:STATE_WORDS + 3 * grid]
        return np.array([[starts.min(), ends.max(), self.num_items, (ends - starts).max(), starts.max()]], np.int64)

    @staticmethod
    def _synchronize(stream):
        """Wait for ``stream``: ``run``'s contract where it reads nothing back."""
        if not SIMULATOR:
            (stream.numba if stream.numba != 0 else cuda.default_stream()).synchronize()

    @staticmethod
    def _read(array, stream):
        host = array.copy_to_host(stream=stream.numba) if not SIMULATOR else array.copy_to_host()
        if not SIMULATOR and stream.numba != 0:
            stream.numba.synchronize()
        return host


class PlanLaunch:
    """A prepared launch that a plan owns and its own calls run, as
    ``PersistentDecode.launches`` hands it out (the reset launch): ``run(stream)`` and what
    the launch tells (``READABLE``: ``dependent``, ``grid``, ``block``, ``cluster``,
    ``as_launch()``...), nothing else: its setters (``set_scalar``, ``set_array``,
    ``rebind``) would change the launch under the plan's own calls (a slice's
    ``split_blocks`` set to 3 gave a relative L2 error of 968 on the simulator).
    ``as_launch()`` gives its kernel and arguments to prepare a copy of one's own."""

    READABLE = frozenset({"dependent", "grid", "block", "cluster", "name", "as_launch", "matches",
                          "max_active_clusters"})

    def __init__(self, launch):
        self._launch = launch

    def run(self, stream=0) -> None:
        """Enqueue the launch on ``stream`` (the prepared launch's ``run``)."""
        self._launch.run(stream)

    def __getattr__(self, name):
        if name not in PlanLaunch.READABLE:
            raise AttributeError(f"{name}: a plan's own launch is not to be changed (its calls run it), only run "
                                 f"or read ({', '.join(sorted(PlanLaunch.READABLE))}); prepare a copy from "
                                 f"as_launch() instead")
        return getattr(self._launch, name)


class BareSlice(PlanLaunch):
    """A plan's later-slice launch as ``PersistentDecode.launches`` hands it out, for a
    caller that drives the slices itself (after the reset launch). ``run(stream)`` enqueues
    it and marks the plan's state and merge counters as possibly mid-call (the slice may
    stop with its call undrained, which no plan can see), so the plan's next ``run`` or
    ``enqueue``, and the next call of any plan on those counters, resets first, and
    ``paged_decode`` or a ``DecodePlan`` on the workspace zeroes them first. So another
    launch on the workspace between two bare slices abandons their call. A graph that
    captures bare slices marks nothing when replayed: run the reset launch before the next
    call. Other attributes as :class:`PlanLaunch`'s."""

    def __init__(self, launch, mark_mid_call):
        super().__init__(launch)
        self._mark_mid_call = mark_mid_call

    def run(self, stream=0) -> None:
        """Enqueue the slice on ``stream`` (the prepared launch's ``run``); marks the plan."""
        self._mark_mid_call()
        self._launch.run(stream)


def persistent_decode(q, store, layer: int, block_tables, seq_lens, tail_slots, budget_us, out=None,
                      scale: float | None = None, max_seq_len: int | None = None, stream=None,
                      options: DecodeOptions | None = None, count_items: bool = False):
    """``paged_decode`` in launches of at most ``budget_us`` microseconds (plus one work item;
    an eager first slice: see ``DecodeOptions.eager_first``);
    returns ``(out, PersistentStats)``. Host arrays are checked and copied once, as by
    ``paged_decode``; device arrays are trusted (the kernel clamps bad ids, see kernel.py).

    Parameters are ``paged_decode``'s (``q`` float16 ``[B, num_q_heads, head_dim]``,
    ``block_tables`` int32 ``[B, max_blocks]``, ``seq_lens`` and ``tail_slots`` int32 ``[B]``,
    ``out`` float16 like ``q``), plus ``budget_us``: each launch's time budget (a number in
    (0, 1e6], at least one item's time, else :class:`BudgetError`) and ``count_items`` (see
    :class:`PersistentStats`). Synchronises with the stream (it reads the queue cursor).
    """
    checked_budget(budget_us)
    checked_count_items(count_items)
    options = launcher.resolved_options(options)
    launcher.decode_launch(q, store, layer, block_tables, seq_lens, tail_slots, out, scale, max_seq_len, options,
                           _workspace)  # host arrays are range-checked here, before they are copied
    if isinstance(seq_lens, np.ndarray) and max_seq_len is None:
        max_seq_len = int(seq_lens.max(initial=0))
    q, block_tables, seq_lens, tail_slots = (cuda.to_device(np.ascontiguousarray(a)) if isinstance(a, np.ndarray)
                                             else a for a in (q, block_tables, seq_lens, tail_slots))
    plan = PersistentDecode(q, store, block_tables, seq_lens, tail_slots, budget_us, max_seq_len, out, scale,
                            options, count_items)
    plan.run(layer, stream)
    return plan.out, plan.stats(stream)


def eager_first(options: DecodeOptions) -> bool:
    """Whether a call's first slice is eager: ``options.eager_first``, or where None, on a
    GPU with the slice grid at the kernel's occupancy (``ctas_per_sm`` unset), so that its
    CTAs are resident together and none starts late unless another stream holds SMs."""
    if options.eager_first is not None:
        return options.eager_first
    return not SIMULATOR and options.ctas_per_sm is None


def checked_budget(budget_us) -> float:
    """``budget_us`` as a float in (0, MAX_BUDGET_US], else BudgetError naming the value."""
    value = real_value(budget_us)
    if not (math.isfinite(value) and 0 < value <= MAX_BUDGET_US):
        raise BudgetError(f"budget_us: expected a number of microseconds in (0, {MAX_BUDGET_US:g}], got "
                          f"{shown(budget_us)}")
    return value


def checked_count_items(count_items) -> bool:
    """``count_items`` as a bool (numpy's accepted), else HexcoreInvalidArgumentError naming it."""
    if not isinstance(count_items, (bool, np.bool_)):
        raise HexcoreInvalidArgumentError(f"count_items: expected a bool, got {shown(count_items)}")
    return bool(count_items)
