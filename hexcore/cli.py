"""The ``hexcore`` command: ``demo`` (the main job), ``plan`` (capacity planner).

Every flag is checked where it is parsed: a bad value prints one line naming the flag
(``hexcore: argument --budget-gib: expected ...``) and exits with status 2, never a
traceback; :func:`main` returns its status and never raises.
"""

from __future__ import annotations

import argparse
import math
import sys

from .config import PRESETS, KVCacheConfig, KVDtype
from .errors import HexcoreError, HexcoreInvalidArgumentError

GIB = 1 << 30
MAX_BUDGET_GIB = 2**32  # 4 EiB: budgets stay exact ints far below hexcore's 2**62 limit
MAX_SEQS = 2**31 - 1
BLOCK_SIZES = (16, 32, 64, 128, 256)
MAX_STEPS = 1_000_000


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


def capacity_table(preset: str, budget_gib: float, max_seqs: int, block_size: int) -> str:
    """The capacity of each KV dtype for ``preset`` in a budget, as aligned text.

    ``budget_gib``: a finite number in [2**-30, 2**32); ``max_seqs`` and ``block_size``
    follow the integer rule (HexcoreInvalidArgumentError or HexcoreConfigError otherwise).
    """
    if isinstance(budget_gib, bool) or not isinstance(budget_gib, (int, float)) or not _budget_ok(budget_gib):
        raise HexcoreInvalidArgumentError(f"budget_gib: expected a finite number in [2**-30, {MAX_BUDGET_GIB}), "
                                          f"got {budget_gib!r:.40}")
    budget = int(budget_gib * GIB)
    header = f"{'dtype':<6} {'bytes/token':>12} {'block MiB':>10} {'blocks':>10} {'tokens':>12} {'vs fp16':>8}"
    lines = [f"{preset}: {budget_gib:g} GiB budget, {max_seqs} sequences, block_size {block_size}", header]
    for dtype in KVDtype:
        cfg = KVCacheConfig.from_preset(preset, kv_dtype=dtype, block_size=block_size)
        lines.append(
            f"{dtype.value:<6} {cfg.block_bytes / cfg.block_size:>12.1f} {cfg.block_bytes / (1 << 20):>10.3f} "
            f"{cfg.blocks_for_budget(budget, max_seqs):>10,} {cfg.tokens_for_budget(budget, max_seqs):>12,} "
            f"{cfg.compression_ratio:>7.2f}x"
        )
    return "\n".join(lines)


def _layout_report(preset: str, block_size: int) -> str:
    from ._runtime import use_simulator_if_no_gpu

    simulated = use_simulator_if_no_gpu()
    from .cuda import layout_agrees

    where = "CUDA simulator" if simulated else "GPU"
    results = []
    for dtype in KVDtype:
        cfg = KVCacheConfig.from_preset(preset, kv_dtype=dtype, block_size=block_size)
        small = KVCacheConfig(num_layers=2, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                              block_size=min(block_size, 16), kv_dtype=dtype, group_size=cfg.group_size)
        results.append(f"{dtype.value} {'agrees' if layout_agrees(small, num_blocks=2) else 'DISAGREES'}")
    return f"layout agreement ({where}): " + ", ".join(results)


def _serve_report(preset: str, kv_dtype: str, steps: int) -> str:
    from ._runtime import use_simulator_if_no_gpu

    simulated = use_simulator_if_no_gpu()
    from .serve import serve

    model = PRESETS[preset]
    if simulated:  # the simulator runs one Python thread per CUDA thread: keep it tiny
        cfg = KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=64, block_size=16, kv_dtype=kv_dtype,
                            group_size=32)
        q_heads, seqs, blocks, prompts = 2, 4, 64, (5, 30)
    else:
        cfg = KVCacheConfig(num_layers=2, num_kv_heads=model.num_kv_heads, head_dim=model.head_dim,
                            block_size=32, kv_dtype=kv_dtype)
        q_heads, seqs, blocks, prompts = model.num_q_heads, 16, 4096, (100, 2000)
    where = "CUDA simulator, tiny shapes" if simulated else f"GPU, {preset} attention heads, 2 layers"
    print(f"serving {steps} decode steps ({cfg.kv_dtype.value}, {where}):")
    report = serve(cfg, q_heads, seqs, blocks, steps, prompts)
    return (f"served {report.tokens} tokens in {report.steps} steps ({report.forks} forks, {report.finished} "
            f"finished) in {report.seconds:.1f} s; worst attention error vs exact fp16 K/V "
            f"{report.max_rel_error:.2e}")


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
    demo.add_argument("--steps", type=_int_in(0, MAX_STEPS), default=6,
                      help="decode steps of the serving loop (0: none)")
    plan = sub.add_parser("plan", help="capacity planner: what fits a memory budget")
    _add_capacity_args(plan)
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
        print(capacity_table(args.preset, args.budget_gib, args.max_seqs, args.block_size))
        if args.command == "demo":
            print(_layout_report(args.preset, args.block_size))
            if args.steps > 0:
                print(_serve_report(args.preset, args.kv_dtype, args.steps))
    except HexcoreError as exc:
        print(f"hexcore: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("hexcore: interrupted", file=sys.stderr)
        return 130
    return 0
