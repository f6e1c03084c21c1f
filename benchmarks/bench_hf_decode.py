"""Decode tokens/s of a Llama-3-8B-shaped model with random weights through transformers:
hexcore FP16/INT4/INT2 against DynamicCache + SDPA and transformers' own paged cache.

    python -m benchmarks.bench_hf_decode [--layers 32] [--batch 1 8 64] [--context 1024 4096 16384]
        [--steps 32] [--caches dynamic paged fp16 int4 int2] [--budget-gib 64] [--out FILE]
    NUMBA_ENABLE_CUDASIM=1 python -m benchmarks.bench_hf_decode --tiny --device cpu --batch 1 2 --context 64 --steps 3

The model (hidden 4096, 32 heads, 8 KV heads, head_dim 128, intermediate 14336, vocab
128256, rope_theta 500000; ``--layers`` of them) is built in float16 on the GPU with the
"hexcore" attention, which is plain SDPA without a HexcoreCache, so one model serves every
cache. For each cache x batch x context the context is filled with random K/V without
running the model (DynamicCache: ``update`` per layer; hexcore: ``Engine.prefill`` of one
random ``[L, ctx, 8, 128]`` K and V into every row, then ``HexcoreCache.adopt``), then
decode forwards run by hand, one token per row, the next token the argmax of the logits
(generate()'s greedy loop without its bookkeeping): 2 warm-up steps, then ``--steps``
timed ones between device synchronisations, then 4 more under torch's profiler. Printed:
wall ms per step, GPU ms per step (the kernels' own time over the profiled steps, hexcore's
numba kernels included: where it is far below the wall time the step is bound by the host's
Python and launches, not by attention), tokens/s (``B * steps / wall seconds``) and the KV
bytes allocated. ``paged`` is transformers' continuous batching (``generate_batch``, attention
"paged|sdpa") over ``B`` random prompts of ``context`` tokens: it cannot be handed a filled
cache, so its decode steps are timed by the tokens' timestamps (``paged_seconds``; no GPU time
column; its own scheduler decides how many rows decode together). A case whose KV (estimated before
allocating) does not fit the free GPU memory, or that runs out of memory, is printed as
"does not fit". Then, for ``--budget-gib``, the largest batch per context whose KV fits
that budget, computed from the layout (nothing allocated). ``--tiny`` (2 layers, hidden
256, 4/2 heads, head_dim 64, vocab 512) with ``--device cpu`` runs the whole path on the
CUDA simulator (a float32 model), to check the code, not to measure it.
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import pathlib
import time

CACHES = ("dynamic", "paged", "fp16", "int4", "int2")
FP16_CACHES = ("dynamic", "paged")  # transformers' caches: FP16 K/V, no hexcore layout
BLOCK = 32  # hexcore's block size
WARMUP = 2  # untimed decode steps per case
PROFILED = 4  # steps after the timed ones, under the profiler (GPU time)
HEADROOM = 4 << 30  # bytes left free for activations, logits and the decode buffers
GIB = float(1 << 30)


# -- the model ---------------------------------------------------------------------------
def llama_config(layers: int | None, tiny: bool, max_positions: int):
    """A Llama-3-8B config with ``layers`` layers (default 32), or ``--tiny``'s small one."""
    from transformers import LlamaConfig

    shape = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=64, vocab_size=512, num_hidden_layers=2) if tiny else \
        dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
             head_dim=128, vocab_size=128256, num_hidden_layers=32)
    if layers is not None:
        shape["num_hidden_layers"] = layers
    return LlamaConfig(**shape, rope_theta=500000.0, rms_norm_eps=1e-5, max_position_embeddings=max_positions,
                       tie_word_embeddings=False)


def build_model(config, device: str):
    """Random weights, float16 on the GPU (float32 on the CPU), allocated where they run."""
    import torch
    from transformers import AutoModelForCausalLM

    import hexcore.integrations.transformers  # noqa: F401  (registers "hexcore")

    torch.manual_seed(0)
    dtype = torch.float16 if device == "cuda" else torch.float32
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, attn_implementation="hexcore", dtype=dtype)
    return model.eval()


