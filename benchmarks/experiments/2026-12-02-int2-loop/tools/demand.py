import sys, ast, collections
sys.path.insert(0, '/tmp/s13-int/tools')
from regions import run
from smsp_sim import unit
def demand(common, P={'hmma': 8, 'mufu': 8}):
    d = collections.Counter()
    for i in common:
        u, occ = unit(i, P)
        if u == 'fma': d['fma(H or L)'] += 1
        elif u: d[u] += occ
    return d
if __name__ == '__main__':
    common, _ = run(sys.argv[1], ast.literal_eval(sys.argv[2]), sys.argv[1])
    d = demand(common)
    print('   per warp-iteration pipe cycles (x4 warps per SMSP):', dict(d), 'issue', len(common))
