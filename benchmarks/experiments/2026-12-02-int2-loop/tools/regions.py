import sys, collections, re
sys.path.insert(0, '/tmp/s13-int/tools')
from sass_ctl import parse, hot_loop, cls, simulate

def purpose(i):
    op, a = i['op'], i['args']
    base = op.split('.')[0]
    if base == 'LOP3' and ', 0xea,' in a: return 'unpack LOP3 (mask|0x6400)'
    if base == 'HFMA2' and re.search(r', -?\d+, -?\d+$', a.replace(' ', ' ')): return 'unpack HFMA2 (x*2^-e - 1024*2^-e)'
    if base == 'SHF' and 'SHF.R.U32.HI' in op and ', 0x8,' in a: return 'unpack SHF (>>8)'
    if base == 'SHF' and 'SHF.R.U32.HI' in op and ', 0x4,' in a: return 'unpack SHF (>>4)'
    if base == 'SHF' and 'SHF.R.U32.HI' in op and ', 0xc,' in a: return 'unpack SHF (>>12)'
    if base == 'HMUL2': return 'HMUL2 (q*s per block / p*s per k-step)'
    return cls(i)

def run(path, skip, label):
    insts = parse(open(path).read())
    loop = hot_loop(insts)
    common = [i for i in loop if not any(lo <= i['addr'] < hi for lo, hi in skip)]
    c = collections.Counter(purpose(i) for i in common)
    print(f'== {label}: static loop {len(loop)}, common path {len(common)}, stall sum {sum(max(1,i["stall"]) for i in common)}, single-warp model {simulate(common)} cycles')
    for k, v in sorted(c.items(), key=lambda kv: -kv[1]): print(f'   {v:4d} {k}')
    return common, c

if __name__ == '__main__':
    import ast
    run(sys.argv[1], ast.literal_eval(sys.argv[2]), sys.argv[1])
