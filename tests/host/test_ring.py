"""LockFreeRingBuffer: layout, a deque model, errors, and SPSC streams between threads
and processes (2,000,000 sequence-numbered records; a producer killed mid-stream)."""

from __future__ import annotations

import collections
import multiprocessing
import os
import pickle
import signal
import subprocess
import sys
import threading
import time

import numba
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hexcore.errors import HexcoreInvalidArgumentError
from hexcore.host import LockFreeRingBuffer
from hexcore.host import ring as ring_mod
from hexcore.host.ring import RING_CLOSED, ring_close, ring_len, ring_try_pop_batch, ring_try_push_batch

W = 4  # stream records: [seq, seq*3+1, ~seq, checksum]
NUM_STREAM = 2_000_000


@numba.njit(cache=True, nogil=True)
def _fill(rec, seq):
    rec[0], rec[1], rec[2] = seq, seq * 3 + 1, ~seq
    rec[3] = seq * 7 + rec[1] * 11 - rec[2] * 13


@numba.njit(cache=True, nogil=True)
def produce(buf, start, stop, batch):
    """Push records start..stop-1 in batches; return the full-ring retries, -1 if closed."""
    recs = np.empty((batch, W), np.int64)
    seq, full = start, 0
    while seq < stop:
        n = min(batch, stop - seq)
        for i in range(n):
            _fill(recs[i], seq + i)
        done = 0
        while done < n:
            count = ring_try_push_batch(buf, recs[done:n])
            if count == RING_CLOSED:
                return -1
            full += count == 0
            done += count
        seq += n
    return full


@numba.njit(cache=True, nogil=True)
def consume(buf, total, batch, wait_full, result):
    """Pop until ``total`` records (or the end of stream, total < 0), checking each.

    result: int64 [3] -> [records received, first bad position or -1, empty polls]
    """
    expect, out = np.empty(W, np.int64), np.empty((batch, W), np.int64)
    while wait_full and ring_len(buf) < buf[ring_mod.CAPACITY] and buf[ring_mod.CLOSED] == 0:
        pass  # let the producer hit a full ring before draining starts
    result[1] = -1
    while total < 0 or result[0] < total:
        count = ring_try_pop_batch(buf, out)
        if count == RING_CLOSED:
            break
        result[2] += count == 0
        for i in range(count):
            _fill(expect, result[0])
            for w in range(W):
                if out[i, w] != expect[w] and result[1] < 0:
                    result[1] = result[0]
            result[0] += 1


def _start_consumer(buf, total, batch, wait_full=False):
    result = np.zeros(3, np.int64)
    thread = threading.Thread(target=consume, args=(buf, total, batch, wait_full, result))
    thread.start()
    return thread, result


def _producer_process(name, start, stop, batch):
    ring = LockFreeRingBuffer.attach(name)
    produce(ring.buffer, start, stop, batch)
    ring.close()  # end of stream; an attacher never unlinks


def _spawn(target, *args):
    proc = multiprocessing.get_context("spawn").Process(target=target, args=args)
    proc.start()
    return proc


# -- layout and single-threaded behaviour ---------------------------------------------------
def test_layout_lines_and_alignment():
    ring = LockFreeRingBuffer(16, 3)
    buf = ring.buffer
    assert buf.ctypes.data % 64 == 0 and (ring_mod.HEADER_WORDS * 8) % 64 == 0
    assert {ring_mod.HEAD * 8 // 64, ring_mod.TAIL * 8 // 64, ring_mod.CLOSED * 8 // 64} == {0, 2, 4}
    assert len(buf) == ring_mod.ring_words(16, 3) and buf[ring_mod.CAPACITY] == 16


@pytest.mark.parametrize("capacity,width", [(1, 1), (4, 1), (8, 4), (64, 7)])
def test_full_and_empty_are_counts(capacity, width):
    ring = LockFreeRingBuffer(capacity, width)
    out = np.empty((capacity + 3, width), np.int64)
    assert ring.try_pop_batch(out) == 0 and ring.try_pop(out[0]) == 0
    records = np.arange((capacity + 3) * width, dtype=np.int64).reshape(-1, width)
    assert ring.try_push_batch(records) == capacity and len(ring) == capacity
    assert ring.try_push(records[0]) == 0 and ring.try_push_batch(records) == 0
    assert ring.try_pop_batch(out) == capacity
    np.testing.assert_array_equal(out[:capacity], records[:capacity])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 11)), max_size=60))
