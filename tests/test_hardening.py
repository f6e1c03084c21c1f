"""Hardening (issue 13): every entry point under hostile input, one test per class of bad
outcome found by the adversarial pass (docs/adversarial.md): a crash, a hang, a raw
exception instead of a HexcoreError, an overlapping copy, a launcher outside the shared
validation layer. The fuzz targets of fuzz/ run in tests/fuzz."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import time
from multiprocessing import shared_memory

import numpy as np
import pytest

from hexcore import KVCacheConfig
from hexcore.errors import (HexcoreConfigError, HexcoreCorruptionError, HexcoreInvalidArgumentError,
                            HexcoreOOMError)
from hexcore.host import LockFreeRingBuffer, MetricsCollector
from hexcore.host import ring as ring_mod
from hexcore.host.metrics import as_collector
from hexcore.host.ring import check_timeout

def _forged_segment(capacity, width, words=None, **header):
    """A shared segment with a ring header of the given (possibly impossible) shape."""
    words = words if words is not None else ring_mod.ring_words(8, 4)
    shm = shared_memory.SharedMemory(create=True, size=words * 8)
    buf = np.ndarray(words, np.int64, buffer=shm.buf)
    buf[:] = 0
    if words >= ring_mod.HEADER_WORDS:
        buf[ring_mod.MAGIC], buf[ring_mod.CAPACITY], buf[ring_mod.RECORD_WIDTH] = ring_mod.RING_MAGIC, capacity, width
        for name, value in header.items():
            buf[getattr(ring_mod, name)] = value
    del buf
    return shm


# -- class 1: a crash (a forged shared ring header) --------------------------------------
@pytest.mark.parametrize("capacity, width, match", [
    (-1, 4, "capacity -1"), (-(2**40), 4, "capacity"), (6, 4, "power of two"), (0, 4, "capacity 0"),
    (2**33, 4, "capacity"), (8, -100, "record_width -100"), (8, 0, "record_width 0"), (8, 2**20, "record_width"),
    (16, 4, "needs"), (2**32, 4096, "needs"),
])
def test_attach_refuses_a_forged_header(capacity, width, match):
    shm = _forged_segment(capacity, width, TAIL=-(2**40))
    try:
        with pytest.raises(HexcoreCorruptionError, match=match):
            LockFreeRingBuffer.attach(shm.name)
    finally:
        shm.close()
        shm.unlink()


@pytest.mark.parametrize("words, magic, match", [(8, True, "shorter than a ring header"),
                                                 (ring_mod.ring_words(8, 4), False, "bad magic")])
def test_attach_refuses_what_is_not_a_ring(words, magic, match):
    shm = _forged_segment(8, 4, words=words)
    if not magic and words >= ring_mod.HEADER_WORDS:
        np.ndarray(words, np.int64, buffer=shm.buf)[ring_mod.MAGIC] = 12345
    try:
        with pytest.raises(HexcoreInvalidArgumentError, match=match):
            LockFreeRingBuffer.attach(shm.name)
    finally:
        shm.close()
        shm.unlink()


def test_forged_header_that_crashed_the_producer_is_a_typed_error_in_a_subprocess():
    """The reproducer of the SIGSEGV (negative capacity, forged tail), in its own process so
    a regression fails this test instead of killing the run."""
    script = textwrap.dedent("""
        import numpy as np
        from multiprocessing import shared_memory
        from hexcore.errors import HexcoreCorruptionError
        from hexcore.host import LockFreeRingBuffer
        from hexcore.host import ring as r
        shm = shared_memory.SharedMemory(create=True, size=r.ring_words(8, 4) * 8)
        buf = np.ndarray(shm.size // 8, np.int64, buffer=shm.buf); buf[:] = 0
        buf[r.MAGIC], buf[r.CAPACITY], buf[r.RECORD_WIDTH], buf[r.TAIL] = r.RING_MAGIC, -1, 4, -(2**40)
        try:
            ring = LockFreeRingBuffer.attach(shm.name)
            for _ in range(100):
                ring.try_push(np.arange(4))
            print("accepted")
        except HexcoreCorruptionError as exc:
            print("typed:", exc)
        # the raw njit functions on the forged vector: nothing read or written
        assert r.ring_try_push(buf, np.arange(4)) == r.RING_CLOSED
        assert r.ring_try_pop_batch(buf, np.empty((4, 4), np.int64)) == r.RING_CLOSED
        assert r.ring_len(buf) == 0
        del buf; shm.close(); shm.unlink()
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.startswith("typed: ") and "capacity -1" in done.stdout


def test_header_rewritten_after_attach_is_reported_not_followed():
    """A peer that rewrites capacity or width later: every push and pop re-checks the header."""
    ring = LockFreeRingBuffer.create_shared(8, 4)
    peer = LockFreeRingBuffer.attach(ring.name)
    try:
        peer.push([1, 2, 3, 4])
        buf = ring.buffer
        for word, value in ((ring_mod.CAPACITY, 2**40), (ring_mod.CAPACITY, -1), (ring_mod.RECORD_WIDTH, 4096),
                            (ring_mod.RECORD_WIDTH, 2)):
            saved = int(buf[word])
            buf[word] = value
            with pytest.raises(HexcoreCorruptionError, match="corrupted header"):
                peer.try_push(np.arange(4))
            with pytest.raises(HexcoreCorruptionError, match="corrupted header"):
                ring.try_pop(np.empty(4, np.int64))
            with pytest.raises(HexcoreCorruptionError):
                len(ring)
            buf[word] = saved
        buf[ring_mod.TAIL] = -(2**62)  # head and tail are only used masked: a forged one cannot index outside
        assert 0 <= len(ring) <= 8 and ring.try_push_batch(np.zeros((20, 4), np.int64)) <= 8
        del buf
    finally:
        peer.close()
        ring.close()


def test_njit_ring_functions_take_wrong_widths_and_short_vectors_safely():
    ring = LockFreeRingBuffer(4, 3)
    buf = ring.buffer
    assert ring_mod.ring_try_push(buf, np.zeros(2, np.int64)) == ring_mod.RING_CLOSED  # width 2 into width 3
    assert ring_mod.ring_try_push_batch(buf, np.zeros((2, 9), np.int64)) == ring_mod.RING_CLOSED
    assert ring_mod.ring_try_pop(buf, np.empty(1, np.int64)) == ring_mod.RING_CLOSED
    short = np.zeros(10, np.int64)
    assert ring_mod.ring_try_push(short, np.zeros(3, np.int64)) == ring_mod.RING_CLOSED
    ring_mod.ring_close(short)  # no write past a short vector
    assert not short.any() and ring_mod.ring_len(short) == 0
    assert ring.try_push([1, 2, 3]) == 1 and len(ring) == 1  # the ring itself is untouched


# -- class 2: hangs (timeouts) ---------------------------------------------------------------
@pytest.mark.parametrize("timeout", [float("nan"), float("inf"), -1, -1e-9, "1", True, np.bool_(True), [1], 10**400,
                                     np.float64("nan")])
def test_timeouts_are_finite_and_non_negative(timeout):
    ring = LockFreeRingBuffer(2, 1)
    start = time.monotonic()
    for call in (lambda: ring.pop(timeout=timeout), lambda: ring.pop_batch(4, timeout=timeout),
                 lambda: ring.push_batch(np.zeros((3, 1), np.int64), timeout=timeout),
                 lambda: ring.push([1], timeout=timeout)):
        with pytest.raises(HexcoreInvalidArgumentError, match="timeout: expected a finite number of seconds >= 0"):
            call()
    assert time.monotonic() - start < 5 and len(ring) == 0  # nothing waited, nothing pushed


@pytest.mark.parametrize("value, expect", [(None, None), (0, 0.0), (0.5, 0.5), (np.float32(2), 2.0), (np.int64(3), 3.0),
                                           (10**30, 1e30)])
def test_check_timeout_accepts_finite_numbers(value, expect):
    assert check_timeout("timeout", value) == expect
    with pytest.raises(HexcoreInvalidArgumentError):
        check_timeout("poll", None, allow_none=False)


def test_a_zero_timeout_polls_once_and_large_batches_allocate_one_ring():
    ring = LockFreeRingBuffer(2, 1)
    with pytest.raises(TimeoutError):
        ring.pop(timeout=0)
    ring.push([7])
    assert ring.pop_batch(2**32, timeout=0.0).tolist() == [[7]]  # no [2**32, 1] buffer is allocated


# -- class 3: raw exceptions instead of HexcoreError -----------------------------------------------
@pytest.mark.parametrize("name", ["", "a/b", "x\0y", "x" * 300, 5, None, b"ring", "\udcff"])
def test_bad_shared_memory_names_are_typed(name):
    with pytest.raises(HexcoreInvalidArgumentError, match="name"):
        LockFreeRingBuffer.attach(name)
    if name is not None:
        with pytest.raises(HexcoreInvalidArgumentError, match="name"):
            LockFreeRingBuffer.create_shared(8, 1, name=name)


def test_ring_outputs_and_records_are_checked():
    ring = LockFreeRingBuffer(4, 2)
    out = np.empty((2, 2), np.int64)
    out.flags.writeable = False
    with pytest.raises(HexcoreInvalidArgumentError, match="out: expected a writable"):
        ring.try_pop_batch(out)
    with pytest.raises(HexcoreInvalidArgumentError, match="out: expected a writable"):
        ring.try_pop(out[0])
    with pytest.raises(HexcoreInvalidArgumentError, match="records"):
        ring.push_batch([[1, 2], [3]])  # ragged
    with pytest.raises(HexcoreInvalidArgumentError, match="does not fit int64"):
        ring.push([np.uint64(2**63), np.uint64(1)])  # a list of uint64 that int64 cannot hold
    assert len(ring) == 0


def test_ring_too_large_for_memory_is_an_oom_error(monkeypatch):
    def refuse(*args, **kwargs):
        raise MemoryError
    monkeypatch.setattr(ring_mod.np, "zeros", refuse)
    with pytest.raises(HexcoreOOMError, match="does not fit in memory"):
        LockFreeRingBuffer(2**32, 4096)


def test_a_bad_record_call_raises_typed_and_leaves_the_collector_usable():
    from hexcore.host.metrics import COUNTERS, GAUGES

    m = MetricsCollector()
    good_inc, good_gauges = (1,) * len(COUNTERS), (2,) * len(GAUGES)
    bad_calls = [
        ("op", 5, (1, 2), good_gauges), ("op", 5, good_inc, (1,)), ("op", 5, good_inc, None), ("op", 5, None, None),
        ("op", "5", good_inc, good_gauges), ("op", float("nan"), good_inc, good_gauges), ("op", -1, good_inc, good_gauges),
        (None, 5, good_inc, good_gauges), ("op", 5, (None,) * len(COUNTERS), good_gauges),
        ("op", 5, ("a",) * len(COUNTERS), good_gauges), ("op", 5, (-1,) * len(COUNTERS), good_gauges),
        ("op", 5, (1.5,) * len(COUNTERS), good_gauges), ("op", 5, good_inc, (True,) * len(GAUGES)),
        ("op", 10**30, good_inc, good_gauges), ("op", 5, "abcdef", good_gauges),
    ]
    for args in bad_calls:
        with pytest.raises(HexcoreInvalidArgumentError):
            m.record(*args)
        snap = m.snapshot()  # still usable, nothing recorded
        assert snap["latency"]["count"] == 0 and snap["calls"] == {} and snap["blocks_allocated"] == 0
    m.record("op", 5, good_inc, good_gauges)
    m.record("op", np.int64(5), list(good_inc), np.array(good_gauges))  # the checked path takes numpy and lists
    assert m.snapshot()["calls"] == {"op": 2} and m.to_string().startswith("hexcore")


@pytest.mark.parametrize("call", [
    lambda m: m.observe(None, 1), lambda m: m.observe("x", float("nan")), lambda m: m.observe("x", 1, freed=-1),
    lambda m: m.set_gauges(active_blocks=None, free_blocks=0, reserved_blocks=0, sequences=0, num_blocks=0),
    lambda m: m.percentile_us(float("nan")), lambda m: m.percentile_us(10**400), lambda m: m.percentile_us(np.bool_(1)),
    lambda m: MetricsCollector(buckets_us=(1, 10**400)), lambda m: MetricsCollector(buckets_us=(1, 2**53, 2**53 + 1)),
    lambda m: MetricsCollector(buckets_us=[1.0] * 5000), lambda m: as_collector("metrics", 5),
])
def test_every_metrics_error_is_typed(call):
    m = MetricsCollector()
    with pytest.raises(HexcoreInvalidArgumentError):
        call(m)
    assert m.snapshot()["latency"]["count"] == 0


def test_metrics_without_prometheus_is_a_config_error():
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        with pytest.raises(HexcoreConfigError, match="prometheus_client"):
            MetricsCollector().register()
    else:
        with pytest.raises(HexcoreInvalidArgumentError, match="registry"):
            MetricsCollector().register(registry=object())


def test_distinct_operation_names_are_bounded():
    from hexcore.host.metrics import COUNTERS, GAUGES, MAX_OPS

    m = MetricsCollector()
    for i in range(MAX_OPS):
        m.record(f"op{i}", 1, (0,) * len(COUNTERS), (0,) * len(GAUGES))
    with pytest.raises(HexcoreInvalidArgumentError, match="distinct operations"):
        m.record("one more", 1, (0,) * len(COUNTERS), (0,) * len(GAUGES))
    assert len(m.snapshot()["calls"]) == MAX_OPS


# -- launchers on the simulator: classes 3 (typed errors), 4 (overlaps), 5 (one validation layer) --
@pytest.fixture(scope="module")
def store():
    from hexcore.cuda import DeviceKVStore

    cfg = KVCacheConfig(num_layers=2, num_kv_heads=1, head_dim=64, block_size=16, kv_dtype="int4", group_size=32)
    store = DeviceKVStore(cfg, num_blocks=4, max_seqs=3)
    store.pool.copy_to_device(np.zeros(store.pool.shape, np.uint32))
    return store


def _ids(*values):
    return np.array(values, np.int32)


def _launchers(store):
    from hexcore.cuda import append, copy_blocks, copy_tails, dequantize_blocks, seal

    k = np.zeros((2, 1, 1, 64), np.float16)
    return {
        "append": lambda s, layer=None: append(s, k if layer is None else k[0], k if layer is None else k[0],
                                               _ids(0), _ids(0), layer=layer),
        "seal": lambda s, layer=None: seal(s, _ids(0), _ids(1), layer=layer),
        "copy_tails": lambda s, layer=None: copy_tails(s, _ids(0), _ids(1)),
        "copy_blocks": lambda s, layer=None: copy_blocks(s, _ids(0), _ids(1)),
        "dequantize_blocks": lambda s, layer=0: dequantize_blocks(s, layer, _ids(0)),
    }


@pytest.mark.parametrize("bad", [None, "store", 3, KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=64)])
def test_every_launcher_refuses_a_non_store(store, bad):
    from numba import cuda

    from hexcore.cuda import DecodeGraph, paged_decode, prepare_append, prepare_copy_tails, prepare_seal

    calls = list(_launchers(store).values()) + [
        lambda s: paged_decode(np.zeros((1, 1, 64), np.float16), s, 0, np.zeros((1, 1), np.int32), _ids(1), _ids(0)),
        lambda s: prepare_seal(s, cuda.to_device(_ids(0)), cuda.to_device(_ids(1))),
        lambda s: prepare_copy_tails(s, cuda.to_device(_ids(0)), cuda.to_device(_ids(1))),
        lambda s: prepare_append(s, None, None, None, None), lambda s: DecodeGraph(s, 1, 4),
    ]
    for call in calls:
        with pytest.raises(HexcoreInvalidArgumentError, match="store: expected a DeviceKVStore"):
            call(bad)


