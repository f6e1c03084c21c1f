"""Crude SMSP model: W warps each running `iters` iterations of a straight-line path (SASS with control codes).
Per instruction: in-order issue per warp after its previous instruction's stall count and the scoreboards it waits on;
one issue per cycle per SMSP; functional-unit pipes with per-instruction occupancy; the shared-memory/LSU path (MIO)
shared by the SM's 4 SMSPs modelled as a quarter share per SMSP.  Numbers are assumptions (see PIPE, LAT)."""
import sys
sys.path.insert(0, '/tmp/s13-int/tools')

ALU = {'LOP3', 'SHF', 'PRMT', 'IADD3', 'ISETP', 'LEA', 'SEL', 'FMNMX', 'FSETP', 'PLOP3', 'P2R', 'R2P', 'MOV', 'VOTE', 'FSEL',
       'IMNMX', 'VIADD', 'UMOV', 'ULDC', 'UIADD3', 'ULOP3', 'USHF', 'UISETP', 'ULEA', 'UIMAD', 'USEL', 'S2UR', 'F2FP'}
FMA = {'FADD', 'FMUL', 'FFMA', 'HFMA2', 'HMUL2', 'HADD2'}
def lds_wavefronts(ins):
    op = ins['op']
    if '.128' in op: return 4
    if '.64' in op: return 2
    return 1

def unit(ins, P):
    base = ins['op'].split('.')[0]
    if base == 'HMMA': return ('tensor', P['hmma'])
    if base == 'MUFU': return ('mufu', P['mufu'])
    if base == 'IMAD': return ('fmaH', 2 if 'WIDE' not in ins['op'] else 4)
    if base in FMA: return ('fma', 1)
    if base in ALU: return ('alu', 2)
    if base in ('LDS', 'LDL', 'STL', 'STS'): return ('mio', 4 * lds_wavefronts(ins))   # quarter of 1 wavefront/clk/SM
    if base == 'LDGSTS': return ('mio', 16)
    if base in ('SHFL', 'MOVM'): return ('mio', 4)
    if base == 'LDG': return ('mio', 4 * lds_wavefronts(ins))
    return (None, 0)

LAT = {'LDS': 30, 'SHFL': 24, 'MOVM': 24, 'MUFU': 18, 'LDL': 32, 'LDG': 600, 'S2R': 24, 'LDC': 12,
       'LDGSTS': 8, 'DEPBAR': 0, 'BAR': 20, 'S2UR': 12, 'VOTE': 4, 'I2F': 10, 'F2F': 10}

def simulate(path, warps=4, iters=12, P=None, policy='gto'):
    P = P or {'hmma': 8, 'mufu': 8}
    n = len(path)
    pc = [0] * warps; it = [0] * warps; nxt = [0] * warps
    ready = [[0] * 6 for _ in range(warps)]
    busy = {'tensor': 0, 'mufu': 0, 'fmaH': 0, 'fmaL': 0, 'alu': 0, 'mio': 0}
    t = 0; last = 0; issued = 0; done = 0
    order = list(range(warps))
    while done < warps:
        chosen = None
        cand = ([last] + [w for w in order if w != last]) if policy == 'gto' else order
        for w in cand:
            if it[w] >= iters or nxt[w] > t: continue
            ins = path[pc[w]]
            if any(ins['wait'] >> b & 1 and ready[w][b] > t for b in range(6)): continue
            u, occ = unit(ins, P)
            if u == 'fma':
                if busy['fmaL'] <= t: u = 'fmaL'
                elif busy['fmaH'] <= t: u = 'fmaH'
                else: continue
                occ = 2
            elif u and busy[u] > t: continue
            chosen = (w, ins, u, occ); break
        if chosen is None:
            t += 1; continue
        w, ins, u, occ = chosen
        if u: busy[u] = max(busy[u], t) + occ
        base = ins['op'].split('.')[0]
        lat = LAT.get(base, 6)
        if u == 'mio': lat += max(0, busy['mio'] - t - occ)   # queueing behind earlier MIO work
        if ins['wbar'] != 7: ready[w][ins['wbar']] = t + lat
        if ins['rbar'] != 7: ready[w][ins['rbar']] = t + 6
        nxt[w] = t + max(1, ins['stall'])
        issued += 1; last = w
        pc[w] += 1
        if pc[w] == n:
            pc[w] = 0; it[w] += 1
            if it[w] == iters: done += 1
        if policy == 'lrr': order = order[1:] + order[:1]
        t += 1
    return t, issued

if __name__ == '__main__':
    import ast
    from regions import run
    common, _ = run(sys.argv[1], ast.literal_eval(sys.argv[2]), sys.argv[1])
    for hm in (8, 16):
        for w in (1, 4):
            t, iss = simulate(common, warps=w, P={'hmma': hm, 'mufu': 8})
            print(f'   hmma {hm} cyc, {w} warps: {t / 12:.0f} cycles per iteration-round, IPC {iss / t:.2f}')

def simulate_reasons(path, warps=4, iters=12, P=None):
    """as simulate (gto) but counts, for each cycle with no issue, why the next-in-line warp could not issue."""
    import collections
    P = P or {'hmma': 8, 'mufu': 8}
    n = len(path)
    pc = [0] * warps; it = [0] * warps; nxt = [0] * warps
    ready = [[0] * 6 for _ in range(warps)]; setter = [[None] * 6 for _ in range(warps)]
    busy = {'tensor': 0, 'mufu': 0, 'fmaH': 0, 'fmaL': 0, 'alu': 0, 'mio': 0}
    t = 0; last = 0; issued = 0; done = 0; why = collections.Counter()
    while done < warps:
        chosen = None; reasons = []
        for w in [last] + [x for x in range(warps) if x != last]:
            if it[w] >= iters: continue
            ins = path[pc[w]]
            if nxt[w] > t: reasons.append('fixed-latency stall (stall count)'); continue
            blk = [b for b in range(6) if ins['wait'] >> b & 1 and ready[w][b] > t]
            if blk: reasons.append('scoreboard: ' + setter[w][blk[0]]); continue
            u, occ = unit(ins, P)
            if u == 'fma':
                if busy['fmaL'] <= t: u = 'fmaL'
                elif busy['fmaH'] <= t: u = 'fmaH'
                else: reasons.append('pipe busy: fma'); continue
                occ = 2
            elif u and busy[u] > t: reasons.append('pipe busy: ' + u); continue
            chosen = (w, ins, u, occ); break
        if chosen is None:
            # attribute the idle cycle to the reason of the warp closest to issuing (first listed)
            why[reasons[0] if reasons else 'done'] += 1
            t += 1; continue
        w, ins, u, occ = chosen
        if u: busy[u] = max(busy[u], t) + occ
        base = ins['op'].split('.')[0]
        lat = LAT.get(base, 6)
        if u == 'mio': lat += max(0, busy['mio'] - t - occ)
        if ins['wbar'] != 7: ready[w][ins['wbar']] = t + lat; setter[w][ins['wbar']] = base
        if ins['rbar'] != 7: ready[w][ins['rbar']] = t + 6; setter[w][ins['rbar']] = base + '(src read)'
        nxt[w] = t + max(1, ins['stall'])
        issued += 1; last = w; pc[w] += 1
        if pc[w] == n:
            pc[w] = 0; it[w] += 1
            if it[w] == iters: done += 1
        t += 1
    return t, issued, why
