"""Fuzz targets of hexcore's public entry points, as plain functions of a byte string.

Each ``target_*(data: bytes)`` decodes ``data`` into calls (with :class:`Reader`), runs
them, and raises ``AssertionError`` when hexcore misbehaves: an exception that is not a
``HexcoreError`` (or the documented ``TimeoutError``), a result that disagrees with a
plain-Python model, a broken invariant. Anything else (a typed error for bad input) is
the expected outcome. The same functions serve atheris (``fuzz/fuzz_*.py``: coverage
guided, raw bytes) and hypothesis (``tests/fuzz``: ``st.binary()`` in CI).

Targets:

- :func:`target_block_manager`: ``PagedKVCache`` driven by op sequences, checked after
  every op against :class:`BlockModel`, ``check_invariants()``, the metrics gauges and
  a ``BlockTableMirror`` fed by the event ring; hostile arguments mixed in.
- :func:`target_ring_attach`: ``LockFreeRingBuffer.attach`` on segments with random
  headers, then pushes and pops while a "peer" rewrites the header.
- :func:`target_config`: ``KVCacheConfig`` and its methods with hostile fields.
- :func:`target_cli`: ``hexcore.cli.main(argv)`` (the demo's GPU work stubbed out).
- :func:`target_launchers` (needs ``NUMBA_ENABLE_CUDASIM=1``): append, seal, copies,
  dequantize and paged_decode with random arrays on the simulator.
"""

from __future__ import annotations

import contextlib
import io
import os

import numpy as np

from hexcore import HexcoreError, KVCacheConfig, Status
from hexcore.errors import (HexcoreCorruptionError, HexcoreInvalidArgumentError, HexcoreInvalidSequenceError,
                            HexcoreOOMError)

MAX_OPS = 24  # calls per input of the block-manager target
INVARIANT_EVERY = 4  # ops between two check_invariants() calls (and one after the last op)


class Reader:
    """Decisions drawn from a byte string; zeros once it is used up (so every input is valid)."""

    def __init__(self, data: bytes):
        self.data, self.pos = bytes(data), 0

    def remaining(self) -> int:
        return len(self.data) - self.pos

    def byte(self) -> int:
        if self.pos >= len(self.data):
            return 0
        self.pos += 1
        return self.data[self.pos - 1]

    def int(self, low: int, high: int) -> int:
        """An int in [low, high] (inclusive) from as few bytes as the range needs."""
        span = high - low + 1
        value, size = 0, 1
        while size < span:
            value = value << 8 | self.byte()
            size <<= 8
        return low + value % span

    def bool(self) -> bool:
        return self.byte() & 1 == 1

    def pick(self, options):
        return options[self.int(0, len(options) - 1)]


# -- hostile values -----------------------------------------------------------------------
HOSTILE_SCALARS = (
    None, True, False, np.bool_(True), 1.5, 0.0, float("nan"), float("inf"), -float("inf"), -1, -2**31, 2**31,
    2**62, 2**63, -2**63 - 1, 10**30, -10**30, "3", b"3", [1], (1,), {}, np.float32(2.0), np.float64("nan"),
    np.array(3.5), np.array([1]), np.uint64(2**64 - 1), np.int64(-1), complex(1, 1), object(),
)  # none of them is a valid id, length or count of any call they are passed to


def hostile(r: Reader):
    return r.pick(HOSTILE_SCALARS)


def hostile_ids(r: Reader, count: int, high: int):
    """An id array of the wrong kind: dtype, rank, strides or type (never an int32 vector)."""
    kind = r.int(0, 6)
    ids = np.array([r.int(-2, high + 1) for _ in range(count)], np.int32)
    if kind == 0:
        return ids.astype(r.pick((np.int64, np.float32, np.uint32, np.int16, np.bool_)))
    if kind == 1:
        return ids.reshape(1, -1)
    if kind == 2:
        return np.repeat(ids, 2)[::2] if count > 1 else ids.reshape(1, -1)  # strided
    if kind == 3:
        return ids.tolist()
    if kind == 4:
        return np.array([str(i) for i in ids])
    if kind == 5:
        return np.array(ids, dtype=object)
    return hostile(r)


def _typed(exc: BaseException) -> bool:
    return isinstance(exc, HexcoreError)


def _unexpected(what: str, exc: BaseException) -> AssertionError:
    return AssertionError(f"{what} raised {type(exc).__name__}: {exc}")


# -- target 1: the block manager against a model ------------------------------------------
BS = 16
CONFIG = KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=64, block_size=BS)


