"""Thirty-second session (CPU): every backward branch enclosing at least 8 HMMA in the SASS
files given, with opcode counts (sass-loops.txt):

    PYTHONPATH=. python benchmarks/experiments/2026-12-04-s32/loops.py \
        /tmp/sassdump/grid4.sass /tmp/sassdump/slice4.sass
"""
import sys
from collections import Counter
from benchmarks import sass_loop
for path in sys.argv[1:]:
    text = open(path).read()
    ins = sass_loop.instructions(text)
    # (addr, op, target)
    addrs = [a for a, _, _ in ins]
    print(path)
    for a, op, t in ins:
        if t is not None and t <= a:
            body = [o for b, o, _ in ins if t <= b <= a]
            c = Counter(body)
            if c["HMMA"] >= 8:
                ops = ("HMMA", "LDS", "LOP3", "IMAD", "ISETP", "IADD3", "LDG", "BAR")
                counts = ", ".join(f"{op} {c[op]}" for op in ops)
                print(f"  loop {t:#x}..{a:#x}: {len(body)} instr, {counts}")
