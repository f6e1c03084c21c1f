import sys, re
sys.path.insert(0, "/tmp/s13-pers")
from regions import hot
from loops import parse
for p in sys.argv[1:]:
    ins = parse(p); t, a, n, c = hot(ins)
    body = [x[3] for x in ins if t <= x[0] <= a]
    urs = set(re.findall(r"\bUR(\d+)\b", " ".join(body)))
    uops = sum(1 for b in body if re.search(r"\*/\s+(@!?U?P\w+\s+)?U[A-Z]", b))
    print(f"{p}: loop n={n} distinct UR {len(urs)} uniform-datapath instrs {uops}; R2UR total {sum(1 for x in ins if x[1]=='R2UR')}, in loop {sum(1 for b in body if 'R2UR' in b)}")
