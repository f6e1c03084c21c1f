"""A block manager's whole state, copied, for "a refused call changes nothing" checks."""

import numpy as np


def snapshot(cache):
    """Copies of every state array of ``cache`` (the prefix cache's too, when on)."""
    arrays = [cache._blocks, cache._seqs, cache._tables, cache._counters]
    if cache._prefix is not None:
        arrays += list(cache._prefix.arrays())
    return [a.copy() for a in arrays]


def assert_unchanged(cache, before):
    """``cache`` holds exactly the state ``before`` (a :func:`snapshot`) and its invariants."""
    assert all(np.array_equal(x, y) for x, y in zip(before, snapshot(cache)))
    cache.check_invariants()
