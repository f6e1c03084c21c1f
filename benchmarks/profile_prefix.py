"""Where a prefix-cache hit spends its time: a chat's second turn on a cache that ran the first
(a hit) and on a fresh cache (a miss), each under cProfile and torch's profiler.

    python -m benchmarks.profile_prefix MODEL_DIR [--cache fp16] [--system-repeats 8] [--new-tokens 32] [--top 25]
    python -m benchmarks.profile_prefix --tiny [--layers 30] [--prompt-tokens 480] [--llama-8b-layers] [--detail]
    NUMBA_ENABLE_CUDASIM=1 python -m benchmarks.profile_prefix --tiny --device cpu --prompt-tokens 40 [--stub]

The turns are ``bench_hf --prefix``'s (``after_turn_one``, ``first_token``), run once untimed
first (kernel compilation). Printed per case: the wall time; torch's profiler's CPU time
(its ops, hexcore's numba launches not included) and GPU time (every kernel, hexcore's
included), so whether the turn is bound by the host or the device; then cProfile's
functions by cumulative time, hexcore's own first, after one line of counts: hexcore's
attention time per layer and the calls per turn of the array checks and host-to-device
copies (``checked``, ``as_device_array``, ``to_device``, ``device_array``). ``--tiny`` runs
a small random-weight Llama on random token ids instead of a model folder (``--layers`` of
them, default 2; on a GPU with as many layers as a real model, its hexcore host path per
layer is the real one's; with ``--device cpu``, on the CUDA simulator: it checks this
script, the figures mean nothing). ``--llama-8b-layers`` gives ``--tiny``'s model Llama-3-8B's
layer shape (hidden 4096, 32 query / 8 KV heads of 128, random weights; ``--layers`` of
them, default 32): a turn whose prefill the GPU, not the host, bounds. ``--stub``
(simulator only) stubs the kernel launches as ``benchmarks.host_step`` does: no kernel
runs, so a turn takes seconds rather than minutes and the counts show the simulator's host
path (its arrays are host arrays, copied per call, unlike a GPU's); the outputs mean
nothing.

Beside the profiled figures, per case: ``--repeats`` more turns timed without any profiler
(each after its own turn 1, synchronised on a GPU: ``bench_hf.first_token``), their best
and median, so hit and miss compare without the profilers' overhead, with the host time
spent inside the attention function of each layer of those turns (:func:`host_phases`: the
first layer's, which starts the forward, a middle layer's and the last one's, which
stores the new K/V; with ``--detail``, also the host time of each function of
:data:`DETAIL`, wrapped while those turns run); and one more turn
under :func:`counted_launches`: its kernel launches, the host (numpy) arrays among their
arguments (numba copies each to the device, synchronously, at every launch) and its
host-to-device copies (``numba.cuda.to_device``; of int32 arrays: ids). Note that the
``to_device`` of the calls-per-turn line is every function of that name, numba's
``ArgHint.to_device`` too: numba calls it for every array argument of a launch it
marshals, a device array included (a view, no copy).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import importlib
import io
import pstats
import statistics
import sys
import time

import numpy as np

from benchmarks.bench_hf import PROMPTS, after_turn_one, chat_ids, first_token, load, prefix_cache
from benchmarks.host_step import stubbed_launches


def profiled(run) -> dict:
    """``run()`` under cProfile and torch's profiler: wall, CPU and GPU ms, and the stats."""
    import torch

    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    profile = cProfile.Profile()
    with torch.profiler.profile(activities=activities) as prof:
        start = time.perf_counter()
        profile.enable()
        run()
        profile.disable()
        wall = time.perf_counter() - start
    events = prof.key_averages()
    cpu = sum(e.self_cpu_time_total for e in events)
    gpu = sum(getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0)) for e in events)
    return dict(wall_ms=1e3 * wall, torch_cpu_ms=cpu / 1e3, gpu_ms=gpu / 1e3, stats=pstats.Stats(profile))


