"""``hexcore demo``: a serving run sized for the machine, with a progress bar and a summary.

On a GPU the run uses a preset's attention shapes (llama-3-8b: 32 query heads, 8 KV
heads, head_dim 128) over ``DEMO_LAYERS`` layers; on numba's CUDA simulator, which runs
one Python thread per CUDA thread, tiny shapes and a handful of requests, so the run
finishes in about a minute on a small CPU. The serving loop is :class:`hexcore.serve.Server`
(its Engine runs the speculative allocator; :mod:`hexcore.serve_faults` its fault drill).
With ``format`` (a format by age, e.g. ``"int2-aged"``) the cache holds blocks by age
instead, without speculative allocation, block events or the fault drill.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from typing import NamedTuple

import numpy as np

from ._checks import as_int
from .config import PRESETS, KVCacheConfig
from .errors import HexcoreInvalidArgumentError
from .quant import kv_format
from .serve import Server, ServeReport
from .serve_workload import Workload, synthetic_workload

DEMO_LAYERS = 4  # layers of the GPU run (a full model has 32: the shapes per layer are the real ones)
MIB = 1 << 20


@dataclasses.dataclass(frozen=True)
class DemoShape:
    """Sizes of one demo run: the cache, the pool and the workload's distributions."""

    where: str
    config: KVCacheConfig
    num_q_heads: int
    num_blocks: int
    max_seqs: int
    prompt_mean: float
    prompt_max: int
    output_mean: float
    output_max: int
    arrivals_per_step: float
    check_every: int
    check_seqs: int
    batch_buckets: tuple = (1, 2, 4, 8, 16, 32, 64)
    sample_every: int = 16  # sampled verification: each block once in this many steps
    format: str | None = None  # a format by age (hexcore.quant.FORMATS), or None: config.kv_dtype


def demo_shape(simulated: bool, preset: str = "llama-3-8b", kv_dtype: str = "int4", block_size: int = 32,
               layers: int = DEMO_LAYERS, format: str | None = None) -> DemoShape:
    """The run's sizes: the preset's attention shapes on a GPU; tiny ones on the simulator.
    ``format``: a format by age to hold the blocks in (``kv_dtype`` is then unused). A bad
    preset, dtype, size or format raises HexcoreConfigError naming it."""
    if format is not None:
        kv_format(format)  # (a format by age, or a name in hexcore.quant.FORMATS)
    if simulated:
        cfg = KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=64, block_size=16, kv_dtype=kv_dtype,
                            group_size=32)
        return DemoShape("CUDA simulator, tiny shapes (1 layer, 2 query heads / 1 KV head, head_dim 64)", cfg,
                         2, num_blocks=4, max_seqs=4, prompt_mean=20, prompt_max=30, output_mean=5, output_max=8,
                         arrivals_per_step=1.0, check_every=2, check_seqs=1, batch_buckets=(1, 2, 4),
                         sample_every=2, format=format)
    cfg = dataclasses.replace(KVCacheConfig.from_preset(preset, kv_dtype, block_size), num_layers=layers)
    model = PRESETS[preset]
    # a pool that holds ~48 average sequences: with 64 slots it runs dry, and preempts
    prompt_mean, output_mean = 600, 128
    num_blocks = int(48 * (prompt_mean + output_mean) / block_size)
    return DemoShape(f"GPU, {preset} attention shapes ({model.num_q_heads} query heads / {model.num_kv_heads} "
                     f"KV heads, head_dim {model.head_dim}), {layers} layers", cfg, model.num_q_heads, num_blocks,
                     max_seqs=64, prompt_mean=prompt_mean, prompt_max=4000, output_mean=output_mean,
                     output_max=512, arrivals_per_step=2.0, check_every=16, check_seqs=2, format=format)


def default_requests(simulated: bool) -> int:
    """Requests of a default run: 8 on the simulator, 256 on a GPU."""
    return 8 if simulated else 256


