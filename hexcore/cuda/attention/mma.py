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
- ``prmt(a, b, selector)``: PTX ``prmt.b32``: byte ``i`` of the result is byte
  ``(selector >> 4i) & 7`` of the 8-byte value ``b:a``. ``0x5410`` = low halves of
  ``a`` and ``b``; ``0x7632`` = their high halves.
- ``dequant_f16x2(word, shift, mask, scale, low)``: two codes of a packed word as
  ``scale * code + low`` in float16, in 32-bit instructions only: ``raw = ((word >> shift)
  & mask) | 0x64006400`` (``lop3``) puts the codes at bits 0.. and 16.. of two float16
  1024.0, ``raw - 1024`` (``sub.f16x2``) is the two codes exactly, and ``fma.rn.f16x2``
  rounds ``scale * code + low`` once. (numba would do the bit operations in 64 bits.)
- ``pack_f16x2(lo, hi)``: two float32 rounded to float16 in one word, ``lo`` in the low
  half (``cvt.rn.f16x2.f32``).
- ``prefetch_l2(words, i, nbytes)``: ask for ``nbytes`` (a multiple of 16) of the uint32
  array ``words`` from word ``i`` (16-byte aligned) into L2, without waiting
  (``cp.async.bulk.prefetch.L2.global``, sm_90). One lane issues it for the whole range.

