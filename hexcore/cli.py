"""The ``hexcore`` command: ``demo`` (the main job), ``plan`` (capacity planner)."""

from __future__ import annotations

import argparse
import sys

from .config import PRESETS, KVCacheConfig, KVDtype
from .errors import HexcoreError

GIB = 1 << 30


def capacity_table(preset: str, budget_gib: float, max_seqs: int, block_size: int) -> str:
    """The capacity of each KV dtype for ``preset`` in a budget, as aligned text."""
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


def _add_capacity_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="llama-3-8b", choices=sorted(PRESETS))
    p.add_argument("--budget-gib", type=float, default=40.0, help="KV cache memory budget in GiB")
    p.add_argument("--max-seqs", type=int, default=256, help="live sequences (each holds a tail)")
    p.add_argument("--block-size", type=int, default=32)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``hexcore`` command; returns the exit status."""
    parser = argparse.ArgumentParser(prog="hexcore", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="capacity table and the GPU layout check")
    _add_capacity_args(demo)
    plan = sub.add_parser("plan", help="capacity planner: what fits a memory budget")
    _add_capacity_args(plan)
    args = parser.parse_args(argv)
    try:
        print(capacity_table(args.preset, args.budget_gib, args.max_seqs, args.block_size))
        if args.command == "demo":
            print(_layout_report(args.preset, args.block_size))
    except HexcoreError as exc:
        print(f"hexcore: {exc}", file=sys.stderr)
        return 2
    return 0
