"""Device helpers: every warp-level or intrinsic operation kernels use, each with a twin.

numba's CUDA simulator runs one Python thread per CUDA thread: it has no warp shuffles
and no ``@intrinsic``. So kernels never call those primitives directly; they call the
helpers below, and when the simulator is on each helper is replaced by a plain twin
that computes the same thing. The simulator checks the algorithm; a real GPU checks
the real code (``pytest -m gpu``). Tensor-core and packed-half helpers are in
``mma.py``, built the same way.

Helpers

- ``load_u32x4(a, i)``: words ``a[i:i+4]`` of a 1-D uint32 array as one 16-byte load
  (``ld.global.v4.u32``, SASS ``LDG.E.128``); ``i`` must be a multiple of 4.
- ``load_u32x2(a, i)``: the 8-byte version; ``i`` a multiple of 2.
- ``load_words(a, at, n, out, o)``: ``out[o:o+n] = a[at:at+n]`` for n = 1, 2 or 4, as one load.
- ``ld(a, i)``: ``a[i]`` of a 1-D array, without numba's negative-index wraparound (a
  signed index otherwise costs a compare, a select and 64-bit arithmetic per access);
  ``i`` must be in range.
- ``load_cg_f32(a, i)``: ``a[i]`` of a 1-D float32 array read from L2 (``ld.global.cg``),
  never from a stale L1 line: for data another CTA of the same launch wrote.
  ``load_cg_f32x4(a, i)``: ``a[i:i+4]`` the same way, as one 16-byte load (``i`` a
  multiple of 4).
- ``add_acq_rel(a, i, value)``: ``a[i] += value`` for a 1-D int64 array, returning the old
  value, as one acquire-release atomic at GPU scope (``atom.acq_rel.gpu.global.add.u64``):
  this thread's earlier memory operations are ordered before it (release) and its later ones
  after it (acquire). The twin is ``cuda.atomic.add``. ``add_acq_rel_i32(a, i, value)``: the
  same for a 1-D int32 array (``.u32``). After a ``syncthreads`` one thread's release covers
  the whole CTA's earlier writes (cumulativity), and its acquire followed by a
  ``syncthreads`` orders every thread's later reads: a split-K handshake with no
  ``threadfence`` (``membar.gl``, a sequentially consistent fence, in every thread).
- ``load_where(a, i, j, ok)``: ``a[i, j]`` of a 2-D int32 array if ``ok``, else -1, as one
  predicated load (``@p ld.global.b32``, no branch): a read that may be out of range only
  when it is not needed, which the compiler then issues with the loads before it (a branch
  around it made ptxas issue it after the reads the branch's condition waited for).
- ``load_relaxed(a, i)``: ``a[i]`` of a 1-D int64 array by a relaxed load at GPU scope
  (``ld.relaxed.gpu.global.s64``): from L2, never from a stale L1 line, and ordered after an
  earlier acquire (``add_acq_rel``) of this thread.
- ``shfl_idx(value, src)``: float32 ``value`` of lane ``src`` (every lane must call it).
- ``shfl_idx_int(value, src)``: the same for an int32 ``value`` (a block id).
- ``shfl_xor(value, mask)``: float32 ``value`` of lane ``lane ^ mask``.
- ``shfl_xor_u32(value, mask)``: the same for a uint32 ``value`` (a digest's lane sums).
- ``warp_ballot(predicate)``: uint32 mask of the lanes with ``predicate`` (``vote.ballot``),
  the same in every lane.
- ``warp_any(predicate)``: whether any lane of the warp has ``predicate`` (``vote.any``);
  the branch it guards is warp-uniform.
- ``mad_u32(a, b, c)``, ``add_u32(a, b)``, ``xorshift_u32(x, s)``: ``a * b + c``, ``a + b``
  and ``x ^ (x >> s)`` mod 2**32 (``0 <= s < 32``; integer operands taken mod 2**32), in
  32-bit instructions (one IMAD, one IADD3, SHF and LOP3). numba computes uint32
  arithmetic in 64 bits and masks it, which leaves ptxas a mask per shift and a key
  multiply per word (the head digest in the decode's verify loop: about 14 instructions a
  word, 12 with these, about 11 with the key added and kept from LLVM's sight:
  ``integrity.head_key_opaque``).
- ``xor_rotl_and_u32(a, r, n, m)``: ``a ^ (rotl(r, n) & m)`` mod 2**32 (``0 < n < 32``), a
  funnel shift and a three-input logic op (the tensor-core digest's weights:
  ``integrity.dense_weight``).
- ``exp2(x)``: ``2**x`` in float32 (``ex2.approx.ftz``: 2 ulp; the twin uses math.exp2).
- ``cp_async16(dst, j, src, i)``: start copying words ``src[i:i+4]`` (global) to
  ``dst[j:j+4]`` (a shared uint32 array declared with ``alignment=SHARED_ALIGN16``), 16
  bytes, without registers (``cp.async.cg.shared.global``); ``cp_async_commit()`` closes a
  group of such copies, ``cp_async_wait_one()`` waits until at most the newest group is in flight,
  ``cp_async_wait_all()`` for all of them. Other lanes see the words after ``syncwarp()``.
  ``cp_async16_at(dst, j, src, i, w)`` copies ``src[i+w:i+w+4]`` to ``dst[j+w:j+w+4]`` with
  the global address made from ``&src[i]`` plus ``4w`` bytes, so a lane's copies that differ
  only in a constant ``w`` share one 64-bit address computation.
- ``syncwarp()``: the warp's lanes meet (``bar.warp.sync``); orders their shared memory.
- ``prefetch_l2(words, i, nbytes)``: ask for ``nbytes`` (a multiple of 16) of the uint32
  array ``words`` from word ``i`` (16-byte aligned) into L2, without waiting
  (``cp.async.bulk.prefetch.L2.global``, sm_90). One lane issues it for the whole range.
- ``wait_prior_grids()`` and ``allow_dependent_grids()``: programmatic dependent launch
  (sm_90, ``griddepcontrol.wait`` / ``griddepcontrol.launch_dependents``). A kernel launched
  with the launch attribute ``PROGRAMMATIC_STREAM_SERIALIZATION`` (``launch.PreparedLaunch``,
  ``dependent=True``) may start while the kernel before it on the stream is still running;
  ``wait_prior_grids()`` waits until that kernel has finished and its writes are visible,
  so a kernel calls it before its first global read or write. ``allow_dependent_grids()``
  lets the next such kernel start once every CTA of this one has called it (or exited).
  Without the attribute both are no-ops; the twins do nothing (the simulator runs launches
  one after another).
- ``cluster_sync()`` and ``load_cluster_f32(a, i, rank)``: thread block clusters (sm_90). In
  a launch with a cluster dimension (``launch.PreparedLaunch``, ``cluster``), every thread
  of every CTA of the cluster meets at ``cluster_sync()`` (``barrier.cluster.arrive`` with
  release semantics, then ``barrier.cluster.wait`` with acquire), so the shared memory each
  CTA wrote before it is visible to the others after it; ``load_cluster_f32(a, i, rank)``
  reads ``a[i]`` of a 1-D float32 *shared* array in the CTA of cluster rank ``rank``
  (``mapa`` of the generic address, then a generic load: distributed shared memory). A CTA
  must not exit while another may still read its shared memory: ``cluster_sync_relaxed()``
  (a relaxed arrive: no fence, so it does not wait for this thread's global stores as the
  release does, ``MEMBAR.ALL.GPU`` in SASS) ends such a phase once every thread has used
  what it read. The twins are a cluster of one CTA (``syncthreads``, ``a[i]``): the
  simulator runs a grid's CTAs one after another, so no cluster larger than one runs there.

The twins of the warp operations exchange values through a per-warp slot table and a
``threading.Barrier`` of 32 simulated lanes, so a lane that skips a call deadlocks the
simulated warp, as a divergent shuffle would misbehave on a GPU.
"""

