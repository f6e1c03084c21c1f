"""Prometheus export of a MetricsCollector (imported only when asked for: needs prometheus_client).

Names follow Prometheus conventions: ``hexcore_`` prefix, base units (seconds),
``_total`` on counters, usage as a 0-1 gauge.
"""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

_COUNTERS = (
    ("blocks_allocated", "hexcore_blocks_allocated_total", "Blocks taken from the free pool."),
    ("blocks_freed", "hexcore_blocks_freed_total", "Blocks returned to the free pool."),
    ("blocks_sealed", "hexcore_blocks_sealed_total", "Tails sealed into blocks."),
    ("oom_events", "hexcore_oom_events_total", "Requests refused for lack of blocks."),
    ("hits", "hexcore_prefetch_hits_total", "Seals served by a prefetched block."),
    ("misses", "hexcore_prefetch_misses_total", "Seals served by a fresh block."),
    ("prefix_queries", "hexcore_prefix_cache_queries_total", "Tokens of requests admitted with the prefix cache."),
    ("prefix_hits", "hexcore_prefix_cache_hits_total", "Tokens of admitted requests found in the prefix cache."),
    ("prefix_evictions", "hexcore_prefix_cache_evictions_total", "Cached blocks evicted from the prefix cache."),
)
_GAUGES = (
    ("active_blocks", "hexcore_active_blocks", "Blocks referenced by block tables."),
    ("free_blocks", "hexcore_free_blocks", "Blocks on the free stack."),
    ("reserved_blocks", "hexcore_reserved_blocks", "Blocks prefetched for a next seal."),
    ("sequences", "hexcore_sequences", "Live sequences."),
    ("cached_blocks", "hexcore_prefix_cached_blocks", "Blocks kept by the prefix cache that no table references."),
    ("quarantined_blocks", "hexcore_quarantined_blocks", "Blocks found corrupted, never handed out again."),
    ("usage", "hexcore_block_usage_ratio", "Fraction of blocks not free (0-1)."),
)


class PrometheusCollector:
    """Custom collector: ``collect()`` yields metric families from a snapshot."""

    def __init__(self, metrics):
        from .metrics import MetricsCollector
        from ..errors import HexcoreInvalidArgumentError

        if not isinstance(metrics, MetricsCollector):
            raise HexcoreInvalidArgumentError(f"metrics: expected a MetricsCollector, got {type(metrics).__name__}")
        self.metrics = metrics

    def collect(self):
        """Yield the counters, gauges and the latency histogram (seconds)."""
        snap = self.metrics.snapshot()
        for key, name, doc in _COUNTERS:
            yield CounterMetricFamily(name, doc, value=snap[key])
        for key, name, doc in _GAUGES:
            yield GaugeMetricFamily(name, doc, value=snap[key])
        lat = snap["latency"]
        cumulative, buckets = 0, []
        for bound_us, count in lat["buckets_us"].items():
            cumulative += count
            le = "+Inf" if bound_us == float("inf") else repr(bound_us / 1e6)
            buckets.append((le, cumulative))
        yield HistogramMetricFamily("hexcore_allocation_latency_seconds",
                                    "Latency of block-manager calls.", buckets=buckets,
                                    sum_value=lat["sum_us"] / 1e6)
