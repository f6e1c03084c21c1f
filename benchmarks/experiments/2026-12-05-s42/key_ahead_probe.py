"""Why the GPU twin of test_head_key_ahead_steps_the_word_index failed (forty-second
session, H100): the kernel's rows against Python's, and the PTX this numba-cuda emits.

As run (call 3), ``integrity.head_key`` passed the key through ``device.opaque_u32``, an
inline-assembly move, since removed; on today's tree both kernels below are the same.
``opaque_probe.py`` reproduces the fault without the library's helpers."""
import numpy as np
from numba import cuda

from hexcore.cuda import integrity
from hexcore.cuda.device import add_u32, mad_u32
from hexcore.host.checksum import HEAD_K1, HEAD_K2


@cuda.jit
def ahead(first, out):
    i = cuda.grid(1)
    if i < first.shape[0]:
        key = integrity.head_key(first[i])
        out[0, i] = integrity.head_key_ahead(key, 3)
        for j in range(4):
            out[1 + j, i] = integrity.head_key_ahead(key, 32 * j)


@cuda.jit
def plain(first, out):  # the same without opaque_u32
    i = cuda.grid(1)
    if i < first.shape[0]:
        key = mad_u32(first[i], HEAD_K1, HEAD_K2)
        out[0, i] = add_u32(key, mad_u32(3, HEAD_K1, 0))
        for j in range(4):
            out[1 + j, i] = add_u32(key, mad_u32(32 * j, HEAD_K1, 0))


first = np.arange(8, dtype=np.uint32) * np.uint32(1000003)
want = np.array([[(int(i) + n) * HEAD_K1 + HEAD_K2 & 0xFFFFFFFF for i in first] for n in (3, 0, 32, 64, 96)])
for kernel in (ahead, plain):
    out = cuda.to_device(np.zeros((5, 8), np.uint32))
    kernel[1, 8](first, out)
    got = out.copy_to_host()
    print(kernel.__name__, "rows equal:", [bool((got[r] == want[r]).all()) for r in range(5)])
    print(got[:, :2].tolist(), want[:, :2].tolist())
    ptx = next(iter(kernel.inspect_asm().values()))
    body = ptx[ptx.index("{", ptx.index(".entry")):]
    print("\n".join(line for line in body.splitlines() if line.strip() and not line.strip().startswith("//")))
