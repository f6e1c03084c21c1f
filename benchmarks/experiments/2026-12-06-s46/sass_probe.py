"""Issue 19, on the CPU: where each kernel of ``one_probe.py`` keeps the INT2 item's hot loop
(its first and last address, its size, its branches out and back) and how big the kernel
is, sm_90, D 128, block 32,
group 4 (ptxas and cuobjdump on PATH, as ``benchmarks.ptx_report`` wants them):

    PYTHONPATH=.:benchmarks/experiments/2026-12-06-s46 python3 benchmarks/experiments/2026-12-06-s46/sass_probe.py
"""
from benchmarks.ptx_report import DECODE_SIG, I32, ONE_LAUNCH_SIG, ptxas  # first: no GPU needed after it
import os
import re
import tempfile

from numba import cuda

from benchmarks.sass_loop import hot_loop
from hexcore.cuda.attention.kernel import decode_kernel
from hexcore.cuda.attention.shape import DecodeShape
from hexcore.cuda.attention.tiered_kernels import one_launch_kernel, pool_kernel
from one_probe import one_item_kernel

BRANCH = re.compile(r"/\*([0-9a-f]{4,6})\*/\s+(?:@!?U?P\w+\s+)?BRA(?:\.\w+)*\s+(?:\w+,\s*)?(0x[0-9a-f]+)")
INT2, INT4, FP16 = (DecodeShape(bits, 8, 128, 32, 4, 64) for bits in (2, 4, 16))
KERNELS = {  # name: (kernel, signature, register cap given to ptxas)
    "INT2 partials kernel, uncapped": (decode_kernel(INT2, 255, partials=True, dependent=True), DECODE_SIG, 255),
    "INT2 pool kernel merging (last), uncapped": (pool_kernel(INT2, 255, "none", True, True, False, True),
                                                  DECODE_SIG + (I32,), 255),
    "one launch int2-aged, cap 168": (one_launch_kernel((INT2, FP16, INT4), 168, "none", True, True),
                                      ONE_LAUNCH_SIG, 168),
    "one launch, two INT2 items, cap 168": (one_launch_kernel((INT2, INT2), 168, "none", True, True),
                                            ONE_LAUNCH_SIG, 168),
    "one launch, three INT2 items, cap 168": (one_launch_kernel((INT2, INT2, INT2), 168, "none", True, True),
                                              ONE_LAUNCH_SIG, 168),
    "one INT2 item, ring passed in, cap 168": (one_item_kernel(INT2, 168, dependent=True), DECODE_SIG + (I32,), 168),
    "one INT2 item, ring passed in, uncapped": (one_item_kernel(INT2, None, dependent=True), DECODE_SIG + (I32,),
                                                255),
}



def far_branches(sass: str) -> str:
    """The hot loop's branches to code outside it and the branches from outside back into it
    (address -> target, hex)."""
    loop = hot_loop(sass)
    inside = lambda a: loop.start <= a <= loop.end  # noqa: E731
    out, back = [], []
    for line in sass.splitlines():  # every branch, predicated or not (sass_loop's loops take the former)
        m = BRANCH.search(line)
        address, target = (int(m.group(1), 16), int(m.group(2), 16)) if m else (0, 0)
        if m and inside(address) != inside(target):
            (out if inside(address) else back).append(f"{address:x}->{target:x}")
    return f"out of the loop: {', '.join(out) or 'none'}; back in: {', '.join(back) or 'none'}"


with tempfile.TemporaryDirectory() as tmp:
    for i, (name, (kernel, sig, cap)) in enumerate(KERNELS.items()):
        ptx, _ = cuda.compile_ptx(kernel.py_func, sig, cc=(9, 0))
        print(f"{name}: {ptxas(ptx, sass=True, cap=cap, dump=tmp, name=f'k{i}')}", flush=True)
        with open(os.path.join(tmp, f"k{i}.sass")) as f:
            print(f"    {far_branches(f.read())}", flush=True)
