"""Which form of the head-key test kernel does the lent GPU's NVVM miscompile (forty-third
session)? The GPU twin of test_head_key_ahead_steps_the_word_index failed on an H100 with the
key through integrity.head_key_opaque (a shuffle): rows 2-4 of its 2-D output were not
written where they belong, as with the forty-second session's inline-assembly move. Six
forms of the kernel, their rows right or wrong, and the PTX of their stores. On the CPU
(CUDA 13.5's NVVM, `cuda.compile_ptx` for sm_90) "minimal" -- no shuffle, no assembly, no
head key: a store to row 0, then a loop storing rows 1-4 of a 2-D array whose row length is
known only at run time -- gets the same wrong addresses (row 2 at 3 rows, row 3 at 6, row 4
at 10), while llvmlite's LLVM, optimizing and emitting PTX from the same numba IR, stores
every row at its place: the fault is NVVM's optimizer, not the shuffle or the assembly."""
import numpy as np
from numba import cuda

from hexcore.cuda import integrity
from hexcore.host.checksum import HEAD_K1, HEAD_K2

N = 64


@cuda.jit
def as_tested(first, out):  # the test's kernel: 2-D out (a runtime row stride), a loop of stores
    i = cuda.grid(1)
    if i < first.shape[0]:
        key = integrity.head_key_opaque(first[i])
        out[0, i] = integrity.head_key_ahead(key, 3)
        for j in range(4):
            out[1 + j, i] = integrity.head_key_ahead(key, 32 * j)


@cuda.jit
def straight(first, out):  # the same stores written out, no loop
    i = cuda.grid(1)
    if i < first.shape[0]:
        key = integrity.head_key_opaque(first[i])
        out[0, i] = integrity.head_key_ahead(key, 3)
        out[1, i] = integrity.head_key_ahead(key, 0)
        out[2, i] = integrity.head_key_ahead(key, 32)
        out[3, i] = integrity.head_key_ahead(key, 64)
        out[4, i] = integrity.head_key_ahead(key, 96)


@cuda.jit
def flat(first, out):  # 1-D out with a compile-time row stride, the loop kept
    i = cuda.grid(1)
    if i < first.shape[0]:
        key = integrity.head_key_opaque(first[i])
        out[i] = integrity.head_key_ahead(key, 3)
        for j in range(4):
            out[(1 + j) * N + i] = integrity.head_key_ahead(key, 32 * j)


@cuda.jit
def summed(first, out):  # the steps feeding a value, as the verify loops use them: one store
    i = cuda.grid(1)
    if i < first.shape[0]:
        key = integrity.head_key_opaque(first[i])
        total = integrity.head_key_ahead(key, 3)
        for j in range(4):
            total = integrity.head_add(total, integrity.head_term(first[i], integrity.head_key_ahead(key, 32 * j)))
        out[i] = total


@cuda.jit
def unhidden(first, out):  # as_tested with the key in plain sight (integrity.head_key)
    i = cuda.grid(1)
    if i < first.shape[0]:
        key = integrity.head_key(first[i])
        out[0, i] = integrity.head_key_ahead(key, 3)
        for j in range(4):
            out[1 + j, i] = integrity.head_key_ahead(key, 32 * j)


@cuda.jit
def minimal(first, out):  # no shuffle, no head key: a row-0 store, then a loop of row stores
    i = cuda.grid(1)
    if i < first.shape[0]:
        key = first[i] + np.uint32(5)
        out[0, i] = key
        for j in range(4):
            out[1 + j, i] = key


def main():
    from hexcore.host.checksum import head_term
    first = (np.arange(N, dtype=np.uint64) * 1000003 % (1 << 32)).astype(np.uint32)
    want = np.array([[(int(i) + n) * HEAD_K1 + HEAD_K2 & 0xFFFFFFFF for i in first] for n in (3, 0, 32, 64, 96)],
                    np.uint32)
    sums = np.array([(int(want[0, c]) + sum(head_term(int(first[c]) + 32 * j, int(first[c])) for j in range(4)))
                     & 0xFFFFFFFF for c in range(N)], np.uint32)
    for kernel, shape in ((as_tested, (16, N)), (straight, (16, N)), (flat, (16 * N,)), (summed, (N,)),
                          (unhidden, (16, N)), (minimal, (16, N))):
        out = cuda.to_device(np.zeros(shape, np.uint32))  # rows 5-15: where a wrong address lands
        kernel[1, N](first, out)
        got = out.copy_to_host().reshape(-1, N)
        if kernel is summed:
            print(f"{kernel.__name__:10s} sum right: {bool((got[0] == sums).all())}")
        elif kernel is minimal:
            print(f"{kernel.__name__:10s} rows 0-4 right: {[bool((got[r] == first + 5).all()) for r in range(5)]}, "
                  f"rows 5-15 written: {[r for r in range(5, 16) if got[r].any()]}")
        else:
            print(f"{kernel.__name__:10s} rows 0-4 right: {[bool((got[r] == want[r]).all()) for r in range(5)]}, "
                  f"rows 5-15 written: {[r for r in range(5, 16) if got[r].any()]}")
        if not hasattr(kernel, "inspect_asm"):  # (the simulator)
            continue
        ptx = next(iter(kernel.inspect_asm().values()))
        body = ptx[ptx.index("{", ptx.index(".entry")):]
        print("    " + "\n    ".join(line.strip() for line in body.splitlines()
                                     if any(op in line for op in ("st.global", "mul.lo.s64", "shl.b64", "shfl"))))
    if not hasattr(as_tested, "inspect_asm"):
        return
    from numba.cuda.cudadrv import nvvm
    print("NVVM", nvvm.NVVM().get_version())


if __name__ == "__main__":
    main()