# -- KV bytes ------------------------------------------------------------------------------
def kv_layout(config, name: str):
    """The KVCacheConfig of a HexcoreCache of ``name`` for ``config`` (None for transformers' caches)."""
    from hexcore import KVCacheConfig

    if name in FP16_CACHES:
        return None
    return KVCacheConfig(num_layers=config.num_hidden_layers, num_kv_heads=config.num_key_value_heads,
                         head_dim=config.head_dim, block_size=BLOCK, kv_dtype=name,
                         group_size=min(64, config.head_dim))


def kv_bytes(config, name: str, batch: int, tokens: int) -> int:
    """KV bytes of ``batch`` rows of ``tokens`` tokens: FP16 K and V for transformers' caches; the
    pool this benchmark gives a HexcoreCache (``tokens + BLOCK`` per row) and its tails."""
    layout = kv_layout(config, name)
    if layout is None:
        return 2 * config.num_hidden_layers * tokens * batch * config.num_key_value_heads * config.head_dim * 2
    return layout.total_bytes(-(-batch * (tokens + BLOCK) // BLOCK), batch)


def scratch_bytes(config, name: str, batch: int, tokens: int) -> int:
    """Transient bytes of a case besides its KV: the random source K/V, and for DynamicCache
    a layer's K/V copied by ``torch.cat`` each step and repeated for the query heads; for the
    paged cache, a layer's K/V of the whole batch (its prefill)."""
    per_row_layer = 2 * tokens * config.num_key_value_heads * config.head_dim * 2
    if name == "paged":
        return batch * per_row_layer
    if name != "dynamic":
        return config.num_hidden_layers * per_row_layer
    groups = config.num_attention_heads // config.num_key_value_heads
    return batch * per_row_layer * (2 + groups)


def fits(config, name: str, batch: int, tokens: int, device: str) -> bool:
    """Whether the case's KV and scratch fit the free GPU memory (always True on the CPU)."""
    import torch

    if device != "cuda":
        return True
    need = kv_bytes(config, name, batch, tokens) + scratch_bytes(config, name, batch, tokens) + HEADROOM
    return need <= torch.cuda.mem_get_info()[0]


def max_batch(config, name: str, tokens: int, budget: int) -> int:
    """The largest batch whose KV (``kv_bytes``) fits ``budget`` bytes; 0 if none."""
    batch = budget // kv_bytes(config, name, 1, tokens)
    while batch > 0 and kv_bytes(config, name, batch, tokens) > budget:
        batch -= 1
    while kv_bytes(config, name, batch + 1, tokens) <= budget:
        batch += 1
    return batch


# -- the caches, filled without running the model -------------------------------------------
def dynamic_cache(model, batch: int, context: int):
    """A DynamicCache whose every layer holds the same random ``[B, H, ctx, D]`` K and V."""
    import torch
    from transformers import DynamicCache

    cfg = model.config
    cache = DynamicCache(config=cfg)
    shape = (batch, cfg.num_key_value_heads, context, cfg.head_dim)
    k = torch.randn(shape, dtype=model.dtype, device=model.device)
    v = torch.randn(shape, dtype=model.dtype, device=model.device)
    for layer in range(cfg.num_hidden_layers):
        cache.update(k, v, layer)  # copies (torch.cat)
    return cache


def hexcore_cache(model, name: str, batch: int, context: int, tokens: int):
    """A HexcoreCache of ``name`` whose ``batch`` rows hold the same random ``[L, ctx, H, D]``
    K and V (``Engine.prefill``), adopted as the cache's rows."""
    import torch

    from hexcore.integrations.transformers import HexcoreCache

    cfg = model.config
    cache = HexcoreCache(cfg, kv_dtype=name, max_tokens=batch * (tokens + BLOCK), max_seqs=batch,
                         block_size=BLOCK, max_seq_len=tokens + BLOCK)
    shape = (cfg.num_hidden_layers, context, cfg.num_key_value_heads, cfg.head_dim)
    k = torch.randn(shape, dtype=torch.float16, device=model.device)
    v = torch.randn(shape, dtype=torch.float16, device=model.device)
    if not k.is_cuda:  # the simulator's engine takes host arrays
        k, v = k.numpy(), v.numpy()
    seqs = []
    for _ in range(batch):
        seqs.append(cache.engine.add())
        cache.engine.prefill(seqs[-1], k, v)
    cache.adopt(seqs)
    return cache


# -- decode -------------------------------------------------------------------------------
def decode_steps(model, cache, token, first_position: int, count: int):
    """``count`` decode forwards by hand from ``first_position``, one token per row, the next
    token the argmax of the logits (generate()'s greedy loop without its bookkeeping);
    returns the last token ``[B, 1]``."""
    import torch

    params = inspect.signature(model.forward).parameters
    cache_kw = "cache" if "cache" in params else "past_key_values"  # transformers 5.24 renamed it
    with torch.no_grad():
        for position in range(first_position, first_position + count):
            extra = {"cache_position": torch.tensor([position], device=model.device)} \
                if "cache_position" in params else {}  # older transformers take it
            out = model(input_ids=token, position_ids=torch.full_like(token, position), use_cache=True,
                        **{cache_kw: cache}, **extra)
            token = out.logits[:, -1].argmax(-1, keepdim=True)
    return token


def decode_seconds(model, cache, batch: int, context: int, steps: int) -> tuple[float, float | None]:
    """(wall seconds per decode step over ``steps`` timed steps after ``WARMUP`` untimed
    ones, GPU seconds per step over ``PROFILED`` more under torch's profiler: the kernels'
    own time, hexcore's included; None on the CPU)."""
    import torch

    cuda = model.device.type == "cuda"
    token = torch.zeros((batch, 1), dtype=torch.long, device=model.device)
    token = decode_steps(model, cache, token, context, WARMUP)
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    token = decode_steps(model, cache, token, context + WARMUP, steps)
    if cuda:
        torch.cuda.synchronize()
    wall = (time.perf_counter() - start) / steps
    if not cuda:
        return wall, None
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        decode_steps(model, cache, token, context + WARMUP + steps, PROFILED)
        torch.cuda.synchronize()
    kernels = sum(getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0))
                  for e in prof.key_averages())
    return wall, kernels * 1e-6 / PROFILED


