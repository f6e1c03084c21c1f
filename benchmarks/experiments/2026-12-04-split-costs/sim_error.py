"""On the CUDA simulator (no GPU): the INT2 decode's relative L2 error against the float64
reference for one sequence of CTX tokens, 1 KV head x 4 query heads, the same seed, at the
split counts that ``min_split_blocks`` allows (the policy takes the most it prices cheapest).

    NUMBA_ENABLE_CUDASIM=1 python benchmarks/experiments/2026-12-04-split-costs/sim_error.py CTX SEED MIN[,MIN...]
"""
import sys, time
import numpy as np
sys.path.insert(0, '.')  # run from the repository root
from hexcore import KVCacheConfig
from hexcore.cuda import DecodeOptions
from tests.cuda.attention.test_decode import check_decode
ctx = int(sys.argv[1]); seed = int(sys.argv[2])
cfg = KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=128, block_size=32, kv_dtype="int2", group_size=64)
V = ctx // 32
for mb in [int(x) for x in sys.argv[3].split(',')]:
    t = time.time()
    options = DecodeOptions(min_split_blocks=mb)
    err = check_decode(cfg, 4, [ctx], np.random.default_rng(seed), options, tolerance=1.0)
    print(ctx, seed, 'min_split_blocks', mb, 'splits <=', -(-V // mb), f'{err:.4e}', f'{time.time() - t:.0f}s',
          flush=True)
