"""MetricsCollector: thread-safe block-manager counters, gauges and a latency histogram.

:class:`~hexcore.host.PagedKVCache` feeds one :meth:`MetricsCollector.record` per
public call when a collector is attached (and does no timing work when none is);
other callers use the checked :meth:`MetricsCollector.observe`.
Export as a log line (:meth:`to_string`), a dict (:meth:`snapshot`) or, when
``prometheus_client`` is installed, a Prometheus collector (:meth:`register`).

Every method checks its arguments and raises HexcoreInvalidArgumentError (or
HexcoreConfigError for a missing ``prometheus_client``) before changing anything, so
one bad call never leaves the collector broken for the next.
"""

from __future__ import annotations

import bisect
import math
import numbers
import threading

import numpy as np

from .._checks import INT_LIMIT, as_int
from ..errors import HexcoreConfigError, HexcoreInvalidArgumentError

# Upper bounds of the latency buckets, in microseconds; a last bucket catches the rest.
DEFAULT_BUCKETS_US = (0.25, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)

# The order of MetricsCollector.record's tuples.
# prefix_queries / prefix_hits: tokens of admitted requests, and those found cached
# (vLLM's prefix_cache_queries / prefix_cache_hits); prefix_evictions: cached blocks
# evicted; cached_blocks: blocks kept for reuse that no table references; quarantined_blocks:
# blocks found corrupted, never handed out again.
COUNTERS = ("blocks_allocated", "blocks_freed", "blocks_sealed", "oom_events", "hits", "misses",
            "prefix_queries", "prefix_hits", "prefix_evictions")
GAUGES = ("active_blocks", "free_blocks", "reserved_blocks", "sequences", "num_blocks", "cached_blocks",
          "quarantined_blocks")
_INCREMENTS = ("allocated", "freed", "sealed", "oom", "hits", "misses",  # observe's names, COUNTERS order
               "prefix_queries", "prefix_hits", "prefix_evictions")
_NUM_COUNTERS, _NUM_GAUGES, _INT_TYPE = len(COUNTERS), len(GAUGES), {int}
MAX_OPS = 1024  # distinct operation names one collector counts (a bound on its memory)
MAX_BUCKETS = 1024


def as_collector(name: str, value):
    """``value`` if it is a :class:`MetricsCollector` (or None), else HexcoreInvalidArgumentError
    naming ``name``: what a component taking ``metrics=`` should check before using it."""
    if value is None or isinstance(value, MetricsCollector):
        return value
    raise HexcoreInvalidArgumentError(f"{name}: expected a MetricsCollector or None, got {type(value).__name__}")


def _finite(x) -> bool:
    try:
        return math.isfinite(x)
    except OverflowError:  # an int too large for a float
        return False


def _bucket_bounds(buckets_us) -> tuple[float, ...]:
    # buckets_us as a tuple of floats: finite, positive, strictly increasing real numbers
    try:
        values = list(buckets_us)
    except TypeError:
        raise HexcoreInvalidArgumentError(
            f"buckets_us: expected a sequence of numbers, got {type(buckets_us).__name__}") from None
    for i, b in enumerate(values):
        if isinstance(b, (bool, np.bool_)) or not isinstance(b, numbers.Real) or not _finite(b) or b <= 0:
            raise HexcoreInvalidArgumentError(f"buckets_us[{i}]: expected a finite number > 0, got {_short(b)}")
    if not values or len(values) > MAX_BUCKETS or any(a >= b for a, b in zip(values, values[1:])):
        raise HexcoreInvalidArgumentError(f"buckets_us: expected 1 to {MAX_BUCKETS} increasing positive bounds, "
                                          f"got {_short(buckets_us)}")
    bounds = tuple(float(b) for b in values)
    if not all(math.isfinite(b) and b > 0 for b in bounds) or any(a >= b for a, b in zip(bounds, bounds[1:])):
        # e.g. 10**400 (finite as an int, not as a float) or two ints that round to one float
        raise HexcoreInvalidArgumentError(f"buckets_us: expected increasing finite bounds as floats, "
                                          f"got {_short(buckets_us)}")
    return bounds


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + "..."


