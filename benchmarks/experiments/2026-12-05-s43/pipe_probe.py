"""How fast does the GPU hash words with the head digest's mixer, by the way its right shifts
are computed (forty-third session)? A throughput kernel: every thread sums the terms of
`n` words made in registers (8 independent chains), with the mixer's three right shifts as
SHF ("shift"), as multiply-highs by constants hidden in shuffles ("mulhi", IMAD.HI on the
multiply-add pipe, as the session's integrity.head_mix_hi did), or the two by 16 as multiply-highs and the one by
13 as a shift ("mixed"); plus two pure-pipe rows (a chain of xorshifts; a chain of
multiply-highs feeding multiply-adds) that give each pipe's rate. Prints ns a term per SM and the SASS counts."""
import sys
import time

import numpy as np
from llvmlite import ir
from numba import cuda, types, uint32
from numba.cuda import cgutils
from numba.cuda.extending import intrinsic

from hexcore.cuda.device import add_u32, mad_u32, shfl_xor_u32, xorshift_u32
from hexcore.host.checksum import HEAD_K1, HEAD_M1, HEAD_M2

CHAINS = 8


@intrinsic
def xorshift_hi_u32(typingctx, x, m):
    """``x ^ mulhi(x, m)`` (uint32): with ``m = 2**(32 - s)``, ``x ^ (x >> s)``, as a
    multiply-high (``llvm.nvvm.mulhi.ui``; IMAD.HI where ``m`` is not a known constant).
    The forty-third session tried it in the head digest's mixer (``integrity.head_mix_hi``,
    not kept)."""
    sig = types.uint32(types.uint32, types.uint32)

    def codegen(context, builder, sig, ops):
        i32 = ir.IntType(32)
        mulhi = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i32, [i32, i32]), "llvm.nvvm.mulhi.ui")
        return builder.xor(ops[0], builder.call(mulhi, [ops[0], ops[1]]))
    return sig, codegen


def make(form):
    @cuda.jit(device=True, inline=True)
    def mix(x, m16, m19):
        if form == "shift":
            x = mad_u32(xorshift_u32(x, 16), HEAD_M1, 0)
            x = mad_u32(xorshift_u32(x, 13), HEAD_M2, 0)
            return xorshift_u32(x, 16)
        if form == "mixed":
            x = mad_u32(xorshift_hi_u32(x, m16), HEAD_M1, 0)
            x = mad_u32(xorshift_u32(x, 13), HEAD_M2, 0)
            return xorshift_hi_u32(x, m16)
        if form == "alu":  # xorshifts only: the integer pipe
            return xorshift_u32(xorshift_u32(xorshift_u32(x, 16), 13), 16)
        if form == "imad":  # multiply-highs and multiply-adds only: the multiply-add pipe
            x = mad_u32(x, HEAD_M1, xorshift_hi_u32(x, m16) ^ x)  # (x ^ x ^ hi: LLVM keeps the hi alone)
            x = mad_u32(x, HEAD_M2, xorshift_hi_u32(x, m19) ^ x)
            return mad_u32(x, HEAD_M1, xorshift_hi_u32(x, m16) ^ x)
        x = mad_u32(xorshift_hi_u32(x, m16), HEAD_M1, 0)
        x = mad_u32(xorshift_hi_u32(x, m19), HEAD_M2, 0)
        return xorshift_hi_u32(x, m16)

    @cuda.jit
    def kernel(seed, n, out):
        m16, m19 = shfl_xor_u32(uint32(1 << 16), 0), shfl_xor_u32(uint32(1 << 19), 0)
        t = cuda.grid(1)
        k = shfl_xor_u32(mad_u32(seed[0], t, 0), 0)
        s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = uint32(0)
        for i in range(n):
            w = add_u32(k, mad_u32(i, HEAD_K1, 0))
            s0 = add_u32(s0, mix(add_u32(w, 0x1000), m16, m19))
            s1 = add_u32(s1, mix(add_u32(w, 0x2000), m16, m19))
            s2 = add_u32(s2, mix(add_u32(w, 0x3000), m16, m19))
            s3 = add_u32(s3, mix(add_u32(w, 0x4000), m16, m19))
            s4 = add_u32(s4, mix(add_u32(w, 0x5000), m16, m19))
            s5 = add_u32(s5, mix(add_u32(w, 0x6000), m16, m19))
            s6 = add_u32(s6, mix(add_u32(w, 0x7000), m16, m19))
            s7 = add_u32(s7, mix(add_u32(w, 0x8000), m16, m19))
        out[t] = s0 ^ s1 ^ s2 ^ s3 ^ s4 ^ s5 ^ s6 ^ s7
    return kernel


def main():
    sms = cuda.get_current_device().MULTIPROCESSOR_COUNT
    blocks, threads, n = sms * 8, 256, 4096
    seed = cuda.to_device(np.array([12345], np.uint32))
    out = cuda.device_array(blocks * threads, np.uint32)
    results = {}
    for form in ("shift", "mulhi", "mixed", "alu", "imad"):
        kernel = make(form)
        kernel[blocks, threads](seed, n, out)
        cuda.synchronize()
        results[form] = out.copy_to_host()
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            kernel[blocks, threads](seed, n, out)
            cuda.synchronize()
            best = min(best, time.perf_counter() - t0)
        terms = blocks * threads * n * CHAINS
        try:
            sass = next(iter(kernel.inspect_sass().values()))
        except Exception as e:  # (nvdisasm may be missing)
            sass = f"{e}"
        counts = {op: sass.count(op) for op in ("SHF", "IMAD.HI", "IMAD ", "LOP3", "IADD3")}
        print(f"{form:6s} {best * 1e3:8.3f} ms  {best / terms * sms * 1e9:7.4f} ns a term per SM  sass {counts}",
              flush=True)
    same = all(np.array_equal(results["shift"], results[f]) for f in ("mulhi", "mixed"))
    print("shift, mulhi and mixed sums equal:", same)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
