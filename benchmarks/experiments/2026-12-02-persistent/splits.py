import math
def sb(items, mv, cps, merge, oh=1.0, minb=4, sms=132):
    slots=cps*sms; best,bc=mv,None
    for s in range(1, min(mv, -(-4*slots//items))+1):
        b=-(-mv//s)
        if b<minb and s>1: break
        c=-(-items*s//slots)*(b+oh)+s*merge
        if bc is None or c<bc: best,bc=b,c
    return best
for name,B,hkv,hq,ctx in [("64 32/8 4k",64,8,32,4096),("64 32/32 4k",64,32,32,4096),("1 32/8 32k",1,8,32,32768)]:
    G=hq//hkv; hg=-(-G//8); items=B*hkv*hg; mv=ctx//32
    for bits,m in [(16,0.48),(4,1.43),(2,1.12),(16,0),]:
        b=sb(items,mv,4,m); s=-(-mv//b); n=s*items
        print(name,bits,"merge",m,"split_blocks",b,"splits",s,"items",n,"grid min(528,items)",min(528,n),"items/CTA %.2f"%(n/min(528,n)), "blocks/warp/item", b/4)
