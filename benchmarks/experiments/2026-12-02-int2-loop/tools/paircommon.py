import sys, collections, pickle; sys.path.insert(0,'/tmp/s13-int/tools')
from sass_ctl import parse, hot_loop, TGT
from regions import purpose
from smsp_sim import simulate
def pair_common(f, fb_lo, fb_hi):
    l = hot_loop(parse(open(f).read()))
    keep = [i for i in l if not (fb_lo <= i['addr'] < fb_hi)]
    rare=[]
    for ins in keep:
        if ins['op'].startswith('BRA') and ins['pred'] and not ins['op'].startswith('BRA.DIV'):
            tgt=int(TGT.search(ins['args']).group(1),16)
            if tgt<=ins['addr']: continue
            body=[i for i in keep if ins['addr']<i['addr']<tgt]
            ops=collections.Counter(i['op'].split('.')[0] for i in body)
            if ops['LDG'] or ops['FMUL']>=20: rare.append((ins['addr']+16,tgt))
    rare=[r for r in rare if not any(o!=r and o[0]>=r[0] and o[1]<=r[1] for o in rare)]
    return [i for i in keep if not any(a<=i['addr']<b for a,b in rare)]
if __name__=='__main__':
    f, lo, hi = sys.argv[1], int(sys.argv[2],16), int(sys.argv[3],16)
    c = pair_common(f, lo, hi)
    print(f, 'per pair', len(c), 'per block', len(c)/2, 'stall sum/block', sum(max(1,i['stall']) for i in c)/2)
    for hm in (8,16):
        t,_=simulate(c,warps=4,P={'hmma':hm,'mufu':8}); print('  model hmma',hm,'cycles per block per SMSP', round(t/12/8))
    pickle.dump(c, open(f + '.common.pkl','wb'))
