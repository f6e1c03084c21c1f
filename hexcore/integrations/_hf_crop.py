"""``HexcoreCache.crop``: rolling rows back, for assisted (speculative) decoding.

The block manager shrinks a sequence inside its open tail or to a block boundary
(:meth:`hexcore.host.PagedKVCache.truncate_sequence`); a sealed block is never rewritten.
A verification forward of assisted decoding often seals a block and then keeps only part
of it. For that case each row keeps a *journal*: the float16 K/V (and token ids) of its
latest positions, at most ``max_rollback`` of them plus the rest of their block, as the
prompt or the forward staged them. A crop inside a sealed block then cuts the row to the
block's start (the block's reference goes; it stays cached if the prefix cache indexed it)
and stores the journal's tokens of that block again into the empty tail: the same float16
values, so the row holds exactly what a DynamicCache would.
"""

from __future__ import annotations

import numpy as np
import torch

from .._checks import as_int
from ..errors import HexcoreInvalidArgumentError
from ._hf_parts import for_engine


class Journal:
    """A row's float16 K/V ``[L, n, H, D]`` of its positions ``[start, start + n)``, and their
    token ids (int32 [n] numpy, or None when unknown)."""

    __slots__ = ("start", "k", "v", "ids")

    def __init__(self, start: int, k, v, ids):
        self.start, self.k, self.v, self.ids = start, k, v, ids

    @property
    def end(self) -> int:
        return self.start + int(self.k.shape[1])

    def upto(self, end: int):
        """This journal without its positions at and past ``end`` (None when nothing is left)."""
        if end <= self.start:
            return None
        n = end - self.start
        return Journal(self.start, self.k[:, :n], self.v[:, :n], None if self.ids is None else self.ids[:n])


def record(old: Journal | None, start: int, k, v, ids, window: int, block_size: int) -> Journal | None:
    """The journal of a row after its positions ``[start, start + n)`` were stored from ``k``,
    ``v`` (float16 ``[L, n, H, D]``) and ``ids`` (int32 [n] or None), given its journal
    ``old``: the last ``window`` positions and the rest of their first block, as far as they
    are known (a decode step in between leaves a gap: the journal then starts at ``start``)."""
    if window <= 0:
        return None
    end = start + int(k.shape[1])
    first = max(0, end - window) // block_size * block_size
    if first < start and old is not None and old.start <= first and old.end == start:
        a = first - old.start
        ids = None if ids is None or old.ids is None else np.concatenate([old.ids[a:], ids])
        return Journal(first, torch.cat([old.k[:, a:], k], 1), torch.cat([old.v[:, a:], v], 1), ids)
    if first <= start:
        return Journal(start, k, v, ids)
    skip = first - start  # a long prompt: keep its last positions only (a copy, so the rest can go)
    return Journal(first, k[:, skip:].clone(), v[:, skip:].clone(), None if ids is None else ids[skip:].copy())


def crop(cache, max_length) -> None:
    """``HexcoreCache.crop``: see its docstring. All rows or none: a row that cannot be cut
    raises HexcoreInvalidArgumentError before any row changes."""
    n = as_int("max_length", max_length)
    length = cache._length
    target = length + n if n < 0 else (length if n == 0 else min(n, length))
    if target < 0:
        raise HexcoreInvalidArgumentError(f"crop: max_length {n} would remove {-n} tokens, more than the cache's "
                                          f"{length}")
    if target == length:
        return
    if cache._in_forward():
        raise HexcoreInvalidArgumentError("crop: cannot crop in the middle of a forward pass")
    if cache._crop_blocked is not None:
        raise HexcoreInvalidArgumentError(f"crop: max_length {n}: {cache._crop_blocked}; a crop cannot tell which "
                                          f"of the removed positions a row holds")
    cache._journals += [None] * (len(cache.rows) - len(cache._journals))  # (rows set by hand: none kept)
    plan = [_plan_row(cache, row, seq, length - target, n) for row, seq in enumerate(cache.rows) if seq >= 0]
    engine = cache.engine
    for row, seq, new_len, journal in plan:
        if journal is None:
            engine.cache.truncate_sequence(seq, new_len)
        else:  # inside a sealed block: back to the block's start, then its kept tokens again
            block_start = new_len // cache.kv_config.block_size * cache.kv_config.block_size
            a, z = block_start - journal.start, new_len - journal.start
            stream = torch.cuda.current_stream(journal.k.device) if journal.k.is_cuda else None
            engine.cache.truncate_sequence(seq, block_start)
            engine.prefill(seq, for_engine(journal.k[:, a:z]), for_engine(journal.v[:, a:z]), stream=stream,
                           tokens=None if journal.ids is None else journal.ids[a:z])
        old = cache._journals[row]
        cache._journals[row] = None if old is None else old.upto(new_len)
    cache._length = target


def _plan_row(cache, row: int, seq: int, removed: int, n: int) -> tuple:
    # (row, seq, new length, the journal to store again from or None) of cutting `removed` positions
    held, bs = cache.engine.seq_len(seq), cache.kv_config.block_size
    new_len = held - removed
    if new_len < 0:
        raise HexcoreInvalidArgumentError(f"crop: max_length {n} would remove {removed} positions, but row {row} "
                                          f"holds {held} tokens (the rest is its prompt's padding)")
    if new_len >= held // bs * bs or new_len % bs == 0:
        return row, seq, new_len, None  # inside the open tail, or on a block boundary
    journal, block = cache._journals[row], new_len // bs
    if journal is None or journal.start > block * bs or journal.end < new_len:
        kept = "nothing" if journal is None else f"tokens [{journal.start}, {journal.end})"
        raise HexcoreInvalidArgumentError(
            f"crop: max_length {n} would cut row {row} to {new_len} tokens, inside its sealed block {block} "
            f"(tokens [{block * bs}, {(block + 1) * bs})), and the cache kept {kept} of that row to store again "
            f"(max_rollback {cache.max_rollback}; a decode step in between is not kept)")
    return row, seq, new_len, journal
