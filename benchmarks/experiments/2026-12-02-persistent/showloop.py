import sys, re
sys.path.insert(0, "/tmp/s13-pers")
from regions import hot
from loops import parse
pat = re.compile(sys.argv[2]) if len(sys.argv) > 2 else re.compile(r"LDL|STL|BRA|DEPBAR|LDGSTS|LDG\.|BAR|SHFL|ATOM")
ins = parse(sys.argv[1]); t, a, n, c = hot(ins)
print(f"hot loop 0x{t:x}..0x{a:x} n={n}")
for i, x in enumerate([x for x in ins if t <= x[0] <= a]):
    if pat.search(x[1]): print(f"{i:4d}: {x[3]}")
