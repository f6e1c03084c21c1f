"""Tensor-core and packed-half helpers, each with a simulator twin (see device.py).

- ``mma_f16(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3)``: one warp-wide
  ``mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32``: ``C[16x8] += A[16x16] B[16x8]``
  with float16 inputs packed two per uint32 (low half first) and float32 accumulators.
  Lane ``4 * gid + tig`` holds (PTX ISA, "mma.m16n8k16 fragments")::

      a0 = A[gid,   2tig:2tig+2]   a1 = A[gid+8, 2tig:2tig+2]
      a2 = A[gid, 2tig+8:2tig+10]  a3 = A[gid+8, 2tig+8:2tig+10]
      b0 = B[2tig:2tig+2, gid]     b1 = B[2tig+8:2tig+10, gid]
      c0, c1 = C[gid, 2tig:2tig+2] c2, c3 = C[gid+8, 2tig:2tig+2]

  Every lane of the warp must call it with the same control flow. Returns (c0..c3).
- ``mma_u8s8(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3)``: one warp-wide
  ``mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32``: ``C[16x8] += A[16x32] B[32x8]``,
  A unsigned bytes, B signed bytes, four per uint32 (lowest byte first), C int32 carried as
  uint32 (two's complement, wrapping). Lane ``4 * gid + tig`` holds::

      a0 = A[gid,   4tig:4tig+4]     a1 = A[gid+8, 4tig:4tig+4]
      a2 = A[gid, 4tig+16:4tig+20]   a3 = A[gid+8, 4tig+16:4tig+20]
      b0 = B[4tig:4tig+4, gid]       b1 = B[4tig+16:4tig+20, gid]
      c0, c1 = C[gid, 2tig:2tig+2]   c2, c3 = C[gid+8, 2tig:2tig+2]

  Warp-wide, as ``mma_f16``. The tensor-core head digest (``hexcore/host/tensor_digest.py``).
- ``transpose8x8(word)``: PTX ``movmatrix.sync.aligned.m8n8.trans.b16``: the warp's 8x8
  float16 matrix, lane ``4 * r + c`` holding ``M[r, 2c:2c+2]`` in one word, comes back
  transposed in the same layout (lane ``4 * r + c`` gets ``M[2c:2c+2, r]``). Warp-wide.
- ``prmt(a, b, selector)``: PTX ``prmt.b32``: byte ``i`` of the result is byte
  ``(selector >> 4i) & 7`` of the 8-byte value ``b:a``. ``0x5410`` = low halves of
  ``a`` and ``b``; ``0x7632`` = their high halves.
- ``hfma2(a, b, c)``, ``hmul2(a, b)``: ``a * b + c`` and ``a * b`` on two float16 at once
  (``fma.rn.f16x2``, ``mul.rn.f16x2``: one rounding each).
- ``pack_f16x2(lo, hi)``: two float32 rounded to float16 in one word, ``lo`` in the low
  half (``cvt.rn.f16x2.f32``).
- ``half2_lo(w)``, ``half2_hi(w)``: the two float16 of a word, as float32.
- ``half_at(words, i)``: float16 element ``i`` of a uint32 array holding two per word (low
  half first), as float32.

The twins run on numba's simulator, which runs one Python thread per CUDA thread: the
mma twin gathers the warp's fragments through a per-warp barrier.
"""

from __future__ import annotations

import threading

import numpy as np
from numba import cuda, types

from .device import SIMULATOR, device_function

F16X2_ONES = 0x3C003C00  # two float16 1.0

