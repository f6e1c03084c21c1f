import sys, ast
sys.path.insert(0, '/tmp/s13-int/tools')
from sass_ctl import parse, hot_loop
from regions import purpose
from smsp_sim import simulate
f, skip = sys.argv[1], ast.literal_eval(sys.argv[2])
issue_hi = int(sys.argv[3], 16)  # end of the issue section
loop = hot_loop(parse(open(f).read()))
common = [i for i in loop if not any(a <= i['addr'] < b for a, b in skip)]
fold = set()
def run(label, path):
    r = [simulate(path, P={'hmma': hm, 'mufu': 8})[0] / 12 for hm in (8, 16)]
    print(f'  {label:55s} instr {len(path):4d}  model cycles/round {r[0]:6.0f} (HMMA 8) {r[1]:6.0f} (HMMA 16)')
run('baseline', common)
run('no unpack HFMA2', [i for i in common if not purpose(i).startswith('unpack HFMA2')])
run('no unpack HFMA2 for values only (2nd half)', [i for i in common if not (purpose(i).startswith('unpack HFMA2') and i['addr'] > 0x4d00)])
iss = [i for i in common if i['addr'] < issue_hi and purpose(i).startswith('int addr')]
drop = set(id(i) for i in iss[:max(0, len(iss) - 20)])
run(f'issue address ops {len(iss)} -> 20', [i for i in common if id(i) not in drop])
movs = [i for i in common if purpose(i).startswith('MOV')]
run(f'no MOVs at all ({len(movs)})', [i for i in common if not purpose(i).startswith('MOV')])
both = [i for i in common if id(i) not in drop and not purpose(i).startswith('unpack HFMA2') and not purpose(i).startswith('MOV')]
run('all three', both)
