"""Thirty-second session (CPU): the INT4 grid decode kernel and the persistent slice kernel,
both uncapped, through ptxas to SASS in /tmp/sassdump (BITS as argv[1]):

    PATH=<cu13 bin>:$PATH PYTHONPATH=. python benchmarks/experiments/2026-12-04-s32/cmp_loops.py 4
"""
import sys
from benchmarks.ptx_report import *  # noqa
from benchmarks.ptx_report import ptxas, DECODE_SIG, PERSISTENT_SIG
from hexcore.cuda.attention.persistent import persistent_kernel
from hexcore.cuda.attention.kernel import decode_kernel
from hexcore.cuda.attention.shape import DecodeShape
from numba import cuda
bits = int(sys.argv[1])
shape = DecodeShape(bits, 8, 128, 32, 4, 64)
g = decode_kernel(shape, 255, "none", True, verify=False, dependent=True).py_func
p = persistent_kernel.__wrapped__(shape, 255, "none", True, False, "inline", True).py_func
for name, k, sig in (("grid", g, DECODE_SIG), ("slice", p, PERSISTENT_SIG)):
    ptx, _ = cuda.compile_ptx(k, sig, cc=(9, 0))
    print(name, ptxas(ptx, True, "/tmp/sassdump", f"{name}{bits}", cap=255), flush=True)