@contextlib.contextmanager
def counted_launches():
    """Counts of what the code run inside does, a dict filled while open: ``launches``
    (kernel launches from the host: on the simulator every one, eager or prepared; on a GPU
    eager launches and prepared runs), ``host array arguments`` (numpy arrays among their
    arguments, or a prepared launch's: numba copies each to the device, synchronously),
    ``host-to-device copies`` (``numba.cuda.to_device`` calls) and ``of id arrays`` (those of
    an int32 array: hexcore's ids, tables and lengths); ``sites`` maps each host array
    argument's kernel and hexcore call site to its count. The functions wrapped are restored
    on exit."""
    from numba import cuda

    from hexcore.cuda.device import SIMULATOR

    found = dict.fromkeys(("launches", "host array arguments", "host-to-device copies", "of id arrays"), 0)
    found["sites"] = {}
    wrapped = [(cuda, "to_device", lambda original: _counting_copies(original, found))]
    if not SIMULATOR:
        from numba.cuda import dispatcher

        from hexcore.cuda.launch import PreparedLaunch

        wrapped += [(PreparedLaunch, "__init__", lambda original: _counting_prepare(original, found)),
                    (PreparedLaunch, "run", lambda original: _counting_run(original, found))]
        eager = getattr(dispatcher, "_LaunchConfiguration", None)  # numba-cuda 0.68's kernel[grid, block]
        if eager is not None:
            wrapped.append((eager, "__call__", lambda original: _counting_eager(original, found)))
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in wrapped]
    try:
        for (owner, name, make), (_, _, original) in zip(wrapped, saved):
            setattr(owner, name, make(original))
        if SIMULATOR:
            from hexcore.cuda.simulated import launches

            with launches(_counting_simulated(found)):
                yield found
        else:
            yield found
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)


def _count_host_arguments(found: dict, kernel, args) -> None:
    hosts = sum(isinstance(a, np.ndarray) for a in args)
    if hosts:
        found["host array arguments"] += hosts
        key = f"{getattr(getattr(kernel, 'py_func', kernel), '__name__', kernel)} at {_hexcore_site()}"
        found["sites"][key] = found["sites"].get(key, 0) + hosts


def _hexcore_site() -> str:
    """file:line of the innermost hexcore frame that is not the launch machinery."""
    frame = sys._getframe(1)
    while frame is not None:
        path = frame.f_code.co_filename
        if "hexcore/" in path and not path.endswith(("cuda/launch.py", "cuda/simulated.py", "profile_prefix.py")):
            return f"{_short(path)}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


def _counting_copies(original, found: dict):
    def to_device(obj, *args, **kwargs):
        found["host-to-device copies"] += 1
        found["of id arrays"] += isinstance(obj, np.ndarray) and obj.dtype == np.int32
        return original(obj, *args, **kwargs)

    return to_device


def _counting_simulated(found: dict):
    def hook(kernel, args, launch):  # (hexcore.cuda.simulated.launches: a launch from the host)
        found["launches"] += 1
        _count_host_arguments(found, kernel, args)
        return launch()

    return hook


def _counting_eager(original, found: dict):
    def call(self, *args):
        found["launches"] += 1
        _count_host_arguments(found, self.dispatcher, args)
        return original(self, *args)

    return call


def _counting_prepare(original, found: dict):
    def init(self, dispatcher, griddim, blockdim, args, *rest, **kwargs):
        _count_host_arguments(found, dispatcher, args)
        return original(self, dispatcher, griddim, blockdim, args, *rest, **kwargs)

    return init


def _counting_run(original, found: dict):
    def run(self, *args, **kwargs):
        found["launches"] += 1
        return original(self, *args, **kwargs)

    return run


def launch_line(found: dict) -> str:
    """One line of :func:`counted_launches`' counts, then a line per host array argument's site."""
    shown = ", ".join(f"{name} {found[name]}" for name in found if name != "sites")
    return "\n".join([f"-- one more turn, counted: {shown}",
                      *(f"   host array argument {n}: {site}" for site, n in sorted(found["sites"].items()))])


def unprofiled_line(seconds: list) -> str:
    """The best and median of turns timed with no profiler (wall seconds, synchronised)."""
    ms = [1e3 * s for s in seconds]
    return (f"-- unprofiled: best {min(ms):.2f} ms, median {statistics.median(ms):.2f} ms of {len(ms)} turns "
            f"(no profiler, synchronised)")


COUNTED = ("checked", "as_device_array", "to_device", "device_array")  # array checks, host-to-device copies


def call_counts(stats: pstats.Stats) -> dict:
    """The calls of each function named in COUNTED in one profiled turn (every module's
    function of that name: numba's nest, so a GPU's figures are not the simulator's)."""
    calls = dict.fromkeys(COUNTED, 0)
    for (_, _, function), (_, ncalls, _, _, _) in stats.stats.items():
        if function in calls:
            calls[function] += ncalls
    return calls


