"""The common path of a decode kernel's hot loop (``benchmarks.sass_loop.hot_loop``): the path
from the loop head to its back edge, forward edges only, with the most HMMA, then the most
LDGSTS, then the fewest instructions (so no rescale, no lazy-max trigger, no table refill).
``BRA.DIV`` (the divergent-shuffle fallback) counts as conditional.

    PYTHONPATH=. python benchmarks/experiments/2026-12-02-decode-g8/common_path.py K.sass [--ops]

(``K.sass``: ``cuobjdump --dump-sass`` of one kernel, e.g. from ``ptx_report --sass --dump``.)"""
import re, sys
from collections import Counter
from benchmarks.sass_loop import hot_loop
LINE = re.compile(r"/\*([0-9a-f]{4,6})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)([^;]*);")
TGT = re.compile(r"(0x[0-9a-f]+)")
def parse(text):
    out = []
    for line in text.splitlines():
        m = LINE.search(line)
        if m:
            op = m.group(3); tgt = None
            if op in ("BRA",):
                t = TGT.findall(m.group(4)); tgt = int(t[-1], 16) if t else None
            out.append((int(m.group(1), 16), op, bool(m.group(2)) or m.group(4).startswith(".DIV"), tgt, line.strip()))
    return out
def common(text):
    loop = hot_loop(text)
    ins = [i for i in parse(text) if loop.start <= i[0] <= loop.end]
    addrs = [i[0] for i in ins]; idx = {a: k for k, a in enumerate(addrs)}
    n = len(ins)
    # best[k] = best (hmma, ldgsts, -count, ops) reaching end from instruction k (inclusive)
    NEG = None
    best = [NEG] * (n + 1)
    def add(score, op):
        h, g, c, ops = score
        ops = ops + Counter({op: 1})
        return (h + (op == "HMMA"), g + (op == "LDGSTS"), c - 1, ops)
    for k in range(n - 1, -1, -1):
        a, op, pred, tgt, _ = ins[k]
        cands = []
        if k == n - 1:  # the back edge
            cands.append((0, 0, 0, Counter()))
        else:
            if op == "BRA" and tgt is not None:
                if tgt in idx and tgt > a and best[idx[tgt]] is not None:
                    cands.append(best[idx[tgt]])
                if pred and best[k + 1] is not None:
                    cands.append(best[k + 1])
            elif op in ("EXIT", "RET"):
                pass
            elif best[k + 1] is not None:
                cands.append(best[k + 1])
        if cands:
            s = max(cands, key=lambda s: s[:3])
            best[k] = add(s, op)
    return loop, best[0]
if __name__ == "__main__":
    loop, s = common(open(sys.argv[1]).read())
    print(f"{sys.argv[1].split('/')[-1]}: static {loop.size}; common path {-s[2]} instr, HMMA {s[0]}, LDGSTS {s[1]}")
    if "--ops" in sys.argv:
        print("   ", ", ".join(f"{o} {c}" for o, c in s[3].most_common(16)))