if not SIMULATOR:
    from llvmlite import ir
    from numba.cuda.extending import intrinsic

    _I32 = ir.IntType(32)
    _F32 = ir.FloatType()

    def _asm(builder, ret, operands, text, constraints):
        fnty = ir.FunctionType(ret, [op.type for op in operands])
        return builder.call(ir.InlineAsm(fnty, text, constraints), operands)

    def _u32_op(arity, text):
        """An intrinsic of two or three uint32 operands returning one uint32 (inline PTX)."""
        constraints = ",".join(["=r"] + ["r"] * arity)

        def codegen(context, builder, sig, args):
            return _asm(builder, _I32, list(args), text, constraints)

        if arity == 2:
            @intrinsic
            def op2(typingctx, a, b):
                return types.uint32(types.uint32, types.uint32), codegen

            return op2

        @intrinsic
        def op3(typingctx, a, b, c):
            return types.uint32(types.uint32, types.uint32, types.uint32), codegen

        return op3

    _prmt = _u32_op(3, "prmt.b32 $0, $1, $2, $3;")
    _hfma2 = _u32_op(3, "fma.rn.f16x2 $0, $1, $2, $3;")
    _hmul2 = _u32_op(2, "mul.rn.f16x2 $0, $1, $2;")

    @intrinsic
    def _mma(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        sig = types.UniTuple(types.float32, 4)(*([types.uint32] * 6 + [types.float32] * 4))

        def codegen(context, builder, sig, args):
            out = _asm(builder, ir.LiteralStructType([_F32] * 4), list(args),
                       "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                       "{$0,$1,$2,$3}, {$4,$5,$6,$7}, {$8,$9}, {$10,$11,$12,$13};",
                       "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f")
            items = [builder.extract_value(out, k) for k in range(4)]
            return context.make_tuple(builder, sig.return_type, items)

        return sig, codegen

    @intrinsic
    def _imma(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        sig = types.UniTuple(types.uint32, 4)(*([types.uint32] * 10))

        def codegen(context, builder, sig, args):
            out = _asm(builder, ir.LiteralStructType([_I32] * 4), list(args),
                       "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 "
                       "{$0,$1,$2,$3}, {$4,$5,$6,$7}, {$8,$9}, {$10,$11,$12,$13};",
                       ",".join(["=r"] * 4 + ["r"] * 10))
            items = [builder.extract_value(out, k) for k in range(4)]
            return context.make_tuple(builder, sig.return_type, items)

        return sig, codegen

    @intrinsic
    def _movmatrix(typingctx, word):
        sig = types.uint32(types.uint32)

        def codegen(context, builder, sig, args):
            return _asm(builder, _I32, list(args), "movmatrix.sync.aligned.m8n8.trans.b16 $0, $1;", "=r,r")

        return sig, codegen

    @intrinsic
    def _pack(typingctx, lo, hi):
        sig = types.uint32(types.float32, types.float32)

        def codegen(context, builder, sig, args):
            # cvt.rn.f16x2.f32 d, a, b puts a in the upper half
            return _asm(builder, _I32, [args[1], args[0]], "cvt.rn.f16x2.f32 $0, $1, $2;", "=r,f,f")

        return sig, codegen

    def _half2_part(k):
        @intrinsic
        def part(typingctx, word):
            sig = types.float32(types.uint32)

            def codegen(context, builder, sig, args):
                pair = builder.bitcast(args[0], ir.VectorType(ir.HalfType(), 2))
                half = builder.extract_element(pair, ir.Constant(_I32, k))
                return builder.fpext(half, _F32)

            return sig, codegen

        return part

    _half2_lo = _half2_part(0)
    _half2_hi = _half2_part(1)

    @device_function
    def mma_f16(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        """One warp-wide m16n8k16 f16 mma with f32 accumulators (see the module docstring)."""
        return _mma(types.uint32(a0), types.uint32(a1), types.uint32(a2), types.uint32(a3), types.uint32(b0),
                    types.uint32(b1), types.float32(c0), types.float32(c1), types.float32(c2), types.float32(c3))

    @device_function
    def mma_u8s8(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        """One warp-wide m16n8k32 u8 x s8 mma with s32 accumulators (see the module docstring)."""
        return _imma(types.uint32(a0), types.uint32(a1), types.uint32(a2), types.uint32(a3), types.uint32(b0),
                     types.uint32(b1), types.uint32(c0), types.uint32(c1), types.uint32(c2), types.uint32(c3))

    @device_function
    def transpose8x8(word):
        """The warp's 8x8 float16 matrix transposed (see the module docstring)."""
        return _movmatrix(types.uint32(word))

    @device_function
    def prmt(a, b, selector):
        """PTX ``prmt.b32``: bytes of ``b:a`` picked by ``selector``."""
        return _prmt(types.uint32(a), types.uint32(b), types.uint32(selector))

    @device_function
    def hfma2(a, b, c):
        """``a * b + c`` on float16 pairs, one rounding."""
        return _hfma2(types.uint32(a), types.uint32(b), types.uint32(c))

    @device_function
    def hmul2(a, b):
        """``a * b`` on float16 pairs."""
        return _hmul2(types.uint32(a), types.uint32(b))

    @device_function
    def pack_f16x2(lo, hi):
        """Two float32 rounded into one float16 pair, ``lo`` in the low half."""
        return _pack(types.float32(lo), types.float32(hi))

    @device_function
    def half2_lo(word):
        """The low float16 of ``word``, as float32."""
        return _half2_lo(types.uint32(word))

    @device_function
    def half2_hi(word):
        """The high float16 of ``word``, as float32."""
        return _half2_hi(types.uint32(word))

else:
    from .device import warp_state

    class _Warp:
        """What the 32 simulated lanes of one warp exchange for one mma."""

        def __init__(self):
            self.barrier = threading.Barrier(32, timeout=120)
            self.a = np.zeros((32, 4), np.uint32)
            self.b = np.zeros((32, 2), np.uint32)
            self.m = np.zeros(32, np.uint32)

    def _halves(words):
        return np.asarray(words, np.uint32).view(np.float16).astype(np.float32)

    def _pair(lo, hi):
        return np.uint32(np.array([lo, hi], np.float16).view(np.uint32)[0])

    def _warp():
        return warp_state(_Warp, tuple(cuda.blockIdx), cuda.threadIdx.x // 32)

    def _gather(a0, a1, a2, a3, b0, b1):
        """(a, b, lane): every lane's A and B fragment words (uint32 ``[32, 4]``, ``[32, 2]``,
        copies) once all 32 lanes have called it, and this lane."""
        warp = _warp()
        lane = cuda.threadIdx.x % 32
        warp.a[lane] = (a0, a1, a2, a3)
        warp.b[lane] = (b0, b1)
        warp.barrier.wait()  # every lane's fragments written
        a, b = warp.a.copy(), warp.b.copy()
        warp.barrier.wait()  # every lane has read them
        return a, b, lane

    @cuda.jit(device=True)
    def mma_f16(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        """One warp-wide m16n8k16 f16 mma with f32 accumulators (see the module docstring)."""
        a, b, lane = _gather(a0, a1, a2, a3, b0, b1)
        # lane 4g + t holds A[g, 2t:2t+2], A[g+8, 2t:2t+2], A[g, 2t+8:2t+10], A[g+8, 2t+8:2t+10]
        # (its a0..a3, low half first) and B[2t:2t+2, g], B[2t+8:2t+10, g] (b0, b1)
        a = a.view(np.float16).astype(np.float64).reshape(8, 4, 4, 2)  # [g, t, word, half]
        b = b.view(np.float16).astype(np.float64).reshape(8, 4, 2, 2)
        A = np.empty((16, 16))
        A[:8, :8], A[8:, :8] = a[:, :, 0].reshape(8, 8), a[:, :, 1].reshape(8, 8)
        A[:8, 8:], A[8:, 8:] = a[:, :, 2].reshape(8, 8), a[:, :, 3].reshape(8, 8)
        B = np.empty((16, 8))
        B[:8], B[8:] = b[:, :, 0].reshape(8, 8).T, b[:, :, 1].reshape(8, 8).T
        C = A @ B
        g, t = lane // 4, lane % 4
        return (np.float32(c0 + C[g, 2 * t]), np.float32(c1 + C[g, 2 * t + 1]),
                np.float32(c2 + C[g + 8, 2 * t]), np.float32(c3 + C[g + 8, 2 * t + 1]))

    @cuda.jit(device=True)
    def mma_u8s8(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        """One warp-wide m16n8k32 u8 x s8 mma with s32 accumulators (see the module docstring)."""
        a, b, lane = _gather(a0, a1, a2, a3, b0, b1)
        # lane 4g + t: a_q holds A[g + 8 (q % 2), 4t + 16 (q // 2) + i] in byte i; b_j holds
        # B[16 j + 4t + i, g]
        a = a.view(np.uint8).astype(np.int64).reshape(8, 4, 2, 2, 4)  # [g, t, q // 2, q % 2, i]
        b = b.view(np.int8).astype(np.int64).reshape(8, 4, 2, 4)  # [g, t, j, i]
        A = a.transpose(3, 0, 2, 1, 4).reshape(16, 32)
        B = b.transpose(2, 1, 3, 0).reshape(32, 8)
        C = A @ B
        g, t = lane // 4, lane % 4
        return tuple(np.uint32((int(c) + int(C[r, n])) & 0xFFFFFFFF)
                     for c, r, n in ((c0, g, 2 * t), (c1, g, 2 * t + 1), (c2, g + 8, 2 * t), (c3, g + 8, 2 * t + 1)))

    @cuda.jit(device=True)
    def transpose8x8(word):
        """The warp's 8x8 float16 matrix transposed (see the module docstring)."""
        warp = _warp()
        lane = cuda.threadIdx.x % 32
        warp.m[lane] = word
        warp.barrier.wait()  # every lane's row written
        M = warp.m.view(np.float16).reshape(8, 8)  # M[r, c]: lane 4r + c // 2, half c % 2
        r, c = lane // 4, lane % 4
        out = _pair(M[2 * c, r], M[2 * c + 1, r])
        warp.barrier.wait()  # every lane has read
        return out

    @cuda.jit(device=True)
    def prmt(a, b, selector):
        """PTX ``prmt.b32``: bytes of ``b:a`` picked by ``selector``."""
        data = np.array([a, b], np.uint32).view(np.uint8)
        out = np.array([data[(int(selector) >> (4 * i)) & 7] for i in range(4)], np.uint8)
        return np.uint32(out.view(np.uint32)[0])

    @cuda.jit(device=True)
    def hfma2(a, b, c):
        """``a * b + c`` on float16 pairs, one rounding."""
        x, y, z = (_halves([w]).astype(np.float64) for w in (a, b, c))
        r = x * y + z
        return _pair(r[0], r[1])

    @cuda.jit(device=True)
    def hmul2(a, b):
        """``a * b`` on float16 pairs."""
        r = _halves([a]).astype(np.float64) * _halves([b]).astype(np.float64)
        return _pair(r[0], r[1])

    @cuda.jit(device=True)
    def pack_f16x2(lo, hi):
        """Two float32 rounded into one float16 pair, ``lo`` in the low half."""
        return _pair(lo, hi)

    @cuda.jit(device=True)
    def half2_lo(word):
        """The low float16 of ``word``, as float32."""
        return np.float32(np.array([word], np.uint32).view(np.float16)[0])

    @cuda.jit(device=True)
    def half2_hi(word):
        """The high float16 of ``word``, as float32."""
        return np.float32(np.array([word], np.uint32).view(np.float16)[1])


@cuda.jit(device=True)
def half_at(words, i):
    """Float16 element ``i`` (>= 0) of a uint32 array holding two per word (low half first), as float32."""
    w = words[i >> 1]
    return half2_hi(w) if i & 1 else half2_lo(w)
