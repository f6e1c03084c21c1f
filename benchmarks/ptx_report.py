"""Compile the decode kernel to PTX and SASS on a CPU machine: registers, spills, loads, mma,
and the hot loop's size and opcodes (``sass_loop``); with ``--seal``, the quantizing seal
kernels instead (plain and with fitted keys).

    python -m benchmarks.ptx_report [--sass] [--dump DIR] [--only BITS,D,BS,G] [--verify] [--prefetch MODE]
    python -m benchmarks.ptx_report --seal
    python -m benchmarks.ptx_report --persistent [--dump DIR] [--only BITS,D,BS,G] [--count-items]
    python -m benchmarks.ptx_report --tiered [--only BITS,D,BS,G]

Each plain decode kernel's line, and each kernel's line of ``--persistent``'s caps, ends with
the shared memory it declares beside its ring against ``kernel.BESIDE_RING`` (a hand-counted
bound, which the verify kernel's weight table is sized by): "EXCEEDS" means the count is short.

``--prefetch MODE``: the decode kernels built with ``DecodeOptions.l2_prefetch`` MODE
("quantized", "all"; "none" by default).

``--verify``: each shape's line is followed by one for the decode kernel's verify variant
(``decode_kernel(verify=True)``: sampled blocks checked against their head digests); with
``--sass``, then by what the variant's hot loop adds to the plain one's, by opcode.

``--persistent``: the persistent slice kernel (``persistent_kernels.persistent_kernel``, item
inlined, at the grid kernel's register cap) instead, FP16/INT4/INT2 at D=128, block 32, group 4 by
default: its registers and spills, and the slice's own cost (``benchmarks.sass_slice``):
atomics, fences and barriers in the whole kernel, and the instructions before the first
item and after the last one; then, capped at 128 and uncapped, the registers and spills of
the slice kernel, the one-launch call's kernel (``persistent_kernels.oneshot_kernel``) and the
grid kernel.

``--tiered``: a format by age's pool kernels (``tiered_kernels.py``) at D=128, block 32, group
4 by default, capped at 128 registers and uncapped: the partials kernel a merge launch
follows, and ``pool_kernel`` first, middle and last (merging): registers and spills; then
``one_launch_kernel`` of int4-aged's pools (INT4, FP16) and int2-aged's (INT2, FP16, INT4)
at that D, block and group, capped at 128, at ``tiered.ONE_LAUNCH_UNCAPPED`` and uncapped, as
"one" and as "packed" (each CTA running its slots in turn): registers, spills, shared memory
and SASS.

Needs numba-cuda's NVVM (``numba-cuda[cu13]``) and, for registers and SASS, ptxas and
cuobjdump on PATH (Triton's wheel carries cuobjdump; or pip ``nvidia-cuda-nvcc``,
``nvidia-cuda-cuobjdump`` and ``nvidia-cuda-nvdisasm``, whose cuobjdump needs nvdisasm beside
it and prints no SASS without it). No GPU is used: the compute capability is fixed at 9.0
(H100/H200).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import types as pytypes

os.environ["NUMBA_ENABLE_CUDASIM"] = "0"

import numba.cuda.dispatcher as _dispatcher  # noqa: E402
from numba import cuda, types  # noqa: E402

# device functions ask the current device for its compute capability; there is none here
_dispatcher.get_current_device = lambda: pytypes.SimpleNamespace(compute_capability=(9, 0))

from hexcore.cuda.attention.kernel import BESIDE_RING, GRID_REGISTERS, decode_kernel, ring_words  # noqa: E402
from benchmarks.sass_loop import describe, difference, hot_loop  # noqa: E402
from hexcore.cuda.attention.shape import DecodeShape  # noqa: E402

U32, I32, I64, F32 = types.uint32[::1], types.int32[::1], types.int64, types.float32[::1]
DECODE_SIG = (U32, I64, I64, I64, I64, I64, I64, U32, types.int32[:, ::1], I32, I32, types.float16[::1], F32, F32,
              I32, I64, I64, I64, I64, I64, types.float32)
VERIFY_SIG = DECODE_SIG + (types.uint32[:, :, ::1], I32, U32, types.int32[:, ::1])  # head_sums, vctl, flags, found
SHAPES = [(16, 128, 32, 1), (16, 128, 32, 4), (16, 128, 16, 8), (16, 64, 32, 1),
          (4, 128, 32, 1), (4, 128, 32, 4), (4, 128, 16, 8), (4, 64, 32, 3),
          (2, 128, 32, 4), (2, 128, 64, 8), (2, 64, 16, 1)]


PERSISTENT_SIG = DECODE_SIG + (types.int64[::1], types.int64[::1], I32, I64, I64, I64)  # state, log, counts, ...
PERSISTENT_SHAPES = [(16, 128, 32, 4), (4, 128, 32, 4), (2, 128, 32, 4)]


def ptx_of(shape: DecodeShape, verify: bool = False, l2_prefetch: str = "none") -> str:
    kernel = decode_kernel(shape, l2_prefetch=l2_prefetch, verify=verify).py_func
    ptx, _ = cuda.compile_ptx(kernel, VERIFY_SIG if verify else DECODE_SIG, cc=(9, 0))
    return ptx


def ptxas(ptx: str, sass: bool = False, dump: str | None = None, name: str = "k", cap: int = GRID_REGISTERS,
          loops: list | None = None) -> str:
    """ptxas -v resource usage (and SASS instruction counts when ``sass``) for one PTX module
    compiled with the register cap ``cap`` (the decode kernel's by default); with ``sass``,
    the hot loop (``sass_loop.HotLoop``, or None) is also appended to ``loops`` if given."""
    if not shutil.which("ptxas"):
        return "ptxas not found"
    with tempfile.TemporaryDirectory() as tmp:
        src, obj = os.path.join(tmp, "k.ptx"), os.path.join(tmp, "k.cubin")
        with open(src, "w") as f:  # this NVVM may be newer than ptxas: claim the PTX ISA ptxas knows
            f.write(re.sub(r"^\.version .*$", ".version 9.0", ptx, flags=re.MULTILINE))
        res = subprocess.run(["ptxas", "-arch=sm_90", "-O3", "-v", "-maxrregcount", str(cap), src, "-o", obj],
                             capture_output=True, text=True)
        info = " ".join(l.split("info    : ")[-1] for l in res.stderr.splitlines() if "Used" in l or "spill" in l)
        if sass and res.returncode == 0 and shutil.which("cuobjdump"):
            dump_text = subprocess.run(["cuobjdump", "--dump-sass", obj], capture_output=True, text=True).stdout
            ops = re.findall(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", dump_text, re.MULTILINE)
            count = {k: sum(1 for o in ops if o.startswith(k)) for k in ("HMMA", "LDG", "LOP3", "HFMA2", "SHFL",
                                                                         "LDL", "STL", "BAR")}
            info += " | SASS " + ", ".join(f"{k} {v}" for k, v in count.items()) + f", total {len(ops)}"
            loop = hot_loop(dump_text)
            info += " | " + describe(loop)
            if loops is not None:
                loops.append(loop)
            if dump:
                with open(os.path.join(dump, f"{name}.sass"), "w") as f:
                    f.write(dump_text)
        return info if res.returncode == 0 else res.stderr[-500:]


def beside_ring(info: str, shape: DecodeShape) -> str:
    """The static shared memory a kernel of ``shape`` declares beside its ring (ptxas's
    ``smem`` in ``info`` less the ring's bytes), against ``kernel.BESIDE_RING``, the hand-counted
    bound the verify kernel's weight table is sized with (``kernel.TABLED``); "EXCEEDS" where
    the count is short."""
    found = re.search(r"(\d+) bytes smem", info)
    if not found:
        return "beside the ring: no smem figure"
    beside = int(found.group(1)) - 4 * ring_words(shape)
    return f"beside the ring {beside} B of BESIDE_RING {BESIDE_RING}" + (" EXCEEDS" if beside > BESIDE_RING else "")


def report(sass: bool = False, dump: str | None = None, only: str | None = None, verify: bool = False,
           l2_prefetch: str = "none") -> None:
    """One line per shape of SHAPES (or only ``only``, "bits,head_dim,block_size,group"); with
    ``verify``, one more per shape for the verify variant, and with ``sass`` too, what its hot
    loop adds to the plain one's (``sass_loop.difference``); ``l2_prefetch``: the kernels'
    DecodeOptions.l2_prefetch."""
    shapes = [tuple(int(x) for x in only.split(","))] if only else SHAPES
    for bits, head_dim, block_size, group in shapes:
        shape = DecodeShape(bits, 8, head_dim, block_size, group, 64)
        loops = []
        for variant in (False, True) if verify else (False,):
            ptx = ptx_of(shape, variant, l2_prefetch)
            name = f"decode_b{bits}_d{head_dim}_bs{block_size}_g{group}" + ("_verify" if variant else "")
            if dump:
                os.makedirs(dump, exist_ok=True)
                with open(os.path.join(dump, f"{name}.ptx"), "w") as f:
                    f.write(ptx)
            info = ptxas(ptx, sass, dump, name, loops=loops)
            ring = "" if variant else f" | {beside_ring(info, shape)}"  # (verify: its table beside it too)
            print(f"decode{' verify' if variant else ''} bits={bits:2} D={head_dim} BS={block_size} G={group}: "
                  f"mma {ptx.count('mma.sync')}, v4 loads {ptx.count('ld.global.v4')}, local {ptx.count('.local')}, "
                  f"cvt.s64 {ptx.count('cvt.rn.f32.s64')} | {info}{ring}", flush=True)
        if len(loops) == 2:
            print(f"    verify's hot loop against the plain one: {difference(*loops)}", flush=True)


def persistent_report(dump: str | None = None, only: str | None = None, count_items: bool = False) -> None:
    """One line per shape of PERSISTENT_SHAPES (or ``only``): the persistent slice kernel's
    registers and spills, then its slice cost (``sass_slice.describe``); then, at a cap of
    128 and uncapped, the registers and spills of the slice kernel, the one-launch call's
    kernel (``persistent_kernels.oneshot_kernel``) and the grid kernel (all three dependent, as
    launched by default)."""
    from benchmarks.sass_slice import describe as describe_slice, slice_cost
    from hexcore.cuda.attention.persistent_kernels import persistent_kernel

    shapes = [tuple(int(x) for x in only.split(","))] if only else PERSISTENT_SHAPES
    for bits, head_dim, block_size, group in shapes:
        shape = DecodeShape(bits, 8, head_dim, block_size, group, 64)
        kernel = persistent_kernel.__wrapped__(shape, None, "none", True, count_items, "inline").py_func
        ptx, _ = cuda.compile_ptx(kernel, PERSISTENT_SIG, cc=(9, 0))
        name = f"persistent_b{bits}_d{head_dim}_bs{block_size}_g{group}" + ("_counted" if count_items else "")
        with tempfile.TemporaryDirectory() as tmp:
            where = dump or tmp
            os.makedirs(where, exist_ok=True)
            info = ptxas(ptx, True, where, name)
            with open(os.path.join(where, f"{name}.sass")) as f:
                sass = f.read()
        print(f"persistent bits={bits:2} D={head_dim} BS={block_size} G={group}: {info.split(' | ')[0]}\n"
              f"    {describe_slice(slice_cost(sass))}", flush=True)
        one_launch_lines(shape, count_items)


def one_launch_lines(shape: DecodeShape, count_items: bool) -> None:
    """Registers and spills of the slice kernel, the one-launch kernel and the grid kernel of
    ``shape``, at a cap of 128 and uncapped."""
    from hexcore.cuda.attention.launcher import UNCAPPED_REGISTERS
    from hexcore.cuda.attention.persistent_kernels import oneshot_kernel, persistent_kernel

    for cap in (GRID_REGISTERS, UNCAPPED_REGISTERS):
        kernels = (("slice", persistent_kernel.__wrapped__(shape, cap, "none", True, count_items, "inline", True),
                    PERSISTENT_SIG),
                   ("one launch", oneshot_kernel.__wrapped__(shape, cap, "none", True, count_items, True),
                    PERSISTENT_SIG),
                   ("grid", decode_kernel(shape, cap, dependent=True), DECODE_SIG))
        for name, kernel, sig in kernels:
            ptx, _ = cuda.compile_ptx(kernel.py_func, sig, cc=(9, 0))
            info = ptxas(ptx, cap=cap).split(' | ')[0]
            print(f"    cap {cap} {name:10}: {info} | {beside_ring(info, shape)}", flush=True)


def tiered_report(only: str | None = None) -> None:
    """One line per (shape, register cap, kernel): a format by age's pool kernels' registers
    and spills, then the one-launch kernels of int4-aged and int2-aged at the first shape's
    D, block and group: registers, spills, shared memory and SASS (``--tiered``)."""
    from hexcore.cuda.attention.launcher import UNCAPPED_REGISTERS
    from hexcore.cuda.attention.tiered import ONE_LAUNCH_UNCAPPED
    from hexcore.cuda.attention.tiered_kernels import one_launch_kernel, pool_kernel

    shapes = [tuple(int(x) for x in only.split(","))] if only else PERSISTENT_SHAPES
    for bits, head_dim, block_size, group in shapes:
        shape = DecodeShape(bits, 8, head_dim, block_size, group, 64)
        for cap in (GRID_REGISTERS, UNCAPPED_REGISTERS):
            kernels = {"partials": (decode_kernel(shape, cap, partials=True, dependent=True), DECODE_SIG)}
            for name, first, last in (("first", True, False), ("middle", False, False), ("last", False, True)):
                kernel = pool_kernel(shape, cap, "none", True, True, first, last)
                kernels[f"pool {name}"] = (kernel, DECODE_SIG + (I32,))
            for name, (kernel, sig) in kernels.items():
                ptx, _ = cuda.compile_ptx(kernel.py_func, sig, cc=(9, 0))
                print(f"tiered bits={bits:2} D={head_dim} BS={block_size} G={group} cap {cap} {name:12}: "
                      f"{ptxas(ptx, cap=cap)}", flush=True)
    head_dim, block_size, group = shapes[0][1:]
    for name, bits in (("int4-aged", (4, 16)), ("int2-aged", (2, 16, 4))):
        pools = tuple(DecodeShape(b, 8, head_dim, block_size, group, 64) for b in bits)
        for cap in (GRID_REGISTERS, ONE_LAUNCH_UNCAPPED, UNCAPPED_REGISTERS):
            for packed in (False, True):
                kernel = one_launch_kernel(pools, cap, "none", True, True, packed)
                ptx, _ = cuda.compile_ptx(kernel.py_func, ONE_LAUNCH_SIG, cc=(9, 0))
                print(f"tiered {name} D={head_dim} BS={block_size} G={group} cap {cap} "
                      f"{'packed' if packed else 'one launch'}: {ptxas(ptx, sass=True, cap=cap)}", flush=True)


# one_launch_kernel's: pool a's partials arguments, seq_lens, n_a, n_b, then two pools' own
# (pool, k_codes..v_tails, block_tables, pool_lens, part_o, part_ml, num_blocks, max_seqs, split_blocks)
ONE_POOL_SIG = (U32, I64, I64, I64, I64, I64, I64, types.int32[:, ::1], I32, F32, F32, I64, I64, I64)
ONE_LAUNCH_SIG = DECODE_SIG + (I32, I64, I64) + ONE_POOL_SIG * 2


SEAL_SIG = (U32, U32, U32, U32, types.float16[::1], types.float16[::1], I32, I32, I64, I64, I64,
            types.int32[:, ::1], I64, I64)


def seal_report() -> None:
    """Registers and spills of the quantizing seal (H=8, D=128, BS=32, group 64, from tails)
    for INT4 and INT2, plain and (INT2) with fitted keys, at the seal's register cap."""
    from hexcore import KVCacheConfig
    from hexcore.cuda.write import SEAL_REGISTERS, _seal_quantized_kernel

    for dtype, fitted in (("int4", False), ("int2", False), ("int2", True)):
        cfg = KVCacheConfig(num_layers=1, num_kv_heads=8, head_dim=128, block_size=32, kv_dtype=dtype)
        ptx, _ = cuda.compile_ptx(_seal_quantized_kernel(cfg, fitted=fitted).py_func, SEAL_SIG, cc=(9, 0))
        print(f"seal {dtype}{' fitted keys' if fitted else ''}: {ptxas(ptx, cap=SEAL_REGISTERS)}", flush=True)


if __name__ == "__main__":
    def _arg(flag):
        return sys.argv[sys.argv.index(flag) + 1] if flag in sys.argv else None
    if "--seal" in sys.argv:
        seal_report()
    elif "--tiered" in sys.argv:
        tiered_report(only=_arg("--only"))
    elif "--persistent" in sys.argv:
        persistent_report(dump=_arg("--dump"), only=_arg("--only"), count_items="--count-items" in sys.argv)
    else:
        report(sass="--sass" in sys.argv, dump=_arg("--dump"), only=_arg("--only"), verify="--verify" in sys.argv,
               l2_prefetch=_arg("--prefetch") or "none")