def attention_per_layer(stats: pstats.Stats) -> tuple:
    """(calls, ms per call) of ``hexcore_attention``, cumulative under cProfile."""
    calls, seconds = 0, 0.0
    for (path, _, function), (_, ncalls, _, cumulative, _) in stats.stats.items():
        if function == "hexcore_attention" and "hexcore" in path:
            calls, seconds = calls + ncalls, seconds + cumulative
    return calls, 1e3 * seconds / max(calls, 1)


def callers(stats: pstats.Stats) -> list:
    """One line per function named in COUNTED: its calls by each direct caller (file:line),
    hexcore's call sites first, so that a turn's checks and copies can be traced."""
    lines = []
    for (path, line, function), (_, ncalls, _, _, by) in sorted(stats.stats.items()):
        if function not in COUNTED or not ncalls:
            continue
        sites = sorted(((f"{_short(p)}:{n}({f})", c[1]) for (p, n, f), c in by.items()),
                       key=lambda site: ("hexcore" not in site[0], site[0]))
        shown = ", ".join(f"{site} {n}" for site, n in sites)
        lines.append(f"   {function} {ncalls} ({_short(path)}:{line}) <- {shown}")
    return lines


def _short(path: str) -> str:
    """``path`` from its package folder (hexcore/..., numba/...)."""
    for root in ("hexcore/", "numba_cuda/", "numba/", "benchmarks/"):
        if root in path:
            return root + path.split(root, 1)[1]
    return path


def counts(stats: pstats.Stats) -> str:
    """hexcore's attention time per layer (cumulative, under cProfile) and the calls of each
    function named in COUNTED, in one profiled turn, then where each is called from."""
    layers, per_layer = attention_per_layer(stats)
    shown = ", ".join(f"{name} {n}" for name, n in call_counts(stats).items())
    return "\n".join([f"-- hexcore_attention {layers} calls, {per_layer:.3f} ms per layer; calls per turn: {shown}",
                      *callers(stats)])


def report(name: str, result: dict, top: int) -> str:
    """The case's totals, its unprofiled times and launch counts where it has them,
    :func:`counts` and its ``top`` functions by cumulative time (hexcore's, then all)."""
    lines = [f"== {name}: wall {result['wall_ms']:.2f} ms (under both profilers), torch ops' CPU "
             f"{result['torch_cpu_ms']:.2f} ms, GPU {result['gpu_ms']:.2f} ms"]
    if result.get("unprofiled"):
        lines.append(unprofiled_line(result["unprofiled"]))
        lines.append(phases_line(result["phases"]))
    if result.get("launches"):
        lines.append(launch_line(result["launches"]))
    lines.append(counts(result["stats"]))
    for title, pattern in (("hexcore", "hexcore"), ("everything", "")):
        text = io.StringIO()
        stats = result["stats"]
        stats.stream = text
        stats.sort_stats("cumulative").print_stats(*([pattern] if pattern else []), top)
        body = text.getvalue()
        lines.append(f"-- {title}, by cumulative time --")
        lines.append(body[body.find("ncalls"):].rstrip() if "ncalls" in body else body.rstrip())
    return "\n".join(lines)


def tiny_turns(model, prompt_tokens: int):
    """Random ids for ``--tiny``: turn 1 ``[1, prompt_tokens]`` and turn 2's new question ``[1, 8]``."""
    import torch

    generator = torch.Generator().manual_seed(0)
    first = torch.randint(1, model.config.vocab_size, (1, prompt_tokens), generator=generator)
    return first.to(model.device), torch.randint(1, model.config.vocab_size, (1, 8), generator=generator).to(
        model.device)


def turn_two(model, cache_name, first, follow, new_tokens, pad) -> tuple:
    """(a cache after turn 1, turn 2's ids, a fresh cache for them): a hit's and a miss's start."""
    cache, ids, longest = after_turn_one(model, cache_name, first, follow, new_tokens, pad)
    return cache, ids, prefix_cache(model, cache_name, longest)


def warm_up(model, cache_name, first, follow, new_tokens, pad) -> None:
    """A hit and a miss, untimed: every kernel compiled."""
    cache, ids, fresh = turn_two(model, cache_name, first, follow, new_tokens, pad)
    first_token(model, cache, ids, pad)
    first_token(model, fresh, ids, pad)


