"""Compile grid and persistent decode kernels to PTX/cubin/SASS. Usage:
   PYTHONPATH=<tree> python compile.py OUTDIR [cap_persistent] [kinds...]"""
import os, re, subprocess, sys, types as pytypes
os.environ["NUMBA_ENABLE_CUDASIM"] = "0"
import numba.cuda.dispatcher as _d
_d.get_current_device = lambda: pytypes.SimpleNamespace(compute_capability=(9, 0))
from numba import cuda, types
import hexcore
from hexcore.cuda.attention.kernel import decode_kernel
from hexcore.cuda.attention import persistent as P
from hexcore.cuda.attention.shape import DecodeShape
U32, I32, I64, F32 = types.uint32[::1], types.int32[::1], types.int64, types.float32[::1]
DECODE_SIG = (U32, I64, I64, I64, I64, I64, I64, U32, types.int32[:, ::1], I32, I32, types.float16[::1], F32, F32,
              I32, I64, I64, I64, I64, I64, types.float32)
PSIG = DECODE_SIG + (types.int64[::1], types.int64[::1], I32, I64, I64, I64)
out = sys.argv[1]; os.makedirs(out, exist_ok=True)
cap = int(sys.argv[2]) if len(sys.argv) > 2 else 128
kinds = sys.argv[3].split(",") if len(sys.argv) > 3 else ["grid", "pers"]
shapes = [tuple(int(x) for x in t.split("/")) for t in sys.argv[4].split(",")] if len(sys.argv) > 4 else [(16, 4), (4, 4), (16, 1), (4, 1)]
print("hexcore from", hexcore.__file__)
for bits, G in shapes:
    shape = DecodeShape(bits, 8, 128, 32, G, 64)
    for kind in kinds:
        if kind == "grid":
            ptx, _ = cuda.compile_ptx(decode_kernel(shape).py_func, DECODE_SIG, cc=(9, 0)); c = 128
        else:
            k = P.persistent_kernel(shape, None, "none", True, False, "inline")
            ptx, _ = cuda.compile_ptx(k.py_func, PSIG, cc=(9, 0)); c = cap
        name = f"{kind}_b{bits}_g{G}"
        ptx = re.sub(r"^\.version .*$", ".version 9.0", ptx, flags=re.M)
        open(f"{out}/{name}.ptx", "w").write(ptx)
        r = subprocess.run(["/usr/local/bin/ptxas", "-arch=sm_90", "-O3", "-v", "-maxrregcount", str(c),
                            f"{out}/{name}.ptx", "-o", f"{out}/{name}.cubin"], capture_output=True, text=True)
        info = " ".join(l.split("info    : ")[-1] for l in r.stderr.splitlines() if "Used" in l or "spill" in l)
        open(f"{out}/{name}.ptxas", "w").write(r.stderr)
        s = subprocess.run(["/tmp/tritonbin/triton/backends/nvidia/bin/cuobjdump", "-sass", f"{out}/{name}.cubin"],
                           capture_output=True, text=True).stdout
        open(f"{out}/{name}.sass", "w").write(s)
        print(name, "cap", c, "|", info, flush=True)
