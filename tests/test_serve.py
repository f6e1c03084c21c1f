"""The serving loop: block manager and kernels together, checked against exact attention."""

import pytest

from hexcore import KVCacheConfig
from hexcore.serve import serve


@pytest.mark.parametrize("dtype,bound", [("fp16", 2e-3), ("int4", 0.25)])
def test_serving_steps_match_exact_attention(dtype, bound):
    cfg = KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=64, block_size=16, kv_dtype=dtype, group_size=32)
    lines = []
    report = serve(cfg, num_q_heads=2, max_seqs=3, num_blocks=32, steps=4, prompt_range=(6, 20), seed=1,
                   log=lines.append)
    assert report.steps == 4 and report.forks == 1 and report.tokens >= 8
    assert report.max_rel_error <= bound, report
    assert len(lines) == 4 and "sealed" in lines[0]