@pytest.mark.parametrize("layer", [True, np.bool_(False), 1.0, "0", -1, 2, 10**30, np.float64(0), [0]])
def test_layers_follow_the_integer_rule_in_every_launcher(store, layer):
    for name, call in _launchers(store).items():
        if name in ("copy_tails", "copy_blocks"):
            continue
        with pytest.raises(HexcoreInvalidArgumentError, match=r"layer: expected an int in \[0, 2\)"):
            call(store, layer)


def test_numpy_integer_layers_are_layers(store):
    for name, call in _launchers(store).items():
        call(store, np.int64(1) if name != "copy_tails" else None)


@pytest.mark.parametrize("what", ["copy_tails", "copy_blocks"])
def test_copies_refuse_overlapping_sources_and_destinations(store, what):
    from hexcore import cuda as hc

    copy = getattr(hc, what)
    for src, dst, named in (((0,), (0,), "[0]"), ((0, 1), (1, 2), "[1]"), ((2, 0), (1, 2), "[2]")):
        with pytest.raises(HexcoreInvalidArgumentError, match=rf"ids {re.escape(named)} are also in src_"):
            copy(store, _ids(*src), _ids(*dst))
    with pytest.raises(HexcoreInvalidArgumentError, match=r"expected distinct ids, got \[1\] more than once"):
        copy(store, _ids(0, 0), _ids(1, 1))
    copy(store, _ids(0, 0), _ids(1, 2))  # one source to many destinations reads only