def paged_seconds(model, batch: int, context: int, steps: int) -> float:
    """Wall seconds per decode step of transformers' paged cache (``generate_batch``, attention
    "paged|sdpa") over ``batch`` random prompts of ``context`` tokens, after one untimed call.

    With per-token timestamps (``generate_batch(record_timestamps=True)``, transformers 5.24):
    from the moment every row has its ``WARMUP``-th token to the moment every row has its
    last, over ``steps``. Without them: ``(T(WARMUP + steps) - T(WARMUP)) / steps``, T the wall
    time of a call making that many tokens per row (both prefill; noisy where the call's fixed
    cost is large)."""
    import torch
    from transformers import GenerationConfig

    generator = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, model.config.vocab_size, (batch, context), generator=generator).tolist()
    sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)
    stamps = "record_timestamps" in inspect.signature(model.generate_batch).parameters

    def run(new_tokens: int) -> tuple:
        config = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=-1, pad_token_id=0)
        sync()
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate_batch(inputs=prompts, generation_config=config,
                                       **({"record_timestamps": True} if stamps else {}))
        sync()
        seconds = time.perf_counter() - start
        made = sum(len(o.generated_tokens) for o in out.values())
        if made != batch * new_tokens:
            raise RuntimeError(f"paged: {made} tokens generated, expected {batch} x {new_tokens}")
        return seconds, list(out.values())

    model.set_attn_implementation("paged|sdpa")
    try:
        run(WARMUP)
        if stamps:
            _, outs = run(WARMUP + steps)
            if all(o.timestamps and len(o.timestamps) == WARMUP + steps for o in outs):
                first = max(o.timestamps[WARMUP - 1] for o in outs)
                return (max(o.timestamps[-1] for o in outs) - first) / steps
        return (run(WARMUP + steps)[0] - run(WARMUP)[0]) / steps
    finally:
        model.set_attn_implementation("hexcore")


def out_of_memory(error: BaseException) -> bool:
    """torch's or numba's CUDA out-of-memory error (or the host's MemoryError); not hexcore's
    own errors (a pool short of blocks would be this benchmark's sizing bug)."""
    import torch

    from hexcore import HexcoreError

    if isinstance(error, HexcoreError):
        return False
    return isinstance(error, (torch.cuda.OutOfMemoryError, MemoryError)) or "OUT_OF_MEMORY" in str(error)


