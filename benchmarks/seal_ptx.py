"""Static size of the quantized seal kernels for sm_90, before (commit 9a80669: ``floor``
and an integer clamp) and after the non-finite policy (float32 clamp, NaN groups, optional
``nonfinite=`` flags): PTX instructions, and registers/spills/shared memory from ptxas.
Runs on a machine without a GPU; needs numba-cuda with the nvidia-cuda-nvrtc and
nvidia-cuda-nvcc 13.x wheels (ptxas from the latter), and git (for the old write.py).

    python benchmarks/seal_ptx.py
"""
import importlib.util
import os
import re
import subprocess
import sys
import tempfile

os.environ.pop("NUMBA_ENABLE_CUDASIM", None)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
OLD = os.path.join(tempfile.mkdtemp(), "write_9a80669.py")
with open(OLD, "w") as f:
    f.write(subprocess.run(["git", "-C", ROOT, "show", "9a80669:hexcore/cuda/write.py"], capture_output=True,
                           text=True, check=True).stdout)
import numba.cuda.dispatcher as disp
class _D: compute_capability = (9, 0)
disp.get_current_device = lambda: _D()
from numba import types
from numba.cuda import compile_ptx
from hexcore import KVCacheConfig
import hexcore.cuda.write as new
spec = importlib.util.spec_from_file_location("hexcore.cuda._write_orig", OLD)
old = importlib.util.module_from_spec(spec); old.__package__ = "hexcore.cuda"; spec.loader.exec_module(old)
f16a, u32a, i32a, i32b = (types.Array(types.float16, 1, "C"), types.Array(types.uint32, 1, "C"),
                          types.Array(types.int32, 1, "C"), types.Array(types.int32, 2, "C"))
def count(ptx):
    lines = [l.strip() for l in ptx.splitlines()]
    ins = [l for l in lines if l and not l.startswith(("//", ".", "{", "}", "$")) and l.endswith(";")]
    return len(ins)
for dtype in ("int4", "int2"):
    cfg = KVCacheConfig(num_layers=2, num_kv_heads=8, head_dim=128, block_size=32, kv_dtype=dtype, group_size=64)
    base = (f16a, f16a, u32a, u32a, f16a, f16a, i32a, i32a, types.int64, types.int64, types.int64)
    p_old, _ = compile_ptx(old._seal_quantized_kernel(cfg).py_func, base, cc=(9, 0))
    p_new, _ = compile_ptx(new._seal_quantized_kernel(cfg, False).py_func, base + (i32b,), cc=(9, 0))
    p_rep, _ = compile_ptx(new._seal_quantized_kernel(cfg, True).py_func, base + (i32b,), cc=(9, 0))
    print(dtype, "PTX instructions: before", count(p_old), "after", count(p_new), "with flags", count(p_rep))

# registers, spills and shared memory of each, from ptxas -O3 -v (sm_90)
import glob, subprocess, tempfile
ptxas = glob.glob(os.path.join(os.path.dirname(sys.executable), "..", "lib", "python3*", "site-packages", "nvidia",
                               "cu13", "bin", "ptxas"))[0]
for dtype in ("int4", "int2"):
    cfg = KVCacheConfig(num_layers=2, num_kv_heads=8, head_dim=128, block_size=32, kv_dtype=dtype, group_size=64)
    base = (f16a, f16a, u32a, u32a, f16a, f16a, i32a, i32a, types.int64, types.int64, types.int64)
    for label, fn, sig in (("before", old._seal_quantized_kernel(cfg).py_func, base),
                           ("after", new._seal_quantized_kernel(cfg, False).py_func, base + (i32b,)),
                           ("with flags", new._seal_quantized_kernel(cfg, True).py_func, base + (i32b,))):
        ptx, _ = compile_ptx(fn, sig, cc=(9, 0))
        with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
            f.write(ptx)
        out = subprocess.run([ptxas, "-O3", "-v", "-arch=sm_90", f.name, "-o", os.devnull], capture_output=True,
                             text=True)
        used = [l for l in (out.stdout + out.stderr).splitlines() if "Used" in l or "spill" in l]
        print(dtype, label, " | ".join(u.split("info    : ")[-1] for u in used))
