"""Acquire loads and release stores on int64 words of a numpy array, for njit code.

numba has no CPU atomics API, so these are ``numba.extending.intrinsic`` functions
that emit LLVM ``load atomic i64 ... acquire`` and ``store atomic i64 ... release``
on a pointer into the array's data. On x86-64 both compile to a plain ``mov``; what
they buy there is that LLVM may neither reorder the record writes past the release
store nor hoist an acquire load out of a spin loop. On weaker CPUs (aarch64) they
also emit the ``ldar``/``stlr`` the hardware needs.

Under ``NUMBA_DISABLE_JIT=1`` the same names are plain Python functions over the
array: the interpreter executes loads and stores in program order, which is enough
for the pure-Python fallback on x86-64 (the only use of that mode is debugging).
"""

from __future__ import annotations

import numba
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["load_acquire", "store_release"]


def _int64_vector(arr) -> bool:
    return (isinstance(arr, types.Array) and arr.dtype == types.int64 and arr.ndim == 1
            and arr.layout == "C")


def _word_pointer(context, builder, arr_type, arr_value, index_type, index_value):
    """Pointer to word ``index`` of a C-contiguous int64 vector (no bounds check)."""
    array = context.make_array(arr_type)(context, builder, arr_value)
    index = context.cast(builder, index_value, index_type, types.intp)
    return cgutils.gep(builder, array.data, index)


if numba.config.DISABLE_JIT:

    def load_acquire(buf, index):
        """Word ``index`` of ``buf`` (pure-Python fallback)."""
        return int(buf[index])

    def store_release(buf, index, value):
        """Set word ``index`` of ``buf`` to ``value`` (pure-Python fallback)."""
        buf[index] = value

else:

    @intrinsic
    def load_acquire(typingctx, buf, index):
        """Load word ``index`` of an int64 C-contiguous vector with acquire ordering."""
        if not _int64_vector(buf) or not isinstance(index, types.Integer):
            return None
        sig = types.int64(buf, index)

        def codegen(context, builder, signature, args):
            ptr = _word_pointer(context, builder, signature.args[0], args[0],
                                signature.args[1], args[1])
            return builder.load_atomic(ptr, "acquire", 8)

        return sig, codegen

    @intrinsic
    def store_release(typingctx, buf, index, value):
        """Store ``value`` to word ``index`` of an int64 vector with release ordering."""
        if (not _int64_vector(buf) or not isinstance(index, types.Integer)
                or not isinstance(value, types.Integer)):
            return None
        sig = types.void(buf, index, value)

        def codegen(context, builder, signature, args):
            ptr = _word_pointer(context, builder, signature.args[0], args[0],
                                signature.args[1], args[1])
            word = context.cast(builder, args[2], signature.args[2], types.int64)
            builder.store_atomic(word, ptr, "release", 8)
            return context.get_dummy_value()

        return sig, codegen
