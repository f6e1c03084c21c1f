"""Prefix caching benchmarks: hexcore's PagedKVCache(prefix_cache=True) against a plain-Python
block manager that caches blocks by a dict of chained block hashes (as nano-vllm does).

Run: .venv/bin/python -m pytest benchmarks/bench_prefix.py --benchmark-only -s
After the last benchmark, -s prints per-unit figures and hexcore / plain ratios, all from
the same run. Target (2-core CPU): admitting a 2048-token request whose prefix is cached
-- hashing its tokens, the lookup and the block-table update -- in <= 10 us at block size
16, flat from 1k to 64k blocks. With --benchmark-disable every benchmark runs once (smoke).

The plain-Python baseline follows nano-vllm's BlockManager: Block objects with a ref
count, a hash and their token ids, a dict hash -> block id, a deque of free block ids;
a block's hash chains on its parent's (Python's tuple hash stands in for xxhash, which
is not installed: it is faster, so the baseline is flattered); a hit checks the token
ids; a cached block that no sequence uses is taken back out of the free deque
(``deque.remove``, O(n), as nano-vllm does).
"""

from __future__ import annotations

import collections

import numpy as np
import pytest

from benchmarks.per_unit import PerUnit

from hexcore import KVCacheConfig
from hexcore.host import PagedKVCache

BS = 16
PROMPT = 2048  # tokens of the request
NUM_SEQS = 256  # sequences per decode step
STEPS = 32  # decode steps per timed round
POOLS = {"1k": 1024, "64k": 65536}
CONFIG = KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=64, block_size=BS)
FIGURES = PerUnit("us")  # (op, pool, impl) -> us per unit


class Block:
    """One pool block as nano-vllm keeps it."""

    __slots__ = ("block_id", "ref_count", "hash", "token_ids")

    def __init__(self, block_id):
        self.block_id, self.ref_count, self.hash, self.token_ids = block_id, 0, -1, []


class PlainPrefixCache:
    """The plain-Python baseline (nano-vllm's design): hash chain, dict, deque, Block objects."""

    def __init__(self, num_blocks, block_size=BS):
        self.block_size = block_size
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.hash_to_block_id: dict[int, int] = {}
        self.free_block_ids = collections.deque(range(num_blocks))
        self.used_block_ids: set[int] = set()
        self.tables: dict[int, list[int]] = {}
        self.tokens: dict[int, list[int]] = {}  # seq -> its token ids
        self.next_seq = 0

    @staticmethod
    def compute_hash(token_ids, prefix=-1):
        return hash((prefix, tuple(token_ids)))

    def _allocate_block(self, block_id):
        block = self.blocks[block_id]
        if block.hash != -1 and self.hash_to_block_id.get(block.hash) == block_id:
            del self.hash_to_block_id[block.hash]  # evicted
        block.ref_count, block.hash, block.token_ids = 1, -1, []
        self.free_block_ids.remove(block_id)
        self.used_block_ids.add(block_id)
        return block

    def admit(self, token_ids, leave_last=True):
        """A new sequence sharing the cached prefix of ``token_ids``; (seq, cached tokens)."""
        seq = self.next_seq
        self.next_seq += 1
        table, h, bs = [], -1, self.block_size
        limit = (len(token_ids) - 1 if leave_last else len(token_ids)) // bs
        for i in range(limit):
            block_tokens = token_ids[i * bs:(i + 1) * bs]
            h = self.compute_hash(block_tokens, h)
            block_id = self.hash_to_block_id.get(h, -1)
            if block_id == -1 or self.blocks[block_id].token_ids != block_tokens:
                break
            if block_id in self.used_block_ids:
                self.blocks[block_id].ref_count += 1
            else:
                block = self._allocate_block(block_id)
                block.hash, block.token_ids = h, block_tokens
                self.hash_to_block_id[h] = block_id
            table.append(block_id)
        self.tables[seq], self.tokens[seq] = table, (token_ids, len(table) * bs)  # copied at the first grow
        return seq, len(table) * bs

    def grow(self, seq, token_ids):
        """Append ``token_ids`` to ``seq``; each block it fills is hashed and registered."""
        tokens, table, bs = self.tokens[seq], self.tables[seq], self.block_size
        if type(tokens) is tuple:
            tokens = self.tokens[seq] = tokens[0][:tokens[1]]
        tokens += token_ids
        while len(tokens) >= (len(table) + 1) * bs:
            j = len(table)
            block = self._allocate_block(self.free_block_ids[0])
            h = self.blocks[table[-1]].hash if table else -1
            block_tokens = tokens[j * bs:(j + 1) * bs]
            block.hash, block.token_ids = self.compute_hash(block_tokens, h), block_tokens
            self.hash_to_block_id[block.hash] = block.block_id
            table.append(block.block_id)

    def free(self, seq):
        for block_id in reversed(self.tables.pop(seq)):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.used_block_ids.remove(block_id)
                self.free_block_ids.append(block_id)
        del self.tokens[seq]

    def step(self, seqs, token_ids):
        """One decode step: token ``token_ids[i]`` appended to ``seqs[i]``."""
        for seq, token in zip(seqs, token_ids):
            self.grow(seq, [token])


