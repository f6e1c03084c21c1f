"""Block manager benchmarks: hexcore's PagedKVCache against a plain-Python deque allocator.

Run: .venv/bin/python -m pytest benchmarks/bench_allocator.py --benchmark-only -s
After the last benchmark, -s shows a table of per-unit figures and hexcore / deque ratios, all
measured in the same run. Targets (2-core CPU): batched alloc and free <= 20 ns per
block, a 256-sequence decode step <= 5 us, one grow_sequence call <= 2 us, flat
from 1k to 64k blocks. With --benchmark-disable every benchmark runs once (smoke).
"""

from __future__ import annotations

import collections

import numpy as np
import pytest

from benchmarks.per_unit import PerUnit

from hexcore import KVCacheConfig
from hexcore.host import PagedKVCache

BS = 16
BATCH_BLOCKS = 1024  # blocks per batched alloc / free call
NUM_SEQS = 256  # sequences per decode step
STEPS = 32  # decode steps (or grow calls x 32) per timed round
POOLS = {"1k": 1024, "64k": 65536}
CONFIG = KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=64, block_size=BS)
FIGURES = PerUnit("ns")  # (op, pool, impl) -> ns per unit


class Block:
    """One pool block as a Python object, as simple engines keep them."""

    __slots__ = ("block_id", "ref_count")

    def __init__(self, block_id):
        self.block_id, self.ref_count = block_id, 0


class DequeAllocator:
    """The plain-Python baseline: a deque free list of Block objects, lists per sequence."""

    def __init__(self, num_blocks, block_size=BS):
        self.block_size = block_size
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free = collections.deque(self.blocks)
        self.tables: dict[int, list[Block]] = {}
        self.lens: dict[int, int] = {}

    def add_sequence(self, seq_id):
        self.tables[seq_id], self.lens[seq_id] = [], 0

    def allocate(self, n):
        if n > len(self.free):
            raise MemoryError(f"need {n} blocks, {len(self.free)} free")
        blocks = [self.free.popleft() for _ in range(n)]
        for block in blocks:
            block.ref_count = 1
        return blocks

    def grow_sequence(self, seq_id, new_len):
        need = new_len // self.block_size - self.lens[seq_id] // self.block_size
        new = self.allocate(need) if need > 0 else []
        self.tables[seq_id] += new
        self.lens[seq_id] = new_len
        return new

    def free_sequence(self, seq_id):
        for block in self.tables.pop(seq_id):
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free.append(block)
        del self.lens[seq_id]

    def step(self, seq_ids):
        """+1 token for each sequence; returns the kernel's lengths and tail slots."""
        sealed = []
        for s in seq_ids:
            n = self.lens[s] + 1
            if n % self.block_size == 0:
                sealed.append((s, self.allocate(1)[0].block_id))
                self.tables[s].append(self.blocks[sealed[-1][1]])
            self.lens[s] = n
        return sealed, [self.lens[s] for s in seq_ids], list(seq_ids)


def make(impl, num_blocks):
    if impl == "deque":
        return DequeAllocator(num_blocks)
    return PagedKVCache(CONFIG, num_blocks, NUM_SEQS, max_seq_len=BATCH_BLOCKS * BS)


record = FIGURES.record


impls = pytest.mark.parametrize("impl", ["deque", "hexcore"])
pools = pytest.mark.parametrize("pool", list(POOLS))


@pools
@impls
def test_batched_alloc(benchmark, impl, pool):
    """One call allocating BATCH_BLOCKS blocks (a prefill); ns per block."""
    alloc = make(impl, POOLS[pool])
    alloc.add_sequence(0)

    def setup():
        alloc.free_sequence(0)
        alloc.add_sequence(0)

    alloc.grow_sequence(0, BS)
    benchmark.pedantic(alloc.grow_sequence, args=(0, BATCH_BLOCKS * BS), setup=setup, rounds=200)
    record(benchmark, "alloc ns/block", pool, impl, BATCH_BLOCKS)


@pools
@impls
def test_free(benchmark, impl, pool):
    """Freeing a sequence of BATCH_BLOCKS blocks; ns per block."""
    alloc = make(impl, POOLS[pool])

    def setup():
        alloc.add_sequence(0)
        alloc.grow_sequence(0, BATCH_BLOCKS * BS)

    benchmark.pedantic(alloc.free_sequence, args=(0,), setup=setup, rounds=200)
    record(benchmark, "free ns/block", pool, impl, BATCH_BLOCKS)


@pools
@impls
def test_decode_step(benchmark, impl, pool):
    """STEPS decode steps of NUM_SEQS sequences, +1 token each; us per step."""
    alloc = make(impl, POOLS[pool])
    rng = np.random.default_rng(0)
    ids = np.arange(NUM_SEQS, dtype=np.int32)
    starts = rng.integers(0, 4 * BS, NUM_SEQS)  # staggered: ~1 in BS seals per step

    def setup():
        for s in range(NUM_SEQS):
            if s in getattr(alloc, "lens", ()) or (impl == "hexcore" and alloc.is_live(s)):
                alloc.free_sequence(s)
            alloc.add_sequence(s)
            alloc.grow_sequence(s, int(starts[s]))

    step = alloc.step
    batch = ids if impl == "hexcore" else ids.tolist()

    def run():
        for _ in range(STEPS):
            step(batch)

    benchmark.pedantic(run, setup=setup, rounds=100)
    record(benchmark, "decode step us", pool, impl, STEPS * 1000)


@pools
@impls
def test_grow_call(benchmark, impl, pool):
    """Single grow_sequence calls from Python, +1 token each (1 in BS seals); us per call."""
    alloc = make(impl, POOLS[pool])
    alloc.add_sequence(0)
    calls = STEPS * 32

    def setup():
        alloc.free_sequence(0)
        alloc.add_sequence(0)

    grow = alloc.grow_sequence

    def run():
        for n in range(1, calls + 1):
            grow(0, n)

    benchmark.pedantic(run, setup=setup, rounds=100)
    record(benchmark, "grow call us", pool, impl, calls * 1000)


@pytest.fixture(scope="module", autouse=True)
def report():
    """After the module: print per-unit figures (min over rounds) and hexcore / deque ratios."""
    yield
    FIGURES.print_table(POOLS, "deque")
