"""Two correct references in the same dtype: parting rate of beams.
 base: DynamicCache, sdpa, full prefill. variants: eager attention; K/V of the 64-token prefix x (1 + 2^-11 noise)."""
import sys
sys.path.insert(0, "/work/wt-beam")
import torch, transformers
torch.set_num_threads(1)
from tests.integrations import test_transformers as T
dtype = {"f32": torch.float32, "f16": torch.float16}[sys.argv[1]]
seeds = range(int(sys.argv[2]), int(sys.argv[3]))
kw = dict(num_beams=4, num_return_sequences=2, max_new_tokens=32, min_new_tokens=32, do_sample=False,
          pad_token_id=0, output_scores=True, return_dict_in_generate=True)
def turn2(model, seed):
    ids, _ = T.ragged_prompts(seed, [70])
    first = T.generate(model, transformers.DynamicCache(config=model.config), ids, None, 8)
    user, _ = T.ragged_prompts(seed + 1, [10])
    return torch.cat([first.sequences, user], dim=1)
def noisy(model, ids, seed, cut=64, rel=2.0**-11):
    c = transformers.DynamicCache(config=model.config)
    with torch.no_grad():
        model(ids[:, :cut], past_key_values=c, use_cache=True)
    g = torch.Generator().manual_seed(seed)
    for layer in c.layers:
        for t in (layer.keys, layer.values):
            t.mul_(1 + rel * torch.randn(t.shape, generator=g).to(t.dtype))
    c.batch_repeat_interleave(4)
    return c
def gen(model, ids, cache):
    with torch.no_grad():
        return model.generate(ids, attention_mask=torch.ones_like(ids), past_key_values=cache, **kw)
def score_of(model, out, ids):
    # uncached mean log-prob of each returned beam (as sequences_scores with length_penalty 1)
    new = len(out.scores)
    with torch.no_grad():
        logits = model(out.sequences, use_cache=False).logits[:, -new - 1:-1].float()
    return logits.log_softmax(-1).gather(-1, out.sequences[:, -new:, None])[..., 0].sum(1) / out.sequences.shape[1]
rows = []
for seed in seeds:
    model = T.tiny_model(seed, dtype=dtype, **T.ARCHS[0])
    ids = turn2(model, seed)
    base = gen(model, ids, transformers.DynamicCache(config=model.config))
    model.config._attn_implementation = "eager"
    eager = gen(model, ids, transformers.DynamicCache(config=model.config))
    model.config._attn_implementation = "sdpa"
    noise = gen(model, ids, noisy(model, ids, seed))
    s = [int((x.sequences == base.sequences).all(1).sum()) for x in (eager, noise)]
    d = [float(x.sequences_scores[0] - base.sequences_scores[0]) for x in (eager, noise)]
    rows.append((seed, s, d))
    print(seed, "same(eager, noise)", s, "best score - base's", [f"{v:+.4f}" for v in d], flush=True)
for k, name in enumerate(("eager", "noise")):
    print(name, "seeds with 0 of 2 same:", sum(r[1][k] == 0 for r in rows), "<2:", sum(r[1][k] < 2 for r in rows),
          "of", len(rows), "max |best score diff|", max(abs(r[2][k]) for r in rows))
