import sys, time
sys.path.insert(0, "/work/wt-beam"); sys.path.insert(0, "/work/beamscratch")
from fastdecode import fast_decode
import torch, transformers
torch.set_num_threads(1)
from tests.integrations import test_transformers as T
from hexcore.integrations import transformers as hx
seed, dtype, mode = int(sys.argv[1]), {"f32": torch.float32, "f16": torch.float16}[sys.argv[2]], sys.argv[3]
t0 = time.time()
model = T.tiny_model(seed, dtype=dtype, **T.ARCHS[0])
cache = T.make_cache(model, prefix_cache=True, max_seqs=16, block_size=32)
with fast_decode(cache.engine):
    _, ids = T.chat_turns(model, cache, seed, 70, 8, 10)
if mode == "plain":
    cache = T.make_cache(model, max_seqs=16, block_size=32)
else:
    assert cache.admit(ids.repeat_interleave(4, dim=0)) == [64] * 4
if mode == "noreorder":
    hx.HexcoreCache.reorder_cache = lambda self, beam_idx: None
with fast_decode(cache.engine):
    got = T.beam_search(model, ids, cache)
ref = T.beam_search(model, ids, transformers.DynamicCache(config=model.config))
print("returned same", (got[0].sequences == ref[0].sequences).all(1).tolist(), "scores", got[0].sequences_scores.tolist(), ref[0].sequences_scores.tolist())
print("path", T.same_beam_path(*got, *ref, margin=float("inf")))
try:
    T.check_beam_search(model, got, ref, torch.ones_like(ids)); print("PASS")
except AssertionError as e:
    print("FAIL", str(e).splitlines()[0])
print("time", round(time.time() - t0))