class BlockModel:
    """What PagedKVCache should hold, in plain Python: lengths, tables, reservations."""

    def __init__(self, num_blocks: int, max_seqs: int, max_len: int):
        self.num_blocks, self.max_seqs, self.max_len = num_blocks, max_seqs, max_len
        self.lens: dict[int, int] = {}
        self.tables: dict[int, list] = {}
        self.reserved: dict[int, int] = {}
        self.gen = [0] * max_seqs
        self.refs = [0] * num_blocks
        self.free = set(range(num_blocks))

    def live(self, sid) -> bool:
        return type(sid) is int and sid in self.lens

    def take(self, block: int, sid: int, first: bool) -> None:
        """Account for ``block`` sealed into ``sid`` (its reserved block first, else a free one)."""
        if first and sid in self.reserved:
            assert block == self.reserved.pop(sid), f"seal of {sid} did not take its reserved block"
        else:
            assert block in self.free, f"sealed block {block} was not free"
            self.free.remove(block)
        assert self.refs[block] == 0
        self.refs[block] = 1
        self.tables[sid].append(block)

    def grow_status(self, sid, new_len) -> Status:
        if not self.live(sid):
            return Status.INVALID_SEQUENCE
        old = self.lens[sid]
        if not old <= new_len <= self.max_len:
            return Status.INVALID_SEQUENCE
        need = new_len // BS - old // BS
        hit = int(need > 0 and sid in self.reserved)
        return Status.OUT_OF_MEMORY if need > len(self.free) + hit else Status.OK

    def grow(self, sid: int, new_len: int, sealed) -> None:
        old = self.lens[sid]
        sealed = [int(b) for b in sealed]
        assert len(sealed) == new_len // BS - old // BS, (sealed, old, new_len)
        for j, b in enumerate(sealed):
            self.take(b, sid, j == 0)
        self.lens[sid] = new_len

    def drop(self, sid: int) -> None:
        for b in self.tables.pop(sid):
            self.refs[b] -= 1
            if self.refs[b] == 0:
                self.free.add(b)
        if sid in self.reserved:
            self.free.add(self.reserved.pop(sid))
        del self.lens[sid]
        self.gen[sid] += 1

    def reserve(self, sid: int, block: int) -> None:
        assert block in self.free, f"reserved block {block} was not free"
        self.free.remove(block)
        self.reserved[sid] = block


def _sid(r: Reader, max_seqs: int) -> int:
    return r.int(-2, max_seqs + 1) if r.int(0, 7) == 0 else r.int(0, max_seqs - 1)


def _ids(r: Reader, max_seqs: int) -> np.ndarray:
    return np.array([_sid(r, max_seqs) for _ in range(r.int(0, max_seqs + 1))], np.int32)


def _expect_raise(kind, fn, *args, **kwargs):
    try:
        result = fn(*args, **kwargs)
    except kind:
        return
    except Exception as exc:
        raise _unexpected(f"{getattr(fn, '__name__', fn)}{args}", exc) from exc
    raise AssertionError(f"{getattr(fn, '__name__', fn)}{args} returned {result!r}, expected {kind.__name__}")


def _op_add(cache, m, r):
    if r.bool():
        if len(m.lens) == m.max_seqs:
            return _expect_raise(HexcoreOOMError, cache.add_sequence)
        sid = cache.add_sequence()
        assert type(sid) is int and 0 <= sid < m.max_seqs and sid not in m.lens
    else:
        sid = _sid(r, m.max_seqs)
        if not 0 <= sid < m.max_seqs or sid in m.lens:
            return _expect_raise(HexcoreInvalidSequenceError, cache.add_sequence, sid)
        assert cache.add_sequence(sid) == sid
    m.lens[sid], m.tables[sid] = 0, []


def _op_free(cache, m, r):
    sid = _sid(r, m.max_seqs)
    if not m.live(sid):
        return _expect_raise(HexcoreInvalidSequenceError, cache.free_sequence, sid)
    cache.free_sequence(sid)
    m.drop(sid)


def _op_fork(cache, m, r):
    parent = _sid(r, m.max_seqs)
    child = None if r.bool() else _sid(r, m.max_seqs)
    if not m.live(parent) or (child is not None and (not 0 <= child < m.max_seqs or child in m.lens)):
        return _expect_raise(HexcoreInvalidSequenceError, cache.fork_sequence, parent, child)
    if child is None and len(m.lens) == m.max_seqs:
        return _expect_raise(HexcoreOOMError, cache.fork_sequence, parent)
    got = cache.fork_sequence(parent, child)
    assert child is None or got == child
    assert got not in m.lens and 0 <= got < m.max_seqs
    m.lens[got], m.tables[got] = m.lens[parent], list(m.tables[parent])
    for b in m.tables[got]:
        m.refs[b] += 1