def unprofiled(turn: tuple, repeats: int, cached: int, detail: bool = False) -> tuple:
    """({"hit", "miss": wall seconds of ``repeats`` turns each, no profiler}, {"hit", "miss":
    those turns' :func:`host_phases`}); each hit after its own turn 1, finding ``cached``
    tokens as the profiled one did."""
    model, pad = turn[0], turn[-1]
    times, phases = {"hit": [], "miss": []}, {"hit": [], "miss": []}
    for _ in range(repeats):
        cache, ids, fresh = turn_two(*turn)
        with host_phases(detail) as hit:
            seconds, found = first_token(model, cache, ids, pad)
        _check_cached(found, cached)
        times["hit"].append(seconds)
        with host_phases(detail) as miss:
            times["miss"].append(first_token(model, fresh, ids, pad)[0])
        phases["hit"].append(hit)
        phases["miss"].append(miss)
    return times, phases


# what ``--detail`` times inside a turn: (module, attribute path); nested ones overlap.
# Not torch's scaled_dot_product_attention itself: torch's causal-bias mask dispatches on
# that function's identity, and a wrapper sends it down the dense path (a shape error).
DETAIL = (("hexcore.integrations._hf_prefix", "Extend._start"), ("hexcore.integrations._hf_prefix", "Extend.commit"),
          ("hexcore.integrations._hf_prefix", "check_held_positions"),
          ("hexcore.integrations._hf_prefix", "real_tokens"), ("hexcore.integrations._hf_parts", "Prefill.stage"),
          ("hexcore.integrations._hf_parts", "Prefill.commit"), ("hexcore.engine", "Engine.batch_rows"),
          ("hexcore.engine", "Engine.prefill_attention_batch"), ("hexcore.engine", "Engine.prefill"),
          ("hexcore.cuda.launch", "PreparedLaunch.__init__"), ("hexcore.cuda.launch", "PreparedLaunch.run"),
          ("hexcore.cuda.attention.prefill", "upload_once"), ("hexcore.cuda.attention.prefill", "_sdpa_masked"))


class Phases(list):
    """:func:`host_phases`' host seconds: one entry per call of the "hexcore" attention
    function (one per layer of each forward, in order), ``admit``, those of
    ``HexcoreCache.admit``, and ``detail``: {name: [seconds of each call]} of the
    functions of :data:`DETAIL` when asked for."""

    def __init__(self):
        super().__init__()
        self.admit, self.detail = [], {}


@contextlib.contextmanager
def host_phases(detail: bool = False):
    """A :class:`Phases` filled while open: the host time of each call of the "hexcore"
    attention function and of ``HexcoreCache.admit`` (and with ``detail`` of the functions
    of :data:`DETAIL`); all restored on exit. No synchronisation is added: a call's time is
    its Python and torch dispatch, plus any wait for the GPU that the call itself makes."""
    import hexcore.integrations.transformers as hx

    found, admit = Phases(), hx.HexcoreCache.admit

    def timing(function, into):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                into.append(time.perf_counter() - start)
        return timed

    saved = []
    try:
        for module, path in DETAIL if detail else ():
            owner = importlib.import_module(module)
            *parents, name = path.split(".")
            for parent in parents:
                owner = getattr(owner, parent)
            saved.append((owner, name, owner.__dict__[name]))
            setattr(owner, name, timing(owner.__dict__[name], found.detail.setdefault(path, [])))
        hx.AttentionInterface.register(hx.ATTN_IMPLEMENTATION, timing(hx.hexcore_attention, found))
        hx.HexcoreCache.admit = timing(admit, found.admit)
        yield found
    finally:
        hx.AttentionInterface.register(hx.ATTN_IMPLEMENTATION, hx.hexcore_attention)
        hx.HexcoreCache.admit = admit
        for owner, name, original in reversed(saved):
            setattr(owner, name, original)


def phases_line(turns: list) -> str:
    """The median over turns of :func:`host_phases`' first, middle and last layer calls (the
    first forward's: the prefill), their sum and ``admit``; then, where timed, each
    :data:`DETAIL` function's time a turn."""
    layers = min(len(calls) for calls in turns)
    if layers < 3:
        line = f"-- host in the attention function: {layers} calls a turn (too few to split)"
    else:
        first = statistics.median(calls[0] for calls in turns)
        middle = statistics.median(statistics.median(calls[1:layers - 1]) for calls in turns)
        last = statistics.median(calls[layers - 1] for calls in turns)
        total = statistics.median(sum(calls[:layers]) for calls in turns)
        admit = statistics.median(sum(calls.admit) for calls in turns)
        line = (f"-- host in the attention function (median of {len(turns)} unprofiled turns): first layer "
                f"{1e3 * first:.3f} ms, middle layers {1e6 * middle:.0f} us each, last layer {1e3 * last:.3f} ms, "
                f"all {layers} layers {1e3 * total:.2f} ms; admit {1e3 * admit:.3f} ms")
    names = [name for name in turns[0].detail if turns[0].detail[name]]
    if names:  # --detail: per function, median over turns of its calls' sum (calls a turn)
        parts = [f"{name} {1e3 * statistics.median(sum(t.detail[name]) for t in turns):.3f} ms "
                 f"({len(turns[0].detail[name])})" for name in names]
        line += "\n-- host by function (median a turn, calls; nested ones overlap): " + ", ".join(parts)
    return line


