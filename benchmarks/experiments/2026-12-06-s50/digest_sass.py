"""What the tensor-core head digest would cost in SASS, counted on the CPU (issue 14).

Not part of hexcore. Three kernels per stage size (one warp's ring stage of a checked block:
INT4 D=128 BS=32 1216 words, INT2 704), compiled for sm_90 at a cap of 128 registers and
counted with cuobjdump (`benchmarks.ptx_report.ptxas`):

- ``base``: each of 4 warps copies its stage (and the weight table) from global into shared
  memory and writes a result word; no digest.
- ``current``: ``base`` plus hexcore's head digest of the stage as the decode kernel's verify
  path computes it (``chunk_terms``: lane p takes words p, p + 32, ...; ``head_term`` of each;
  ``warp_sum_u32``; lane 0 compares with the recorded digest).
- ``dense``: ``base`` plus the dense digest of ``dense_digest.py``: per 128-word step one
  16-byte shared load of the lane's 4 words (A), one 8-byte shared load of its weights (B),
  one ``mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32``; then the 4 accumulator entries a
  lane through ``head_term`` with their keys, ``warp_sum_u32``, the compare.

``dense``'s steps are unrolled (compile-time sizes): its static count is what a warp issues.
``current``'s word loop stays rolled, so its count is taken as the static count with that
loop's body once per trip. ``current - base`` and ``dense - base`` are then the two digests'
instructions a lane for one checked block. Run (numba-cuda with ptxas and cuobjdump on PATH, no GPU):
``PYTHONPATH=. python benchmarks/experiments/2026-12-06-s50/digest_sass.py``.
"""

import re
import shutil
import subprocess
import tempfile
import os

import benchmarks.ptx_report  # noqa: F401 (first: the simulator off, a stand-in device for compile_ptx)
from llvmlite import ir
from numba import cuda, types, uint32
from numba.cuda.extending import intrinsic

from benchmarks.sass_loop import hot_loop
from hexcore.cuda.device import load_u32x2, load_u32x4, ld
from hexcore.cuda.integrity import head_add, head_key, head_key_ahead, head_key_opaque, head_term, warp_sum_u32

WARPS, STEP = 4, 128


@intrinsic
def imma(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    sig = types.UniTuple(types.uint32, 4)(*([types.uint32] * 10))

    def codegen(context, builder, sig, args):
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.LiteralStructType([i32] * 4), [i32] * 10)
        out = builder.call(ir.InlineAsm(fnty, "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 "
                                        "{$0,$1,$2,$3}, {$4,$5,$6,$7}, {$8,$9}, {$10,$11,$12,$13};",
                                        ",".join(["=r"] * 4 + ["r"] * 10)), list(args))
        return context.make_tuple(builder, sig.return_type, [builder.extract_value(out, k) for k in range(4)])

    return sig, codegen


