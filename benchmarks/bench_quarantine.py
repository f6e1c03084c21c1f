"""Host cost of the QUARANTINED block state: quarantine_block, and a migration's table edit.

Run: .venv/bin/python -m pytest benchmarks/bench_quarantine.py --benchmark-only
A 64k-block pool holding 200 sequences of 128 blocks (block size 16), prefix cache off and
on. ``quarantine_block`` of a LIVE block is O(1) with the prefix cache off; with it on it
walks the index's parent links and the tables once (O(num_blocks + table entries)) to
unindex the block's descendants. A migration's edit is ``prepare_free_blocks(128)`` then
``replace_blocks``. With --benchmark-disable each runs once (smoke).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from hexcore import KVCacheConfig
from hexcore.host import PagedKVCache

BS, NUM_BLOCKS, NUM_SEQS, SEQ_BLOCKS = 16, 65536, 200, 128
CONFIG = KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=64, block_size=BS)


def filled(prefix: bool) -> PagedKVCache:
    """The pool, NUM_SEQS sequences of SEQ_BLOCKS blocks each (indexed with the prefix cache on)."""
    cache = PagedKVCache(CONFIG, NUM_BLOCKS, 256, prefix_cache=prefix, max_seq_len=SEQ_BLOCKS * BS * 2)
    for i in range(NUM_SEQS):
        tokens = np.arange(i * 10_000, i * 10_000 + SEQ_BLOCKS * BS, dtype=np.int32)
        seq = cache.admit(tokens).seq_id
        cache.grow_sequence(seq, len(tokens), tokens)
    return cache


@pytest.mark.parametrize("prefix", [False, True], ids=["plain", "prefix"])
def test_quarantine_live_block(benchmark, prefix):
    """One quarantine_block call of a LIVE block (a new one each round: the first of a chain)."""
    cache = filled(prefix)
    targets = itertools.cycle(int(cache.block_table(s)[0]) for s in range(NUM_SEQS))
    benchmark.pedantic(cache.quarantine_block, setup=lambda: ((next(targets),), {}), rounds=60, warmup_rounds=5)
    cache.check_invariants()


@pytest.mark.parametrize("prefix", [False, True], ids=["plain", "prefix"])
def test_migration_table_edit(benchmark, prefix):
    """prepare_free_blocks(SEQ_BLOCKS) + replace_blocks of one sequence (its old blocks go back)."""
    cache = filled(prefix)

    def migrate():
        cache.replace_blocks(0, cache.prepare_free_blocks(SEQ_BLOCKS))

    benchmark.pedantic(migrate, rounds=60, warmup_rounds=5)
    cache.check_invariants()
