"""INT2/INT4/FP16 at B=1 x 2 KV heads x 128k (test_long_context_small_groups_and_head_groups_gpu's
first case): the relative L2 error against the float64 reference at the split count the
policy picks (128), at the twenty-seventh session's (64) and at 16, same seeds, to see
whether the count moves the error (a GPU run failed 2.14e-3 against the 2e-3 tolerance)."""
import numpy as np

from hexcore import KVCacheConfig
from hexcore.cuda import DecodeOptions
from tests.cuda.attention.test_decode import check_decode

for seed in (6327934641814624893, 1):
    for dtype in ("int2", "fp16"):
        cfg = KVCacheConfig(num_layers=1, num_kv_heads=2, head_dim=128, block_size=32, kv_dtype=dtype,
                            group_size=64)
        errs = []
        for min_blocks in (4, 64, 256):  # 128, 64 (the old policy's) and 16 splits
            rng = np.random.default_rng(seed)
            errs.append(check_decode(cfg, 4, [131072], rng, DecodeOptions(min_split_blocks=min_blocks), tolerance=1.0))
        print(seed, dtype, " ".join(f"{e:.3e}" for e in errs), flush=True)
