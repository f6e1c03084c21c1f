"""Issue 17 diagnostic: where the persistent kernel's extra time at B=1 goes.
python .gpurun/s19diag.py VARIANT DTYPES  (variants: main nocas nobegin endlight bare)
Compiles first, then takes a file lock for the timing so parallel processes do not overlap."""
import fcntl, json, sys, time
import numpy as np
from numba import cuda
from benchmarks.bench_persistent import case
from benchmarks.gpu_common import time_gpu
from hexcore.cuda import DecodePlan
from hexcore.cuda.attention import persistent as P
from hexcore.cuda.attention.persistent import START, EXITED, LONGEST, LATEST, SNAP, BASE, REPAIR, MAX_BUDGET_US
from hexcore.cuda.device import add_acq_rel
from hexcore.cuda.timer import global_timer_ns

variant, dtypes = sys.argv[1], sys.argv[2].split(",")
orig_begin, orig_end, orig_close = P.begin_slice, P.end_slice, P.close_slice

@cuda.jit(device=True)
def begin_nocas(state, s, budget_ns, num_items, flags):
    now = global_timer_ns()
    first = flags & 1
    snap = state[SNAP]
    base = snap if first else state[BASE]
    s[0] = s[2] = now
    s[1] = now
    s[3] = s[4] = s[5] = 0
    s[6] = -1
    s[9] = base
    grid = cuda.gridDim.x
    s[7] = base - grid
    s[8] = 0 if snap + grid - base < num_items else -1
    i = snap - base + cuda.blockIdx.x
    if i < num_items:
        s[6] = i
        s[4] = 1
        s[5] = now

@cuda.jit(device=True)
def begin_none(state, s, budget_ns, num_items, flags):
    now = global_timer_ns()
    s[0] = s[1] = s[2] = now
    s[3] = s[4] = s[5] = 0
    s[9] = 0
    s[7] = -cuda.gridDim.x
    s[8] = -1
    i = cuda.blockIdx.x
    s[6] = -1
    if i < num_items:
        s[6] = i
        s[4] = 1
        s[5] = now

@cuda.jit(device=True)
def end_light(state, log, counters, longest, latest, taken, num_items, base, flags):
    if cuda.atomic.add(state, EXITED, 1) == cuda.gridDim.x - 1:
        orig_close(state, log, counters, num_items, base, flags)

@cuda.jit(device=True)
def end_none(state, log, counters, longest, latest, taken, num_items, base, flags):
    pass