def counted(turn: tuple, cached: int) -> dict:
    """{"hit", "miss": :func:`counted_launches`' counts of one turn}."""
    model, pad, found = turn[0], turn[-1], {}
    cache, ids, fresh = turn_two(*turn)
    for name, on in (("hit", cache), ("miss", fresh)):
        with counted_launches() as found[name]:
            hit = first_token(model, on, ids, pad)[1]
        if name == "hit":
            _check_cached(hit, cached)
    return found


def _check_cached(found: int, cached: int) -> None:
    if found != cached:
        raise RuntimeError(f"a repeated turn 2 found {found} tokens cached, the profiled one {cached}")


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", nargs="?", help="a folder with a GGUF file or a transformers checkpoint")
    parser.add_argument("--cache", default="fp16", help="the HexcoreCache kv_dtype")
    parser.add_argument("--system-repeats", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32, help="turn 1's answer")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--tiny", action="store_true", help="a small random Llama (checks this script)")
    parser.add_argument("--prompt-tokens", type=int, default=40, help="--tiny: turn 1's length")
    parser.add_argument("--layers", type=int, help="--tiny: decoder layers (default 2)")
    parser.add_argument("--detail", action="store_true",
                        help="the unprofiled turns' host time in each function of DETAIL too")
    parser.add_argument("--llama-8b-layers", action="store_true",
                        help="--tiny: Llama-3-8B's layer shape instead of the small one")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--stub", action="store_true", help="simulator only: kernel launches stubbed (host path)")
    parser.add_argument("--repeats", type=int, default=5, help="turns of each case timed with no profiler (best of)")
    args = parser.parse_args(argv)
    if args.repeats < 0:
        parser.error(f"--repeats: expected a count >= 0, got {args.repeats}")
    if args.llama_8b_layers and not args.tiny:
        parser.error("--llama-8b-layers: only with --tiny (a model folder brings its own shape)")
    with stubbed_launches() if args.stub else contextlib.nullcontext():
        return run(parser, args)


def run(parser, args) -> dict:
    """Turn 2 of ``args``' model profiled as a hit and as a miss, printed; the results."""
    if args.tiny:
        from benchmarks.bench_hf_decode import build_model, llama_config

        positions = max(4096, 2 * (args.prompt_tokens + args.new_tokens) + 64)
        model, pad = build_model(llama_config(args.layers, not args.llama_8b_layers, positions), args.device), 0
        first, follow = tiny_turns(model, args.prompt_tokens)
    elif args.model_dir:
        tokenizer, model = load(args.model_dir, args.device)
        pad = tokenizer.pad_token_id
        first = chat_ids(tokenizer, model, [PROMPTS[0]], args.system_repeats)
        follow = tokenizer(" " + PROMPTS[1], return_tensors="pt").input_ids.to(model.device)
    else:
        parser.error("a model folder or --tiny")
    results = {}
    turn = (model, args.cache, first, follow, args.new_tokens, pad)
    warm_up(*turn)  # compiles every kernel
    cache, ids, fresh = turn_two(*turn)
    cached = []
    results["hit"] = profiled(lambda: cached.append(first_token(model, cache, ids, pad)[1]))
    results["miss"] = profiled(lambda: first_token(model, fresh, ids, pad))
    print(f"turn 2: {ids.shape[1]} tokens, {cached[0]} cached ({args.cache})")
    (timed, phases), found = unprofiled(turn, args.repeats, cached[0], args.detail), counted(turn, cached[0])
    for name in results:
        results[name].update(unprofiled=timed[name], phases=phases[name], launches=found[name])
    for name, result in results.items():
        print(report(name, result, args.top))
    return results


if __name__ == "__main__":
    main()