from __future__ import annotations

import math
import threading

import numpy as np
from numba import config, cuda, types

SIMULATOR = bool(config.ENABLE_CUDASIM)
FULL_MASK = 0xFFFFFFFF
# the ``alignment`` of a shared array written or read 16 bytes at a time (cp_async16's
# destination): numba declares a shared array with its dtype's alignment, and where ptxas
# places it among a kernel's other shared arrays is its choice (an out-of-line callee's
# arrays move). None on the simulator, which refuses the argument (and needs none)
SHARED_ALIGN16 = None if SIMULATOR else 16


def device_function(fn):
    """``cuda.jit(device=True)``, always inlined on a GPU (``forceinline``): local arrays
    passed between device functions then stay in registers."""
    return cuda.jit(device=True)(fn) if SIMULATOR else cuda.jit(device=True, forceinline=True)(fn)


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
    def _ld(typingctx, array, index):
        if not (isinstance(array, types.Array) and array.ndim == 1):
            return None
        sig = array.dtype(array, index)

        def codegen(context, builder, sig, args):
            ary = context.make_array(sig.args[0])(context, builder, value=args[0])
            return builder.load(cgutils.get_item_pointer(context, builder, sig.args[0], ary, [args[1]]))

        return sig, codegen

    @intrinsic
    def _load_cg(typingctx, array, index):
        if not (isinstance(array, types.Array) and array.dtype == types.float32 and array.ndim == 1):
            return None
        sig = types.float32(array, index)

        def codegen(context, builder, sig, args):
            ary = context.make_array(sig.args[0])(context, builder, value=args[0])
            ptr = cgutils.get_item_pointer(context, builder, sig.args[0], ary, [args[1]])
            fnty = ir.FunctionType(ir.FloatType(), [ir.IntType(64)])
            asm = ir.InlineAsm(fnty, "ld.global.cg.f32 $0, [$1];", "=f,l", side_effect=True)
            return builder.call(asm, [builder.ptrtoint(ptr, ir.IntType(64))])

        return sig, codegen

    @intrinsic
    def _load_cg4(typingctx, array, index):
        if not (isinstance(array, types.Array) and array.dtype == types.float32 and array.ndim == 1):
            return None
        sig = types.UniTuple(types.float32, 4)(array, index)

        def codegen(context, builder, sig, args):
            ary = context.make_array(sig.args[0])(context, builder, value=args[0])
            ptr = cgutils.get_item_pointer(context, builder, sig.args[0], ary, [args[1]])
            f32 = ir.FloatType()
            fnty = ir.FunctionType(ir.LiteralStructType([f32] * 4), [ir.IntType(64)])
            asm = ir.InlineAsm(fnty, "ld.global.cg.v4.f32 {$0, $1, $2, $3}, [$4];", "=f,=f,=f,=f,l",
                               side_effect=True)
            got = builder.call(asm, [builder.ptrtoint(ptr, ir.IntType(64))])
            return context.make_tuple(builder, sig.return_type, [builder.extract_value(got, k) for k in range(4)])

        return sig, codegen

    def _int64_address(context, builder, sig, args, dims=1):
        # the address of args[0][args[1], ..., args[dims]] (args[0] an array of type sig.args[0])
        ary = context.make_array(sig.args[0])(context, builder, value=args[0])
        return builder.ptrtoint(cgutils.get_item_pointer(context, builder, sig.args[0], ary, list(args[1:1 + dims])),
                                ir.IntType(64))

    def _int64_array(array):
        return isinstance(array, types.Array) and array.dtype == types.int64 and array.ndim == 1

    @intrinsic
    def _add_acq_rel(typingctx, array, index, value):
        # int64 or int32 counters; the value has the array's type
        if not (isinstance(array, types.Array) and array.ndim == 1 and array.dtype in (types.int64, types.int32)) \
                or value != array.dtype:
            return None
        sig = array.dtype(array, index, value)
        wide = array.dtype == types.int64

        def codegen(context, builder, sig, args):
            word = ir.IntType(64 if wide else 32)
            text = f"atom.acq_rel.gpu.global.add.u{64 if wide else 32} $0, [$1], $2;"
            asm = ir.InlineAsm(ir.FunctionType(word, [ir.IntType(64), word]), text,
                               "=l,l,l,~{memory}" if wide else "=r,l,r,~{memory}", side_effect=True)
            return builder.call(asm, [_int64_address(context, builder, sig, args), args[2]])

        return sig, codegen

    @intrinsic
    def _load_where(typingctx, array, i, j, ok):
        if not (isinstance(array, types.Array) and array.dtype == types.int32 and array.ndim == 2):
            return None
        sig = types.int32(array, types.int64, types.int64, types.uint32)

        def codegen(context, builder, sig, args):
            fnty = ir.FunctionType(ir.IntType(32), [ir.IntType(64), ir.IntType(32)])
            text = ("{\n\t.reg .pred ok;\n\tsetp.ne.u32 ok, $2, 0;\n\tmov.b32 $0, -1;\n\t"
                    "@ok ld.global.b32 $0, [$1];\n\t}")
            # a side effect, so LLVM keeps it after the kernel's griddepcontrol.wait (a
            # read-none asm could be scheduled above it: a read of the table before the grid
            # that writes it is done); ptxas still issues it with the loads around it
            asm = ir.InlineAsm(fnty, text, "=r,l,r", side_effect=True)
            return builder.call(asm, [_int64_address(context, builder, sig, args, dims=2), args[3]])

        return sig, codegen

    @intrinsic
    def _load_relaxed(typingctx, array, index):
        if not _int64_array(array):
            return None
        sig = types.int64(array, index)

        def codegen(context, builder, sig, args):
            i64 = ir.IntType(64)
            asm = ir.InlineAsm(ir.FunctionType(i64, [i64]), "ld.relaxed.gpu.global.s64 $0, [$1];", "=l,l,~{memory}",
                               side_effect=True)
            return builder.call(asm, [_int64_address(context, builder, sig, args)])

        return sig, codegen

    @intrinsic
    def _volatile_tid(typingctx):
        sig = types.int32()

        def codegen(context, builder, sig, args):
            fnty = ir.FunctionType(ir.IntType(32), [])
            return builder.call(ir.InlineAsm(fnty, "mov.u32 $0, %tid.x;", "=r", side_effect=True), [])

        return sig, codegen

    @intrinsic
    def _ex2(typingctx, x):
        sig = types.float32(types.float32)

        def codegen(context, builder, sig, args):
            fnty = ir.FunctionType(ir.FloatType(), [ir.FloatType()])
            return builder.call(ir.InlineAsm(fnty, "ex2.approx.ftz.f32 $0, $1;", "=f,f"), list(args))

        return sig, codegen

    @intrinsic
    def _prefetch(typingctx, array, index, nbytes):
        if not (isinstance(array, types.Array) and array.dtype == types.uint32 and array.ndim == 1):
            return None
        sig = types.void(array, index, types.uint32)

        def codegen(context, builder, sig, args):
            address = _int64_address(context, builder, sig, args)
            fnty = ir.FunctionType(ir.VoidType(), [ir.IntType(64), ir.IntType(32)])
            text = "{ .reg .u64 g; cvta.to.global.u64 g, $0; cp.async.bulk.prefetch.L2.global [g], $1; }"
            builder.call(ir.InlineAsm(fnty, text, "l,r", side_effect=True), [address, args[2]])
            return context.get_dummy_value()

        return sig, codegen

    @intrinsic
    def _cp_async(typingctx, dst, dst_index, src, src_index):
        if not all(isinstance(a, types.Array) and a.dtype == types.uint32 and a.ndim == 1 for a in (dst, src)):
            return None
        sig = types.void(dst, dst_index, src, src_index)

        def codegen(context, builder, sig, args):
            # the shared side as a 32-bit address: the array's base (converted once per
            # kernel, ptxas hoists it) plus a 32-bit byte offset, so no copy computes a
            # 64-bit generic address; the global side is the element's address
            i32, i64 = ir.IntType(32), ir.IntType(64)
            shared = context.make_array(sig.args[0])(context, builder, value=args[0])
            base = builder.ptrtoint(shared.data, i64)
            offset = builder.shl(builder.trunc(context.cast(builder, args[1], sig.args[1], types.int64), i32),
                                 ir.Constant(i32, 2))
            source = context.make_array(sig.args[2])(context, builder, value=args[2])
            pointer = cgutils.get_item_pointer(context, builder, sig.args[2], source, [args[3]])
            fnty = ir.FunctionType(ir.VoidType(), [i64, i32, i64])
            text = ("{ .reg .u64 s64, g; .reg .u32 s; cvta.to.shared.u64 s64, $0; cvt.u32.u64 s, s64; "
                    "add.u32 s, s, $1; cvta.to.global.u64 g, $2; cp.async.cg.shared.global [s], [g], 16; }")
            builder.call(ir.InlineAsm(fnty, text, "l,r,l", side_effect=True),
                         [base, offset, builder.ptrtoint(pointer, i64)])
            return context.get_dummy_value()

        return sig, codegen

    @intrinsic
    def _cp_async_at(typingctx, dst, dst_index, src, src_index, words):
        if not all(isinstance(a, types.Array) and a.dtype == types.uint32 and a.ndim == 1 for a in (dst, src)):
            return None
        sig = types.void(dst, dst_index, src, src_index, words)

        def codegen(context, builder, sig, args):
            # _cp_async of dst[dst_index + words] <- src[src_index + words], with the global
            # address taken as &src[src_index] plus 4 * words bytes: copies that differ only
            # in a constant ``words`` share one address (ptxas folds the rest into offsets)
            i32, i64 = ir.IntType(32), ir.IntType(64)
            shift = context.cast(builder, args[4], sig.args[4], types.int64)
            shared = context.make_array(sig.args[0])(context, builder, value=args[0])
            base = builder.ptrtoint(shared.data, i64)
            at = builder.add(context.cast(builder, args[1], sig.args[1], types.int64), shift)
            offset = builder.shl(builder.trunc(at, i32), ir.Constant(i32, 2))
            source = context.make_array(sig.args[2])(context, builder, value=args[2])
            pointer = cgutils.get_item_pointer(context, builder, sig.args[2], source, [args[3]])
            address = builder.add(builder.ptrtoint(pointer, i64), builder.shl(shift, ir.Constant(i64, 2)))
            fnty = ir.FunctionType(ir.VoidType(), [i64, i32, i64])
            text = ("{ .reg .u64 s64, g; .reg .u32 s; cvta.to.shared.u64 s64, $0; cvt.u32.u64 s, s64; "
                    "add.u32 s, s, $1; cvta.to.global.u64 g, $2; cp.async.cg.shared.global [s], [g], 16; }")
            builder.call(ir.InlineAsm(fnty, text, "l,r,l", side_effect=True), [base, offset, address])
            return context.get_dummy_value()

        return sig, codegen

    def _asm_statement(text):
        @intrinsic
        def statement(typingctx):
            def codegen(context, builder, sig, args):
                fnty = ir.FunctionType(ir.VoidType(), [])
                builder.call(ir.InlineAsm(fnty, text, "~{memory}", side_effect=True), [])
                return context.get_dummy_value()

            return types.void(), codegen

        return statement

    _commit = _asm_statement("cp.async.commit_group;")
    _griddep_wait = _asm_statement("griddepcontrol.wait;")
    _griddep_launch = _asm_statement("griddepcontrol.launch_dependents;")
    _cluster_barrier = _asm_statement("barrier.cluster.arrive.release.aligned;\n\t"
                                      "barrier.cluster.wait.acquire.aligned;")
    _cluster_barrier_relaxed = _asm_statement("barrier.cluster.arrive.relaxed.aligned;\n\t"
                                              "barrier.cluster.wait.aligned;")

    @intrinsic
    def _load_cluster(typingctx, array, index, rank):
        if not (isinstance(array, types.Array) and array.dtype == types.float32 and array.ndim == 1):
            return None
        sig = types.float32(array, index, types.uint32)

        def codegen(context, builder, sig, args):
            fnty = ir.FunctionType(ir.FloatType(), [ir.IntType(64), ir.IntType(32)])
            text = "{\n\t.reg .u64 remote;\n\tmapa.u64 remote, $1, $2;\n\tld.f32 $0, [remote];\n\t}"
            asm = ir.InlineAsm(fnty, text, "=f,l,r,~{memory}", side_effect=True)
            return builder.call(asm, [_int64_address(context, builder, sig, args), args[2]])

        return sig, codegen

    @device_function
    def wait_prior_grids():
        _griddep_wait()

    @device_function
    def allow_dependent_grids():
        _griddep_launch()

    @device_function
    def cluster_sync():
        _cluster_barrier()

    @device_function
    def cluster_sync_relaxed():
        _cluster_barrier_relaxed()

    @device_function
    def load_cluster_f32(array, index, rank):
        return _load_cluster(array, index, types.uint32(rank))
    _wait_one = _asm_statement("cp.async.wait_group 1;")
    _wait_all = _asm_statement("cp.async.wait_all;")

    @device_function
    def cp_async16(dst, dst_index, src, src_index):
        _cp_async(dst, dst_index, src, src_index)

    @device_function
    def cp_async16_at(dst, dst_index, src, src_index, words):
        _cp_async_at(dst, dst_index, src, src_index, words)

    @device_function
    def cp_async_commit():
        _commit()

    @device_function
    def cp_async_wait_one():
        _wait_one()

    @device_function
    def cp_async_wait_all():
        _wait_all()

    @device_function
    def syncwarp():
        cuda.syncwarp(FULL_MASK)

    @device_function
    def ld(array, index):
        return _ld(array, index)

    @device_function
    def warp_any(predicate):
        """True in every lane when ``predicate`` holds in any lane of the (full) warp; the
        branch it guards is then warp-uniform."""
        return cuda.any_sync(FULL_MASK, predicate)

    @device_function
    def warp_ballot(predicate):
        return types.uint32(cuda.ballot_sync(FULL_MASK, predicate))

    @device_function
    def load_cg_f32(array, index):
        return _load_cg(array, index)

    @device_function
    def add_acq_rel(array, index, value):
        return _add_acq_rel(array, index, types.int64(value))

    @device_function
    def add_acq_rel_i32(array, index, value):
        return _add_acq_rel(array, index, types.int32(value))

    @device_function
    def load_relaxed(array, index):
        return _load_relaxed(array, index)

    @device_function
    def load_where(array, i, j, ok):
        return _load_where(array, types.int64(i), types.int64(j), types.uint32(ok))

    @device_function
    def load_cg_f32x4(array, index):
        return _load_cg4(array, index)

    @device_function
    def prefetch_l2(words, i, nbytes):
        _prefetch(words, i, types.uint32(nbytes))

    @device_function
    def shfl_idx(value, src):
        return cuda.shfl_sync(FULL_MASK, value, src)

    @device_function
    def shfl_idx_int(value, src):
        return cuda.shfl_sync(FULL_MASK, types.int32(value), src)

    @device_function
    def shfl_xor(value, mask):
        return cuda.shfl_xor_sync(FULL_MASK, value, mask)

    @device_function
    def shfl_xor_u32(value, mask):
        return types.uint32(cuda.shfl_xor_sync(FULL_MASK, types.int32(value), mask))  # (int32: same bits)

    def _u32_signature(*operands):
        # uint32(uint32, ...) for integer operands (numba casts the arguments), else None
        if not all(isinstance(a, types.Integer) for a in operands):
            return None
        return types.uint32(*[types.uint32] * len(operands))

    @intrinsic
    def mad_u32(typingctx, a, b, c):
        sig = _u32_signature(a, b, c)
        return sig and (sig, lambda context, builder, sig, ops: builder.add(builder.mul(ops[0], ops[1]), ops[2]))

    @intrinsic
    def add_u32(typingctx, a, b):
        sig = _u32_signature(a, b)
        return sig and (sig, lambda context, builder, sig, ops: builder.add(ops[0], ops[1]))

    @intrinsic
    def xorshift_u32(typingctx, x, s):
        sig = _u32_signature(x, s)
        return sig and (sig, lambda context, builder, sig, ops: builder.xor(ops[0], builder.lshr(ops[0], ops[1])))

    @intrinsic
    def xor_rotl_and_u32(typingctx, a, r, n, m):
        sig = _u32_signature(a, r, n, m)

        def codegen(context, builder, sig, ops):
            # (NVVM rejects llvm.fshl; shifts by n and 32 - n, both in [1, 31], become one SHF)
            left = builder.shl(ops[1], ops[2])
            right = builder.lshr(ops[1], builder.sub(ops[2].type(32), ops[2]))
            return builder.xor(ops[0], builder.and_(builder.or_(left, right), ops[3]))

        return sig and (sig, codegen)

    @device_function
    def exp2(x):
        return _ex2(types.float32(x))

    @device_function
    def thread_index_volatile():
        """``threadIdx.x`` by a volatile PTX move: each call is a new read, which the
        optimiser can neither hoist out of a loop nor merge with another, so the values a
        loop body derives from it (shared-memory addresses of the thread) are recomputed in
        the body instead of living in registers across every iteration."""
        return _volatile_tid()

