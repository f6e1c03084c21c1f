import sys, ast
sys.path.insert(0, '/tmp/s13-int/tools')
from regions import run
from smsp_sim import simulate_reasons
common, _ = run(sys.argv[1], ast.literal_eval(sys.argv[2]), sys.argv[1])
hm = int(sys.argv[3]) if len(sys.argv) > 3 else 8
t, iss, why = simulate_reasons(common, P={'hmma': hm, 'mufu': 8})
print(f'   model (HMMA {hm} cycles/SMSP): {t/12:.0f} cycles per round of 4 blocks (4 warps), issue {iss/12:.0f}, idle {(t-iss)/12:.0f}:')
for k, v in why.most_common(8): print(f'      {v/12:6.0f}  {k}')
