"""Which form of the head-key test kernel does the lent GPU's NVVM miscompile (forty-third
session)? The GPU twin of test_head_key_ahead_steps_the_word_index failed on an H100 with the
key through integrity.head_key_opaque (a shuffle): row 2 of its 2-D output read 0, as with
the forty-second session's inline-assembly move (rows 2-4 at rows 3, 6 and 10). Six forms of
the kernel, their rows right or wrong, and the PTX of their stores. On the CPU (`--cpu`:
CUDA 13.5's NVVM, `cuda.compile_ptx` for sm_90; output ahead_probe_cpu.txt) "minimal" --
no shuffle, no assembly, no head key: a store to row 0, then a loop storing rows 1-4 of a
2-D array whose row length is known only at run time -- gets wrong addresses (row 2 at 3
rows, row 3 at 6, row 4 at 10), while llvmlite's LLVM, optimizing and emitting PTX from the
same numba IR, stores every row at its place: the fault is NVVM's optimizer; a hidden key
is one trigger in the test's kernel ("unhidden" compiles right)."""
import sys

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
        print_stores(next(iter(kernel.inspect_asm().values())))
    if not hasattr(as_tested, "inspect_asm"):
        return
    from numba.cuda.cudadrv import nvvm
    print("NVVM", nvvm.NVVM().get_version())


def cpu():
    """``--cpu`` (no GPU: ptx_report's environment): NVVM's PTX stores of each form for sm_90,
    then "minimal" through llvmlite's own LLVM (O3, NVPTX) from the same numba IR."""
    import benchmarks.ptx_report  # noqa: F401  (a device stub for compiling without a GPU)
    import llvmlite.binding as llvm
    from numba import uint32
    from numba.cuda import compiler
    two, one = (uint32[::1], uint32[:, ::1]), (uint32[::1], uint32[::1])
    for kernel in (as_tested, straight, flat, summed, unhidden, minimal):
        sig = one if kernel in (flat, summed) else two
        ptx, _ = cuda.compile_ptx(kernel.py_func, sig, cc=(9, 0))
        print(kernel.py_func.__name__, "(NVVM)")
        print_stores(ptx)
    lib, _ = compiler._compile_pyfunc_with_fixup(minimal.py_func, two, debug=False, lineinfo=False, device=False,
                                                 fastmath=False, cc=(9, 0), opt=True, abi="numba", abi_info=None,
                                                 forceinline=False, launch_bounds=None, lto=False)
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    module = llvm.parse_assembly(lib.get_llvm_str())
    machine = llvm.Target.from_triple("nvptx64-nvidia-cuda").create_target_machine(cpu="sm_90", opt=3)
    builder = llvm.create_pass_builder(machine, llvm.create_pipeline_tuning_options(speed_level=3))
    builder.getModulePassManager().run(module, builder)
    print("minimal (llvmlite's LLVM", ".".join(map(str, llvm.llvm_version_info)) + ")")
    print_stores(machine.emit_assembly(module))
    from numba.cuda.cudadrv import nvvm
    print("NVVM", nvvm.NVVM().get_version())


OPS = ("st.global", "mul.lo.s64", "shl.b64", "add.s64", "mad.lo.s64", "shfl")  # the address arithmetic shown


def print_stores(ptx):
    body = ptx[ptx.index("{", ptx.index(".entry")):]
    print("    " + "\n    ".join(line.strip() for line in body.splitlines()
                                 if any(op in line for op in OPS)))


if __name__ == "__main__":
    cpu() if "--cpu" in sys.argv else main()