def test_matches_deque_model(ops):
    ring, model, seq = LockFreeRingBuffer(8, 2), collections.deque(), 0
    for is_push, k in ops:
        if is_push:
            records = np.arange(seq, seq + k, dtype=np.int64)[:, None] * [1, -1]
            count = ring.try_push_batch(records) if k != 1 else ring.try_push(records[0])
            assert count == min(k, 8 - len(model))
            model.extend(records[:count, 0].tolist())
            seq += count
        else:
            out = np.empty((k, 2), np.int64)
            count = ring.try_pop_batch(out) if k != 1 else ring.try_pop(out[0])
            want = [model.popleft() for _ in range(min(k, len(model)))]
            assert count == len(want) and out[:count, 0].tolist() == want
            assert (out[:count, 1] == -out[:count, 0]).all()
        assert len(ring) == len(model)


def test_close_drains_then_reports_end_of_stream():
    ring = LockFreeRingBuffer(4, 2)
    ring.push_batch([[1, 2], [3, 4]])
    ring.close()
    assert ring.closed
    with pytest.raises(HexcoreInvalidArgumentError, match="closed"):
        ring.try_push([5, 6])
    assert ring.pop().tolist() == [1, 2] and ring.pop_batch(4).tolist() == [[3, 4]]
    assert ring.try_pop_batch(np.empty((2, 2), np.int64)) == RING_CLOSED and ring.pop() is None


def test_blocking_calls_time_out():
    ring = LockFreeRingBuffer(2, 1)
    with pytest.raises(TimeoutError):
        ring.pop(timeout=0.01)
    with pytest.raises(TimeoutError):
        ring.push_batch(np.zeros((3, 1), np.int64), timeout=0.01)


@pytest.mark.parametrize("make,match", [
    (lambda: LockFreeRingBuffer(6, 4), "capacity: expected a power of two, got 6"),
    (lambda: LockFreeRingBuffer(0, 4), r"capacity: expected an int in \[1, 4294967296\], got 0"),
    (lambda: LockFreeRingBuffer(8, 0), r"record_width: expected an int in \[1, 4096\], got 0"),
    (lambda: LockFreeRingBuffer.create_shared(8, -2), r"record_width: expected an int in \[1, 4096\], got -2"),
    (lambda: LockFreeRingBuffer(True, 4), "capacity: expected an int, got True"),
    (lambda: LockFreeRingBuffer(8.0, 4), "capacity: expected an int, got float 8.0"),
    (lambda: LockFreeRingBuffer(8, "4"), "record_width: expected an int, got str '4'"),
    (lambda: LockFreeRingBuffer(2**40, 4), r"capacity: expected an int in \[1, 4294967296\]"),
    (lambda: LockFreeRingBuffer(8, 4).pop_batch(True), "max_records: expected an int, got True"),
    (lambda: LockFreeRingBuffer(8, 4).try_push_batch(np.zeros((2, 4))), "float64"),
    (lambda: LockFreeRingBuffer(8, 4).try_push_batch(np.zeros((2, 3), np.int64)), r"\[2, 3\]"),
    (lambda: LockFreeRingBuffer(8, 4).try_push(np.zeros(5, np.int64)), r"\[5\]"),
    (lambda: LockFreeRingBuffer(8, 4).try_pop([0, 0, 0, 0]), "out.*list"),
    (lambda: LockFreeRingBuffer(8, 4).pop_batch(0), "max_records: expected an int in .*, got 0"),
    (lambda: LockFreeRingBuffer.attach("hexcore_no_such_ring"), "hexcore_no_such_ring"),
    (lambda: pickle.dumps(LockFreeRingBuffer(8, 4)), "in-process"),
])
def test_invalid_arguments_raise_typed_errors(make, match):
    with pytest.raises(HexcoreInvalidArgumentError, match=match):
        make()


@pytest.mark.parametrize("kind", [int, np.int64, np.int32, np.uint8])
def test_numpy_ints_are_ints(kind):
    ring = LockFreeRingBuffer(kind(8), kind(2))
    assert (ring.capacity, ring.record_width) == (8, 2) and type(ring.capacity) is int
    ring.push([1, 2])
    assert ring.pop_batch(kind(4)).tolist() == [[1, 2]]
    with LockFreeRingBuffer.create_shared(kind(4), kind(1)) as shared:
        assert shared.capacity == 4


