import sys, ast, collections
sys.path.insert(0, '/tmp/s13-int/tools')
from sass_ctl import parse, hot_loop
from regions import purpose
def seg(path, segs, skip):
    insts = parse(open(path).read()); loop = hot_loop(insts)
    for name, lo, hi in segs:
        body = [i for i in loop if lo <= i['addr'] < hi and not any(a <= i['addr'] < b for a, b in skip)]
        c = collections.Counter(purpose(i) for i in body)
        print(f'  {name:28s} {len(body):4d}: ' + ', '.join(f'{k.split(" (")[0]} {v}' for k, v in c.most_common(8)))
if __name__ == '__main__':
    seg(sys.argv[1], ast.literal_eval(sys.argv[2]), ast.literal_eval(sys.argv[3]))