class MetricsCollector:
    """Counters (blocks allocated/freed/sealed, OOM events, prefetch hits/misses, prefix
    cache queries/hits/evictions), gauges (active/free/reserved/cached/quarantined
    blocks, sequences) and a call-latency histogram.

    A *hit* is a seal served by the sequence's prefetched (reserved) block, a *miss*
    one served by a fresh block from the free stack. Prefix cache queries and hits
    count tokens (an admitted request's, and those of its cached prefix). All methods
    are thread-safe.
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
                sequences: int = 0, num_blocks: int = 0, prefix_queries: int = 0, prefix_hits: int = 0,
                prefix_evictions: int = 0, cached_blocks: int = 0, quarantined_blocks: int = 0) -> None:
        """Record one call of ``op`` that took ``latency_ns``: counter increments and gauges.

        Every number is an int >= 0 (numpy integers accepted); anything else raises
        HexcoreInvalidArgumentError naming it, and nothing is recorded.
        """
        if not isinstance(op, str):
            raise HexcoreInvalidArgumentError(f"op: expected a str, got {type(op).__name__} {_short(op)}")
        latency_ns = as_int("latency_ns", latency_ns, low=0)
        increments = tuple(as_int(name, value, low=0) for name, value in
                           zip(_INCREMENTS, (allocated, freed, sealed, oom, hits, misses, prefix_queries,
                                             prefix_hits, prefix_evictions)))
        gauges = tuple(as_int(name, value, low=0) for name, value in
                       zip(GAUGES, (active_blocks, free_blocks, reserved_blocks, sequences, num_blocks,
                                    cached_blocks, quarantined_blocks)))
        self.record(op, latency_ns, increments, gauges)

    def record(self, op: str, latency_ns: int, increments: tuple, gauges: tuple) -> None:
        """:meth:`observe` with positional tuples in ``COUNTERS`` and ``GAUGES`` order.

        The fast path of PagedKVCache: ``op`` a str, ``latency_ns`` an int, ``increments``
        and ``gauges`` tuples of ``len(COUNTERS)`` and ``len(GAUGES)`` ints, every one in
        [0, 2**62). Anything else goes through :meth:`observe`'s checks (numpy integers
        and lists are accepted there) and raises HexcoreInvalidArgumentError before
        anything is recorded.
        """
        if (type(increments) is not tuple or type(gauges) is not tuple or len(increments) != _NUM_COUNTERS
                or len(gauges) != _NUM_GAUGES or type(op) is not str or type(latency_ns) is not int
                or not 0 <= latency_ns < INT_LIMIT):
            op, latency_ns, increments, gauges = _checked_record(op, latency_ns, increments, gauges)
        else:
            values = increments + gauges
            if set(map(type, values)) != _INT_TYPE or min(values) < 0 or max(values) >= INT_LIMIT:
                op, latency_ns, increments, gauges = _checked_record(op, latency_ns, increments, gauges)
        bucket = bisect.bisect_left(self._bounds_ns, latency_ns)
        with self._lock:
            calls = self._calls
            if op not in calls and len(calls) >= MAX_OPS:
                raise HexcoreInvalidArgumentError(
                    f"op: this collector already counts {MAX_OPS} distinct operations, got a new one {_short(op)}")
            counts = self._counts
            for i, n in enumerate(increments):
                counts[i] += n
            self._gauge_values = gauges
            calls[op] = calls.get(op, 0) + 1
            self._bucket_counts[bucket] += 1
            self._latency_sum_ns += latency_ns

    def set_gauges(self, *, active_blocks: int, free_blocks: int, reserved_blocks: int,
                   sequences: int, num_blocks: int, cached_blocks: int = 0, quarantined_blocks: int = 0) -> None:
        """Set the gauges alone (no call is counted); ints >= 0, as in :meth:`observe`."""
        gauges = tuple(as_int(name, value, low=0) for name, value in
                       zip(GAUGES, (active_blocks, free_blocks, reserved_blocks, sequences, num_blocks,
                                    cached_blocks, quarantined_blocks)))
        with self._lock:
            self._gauge_values = gauges

    def percentile_us(self, q: float) -> float:
        """Latency quantile ``q`` in [0, 1], in microseconds, interpolated within its bucket."""
        if isinstance(q, (bool, np.bool_)) or not isinstance(q, numbers.Real) or not _in_unit(q):
            raise HexcoreInvalidArgumentError(f"q: expected a quantile in [0, 1], got {_short(q)}")
        q = float(q)
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
        queries = snap["prefix_queries"]
        snap["prefix_hit_rate"] = snap["prefix_hits"] / queries if queries else 0.0
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
                f"misses={s['misses']} | prefix queries={s['prefix_queries']} hits={s['prefix_hits']} "
                f"evictions={s['prefix_evictions']} cached={s['cached_blocks']} "
                f"quarantined={s['quarantined_blocks']} | calls={lat['count']} "
                f"p50={lat['p50_us']:.2f}us p99={lat['p99_us']:.2f}us")

    def prometheus_collector(self):
        """A ``prometheus_client`` collector over this object (HexcoreConfigError without
        prometheus_client)."""
        try:
            from ._prometheus import PrometheusCollector
        except ImportError:
            raise HexcoreConfigError("prometheus_collector: prometheus_client is not installed") from None

        return PrometheusCollector(self)

    def register(self, registry=None):
        """Register :meth:`prometheus_collector` with ``registry`` (default: the global one).

        Raises HexcoreConfigError without prometheus_client, HexcoreInvalidArgumentError
        for a ``registry`` that is not a ``prometheus_client`` CollectorRegistry or that
        already holds these metric names.
        """
        try:
            from prometheus_client import REGISTRY, CollectorRegistry
        except ImportError:
            raise HexcoreConfigError("register: prometheus_client is not installed") from None
        if registry is not None and not isinstance(registry, CollectorRegistry):
            raise HexcoreInvalidArgumentError(
                f"registry: expected a prometheus_client CollectorRegistry or None, got {type(registry).__name__}")
        collector = self.prometheus_collector()
        try:
            (REGISTRY if registry is None else registry).register(collector)
        except ValueError as exc:  # "Duplicated timeseries in CollectorRegistry"
            raise HexcoreInvalidArgumentError(f"registry: {exc}") from None
        return collector


def _in_unit(q) -> bool:
    try:
        return 0.0 <= float(q) <= 1.0
    except (OverflowError, ValueError, TypeError):
        return False


def _checked_record(op, latency_ns, increments, gauges) -> tuple:
    """record's arguments checked as :meth:`MetricsCollector.observe` checks them: (op,
    latency_ns, increments, gauges) as a str, an int and tuples of ints in [0, 2**62)."""
    if not isinstance(op, str):
        raise HexcoreInvalidArgumentError(f"op: expected a str, got {type(op).__name__} {_short(op)}")
    latency_ns = as_int("latency_ns", latency_ns, low=0)
    parts = []
    for what, values, names in (("increments", increments, _INCREMENTS), ("gauges", gauges, GAUGES)):
        if isinstance(values, (str, bytes)) or not isinstance(values, (tuple, list, np.ndarray)) \
                or len(values) != len(names):
            got = f"{type(values).__name__} of {len(values)}" if hasattr(values, "__len__") else type(values).__name__
            raise HexcoreInvalidArgumentError(f"{what}: expected a tuple of {len(names)} ints ({', '.join(names)}), "
                                              f"got {got}")
        parts.append(tuple(as_int(f"{what}[{i}] ({n})", v, low=0) for i, (n, v) in enumerate(zip(names, values))))
    return op, latency_ns, parts[0], parts[1]


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