def test_append_refuses_one_tail_place_written_twice(store):
    from hexcore.cuda import append

    k = np.zeros((2, 2, 1, 64), np.float16)
    with pytest.raises(HexcoreInvalidArgumentError, match=r"\(slots, positions\): entry 0 \(1, 3\) appears more"):
        append(store, k, k, _ids(1, 1), _ids(3, 3))
    append(store, k, k, _ids(1, 1), _ids(3, 4))


def test_decode_step_refuses_forks_whose_sources_are_fork_targets(store):
    from hexcore.cuda.steps.indices import check_step

    tables, lens, slots = np.zeros((2, 1), np.int32), _ids(1, 1), _ids(0, 1)
    with pytest.raises(HexcoreInvalidArgumentError, match=r"fork_dst\[1\] = 2 is also a fork_src entry"):
        check_step(store, 4, tables, lens, slots, fork_src=_ids(0, 2), fork_dst=_ids(1, 2))
    with pytest.raises(HexcoreInvalidArgumentError, match=r"fork_dst\[0\] = 0 is also a fork_src entry"):
        check_step(store, 4, tables, lens, slots, fork_src=_ids(0), fork_dst=_ids(0))
    check_step(store, 4, tables, lens, slots, fork_src=_ids(0, 0), fork_dst=_ids(1, 2))


