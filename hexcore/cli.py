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
    p.add_argument("--budget-gib", type=float, default=40.0, help="KV cache memory budget in GiB")
    p.add_argument("--max-seqs", type=int, default=256, help="live sequences (each holds a tail)")
    p.add_argument("--block-size", type=int, default=32)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``hexcore`` command; returns the exit status."""
    parser = argparse.ArgumentParser(prog="hexcore", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="capacity table, layout check, and a serving loop")
    _add_capacity_args(demo)
    demo.add_argument("--kv-dtype", default="int4", choices=[d.value for d in KVDtype])
    demo.add_argument("--steps", type=int, default=6, help="decode steps of the serving loop (0: none)")
    plan = sub.add_parser("plan", help="capacity planner: what fits a memory budget")
    _add_capacity_args(plan)
    args = parser.parse_args(argv)
    try:
        print(capacity_table(args.preset, args.budget_gib, args.max_seqs, args.block_size))
        if args.command == "demo":
            print(_layout_report(args.preset, args.block_size))
            if args.steps > 0:
                print(_serve_report(args.preset, args.kv_dtype, args.steps))
    except HexcoreError as exc:
        print(f"hexcore: {exc}", file=sys.stderr)
        return 2
    return 0
