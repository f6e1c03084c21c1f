"""Does an inline-assembly move that LLVM cannot see through break a loop's addresses on
the lent GPU's NVVM (forty-second session)? A pure asm (device.opaque_u32 as built) and the
same asm marked with a side effect, each in the test's loop; rows right or wrong."""
import numpy as np
from llvmlite import ir
from numba import cuda, types
from numba.core.extending import intrinsic

from hexcore.cuda.device import add_u32, mad_u32
from hexcore.host.checksum import HEAD_K1, HEAD_K2


def _opaque(side_effect):
    @intrinsic
    def opaque(typingctx, x):
        sig = types.uint32(types.uint32)

        def codegen(context, builder, sig, args):
            fnty = ir.FunctionType(ir.IntType(32), [ir.IntType(32)])
            return builder.call(ir.InlineAsm(fnty, "mov.b32 $0, $1;", "=r,r", side_effect=side_effect), list(args))

        return sig, codegen
    return opaque


pure, effect = _opaque(False), _opaque(True)


def make(op):
    @cuda.jit
    def kernel(first, out):
        i = cuda.grid(1)
        if i < first.shape[0]:
            key = op(mad_u32(first[i], HEAD_K1, HEAD_K2))
            out[0, i] = add_u32(key, mad_u32(3, HEAD_K1, 0))
            for j in range(4):
                out[1 + j, i] = add_u32(key, mad_u32(32 * j, HEAD_K1, 0))
    return kernel


first = np.arange(8, dtype=np.uint32) * np.uint32(1000003)
want = np.array([[(int(i) + n) * HEAD_K1 + HEAD_K2 & 0xFFFFFFFF for i in first] for n in (3, 0, 32, 64, 96)])
for name, op in (("pure", pure), ("side effect", effect)):
    kernel = make(op)
    out = cuda.to_device(np.zeros((16, 8), np.uint32))  # rows 5-15: where a wrong address lands
    kernel[1, 8](first, out)
    got = out.copy_to_host()
    print(name, "rows 0-4 right:", [bool((got[r] == want[r]).all()) for r in range(5)],
          "rows 5-15 written:", [r for r in range(5, 16) if got[r].any()])
import numba_cuda, numba
print("numba", numba.__version__, "numba-cuda", getattr(numba_cuda, "__version__", "?"))
from numba.cuda.cudadrv import nvvm
print("NVVM", nvvm.NVVM().get_version())
