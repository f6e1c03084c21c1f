"""Parse cuobjdump --dump-sass with control words; hot loop; class counts; single-warp timing model."""
import re, sys, collections

LINE = re.compile(r"/\*([0-9a-f]{4,6})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);\s*/\* (0x[0-9a-f]{16}) \*/")
HI = re.compile(r"^\s*/\* (0x[0-9a-f]{16}) \*/\s*$")

def parse(text):
    out = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = LINE.search(lines[i])
        if m and i + 1 < len(lines):
            h = HI.match(lines[i + 1])
            if h:
                c = int(h.group(1), 16) >> 41
                out.append(dict(addr=int(m.group(1), 16), pred=(m.group(2) or '').strip(), op=m.group(3),
                                args=m.group(4).strip(), stall=c & 15, yld=(c >> 4) & 1, wbar=(c >> 5) & 7,
                                rbar=(c >> 8) & 7, wait=(c >> 11) & 63))
                i += 2
                continue
        i += 1
    return out

TGT = re.compile(r"(0x[0-9a-f]+)")

def hot_loop(insts):
    best = None
    for k, ins in enumerate(insts):
        if ins['op'].startswith('BRA') and ins['pred'] and not ins['op'].startswith('BRA.DIV'):
            t = TGT.search(ins['args'])
            if not t: continue
            tgt = int(t.group(1), 16)
            if tgt >= ins['addr']: continue
            body = [x for x in insts if tgt <= x['addr'] <= ins['addr']]
            n = sum(1 for x in body if x['op'].startswith('HMMA'))
            key = (n, -len(body))
            if n and (best is None or key > best[0]):
                best = (key, body)
    return best[1] if best else None

def cls(ins):
    op = ins['op']; base = op.split('.')[0]
    if base in ('LDS',): return 'LDS (shared load)'
    if base in ('LDG',): return 'LDG (global load)'
    if base == 'LDGSTS': return 'LDGSTS (cp.async)'
    if base in ('LDL', 'STL'): return 'LDL/STL (spill)'
    if base in ('STS',): return 'STS'
    if base == 'HMMA': return 'HMMA'
    if base in ('HFMA2', 'HMUL2', 'HADD2'): return 'HFMA2/HMUL2/HADD2'
    if base in ('F2FP', 'F2F', 'I2F', 'F2I', 'I2FP'): return 'conversion (F2FP/I2F..)'
    if base in ('LOP3',): return 'LOP3'
    if base in ('SHF',): return 'SHF'
    if base in ('PRMT',): return 'PRMT'
    if base == 'IMAD' and '.MOV' in op: return 'MOV (IMAD.MOV/MOV)'
    if base in ('MOV', 'UMOV'): return 'MOV (IMAD.MOV/MOV)'
    if base in ('IMAD', 'IADD3', 'LEA', 'VIADD', 'SEL', 'IMNMX', 'ISETP', 'S2R', 'LDC', 'ULDC', 'S2UR', 'UIADD3', 'ULEA', 'UIMAD', 'USHF', 'ULOP3', 'IABS', 'UISETP', 'USEL', 'P2R', 'R2P', 'PLOP3'): return 'int addr/ctrl (IMAD/IADD3/LEA/ISETP/SEL/LDC/S2R)'
    if base in ('FADD', 'FMUL', 'FFMA', 'FMNMX', 'FSETP', 'FSEL'): return 'fp32 (FADD/FMUL/FMNMX/FSETP)'
    if base == 'MUFU': return 'MUFU.EX2'
    if base in ('SHFL',): return 'SHFL'
    if base in ('MOVM',): return 'MOVM (movmatrix)'
    if base in ('VOTE',): return 'VOTE'
    if base in ('BAR', 'WARPSYNC', 'DEPBAR', 'LDGDEPBAR', 'BSSY', 'BSYNC', 'NOP', 'BRA', 'EXIT', 'CALL', 'RET'): return 'branch/barrier/NOP (BAR/DEPBAR/WARPSYNC/BSSY/NOP/BRA)'
    return 'other:' + base

VARLAT = {'LDS': 32, 'SHFL': 28, 'MOVM': 30, 'MUFU': 20, 'LDL': 35, 'LDG': 600, 'S2R': 30, 'LDC': 20,
          'LDGSTS': 10, 'VOTE': 6, 'DEPBAR': 0, 'BAR': 20, 'S2UR': 20, 'I2F': 12, 'F2F': 12, 'F2I': 12, 'HMMA': 33,
          'POPC': 10, 'FLO': 10, 'BREV': 10}

def simulate(path, varlat=VARLAT):
    """single warp, in order; returns cycles from the first issue to the issue after the last."""
    t = 0; ready = [0] * 6; prev_stall = 0; first = True
    for ins in path:
        if not first:
            t += max(1, prev_stall)
        first = False
        for b in range(6):
            if ins['wait'] >> b & 1:
                t = max(t, ready[b])
        base = ins['op'].split('.')[0]
        lat = varlat.get(base, 6)
        if ins['wbar'] != 7: ready[ins['wbar']] = t + lat
        if ins['rbar'] != 7: ready[ins['rbar']] = max(ready[ins['rbar']], t + 4)
        prev_stall = ins['stall']
    return t + max(1, prev_stall)