def _new_len(r, m, sid) -> int:
    base = m.lens.get(sid, 0) if type(sid) is int else 0
    kind = r.int(0, 7)
    if kind == 0:
        return r.pick((-1, base - 1, m.max_len + 1, 2**31, 2**62 - 1, 2**62, -2**63))
    return base + r.pick((0, 1, 1, BS - 1, BS, BS + 1, 2 * BS, 5 * BS, m.max_len))


def _op_grow(cache, m, r):
    sid = _sid(r, m.max_seqs)
    new_len = _new_len(r, m, sid)
    status = m.grow_status(sid, new_len)
    if r.bool():  # try_grow_sequence
        old_table = list(m.tables.get(sid, ()))
        got = cache.try_grow_sequence(sid, new_len)
        assert got == status, (got, status, sid, new_len)
        if status == Status.OK:
            m.grow(sid, new_len, cache.block_table(sid)[len(old_table):])
        return
    if status == Status.OK:
        m.grow(sid, new_len, cache.grow_sequence(sid, new_len))
    else:
        kind = HexcoreOOMError if status == Status.OUT_OF_MEMORY else HexcoreInvalidSequenceError
        _expect_raise(kind, cache.grow_sequence, sid, new_len)


def _op_step(cache, m, r):
    ids = _ids(r, m.max_seqs)
    new_lens = None if r.bool() else np.array([_new_len(r, m, int(s)) % 2**31 for s in ids], np.int32)
    if len(ids) > m.max_seqs:
        return _expect_raise(HexcoreInvalidArgumentError, cache.step, ids, new_lens)
    result = cache.step(ids, new_lens)
    seals = list(zip(result.seal_slots.tolist(), result.seal_logical.tolist(), result.seal_blocks.tolist()))
    seen, failed, hits, k = set(), 0, 0, 0
    for i, sid in enumerate(ids.tolist()):
        if not m.live(sid):
            status = Status.INVALID_SEQUENCE
        elif sid in seen:
            status = Status.INVALID_ARGUMENT
        else:
            seen.add(sid)
            old = m.lens[sid]
            new = old + 1 if new_lens is None else int(new_lens[i])
            status = m.grow_status(sid, new)
            if status == Status.OK:
                need = new // BS - old // BS
                hits += int(need > 0 and sid in m.reserved)
                mine = seals[k:k + need]
                k += need
                assert [(s, j) for s, j, _ in mine] == [(sid, old // BS + j) for j in range(need)], (mine, sid)
                m.grow(sid, new, [b for _, _, b in mine])
        failed += status != Status.OK
        assert result.statuses[i] == status, (i, sid, int(result.statuses[i]), status)
        if m.live(sid):
            table = m.tables[sid]
            assert result.seq_lens[i] == m.lens[sid] and result.tail_slots[i] == sid
            assert result.block_tables[i, :len(table)].tolist() == table
            assert (result.block_tables[i, len(table):] == -1).all()
        else:
            assert result.seq_lens[i] == 0 and result.tail_slots[i] == -1 and (result.block_tables[i] == -1).all()
    assert k == len(seals) == result.num_sealed and result.num_failed == failed and result.num_hits == hits


def _op_can_step(cache, m, r):
    ids = _ids(r, m.max_seqs)
    if len(ids) > m.max_seqs:
        return _expect_raise(HexcoreInvalidArgumentError, cache.can_step, ids)
    want, seen, need = (Status.OK, -1), set(), 0
    for i, sid in enumerate(ids.tolist()):
        if not m.live(sid):
            want = (Status.INVALID_SEQUENCE, i)
            break
        if sid in seen:
            want = (Status.INVALID_ARGUMENT, i)
            break
        seen.add(sid)
        if m.lens[sid] + 1 > m.max_len:
            want = (Status.INVALID_SEQUENCE, i)
            break
        need += (m.lens[sid] + 1) // BS > m.lens[sid] // BS and sid not in m.reserved
    if want[0] == Status.OK and need > len(m.free):
        want = (Status.OUT_OF_MEMORY, -1)
    assert cache.can_step(ids) == want, (cache.can_step(ids), want, ids)


def _op_reserve(cache, m, r):
    ids = _ids(r, m.max_seqs)
    if not all(m.live(s) for s in ids.tolist()):
        return _expect_raise(HexcoreInvalidSequenceError, cache.reserve_blocks, ids)
    out = cache.reserve_blocks(ids)
    for i, sid in enumerate(ids.tolist()):
        if sid not in m.reserved and m.free:
            m.reserve(sid, int(out[i]))
        assert out[i] == m.reserved.get(sid, -1), (i, sid, out)


def _op_predict(cache, m, r, ring=None):
    rows = np.array([[_sid(r, m.max_seqs), r.pick((-1, 0, 1, 2, 2**40))] for _ in range(r.int(0, 6))],
                    np.int64).reshape(-1, 2)
    floor, cap = r.int(0, m.num_blocks), r.int(0, m.max_seqs)
    counts = np.zeros(4, np.int64)
    want = [0, 0, 0, 0]
    if ring is not None:
        ring.push_batch(rows, timeout=0)  # rows <= capacity: always fits (drained by every call)
        got = cache.reserve_predictions(ring, floor, cap, counts)
    else:
        got = cache.reserve_predictions(rows, floor, cap, counts)
    for sid, gen in rows.tolist():
        if not (0 <= sid < m.max_seqs and sid in m.lens) or (gen >= 0 and gen != m.gen[sid]):
            want[1] += 1
        elif sid in m.reserved:
            want[2] += 1
        elif len(m.free) <= floor or len(m.reserved) >= cap:
            want[3] += 1
        else:
            m.reserve(sid, cache.prefetched_block(sid))
            want[0] += 1
    assert counts.tolist() == want and got == want[0], (counts, want, got)


def _op_release(cache, m, r):
    if r.int(0, 3) == 0:
        want = len(m.reserved)
        assert cache.release_all_reserved() == want
        for sid in list(m.reserved):
            m.free.add(m.reserved.pop(sid))
        return
    ids = _ids(r, m.max_seqs)
    if not all(m.live(s) for s in ids.tolist()):
        return _expect_raise(HexcoreInvalidSequenceError, cache.release_reserved, ids)
    want = 0
    for sid in ids.tolist():
        if sid in m.reserved:
            m.free.add(m.reserved.pop(sid))
            want += 1
    assert cache.release_reserved(ids) == want


def _op_query(cache, m, r):
    sid = _sid(r, m.max_seqs)
    assert cache.is_live(sid) == m.live(sid)
    for fn in (cache.block_table, cache.seq_len, cache.generation, cache.prefetched_block):
        if not m.live(sid):
            _expect_raise(HexcoreInvalidSequenceError, fn, sid)
    if m.live(sid):
        assert cache.generation(sid) == m.gen[sid]


def _op_hostile(cache, m, r):
    """One call with one hostile argument: a typed error (or a documented no-raise
    answer), and nothing changed (the check after the op compares with the model)."""
    h = hostile(r)
    arr = hostile_ids(r, r.int(0, m.max_seqs + 1), m.max_seqs)
    live = next(iter(m.lens), 0)
    calls = [
        lambda: cache.add_sequence(h if h is not None else "x"),
        lambda: cache.free_sequence(h),
        lambda: cache.fork_sequence(h),
        lambda: cache.fork_sequence(live, h if h is not None else -5),
        lambda: cache.grow_sequence(h, 1),
        lambda: cache.grow_sequence(live, h),
        lambda: cache.step(arr),
        lambda: cache.step(np.array([live], np.int32), arr if arr is not None else "x"),  # None: +1 each
        lambda: cache.can_step(arr),
        lambda: cache.reserve_blocks(arr),
        lambda: cache.release_reserved(arr),
        lambda: cache.reserve_predictions(arr),
        lambda: cache.reserve_predictions(np.zeros((0, 2), np.int64), floor=h),
        lambda: cache.reserve_predictions(np.zeros((0, 2), np.int64), max_reserved=h if h is not None else -1),
        lambda: cache.reserve_predictions(np.zeros((0, 2), np.int64), counts=arr),
        lambda: cache.block_table(h),
        lambda: cache.seq_len(h),
        lambda: cache.generation(h),
        lambda: cache.prefetched_block(h),
    ]
    i = r.int(0, len(calls))
    if i == len(calls):
        status = cache.try_grow_sequence(h, 1) if r.bool() else cache.try_grow_sequence(live, h)
        assert status != Status.OK or (not isinstance(h, (bool, np.bool_)) and _int_like(h)), (h, status)
        if status == Status.OK:  # an int-like value that was valid: keep the model in step
            raise AssertionError(f"try_grow_sequence accepted hostile {h!r}")
        assert cache.is_live(h) in (True, False)
        return
    try:
        calls[i]()
    except HexcoreError:
        return
    except Exception as exc:
        raise _unexpected(f"hostile call {i} with {h!r} / {arr!r}", exc) from exc
    # only `counts=` can be accepted (an int64 [4] array), by a call that changes nothing


def _int_like(v) -> bool:
    try:
        import operator

        operator.index(v)
        return True
    except Exception:
        return False


OPS = (_op_add, _op_add, _op_free, _op_fork, _op_grow, _op_grow, _op_step, _op_step, _op_can_step, _op_reserve,
       _op_predict, _op_release, _op_query, _op_hostile)


def _check(cache, m, metrics, mirror, invariants: bool = True) -> None:
    if invariants:
        cache.check_invariants()
    assert cache.num_free_blocks == len(m.free), (cache.num_free_blocks, len(m.free))
    assert cache.num_reserved_blocks == len(m.reserved)
    assert cache.num_active_blocks == sum(1 for c in m.refs if c)
    assert cache.num_sequences == len(m.lens)
    for sid, n in m.lens.items():
        assert cache.seq_len(sid) == n and cache.block_table(sid).tolist() == m.tables[sid], sid
        assert cache.prefetched_block(sid) == m.reserved.get(sid, -1)
    if metrics is not None:
        snap = metrics.snapshot()
        assert (snap["active_blocks"], snap["free_blocks"], snap["reserved_blocks"], snap["sequences"],
                snap["num_blocks"]) == (cache.num_active_blocks, cache.num_free_blocks, cache.num_reserved_blocks,
                                        cache.num_sequences, cache.num_blocks), snap
    if mirror is not None:
        for _ in range(10_000):
            left = cache.flush_events(0.0)
            mirror.poll()
            if left == 0 and len(mirror.ring) == 0:
                break
        else:
            raise AssertionError("the event ring never drained")
        assert mirror.live_seq_ids().tolist() == sorted(m.lens)
        for sid in m.lens:
            assert mirror.block_table(sid).tolist() == m.tables[sid], sid


def target_block_manager(data: bytes) -> None:
    """PagedKVCache under a random op sequence, checked against BlockModel after each op."""
    from hexcore.host import BlockTableMirror, LockFreeRingBuffer, MetricsCollector, PagedKVCache

    r = Reader(data)
    num_blocks, max_seqs, max_blocks = r.int(1, 24), r.int(1, 8), r.int(1, 6)
    flags = r.byte()
    metrics = MetricsCollector() if flags & 1 else None
    cache = PagedKVCache(CONFIG, num_blocks, max_seqs, metrics, max_seq_len=max_blocks * BS)
    m = BlockModel(num_blocks, max_seqs, max_blocks * BS)
    mirror = None
    if flags & 2:
        ring = LockFreeRingBuffer((1, 4, 64)[flags >> 2 & 1], 4)
        cache.attach_event_ring(ring)
        mirror = BlockTableMirror.like(cache, ring)
    predictions = LockFreeRingBuffer(8, 2) if flags & 8 else None
    for i in range(MAX_OPS):
        if not r.remaining():
            break
        op = OPS[r.byte() % len(OPS)]
        if op is _op_predict and predictions is not None and r.bool():
            op(cache, m, r, predictions)
        else:
            op(cache, m, r)
        # the model after every op; check_invariants (O(state), half the run time) after
        # every INVARIANT_EVERY-th op and the last one
        _check(cache, m, metrics, mirror, invariants=i % INVARIANT_EVERY == INVARIANT_EVERY - 1)
    cache.check_invariants()


# -- target 2: ring attach with random headers ---------------------------------------------
def target_ring_attach(data: bytes) -> None:
    """Attach to a segment holding a random header; push and pop while a peer rewrites it."""
    from multiprocessing import shared_memory

    from hexcore.host import LockFreeRingBuffer
    from hexcore.host import ring as ring_mod

    r = Reader(data)
    words = r.pick((0, 1, 47, 48, 49, 50, 52, 56, 64, 80, 112, 176, 560))
    interesting = (0, 1, 2, 3, 4, 7, 8, 16, 64, 2**32, 2**33, 2**62, -1, -2, -2**40, -2**63, 2**63 - 1)

    def word():
        return r.pick(interesting) if r.bool() else r.int(-2**63, 2**63 - 1)

    shm = shared_memory.SharedMemory(create=True, size=max(8, words * 8))
    ring = None
    try:
        buf = np.ndarray(shm.size // 8, np.int64, buffer=shm.buf)
        buf[:] = 0
        if words >= ring_mod.HEADER_WORDS:
            magic_ok = r.int(0, 7) != 0
            buf[ring_mod.MAGIC] = ring_mod.RING_MAGIC if magic_ok else word()
            buf[ring_mod.CAPACITY] = r.pick((1, 2, 4, 8)) if r.bool() else word()
            buf[ring_mod.RECORD_WIDTH] = r.pick((1, 2, 4)) if r.bool() else word()
            for index in (ring_mod.HEAD, ring_mod.TAIL, ring_mod.CONSUMER_TAIL_CACHE, ring_mod.PRODUCER_HEAD_CACHE):
                buf[index] = 0 if r.bool() else word()
        try:
            ring = LockFreeRingBuffer.attach(shm.name)
        except HexcoreError:
            return
        except Exception as exc:
            raise _unexpected("attach", exc) from exc
        assert ring.capacity * ring.record_width + ring_mod.HEADER_WORDS <= words, "attach accepted an impossible header"
        for _ in range(16):
            if not r.remaining():
                break
            kind = r.int(0, 9)
            width = ring.record_width if r.int(0, 5) else r.int(1, 8)
            try:
                if kind == 0:
                    ring.try_push(np.arange(width, dtype=np.int64))
                elif kind == 1:
                    ring.try_push_batch(np.ones((r.int(0, 9), width), np.int64))
                elif kind == 2:
                    ring.try_pop(np.empty(width, np.int64))
                elif kind == 3:
                    ring.try_pop_batch(np.empty((r.int(0, 9), width), np.int64))
                elif kind == 4:
                    ring.pop_batch(r.int(1, 9), timeout=0)
                elif kind == 5:
                    ring.push(np.zeros(width, np.int64), timeout=r.pick((0, 1e-4, float("nan"), -1, "1")))
                elif kind == 6:  # the peer rewrites a header word
                    buf[r.pick((ring_mod.CAPACITY, ring_mod.RECORD_WIDTH, ring_mod.HEAD, ring_mod.TAIL,
                                ring_mod.MAGIC, ring_mod.CLOSED, ring_mod.CONSUMER_TAIL_CACHE,
                                ring_mod.PRODUCER_HEAD_CACHE))] = word()
                elif kind == 7:
                    n = len(ring)
                    assert 0 <= n <= ring.capacity
                elif kind == 8:
                    ring_mod.ring_len(buf), ring_mod.ring_try_push(buf, np.zeros(r.int(1, 6), np.int64))
                    ring_mod.ring_try_pop_batch(buf, np.empty((r.int(0, 4), r.int(1, 6)), np.int64))
                else:
                    ring.closed
            except (HexcoreError, TimeoutError):
                pass
            except Exception as exc:
                raise _unexpected(f"ring op {kind}", exc) from exc
    finally:
        if ring is not None:
            ring._buf = None
            ring._release()
        buf = None
        shm.close()
        shm.unlink()


# -- target 3: KVCacheConfig ----------------------------------------------------------------
CONFIG_VALUES = (1, 2, 8, 16, 17, 32, 64, 96, 128, 256, 512, 0, -1, 2**31, 2**62, 10**30, np.int64(64),
                 np.int32(32), np.uint8(16))


def target_config(data: bytes) -> None:
    """KVCacheConfig with random (often hostile) fields, then every method."""
    from hexcore.config import PRESETS, KVDtype

    r = Reader(data)

    def field():
        return r.pick(CONFIG_VALUES) if r.int(0, 5) else hostile(r)

    kwargs = dict(num_layers=field(), num_kv_heads=field(), head_dim=field(), block_size=field(),
                  kv_dtype=r.pick(("fp16", "int4", "int2", "INT4", KVDtype.INT2, "int3", None, 4, b"int4")),
                  group_size=field())
    try:
        cfg = KVCacheConfig(**kwargs)
    except HexcoreError:
        cfg = None
    except Exception as exc:
        raise _unexpected(f"KVCacheConfig({kwargs})", exc) from exc
    try:
        KVCacheConfig.from_preset(r.pick((*PRESETS, "nope", None, 3)), kv_dtype=kwargs["kv_dtype"],
                                  block_size=field(), group_size=field())
    except HexcoreError:
        pass
    except Exception as exc:
        raise _unexpected("from_preset", exc) from exc
    if cfg is None:
        return
    assert cfg.block_bytes > 0 and cfg.tail_bytes > 0 and cfg.compression_ratio >= 1.0
    assert all(type(getattr(cfg, f)) is int for f in ("num_layers", "num_kv_heads", "head_dim", "block_size",
                                                        "group_size"))
    for _ in range(4):
        a, b = (r.pick(CONFIG_VALUES) if r.bool() else hostile(r)), (r.pick(CONFIG_VALUES) if r.bool() else hostile(r))
        method = r.pick(("total_bytes", "blocks_for_budget", "tokens_for_budget", "code_shape", "key_meta_shape",
                         "value_meta_shape", "tail_shape"))
        try:
            out = getattr(cfg, method)(a, b) if method in ("total_bytes", "blocks_for_budget",
                                                            "tokens_for_budget") else getattr(cfg, method)(a)
        except HexcoreError:
            continue
        except Exception as exc:
            raise _unexpected(f"{method}({a!r}, {b!r})", exc) from exc
        assert isinstance(out, (int, tuple)) and (not isinstance(out, int) or out >= 0)


# -- target 4: the command line ---------------------------------------------------------------
CLI_WORDS = ("plan", "demo", "--preset", "--budget-gib", "--max-seqs", "--block-size", "--kv-dtype", "--steps",
             "-h", "--help", "llama-3-8b", "mistral-7b", "nan", "inf", "-inf", "-1", "0", "1", "8", "16", "32",
             "1e-12", "1e300", "4294967296", "2147483648", "1" + "0" * 30, "int4", "fp16", "int3", "", "--",
             "--budget-gib=nan", "--max-seqs=", "0x10", "1_000", " 5", "\x00", "é", "--bogus", "-x")


def target_cli(data: bytes) -> None:
    """hexcore.cli.main never raises: it returns 0, or 2 with one line on stderr."""
    from hexcore import cli

    r = Reader(data)
    argv = []
    for _ in range(r.int(0, 7)):
        if r.int(0, 4):
            argv.append(r.pick(CLI_WORDS))
        else:
            raw = bytes(r.byte() for _ in range(r.int(0, 6)))
            argv.append(raw.decode("utf-8", "replace"))
    stdout, stderr = io.StringIO(), io.StringIO()
    layout, serve = cli._layout_report, cli._serve_report
    cli._layout_report = lambda preset, block_size: "layout agreement (stub)"
    cli._serve_report = lambda preset, kv_dtype, steps: "served (stub)"
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            code = cli.main(argv)
    except BaseException as exc:  # SystemExit included: main must return
        raise _unexpected(f"main({argv!r})", exc) from exc
    finally:
        cli._layout_report, cli._serve_report = layout, serve
    assert code in (0, 2), (argv, code)
    err = stderr.getvalue()
    if code == 2:
        assert err.startswith("hexcore: ") and err.count("\n") == 1 and "Traceback" not in err, (argv, err)
    elif "-h" not in argv and "--help" not in argv:
        assert err == "" and "dtype" in stdout.getvalue(), (argv, err)


# -- target 5: launchers on the simulator -------------------------------------------------------
_STORES: dict = {}


def _store(dtype: str):
    if dtype not in _STORES:
        from hexcore.cuda import DeviceKVStore

        cfg = KVCacheConfig(num_layers=2, num_kv_heads=1, head_dim=64, block_size=16, kv_dtype=dtype,
                            group_size=32 if dtype != "fp16" else 64)
        store = DeviceKVStore(cfg, num_blocks=4, max_seqs=3)
        store.pool.copy_to_device(np.zeros(store.pool.shape, np.uint32))
        _STORES[dtype] = store
    return _STORES[dtype]


def _array(r: Reader, dtype, shape, high: int | None = None, device_high: int | None = None):
    """An array meant to be ``dtype`` ``shape``, often wrong in one way; host or device.

    ``device_high``: a device copy gets its values clipped to [0, device_high] (for the
    decode kernel, which trusts device index arrays: docs/adversarial.md)."""
    from numba import cuda

    kind = r.int(0, 11)
    shape = tuple(shape)
    if kind == 0 and shape:
        shape = shape[:-1] + (shape[-1] + r.pick((-1, 1)),)
    elif kind == 1:
        shape = shape + (1,) if r.bool() else shape[1:]
    if high is not None:
        x = np.array([r.int(-1, high) for _ in range(int(np.prod(shape)))], np.int64).reshape(shape).astype(dtype)
    else:
        # finite K/V only: NaN/inf reaching a seal is the open GPU-side limitation of
        # docs/adversarial.md (the quantizer's float-to-int of NaN; a kernel change)
        x = np.zeros(shape, dtype) + r.pick((0, 1, -2, 1e4, 65504))
    if kind == 2:
        x = x.astype(r.pick((np.float32, np.int64, np.uint8, np.float16, np.int32)))
    elif kind == 3 and x.ndim:
        x = np.repeat(x, 2, axis=-1)[..., ::2]  # strided host array
    elif kind == 4:
        x.flags.writeable = False
    elif kind == 5:
        return hostile(r)
    elif kind == 6 and x.ndim and x.shape[-1] > 1:
        return cuda.to_device(np.repeat(x, 2, axis=-1))[..., ::2]  # strided device array
    if r.int(0, 2) == 0:
        if device_high is not None and x.dtype.kind in "iu":
            x = np.clip(x, 0, device_high).astype(x.dtype)
        return cuda.to_device(np.ascontiguousarray(x))
    return x


def target_launchers(data: bytes) -> None:
    """Every launcher with random arrays: a typed error or a launch, never another exception
    (an out-of-bounds access inside a simulated kernel raises IndexError, caught here)."""
    from hexcore.cuda import (append, copy_blocks, copy_tails, dequantize_blocks, paged_decode, prepare_append,
                              prepare_copy_tails, prepare_seal, seal)

    r = Reader(data)
    store = _store(r.pick(("fp16", "int4", "int2")))
    cfg = store.config
    if r.int(0, 15) == 0:
        store = r.pick((None, cfg, "store", 3))
    H, D, L, S, N = cfg.num_kv_heads, cfg.head_dim, cfg.num_layers, store.max_seqs if hasattr(store, "max_seqs") \
        else 3, 4
    n = r.int(0, 3)
    layer = r.pick((None, 0, 1, 2, -1, True, 1.0, np.int64(1), "0")) if r.int(0, 3) == 0 else r.pick((None, 0, 1))
    which = r.int(0, 7)
    try:
        if which == 0:
            lead = (L,) if layer is None else ()
            append(store, _array(r, np.float16, lead + (n, H, D)), _array(r, np.float16, lead + (n, H, D)),
                   _array(r, np.int32, (n,), S), _array(r, np.int32, (n,), 16), layer=layer,
                   rows=None if r.int(0, 3) else (r.int(-1, 3), r.int(-1, 3)))
        elif which == 1:
            seal(store, _array(r, np.int32, (n,), S), _array(r, np.int32, (n,), N), layer=layer)
        elif which == 2:
            copy_tails(store, _array(r, np.int32, (n,), S), _array(r, np.int32, (n,), S))
        elif which == 3:
            copy_blocks(store, _array(r, np.int32, (n,), N), _array(r, np.int32, (n,), N))
        elif which == 4:
            dequantize_blocks(store, layer, _array(r, np.int32, (n,), N))
        elif which == 5:
            b, qh, width = max(n, 1), r.pick((1, 2)), r.int(0, 2)
            max_seq_len = r.pick((None, 0, 20, 40, 10**9, -1, 1.5))
            # device seq_lens within what the tables and max_seq_len allow (the decode kernel trusts them)
            longest = (width + 1) * 16 - 1
            if type(max_seq_len) is int and max_seq_len >= 0:
                longest = min(longest, max_seq_len)
            paged_decode(_array(r, np.float16, (b, qh, D)), store, layer if layer is not None else 0,
                         _array(r, np.int32, (b, width), N, N - 1), _array(r, np.int32, (b,), 40, longest),
                         _array(r, np.int32, (b,), S, S - 1),
                         out=_array(r, np.float16, (b, qh, D)) if r.bool() else None,
                         scale=r.pick((None, 0.1, 0.0, -1.0, float("nan"), float("inf"), True, "x")),
                         max_seq_len=max_seq_len)
        elif which == 6:
            prepare_seal(store, _array(r, np.int32, (n,), S), _array(r, np.int32, (n,), N), layer=layer)
        else:
            if r.bool():
                prepare_copy_tails(store, _array(r, np.int32, (n,), S), _array(r, np.int32, (n,), S))
            else:
                lead = (L,) if layer is None else ()
                prepare_append(store, _array(r, np.float16, lead + (n, H, D)),
                               _array(r, np.float16, lead + (n, H, D)), _array(r, np.int32, (n,), S),
                               _array(r, np.int32, (n,), 16), layer=layer)
    except HexcoreError:
        pass
    except Exception as exc:
        raise _unexpected(f"launcher {which}", exc) from exc


TARGETS = {
    "block_manager": target_block_manager,
    "ring_attach": target_ring_attach,
    "config": target_config,
    "cli": target_cli,
    "launchers": target_launchers,
}


def replay(target: str, directory: str) -> int:
    """Run every file of ``directory`` through ``TARGETS[target]``; the number run."""
    count = 0
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), "rb") as f:
            TARGETS[target](f.read())
        count += 1
    return count


__all__ = ["BlockModel", "Reader", "TARGETS", "replay", *(f"target_{t}" for t in TARGETS)]