class _Progress:
    """A tqdm bar over the tokens to generate (no bar when tqdm is not installed or off)."""

    def __init__(self, total: int, enabled: bool):
        self.bar = None
        if enabled:
            try:
                from tqdm import tqdm
            except ImportError:
                print("(no progress bar: pip install 'hexcore-llm[demo]' for one)", file=sys.stderr)
            else:
                self.bar = tqdm(total=total, unit="tok", desc="serving", file=sys.stderr, dynamic_ncols=True)
        self._done = 0

    def __call__(self, report: ServeReport, server: Server) -> None:
        if self.bar is not None and report.decode_tokens > self._done:
            self.bar.update(report.decode_tokens - self._done)
            self._done = report.decode_tokens
            self.bar.set_postfix(running=len(server.running), waiting=len(server.waiting),
                                 blocks=server.active_blocks, refresh=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def run_demo(shape: DemoShape, num_requests: int, seed: int = 0, max_steps: int | None = None,
             progress: bool = True, warmup: bool | None = None) -> dict:
    """Serve ``num_requests`` synthetic requests at ``shape``; the summary as a dict (see
    :func:`summary_rows` for what each entry means).

    ``warmup`` (default: on a GPU, not on the simulator, which compiles nothing): first
    :func:`warm_up` (a throwaway run that compiles every kernel the run will use) and, for a
    plain dtype, capture the run's decode graphs (:func:`capture_graphs`), timed apart from
    the run. Kernels compiled during the run itself are counted either way
    (``hexcore.cuda.compiles``)."""
    from .cuda import compiles
    from .cuda.device import SIMULATOR

    if not isinstance(shape, DemoShape):
        raise HexcoreInvalidArgumentError(f"shape: expected a DemoShape, got {type(shape).__name__}")
    warmup = not SIMULATOR if warmup is None else warmup
    rng = np.random.default_rng(as_int("seed", seed, low=0))
    workload = synthetic_workload(num_requests, rng, shape.prompt_mean, shape.prompt_max, shape.output_mean,
                                  shape.output_max, shape.arrivals_per_step)
    fault = shape.format is None and _fault_tolerance_available()
    with compiles.recording() as log:
        server, warm = _prepared(shape, workload, seed, fault, warmup, log)
        mark = log.mark()
        report = _served(server, int(workload.output_lens.sum()), progress, max_steps)
        warm = warm._replace(in_run=tuple(log.since(mark)))
    if not fault:
        note = "not with a format by age" if shape.format else "hexcore.fault is not in this build"
        return summarize(shape, report, {"available": False, "note": note}, warm)
    return summarize(shape, report, {"available": True, "injected": report.corruptions_injected,
                                     "detected": report.corruptions_detected,
                                     "migrated": report.sequences_migrated, "blocks_verified": report.blocks_verified,
                                     "sample_every": shape.sample_every}, warm)


def _prepared(shape: DemoShape, workload: Workload, seed: int, fault: bool, warmup: bool, log) -> tuple:
    """(the run's Server, its :class:`WarmUp`): with ``warmup``, :func:`warm_up` before the
    Server is made and :func:`capture_graphs` after, both timed (``log``: the open
    ``compiles.recording()``, whose entries so far are the warm-up's)."""
    from .cuda.device import SIMULATOR

    seconds = _timed(warm_up, shape, seed) if warmup else 0.0
    server = _server(shape, workload, seed, None, fault)
    graphs = 0
    if warmup:
        graphs, capture_seconds = _timed(capture_graphs, server, shape, result=True)
        seconds += capture_seconds
    return server, WarmUp(warmup, seconds, log.since(0), graphs, simulated=SIMULATOR)


def _served(server: Server, tokens: int, progress: bool, max_steps: int | None) -> ServeReport:
    """``server.run(max_steps)`` under a progress bar over ``tokens``."""
    bar = _Progress(tokens, progress)
    server.on_step = bar
    try:
        return server.run(max_steps)
    finally:
        bar.close()


def _timed(function, *args, result: bool = False):
    """Seconds ``function(*args)`` took; with ``result``, (its result, the seconds)."""
    start = time.perf_counter()
    value = function(*args)
    seconds = time.perf_counter() - start
    return (value, seconds) if result else seconds


class WarmUp(NamedTuple):
    """What came before the timed run: whether the warm-up ran, its ``seconds`` (the
    throwaway run and the graph captures), the kernels compiled
    then (``compiled``: ``hexcore.cuda.compiles.Compile`` entries), the decode graphs
    captured (``graphs``), and what compiled during the timed run (``in_run``: none when the
    warm-up covered the run; on the simulator, ``simulated``, kernels' first launches)."""

    ran: bool
    seconds: float
    compiled: list
    graphs: int
    in_run: tuple = ()
    simulated: bool = False  # numba's CUDA simulator: first launches stand for compilations


def _server(shape: DemoShape, workload, seed: int, on_step, fault: bool, max_seqs: int | None = None,
            num_blocks: int | None = None) -> Server:
    """A Server at ``shape`` (its pool and slots unless ``num_blocks``/``max_seqs`` are given)."""
    return Server(shape.config, shape.num_q_heads, num_blocks or shape.num_blocks, max_seqs or shape.max_seqs,
                  workload, seed=seed, check_every=shape.check_every, check_seqs=shape.check_seqs,
                  batch_buckets=shape.batch_buckets, on_step=on_step, fault_tolerance=fault,
                  sample_every=shape.sample_every, inject_at=INJECT_AT, format=shape.format)


INJECT_AT = 3  # the step at which the fault drill flips its bit (run and warm-up alike)
WARMUP_SEQS = 4  # sequence slots of the warm-up's throwaway Server


def warmup_workload(shape: DemoShape) -> Workload:
    """Requests that take every kernel path a run at ``shape`` can take, in few steps:

    - a prompt shorter than a block (append only), growing past a block in decode steps
      (a seal from the tail: the sink's FP16 block with a format by age);
    - a prompt of two whole blocks (sealed from its rows, nothing appended), then a block
      more of steps (a seal from the tail into the format's first tier);
    - a prompt of a block and a half (rows sealed, the rest appended);
    - when the run's longest request reaches past the format's oldest tier: a prompt past
      it (blocks sealed straight into every pool) whose steps cross a block boundary (a
      re-seal as a block ages).

    Batches of 1 (the first step) and of several; every check and (plain dtype) the fault
    drill's injection, detection and recompute at the run's settings. Arrivals, prompt and
    output lengths: int64 ``[3]``, or ``[4]`` with the long prompt."""
    bs = shape.config.block_size
    prompts, outputs = [1, 2 * bs, bs + bs // 2], [bs + 1, bs + 1, 2]
    horizon = _format_horizon(shape)
    if horizon and shape.prompt_max + shape.output_max > horizon:
        prompts.append(horizon + bs // 2)
        outputs.append(bs + 1)
    arrivals = [0] + [1] * (len(prompts) - 1)  # one sequence alone first, then a batch
    return Workload(*(np.array(x, np.int64) for x in (arrivals, prompts, outputs)))


def _format_horizon(shape: DemoShape) -> int:
    """Tokens past which every block of a sequence has reached the format's oldest tier
    (0 without a format)."""
    if shape.format is None:
        return 0
    fmt = kv_format(shape.format)
    return (fmt.sink_blocks + 2) * shape.config.block_size + max([t.min_age for t in fmt.tiers], default=0)


def warm_up(shape: DemoShape, seed: int = 0) -> ServeReport:
    """Serve :func:`warmup_workload` on a throwaway Server of ``shape``'s config, format,
    query heads, batch buckets, checks and fault drill (its pool just large enough, at most
    ``WARMUP_SEQS`` slots): every kernel the run at ``shape`` uses is compiled on first
    launch, and the kernel factories (``functools.cache`` over the config, the decode shape
    and flags, never over pool sizes) hand the run the same compiled kernels. Then releases
    every speculative reservation, as a step that finds the pool full does (the H200's int4
    run once compiled that host function mid-run). Its report."""
    workload = warmup_workload(shape)
    bs = shape.config.block_size
    num_blocks = int(sum((p + o) // bs + 2 for p, o in zip(workload.prompt_lens, workload.output_lens)))
    fault = shape.format is None and _fault_tolerance_available()
    server = _server(shape, workload, seed, None, fault, max_seqs=min(WARMUP_SEQS, shape.max_seqs),
                     num_blocks=num_blocks)
    report = server.run()
    if server.engine.speculative is not None:  # the OOM retry's path, which a run under pool pressure takes
        server.engine.speculative.release_all()
    _synchronize()
    return report


def capture_graphs(server: Server, shape: DemoShape) -> int:
    """Capture the decode graphs of ``server``'s Engine (plain dtype, a GPU) for every batch
    bucket and every context bucket up to the run's longest request, as an engine does at
    start-up, so that no step of the run captures one (``DecodeGraph.warmup``: runs changing
    nothing in the store). The number captured (0 for a format by age, or eager graphs)."""
    graph = server.engine.graph
    if graph is None or graph.backend == "eager":
        return 0
    longest = min(shape.prompt_max + shape.output_max, graph.capacity)
    contexts = sorted({graph.context_bucket(n) for n in _doublings(shape.config.block_size, longest)})
    for batch in graph.batch_buckets:
        for context in contexts:
            graph.warmup(batch, context)
    _synchronize()
    return len(graph.batch_buckets) * len(contexts)


def _doublings(first: int, last: int) -> list:
    """``first``, ``2 first``, ... while below ``last``, then ``last``."""
    out = [first]
    while out[-1] < last:
        out.append(min(2 * out[-1], last))
    return out


def _synchronize() -> None:
    from numba import cuda

    cuda.synchronize()


def _fault_tolerance_available() -> bool:
    try:
        from .fault import FaultTolerantKVCache  # noqa: F401
    except ImportError:
        return False
    return True


def summarize(shape: DemoShape, report: ServeReport, fault: dict, warm: WarmUp | None = None) -> dict:
    """The run's figures, JSON-ready. The step times and tokens/s are the timed run's;
    ``warm`` (None: no warm-up, nothing recorded) what came before it, apart."""
    cfg = shape.config
    warm = warm or WarmUp(False, 0.0, [], 0)
    steps = np.array(report.step_seconds) * 1e3
    step_time = float(np.sum(report.step_seconds))
    return {
        "where": shape.where, "kv_dtype": shape.format or cfg.kv_dtype.value, "format": shape.format,
        "layers": cfg.num_layers,
        "num_blocks": shape.num_blocks, "max_seqs": shape.max_seqs, "block_size": cfg.block_size,
        "requests": report.requests, "requests_finished": report.requests_finished,
        "preemptions": report.preemptions, "recomputed_tokens": report.recomputed_tokens,
        "steps": report.steps, "decode_tokens": report.decode_tokens, "prefill_tokens": report.prefill_tokens,
        "peak_batch": report.peak_batch,
        "decode_tokens_per_s": report.decode_tokens / step_time if step_time else math.nan,
        "wall_tokens_per_s": report.decode_tokens / report.wall_seconds if report.wall_seconds else math.nan,
        "wall_seconds": report.wall_seconds, "prefill_seconds": report.prefill_seconds,
        "step_ms_p50": float(np.percentile(steps, 50)) if len(steps) else math.nan,
        "step_ms_p99": float(np.percentile(steps, 99)) if len(steps) else math.nan,
        "peak_active_blocks": report.peak_active_blocks, "peak_tokens": report.peak_tokens,
        "peak_kv_bytes": report.peak_kv_bytes, "peak_kv_bytes_fp16": report.peak_kv_bytes_fp16,
        "seals": report.seals, "reseals": report.reseals, "speculative_hits": report.seal_hits,
        "speculative_hit_rate": report.seal_hits / report.seals if report.seals and not shape.format else math.nan,
        "mispredicted": report.mispredicted,
        "events_applied": report.events_applied, "mirror_mismatches": report.mirror_mismatches,
        "fault_tolerance": fault,
        "checked_outputs": report.checked_outputs,
        "attention_error_mean": report.mean_error, "attention_error_max": report.max_error,
        "simulated": warm.simulated, "warmup": warm.ran, "warmup_seconds": warm.seconds, "warmup_kernels_compiled": len(warm.compiled),
        "warmup_compile_seconds": sum(c.seconds for c in warm.compiled), "warmup_graphs_captured": warm.graphs,
        "kernels_compiled_in_run": len(warm.in_run), "compile_seconds_in_run": sum(c.seconds for c in warm.in_run),
        "compiled_in_run": sorted({c.name for c in warm.in_run}),
    }


def summary_rows(s: dict) -> list[tuple[str, str]]:
    """(what, figure) rows of the closing table."""
    ratio = s["peak_kv_bytes_fp16"] / s["peak_kv_bytes"] if s["peak_kv_bytes"] else math.nan
    fault = s["fault_tolerance"]
    corruptions = (f"{fault['detected']} of {fault['injected']} injected ({fault['migrated']} sequences migrated, "
                   f"{fault['blocks_verified']:,} block checks, 1 in {fault['sample_every']} sampled)"
                   if fault.get("available") else f"n/a ({fault['note']})")
    return [
        ("requests served", f"{s['requests_finished']} of {s['requests']} ({s['preemptions']} preemptions, "
                            f"{s['recomputed_tokens']:,} tokens recomputed)"),
        ("tokens", f"{s['decode_tokens']:,} decoded in {s['steps']:,} steps (batch up to {s['peak_batch']}), "
                   f"{s['prefill_tokens']:,} prefilled"),
        ("tokens/s", f"{_rate(s['decode_tokens_per_s'])} in decode steps, {_rate(s['wall_tokens_per_s'])} over "
                     f"the whole run ({s['wall_seconds']:.1f} s)"),
        ("step latency p50 / p99", f"{s['step_ms_p50']:.2f} / {s['step_ms_p99']:.2f} ms"),
        ("compile and warm-up", _warmup_figure(s)),
        ("peak blocks", f"{s['peak_active_blocks']:,} of {s['num_blocks']:,} ({s['peak_tokens']:,} tokens live)"
         if not s.get("format") else f"{s['peak_tokens']:,} tokens live, the last pool {s['num_blocks']:,} blocks"),
        (f"KV memory at peak ({s['kv_dtype']})", f"{_size(s['peak_kv_bytes'])} in sealed blocks; FP16 would "
                                                 f"need {_size(s['peak_kv_bytes_fp16'])} ({ratio:.2f}x)"),
        ("speculative allocation", f"{s['speculative_hit_rate']:.1%} of {s['seals']:,} seals hit a reserved "
                                   f"block, {s['mispredicted']} mispredicted" if not s.get("format") else
         f"n/a (a format by age: {s['seals']:,} seals, {s['reseals']:,} re-seals as blocks aged)"),
        ("block events", f"{s['events_applied']:,} applied by the mirror, {s['mirror_mismatches']} table "
                         f"mismatches" if not s.get("format") else "n/a (a format by age)"),
        ("corruptions detected", corruptions),
        ("attention error vs FP16", f"mean {s['attention_error_mean']:.2e}, max {s['attention_error_max']:.2e} "
                                    f"(rel. L2, {s['checked_outputs']} outputs vs float64 over exact FP16 K/V)"),
    ]


def _warmup_figure(s: dict) -> str:
    """The warm-up's row: its time and compilations, and what compiled during the run anyway."""
    late = s["kernels_compiled_in_run"]
    if not s["warmup"]:
        if s["simulated"]:
            return f"none (no kernel compiles on the simulator; {late} first launched or compiled during the run)"
        return (f"none: {late} compiled during the run, {s['compile_seconds_in_run']:.1f} s counted in "
                f"its steps")
    graphs = f", {s['warmup_graphs_captured']} decode graphs captured" if s["warmup_graphs_captured"] else ""
    during = ("none compiled during the run" if not late else
              f"{late} compiled during the run ({s['compile_seconds_in_run']:.1f} s in its steps: "
              f"{', '.join(s['compiled_in_run'][:4])})")
    return (f"{s['warmup_seconds']:.1f} s before the run, not in the figures above ({s['warmup_kernels_compiled']} "
            f"compiled in {s['warmup_compile_seconds']:.1f} s{graphs}); {during}")


def _rate(per_s: float) -> str:
    """Thousands separators above 100/s, three significant digits below (the simulator)."""
    return f"{per_s:,.0f}" if per_s >= 100 else f"{per_s:.3g}"


def _size(nbytes: int) -> str:
    return f"{nbytes / MIB:,.1f} MiB" if nbytes >= MIB else f"{nbytes / 1024:,.1f} KiB"


def format_summary(s: dict) -> str:
    """The closing table as aligned text."""
    rows = summary_rows(s)
    width = max(len(what) for what, _ in rows)
    lines = [f"served on {s['where']}, {s['kv_dtype']} KV cache:"]
    lines += [f"  {what:<{width}}  {figure}" for what, figure in rows]
    return "\n".join(lines)


def write_json(summary: dict, path: str) -> None:
    """The summary as JSON (NaN written as null)."""
    clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in summary.items()}
    with open(path, "w") as f:
        json.dump(clean, f, indent=1)
