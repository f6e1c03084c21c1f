import sys
from benchmarks.ptx_report import ptxas, PERSISTENT_SIG, cuda, DecodeShape
from numba import int64
from hexcore.cuda.attention.kernel import decode_item_function
from hexcore.cuda.attention.persistent import end_oneshot, linear_block
from hexcore.cuda.timer import global_timer_ns
from hexcore.cuda.device import wait_prior_grids, allow_dependent_grids
variant = sys.argv[1]; bits = int(sys.argv[2])
shape = DecodeShape(bits, 8, 128, 32, 4, 64)
decode_item = decode_item_function(shape, "none", True)
HG = shape.head_groups
V = variant
def kernel(pool, k_codes, v_codes, k_meta, v_meta, k_tails, v_tails, q, block_tables, seq_lens, tail_slots, out,
           part_o, part_ml, counters, layer, num_blocks, max_seqs, split_blocks, max_splits, scale, state, log,
           item_counts, budget_ns, num_items, flags):
    wait_prior_grids()
    start = cuda.shared.array(1, int64)
    if V != "nostart":
        if cuda.threadIdx.x == 0:
            start[0] = global_timer_ns()
    decode_item(pool, k_codes, v_codes, k_meta, v_meta, k_tails, v_tails, q, block_tables, seq_lens, tail_slots,
                out, part_o, part_ml, counters, layer, num_blocks, max_seqs, split_blocks, max_splits, scale,
                cuda.blockIdx.x, cuda.blockIdx.y // HG, cuda.blockIdx.y % HG, cuda.blockIdx.z)
    if V != "noend":
        cuda.syncthreads()
        if cuda.threadIdx.x == 0:
            if V == "nolog":
                n = cuda.gridDim.x * cuda.gridDim.y * cuda.gridDim.z
                j = linear_block()
                state[13 + n + j] = start[0]
                state[13 + 2 * n + j] = global_timer_ns()
                if j == 0:
                    state[0] = n
            else:
                end_oneshot(state, log, start[0], global_timer_ns(), linear_block(), num_items)
    allow_dependent_grids()
ptx, _ = cuda.compile_ptx(kernel, PERSISTENT_SIG, cc=(9, 0))
print(V, bits, ptxas(ptx, cap=128).split(" | ")[0], flush=True)
import os
os.makedirs("/tmp/dumps", exist_ok=True)
loops=[]
print(ptxas(ptx, sass=True, dump="/tmp/dumps", name=f"{V}{bits}", cap=128, loops=loops))
from benchmarks.sass_loop import instructions
ins = instructions(open(f"/tmp/dumps/{V}{bits}.sass").read())
lo, hi = loops[0].start, loops[0].end
print("LDL/STL in loop:", [(hex(a), op) for a, op, *_ in ins if lo <= a <= hi and op.startswith(("LDL", "STL"))])
print("all LDL/STL:", [(hex(a), op) for a, op, *_ in ins if op.startswith(("LDL", "STL"))])
