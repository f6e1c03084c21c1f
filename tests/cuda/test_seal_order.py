"""seal_order: the quantizing seal's word order is a permutation, its rotations are fields,
and, in the 32-bank model, a warp's reads conflict far less than in plain order."""

from __future__ import annotations

import numpy as np
import pytest

from hexcore.cuda.seal_order import bank_ways, key_reads, key_rotations, value_order, value_reads

CONFIGS = [(4, 128, 32, 64), (2, 128, 32, 64), (4, 64, 16, 32), (2, 64, 64, 64), (4, 256, 16, 128)]


def mean_ways(bits, head_dim, block_size, group_size, ordered: bool) -> tuple[float, float]:
    """Mean replays per warp-wide read of the key and value loops (1.0: conflict-free)."""
    fields, run = 32 // bits, block_size * head_dim * bits // 32
    rotations = key_rotations(bits, head_dim, block_size) if ordered else np.zeros(run, np.int32)
    order = value_order(bits, head_dim, block_size, group_size) if ordered else np.arange(run)
    keys, values = [], []
    for group in range(0, run, 32):
        for step in range(fields):
            for kind in range(2):
                keys.append(bank_ways([key_reads(w, (step + rotations[w]) % fields, bits, head_dim)[kind]
                                       for w in range(group, group + 32)]))
                values.append(bank_ways([value_reads(int(w), step, bits, head_dim, group_size)[kind]
                                         for w in order[group:group + 32]]))
    return float(np.mean(keys)), float(np.mean(values))


@pytest.mark.parametrize("bits,head_dim,block_size,group_size", CONFIGS)
def test_tables_are_a_permutation_and_field_rotations(bits, head_dim, block_size, group_size):
    run = block_size * head_dim * bits // 32
    order = value_order(bits, head_dim, block_size, group_size)
    rotations = key_rotations(bits, head_dim, block_size)
    assert order.dtype == np.int32 and sorted(order.tolist()) == list(range(run))
    assert rotations.shape == (run,) and rotations.min() >= 0 and rotations.max() < 32 // bits


@pytest.mark.parametrize("bits,head_dim,block_size,group_size", CONFIGS)
def test_ordered_reads_conflict_less(bits, head_dim, block_size, group_size):
    plain_k, plain_v = mean_ways(bits, head_dim, block_size, group_size, ordered=False)
    keys, values = mean_ways(bits, head_dim, block_size, group_size, ordered=True)
    print(f"bits {bits} D {head_dim} BS {block_size} GS {group_size}: keys {plain_k:.2f} -> {keys:.2f}, "
          f"values {plain_v:.2f} -> {values:.2f} ways")
    assert keys == 1.0 and values <= min(1.6, plain_v / 1.6)
    assert plain_k >= 3 and plain_v >= 2.5  # what the order is for


def test_bank_ways_counts_distinct_words_per_bank():
    assert bank_ways(range(32)) == 1
    assert bank_ways([0] * 32) == 1  # one word: a broadcast
    assert bank_ways([0, 32, 64, 1]) == 3
