"""Integer-pipe counts of the decode kernels' hot loops, plain and verify (forty-third
session): for each `*_verify.sass` in the dump folders given (``ptx_report --sass --verify
--dump DIR``), the verify and plain hot loops' sizes, their integer-pipe instructions
(LOP3, SHF, IADD3, compares, selects, moves: ncu's ``alu`` pipe, 2 cycles a warp
instruction) and IMADs, and what checking adds by issue slots and by the model
``max(size, 2 * integer-pipe)``. The folders were HEAD's kernels and hi.diff's (the
multiply-highs); output: sass-pipes.txt."""
import glob
import os
import sys

from benchmarks.sass_loop import hot_loop

ALU = {"LOP3", "LOP", "SHF", "IADD3", "ISETP", "LEA", "PRMT", "SEL", "FSEL", "FMNMX", "FSETP", "IMNMX", "VIMNMX",
       "MOV", "PLOP3", "P2R", "R2P", "SGXT", "BMSK", "IABS", "VIADD"}


def counts(path):
    loop = hot_loop(open(path).read())
    return loop.size, sum(n for op, n in loop.ops.items() if op in ALU), loop.ops.get("IMAD", 0)


for f in sorted(glob.glob(os.path.join(sys.argv[1], "*_verify.sass"))):
    name = os.path.basename(f)
    print(name[:-len("_verify.sass")])
    for d in sys.argv[1:]:
        (vs, va, vi), (ps, pa, _) = counts(os.path.join(d, name)), counts(os.path.join(d, name.replace("_verify", "")))
        print(f"   {d}: verify {vs} integer-pipe {va} IMAD {vi} | plain {ps} integer-pipe {pa} | "
              f"added: issue +{vs - ps}, model +{max(vs, 2 * va) - max(ps, 2 * pa)}")
