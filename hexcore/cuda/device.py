"""Device helpers: every warp-level or intrinsic operation kernels use, each with a twin.

numba's CUDA simulator runs one Python thread per CUDA thread: it has no warp shuffles
and no ``@intrinsic``. So kernels never call those primitives directly; they call the
helpers below, and when the simulator is on each helper is replaced by a plain twin
that computes the same thing. The simulator checks the algorithm; a real GPU checks
the real code (``pytest -m gpu``).

Helpers

- ``load_u32x4(a, i)``: words ``a[i:i+4]`` of a 1-D uint32 array as one 16-byte load
  (``ld.global.v4.u32``, SASS ``LDG.E.128``); ``i`` must be a multiple of 4.
- ``load_u32x2(a, i)``: the 8-byte version; ``i`` a multiple of 2.
- ``u32_as_f32(w)``: reinterpret bits. With ``MAGIC = 0x4B000000`` (2**23 as float32),
  ``u32_as_f32(MAGIC | n) - 2**23 == n`` exactly for ``n < 2**23``: the integer to
  float conversion in two 32-bit ALU operations, never through int64.
- ``half2_lo(w)``, ``half2_hi(w)``: the two float16 packed in a 32-bit word, as float32.
- ``xor_sum_store(out, i, j, value, lane, lo, hi, store)``: ``out[i, j] =`` the sum of
  ``value`` over the lanes that differ from this one only in the lane-id bits ``lo``
  to ``hi`` (powers of two; ``lo > hi`` means no other lane). A butterfly of xor
  shuffles, then the lane with those bits clear stores if ``store``. Every lane of the
  warp must call it, storing or not. The twin adds with a shared-memory atomic instead, so ``out`` must be
  zeroed first::

      lo=1, hi=8:   lanes 0-15 sum into lane 0, lanes 16-31 into lane 16
      lo=4, hi=16:  lanes 0,4,8,...,28 sum into lane 0; 1,5,...,29 into lane 1; ...

- ``xor_sum_add(out, i, j, value, lane, lo, hi)``: the same, added atomically into
  ``out[i, j]`` (several warps may add to one element).
- ``half_at(words, k)``: float16 number ``k`` of a uint32 array, as float32.
- ``block_max(value, scratch)``, ``block_sum(value, scratch)``: the max / sum of
  ``value`` over the whole CTA, returned to every thread; ``scratch`` is a shared
  float32 array of blockDim.x elements. Every thread must call them (they contain
  ``syncthreads``). GPU: warp shuffles, then one value per warp; twin: all through
  shared memory.
"""

from __future__ import annotations

import numpy as np
from numba import config, cuda, types

SIMULATOR = bool(config.ENABLE_CUDASIM)
MAGIC = 0x4B000000
MAGIC_F32 = np.float32(8388608.0)  # 2**23, float32 so arithmetic with it stays float32
FULL_MASK = 0xFFFFFFFF