def test_outputs_must_be_writable_device_arrays(store):
    from numba import cuda

    from hexcore.cuda import paged_decode

    q = np.zeros((1, 1, 64), np.float16)
    args = (store, 0, np.zeros((1, 1), np.int32), _ids(1), _ids(0))
    host = np.zeros((1, 1, 64), np.float16)
    with pytest.raises(HexcoreInvalidArgumentError, match="out: an output must be a device array"):
        paged_decode(q, *args, out=host)
    host.flags.writeable = False
    with pytest.raises(HexcoreInvalidArgumentError, match="read-only"):
        paged_decode(q, *args, out=host)

    class ReadOnly:  # a CUDA array exporter that marks its memory read-only
        def __init__(self, arr):
            iface = dict(arr.__cuda_array_interface__)
            iface["data"] = (iface["data"][0], True)
            self.__cuda_array_interface__ = iface

    device_out = cuda.device_array((1, 1, 64), np.float16)
    if hasattr(device_out, "__cuda_array_interface__"):
        with pytest.raises(HexcoreInvalidArgumentError, match="out: an output must be writable"):
            paged_decode(q, *args, out=ReadOnly(device_out))
    paged_decode(q, *args, out=device_out)


@pytest.mark.parametrize("x, match", [
    (np.zeros((1, 1, 64), object), "dtype"), (np.zeros((1, 1, 64), "U1"), "dtype"), (3, "got int"),
    (None, "got NoneType"), ([0.0] * 64, "got list"),
])
def test_wrong_kinds_of_arrays_are_typed(store, x, match):
    from hexcore.cuda import append

    with pytest.raises(HexcoreInvalidArgumentError, match=match):
        append(store, x, x, _ids(0), _ids(0), layer=0)


