"""Why the old fill wrote non-finite halves on the GPU: each step of it, separately."""
import numpy as np
from numba import cuda, float32, uint32
from benchmarks.gpu_common import _hash

@cuda.jit
def old_fill(halves, seed, lo, hi):  # the fill as it was (lo, hi float64)
    i = cuda.grid(1)
    if i < halves.shape[0]:
        u = float32(_hash((i * 2654435761 + seed) & 0xFFFFFFFF) >> uint32(8)) * float32(1.0 / 16777216.0)
        halves[i] = lo + (hi - lo) * u

@cuda.jit
def u_only(out, seed):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = float32(_hash((i * 2654435761 + seed) & 0xFFFFFFFF) >> uint32(8)) * float32(1.0 / 16777216.0)

@cuda.jit
def store64(halves, x):
    i = cuda.grid(1)
    if i < halves.shape[0]:
        halves[i] = x * (i + 1)

@cuda.jit
def store32(halves, x):
    i = cuda.grid(1)
    if i < halves.shape[0]:
        halves[i] = x * float32(i + 1)

n = 1024
h = cuda.device_array(n, np.float16)
old_fill[4, 256](h, 1, -1.0, 1.0); a = h.copy_to_host()
print("old fill f64 lo/hi: finite", np.isfinite(a).mean(), a[:6])
old_fill[4, 256](h, 1, np.float32(-1.0), np.float32(1.0)); a = h.copy_to_host()
print("old fill f32 lo/hi: finite", np.isfinite(a).mean(), a[:6])
f = cuda.device_array(n, np.float32); u_only[4, 256](f, 1); a = f.copy_to_host()
print("u: min max", a.min(), a.max(), a[:4])
store64[4, 256](h, 0.01); a = h.copy_to_host(); print("f64 -> f16 store", a[:4], "expect", (0.01 * np.arange(1, 5)).astype(np.float16))
store32[4, 256](h, np.float32(0.01)); a = h.copy_to_host(); print("f32 -> f16 store", a[:4])
