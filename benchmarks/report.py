"""``hexcore bench``: run the benchmarks and write a report folder of JSON and PNG plots.

    python -m benchmarks.report --out DIR [--quick] [--quality] [--gpu-json DIR] [--plots-only]

Measured here, every run: the block manager's time per operation against pool size and
the block-event ring's throughput (CPU). Measured where a real GPU is present: paged
decode (``bench_decode``) and whole decode steps (``bench_graph``); without one, the GPU
plots are drawn from the JSON of an earlier H200 run committed under
``benchmarks/gpu-runs/`` (``--gpu-json``), and each plot says which run it shows.
``--plots-only`` redraws from the JSON already in ``--out`` (nothing is measured).
``--quality`` also runs ``benchmarks.bench_quality`` (needs torch and transformers).
The plots need matplotlib (``pip install 'hexcore-llm[bench]'``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.per_unit import min_ns

HERE = Path(__file__).resolve().parent
# the latest H200 decode table, peers in the same run (graph.json: the 2026-12-01 run)
GPU_RUN = HERE / "gpu-runs" / "2026-12-07-s59" / "table"
GRAPH_RUN = HERE / "gpu-runs" / "2026-12-01"
CEILING_TBS = 4.47  # HBM read ceiling measured on the H200 (numba, 16-byte loads)
POOLS = (1024, 4096, 16384, 65536, 262144)
BS, BATCH_BLOCKS, NUM_SEQS = 16, 1024, 256


def decode_json(folder: Path) -> Path | None:
    """The decode table in ``folder``: ``decode_new.json`` (what ``hexcore bench`` writes), else
    its one ``decode_*.json`` (a ``bench_decode --name`` run's), else None."""
    if (folder / "decode_new.json").is_file():
        return folder / "decode_new.json"
    named = sorted(folder.glob("decode_*.json"))
    return named[0] if len(named) == 1 else None


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        print(f"bench: {' '.join(message.split())}", file=sys.stderr)
        raise SystemExit(2)


def machine() -> str:
    """This machine in words: CPU model and core count."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{model}, {os.cpu_count()} cores, Python {platform.python_version()}"


def allocator_rows(pools=POOLS, rounds: int = 100) -> list[dict]:
    """PagedKVCache per-operation times (minimum over ``rounds``) at each pool size."""
    from hexcore import KVCacheConfig
    from hexcore.host import PagedKVCache

    cfg = KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=64, block_size=BS)
    rows = []
    for pool in pools:
        cache = PagedKVCache(cfg, pool, NUM_SEQS, max_seq_len=BATCH_BLOCKS * BS)

        def fresh(length=0):
            for s in range(NUM_SEQS):
                if cache.is_live(s):
                    cache.free_sequence(s)
            cache.add_sequence(0)
            if length:
                cache.grow_sequence(0, length)

        alloc = min_ns(fresh, lambda: cache.grow_sequence(0, BATCH_BLOCKS * BS), rounds) / BATCH_BLOCKS
        free = min_ns(lambda: fresh(BATCH_BLOCKS * BS), lambda: cache.free_sequence(0), rounds) / BATCH_BLOCKS
        starts = np.random.default_rng(0).integers(0, 4 * BS, NUM_SEQS)
        ids = np.arange(NUM_SEQS, dtype=np.int32)

        def staggered():
            fresh()
            cache.free_sequence(0)
            for s in range(NUM_SEQS):
                cache.add_sequence(s)
                cache.grow_sequence(s, int(starts[s]))

        step = min_ns(staggered, lambda: [cache.step(ids) for _ in range(32)], rounds) / 32
        grow = min_ns(fresh, lambda: [cache.grow_sequence(0, n) for n in range(1, 257)], rounds) / 256
        rows.append({"pool_blocks": pool, "alloc_ns_per_block": alloc, "free_ns_per_block": free,
                     "step_ns_per_seq": step / NUM_SEQS, "step_us_256_seqs": step / 1e3, "grow_call_ns": grow})
        print(f"allocator, pool {pool:>7,}: alloc {alloc:.2f} ns/block, free {free:.2f} ns/block, "
              f"step {step / 1e3:.2f} us (256 seqs), grow call {grow:.0f} ns", flush=True)
    return rows


def ring_rows(quick: bool) -> list[dict]:
    """LockFreeRingBuffer records/s (median of runs), thread and process, batch and single."""
    from benchmarks import bench_ring as ring

    scale, runs = (8, 1) if quick else (1, 3)
    cases = [("thread to thread, batch of 256", ring.thread_throughput, (ring.NUM_THREAD // scale, ring.BATCH)),
             ("thread to thread, single", ring.thread_throughput, (ring.NUM_THREAD // 4 // scale, 0)),
             ("process to process, batch of 256", ring.process_throughput, (ring.NUM_PROCESS // scale, ring.BATCH)),
             ("process to process, single", ring.process_throughput, (ring.NUM_PROCESS // 4 // scale, 0)),
             ("Python try_push + try_pop", ring.python_call_throughput, (200_000 // scale,))]
    rows = []
    for what, fn, args in cases:
        rates = [fn(*args) for _ in range(runs)]
        rows.append({"path": what, "records_per_s": statistics.median(rates), "min": min(rates),
                     "max": max(rates), "runs": runs})
        print(f"ring, {what}: {statistics.median(rates) / 1e6:.1f} M records/s", flush=True)
    return rows


def speculative_rows() -> list[dict]:
    """The seal paths and event costs of ``bench_speculative`` (figures as text)."""
    from benchmarks import bench_speculative

    return [{"what": what, "figure": figure} for what, figure in bench_speculative.run_all()]


def gpu_present() -> bool:
    """True when numba.cuda sees a real GPU (not the simulator)."""
    from hexcore._runtime import use_simulator_if_no_gpu

    if use_simulator_if_no_gpu():
        return False
    from numba import cuda

    return cuda.is_available()


def run_gpu(out: Path, quick: bool) -> Path:
    """bench_decode (every shape, peers) and bench_graph on this GPU; their JSON folder."""
    from benchmarks import bench_decode, bench_graph

    folder = out / "gpu"
    folder.mkdir(parents=True, exist_ok=True)
    os.environ["OUT"] = str(folder)
    bench_decode.main(["--name", "new"] + (["--shapes", "quick"] if quick else ["--flex", "2"]))
    bench_graph.run()
    return folder


def _save(out: Path, name: str, rows, **meta) -> None:
    with open(out / f"{name}.json", "w") as f:
        json.dump({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine(), **meta,
                   "rows": rows}, f, indent=1)


def measure(out: Path, quick: bool) -> Path:
    """Run every benchmark this machine can; returns the folder of the GPU JSON to plot."""
    pools = (1024, 65536) if quick else POOLS
    _save(out, "allocator", allocator_rows(pools, rounds=10 if quick else 100),
          command="python -m benchmarks.report (allocator_rows)", block_size=BS)
    _save(out, "ring", ring_rows(quick), command="python -m benchmarks.report (ring_rows)")
    _save(out, "speculative", speculative_rows(), command="python -m benchmarks.bench_speculative")
    return run_gpu(out, quick) if gpu_present() else GPU_RUN


def main(argv=None) -> int:
    """Command line (also ``hexcore bench``); returns the exit status."""
    p = _Parser(prog="hexcore bench", description=__doc__.split("\n")[0])
    p.add_argument("--out", default="bench-report", help="report folder (created)")
    p.add_argument("--quick", action="store_true", help="fewer rounds and pool sizes")
    p.add_argument("--quality", action="store_true", help="also run benchmarks.bench_quality")
    p.add_argument("--gpu-json", default=None, help=f"GPU JSON to plot without a GPU (default {GPU_RUN})")
    p.add_argument("--plots-only", action="store_true", help="redraw from the JSON in --out; measure nothing")
    a = p.parse_args(argv)
    try:
        from benchmarks import report_plots as plots
    except ImportError as exc:
        print(f"bench: the plots need matplotlib ({exc}): pip install 'hexcore-llm[bench]'", file=sys.stderr)
        return 2
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    gpu_json = Path(a.gpu_json) if a.gpu_json else None
    if gpu_json is not None and decode_json(gpu_json) is None:
        print(f"bench: --gpu-json {gpu_json}: no decode_new.json there, nor one decode_*.json", file=sys.stderr)
        return 2
    if a.plots_only:
        gpu_json = gpu_json or (out / "gpu" if (out / "gpu" / "decode_new.json").is_file() else GPU_RUN)
    else:
        measured = measure(out, a.quick)
        gpu_json = gpu_json or measured
    graph_json = gpu_json / "graph.json" if (gpu_json / "graph.json").is_file() else GRAPH_RUN / "graph.json"
    written = plots.draw_all(out, gpu_json, graph_json)
    print("wrote " + ", ".join(str(p) for p in written))
    if a.quality:
        try:
            from benchmarks import bench_quality
        except ImportError as exc:
            print(f"bench: --quality needs benchmarks/bench_quality.py and its dependencies ({exc})",
                  file=sys.stderr)
            return 2
        return bench_quality.main(["--json", str(out / "quality.json")])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