def test_dequantize_never_indexes_outside_the_pool():
    from numba import cuda

    from hexcore.cuda import DeviceKVStore, dequantize_blocks

    fp16 = DeviceKVStore(KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=64, block_size=16), 4, 1)
    with pytest.raises(HexcoreInvalidArgumentError, match=r"block_ids\[1\] = 4 is outside \[0, 4\)"):
        dequantize_blocks(fp16, 0, cuda.to_device(_ids(0, 4)))  # device ids are read back on this path


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_q_heads=True), "num_q_heads"), (dict(num_q_heads=1.0), "num_q_heads"),
    (dict(max_blocks_per_seq=10**30), "max_blocks_per_seq"), (dict(max_blocks_per_seq=None), "max_blocks_per_seq"),
    (dict(batch_buckets=range(1, 10**9)), "at most 64"), (dict(batch_buckets=(1, None)), "batch_buckets"),
    (dict(scale=float("nan")), "scale"), (dict(scale=10**400), "scale"), (dict(scale=np.bool_(True)), "scale"),
    (dict(backend="cuda"), "backend"),
])
def test_decode_graph_arguments(store, kwargs, match):
    from hexcore.cuda import DecodeGraph

    args = dict(num_q_heads=1, max_blocks_per_seq=4)
    args.update(kwargs)
    with pytest.raises(HexcoreInvalidArgumentError, match=match):
        DecodeGraph(store, **args)


def test_decode_graph_calls_follow_the_integer_rule(store):
    import warnings

    from hexcore.cuda import DecodeGraph

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = DecodeGraph(store, 1, 4, batch_buckets=(1,), backend="eager")
    for call in (lambda: graph.buffers(None), lambda: graph.buffers(10**6), lambda: graph.buffers(1.0),
                 lambda: graph.warmup(1, None), lambda: graph.warmup(True, 5), lambda: graph.context_bucket("9"),
                 lambda: graph.context_bucket(float("nan"))):
        with pytest.raises(HexcoreInvalidArgumentError):
            call()
    assert graph.context_bucket(np.int64(17)) == 32



def test_a_shared_ring_larger_than_shared_memory_is_refused_not_a_later_sigbus(monkeypatch):
    """A sparse 128 GiB segment on a 24 GiB /dev/shm was accepted; the producer would
    die of SIGBUS once tmpfs filled. Now: room is checked, and the pages are reserved."""
    import errno
    import os

    monkeypatch.setattr(ring_mod, "_shm_free_bytes", lambda: 4096)
    with pytest.raises(HexcoreOOMError, match="free in /dev/shm"):
        LockFreeRingBuffer.create_shared(1024, 4)
    monkeypatch.setattr(ring_mod, "_shm_free_bytes", lambda: None)

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(HexcoreOOMError, match="no room for shared ring 'hexcore_full_ring'"):
        LockFreeRingBuffer.create_shared(8, 4, name="hexcore_full_ring")
    with pytest.raises(HexcoreInvalidArgumentError, match="no shared ring named"):
        LockFreeRingBuffer.attach("hexcore_full_ring")  # unlinked on the way out


