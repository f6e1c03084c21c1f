"""Common path of the hot loop with rare regions (table refill: contains LDG; rescale: >= 20 FMUL) removed automatically."""
import sys, collections
sys.path.insert(0, '/tmp/s13-int/tools')
from sass_ctl import parse, hot_loop, TGT
from regions import purpose
from smsp_sim import simulate, simulate_reasons

def common_path(path):
    loop = hot_loop(parse(open(path).read()))
    rare = []
    for ins in loop:
        if ins['op'].startswith('BRA') and ins['pred'] and not ins['op'].startswith('BRA.DIV'):
            tgt = int(TGT.search(ins['args']).group(1), 16)
            if tgt <= ins['addr']: continue
            body = [i for i in loop if ins['addr'] < i['addr'] < tgt]
            ops = collections.Counter(i['op'].split('.')[0] for i in body)
            if ops['LDG'] or ops['FMUL'] >= 20:
                rare.append((ins['addr'] + 16, tgt))
    # keep the smallest rare regions only (a refill region nested in an issue region)
    rare = [r for r in rare if not any(o != r and o[0] >= r[0] and o[1] <= r[1] for o in rare)]
    return [i for i in loop if not any(a <= i['addr'] < b for a, b in rare)], loop, rare

def summary(path, label=None, detail=False):
    c, loop, rare = common_path(path)
    cnt = collections.Counter(purpose(i) for i in c)
    m8 = simulate(c, P={'hmma': 8, 'mufu': 8})[0] / 12
    m16 = simulate(c, P={'hmma': 16, 'mufu': 8})[0] / 12
    print(f'{label or path}: static {len(loop)}, per-block common path {len(c)}, rare {[(hex(a), hex(b)) for a, b in rare]}, '
          f'model cycles per 4-warp round {m8:.0f} (HMMA 8) / {m16:.0f} (HMMA 16)')
    if detail:
        for k, v in sorted(cnt.items(), key=lambda kv: -kv[1]): print(f'     {v:4d} {k}')
    return c, cnt

if __name__ == '__main__':
    for p in sys.argv[1:]:
        summary(p, detail=True)
