"""MetricsCollector: thread-safe block-manager counters, gauges and a latency histogram.

:class:`~hexcore.host.PagedKVCache` feeds one :meth:`MetricsCollector.record` per
public call when a collector is attached (and does no timing work when none is);
other callers use the checked :meth:`MetricsCollector.observe`.
Export as a log line (:meth:`to_string`), a dict (:meth:`snapshot`) or, when
``prometheus_client`` is installed, a Prometheus collector (:meth:`register`).
"""

from __future__ import annotations

import bisect
import math
import numbers
import threading

from .._checks import as_int
from ..errors import HexcoreInvalidArgumentError

# Upper bounds of the latency buckets, in microseconds; a last bucket catches the rest.
DEFAULT_BUCKETS_US = (0.25, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)

# The order of MetricsCollector.record's tuples.
COUNTERS = ("blocks_allocated", "blocks_freed", "blocks_sealed", "oom_events", "hits", "misses")
GAUGES = ("active_blocks", "free_blocks", "reserved_blocks", "sequences", "num_blocks")
_INCREMENTS = ("allocated", "freed", "sealed", "oom", "hits", "misses")  # observe's names, COUNTERS order


def _bucket_bounds(buckets_us) -> tuple[float, ...]:
    # buckets_us as a tuple of floats: finite, positive, strictly increasing real numbers
    try:
        values = list(buckets_us)
    except TypeError:
        raise HexcoreInvalidArgumentError(
            f"buckets_us: expected a sequence of numbers, got {type(buckets_us).__name__}") from None
    for i, b in enumerate(values):
        if isinstance(b, bool) or not isinstance(b, numbers.Real) or not math.isfinite(b) or b <= 0:
            raise HexcoreInvalidArgumentError(f"buckets_us[{i}]: expected a finite number > 0, got {b!r}")
    if not values or any(a >= b for a, b in zip(values, values[1:])):
        raise HexcoreInvalidArgumentError(f"buckets_us: expected increasing positive bounds, got {buckets_us!r}")
    return tuple(float(b) for b in values)


