"""The ``hexcore`` command: ``demo`` (the main job), ``plan`` (capacity planner), ``bench`` (report).

Every flag is checked where it is parsed: a bad value prints one line naming the flag
(``hexcore: argument --budget-gib: expected ...``) and exits with status 2, never a
traceback; :func:`main` returns its status and never raises.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys

from .config import PRESETS, KVCacheConfig, KVDtype
from ._checks import as_int
from .errors import HexcoreError, HexcoreInvalidArgumentError
from .quant import FORMATS

GIB = 1 << 30
MAX_BUDGET_GIB = 2**32  # 4 EiB: budgets stay exact ints far below hexcore's 2**62 limit
MAX_SEQS = 2**31 - 1
BLOCK_SIZES = (16, 32, 64, 128, 256)
MAX_STEPS = 1_000_000
MAX_REQUESTS = 100_000
MAX_CONTEXT = 2**31 - 1
UNITS = {"": GIB, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": GIB, "tib": 1 << 40,
         "k": 1 << 10, "m": 1 << 20, "g": GIB, "t": 1 << 40, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}


def _budget_gib(text: str) -> float:
    try:
        value = float(text)
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(f"expected a number of GiB, got {text[:40]!r}") from None
    if not _budget_ok(value):
        raise argparse.ArgumentTypeError(f"expected a finite number of GiB in [2**-30, {MAX_BUDGET_GIB}), "
                                         f"got {text[:40]!r}")
    return value


def _budget_ok(value) -> bool:
    try:
        return math.isfinite(value) and 2**-30 <= value < MAX_BUDGET_GIB
    except (TypeError, OverflowError):
        return False


def _memory(text: str) -> float:
    """``80GiB``, ``512MiB``, ``1.5TiB``, ``80GB`` or a plain number of GiB -> GiB."""
    match = re.fullmatch(r"\s*([0-9.eE+-]+)\s*([A-Za-z]*)\s*", text)
    unit = match and match.group(2).lower()
    if not match or unit not in UNITS:
        raise argparse.ArgumentTypeError(f"expected a size such as 80GiB, 512MiB or 80GB, got {text[:40]!r}")
    try:
        value = float(match.group(1)) * UNITS[unit] / GIB
    except (ValueError, OverflowError):
        value = math.nan
    if not _budget_ok(value):
        raise argparse.ArgumentTypeError(f"expected a size in [1 byte, {MAX_BUDGET_GIB} GiB), got {text[:40]!r}")
    return value


def _json_path(text: str) -> str:
    folder = os.path.dirname(os.path.abspath(text))
    if not text or os.path.isdir(text) or not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"expected a file path in an existing folder, got {text[:80]!r}")
    return text


def _out_dir(text: str) -> str:
    if not text or (os.path.exists(text) and not os.path.isdir(text)):
        raise argparse.ArgumentTypeError(f"expected a folder path, got {text[:80]!r}")
    return text


def _int_in(low: int, high: int, what: str = "an int"):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except (ValueError, OverflowError):
            raise argparse.ArgumentTypeError(f"expected {what} in [{low}, {high}], got {text[:40]!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected {what} in [{low}, {high}], got {text[:40]!r}")
        return value

    parse.__name__ = "int"
    return parse


def _block_size(text: str) -> int:
    try:
        value = int(text)
    except (ValueError, OverflowError):
        value = None
    if value not in BLOCK_SIZES:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(map(str, BLOCK_SIZES))}, got {text[:40]!r}")
    return value


class _ParseError(Exception):
    """A bad command line: argparse's message, printed as one line."""


class _Parser(argparse.ArgumentParser):
    # argparse prints usage and calls sys.exit on a bad argument; main returns 2 instead
    def error(self, message):
        raise _ParseError(message)

    def exit(self, status=0, message=None):
        if message:
            print(message, file=sys.stderr, end="")
        raise _Exit(status)