def kernels(words):
    steps = -(-words // STEP)
    stage_words = steps * STEP  # padded with zeros to whole steps in shared memory
    weight_words = steps * 64
    ring_len, wt_len = WARPS * stage_words, WARPS * weight_words  # (shared arrays want plain constants)

    @cuda.jit(device=True, inline=True)
    def fill(src, weights, ring, wt, lane, warp):
        for j in range(lane, stage_words, 32):
            ring[warp * stage_words + j] = src[warp * stage_words + j] if j < words else uint32(0)
        for j in range(lane, weight_words, 32):
            wt[warp * weight_words + j] = weights[j]
        cuda.syncwarp()

    @cuda.jit(device=True, inline=True)
    def no_digest(ring, wt, warp, lane):
        return uint32(0)

    @cuda.jit(device=True, inline=True)
    def current_digest(ring, wt, warp, lane):
        at = warp * stage_words
        key = head_key_opaque(lane)
        total = uint32(0)
        for j in range(-(-words // 32)):
            if words % 32 == 0 or lane + 32 * j < words:
                total = head_add(total, head_term(ld(ring, at + lane + 32 * j), head_key_ahead(key, 32 * j)))
        return warp_sum_u32(total)

    @cuda.jit(device=True, inline=True)
    def dense_digest(ring, wt, warp, lane):
        at, wat = warp * stage_words + 4 * lane, warp * weight_words + 2 * lane
        c0 = c1 = c2 = c3 = uint32(0)
        for s in range(steps):
            a0, a1, a2, a3 = load_u32x4(ring, at + STEP * s)
            b0, b1 = load_u32x2(wt, wat + 64 * s)
            c0, c1, c2, c3 = imma(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3)
        key = head_key_opaque(2 * lane)  # entries 2 lane, 2 lane + 1, 2 lane + 64, 2 lane + 65
        total = head_add(head_term(c0, key), head_term(c1, head_key_ahead(key, 1)))
        total = head_add(total, head_add(head_term(c2, head_key_ahead(key, 64)), head_term(c3, head_key_ahead(key, 65))))
        return warp_sum_u32(total)

    def test_kernel(digest):
        # each warp fills its stage and the weights, digests the stage, and lane 0 writes the
        # digest against the recorded one (with a word of each array, so no fill is dead code)
        @cuda.jit
        def kernel(src, weights, recorded, out):
            ring = cuda.shared.array(ring_len, uint32)
            wt = cuda.shared.array(wt_len, uint32)
            lane, warp = cuda.threadIdx.x % 32, cuda.threadIdx.x // 32
            fill(src, weights, ring, wt, lane, warp)
            total = digest(ring, wt, warp, lane)
            if lane == 0:
                out[warp] = (total ^ recorded[warp]) ^ ld(ring, warp * stage_words + 7) ^ ld(wt, warp * weight_words + 3)

        return kernel

    return {"base": test_kernel(no_digest), "current": test_kernel(current_digest), "dense": test_kernel(dense_digest)}


SIG = (types.uint32[::1], types.uint32[::1], types.uint32[::1], types.uint32[::1])


def sass_count(kernel):
    ptx, _ = cuda.compile_ptx(kernel.py_func, SIG, cc=(9, 0))
    with tempfile.TemporaryDirectory() as tmp:
        src, obj = os.path.join(tmp, "k.ptx"), os.path.join(tmp, "k.cubin")
        with open(src, "w") as f:
            f.write(re.sub(r"^\.version .*$", ".version 9.0", ptx, flags=re.MULTILINE))
        res = subprocess.run(["ptxas", "-arch=sm_90", "-O3", "-v", "-maxrregcount", "128", src, "-o", obj],
                             capture_output=True, text=True)
        if res.returncode:
            raise RuntimeError(res.stderr[-800:])
        regs = re.search(r"Used (\d+) registers", res.stderr).group(1)
        text = subprocess.run(["cuobjdump", "--dump-sass", obj], capture_output=True, text=True).stdout
    ops = re.findall(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", text, re.MULTILINE)
    kinds = {k: sum(1 for o in ops if o.startswith(k)) for k in ("IMMA", "LDS", "IMAD", "SHF", "LOP3", "IADD3",
                                                                  "SHFL")}
    return len(ops), int(regs), kinds, hot_loop(text, "LDS")


def executed(words, name, count, loop):
    """Instructions one warp issues: the static count, with a digest loop that LLVM kept
    rolled (``current``: one shared load a word, ``ceil(words / 32)`` words a lane) counted
    once per trip (its body's LDS count is the words a trip takes)."""
    if name != "current" or loop is None:
        return count
    trips = -(-words // 32) / loop.ops["LDS"]
    return round(count - loop.size + loop.size * trips)


def main():
    assert shutil.which("ptxas") and shutil.which("cuobjdump"), "ptxas and cuobjdump on PATH"
    for name, words in (("INT4 D=128 BS=32", 1216), ("INT2 D=128 BS=32", 704)):
        counts = {k: sass_count(v) for k, v in kernels(words).items()}
        base = counts["base"][0]
        print(f"{name}: {words} words a head, {-(-words // STEP)} mma steps")
        for k, (n, regs, kinds, loop) in counts.items():
            run = executed(words, k, n, loop)
            rolled = f" (a rolled loop of {loop.size}: {dict(loop.ops.most_common(6))})" if run != n else ""
            extra = "" if k == "base" else f"; executed a warp {run}, {run - base:+d} over base"
            print(f"  {k:8s} {n:5d} SASS static, {regs} registers{extra}{rolled}; {kinds}")


if __name__ == "__main__":
    main()