class MetricsCollector:
    """Counters (blocks allocated/freed/sealed, OOM events, prefetch hits/misses),
    gauges (active/free/reserved blocks, sequences) and a call-latency histogram.

    A *hit* is a seal served by the sequence's prefetched (reserved) block, a *miss*
    one served by a fresh block from the free stack. All methods are thread-safe.
    """

    def __init__(self, buckets_us: tuple[float, ...] = DEFAULT_BUCKETS_US):
        self.buckets_us = _bucket_bounds(buckets_us)
        self._bounds_ns = [b * 1000.0 for b in self.buckets_us]
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        """Zero every counter, gauge and histogram bucket."""
        with self._lock:
            self._counts = [0] * len(COUNTERS)  # in COUNTERS order
            self._gauge_values = (0,) * len(GAUGES)  # in GAUGES order
            self._calls: dict[str, int] = {}
            self._bucket_counts = [0] * (len(self.buckets_us) + 1)
            self._latency_sum_ns = 0

    def observe(self, op: str, latency_ns: int, *, allocated: int = 0, freed: int = 0,
                sealed: int = 0, hits: int = 0, misses: int = 0, oom: int = 0,
                active_blocks: int = 0, free_blocks: int = 0, reserved_blocks: int = 0,
                sequences: int = 0, num_blocks: int = 0) -> None:
        """Record one call of ``op`` that took ``latency_ns``: counter increments and gauges.

        Every number is an int >= 0 (numpy integers accepted); anything else raises
        HexcoreInvalidArgumentError naming it, and nothing is recorded.
        """
        if not isinstance(op, str):
            raise HexcoreInvalidArgumentError(f"op: expected a str, got {type(op).__name__} {op!r}")
        latency_ns = as_int("latency_ns", latency_ns, low=0)
        increments = tuple(as_int(name, value, low=0) for name, value in
                           zip(_INCREMENTS, (allocated, freed, sealed, oom, hits, misses)))
        gauges = tuple(as_int(name, value, low=0) for name, value in
                       zip(GAUGES, (active_blocks, free_blocks, reserved_blocks, sequences, num_blocks)))
        self.record(op, latency_ns, increments, gauges)

    def record(self, op: str, latency_ns: int, increments: tuple, gauges: tuple) -> None:
        """:meth:`observe` with positional tuples in ``COUNTERS`` and ``GAUGES`` order.

        The fast path of PagedKVCache: nothing is checked (``latency_ns`` an int, the
        tuples ``len(COUNTERS)`` and ``len(GAUGES)`` ints).
        """
        bucket = bisect.bisect_left(self._bounds_ns, latency_ns)
        with self._lock:
            counts = self._counts
            for i, n in enumerate(increments):
                counts[i] += n
            self._gauge_values = gauges
            self._calls[op] = self._calls.get(op, 0) + 1
            self._bucket_counts[bucket] += 1
            self._latency_sum_ns += latency_ns

    def set_gauges(self, *, active_blocks: int, free_blocks: int, reserved_blocks: int,
                   sequences: int, num_blocks: int) -> None:
        """Set the gauges alone (no call is counted); ints >= 0, as in :meth:`observe`."""
        gauges = tuple(as_int(name, value, low=0) for name, value in
                       zip(GAUGES, (active_blocks, free_blocks, reserved_blocks, sequences, num_blocks)))
        with self._lock:
            self._gauge_values = gauges

    def percentile_us(self, q: float) -> float:
        """Latency quantile ``q`` in [0, 1], in microseconds, interpolated within its bucket."""
        if isinstance(q, bool) or not isinstance(q, numbers.Real) or not 0.0 <= q <= 1.0:
            raise HexcoreInvalidArgumentError(f"q: expected a quantile in [0, 1], got {q!r}")
        with self._lock:
            counts = list(self._bucket_counts)
        return _quantile(self.buckets_us, counts, q)

    def snapshot(self) -> dict:
        """Everything as a plain dict (counters, gauges, usage, calls, latency)."""
        with self._lock:
            counts = list(self._bucket_counts)
            snap = {**dict(zip(COUNTERS, self._counts)), **dict(zip(GAUGES, self._gauge_values)),
                    "calls": dict(self._calls)}
            total_ns = self._latency_sum_ns
        n = sum(counts)
        blocks = snap["num_blocks"]
        snap["usage"] = (blocks - snap["free_blocks"]) / blocks if blocks else 0.0
        requests = snap["hits"] + snap["misses"]
        snap["hit_rate"] = snap["hits"] / requests if requests else 0.0
        snap["latency"] = {
            "count": n, "sum_us": total_ns / 1000.0, "mean_us": total_ns / 1000.0 / n if n else 0.0,
            "p50_us": _quantile(self.buckets_us, counts, 0.5),
            "p99_us": _quantile(self.buckets_us, counts, 0.99),
            "buckets_us": dict(zip([*self.buckets_us, float("inf")], counts)),
        }
        return snap

    def to_string(self) -> str:
        """One log line: gauges, counters and latency p50/p99."""
        s = self.snapshot()
        lat = s["latency"]
        return (f"hexcore blocks active={s['active_blocks']} free={s['free_blocks']} "
                f"reserved={s['reserved_blocks']} usage={s['usage']:.1%} seqs={s['sequences']} | "
                f"allocated={s['blocks_allocated']} freed={s['blocks_freed']} "
                f"sealed={s['blocks_sealed']} oom={s['oom_events']} hits={s['hits']} "
                f"misses={s['misses']} | calls={lat['count']} p50={lat['p50_us']:.2f}us "
                f"p99={lat['p99_us']:.2f}us")

    def prometheus_collector(self):
        """A ``prometheus_client`` collector over this object (needs prometheus_client)."""
        from ._prometheus import PrometheusCollector

        return PrometheusCollector(self)

    def register(self, registry=None):
        """Register :meth:`prometheus_collector` with ``registry`` (default: the global one)."""
        from prometheus_client import REGISTRY

        collector = self.prometheus_collector()
        (registry or REGISTRY).register(collector)
        return collector


def _quantile(bounds_us, counts, q: float) -> float:
    # Prometheus-style histogram_quantile: linear within the bucket; the overflow
    # bucket reports the last finite bound.
    n = sum(counts)
    if n == 0:
        return 0.0
    rank = q * n
    seen = 0
    for i, count in enumerate(counts):
        if count and seen + count >= rank:
            if i == len(bounds_us):
                return float(bounds_us[-1])
            low = 0.0 if i == 0 else bounds_us[i - 1]
            return low + (bounds_us[i] - low) * (rank - seen) / count
        seen += count
    return float(bounds_us[-1])
