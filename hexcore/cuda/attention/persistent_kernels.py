"""The persistent decode's kernels and protocol: the slice kernel (``persistent_kernel``),
the one-launch call's kernel (``oneshot_kernel``), the reset kernel and the device functions
of the slice protocol over the ``state`` words. The host side (sizing, launching, stats) is
``persistent.py``.

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
  Where that eager slice's grid is one CTA an item, or the host's item model puts the whole
  call within a quarter of its budget (a wide call, ``DecodeOptions.wide_one_launch``),
  ``run`` and a one-slice ``enqueue`` are one launch (``ONESHOT``): its outcome is known
  (every item runs), so it runs a kernel of its own (``oneshot_kernel``: the grid kernel's
  grid and item, no loop) that skips the slice's state altogether and stores its clock
  readings in records per item.
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

See docs/persistent.md for the state words and the memory-model argument.
"""

from __future__ import annotations

import functools

from numba import cuda, int32, int64

from ..device import SIMULATOR, add_acq_rel, allow_dependent_grids, load_relaxed, shfl_idx_int, wait_prior_grids
from ..timer import global_timer_ns
from .kernel import GRID_REGISTERS, decode_item_function
from .shape import DecodeShape

# state: int64 [STATE_WORDS + 3 * n], n the slice grid, or the items where a call is one
# launch (``ONESHOT``): the words, then the owed list (one word per CTA of the slice grid),
# then, from ``STATE_WORDS + items``, a one-launch call's starts and ends, one word each per
# item; the protocol and who writes what: docs/persistent.md
CURSOR, LAUNCH, START, EXITED, LONGEST, LATEST, DONE, BASE, SNAP, REPAIR, OWED, REPAID, SHOT = range(13)
STATE_WORDS = 13
# a slice's flags: the first of a call; the last of a fixed number (enqueue); with FIRST, its
# CTAs start their static items before they know the slice's start (``DecodeOptions.eager_first``);
# ONESHOT: the call's only launch (``oneshot_kernel``, one CTA an item: an eager first slice
# whose grid holds every item, or a wide call)
FIRST, LAST, EAGER, ONESHOT = 1, 2, 4, 8
# BASE after a one-launch call: a later slice of the call (a bare ``launches`` slice) finds no item
DRAINED_BASE = -(1 << 62)
# log: int64 [MAX_LOGGED, LOG_WORDS]: per slice its start, end, items, longest item and the
# latest time an item was taken (all %globaltimer ns)
LOG_WORDS = 5
MAX_LOGGED = 1 << 15  # slices logged per call; later ones are counted only


@functools.cache
def persistent_kernel(shape: DecodeShape, max_registers: int | None = None, l2_prefetch: str = "none",
                      joint_softmax: bool = True, count_items: bool = False, item_call: str = "inline",
                      dependent: bool = False):
    """The slice kernel of ``shape``: the decode kernel's arguments, then ``state`` int64
    ``[STATE_WORDS + 3 * n]`` (n: the grid, or the items of a plan whose calls are one launch), ``log`` int64 ``[MAX_LOGGED * LOG_WORDS]``, ``item_counts`` int32 (``[items]``
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
    # a later slice of a one-launch call (BASE DRAINED_BASE): the call's items were all taken,
    # though its grid, the slice grid, may be fewer (a wide call): DONE stays the items
    after_one_launch = base == DRAINED_BASE
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
    done = num_items if after_one_launch else min(cursor - base, num_items) - owed
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
