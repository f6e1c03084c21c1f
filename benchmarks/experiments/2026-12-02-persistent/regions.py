import sys
from collections import Counter
sys.path.insert(0, "/tmp/s13-pers")
from loops import parse, loops
def hot(ins):
    # innermost loop enclosing the sealed-block work: loop with HMMA and LDG/LDGSTS, largest HMMA, the one whose body contains table LDG
    cands = [(t, a, n, c) for t, a, n, c, pr in loops(ins) if pr and c["HMMA"] and n < 1500]
    # choose the block loop: fp16: the one with 17 HMMA and 17 LDG (encloses the kstep loop); int: most HMMA
    cands.sort(key=lambda x: (-x[3]["HMMA"], -x[3]["LDG"], x[0]))
    return cands[0]
def region(ins, lo, hi):
    return Counter(x[1] for x in ins if lo <= x[0] < hi), sum(1 for x in ins if lo <= x[0] < hi)
if __name__ == "__main__":
  for p in sys.argv[1:]:
      ins = parse(p)
      t, a, n, c = hot(ins)
      end = ins[-1][0] + 16
      print(f"== {p}: hot loop 0x{t:x}..0x{a:x} ({n} instr)")
      for name, lo, hi in (("before loop", 0, t), ("hot loop", t, a + 16), ("after loop", a + 16, end)):
          cc, m = region(ins, lo, hi)
          print(f"  {name:12s} n={m:5d} STL {cc['STL']:3d} LDL {cc['LDL']:3d} LDG {cc['LDG']:3d} ATOMG {cc['ATOMG']:2d} RED {cc['RED']:2d} BAR {cc['BAR']:2d} MEMBAR {cc['MEMBAR']} CS2R {cc['CS2R']} CALL {cc['CALL']}")