def test_inputs_that_alias_the_store_are_refused(store):
    """k given as a view of the store's own memory: the append would read what it writes."""
    from hexcore.cuda import append, copy_tails, seal

    rows = store.pool[:2 * 64 // 2].view(np.float16).reshape(2, 1, 1, 64)  # 2 layers x 1 row, inside the pool
    fresh = np.zeros((2, 1, 1, 64), np.float16)
    with pytest.raises(HexcoreInvalidArgumentError, match="k: lies inside the store's memory"):
        append(store, rows, fresh, _ids(0), _ids(0))
    ids = store.pool[:1].view(np.int32)
    with pytest.raises(HexcoreInvalidArgumentError, match="slots: lies inside"):
        seal(store, ids, _ids(1))
    with pytest.raises(HexcoreInvalidArgumentError, match="dst_slots: lies inside"):
        copy_tails(store, _ids(1), ids)
    append(store, fresh, fresh, _ids(0), _ids(0))


# -- the fixes of the second pass (docs/adversarial.md, "What was found and fixed") ------------
def _cache(**kw):
    from hexcore.host import PagedKVCache

    return PagedKVCache(KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=64, block_size=16), 8, 4, **kw)


@pytest.mark.parametrize("metrics", [5, "m", object(), MetricsCollector])
def test_a_cache_takes_a_collector_or_none_for_metrics(metrics):
    with pytest.raises(HexcoreInvalidArgumentError, match="metrics: expected a MetricsCollector or None"):
        _cache(metrics=metrics)


@pytest.mark.parametrize("timeout", [float("nan"), float("inf"), -1, "1", True, 10**400])
def test_event_timeouts_are_checked_before_anything_waits(timeout):
    """drain(nan) on an open ring never returned, flush(nan) spun while the ring was full,
    "1" raised TypeError: every event timeout goes through ring.check_timeout."""
    from hexcore.host import BlockTableMirror
    from hexcore.host.events import EventPublisher

    ring = LockFreeRingBuffer(1, 4)
    cache = _cache()
    cache.attach_event_ring(ring)
    mirror = BlockTableMirror.like(cache, ring)
    for _ in range(3):
        cache.add_sequence()  # the ring holds one event: the others are staged
    staged = cache._events.pending
    assert staged > 0
    for call in (lambda: mirror.drain(timeout), lambda: cache.flush_events(timeout),
                 lambda: EventPublisher(LockFreeRingBuffer(1, 4)).flush(timeout)):
        started = time.monotonic()
        with pytest.raises(HexcoreInvalidArgumentError, match="timeout: expected a finite number"):
            call()
        assert time.monotonic() - started < 5
    assert cache._events.pending == staged and len(ring) == 1 and mirror.events_applied == 0
    assert cache.flush_events(0.0) == staged and mirror.poll() == 1


@pytest.mark.parametrize("num_blocks, max_seqs, kw", [
    (2**31 - 1, 2**31 - 1, {}), (2**31 - 1, 4, {}), (4, 2**31 - 1, {"max_seq_len": 2**31 - 16}),
    (2**31 - 1, 1, {"prefix_cache": True, "max_seq_len": 16}),
])
def test_absurd_cache_sizes_are_oom_errors_not_memory_errors(num_blocks, max_seqs, kw):
    from hexcore.host import PagedKVCache

    with pytest.raises(HexcoreOOMError, match="GiB of host memory"):
        PagedKVCache(KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=64, block_size=16), num_blocks, max_seqs,
                     **kw)


def test_a_cache_that_does_not_fit_free_memory_is_an_oom_error(monkeypatch):
    from hexcore.host import _blocks

    def no_memory(*args):
        raise MemoryError("simulated")

    monkeypatch.setattr(_blocks, "new_state", no_memory)
    with pytest.raises(HexcoreOOMError, match="no free host memory"):
        _cache()


def test_cache_state_size_matches_what_numpy_allocates():
    from hexcore.host._validation import state_bytes

    for prefix in (False, True):
        cache = _cache(prefix_cache=prefix)
        arrays = [cache._blocks, cache._seqs, cache._tables, cache._counters, cache._out_rows, cache._out_tables,
                  cache._seals]
        if prefix:
            cache.attach_event_ring(LockFreeRingBuffer(4, 4))  # (the event log is allocated with a ring)
            arrays += [*cache._prefix.arrays(), cache._prefix.plog, cache._prefix.scratch]
        held = sum(a.nbytes for a in arrays)
        assert held <= state_bytes(8, 4, cache.max_blocks_per_seq, 16, prefix) <= held + 512


