"""Loops holding mma (HMMA) in the SASS of the one-launch kernels and of the pool kernels
they are made of, at a register cap: (start, instructions, HMMA, spill loads LDL, spill
stores STL) per backward branch, as ``benchmarks/sass_loop.py`` finds them. Thirty-third
session, CPU only (numba-cuda's NVVM, ptxas and cuobjdump for sm_90 on PATH):

    PYTHONPATH=. python benchmarks/experiments/2026-12-04-s33/loops.py 128

SASS dumps land in /tmp/sass.
"""
import os
import sys

from benchmarks.ptx_report import ptxas, DECODE_SIG, ONE_LAUNCH_SIG, I32
from benchmarks.sass_loop import instructions
from numba import cuda
from hexcore.cuda.attention.shape import DecodeShape
from hexcore.cuda.attention.tiered_kernels import one_launch_kernel, pool_kernel
os.makedirs("/tmp/sass", exist_ok=True)
def loops(path):
    insts = instructions(open(path).read())
    out = []
    for address, _, target in insts:
        if target is None or target >= address: continue
        body = [op for a, op, _ in insts if target <= a <= address]
        if "HMMA" in body:
            out.append((hex(target), len(body), body.count("HMMA"), body.count("LDL"), body.count("STL")))
    return out
cap = int(sys.argv[1])
S = lambda b: DecodeShape(b, 8, 128, 32, 4, 64)
for name, k, sig in (("one2", one_launch_kernel((S(2), S(16), S(4)), cap, "none", True, True), ONE_LAUNCH_SIG),
                     ("one4", one_launch_kernel((S(4), S(16)), cap, "none", True, True), ONE_LAUNCH_SIG),
                     ("pool2", pool_kernel(S(2), cap, "none", True, True, False, True), DECODE_SIG + (I32,)),
                     ("pool4", pool_kernel(S(4), cap, "none", True, True, False, True), DECODE_SIG + (I32,)),
                     ("pool16", pool_kernel(S(16), cap, "none", True, True, True, False), DECODE_SIG + (I32,))):
    ptx, _ = cuda.compile_ptx(k.py_func, sig, cc=(9, 0))
    ptxas(ptx, sass=True, dump="/tmp/sass", name=f"{name}_{cap}", cap=cap)
    print(name, cap, "(start, size, HMMA, LDL, STL):", loops(f"/tmp/sass/{name}_{cap}.sass"), flush=True)