if not SIMULATOR:
    from llvmlite import ir
    from numba.cuda import cgutils
    from numba.cuda.extending import intrinsic

    def _pointer(context, builder, aryty, ary, index, width):
        array = context.make_array(aryty)(context, builder, value=ary)
        ptr = cgutils.get_item_pointer(context, builder, aryty, array, [index])
        return builder.bitcast(ptr, ir.VectorType(ir.IntType(32), width).as_pointer())

    def _vector_load(width):
        @intrinsic
        def load(typingctx, array, index):
            if not (isinstance(array, types.Array) and array.dtype == types.uint32 and array.ndim == 1):
                return None
            sig = types.UniTuple(types.uint32, width)(array, index)

            def codegen(context, builder, sig, args):
                vptr = _pointer(context, builder, sig.args[0], args[0], args[1], width)
                vec = builder.load(vptr, align=4 * width)
                items = [builder.extract_element(vec, ir.Constant(ir.IntType(32), k)) for k in range(width)]
                return context.make_tuple(builder, sig.return_type, items)

            return sig, codegen

        return load

    load_u32x4 = _vector_load(4)
    load_u32x2 = _vector_load(2)

    @intrinsic
    def _u32_as_f32(typingctx, word):
        sig = types.float32(types.uint32)

        def codegen(context, builder, sig, args):
            return builder.bitcast(args[0], ir.FloatType())

        return sig, codegen

    def _half2_part(k):
        @intrinsic
        def part(typingctx, word):
            sig = types.float32(types.uint32)

            def codegen(context, builder, sig, args):
                pair = builder.bitcast(args[0], ir.VectorType(ir.HalfType(), 2))
                half = builder.extract_element(pair, ir.Constant(ir.IntType(32), k))
                return builder.fpext(half, ir.FloatType())

            return sig, codegen

        return part

    _half2_lo = _half2_part(0)
    _half2_hi = _half2_part(1)

    @cuda.jit(device=True, inline=True)
    def u32_as_f32(word):
        return _u32_as_f32(types.uint32(word))

    @cuda.jit(device=True, inline=True)
    def half2_lo(word):
        return _half2_lo(types.uint32(word))

    @cuda.jit(device=True, inline=True)
    def half2_hi(word):
        return _half2_hi(types.uint32(word))

    @cuda.jit(device=True, inline=True)
    def _xor_sum(value, lo, hi):
        # butterfly: afterwards every lane of the xor group holds the group's sum
        offset = lo
        while offset <= hi:
            value += cuda.shfl_xor_sync(FULL_MASK, value, offset)
            offset <<= 1
        return value

    @cuda.jit(device=True, inline=True)
    def xor_sum_store(out, i, j, value, lane, lo, hi, store):
        total = _xor_sum(value, lo, hi)
        if store and (lane & (2 * hi - lo) == 0 or lo > hi):
            out[i, j] = total

    @cuda.jit(device=True, inline=True)
    def xor_sum_add(out, i, j, value, lane, lo, hi):
        total = _xor_sum(value, lo, hi)
        if lane & (2 * hi - lo) == 0 or lo > hi:
            cuda.atomic.add(out, (i, j), total)

    @cuda.jit(device=True, inline=True)
    def half_at(words, k):
        w = words[k >> 1]
        return half2_hi(w) if k & 1 else half2_lo(w)

    @cuda.jit(device=True, inline=True)
    def block_max(value, scratch):
        offset = 16
        while offset > 0:
            value = max(value, cuda.shfl_xor_sync(FULL_MASK, value, offset))
            offset >>= 1
        if cuda.threadIdx.x % 32 == 0:
            scratch[cuda.threadIdx.x // 32] = value
        cuda.syncthreads()  # one partial per warp in scratch
        result = scratch[0]
        for i in range(1, cuda.blockDim.x // 32):
            result = max(result, scratch[i])
        cuda.syncthreads()  # scratch free for the next reduction
        return result

    @cuda.jit(device=True, inline=True)
    def block_sum(value, scratch):
        offset = 16
        while offset > 0:
            value += cuda.shfl_xor_sync(FULL_MASK, value, offset)
            offset >>= 1
        if cuda.threadIdx.x % 32 == 0:
            scratch[cuda.threadIdx.x // 32] = value
        cuda.syncthreads()  # one partial per warp in scratch
        result = scratch[0]
        for i in range(1, cuda.blockDim.x // 32):
            result += scratch[i]
        cuda.syncthreads()  # scratch free for the next reduction
        return result

else:
    # the simulator swaps `cuda` inside device functions for its fake module (atomics)

    @cuda.jit(device=True)
    def load_u32x4(array, index):
        return array[index], array[index + 1], array[index + 2], array[index + 3]

    @cuda.jit(device=True)
    def load_u32x2(array, index):
        return array[index], array[index + 1]

    @cuda.jit(device=True)
    def u32_as_f32(word):
        return np.float32(np.array([word], np.uint32).view(np.float32)[0])

    @cuda.jit(device=True)
    def half2_lo(word):
        return np.float32(np.array([word], np.uint32).view(np.float16)[0])

    @cuda.jit(device=True)
    def half2_hi(word):
        return np.float32(np.array([word], np.uint32).view(np.float16)[1])

    @cuda.jit(device=True)
    def xor_sum_store(out, i, j, value, lane, lo, hi, store):
        if store:
            cuda.atomic.add(out, (i, j), value)

    @cuda.jit(device=True)
    def xor_sum_add(out, i, j, value, lane, lo, hi):
        cuda.atomic.add(out, (i, j), value)

    @cuda.jit(device=True)
    def half_at(words, k):
        return half2_hi(words[k >> 1]) if k & 1 else half2_lo(words[k >> 1])

    @cuda.jit(device=True)
    def block_max(value, scratch):
        scratch[cuda.threadIdx.x] = value
        cuda.syncthreads()  # every thread's value in scratch
        result = scratch[0]
        for i in range(1, cuda.blockDim.x):
            result = max(result, scratch[i])
        cuda.syncthreads()  # scratch free for the next reduction
        return result

    @cuda.jit(device=True)
    def block_sum(value, scratch):
        scratch[cuda.threadIdx.x] = value
        cuda.syncthreads()  # every thread's value in scratch
        result = scratch[0]
        for i in range(1, cuda.blockDim.x):
            result += scratch[i]
        cuda.syncthreads()  # scratch free for the next reduction
        return result