class _Exit(Exception):
    def __init__(self, status):
        super().__init__(status)
        self.status = status


def capacity_table(preset: str, budget_gib: float, max_seqs: int, block_size: int,
                   context: int | None = None) -> str:
    """The capacity of each KV dtype for ``preset`` in a budget, as aligned text.

    ``budget_gib``: a finite number in [2**-30, 2**32); ``max_seqs`` and ``block_size``
    follow the integer rule (HexcoreInvalidArgumentError or HexcoreConfigError otherwise).
    ``context`` (tokens, optional): adds the sequences of that length that fit together
    (each holds ``context // block_size`` sealed blocks and its FP16 tail).
    """
    if isinstance(budget_gib, bool) or not isinstance(budget_gib, (int, float)) or not _budget_ok(budget_gib):
        raise HexcoreInvalidArgumentError(f"budget_gib: expected a finite number in [2**-30, {MAX_BUDGET_GIB}), "
                                          f"got {budget_gib!r:.40}")
    if context is not None:
        context = as_int("context", context, low=1, high=MAX_CONTEXT)
    budget = int(budget_gib * GIB)
    header = f"{'dtype':<6} {'bytes/token':>12} {'block MiB':>10} {'blocks':>10} {'tokens':>12} {'vs fp16':>8}"
    if context is not None:
        header += f" {'seqs @ ' + format(context, ','):>14}"
    lines = [f"{preset}: {budget_gib:g} GiB budget, {max_seqs} sequences, block_size {block_size}", header]
    for dtype in KVDtype:
        cfg = KVCacheConfig.from_preset(preset, kv_dtype=dtype, block_size=block_size)
        line = (f"{dtype.value:<6} {cfg.block_bytes / cfg.block_size:>12.1f} {cfg.block_bytes / (1 << 20):>10.3f} "
                f"{cfg.blocks_for_budget(budget, max_seqs):>10,} {cfg.tokens_for_budget(budget, max_seqs):>12,} "
                f"{cfg.compression_ratio:>7.2f}x")
        if context is not None:
            line += f" {sequences_at_context(cfg, budget, context):>14,}"
        lines.append(line)
    return "\n".join(lines + format_rows(preset, budget, block_size, context or FORMAT_CONTEXT))


FORMAT_CONTEXT = 4096  # the context at which `plan` prices formats by age without --context


