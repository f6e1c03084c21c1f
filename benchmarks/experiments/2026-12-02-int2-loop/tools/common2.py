import sys, collections, pickle; sys.path.insert(0,'/tmp/s13-int/tools')
from sass_ctl import parse, hot_loop, TGT
from regions import purpose
from smsp_sim import simulate
def common(f, exclude=None, lazy=False):
    l = hot_loop(parse(open(f).read()))
    keep = [i for i in l if not (exclude and exclude[0] <= i['addr'] < exclude[1])]
    rare=[]
    for ins in keep:
        if ins['op'].startswith('BRA') and ins['pred'] and not ins['op'].startswith('BRA.DIV'):
            tgt=int(TGT.search(ins['args']).group(1),16)
            if tgt<=ins['addr']: continue
            body=[i for i in keep if ins['addr']<i['addr']<tgt]
            ops=collections.Counter(i['op'].split('.')[0] for i in body)
            if ops['LDG'] or ops['FMUL']>=20 or (lazy and ops['SHFL'] >= 6 and not ops['HMMA']): rare.append((ins['addr']+16,tgt))
    rare=[r for r in rare if not any(o!=r and o[0]>=r[0] and o[1]<=r[1] for o in rare)]
    return [i for i in keep if not any(a<=i['addr']<b for a,b in rare)], rare
if __name__=='__main__':
    f = sys.argv[1]; blocks = int(sys.argv[2]); lazy = sys.argv[3] == '1'
    ex = (int(sys.argv[4],16), int(sys.argv[5],16)) if len(sys.argv) > 5 else None
    c, rare = common(f, ex, lazy)
    cnt = collections.Counter(purpose(i) for i in c)
    print(f, 'rare', [(hex(a),hex(b)) for a,b in rare], 'per block', len(c)/blocks, 'stall sum/block', sum(max(1,i['stall']) for i in c)/blocks)
    for hm in (8,16):
        t,_=simulate(c,warps=4,P={'hmma':hm,'mufu':8}); print('  model hmma',hm,'cycles per block per SMSP', round(t/12/4/blocks))
    pickle.dump(c, open(f + '.common.pkl','wb'))