The twins run on numba's simulator, which runs one Python thread per CUDA thread: the
mma twin gathers the warp's fragments through a per-warp barrier.
"""

from __future__ import annotations

import threading

import numpy as np
from numba import cuda, types

from .device import SIMULATOR

F16X2_1024 = 0x64006400  # two float16 1024.0

if not SIMULATOR:
    from llvmlite import ir
    from numba.cuda import cgutils
    from numba.cuda.extending import intrinsic

    _I32 = ir.IntType(32)
    _F32 = ir.FloatType()

    def _asm(builder, ret, operands, text, constraints):
        fnty = ir.FunctionType(ret, [op.type for op in operands])
        return builder.call(ir.InlineAsm(fnty, text, constraints), operands)

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
    def _prmt(typingctx, a, b, selector):
        sig = types.uint32(types.uint32, types.uint32, types.uint32)

        def codegen(context, builder, sig, args):
            return _asm(builder, _I32, list(args), "prmt.b32 $0, $1, $2, $3;", "=r,r,r,r")

        return sig, codegen

    @intrinsic
    def _dequant(typingctx, word, shift, mask, scale, low):
        sig = types.uint32(*([types.uint32] * 5))

        def codegen(context, builder, sig, args):
            word, shift, mask, scale, low = args
            magic = ir.Constant(_I32, F16X2_1024)
            shifted = _asm(builder, _I32, [word, shift], "shr.b32 $0, $1, $2;", "=r,r,r")
            raw = _asm(builder, _I32, [shifted, mask, magic], "lop3.b32 $0, $1, $2, $3, 0xEA;", "=r,r,r,r")
            codes = _asm(builder, _I32, [raw, magic], "sub.f16x2 $0, $1, $2;", "=r,r,r")
            return _asm(builder, _I32, [codes, scale, low], "fma.rn.f16x2 $0, $1, $2, $3;", "=r,r,r,r")

        return sig, codegen

    @intrinsic
    def _pack(typingctx, lo, hi):
        sig = types.uint32(types.float32, types.float32)

        def codegen(context, builder, sig, args):
            # cvt.rn.f16x2.f32 d, a, b puts a in the upper half
            return _asm(builder, _I32, [args[1], args[0]], "cvt.rn.f16x2.f32 $0, $1, $2;", "=r,f,f")

        return sig, codegen

    @intrinsic
    def _prefetch(typingctx, array, index, nbytes):
        if not (isinstance(array, types.Array) and array.dtype == types.uint32 and array.ndim == 1):
            return None
        sig = types.void(array, index, types.uint32)

        def codegen(context, builder, sig, args):
            ary = context.make_array(sig.args[0])(context, builder, value=args[0])
            ptr = cgutils.get_item_pointer(context, builder, sig.args[0], ary, [args[1]])
            address = builder.ptrtoint(ptr, ir.IntType(64))
            fnty = ir.FunctionType(ir.VoidType(), [ir.IntType(64), _I32])
            text = "{ .reg .u64 g; cvta.to.global.u64 g, $0; cp.async.bulk.prefetch.L2.global [g], $1; }"
            builder.call(ir.InlineAsm(fnty, text, "l,r", side_effect=True), [address, args[2]])
            return context.get_dummy_value()

        return sig, codegen

    @cuda.jit(device=True, inline=True)
    def prefetch_l2(words, i, nbytes):
        """Ask L2 for ``nbytes`` of ``words`` from word ``i`` (see the module docstring)."""
        _prefetch(words, i, types.uint32(nbytes))

    @cuda.jit(device=True, inline=True)
    def mma_f16(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        """One warp-wide m16n8k16 f16 mma with f32 accumulators (see the module docstring)."""
        return _mma(types.uint32(a0), types.uint32(a1), types.uint32(a2), types.uint32(a3), types.uint32(b0),
                    types.uint32(b1), types.float32(c0), types.float32(c1), types.float32(c2), types.float32(c3))

    @cuda.jit(device=True, inline=True)
    def prmt(a, b, selector):
        """PTX ``prmt.b32``: bytes of ``b:a`` picked by ``selector``."""
        return _prmt(types.uint32(a), types.uint32(b), types.uint32(selector))

    @cuda.jit(device=True, inline=True)
    def dequant_f16x2(word, shift, mask, scale, low):
        """Two codes of ``word`` as ``scale * code + low``, float16 pair (see the module docstring)."""
        return _dequant(types.uint32(word), types.uint32(shift), types.uint32(mask), types.uint32(scale),
                        types.uint32(low))

    @cuda.jit(device=True, inline=True)
    def pack_f16x2(lo, hi):
        """Two float32 rounded into one float16 pair, ``lo`` in the low half."""
        return _pack(types.float32(lo), types.float32(hi))

else:
    _warps: dict = {}
    _warps_lock = threading.Lock()

    class _Warp:
        """What the 32 simulated lanes of one warp exchange for one mma."""

        def __init__(self):
            self.barrier = threading.Barrier(32, timeout=120)
            self.a = np.zeros((32, 4), np.uint32)
            self.b = np.zeros((32, 2), np.uint32)

    def _halves(words):
        return np.asarray(words, np.uint32).view(np.float16).astype(np.float32)

    def _warp():
        key = (tuple(cuda.blockIdx), cuda.threadIdx.x // 32)
        with _warps_lock:
            if key not in _warps:
                _warps[key] = _Warp()
            return _warps[key]

    @cuda.jit(device=True)
    def mma_f16(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        """One warp-wide m16n8k16 f16 mma with f32 accumulators (see the module docstring)."""
        warp = _warp()
        lane = cuda.threadIdx.x % 32
        warp.a[lane] = (a0, a1, a2, a3)
        warp.b[lane] = (b0, b1)
        warp.barrier.wait()  # every lane's fragments written
        A = np.zeros((16, 16), np.float32)
        B = np.zeros((16, 8), np.float32)
        for src in range(32):
            g, t = src // 4, src % 4
            a = _halves(warp.a[src])  # a0 lo, a0 hi, a1 lo, ...
            A[g, 2 * t:2 * t + 2], A[g + 8, 2 * t:2 * t + 2] = a[0:2], a[2:4]
            A[g, 2 * t + 8:2 * t + 10], A[g + 8, 2 * t + 8:2 * t + 10] = a[4:6], a[6:8]
            b = _halves(warp.b[src])
            B[2 * t:2 * t + 2, g], B[2 * t + 8:2 * t + 10, g] = b[0:2], b[2:4]
        warp.barrier.wait()  # every lane has read them
        C = A.astype(np.float64) @ B.astype(np.float64)
        g, t = lane // 4, lane % 4
        return (np.float32(c0 + C[g, 2 * t]), np.float32(c1 + C[g, 2 * t + 1]),
                np.float32(c2 + C[g + 8, 2 * t]), np.float32(c3 + C[g + 8, 2 * t + 1]))

    @cuda.jit(device=True)
    def prefetch_l2(words, i, nbytes):
        """Ask L2 for ``nbytes`` of ``words`` from word ``i`` (see the module docstring)."""
        # a hint only: nothing to simulate

    @cuda.jit(device=True)
    def prmt(a, b, selector):
        """PTX ``prmt.b32``: bytes of ``b:a`` picked by ``selector``."""
        data = np.array([a, b], np.uint32).view(np.uint8)
        out = np.array([data[(int(selector) >> (4 * i)) & 7] for i in range(4)], np.uint8)
        return np.uint32(out.view(np.uint32)[0])

    @cuda.jit(device=True)
    def dequant_f16x2(word, shift, mask, scale, low):
        """Two codes of ``word`` as ``scale * code + low``, float16 pair (see the module docstring)."""
        raw = ((int(word) >> int(shift)) & int(mask)) | F16X2_1024
        r = _halves([raw]).astype(np.float64) - 1024.0
        s = _halves([scale]).astype(np.float64)
        m = _halves([low]).astype(np.float64)
        return np.uint32((r * s + m).astype(np.float16).view(np.uint32)[0])

    @cuda.jit(device=True)
    def pack_f16x2(lo, hi):
        """Two float32 rounded into one float16 pair, ``lo`` in the low half."""
        return np.uint32(np.array([lo, hi], np.float32).astype(np.float16).view(np.uint32)[0])