# -- shared memory ------------------------------------------------------------------------
def test_shared_ring_attach_pickle_and_ownership():
    ring = LockFreeRingBuffer.create_shared(8, 4)
    peer = pickle.loads(pickle.dumps(ring))  # attaches by name
    peer.push([1, 2, 3, 4])
    assert ring.pop().tolist() == [1, 2, 3, 4]
    peer.close()  # an attacher closes the stream but does not unlink
    assert ring.closed
    LockFreeRingBuffer.attach(ring.name).close()
    name = ring.name
    ring.close()  # the creator unlinks
    with pytest.raises(HexcoreInvalidArgumentError, match=name):
        LockFreeRingBuffer.attach(name)
    with pytest.raises(HexcoreInvalidArgumentError, match="detached"):
        ring.try_pop(np.empty(4, np.int64))


def test_create_shared_refuses_a_taken_name():
    with LockFreeRingBuffer.create_shared(8, 1) as ring:
        with pytest.raises(HexcoreInvalidArgumentError, match=f"{ring.name}.*already exists"):
            LockFreeRingBuffer.create_shared(8, 1, name=ring.name)


def test_attacher_process_exit_leaves_segment():
    ring = LockFreeRingBuffer.create_shared(1024, W)
    proc = _spawn(_producer_process, ring.name, 0, 10, 4)
    proc.join(60)
    assert proc.exitcode == 0
    time.sleep(0.2)  # give a resource tracker time to (wrongly) unlink
    LockFreeRingBuffer.attach(ring.name).close()
    assert ring.pop_batch(64).shape == (10, W)
    ring.close()


# -- concurrent streams -----------------------------------------------------------------
def test_checker_detects_a_bad_record():
    ring = LockFreeRingBuffer(8, W)
    produce(ring.buffer, 0, 5, 8)
    ring.buffer[ring_mod.HEADER_WORDS + 3 * W + 2] += 1  # corrupt record 3
    ring_close(ring.buffer)
    thread, result = _start_consumer(ring.buffer, -1, 4)
    thread.join()
    assert result[:2].tolist() == [5, 3]


def test_two_threads_stream_in_order_through_backpressure():
    ring = LockFreeRingBuffer(1024, W)
    consumer, result = _start_consumer(ring.buffer, NUM_STREAM, 256, wait_full=True)
    full = produce(ring.buffer, 0, NUM_STREAM, 192)  # 192: batches straddle the wrap
    consumer.join(60)
    assert not consumer.is_alive()
    assert result[0] == NUM_STREAM and result[1] == -1 and len(ring) == 0
    assert full > 0 and NUM_STREAM // ring.capacity > 1000


def test_two_processes_stream_in_order_through_backpressure():
    ring = LockFreeRingBuffer.create_shared(1024, W)
    consumer, result = _start_consumer(ring.buffer, -1, 256, wait_full=True)
    proc = _spawn(_producer_process, ring.name, 0, NUM_STREAM, 192)
    proc.join(60)
    ring_close(ring.buffer)  # ends the consumer even if the producer failed
    consumer.join(60)
    assert proc.exitcode == 0
    assert result[0] == NUM_STREAM and result[1] == -1
    ring.close()


def test_killed_producer_leaves_no_torn_record():
    ring = LockFreeRingBuffer.create_shared(4096, W)
    consumer, result = _start_consumer(ring.buffer, -1, 100)
    proc = _spawn(_producer_process, ring.name, 0, 1 << 60, 7)
    deadline = time.monotonic() + 60
    while result[0] < 300_000 and proc.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(10)
    ring_close(ring.buffer)
    consumer.join(60)
    assert proc.exitcode == -signal.SIGKILL
    tail = ring.buffer[ring_mod.TAIL]
    assert result[0] >= 300_000 and result[0] == tail and result[1] == -1
    ring.close()


def test_pure_python_fallback_without_jit():
    script = (
        "import numpy as np; from hexcore.host.ring import LockFreeRingBuffer, ring_try_push\n"
        "assert not hasattr(ring_try_push, 'py_func')\n"
        "r = LockFreeRingBuffer(4, 2); r.push_batch([[1, 2], [3, 4]]); r.push([5, 6])\n"
        "assert r.try_push_batch(np.zeros((3, 2), np.int64)) == 1\n"
        "out = np.empty((8, 2), np.int64); assert r.try_pop_batch(out) == 4\n"
        "assert out[:4, 0].tolist() == [1, 3, 5, 0]; r.close(); assert r.pop() is None\n"
    )
    env = dict(os.environ, NUMBA_DISABLE_JIT="1")
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
