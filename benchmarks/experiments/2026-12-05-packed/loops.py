"""Loops holding mma (HMMA) in the SASS of a format by age's one-launch kernel, "one" or
"packed", at a register cap: per backward branch its span, instructions, HMMA, spill loads
(LDL) and stores (STL), as ``benchmarks/sass_loop.py`` finds them, after ptxas's summary.
Thirty-sixth session, CPU only (numba-cuda's NVVM, ptxas and cuobjdump for sm_90 on PATH):

    PYTHONPATH=. python benchmarks/experiments/2026-12-05-packed/loops.py int2-aged 2,16,4 128 1

Arguments: a name, the pools' bits in slot order (the last pool first), the cap, 1 for
packed. D128, block 32, G4, group 64; SASS dumps land in /tmp/sassd.
"""
import os
import sys
from collections import Counter
from benchmarks.ptx_report import ONE_LAUNCH_SIG, ptxas, cuda, DecodeShape
from benchmarks.sass_loop import instructions
from hexcore.cuda.attention.tiered_kernels import one_launch_kernel
os.makedirs("/tmp/sassd", exist_ok=True)
name, bits = sys.argv[1], tuple(int(b) for b in sys.argv[2].split(","))
cap, packed = int(sys.argv[3]), sys.argv[4] == "1"
pools = tuple(DecodeShape(b, 8, 128, 32, 4, 64) for b in bits)
k = one_launch_kernel(pools, cap, "none", True, True, packed=packed)
ptx, _ = cuda.compile_ptx(k.py_func, ONE_LAUNCH_SIG, cc=(9, 0))
tag = f"{name}-{cap}-{int(packed)}"
print(ptxas(ptx, sass=True, cap=cap, dump="/tmp/sassd", name=tag))
insts = instructions(open(f"/tmp/sassd/{tag}.sass").read())
# loops with HMMA: innermost (no other HMMA loop strictly inside)
loops = []
for address, _, target in insts:
    if target is None or target >= address: continue
    body = [op for a, op, _ in insts if target <= a <= address]
    c = Counter(body)
    if c["HMMA"]:
        loops.append((target, address, len(body), c["HMMA"], c["LDL"], c["STL"]))
for lo in sorted(loops):
    print("loop 0x%x..0x%x size %d HMMA %d LDL %d STL %d" % lo)
