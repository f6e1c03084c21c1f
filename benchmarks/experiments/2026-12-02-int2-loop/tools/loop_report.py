import sys, collections
sys.path.insert(0, '/tmp/s13-int/tools')
from sass_ctl import parse, hot_loop, cls, simulate

def report(path, skip_ranges=(), show_branches=True, label=''):
    insts = parse(open(path).read())
    loop = hot_loop(insts)
    print(f'== {label or path}: loop 0x{loop[0]["addr"]:x}..0x{loop[-1]["addr"]:x}, {len(loop)} static')
    if show_branches:
        for ins in loop:
            if ins['op'].startswith('BRA') or ins['op'] in ('BSSY',):
                print('   ', hex(ins['addr']), ins['pred'], ins['op'], ins['args'])
    def skipped(a):
        return any(lo <= a < hi for lo, hi in skip_ranges)
    common = [i for i in loop if not skipped(i['addr'])]
    c = collections.Counter(cls(i) for i in common)
    print(f'   common path: {len(common)} instructions; sum of stall fields {sum(max(1,i["stall"]) for i in common)}; model single-warp cycles {simulate(common)}')
    for k, v in sorted(c.items(), key=lambda kv: -kv[1]):
        print(f'     {v:4d}  {k}')
    return common

if __name__ == '__main__':
    report(sys.argv[1])
