"""LockFreeRingBuffer throughput: records/s thread to thread and process to process.

Records are 4 int64 words. "batch" moves ``BATCH`` records per ring call, "single"
one record per call; both drive the ring from nogil njit loops, so the figures are
the ring's, not the interpreter's. ``python -m benchmarks.bench_ring`` prints them all.
"""

from __future__ import annotations

import multiprocessing
import threading
import time

import numba
import numpy as np

from hexcore.host import LockFreeRingBuffer
from hexcore.host.ring import ring_len, ring_try_pop, ring_try_pop_batch, ring_try_push, ring_try_push_batch

WIDTH, CAPACITY, BATCH = 4, 4096, 256
NUM_THREAD, NUM_PROCESS = 4_000_000, 8_000_000


@numba.njit(cache=True, nogil=True)
def produce_stream(buf, total, batch):
    """Push records [seq, seq, seq, seq] for seq in 0..total-1; batch 0 = one per call."""
    recs = np.empty((max(batch, 1), WIDTH), np.int64)
    seq = 0
    while seq < total:
        n = min(max(batch, 1), total - seq)
        for i in range(n):
            recs[i, :] = seq + i
        done = 0
        while done < n:
            if batch == 0:
                count = ring_try_push(buf, recs[0])
            else:
                count = ring_try_push_batch(buf, recs[done:n])
            if count < 0:
                return
            done += count
        seq += n


@numba.njit(cache=True, nogil=True)
def consume_stream(buf, total, batch):
    """Pop ``total`` records (batch 0 = one per call); return how many were out of order."""
    out = np.empty((max(batch, 1), WIDTH), np.int64)
    seen = bad = 0
    while seen < total:
        count = ring_try_pop(buf, out[0]) if batch == 0 else ring_try_pop_batch(buf, out)
        if count < 0:
            break
        for i in range(count):
            bad += out[i, 3] != seen
            seen += 1
    return bad + (total - seen)


def _consume_timed(ring, total, batch) -> float:
    # Starts the clock at the first record, so thread/process start-up is not counted, and
    # compiles the consumer before (the H200 host's first run, with no numba cache, counted
    # the compilation: 0.4 M records/s, 2026-12-01).
    consume_stream(ring.buffer, 0, batch)
    while ring_len(ring.buffer) == 0:
        time.sleep(0)
    start = time.perf_counter()
    assert consume_stream(ring.buffer, total, batch) == 0
    return total / (time.perf_counter() - start)


def thread_throughput(total: int = NUM_THREAD, batch: int = BATCH) -> float:
    """Records/s from a producer thread to the calling thread (batch 0: single ops)."""
    ring = LockFreeRingBuffer(CAPACITY, WIDTH)
    producer = threading.Thread(target=produce_stream, args=(ring.buffer, total, batch))
    producer.start()
    rate = _consume_timed(ring, total, batch)
    producer.join()
    return rate


def _producer_process(name: str, total: int, batch: int) -> None:
    ring = LockFreeRingBuffer.attach(name)
    produce_stream(ring.buffer, total, batch)
    ring.close()


def process_throughput(total: int = NUM_PROCESS, batch: int = BATCH) -> float:
    """Records/s from a spawned producer process over shared memory (batch 0: single ops)."""
    ring = LockFreeRingBuffer.create_shared(CAPACITY, WIDTH)
    proc = multiprocessing.get_context("spawn").Process(
        target=_producer_process, args=(ring.name, total, batch))
    proc.start()
    try:
        rate = _consume_timed(ring, total, batch)
    finally:
        proc.join(60)
        ring.close()
    return rate


def python_call_throughput(total: int = 200_000) -> float:
    """Records/s of try_push + try_pop called one record at a time from Python."""
    ring, record, out = LockFreeRingBuffer(CAPACITY, WIDTH), np.arange(WIDTH), np.empty(WIDTH, np.int64)
    start = time.perf_counter()
    for _ in range(total):
        ring.try_push(record)
        ring.try_pop(out)
    return total / (time.perf_counter() - start)


def _report(benchmark, label, rate):
    benchmark.extra_info["records_per_s"] = rate
    print(f"\nring {label}: {rate / 1e6:.1f} M records/s")


def test_thread_to_thread_batch(benchmark):
    rate = benchmark.pedantic(thread_throughput, rounds=3, warmup_rounds=1)
    _report(benchmark, "thread-thread batch", rate)


def test_thread_to_thread_single(benchmark):
    rate = benchmark.pedantic(thread_throughput, args=(NUM_THREAD // 4, 0), rounds=3, warmup_rounds=1)
    _report(benchmark, "thread-thread single", rate)


def test_process_to_process_batch(benchmark):
    _report(benchmark, "process-process batch", benchmark.pedantic(process_throughput, rounds=1))


def test_process_to_process_single(benchmark):
    rate = benchmark.pedantic(process_throughput, args=(NUM_PROCESS // 4, 0), rounds=1)
    _report(benchmark, "process-process single", rate)


def test_python_method_calls(benchmark):
    _report(benchmark, "python try_push+try_pop", benchmark.pedantic(python_call_throughput, rounds=1))


if __name__ == "__main__":
    for label, fn, args in [("thread-thread batch", thread_throughput, ()),
                            ("thread-thread single", thread_throughput, (NUM_THREAD, 0)),
                            ("process-process batch", process_throughput, ()),
                            ("process-process single", process_throughput, (NUM_PROCESS, 0)),
                            ("python try_push+try_pop", python_call_throughput, ())]:
        rates = [fn(*args) for _ in range(5)]
        print(f"{label}: median {np.median(rates) / 1e6:.1f} M records/s "
              f"(min {min(rates) / 1e6:.1f}, max {max(rates) / 1e6:.1f}, 5 runs)")
