import re, sys
from collections import Counter
LINE = re.compile(r"/\*([0-9a-f]{4,6})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)([^;]*);")
TGT = re.compile(r"\bBRA(?:\.\w+)*\s+(?:`?\(?[\w.]*\)?,?\s*)?(0x[0-9a-f]+)")
def parse(path):
    ins = []
    for line in open(path):
        m = LINE.search(line)
        if m:
            t = TGT.search(line) if m.group(3) == "BRA" else None
            ins.append((int(m.group(1), 16), m.group(3), m.group(2) or "", m.group(0), int(t.group(1), 16) if t else None))
    return ins
def loops(ins):
    out = []
    for a, op, pred, txt, t in ins:
        if t is not None and t < a:
            body = [x for x in ins if t <= x[0] <= a]
            c = Counter(x[1] for x in body)
            out.append((t, a, len(body), c, bool(pred)))
    return out
if __name__ == "__main__":
    for p in sys.argv[1:]:
        ins = parse(p)
        tot = Counter(x[1] for x in ins)
        print(f"== {p}: {len(ins)} instr; STL {tot['STL']} LDL {tot['LDL']} HMMA {tot['HMMA']} BAR {tot['BAR']} ATOM {tot['ATOM']+tot['ATOMG']+tot['RED']} CS2R {tot['CS2R']} S2R {tot['S2R']} S2UR {tot['S2UR']} MEMBAR {tot['MEMBAR']}")
        for t, a, n, c, pr in loops(ins):
            if n > 20:
                print(f"  loop 0x{t:x}..0x{a:x} n={n} pred={pr} HMMA {c['HMMA']} STL {c['STL']} LDL {c['LDL']} LDG {c['LDG']} LDS {c['LDS']} LDGSTS {c['LDGSTS']} SHFL {c['SHFL']} BAR {c['BAR']} BRA {c['BRA']} MUFU {c['MUFU']}")