def format_rows(preset: str, budget_bytes: int, block_size: int, context: int) -> list[str]:
    """The formats by age (``hexcore.quant.FORMATS`` past the plain dtypes) as table lines:
    bytes per token of a ``context``-token sequence (its blocks at the precision their age
    gives them, its FP16 tail), the ratio to FP16, and how many such sequences fit; a format
    whose tier ages are not multiples of ``block_size`` is listed without figures.
    ``budget_bytes`` and ``context``: ints >= 1 (HexcoreInvalidArgumentError otherwise)."""
    from . import quant

    budget_bytes, context = _budget_bytes(budget_bytes), as_int("context", context, 1, MAX_CONTEXT)
    cfg = KVCacheConfig.from_preset(preset, block_size=block_size)
    shape = dict(head_dim=cfg.head_dim, block_size=block_size, group_size=cfg.group_size, context=context,
                 num_layers=cfg.num_layers, num_kv_heads=cfg.num_kv_heads)
    fp16 = quant.FORMATS["fp16"].bytes_per_token(**shape)
    lines = ["", f"formats by age, one sequence of {context:,} tokens (Engine(format=...), HexcoreCache(kv_dtype=...), "
                 "hexcore demo --format; docs/formats.md)",
             f"{'format':<10} {'bytes/token':>12} {'vs fp16':>8} {'seqs @ ' + format(context, ','):>14}"]
    for name, fmt in quant.FORMATS.items():
        if name in {d.value for d in KVDtype}:
            continue
        ages = [t.min_age for t in fmt.tiers]
        if any(a % block_size for a in ages):
            lines.append(f"{name:<10} {'-':>12} (its tier ages {ages} are not multiples of block_size {block_size})")
            continue
        per_token = fmt.bytes_per_token(**shape)
        seqs = int(budget_bytes // round(per_token * context))
        lines.append(f"{name:<10} {per_token:>12.1f} {fp16 / per_token:>7.2f}x {seqs:>14,}")
    return lines


def sequences_at_context(cfg: KVCacheConfig, budget_bytes: int, context: int) -> int:
    """Sequences of ``context`` tokens whose sealed blocks and tails fit ``budget_bytes`` together
    (``cfg`` a KVCacheConfig, ``budget_bytes`` and ``context`` ints >= 1)."""
    if not isinstance(cfg, KVCacheConfig):
        raise HexcoreInvalidArgumentError(f"cfg: expected KVCacheConfig, got {type(cfg).__name__}")
    budget_bytes, context = _budget_bytes(budget_bytes), as_int("context", context, 1, MAX_CONTEXT)
    return budget_bytes // (cfg.tail_bytes + (context // cfg.block_size) * cfg.block_bytes)


def _budget_bytes(value) -> int:
    """A budget in bytes: an int in [1, MAX_BUDGET_GIB GiB)."""
    return as_int("budget_bytes", value, 1, MAX_BUDGET_GIB * GIB - 1)


def _simulator_unless_gpu() -> bool:
    """The CUDA simulator (made faster) when no GPU is present and the user chose nothing;
    True when it is on. Before anything imports numba.cuda."""
    from ._runtime import use_simulator_if_no_gpu

    simulated = use_simulator_if_no_gpu()
    if simulated:
        from .cuda.simulated import use_fast_simulator

        use_fast_simulator()
    return simulated


def _layout_report(preset: str, block_size: int) -> str:
    simulated = _simulator_unless_gpu()
    from .cuda import layout_agrees

    where = "CUDA simulator" if simulated else "GPU"
    results = []
    for dtype in KVDtype:
        cfg = KVCacheConfig.from_preset(preset, kv_dtype=dtype, block_size=block_size)
        small = KVCacheConfig(num_layers=2, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                              block_size=min(block_size, 16), kv_dtype=dtype, group_size=cfg.group_size)
        results.append(f"{dtype.value} {'agrees' if layout_agrees(small, num_blocks=2) else 'DISAGREES'}")
    return f"layout agreement ({where}): " + ", ".join(results)


def _serve_report(args) -> str:
    simulated = _simulator_unless_gpu()
    from .demo import default_requests, demo_shape, format_summary, run_demo, write_json

    shape = demo_shape(simulated, args.preset, args.kv_dtype, args.block_size, format=args.format)
    requests = args.requests or default_requests(simulated)
    pool = f"last pool of {shape.num_blocks} blocks" if args.format else f"pool of {shape.num_blocks} blocks"
    print(f"serving {requests} requests ({args.format or shape.config.kv_dtype.value}, {shape.where}; {pool}, "
          f"{shape.max_seqs} sequence slots)", flush=True)
    summary = run_demo(shape, requests, seed=args.seed, max_steps=args.steps, progress=not args.no_progress,
                       warmup=False if args.no_warmup else None)
    if args.json:
        write_json(summary, args.json)
    return format_summary(summary)


def _bench(args) -> int:
    if os.path.isfile(os.path.join("benchmarks", "report.py")) and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # the console script does not put the checkout on the path
    try:
        from benchmarks import report
    except ImportError:
        print("hexcore: bench runs from a checkout of the repository (benchmarks/ is not installed): "
              "cd to it and run python -m hexcore bench", file=sys.stderr)
        return 2
    return report.main(["--out", args.out] + (["--quality"] if args.quality else [])
                       + (["--quick"] if args.quick else []))


def _add_capacity_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="llama-3-8b", choices=sorted(PRESETS))
    p.add_argument("--budget-gib", type=_budget_gib, default=40.0, help="KV cache memory budget in GiB")
    p.add_argument("--max-seqs", type=_int_in(1, MAX_SEQS), default=256, help="live sequences (each holds a tail)")
    p.add_argument("--block-size", type=_block_size, default=32, help="tokens per block: 16, 32, 64, 128 or 256")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="hexcore", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    demo = sub.add_parser("demo", help="capacity table, layout check, and a serving loop")
    _add_capacity_args(demo)
    demo.add_argument("--kv-dtype", default="int4", choices=[d.value for d in KVDtype])
    demo.add_argument("--format", default=None, choices=[f for f in FORMATS if f not in {d.value for d in KVDtype}],
                      help="serve from a format by age instead of one kv-dtype (no speculative allocation, block "
                           "events or fault drill)")
    demo.add_argument("--requests", type=_int_in(1, MAX_REQUESTS), default=None,
                      help="requests to serve (default: 256 on a GPU, 8 on the simulator)")
    demo.add_argument("--seed", type=_int_in(0, 2**63 - 1), default=0, help="seed of the workload and the data")
    demo.add_argument("--steps", type=_int_in(0, MAX_STEPS), default=None,
                      help="stop after this many steps (default: when every request is served; 0: no serving)")
    demo.add_argument("--json", type=_json_path, default=None, metavar="PATH", help="write the summary as JSON")
    demo.add_argument("--no-progress", action="store_true", help="no progress bar")
    demo.add_argument("--no-warmup", action="store_true",
                      help="no warm-up before the timed run (on a GPU the kernels then compile in the steps that "
                           "first use them, counted in the summary; the simulator never warms up)")
    plan = sub.add_parser("plan", help="capacity planner: what fits a memory budget")
    _add_capacity_args(plan)
    plan.add_argument("--memory", type=_memory, default=None, metavar="SIZE",
                      help="memory budget with a unit (80GiB, 512MiB, 80GB); overrides --budget-gib")
    plan.add_argument("--context", type=_int_in(1, MAX_CONTEXT), default=None,
                      help="tokens per sequence: also show how many such sequences fit")
    bench = sub.add_parser("bench", help="run the benchmarks; write JSON and PNG plots (needs the checkout)")
    bench.add_argument("--out", type=_out_dir, default="bench-report", metavar="DIR", help="report folder")
    bench.add_argument("--quality", action="store_true", help="also run benchmarks.bench_quality (a real model)")
    bench.add_argument("--quick", action="store_true", help="fewer rounds and pool sizes (a smoke run)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``hexcore`` command; returns the exit status (0, or 2 for a bad
    argument or a typed hexcore error, 130 when interrupted). Never raises."""
    try:
        if argv is not None:
            if isinstance(argv, (str, bytes)) or not hasattr(argv, "__iter__"):
                raise _ParseError(f"expected a list of str arguments, got {argv!r:.80}")
            argv = list(argv)
            if not all(isinstance(a, str) for a in argv):
                raise _ParseError(f"expected a list of str arguments, got {argv!r:.80}")
        args = _parser().parse_args(argv)
    except _ParseError as exc:
        # one line, whatever argparse wrote
        print(f"hexcore: {' '.join(str(exc).split())} (hexcore --help)", file=sys.stderr)
        return 2
    except _Exit as done:  # --help
        return done.status if isinstance(done.status, int) else 2
    try:
        if args.command == "bench":
            return _bench(args)
        budget = args.budget_gib if getattr(args, "memory", None) is None else args.memory
        print(capacity_table(args.preset, budget, args.max_seqs, args.block_size, getattr(args, "context", None)))
        if args.command == "demo":
            print(_layout_report(args.preset, args.block_size))
            if args.steps != 0:
                print(_serve_report(args))
    except HexcoreError as exc:
        print(f"hexcore: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("hexcore: interrupted", file=sys.stderr)
        return 130
    return 0
