"""On a GPU: what the driver compiled for the INT2 decode kernels at D=128, block 32, value
groups of 64, 32 and 16 (plain and verify): shared memory per block and registers, or the
error. The CPU's ptxas (CUDA 13, sm_90) refuses the 32 and 16 ones for more than 48 KB of
static shared memory (fifty-second session, NEXT.md item 5).

    PYTHONPATH=. python3 benchmarks/experiments/2026-12-06-s52/smem_probe.py
"""
import numba.cuda.dispatcher as dispatcher
from numba import cuda

current_device = dispatcher.get_current_device
from benchmarks.ptx_report import DECODE_SIG, VERIFY_SIG  # noqa: E402 (the kernels' argument types)
dispatcher.get_current_device = current_device  # (ptx_report fakes the device for a CPU machine)
from hexcore.cuda.attention.kernel import decode_kernel, ring_words  # noqa: E402
from hexcore.cuda.attention.shape import DecodeShape

print(cuda.get_current_device().name, flush=True)
for gs in (64, 32, 16):
    shape = DecodeShape(2, 8, 128, 32, 4, gs)
    for verify in (False, True):
        kernel = decode_kernel(shape, verify=verify)
        try:
            compiled = kernel.compile(VERIFY_SIG if verify else DECODE_SIG)
            got = f"shared {compiled.shared_mem_per_block} B, {compiled.regs_per_thread} registers"
        except Exception as exc:  # what the driver or the linker said
            got = f"{type(exc).__name__}: {str(exc)[:300]}"
        print(f"INT2 D=128 BS=32 GS={gs} {'verify' if verify else 'plain'}: ring {4 * ring_words(shape)} B; {got}",
              flush=True)
