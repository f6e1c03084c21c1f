"""Per-unit figures of CPU benchmarks that compare hexcore with a plain-Python baseline:
the minimum over a pytest-benchmark run's rounds divided by the units one round did, and
the table of both printed after the module; ``min_ns`` for timings outside pytest-benchmark."""

from __future__ import annotations

import time


def min_ns(setup, run, rounds: int) -> float:
    """The fastest of ``rounds`` calls of ``run()`` in ns, each after an untimed ``setup()``."""
    best = float("inf")
    for _ in range(rounds):
        setup()
        t0 = time.perf_counter_ns()
        run()
        best = min(best, time.perf_counter_ns() - t0)
    return best


class PerUnit:
    """``(op, pool, impl) -> time per unit`` in ``unit`` ("ns" or "us")."""

    def __init__(self, unit: str):
        self.unit, self.scale = unit, {"ns": 1e9, "us": 1e6}[unit]
        self.figures: dict[tuple[str, str, str], float] = {}

    def record(self, benchmark, op: str, pool: str, impl: str, units: int) -> None:
        """Keep the run's minimum per unit (nothing when benchmarks are disabled)."""
        stats = getattr(benchmark, "stats", None)
        if stats is not None and getattr(stats, "stats", None) is not None and stats.stats.rounds:
            self.figures[(op, pool, impl)] = stats.stats.min * self.scale / units
            benchmark.extra_info[f"{self.unit}_per_unit_min"] = self.figures[(op, pool, impl)]

    def print_table(self, pools, baseline: str) -> None:
        """A markdown table of every op and pool measured by both ``baseline`` and hexcore."""
        if not self.figures:
            return  # benchmarks disabled: nothing measured
        print(f"\n| operation | pool | {baseline} | hexcore | hexcore / {baseline} |\n| --- | --- | --- | --- | --- |")
        for op in dict.fromkeys(k[0] for k in self.figures):
            for pool in pools:
                b, h = self.figures.get((op, pool, baseline)), self.figures.get((op, pool, "hexcore"))
                if b and h:
                    print(f"| {op} | {pool} | {b:.3g} | {h:.3g} | {h / b:.3f} |")
