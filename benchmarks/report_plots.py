"""PNG plots of a bench report folder (``benchmarks.report``), drawn from measured JSON only.

GPU plots read ``decode_new.json`` (or a folder's one ``decode_*.json``) and ``graph.json``
(``bench_decode``/``bench_graph`` output) from the GPU folder given; CPU plots read ``allocator.json`` and ``ring.json``
from the report folder. Every plot names the run (date, machine) it shows.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

from benchmarks.report import decode_json

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

CEILING_TBS = 4.47
DTYPES = ("fp16", "int4", "int2")
COLORS = {"hexcore fp16": "#1f77b4", "hexcore int4": "#2ca02c", "hexcore int2": "#98df8a",
          "torch SDPA fp16 contiguous": "#7f7f7f", "FlexAttention paged (page 32)": "#ff7f0e"}
LABELS = {"hexcore fp16": "hexcore FP16", "hexcore int4": "hexcore INT4", "hexcore int2": "hexcore INT2",
          "torch SDPA fp16 contiguous": "torch SDPA FP16 (contiguous KV)",
          "FlexAttention paged (page 32)": "FlexAttention, paged (page 32)"}


def _load(path: Path) -> dict:
    with open(path) as f:
        return json.load(f)


def _shape_key(row: dict) -> tuple:
    return row["B"], row["Hq"], row["Hkv"], row["ctx"]


def _shape_label(key: tuple) -> str:
    batch, hq, hkv, ctx = key
    return f"B={batch}\nctx {ctx // 1024}k\n{hq}/{hkv} heads"


def _decode_table(data: dict) -> tuple[list, dict]:
    shapes, table = [], {}
    for row in data["rows"]:
        key = _shape_key(row)
        if key not in shapes:
            shapes.append(key)
        table[(key, row["kernel"])] = row
    return shapes, table


def _save(fig, path: Path, machine, date) -> Path:
    """Sign the figure with the machine and date it was measured on, write it, close it."""
    fig.text(0.99, 0.01, f"measured: {machine or '?'}, {date or '?'}", ha="right", fontsize=7, color="gray")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def decode_bandwidth(data: dict, path: Path) -> Path:
    """Achieved TB/s of KV read per shape (batch, context, heads), beside the ceiling and peers."""
    shapes, table = _decode_table(data)
    kernels = [k for k in COLORS if any((s, k) in table for s in shapes)]
    fig, ax = plt.subplots(figsize=(11, 4.8))
    width = 0.8 / len(kernels)
    for i, kernel in enumerate(kernels):
        xs = [j + (i - (len(kernels) - 1) / 2) * width for j, s in enumerate(shapes) if (s, kernel) in table]
        ys = [table[(s, kernel)]["TBs"] for s in shapes if (s, kernel) in table]
        ax.bar(xs, ys, width, color=COLORS[kernel], label=LABELS[kernel])
    ax.axhline(CEILING_TBS, color="black", linestyle="--", linewidth=1)
    ax.text(len(shapes) - 0.5, CEILING_TBS + 0.05, f"HBM read ceiling {CEILING_TBS} TB/s", ha="right", va="bottom")
    ax.set_xticks(range(len(shapes)), [_shape_label(s) for s in shapes])
    ax.set_ylabel("TB/s of KV bytes read")
    ax.set_ylim(0, CEILING_TBS * 1.15)
    ax.set_title("Paged decode, one layer, head_dim 128, block 32: achieved bandwidth\n"
                 "(INT4/INT2 read 3.4x/5.8x fewer bytes: their TB/s is lower at a shorter time)", fontsize=10)
    ax.legend(fontsize=8, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.22))
    return _save(fig, path, data.get("device"), data.get("date"))


def decode_speedup(data: dict, path: Path) -> Path:
    """INT4/INT2 (and FP16) decode time against torch SDPA FP16 and against hexcore FP16, per shape."""
    shapes, table = _decode_table(data)
    shapes = [s for s in shapes if (s, "hexcore fp16") in table]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, base, title in ((axes[0], "torch SDPA fp16 contiguous", "speed-up over torch SDPA FP16"),
                            (axes[1], "hexcore fp16", "speed-up over hexcore FP16")):
        kernels = [f"hexcore {d}" for d in DTYPES if f"hexcore {d}" != base]
        width = 0.8 / len(kernels)
        for i, kernel in enumerate(kernels):
            pairs = [(j, table[(s, base)]["ms"] / table[(s, kernel)]["ms"]) for j, s in enumerate(shapes)
                     if (s, kernel) in table and (s, base) in table]
            ax.bar([j + (i - (len(kernels) - 1) / 2) * width for j, _ in pairs], [r for _, r in pairs], width,
                   color=COLORS[kernel], label=LABELS[kernel])
        ax.axhline(1.0, color="black", linewidth=1)
        ax.set_xticks(range(len(shapes)), [_shape_label(s) for s in shapes], fontsize=7)
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("time of the baseline / time")
    return _save(fig, path, data.get("device"), data.get("date"))


def graph_host(data: dict, path: Path) -> Path:
    """Host time of a whole 32-layer decode step against batch: graph replay and eager launches."""
    prefix = "host per 32-layer step: "
    series: dict[str, list] = {}
    for row in data["rows"]:
        if row["what"].startswith(prefix):
            series.setdefault(row["what"][len(prefix):], []).append((row["B"], row["us"]))
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, points in series.items():
        points.sort()
        ax.plot([b for b, _ in points], [us for _, us in points], marker="o", label=name)
        for b, us in points:
            ax.annotate(f"{us:.0f}", (b, us), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.set_xscale("log", base=2)
    batches = sorted({b for points in series.values() for b, _ in points})
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.set_xlim(batches[0] / 1.5, batches[-1] * 3) if batches else None
    ax.set_yscale("log")
    ax.set_ylim(10, 40000)
    ax.set_xlabel("batch (sequences)")
    ax.set_ylabel("host \u00b5s per step (32 layers: append, seal, decode)")
    ax.set_title("Host time of a 32-layer decode step: CUDA graph replay vs eager launches", fontsize=10)
    ax.legend(fontsize=8, loc="center right")
    return _save(fig, path, data.get("device"), data.get("date"))


def allocator(data: dict, path: Path) -> Path:
    """Block manager time per operation against pool size (log-log)."""
    rows = sorted(data["rows"], key=lambda r: r["pool_blocks"])
    pools = [r["pool_blocks"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for key, label in (("grow_call_ns", "one grow_sequence call from Python (per call)"),
                       ("step_ns_per_seq", "256-sequence decode step (per sequence)"),
                       ("alloc_ns_per_block", "batched alloc, 1024 blocks (per block)"),
                       ("free_ns_per_block", "free a 1024-block sequence (per block)")):
        ax.plot(pools, [r[key] for r in rows], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("pool size (blocks)")
    ax.set_ylabel("ns per operation")
    ax.set_title("Block manager (numba.njit): time per operation is flat in pool size", fontsize=10)
    ax.legend(fontsize=8)
    return _save(fig, path, data.get("machine"), data.get("date"))


def ring(data: dict, path: Path) -> Path:
    """LockFreeRingBuffer records/s per path (median, min-max bars)."""
    rows = data["rows"]
    fig, ax = plt.subplots(figsize=(7, 3.8))
    ys = range(len(rows))
    rates = [r["records_per_s"] / 1e6 for r in rows]
    errors = [[(r["records_per_s"] - r["min"]) / 1e6 for r in rows], [(r["max"] - r["records_per_s"]) / 1e6
                                                                      for r in rows]]
    ax.barh(ys, rates, xerr=errors, color="#1f77b4")
    for y, rate in zip(ys, rates):
        ax.text(rate, y, f" {rate:.1f} M/s", va="center", fontsize=8)
    ax.set_yticks(list(ys), [r["path"] for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("M records/s (32-byte records, median of runs)")
    ax.set_title("Block-event ring (SPSC, atomic indices) throughput", fontsize=10)
    return _save(fig, path, data.get("machine"), data.get("date"))


def draw_all(out: Path, gpu_json: Path, graph_json: Path | None = None) -> list[Path]:
    """Every plot whose JSON exists (the decode table in ``gpu_json``, see ``decode_json``;
    the graph run at ``graph_json``, default ``gpu_json / "graph.json"``); the PNG paths
    written."""
    written = []
    table = decode_json(gpu_json)
    if table is not None:
        data = _load(table)
        written += [decode_bandwidth(data, out / "decode_bandwidth.png"),
                    decode_speedup(data, out / "decode_speedup.png")]
    graph_json = graph_json or gpu_json / "graph.json"
    if graph_json.is_file():
        written.append(graph_host(_load(graph_json), out / "graph_host.png"))
    if (out / "allocator.json").is_file():
        written.append(allocator(_load(out / "allocator.json"), out / "allocator.png"))
    if (out / "ring.json").is_file():
        written.append(ring(_load(out / "ring.json"), out / "ring.png"))
    return written