else:
    _warps: dict = {}
    _warps_lock = threading.Lock()

    def warp_state(kind, block, warp):
        """Warp ``warp`` of block ``block``'s one ``kind()`` (made on its first use): what the
        warp's 32 simulated lanes exchange, here in a shuffle, in ``mma.py`` in an mma. (The
        caller names its warp: the simulator gives each module running a kernel its own view
        of ``cuda.blockIdx``, and this module may not be one of them.)"""
        key = (kind, block, warp)
        with _warps_lock:
            if key not in _warps:
                _warps[key] = kind()
            return _warps[key]

    class _Warp:
        """What the 32 simulated lanes of one warp exchange in one shuffle."""

        def __init__(self):
            self.barrier = threading.Barrier(32, timeout=120)
            self.slots = np.zeros(32, np.float32)
            self.int_slots = np.zeros(32, np.int64)

    def _warp():
        return warp_state(_Warp, tuple(cuda.blockIdx), cuda.threadIdx.x // 32)

    def _exchange(value, src, integer=False):
        warp = _warp()
        slots = warp.int_slots if integer else warp.slots
        slots[cuda.threadIdx.x % 32] = value
        warp.barrier.wait()  # every lane's value written
        got = slots[src]
        warp.barrier.wait()  # every lane has read
        return np.int32(got) if integer else np.float32(got)

    @cuda.jit(device=True)
    def load_u32x4(array, index):
        return array[index], array[index + 1], array[index + 2], array[index + 3]

    @cuda.jit(device=True)
    def load_u32x2(array, index):
        return array[index], array[index + 1]

    @cuda.jit(device=True)
    def ld(array, index):
        return array[index]

    @cuda.jit(device=True)
    def load_cg_f32(array, index):
        return array[index]

    @cuda.jit(device=True)
    def add_acq_rel(array, index, value):
        return cuda.atomic.add(array, index, value)  # the simulator's atomics are sequentially consistent

    @cuda.jit(device=True)
    def add_acq_rel_i32(array, index, value):
        return cuda.atomic.add(array, index, value)

    @cuda.jit(device=True)
    def load_relaxed(array, index):
        return array[index]

    @cuda.jit(device=True)
    def load_where(array, i, j, ok):
        return array[i, j] if ok else np.int32(-1)

    @cuda.jit(device=True)
    def load_cg_f32x4(array, index):
        return array[index], array[index + 1], array[index + 2], array[index + 3]

    @cuda.jit(device=True)
    def cp_async16(dst, dst_index, src, src_index):
        for k in range(4):
            dst[dst_index + k] = src[src_index + k]

    @cuda.jit(device=True)
    def cp_async16_at(dst, dst_index, src, src_index, words):
        for k in range(4):
            dst[dst_index + words + k] = src[src_index + words + k]

    @cuda.jit(device=True)
    def wait_prior_grids():
        pass  # the simulator runs one launch after another

    @cuda.jit(device=True)
    def allow_dependent_grids():
        pass

    @cuda.jit(device=True)
    def cluster_sync():
        cuda.syncthreads()  # a cluster of one CTA (the simulator runs CTAs one after another)

    @cuda.jit(device=True)
    def cluster_sync_relaxed():
        cuda.syncthreads()

    @cuda.jit(device=True)
    def load_cluster_f32(array, index, rank):
        return array[index]  # rank 0 of a cluster of one

    @cuda.jit(device=True)
    def cp_async_commit():
        pass  # the twin's copies are done when cp_async16 returns

    @cuda.jit(device=True)
    def cp_async_wait_one():
        pass

    @cuda.jit(device=True)
    def cp_async_wait_all():
        pass

    @cuda.jit(device=True)
    def syncwarp():
        _warp().barrier.wait()

    @cuda.jit(device=True)
    def prefetch_l2(words, i, nbytes):
        pass  # a hint only: nothing to simulate

    @cuda.jit(device=True)
    def warp_any(predicate):
        warp = _warp()
        warp.slots[cuda.threadIdx.x % 32] = 1 if predicate else 0
        warp.barrier.wait()  # every lane's predicate written
        got = bool(warp.slots.any())
        warp.barrier.wait()  # every lane has read
        return got

    @cuda.jit(device=True)
    def warp_ballot(predicate):
        warp = _warp()
        warp.int_slots[cuda.threadIdx.x % 32] = 1 if predicate else 0
        warp.barrier.wait()  # every lane's predicate written
        got = int((warp.int_slots << np.arange(32, dtype=np.int64)).sum())
        warp.barrier.wait()  # every lane has read
        return np.uint32(got)

    @cuda.jit(device=True)
    def shfl_idx(value, src):
        return _exchange(value, src)

    @cuda.jit(device=True)
    def thread_index_volatile():
        return cuda.threadIdx.x

    @cuda.jit(device=True)
    def shfl_idx_int(value, src):
        return _exchange(value, src, integer=True)

    @cuda.jit(device=True)
    def shfl_xor(value, mask):
        return _exchange(value, (cuda.threadIdx.x % 32) ^ mask)

    @cuda.jit(device=True)
    def shfl_xor_u32(value, mask):
        warp = _warp()
        warp.int_slots[cuda.threadIdx.x % 32] = int(value)
        warp.barrier.wait()  # every lane's value written
        got = warp.int_slots[(cuda.threadIdx.x % 32) ^ mask]
        warp.barrier.wait()  # every lane has read
        return np.uint32(got)

    @cuda.jit(device=True)
    def mad_u32(a, b, c):
        return np.uint32((int(a) * int(b) + int(c)) & FULL_MASK)

    @cuda.jit(device=True)
    def add_u32(a, b):
        return np.uint32((int(a) + int(b)) & FULL_MASK)

    @cuda.jit(device=True)
    def xorshift_u32(x, s):
        x = int(x) & FULL_MASK
        return np.uint32(x ^ (x >> int(s)))

    @cuda.jit(device=True)
    def xor_rotl_and_u32(a, r, n, m):
        r, n = int(r) & FULL_MASK, int(n) % 32
        rotated = ((r << n) | (r >> (32 - n))) & FULL_MASK
        return np.uint32((int(a) ^ (rotated & int(m))) & FULL_MASK)

    @cuda.jit(device=True)
    def exp2(x):
        return np.float32(math.exp2(x)) if x > -200 else np.float32(0)


@device_function
def load_words(pool, at, n, out, o):
    """``out[o:o+n] = pool[at:at+n]`` (n = 1, 2 or 4, a compile-time constant), one load."""
    if n == 4:
        out[o], out[o + 1], out[o + 2], out[o + 3] = load_u32x4(pool, at)
    elif n == 2:
        out[o], out[o + 1] = load_u32x2(pool, at)
    else:
        out[o] = pool[at]