def release_memory(device: str) -> None:
    """Free what the last case left: cycles, numba's pending frees, torch's cached blocks."""
    import torch

    gc.collect()
    if device == "cuda":
        from numba import cuda

        context = cuda.current_context()
        for owner in (context, getattr(context, "memory_manager", None)):
            pending = getattr(owner, "deallocations", None)
            if pending is not None:
                pending.clear()
        torch.cuda.empty_cache()


def run_case(model, name: str, batch: int, context: int, steps: int, device: str) -> dict:
    """One cache x batch x context: its row (``ms_per_step`` None when it does not fit)."""
    tokens = context + WARMUP + steps + PROFILED
    row = dict(case="decode", cache=name, batch=batch, context=context, steps=steps, ms_per_step=None,
               gpu_ms_per_step=None, tokens_per_s=None, kv_gib=round(kv_bytes(model.config, name, batch, tokens) / GIB, 3))
    if not fits(model.config, name, batch, tokens, device):
        return row
    cache = None
    try:
        if name == "paged":
            seconds = paged_seconds(model, batch, context, steps)
            row.update(ms_per_step=round(1e3 * seconds, 3), tokens_per_s=round(batch / seconds, 1))
            return row
        if name == "dynamic":
            cache = dynamic_cache(model, batch, context)
        else:
            cache = hexcore_cache(model, name, batch, context, tokens)
        seconds, gpu = decode_seconds(model, cache, batch, context, steps)
        row.update(ms_per_step=round(1e3 * seconds, 3), tokens_per_s=round(batch / seconds, 1),
                   gpu_ms_per_step=None if gpu is None else round(1e3 * gpu, 3))
    except Exception as error:  # out of memory only; anything else is raised
        if not out_of_memory(error):
            raise
    finally:
        del cache
        release_memory(device)
    return row


# -- output -------------------------------------------------------------------------------
def print_row(row: dict) -> None:
    if row["ms_per_step"] is None:
        timing = f"{'does not fit':>33s}"
    else:
        gpu = row["gpu_ms_per_step"]
        timing = f"{row['ms_per_step']:10.3f} {'-' if gpu is None else f'{gpu:.3f}':>10s} {row['tokens_per_s']:11.1f}"
    print(f"{row['cache']:8s} {row['batch']:4d} {row['context']:8d} {timing} {row['kv_gib']:9.3f}", flush=True)


def budget_rows(config, caches, contexts, steps: int, budget_gib: float) -> list:
    """The largest batch per cache and context whose KV fits ``budget_gib``, printed."""
    budget = int(budget_gib * GIB)
    print(f"\nlargest batch whose KV fits {budget_gib:g} GiB (computed from the layout, not measured; "
          f"{config.num_hidden_layers} layers, context + {WARMUP + steps + PROFILED} decode tokens per row)")
    print(f"{'context':>8s} " + " ".join(f"{name:>8s}" for name in caches))
    rows = []
    for context in contexts:
        found = {name: max_batch(config, name, context + WARMUP + steps + PROFILED, budget) for name in caches}
        rows += [dict(case="budget", cache=name, context=context, budget_gib=budget_gib, max_batch=b)
                 for name, b in found.items()]
        print(f"{context:8d} " + " ".join(f"{found[name]:8d}" for name in caches))
    return rows


def main(argv=None) -> list:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, help="decoder layers (default 32; --tiny: 2)")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--context", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--steps", type=int, default=32, help="timed decode steps per case (after 2 warm-up ones)")
    parser.add_argument("--caches", nargs="+", choices=CACHES, default=list(CACHES))
    parser.add_argument("--budget-gib", type=float, default=64.0)
    parser.add_argument("--tiny", action="store_true", help="a small Llama config (checks the code path)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--out", help="write the rows as JSON here")
    args = parser.parse_args(argv)
    max_positions = max(8192, max(args.context) + WARMUP + args.steps)
    model = build_model(llama_config(args.layers, args.tiny, max_positions), args.device)
    print(f"{'cache':8s} {'B':>4s} {'context':>8s} {'ms/step':>10s} {'GPU ms':>10s} {'tokens/s':>11s} "
          f"{'KV GiB':>9s}")
    rows = []
    for name in args.caches:
        for batch in args.batch:
            for context in args.context:
                rows.append(run_case(model, name, batch, context, args.steps, args.device))
                print_row(rows[-1])
    rows += budget_rows(model.config, args.caches, args.context, args.steps, args.budget_gib)
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    main()
