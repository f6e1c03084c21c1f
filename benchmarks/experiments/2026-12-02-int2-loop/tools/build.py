"""Compile the decode kernel of a hexcore tree (argv[1] = root holding hexcore/) for bits,D,BS,G -> PTX, cubin, SASS.
usage: build.py ROOT OUTDIR bits [cap]"""
import os, re, sys, subprocess, types as pytypes
root, outdir, bits = sys.argv[1], sys.argv[2], int(sys.argv[3])
cap = int(sys.argv[4]) if len(sys.argv) > 4 else 128
sys.path.insert(0, root)
os.environ["NUMBA_ENABLE_CUDASIM"] = "0"
import numba.cuda.dispatcher as _d
_d.get_current_device = lambda: pytypes.SimpleNamespace(compute_capability=(9, 0))
from numba import cuda, types
import hexcore
assert hexcore.__file__.startswith(root), hexcore.__file__
from hexcore.cuda.attention.kernel import decode_kernel
from hexcore.cuda.attention.shape import DecodeShape
U32, I32, I64, F32 = types.uint32[::1], types.int32[::1], types.int64, types.float32[::1]
SIG = (U32, I64, I64, I64, I64, I64, I64, U32, types.int32[:, ::1], I32, I32, types.float16[::1], F32, F32,
       I32, I64, I64, I64, I64, I64, types.float32)
shape = DecodeShape(bits, 8, 128, 32, 4, 64)
import os as _os
JOINT = _os.environ.get("JOINT", "1") == "1"
CAP_NONE = _os.environ.get("CAPNONE") == "1"
ptx, _ = cuda.compile_ptx(decode_kernel(shape, joint_softmax=JOINT).py_func, SIG, cc=(9, 0))
os.makedirs(outdir, exist_ok=True)
name = f"{outdir}/b{bits}"
open(name + ".ptx", "w").write(re.sub(r"^\.version .*$", ".version 9.0", ptx, flags=re.MULTILINE))
r = subprocess.run(["/usr/local/bin/ptxas", "-arch=sm_90", "-O3", "-v", "-maxrregcount", str(cap), name + ".ptx", "-o", name + ".cubin"], capture_output=True, text=True)
print(" ".join(l.split("info    : ")[-1] for l in r.stderr.splitlines() if "Used" in l or "spill" in l))
if r.returncode: print(r.stderr[-2000:]); sys.exit(1)
s = subprocess.run(["/tmp/tritonbin/triton/backends/nvidia/bin/cuobjdump", "--dump-sass", name + ".cubin"], capture_output=True, text=True).stdout
open(name + ".sass", "w").write(s)