def prewarm_kernel(shape, max_registers=None, l2_prefetch="none", joint_softmax=True, count_items=False,
                   item_call="inline"):
    # persistent_kernel's inline kernel, plus: while thread 0 waits for begin_slice's round trip,
    # warp 1 of a FIRST slice reads its static item's first 8 table entries and asks L2 for
    # those blocks (prefetch_block's regions): the item's start then hits L1/L2
    from hexcore.cuda.attention.kernel import GRID_REGISTERS, decode_item_function, in_range
    from hexcore.cuda.device import prefetch_l2, shfl_idx_int
    from hexcore.cuda.device_layout import code_offset, key_meta_offset, value_meta_offset
    decode_item = decode_item_function.__wrapped__(shape, l2_prefetch, joint_softmax, volatile_tid=True)
    HG, YS = shape.head_groups, shape.H * shape.head_groups
    H, D, BS, NG = shape.H, shape.D, shape.BS, shape.num_groups
    RW, QUANTIZED = shape.D * shape.bits // 32, shape.quantized
    RUN_BYTES, KMB, VMB = BS * RW * 4, 4 * D, 4 * BS * NG
    begin_slice, next_item, end_slice, as_global, index = P.begin_slice, P.next_item, P.end_slice, P.as_global, P.index
    options = {} if P.SIMULATOR else {"max_registers": GRID_REGISTERS}

    @cuda.jit(device=True)
    def prewarm(pool, k_codes, v_codes, k_meta, v_meta, block_tables, layer, num_blocks, split_blocks, max_splits,
                item, lane):
        split, rest = item % max_splits, item // max_splits
        y, b = rest % YS, rest // YS
        h = y // HG
        j = lane // 4
        vb = split * split_blocks + j
        if j < split_blocks and vb < block_tables.shape[1]:
            block = block_tables[b, vb]
            if in_range(block, num_blocks):
                r = lane % 4
                if r < 2:
                    run = code_offset(layer, block, h, 0, num_blocks, H, BS, RW * 4) // 4
                    prefetch_l2(pool, (k_codes if r == 0 else v_codes) + run, RUN_BYTES)
                elif r == 2 and QUANTIZED:
                    prefetch_l2(pool, k_meta + key_meta_offset(layer, block, h, num_blocks, H, D) // 4, KMB)
                elif r == 3 and QUANTIZED:
                    prefetch_l2(pool, v_meta + value_meta_offset(layer, block, h, 0, num_blocks, H, BS, NG) // 4, VMB)

    @cuda.jit(device=True)
    def run_item(pool, k_codes, v_codes, k_meta, v_meta, k_tails, v_tails, q, block_tables, seq_lens, tail_slots,
                 out, part_o, part_ml, counters, layer, num_blocks, max_seqs, split_blocks, max_splits, scale, item):
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
        tid = cuda.threadIdx.x
        s = cuda.shared.array(10, np.int64)
        if tid == 0:
            begin_slice(state, s, budget_ns, num_items, flags)
        elif tid >= 32 and tid < 64 and flags & 1 and cuda.blockIdx.x < num_items:
            prewarm(pool, k_codes, v_codes, k_meta, v_meta, block_tables, layer, num_blocks, split_blocks,
                    max_splits, cuda.blockIdx.x, tid - 32)
        cuda.syncthreads()
        while True:
            item = s[6]
            if item < 0:
                break
            run_item(pool, k_codes, v_codes, k_meta, v_meta, k_tails, v_tails, q, block_tables, seq_lens,
                     tail_slots, out, part_o, part_ml, counters, layer, num_blocks, max_seqs, split_blocks,
                     max_splits, scale, item)
            cuda.syncthreads()
            if tid == 0:
                next_item(state, s, budget_ns, num_items)
            cuda.syncthreads()
        if tid == 0:
            end_slice(state, log, counters, s[3], s[5], s[4], num_items, s[9], flags)

    return kernel


begin, end = {"main": (orig_begin, orig_end), "nocas": (begin_nocas, orig_end), "nobegin": (begin_none, orig_end),
              "endlight": (orig_begin, end_light), "bare": (begin_none, end_none),
              "prewarm": (orig_begin, orig_end)}[variant]
P.begin_slice, P.end_slice = begin, end
P.persistent_kernel.cache_clear()
if variant == "prewarm":
    P.persistent_kernel = prewarm_kernel

import os
SHAPES = [(1, 8, 2, 256)] if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" else [(1, 32, 8, 32768), (64, 32, 8, 4096), (1, 32, 8, 131072)]
cases = []
import atexit
atexit.register(lambda: open(f"/tmp/s19ready-{variant}", "w").close())  # a failed set-up releases the others
for dtype in dtypes:
    for shape in SHAPES:
        store, q, tables, lens, slots = case(dtype, *shape)
        plan = DecodePlan(q, store, tables, lens, slots, max_seq_len=shape[3])
        whole = P.PersistentDecode(q, store, tables, lens, slots, MAX_BUDGET_US, max_seq_len=shape[3])
        plan.run(0); whole.enqueue(0, 1); cuda.synchronize()
        a, b = plan.out.copy_to_host().astype(np.float32), whole.out.copy_to_host().astype(np.float32)
        cases.append((dtype, shape, plan, whole, float(np.abs(a - b).max()), whole.num_items))
open(f"/tmp/s19ready-{variant}", "w").close()
import glob
t_wait = time.time()
while len(glob.glob("/tmp/s19ready-*")) < int(os.environ.get("S19_PROCS", "1")) and time.time() - t_wait < 150:
    time.sleep(0.5)  # every process set up before any times (no launches of theirs in its timing)
lock = open("/tmp/s19diag.lock", "w")
fcntl.flock(lock, fcntl.LOCK_EX)
for dtype, shape, plan, whole, diff, items in cases:
    tp, tw = [], []
    for _ in range(3):
        tp.append(time_gpu(lambda: plan.run(0), repeats=10))
        tw.append(time_gpu(lambda: whole.enqueue(0, 1), repeats=10))
    tp, tw = min(tp), min(tw)
    print(json.dumps(dict(variant=variant, dtype=dtype, shape=shape, items=items, paged_us=tp * 1e6,
                          persistent_us=tw * 1e6, extra_us=(tw - tp) * 1e6, ratio=tw / tp, max_diff=diff)), flush=True)
fcntl.flock(lock, fcntl.LOCK_UN)