def make(impl, num_blocks, max_seqs=NUM_SEQS):
    if impl == "plain":
        return PlainPrefixCache(num_blocks)
    return PagedKVCache(CONFIG, num_blocks, max_seqs, max_seq_len=4 * PROMPT, prefix_cache=True)


def fill(cache, impl, rng, count):
    """Serve and finish ``count`` other 2048-token prompts (cached, evictable) first."""
    for _ in range(count):
        other = rng.integers(0, 32000, PROMPT).astype(np.int32)
        if impl == "plain":
            seq, _ = cache.admit(other.tolist())
            cache.grow(seq, other.tolist())
            cache.free(seq)
        else:
            adm = cache.admit(other)
            cache.grow_sequence(adm.seq_id, PROMPT, tokens=other)
            cache.free_sequence(adm.seq_id)


record = FIGURES.record


impls = pytest.mark.parametrize("impl", ["plain", "hexcore"])
pools = pytest.mark.parametrize("pool", list(POOLS))


@pytest.mark.parametrize("held", ["live", "cached"])
@pools
@impls
def test_admit_cached_prompt(benchmark, impl, pool, held):
    """Admit a 2048-token request whose blocks are cached: hash, look up, share (127 blocks,
    the last token left to compute). ``live``: another running sequence holds the prefix;
    ``cached``: it was freed, so its blocks come back out of the evictable pool. us per call."""
    num_blocks = POOLS[pool]
    cache = make(impl, num_blocks)
    rng = np.random.default_rng(0)
    fill(cache, impl, rng, min(num_blocks // (PROMPT // BS) - 2, 32))
    tokens = rng.integers(0, 32000, PROMPT).astype(np.int32)
    request = tokens if impl == "hexcore" else tokens.tolist()
    if impl == "plain":
        owner, _ = cache.admit(request)
        cache.grow(owner, request)
        admit, free = cache.admit, cache.free
    else:
        owner = cache.admit(request).seq_id
        cache.grow_sequence(owner, PROMPT, tokens=request)
        admit, free = cache.admit, cache.free_sequence
    if held == "cached":
        free(owner)
    admitted = []

    def setup():
        while admitted:
            free(admitted.pop()[0])

    def run():
        admitted.append(admit(request))

    # (the baseline's cached case runs O(num_blocks) deque removals: fewer rounds)
    rounds = 2000 if impl == "hexcore" else (200 if held == "live" else 20 if pool == "1k" else 3)
    benchmark.pedantic(run, setup=setup, rounds=rounds, warmup_rounds=min(50, rounds))
    assert admitted[-1][1] == PROMPT - BS  # a hit of 127 blocks
    record(benchmark, f"admit cached 2048 ({held}) us", pool, impl, 1)


@pools
@impls
def test_admit_and_prefill_new_prompt(benchmark, impl, pool):
    """Admit a 2048-token request nothing of which is cached, and register its 128 blocks
    as the prefill seals them (hashing every block); us per request."""
    num_blocks = POOLS[pool]
    cache = make(impl, num_blocks)
    rng = np.random.default_rng(1)
    fill(cache, impl, rng, min(num_blocks // (PROMPT // BS) - 2, 32))
    prompts = [rng.integers(0, 32000, PROMPT).astype(np.int32) for _ in range(8)]
    if impl == "plain":
        prompts = [p.tolist() for p in prompts]
    state = {"i": 0, "seq": None}

    def setup():
        if state["seq"] is not None:
            if impl == "plain":
                cache.free(state["seq"])
            else:
                cache.free_sequence(state["seq"])
            if impl == "hexcore":
                cache.clear_prefix_cache()  # a miss again next round
        state["i"] += 1

    def run():
        tokens = prompts[state["i"] % len(prompts)]
        if impl == "plain":
            seq, cached = cache.admit(tokens)
            cache.grow(seq, tokens[cached:])
        else:
            seq, cached = cache.admit(tokens)
            cache.grow_sequence(seq, PROMPT, tokens=tokens[cached:])
        state["seq"] = seq

    if impl == "plain":  # forget earlier rounds' blocks, as clear_prefix_cache does
        inner = setup

        def setup():  # noqa: F811
            inner()
            cache.hash_to_block_id.clear()
            for block in cache.blocks:
                if block.ref_count == 0:
                    block.hash, block.token_ids = -1, []

    benchmark.pedantic(run, setup=setup, rounds=300 if impl == "hexcore" else 50, warmup_rounds=5)
    record(benchmark, "admit + prefill new 2048 us", pool, impl, 1)


@pools
@impls
def test_decode_step_with_tokens(benchmark, impl, pool):
    """STEPS decode steps of NUM_SEQS sequences, one token id each; every filled block is
    hashed and registered (~1 in BS entries per step). us per step."""
    num_blocks = POOLS[pool]
    cache = make(impl, num_blocks)
    rng = np.random.default_rng(2)
    starts = rng.integers(0, 4 * BS, NUM_SEQS)
    seqs = []

    def setup():
        for seq in seqs:
            if impl == "plain":
                cache.free(seq)
            else:
                cache.free_sequence(seq)
        seqs.clear()
        if impl == "hexcore":
            cache.clear_prefix_cache()
        for s in range(NUM_SEQS):
            tokens = rng.integers(0, 32000, int(starts[s])).astype(np.int32)
            if impl == "plain":
                seq, _ = cache.admit(tokens.tolist())
                cache.grow(seq, tokens.tolist())
            else:
                seq = cache.admit(tokens).seq_id
                cache.grow_sequence(seq, len(tokens), tokens=tokens)
            seqs.append(seq)

    token_rows = rng.integers(0, 32000, (STEPS, NUM_SEQS)).astype(np.int32)
    if impl == "plain":
        rows = token_rows.tolist()

        def run():
            for row in rows:
                cache.step(seqs, row)
    else:
        ids = np.arange(NUM_SEQS, dtype=np.int32)
        step = cache.step

        def run():
            for row in token_rows:
                step(ids, tokens=row)

    benchmark.pedantic(run, setup=setup, rounds=30)
    record(benchmark, "decode step, tokens us", pool, impl, STEPS)


@pools
@impls
def test_step_sealing_every_sequence(benchmark, impl, pool):
    """One decode step of NUM_SEQS sequences whose tails are all full: NUM_SEQS blocks sealed,
    hashed and indexed in one call (the worst case of a step). us per step."""
    cache = make(impl, POOLS[pool])
    rng = np.random.default_rng(3)
    seqs = []

    def setup():
        for seq in seqs:
            cache.free(seq) if impl == "plain" else cache.free_sequence(seq)
        seqs.clear()
        if impl == "hexcore":
            cache.clear_prefix_cache()
        for _ in range(NUM_SEQS):
            tokens = rng.integers(0, 32000, BS - 1).astype(np.int32)
            if impl == "plain":
                seq, _ = cache.admit(tokens.tolist())
                cache.grow(seq, tokens.tolist())
            else:
                seq = cache.admit(tokens).seq_id
                cache.grow_sequence(seq, BS - 1, tokens=tokens)
            seqs.append(seq)

    row = rng.integers(0, 32000, NUM_SEQS).astype(np.int32)
    if impl == "plain":
        values = row.tolist()

        def run():
            cache.step(seqs, values)
    else:
        ids = np.arange(NUM_SEQS, dtype=np.int32)

        def run():
            assert cache.step(ids, tokens=row).num_sealed == NUM_SEQS

    benchmark.pedantic(run, setup=setup, rounds=30)
    record(benchmark, "step sealing 256 us", pool, impl, 1)


@pytest.fixture(scope="module", autouse=True)
def report():
    """After the module: per-unit figures (min over rounds) and hexcore / plain ratios."""
    yield
    FIGURES.print_table(POOLS, "plain")
