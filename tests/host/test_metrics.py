"""MetricsCollector: counters, gauges, histogram quantiles, threads, exports."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from hexcore import HexcoreInvalidArgumentError, KVCacheConfig, Status
from hexcore.host import LockFreeRingBuffer, MetricsCollector, PagedKVCache
from hexcore.host import allocator as allocator_module

BS = 16


def make(num_blocks=8, **kw) -> PagedKVCache:
    config = KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=64, block_size=BS)
    return PagedKVCache(config, num_blocks, 4, **kw)


def ids(*values):
    return np.array(values, np.int32)


def test_counters_and_gauges():
    m = MetricsCollector()
    m.observe("grow", 1500, allocated=2, sealed=2, hits=1, misses=1, active_blocks=5,
              free_blocks=3, reserved_blocks=0, sequences=2, num_blocks=8)
    m.observe("free", 500, freed=4, oom=1, active_blocks=1, free_blocks=7, num_blocks=8)
    s = m.snapshot()
    assert (s["blocks_allocated"], s["blocks_freed"], s["blocks_sealed"]) == (2, 4, 2)
    assert (s["hits"], s["misses"], s["oom_events"], s["hit_rate"]) == (1, 1, 1, 0.5)
    assert (s["active_blocks"], s["free_blocks"], s["usage"]) == (1, 7, 1 / 8)
    assert s["calls"] == {"grow": 1, "free": 1} and s["latency"]["count"] == 2
    assert s["latency"]["sum_us"] == 2.0
    m.reset()
    assert m.snapshot()["blocks_freed"] == 0 and m.snapshot()["latency"]["count"] == 0


def test_percentiles_interpolate_within_buckets():
    m = MetricsCollector(buckets_us=(1, 2, 4))
    for _ in range(98):
        m.observe("x", 1500)  # bucket (1, 2]
    m.observe("x", 3000)  # (2, 4]
    m.observe("x", 10**6)  # overflow
    assert m.percentile_us(0.5) == pytest.approx(1 + 50 / 98)
    assert 2 < m.percentile_us(0.99) <= 4
    assert m.percentile_us(1.0) == 4  # the overflow bucket reports the last bound
    assert MetricsCollector().percentile_us(0.5) == 0.0


@pytest.mark.parametrize("q", [1.5, -0.1, "0.5", True, None, float("nan")])
def test_percentile_rejects_bad_quantiles(q):
    with pytest.raises(HexcoreInvalidArgumentError, match="q: expected a quantile in"):
        MetricsCollector().percentile_us(q)


@pytest.mark.parametrize("buckets, match", [
    ((2, 1), "increasing"), ((1, 1), "increasing"), ((), "increasing"), ((0, 1), r"buckets_us\[0\]"),
    ((1, "2"), r"buckets_us\[1\]: .*'2'"), ((True, 2), r"buckets_us\[0\]"), ((1, float("inf")), "finite"),
    (5, "sequence of numbers"),
])
def test_buckets_are_validated(buckets, match):
    with pytest.raises(HexcoreInvalidArgumentError, match=match):
        MetricsCollector(buckets_us=buckets)


@pytest.mark.parametrize("buckets", [(1, 2, 4), (0.5, 2.0), np.array([1, 2, 4]), (np.int64(1), np.float32(2.5))])
def test_buckets_take_any_real_numbers(buckets):
    m = MetricsCollector(buckets_us=buckets)
    assert all(type(b) is float for b in m.buckets_us) and len(m.buckets_us) == len(buckets)


def test_observe_takes_numpy_ints_and_stores_ints():
    m = MetricsCollector()
    m.observe("grow", np.int64(1500), allocated=np.int32(2), free_blocks=np.uint16(3), num_blocks=np.int64(8))
    snap = m.snapshot()
    assert (snap["blocks_allocated"], snap["free_blocks"], snap["latency"]["count"]) == (2, 3, 1)
    assert type(snap["blocks_allocated"]) is int and type(snap["free_blocks"]) is int


@pytest.mark.parametrize("kw, match", [
    ({"latency_ns": -1}, "latency_ns: expected an int >= 0, got -1"),
    ({"latency_ns": 1.5}, "latency_ns: expected an int, got float"),
    ({"allocated": True}, "allocated: expected an int, got True"),
    ({"sealed": -2}, "sealed: expected an int >= 0, got -2"),
    ({"sequences": "3"}, "sequences: expected an int, got str"),
    ({"op": 7}, "op: expected a str, got int"),
])
def test_observe_rejects_bad_numbers_and_records_nothing(kw, match):
    m = MetricsCollector()
    kw = {"op": "grow", "latency_ns": 100, **kw}
    with pytest.raises(HexcoreInvalidArgumentError, match=match):
        m.observe(**kw)
    assert m.snapshot()["latency"]["count"] == 0 and m.snapshot()["calls"] == {}


def test_thread_safe_counts():
    m = MetricsCollector()

    def work():
        for _ in range(2000):
            m.observe("grow", 700, allocated=1, hits=1)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    s = m.snapshot()
    assert s["blocks_allocated"] == s["hits"] == s["latency"]["count"] == 8000


def test_to_string_is_one_line():
    m = MetricsCollector()
    m.observe("grow", 900, allocated=3, active_blocks=3, free_blocks=1, num_blocks=4)
    line = m.to_string()
    assert "\n" not in line and "allocated=3" in line and "usage=75.0%" in line and "p99=" in line


def test_prometheus_export():
    prometheus_client = pytest.importorskip("prometheus_client")
    registry = prometheus_client.CollectorRegistry()
    m = MetricsCollector()
    m.register(registry)
    m.observe("grow", 3000, allocated=2, oom=1, hits=1, misses=1, active_blocks=2,
              free_blocks=6, num_blocks=8)
    get = registry.get_sample_value
    assert get("hexcore_blocks_allocated_total") == 2
    assert get("hexcore_oom_events_total") == 1 and get("hexcore_prefetch_hits_total") == 1
    assert get("hexcore_active_blocks") == 2 and get("hexcore_block_usage_ratio") == 0.25
    assert get("hexcore_allocation_latency_seconds_count") == 1
    assert get("hexcore_allocation_latency_seconds_sum") == pytest.approx(3e-6)
    assert get("hexcore_allocation_latency_seconds_bucket", {"le": "5e-06"}) == 1
    assert get("hexcore_allocation_latency_seconds_bucket", {"le": "2e-06"}) == 0
    text = prometheus_client.generate_latest(registry).decode()
    assert "# TYPE hexcore_blocks_freed_total counter" in text
    m.observe("quarantine_block", 500, quarantined_blocks=3)
    assert get("hexcore_quarantined_blocks") == 3


# -- the allocator feeding a collector ---------------------------------------------
def test_no_timing_without_metrics(monkeypatch):
    def boom():
        raise AssertionError("perf_counter_ns called without metrics")

    monkeypatch.setattr(allocator_module, "perf_counter_ns", boom)
    cache = make()
    s = cache.add_sequence()
    cache.grow_sequence(s, 40), cache.try_grow_sequence(s, 41), cache.step(ids(s))
    cache.reserve_blocks(ids(s)), cache.release_reserved(ids(s)), cache.release_all_reserved()
    cache.reserve_predictions(np.array([[s, -1]], np.int64)), cache.reserve_predictions(LockFreeRingBuffer(4, 2))
    cache.quarantine_block(7), cache.replace_blocks(s, cache.prepare_free_blocks(len(cache.block_table(s))))
    cache.free_sequence(cache.fork_sequence(s)), cache.free_sequence(s)


def test_metrics_counts_follow_the_cache():
    metrics = MetricsCollector()
    cache = make(num_blocks=4, metrics=metrics, max_seq_len=16 * BS)
    s = cache.add_sequence()
    cache.grow_sequence(s, 3 * BS)
    assert cache.try_grow_sequence(s, 9 * BS) is Status.OUT_OF_MEMORY
    cache.free_sequence(s)
    snap = metrics.snapshot()
    assert (snap["blocks_allocated"], snap["blocks_freed"], snap["oom_events"]) == (3, 3, 1)
    assert (snap["free_blocks"], snap["active_blocks"], snap["sequences"]) == (4, 0, 0)
    assert snap["calls"]["grow_sequence"] == 1 and snap["latency"]["count"] == 4


def test_reservations_are_counted():
    metrics = MetricsCollector()
    cache = make(num_blocks=4, metrics=metrics)
    a, b = cache.add_sequence(), cache.add_sequence()
    assert cache.reserve_predictions(np.array([[a, -1], [b, 0]], np.int64)) == 2
    assert metrics.snapshot()["reserved_blocks"] == 2
    assert cache.release_all_reserved() == 2
    snap = metrics.snapshot()
    assert (snap["blocks_allocated"], snap["blocks_freed"], snap["reserved_blocks"]) == (2, 2, 0)
    assert snap["calls"]["reserve_predictions"] == snap["calls"]["release_all_reserved"] == 1


def test_quarantined_blocks_gauge_follows_the_cache():
    metrics = MetricsCollector()
    cache = make(num_blocks=4, metrics=metrics)
    s = cache.add_sequence()
    cache.grow_sequence(s, 2 * BS)
    assert cache.quarantine_block(int(cache.block_table(s)[0]))
    snap = metrics.snapshot()
    assert (snap["quarantined_blocks"], snap["active_blocks"], snap["free_blocks"]) == (1, 1, 2)
    cache.free_sequence(s)  # the quarantined block is not freed with its sequence
    snap = metrics.snapshot()
    assert (snap["quarantined_blocks"], snap["free_blocks"], snap["blocks_freed"]) == (1, 3, 1)
    assert snap["calls"]["quarantine_block"] == 1 and "quarantined=1" in metrics.to_string()
