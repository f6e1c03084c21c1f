import sys, ast
sys.path.insert(0, '/tmp/s13-int/tools')
from sass_ctl import parse, hot_loop
from smsp_sim import LAT
f, skip = sys.argv[1], ast.literal_eval(sys.argv[2])
marks = ast.literal_eval(sys.argv[3])
loop = hot_loop(parse(open(f).read()))
path = [i for i in loop if not any(a <= i['addr'] < b for a, b in skip)]
# single warp, no contention, two iterations; report time per segment in the 2nd iteration
t = 0; ready = [0]*6; prev = 0; first = True; times = []
for rep in range(2):
    for ins in path:
        if not first: t += max(1, prev)
        first = False
        for b in range(6):
            if ins['wait'] >> b & 1: t = max(t, ready[b])
        base = ins['op'].split('.')[0]
        if ins['wbar'] != 7: ready[ins['wbar']] = t + LAT.get(base, 6)
        if ins['rbar'] != 7: ready[ins['rbar']] = max(ready[ins['rbar']], t + 6)
        prev = ins['stall']
        if rep == 1: times.append((ins['addr'], t))
t0 = times[0][1]
bounds = sorted(marks.items(), key=lambda kv: kv[1])
for (name, lo), nxt in zip(bounds, bounds[1:] + [('end', 1 << 30)]):
    seg = [(a, tt) for a, tt in times if lo <= a < nxt[1]]
    if not seg: continue
    n = len(seg)
    print(f'  {name:34s} instr {n:4d}  starts at {seg[0][1]-t0:5d}  spans {seg[-1][1]-seg[0][1]+1:5d} cycles')
print('  total', times[-1][1] - t0)
