import sys, pickle; sys.path.insert(0,'/tmp/s13-int/tools')
import smsp_sim
from auto import common_path
cap4,_,_ = common_path('out/base/b4.sass'); unc3,_,_ = common_path('out/base_uncapped/b4.sass')
nj2,_,_ = common_path('out/base_nojoint/b2.sass'); j2,_,_ = common_path('out/base/b2.sass')
lb2,_,_ = common_path('out/lanebits/b2.sass'); pair = pickle.load(open('out/pair/common.pkl','rb'))
kb2,_,_ = common_path('out/kbias/b2.sass'); is2,_,_ = common_path('out/issue/b2.sass')
def per_block(path, w, P, blocks=1):
    t, _ = smsp_sim.simulate(path, warps=w, P=P); return t / 12 / w / blocks
base_lat = dict(smsp_sim.LAT)
for name, lat, P in [('compiler lat, HMMA 8', {}, {'hmma': 8, 'mufu': 8}),
                     ('compiler lat, HMMA 16', {}, {'hmma': 16, 'mufu': 8}),
                     ('LDS 45 SHFL 40 MOVM 40, HMMA 16', {'LDS': 45, 'SHFL': 40, 'MOVM': 40, 'MUFU': 24}, {'hmma': 16, 'mufu': 8}),
                     ('LDS 60 SHFL 50 MOVM 50 MUFU 30, HMMA 16', {'LDS': 60, 'SHFL': 50, 'MOVM': 50, 'MUFU': 30}, {'hmma': 16, 'mufu': 8})]:
    smsp_sim.LAT = dict(base_lat); smsp_sim.LAT.update(lat)
    a = per_block(unc3, 3, P) / per_block(cap4, 4, P)
    j = per_block(nj2, 4, P) / per_block(j2, 4, P)
    lb = per_block(lb2, 4, P)
    print(f'{name:42s} | 3w-uncapped/4w-capped INT4 {a:.3f} (measured 1.27) | nojoint/joint INT2 {j:.3f} (measured ~1.04-1.07) | '
          f'INT2 per block: base {per_block(j2,4,P):.0f} lanebits {lb:.0f} issue {per_block(is2,4,P)/lb:.3f}x kbias {per_block(kb2,4,P)/lb:.3f}x pair {per_block(pair,4,P,2)/lb:.3f}x')
