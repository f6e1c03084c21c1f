"""The order in which the quantizing seal's threads take a (block, head) run's code words.

The seal stages a head's tail rows in shared memory and packs each 32-bit code word from
``32 // bits`` values spread over the block (the decode kernel's fragment order,
``hexcore/layout.py``). Taken in plain order, the 32 lanes of a warp read 4 to 8
different words of one shared-memory bank per field (a 4- to 8-way conflict on every
read), because a row of ``head_dim`` float16 values is a whole number of bank cycles and
the fragment order repeats with a period of a few words. Two tables undo that, without
changing a single output bit (each word is packed independently):

- **keys**: words stay in plain order (coalesced stores); lane ``w`` starts its field loop
  at a rotation ``key_rotations[w]`` chosen so that, at every step of the loop, the warp's
  32 lanes read distinct banks (the tail row and the key scales/mins alike);
- **values**: the field loop is fixed and the words are permuted instead
  (``value_order``): each group of 32 consecutive entries (one warp's words at one step)
  is picked greedily, from a window of the words not yet taken, to read distinct banks.

``bank_ways`` is the model both are built and tested with: shared memory has 32 banks of
4 bytes; lanes reading the same 4-byte word are served at once, different words in one
bank one after another. Measured with it (``tests/cuda/test_seal_order.py``), llama-3's
shape (INT4, head_dim 128, block 32, groups of 64) goes from 4 (keys) and 4.5 (values)
ways on average to 1 and 1.
"""

from __future__ import annotations

import functools

import numpy as np

from ..layout import key_code_dim, value_chunk_dims, value_code_token_dim

BANKS = 32
WARP = 32
WINDOW = 256  # words the value order looks ahead when it fills a warp's group


def key_reads(w: int, field: int, bits: int, head_dim: int) -> tuple[int, int]:
    """Shared-memory words read for key word ``w``'s field: (tail word, key-parameter index)."""
    row_words = head_dim * bits // 32
    t, kword = w // row_words, w % row_words
    d = key_code_dim(kword, field, bits)
    return (t * head_dim + d) // 2, d


def value_reads(w: int, field: int, bits: int, head_dim: int, group_size: int) -> tuple[int, int]:
    """Shared-memory words read for value word ``w``'s field: (tail word, value-parameter index)."""
    token, dim = value_code_token_dim(w, field, bits, head_dim, value_chunk_dims(group_size))
    return (token * head_dim + dim) // 2, token * 2 * (head_dim // group_size) + dim // group_size


def bank_ways(addresses) -> int:
    """How many times one warp-wide shared-memory read is replayed: the most distinct 4-byte
    words any bank is asked for (1: no conflict)."""
    banks: dict = {}
    for a in addresses:
        banks.setdefault(a % BANKS, set()).add(a)
    return max(len(words) for words in banks.values())


@functools.cache
def key_rotations(bits: int, head_dim: int, block_size: int) -> np.ndarray:
    """int32 ``[block_size * head_dim * bits // 32]``: the field the key word's loop starts at."""
    fields, run = 32 // bits, block_size * head_dim * bits // 32
    rotations = np.zeros(run, np.int32)
    for group in range(0, run, WARP):
        taken = [({}, {}) for _ in range(fields)]  # per loop step, per read: bank -> words
        for w in range(group, group + WARP):
            def reads(r):
                return [key_reads(w, (step + r) % fields, bits, head_dim) for step in range(fields)]
            best = min(range(fields), key=lambda r: _conflicts(taken, reads(r)))
            rotations[w] = best
            _take(taken, reads(best))
    rotations.flags.writeable = False  # cached: shared by every caller
    return rotations


@functools.cache
def value_order(bits: int, head_dim: int, block_size: int, group_size: int) -> np.ndarray:
    """int32 ``[block_size * head_dim * bits // 32]``: a permutation of the value words;
    entries ``32 g .. 32 g + 31`` are the words one warp packs together."""
    fields, run = 32 // bits, block_size * head_dim * bits // 32
    reads = [[value_reads(w, f, bits, head_dim, group_size) for f in range(fields)] for w in range(run)]
    left, order = list(range(run)), []
    while left:
        taken = [({}, {}) for _ in range(fields)]
        for _ in range(min(WARP, len(left))):
            w = left.pop(_cheapest(taken, [reads[w] for w in left[:WINDOW]]))
            _take(taken, reads[w])
            order.append(w)
    order = np.array(order, np.int32)
    order.flags.writeable = False  # cached: shared by every caller
    return order


def _cheapest(taken, candidates) -> int:
    # index of the first candidate adding the fewest replays (the first free one at once):
    # the order stays close to plain order, so the stores stay close to coalesced
    best, best_cost = 0, None
    for i, reads in enumerate(candidates):
        cost = _conflicts(taken, reads)
        if best_cost is None or cost < best_cost:
            best, best_cost = i, cost
            if cost == 0:
                break
    return best


def _conflicts(taken, reads) -> int:
    # extra replays the lane's reads (one per loop step and kind) would add to the group's
    cost = 0
    for step, pair in enumerate(reads):
        for kind, address in enumerate(pair):
            words = taken[step][kind].get(address % BANKS)
            if words and address not in words:
                cost += len(words)
    return cost


def _take(taken, reads) -> None:
    for step, pair in enumerate(reads):
        for kind, address in enumerate(pair):
            taken[step][kind].setdefault(address % BANKS, set()).add(address)
