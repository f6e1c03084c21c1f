import sys
sys.path.insert(0, "/work/wt-beam"); sys.path.insert(0, "/work/beamscratch")
import torch, transformers
torch.set_num_threads(1)
from tests.integrations import test_transformers as T
from dyn2 import turn2, noisy  # noqa (dyn2 runs its own loop on import: pass it seeds)
dtype = {"f32": torch.float32, "f16": torch.float16}[sys.argv[1]]
seeds = range(int(sys.argv[2]), int(sys.argv[3]))
gaps = {"eager": [], "noise": [], "noreorder": []}
fails = {k: 0 for k in gaps}
orig = transformers.DynamicCache.reorder_cache
for seed in seeds:
    model = T.tiny_model(seed, dtype=dtype, **T.ARCHS[0])
    ids = turn2(model, seed)
    ones = torch.ones_like(ids)
    ref = T.beam_search(model, ids, transformers.DynamicCache(config=model.config))
    model.config._attn_implementation = "eager"
    eager = T.beam_search(model, ids, transformers.DynamicCache(config=model.config))
    model.config._attn_implementation = "sdpa"
    noise = T.beam_search(model, ids, noisy(model, ids, seed))
    transformers.DynamicCache.reorder_cache = lambda self, beam_idx: None
    try:
        broken = T.beam_search(model, ids, transformers.DynamicCache(config=model.config))
    finally:
        transformers.DynamicCache.reorder_cache = orig
    line = [seed, "0 in ids" if bool((ids == 0).any()) else ""]
    for name, got in (("eager", eager), ("noise", noise), ("noreorder", broken)):
        try:
            first, gap = T.same_beam_path(*got, *ref, margin=float("inf"))
        except AssertionError as e:
            first, gap = -1, str(e)
        gaps[name].append(gap if gap is not None else 0.0)
        e1, _ = T._reported_vs_uncached(model, got[0], ones)
        e0, _ = T._reported_vs_uncached(model, ref[0], ones)
        try:
            T.check_beam_search(model, got, ref, ones)
            ok = "pass"
        except AssertionError as e:
            ok = "FAIL"; fails[name] += 1
        line.append(f"{name}: first {first} gap {gap if gap is None else round(gap, 4)} err {e1:.1e}/{e0:.1e} {ok}")
    print(*line, flush=True)
for k, v in gaps.items():
    v = sorted(v)
    print(k, "gap max", v[-1], "sorted top", [round(x, 4) for x in v[-6:]], "check fails", fails[k], "of", len(v))
