"""Compile hexcore's kernels to PTX and SASS on a CPU machine: loads, local memory, registers.

    python -m benchmarks.ptx_report [--sass]

Needs numba-cuda's NVVM (``numba-cuda[cu13]``) and, for registers and SASS, ptxas and
cuobjdump on PATH. No GPU is used: the compute capability is fixed at 9.0 (H100/H200).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import types as pytypes

os.environ["NUMBA_ENABLE_CUDASIM"] = "0"

import numba.cuda.dispatcher as _dispatcher
from numba import cuda, types

# device functions ask the current device for its compute capability; there is none here
_dispatcher.get_current_device = lambda: pytypes.SimpleNamespace(compute_capability=(9, 0))

from hexcore.cuda.attention import decode_kernel

U32, I32, I64, F32 = types.uint32[::1], types.int32[::1], types.int64, types.float32
DECODE_SIG = (U32, I64, I64, I64, I64, I64, I64, U32, types.int32[:, ::1], I32, I32, types.float32[:, :, ::1],
              types.float32[:, :, ::1], I64, I64, I64, I64, F32)


def ptx_of(kernel, sig) -> str:
    from hexcore.cuda.attention import KERNEL_OPTIONS

    ptx, _ = cuda.compile_ptx(kernel.py_func, sig, cc=(9, 0), **KERNEL_OPTIONS)
    return ptx


def ptxas(ptx: str, sass: bool = False) -> str:
    """ptxas -v resource usage (and SASS LDG widths when ``sass``) for one PTX module."""
    if not shutil.which("ptxas"):
        return "ptxas not found"
    with tempfile.TemporaryDirectory() as tmp:
        src, obj = os.path.join(tmp, "k.ptx"), os.path.join(tmp, "k.cubin")
        with open(src, "w") as f:  # this NVVM may be newer than ptxas: claim the PTX ISA ptxas knows
            f.write(re.sub(r"^\.version .*$", ".version 9.0", ptx, flags=re.MULTILINE))
        res = subprocess.run(["ptxas", "-arch=sm_90", "-O3", "-v", src, "-o", obj], capture_output=True, text=True)
        info = " ".join(l.split("info    : ")[-1] for l in res.stderr.splitlines() if "Used" in l or "spill" in l)
        if sass and res.returncode == 0 and shutil.which("cuobjdump"):
            dump = subprocess.run(["cuobjdump", "--dump-sass", obj], capture_output=True, text=True).stdout
            loads = sorted(set(re.findall(r"LDG\.E[.\w]*", dump)))
            info += f" | SASS loads: {', '.join(loads)}"
        return info if res.returncode == 0 else res.stderr[-500:]


def report(sass: bool = False) -> None:
    for bits in (16, 4, 2):
        for head_dim, block_size, group in ((128, 32, 1), (128, 32, 4), (128, 16, 8), (64, 32, 1)):
            from hexcore.cuda.attention_tc import supported

            ptx = ptx_of(decode_kernel(bits, 8, head_dim, block_size, group, 64), DECODE_SIG)
            family = "tensor cores" if supported(bits, head_dim, block_size, group) else "CUDA cores"
            print(f"decode bits={bits:2} D={head_dim} BS={block_size} G={group} ({family}): "
                  f"mma {ptx.count('mma.sync')}, "
                  f"v4 loads {ptx.count('ld.global.v4')}, v2 {ptx.count('ld.global.v2')}, "
                  f"local {ptx.count('.local')}, cvt.s64 {ptx.count('cvt.rn.f32.s64')} | {ptxas(ptx, sass)}",
                  flush=True)


if __name__ == "__main__":
    report(sass="--sass" in sys.argv)