def _decode_args(store):
    from numba import cuda

    return (np.zeros((1, 1, 64), np.float16), store, 0, cuda.to_device(np.zeros((1, 2), np.int32)),
            cuda.to_device(_ids(17)), cuda.to_device(_ids(0)))


@pytest.mark.parametrize("layer", [True, np.bool_(False), 1.0, "0", -1, 2, 10**30, [0], None])
def test_decode_layers_follow_the_integer_rule(store, layer):
    from numba import cuda

    from hexcore.cuda import DecodePlan, paged_decode

    q, s, _, tables, lens, slots = _decode_args(store)
    with pytest.raises(HexcoreInvalidArgumentError, match=r"layer: expected an int in \[0, 2\)"):
        paged_decode(q, s, layer, tables, lens, slots)
    plan = DecodePlan(cuda.to_device(q), s, tables, lens, slots, max_seq_len=17)
    for call in (plan.run, plan.launch):
        with pytest.raises(HexcoreInvalidArgumentError, match=r"layer: expected an int in \[0, 2\)"):
            call(layer)


def test_decode_takes_numpy_integers_for_layer_and_max_seq_len(store):
    from numba import cuda

    from hexcore.cuda import DecodePlan, paged_decode

    q, s, _, tables, lens, slots = _decode_args(store)
    plan = DecodePlan(cuda.to_device(q), s, tables, lens, slots, max_seq_len=np.int64(17))
    assert plan.run(np.int64(1)) is plan.out and plan.launch(np.int32(1)) is plan.launch(1)
    out = paged_decode(q, s, np.int8(0), np.zeros((1, 2), np.int32), _ids(17), _ids(0), max_seq_len=np.int64(17))
    assert out.shape == (1, 1, 64)


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), -float("inf"), 0, 0.0, -1, True, np.bool_(True),
                                   10**400, "x", np.float32("nan"), 1j])
def test_decode_scale_is_a_positive_finite_number_everywhere(store, scale):
    from numba import cuda

    from hexcore.cuda import DecodeGraph, DecodePlan, paged_decode

    q, s, layer, tables, lens, slots = _decode_args(store)
    calls = {"paged_decode": lambda: paged_decode(q, s, layer, tables, lens, slots, scale=scale),
             "DecodePlan": lambda: DecodePlan(cuda.to_device(q), s, tables, lens, slots, 17, scale=scale),
             "DecodeGraph": lambda: DecodeGraph(s, 1, 4, scale=scale)}
    for name, call in calls.items():
        with pytest.raises(HexcoreInvalidArgumentError, match="scale"):
            call()


@pytest.mark.parametrize("max_seq_len, match", [
    (1.5, "expected an int"), ("3", "expected an int"), (True, "expected an int"), (10**30, r"in \[0, 47\]"),
    (-1, r"in \[0, 47\]"), (48, r"in \[0, 47\]"), (16, "below the longest seq_lens entry 17"),
])
def test_decode_max_seq_len_is_checked_against_tables_and_host_lengths(store, max_seq_len, match):
    from hexcore.cuda import paged_decode

    q, s, layer, _, _, slots = _decode_args(store)
    with pytest.raises(HexcoreInvalidArgumentError, match=f"max_seq_len: .*{match}"):
        paged_decode(q, s, layer, np.zeros((1, 2), np.int32), _ids(17), _ids(0), max_seq_len=max_seq_len)


def test_decode_plan_checks_its_own_arguments(store):
    from numba import cuda

    from hexcore.cuda import DecodePlan, paged_decode

    q, s, layer, tables, lens, slots = _decode_args(store)
    with pytest.raises(HexcoreInvalidArgumentError, match="workspace: expected a Workspace"):
        DecodePlan(cuda.to_device(q), s, tables, lens, slots, 17, workspace=5)
    with pytest.raises(HexcoreInvalidArgumentError, match="store: expected a DeviceKVStore"):
        DecodePlan(cuda.to_device(q), None, tables, lens, slots, 17)
    inside = store.arrays["k_tails"].reshape(-1)[:64].reshape(1, 1, 64)  # float16 inside the store
    with pytest.raises(HexcoreInvalidArgumentError, match="out: lies inside the store's memory"):
        paged_decode(q, s, layer, tables, lens, slots, out=inside)
    with pytest.raises(HexcoreInvalidArgumentError, match="block_tables: expected dtype int32"):
        paged_decode(q, s, layer, np.array([["a", "b"]]), _ids(17), slots)  # (compared with ints before)


@pytest.mark.parametrize("stream", ["abc", b"x", 1.5, True, -1, 2**64, object(), [0]])
def test_streams_are_checked_on_the_simulator_as_on_a_gpu(store, stream):
    from hexcore.cuda import seal
    from hexcore.cuda.streams import resolve_stream

    with pytest.raises(HexcoreInvalidArgumentError, match="stream: expected"):
        resolve_stream(stream)
    with pytest.raises(HexcoreInvalidArgumentError, match="stream: expected"):
        seal(store, _ids(0), _ids(1), stream=stream)


def test_gpu_stream_handles_are_checked_before_the_driver_sees_them():
    pytest.importorskip("cuda.bindings.driver")
    from hexcore.cuda.streams import stream_handle

    for bad in (-1, 2**64, True):
        with pytest.raises(HexcoreInvalidArgumentError, match=r"stream: expected a stream or a handle in \[0, 2\*\*64\)"):
            stream_handle(bad)
    assert int(stream_handle(5)) == 5


def test_a_mirror_is_sized_like_a_cache_only():
    from hexcore.host import BlockTableMirror

    for bad in (None, 3, KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=64)):
        with pytest.raises(HexcoreInvalidArgumentError, match="cache: expected a PagedKVCache"):
            BlockTableMirror.like(bad, LockFreeRingBuffer(4, 4))


def test_names_that_are_not_strings_are_typed():
    from hexcore.cuda.steps import capture

    for bad in (np.array(["a", "b"]), ["auto"], None, 3):
        with pytest.raises(HexcoreInvalidArgumentError, match="backend: expected one of"):
            capture.choose_backend(bad)
    for bad in ([], {}, None, 3, np.array(["llama-3-8b"])):
        with pytest.raises(HexcoreConfigError, match="preset: expected one of"):
            KVCacheConfig.from_preset(bad)


def test_a_failed_growth_publishes_no_stale_events():
    from hexcore.host import BlockTableMirror

    cache = _cache(prefix_cache=True)
    ring = LockFreeRingBuffer(64, 4)
    cache.attach_event_ring(ring)
    mirror = BlockTableMirror.like(cache, ring)
    sid = cache.add_sequence()
    cache.step(np.array([sid], np.int32), np.array([32], np.int32))
    mirror.poll()
    assert cache.try_grow_sequence(10**30, 1) == 3  # Status.INVALID_SEQUENCE
    assert len(ring) == 0
    mirror.poll()


# -- the last reported findings (docs/adversarial.md), fixed at their roots ------------
@pytest.mark.parametrize("status", [0.5, "0", 1.5, True, None, [0], float("inf"), 10**30, -1])
def test_raise_for_status_follows_the_integer_rule(status):
    from hexcore.errors import raise_for_status

    with pytest.raises(HexcoreInvalidArgumentError, match="status"):
        raise_for_status(status)
    raise_for_status(np.int64(0))  # Status.OK as a numpy integer: quiet


@pytest.mark.parametrize("config,num_blocks,match", [
    (None, 3, "config: expected KVCacheConfig, got NoneType"),
    ("llama-3-8b", 3, "config: expected KVCacheConfig, got str"),
    (KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=64, block_size=16), "x", "num_blocks: expected an int"),
    (KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=64, block_size=16), -1, r"num_blocks: expected an int in"),
    (KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=64, block_size=16), None, "num_blocks: expected an int")])
def test_layout_check_arguments_are_typed(config, num_blocks, match):
    from hexcore.cuda import device_layout_offsets, host_layout_offsets, layout_agrees

    for call in (device_layout_offsets, host_layout_offsets, layout_agrees):
        with pytest.raises(HexcoreInvalidArgumentError, match=match):
            call(config, num_blocks)


@pytest.mark.parametrize("ids", [None, float("nan"), 10**30, object(), "ab", [10**30], [[0]], [0.5]])
def test_engine_step_ids_are_typed(ids):
    from hexcore import Engine

    engine = Engine(KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=64, block_size=16), 8, 4, num_q_heads=1)
    seq = engine.add()
    before = engine.cache.seq_len(seq)
    with pytest.raises(HexcoreInvalidArgumentError, match="seq_ids"):
        engine.step(ids)
    assert engine.cache.seq_len(seq) == before
    engine.cache.check_invariants()


@pytest.mark.parametrize("backend", [np.zeros((2, 2)), None, 3, b"numba"])
def test_prefill_backend_is_typed(backend):
    from hexcore.cuda import DeviceKVStore, prefill_attention

    cfg = KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=64, block_size=16)
    store = DeviceKVStore(cfg, 2, 1)
    x = np.zeros((1, 1, 64), np.float16)
    with pytest.raises(HexcoreInvalidArgumentError, match="backend"):
        prefill_attention(x, x, x, store, 0, np.zeros(0, np.int32), 0, backend=backend)
