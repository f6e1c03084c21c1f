"""TieredKVCache: a pool per kind of block, seals and re-seals by age (hexcore.host.tiered),
replayed on a model of the device's blocks; and PagedKVCache.remove_block it builds on."""

import numpy as np
import pytest

from hexcore import (HexcoreConfigError, HexcoreInvalidArgumentError, HexcoreInvalidSequenceError, HexcoreOOMError,
                     KVCacheConfig)
from hexcore.host import PagedKVCache, TieredKVCache
from hexcore.host.tiered import SEAL
from hexcore.quant import FORMATS, AgeTier, KVFormat

BS = 16
CONFIG = KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=64, block_size=BS)
# a third format: FP16 while young, INT4 from 64 tokens of age, INT2 from 128, two sink blocks
AGED3 = KVFormat("aged3", (AgeTier(64, 4, 4), AgeTier(128, 2, 2)), sink_blocks=2)


class DeviceModel:
    """What the device's pools hold, replayed from a TieredKVCache's operations: each block
    holds (logical block, the pools it went through, the seal it came from). A re-seal
    checks that its source still holds the data of the block it moves, so an operation
    order (or a reference count) that lets a block be overwritten while read fails here."""

    def __init__(self):
        self.blocks = {}  # (pool, block) -> (logical, pools so far, seal id)
        self.data = {}  # seq_id -> {logical: seal id} (forks copy it)
        self.seals = 0

    def run(self, ops):
        for s, j, src, src_block, kind, block in ops.tolist():
            if src == SEAL:
                self.seals += 1
                self.data.setdefault(s, {})[j] = self.seals
                self.blocks[kind, block] = (j, (kind,), self.seals)
            else:
                held = self.blocks[src, src_block]
                assert held[0] == j and held[2] == self.data[s][j], (s, j, held)
                self.blocks[kind, block] = (j, held[1] + (kind,), held[2])

    def check(self, cache):
        """Every live sequence's blocks hold its own data, through the pools its ages say."""
        for s in (s for s in range(cache.max_seqs) if cache._lens[s] >= 0):
            n = cache.seq_len(s)
            kinds = cache.block_kinds(s)
            places = [0] * len(cache.pools)
            for j in range(n // BS):
                kind = int(kinds[j])
                block = int(cache.pools[kind].block_table(s)[places[kind]])
                places[kind] += 1
                assert self.blocks[kind, block] == (j, expected_path(cache, j, n), self.data[s][j]), (s, j)


def expected_path(cache, j: int, n: int) -> tuple:
    """The pools block ``j`` of a sequence of ``n`` tokens went through: its kind when sealed
    (FP16 for a sink block or one younger than the first tier), then each later tier it aged into."""
    fmt, first_fp16 = cache.format, cache._first_fp16
    if j < fmt.sink_blocks:
        return (0,)
    age = n - (j + 1) * BS
    path = [first_fp16 if fmt.tiers and fmt.tiers[0].min_age == 0 else 0]
    path += [t + first_fp16 for t, tier in enumerate(fmt.tiers) if 0 < tier.min_age <= age]
    return tuple(path)


def tiered(fmt, blocks=(24, 48, 48), max_seqs=6):
    cache = TieredKVCache(CONFIG, fmt, {k: n for k, n in zip(("fp16", "int4", "int2"), blocks)
                                        if k in [d.value for d in _kinds(fmt)]}, max_seqs, max_seq_len=64 * BS)
    return cache


def _kinds(fmt):
    from hexcore.host.tiered import pool_kinds as kinds

    return kinds(FORMATS.get(fmt, fmt) if isinstance(fmt, str) else fmt, BS)


@pytest.mark.parametrize("fmt", ["int4-aged", "int2-aged", AGED3, "int4", "fp16"], ids=lambda f: getattr(f, "name", f))
def test_random_workload_keeps_every_block_where_its_age_says(fmt, rng, seed):
    print(f"seed {seed}")
    cache, device = tiered(fmt), DeviceModel()
    for _ in range(400):
        live = [s for s in range(cache.max_seqs) if cache._lens[s] >= 0]
        op = rng.random()
        if op < 0.1 and len(live) < cache.max_seqs:
            cache.add_sequence()
        elif op < 0.15 and live and len(live) < cache.max_seqs:
            parent = int(rng.choice(live))
            child = cache.fork_sequence(parent)
            device.data[child] = dict(device.data.get(parent, {}))
        elif op < 0.2 and len(live) > 2:
            s = int(rng.choice(live))
            cache.free_sequence(s)
            device.data.pop(s, None)
        elif live:
            batch = rng.choice(live, int(rng.integers(1, len(live) + 1)), replace=False).astype(np.int32)
            for _ in range(int(rng.integers(1, 40))):
                try:
                    result = cache.step(batch)
                except HexcoreOOMError:  # out of blocks: preempt one, as a server would (else a
                    s = int(rng.choice(live))  # full pool with two sequences stalls the workload)
                    cache.free_sequence(s)
                    device.data.pop(s, None)
                    break
                except HexcoreInvalidSequenceError:  # at max_seq_len
                    break
                device.run(result.ops)
                assert result.seq_lens.tolist() == [cache.seq_len(int(s)) for s in batch]
        cache.check_invariants()
        device.check(cache)
    assert device.seals > 150  # (1000 seeds per format: at least 220 with the preemption above)


def test_a_step_orders_reseals_oldest_tier_first_then_seals():
    cache = tiered("int2-aged")
    s = cache.add_sequence()
    ops = [cache.step(np.array([s], np.int32)).ops for _ in range(384 + 3 * BS)]
    ops = np.concatenate([o for o in ops if len(o)])
    # block 0 the FP16 sink, blocks 1.. INT4 when sealed; block 1 re-sealed to INT2 once 384 tokens old
    assert ops[0].tolist() == [s, 0, SEAL, -1, 0, ops[0, 5]]
    reseals = ops[ops[:, 2] != SEAL]
    assert reseals[:, [1, 2, 4]].tolist() == [[1, 1, 2], [2, 1, 2]]
    at = int(np.flatnonzero(ops[:, 2] != SEAL)[0])
    assert ops[at + 1, 2] == SEAL and ops[at + 1, 1] == 384 // BS + 1  # the re-seal comes before the step's seal
    assert cache.block_kinds(s).tolist() == [0, 2, 2] + [1] * (384 // BS)


def test_an_oom_changes_nothing():
    cache = tiered("int4-aged", blocks=(3, 1))
    a, b = cache.add_sequence(), cache.add_sequence()
    batch = np.array([a, b], np.int32)
    for _ in range(2 * BS - 1):
        cache.step(batch)
    before = [p._tables.copy() for p in cache.pools], cache._lens.copy(), cache._kind.copy()
    with pytest.raises(HexcoreOOMError, match=r"^pool fp16: the step needs more blocks than the 1 free"):
        cache.step(batch)  # both seal block 1 into FP16, 1 free (block 0 is the sink: it stays)
    after = [p._tables.copy() for p in cache.pools], cache._lens.copy(), cache._kind.copy()
    assert all(np.array_equal(x, y) for x, y in zip(before[0], after[0]))
    assert np.array_equal(before[1], after[1]) and np.array_equal(before[2], after[2])
    cache.check_invariants()


@pytest.mark.parametrize("batch, error, match", [
    ([0, 0], HexcoreInvalidArgumentError, "seq_ids: sequence 0 is listed twice"),
    ([0, 5], HexcoreInvalidSequenceError, r"seq_ids\[1\] = 5 is not a live sequence"),
    ([9], HexcoreInvalidSequenceError, r"seq_ids\[0\] = 9 is not a live sequence"),
])
def test_bad_batches_are_typed_and_change_nothing(batch, error, match):
    cache = tiered("int2-aged")
    cache.add_sequence()
    lens = cache._lens.copy()
    with pytest.raises(error, match=match):
        cache.step(np.array(batch, np.int32))
    with pytest.raises(HexcoreInvalidArgumentError, match="seq_ids: expected a C-contiguous int32"):
        cache.step(np.array(batch, np.int64))
    assert np.array_equal(cache._lens, lens)


@pytest.mark.parametrize("fmt, pools, error, match", [
    (KVFormat("k4v2", (AgeTier(0, 4, 2),)), {"int4": 4}, HexcoreConfigError, "tier 0 holds keys and values at diff"),
    (KVFormat("same", (AgeTier(0, 4, 4), AgeTier(64, 4, 4))), {"int4": 4}, HexcoreConfigError, "keeps the bits"),
    (KVFormat("odd", (AgeTier(40, 4, 4),)), {"fp16": 4, "int4": 4}, HexcoreConfigError, "multiples of block_size"),
    ("int2-aged", {"int4": 4, "int2": 4}, HexcoreInvalidArgumentError, r"pool_blocks: expected a dict with the keys"),
    ("int2-aged", {"fp16": 0, "int4": 4, "int2": 4}, HexcoreInvalidArgumentError, r"pool_blocks\['fp16'\]"),
    ("int9", {}, HexcoreConfigError, "format: expected a KVFormat or one of"),
])
def test_bad_formats_and_pools_are_typed(fmt, pools, error, match):
    with pytest.raises(error, match=match):
        TieredKVCache(CONFIG, fmt, pools, 2)


# -- PagedKVCache.remove_block ----------------------------------------------------------------
def test_remove_block_shifts_the_table_and_frees_the_last_reference():
    cache = PagedKVCache(CONFIG, 8, 2)
    a = cache.add_sequence()
    cache.grow_sequence(a, 3 * BS + 5)
    b = cache.fork_sequence(a)
    table = cache.block_table(a).tolist()
    assert cache.remove_block(a, 1) is False  # b still holds it
    assert cache.block_table(a).tolist() == [table[0], table[2]] and cache.seq_len(a) == 2 * BS + 5
    assert cache.remove_block(b, 1) is True and cache.num_free_blocks == 8 - 3 + 1
    cache.check_invariants()
    for bad, error, match in [((a, 2), HexcoreInvalidArgumentError, r"^index: "), ((a, -1), HexcoreInvalidArgumentError,
                              r"^index: "), ((1 - a + 5, 0), HexcoreInvalidSequenceError, "seq_id")]:
        with pytest.raises(error, match=match):
            cache.remove_block(*bad)
    with pytest.raises(HexcoreConfigError, match="prefix cache"):
        prefix = PagedKVCache(CONFIG, 8, 2, prefix_cache=True)
        s = prefix.add_sequence()
        prefix.grow_sequence(s, BS)
        prefix.remove_block(s, 0)


def test_grow_is_the_steps_of_a_prompt_and_fits_pools_sized_for_the_end():
    # int2-aged (INT2 from 384 tokens = 24 blocks of age), a 600-token prompt: 37 blocks; at the
    # end 1 FP16 (the sink), 12 INT2, 24 INT4. Each block is sealed INT4 and re-sealed INT2 as the
    # prompt ages it, so an INT4 pool of 24 is enough only because each re-seal gives its block
    # back before the next seal takes one.
    n = 600
    stepped, grown, device = tiered("int2-aged"), tiered("int2-aged", blocks=(1, 24, 12)), DeviceModel()
    a, b = stepped.add_sequence(), grown.add_sequence()
    for _ in range(n):
        stepped.step(np.array([a], np.int32))
    result = grown.grow(b, n)
    device.run(result.ops)
    grown.check_invariants()
    device.check(grown)
    assert result.seq_lens.tolist() == [n] and grown.block_kinds(b).tolist() == stepped.block_kinds(a).tolist()
    assert [p.num_free_blocks for p in grown.pools] == [0, 0, 0]
    # the same ops as one token at a time, blocks aside
    again, ops = tiered("int2-aged"), []
    s = again.add_sequence()
    for _ in range(n):
        ops.append(again.step(np.array([s], np.int32)).ops)
    assert np.array_equal(np.concatenate(ops)[:, [1, 2, 4]], result.ops[:, [1, 2, 4]])


def test_grow_out_of_a_pool_or_past_max_seq_len_changes_nothing():
    cache = tiered("int2-aged", blocks=(1, 23, 12))
    s = cache.add_sequence()
    cache.grow(s, 5)
    state = [p._tables.copy() for p in cache.pools], cache._lens.copy(), cache._kind.copy()
    with pytest.raises(HexcoreOOMError, match=r"^pool int4: growing sequence 0 to 600 tokens needs more blocks"):
        cache.grow(s, 600)
    with pytest.raises(HexcoreInvalidArgumentError, match=r"^new_len: "):
        cache.grow(s, cache.max_seq_len + 1)
    with pytest.raises(HexcoreInvalidArgumentError, match=r"^new_len: "):
        cache.grow(s, 4)
    after = [p._tables.copy() for p in cache.pools], cache._lens.copy(), cache._kind.copy()
    assert all(np.array_equal(x, y) for x, y in zip(state[0], after[0]))
    assert np.array_equal(state[1], after[1]) and np.array_equal(state[2], after[2])
    cache.check_invariants()


@pytest.mark.parametrize("fmt", ["int4-aged", "int2-aged", AGED3, "int4"], ids=lambda f: getattr(f, "name", f))
def test_pools_sized_by_pool_blocks_for_hold_any_workload_of_that_many_blocks(fmt, rng, seed):
    # sequences growing token by token (no forks: shared blocks would need fewer) never run
    # out of a pool while their sealed blocks together stay within total_blocks
    from hexcore.host import pool_blocks_for

    print(f"seed {seed}")
    total, max_seqs = 40, 4
    pools = pool_blocks_for(fmt, BS, total, max_seqs)
    assert list(pools) == [k.value for k in _kinds(fmt)] and list(pools.values())[-1] == total
    cache = TieredKVCache(CONFIG, fmt, pools, max_seqs, max_seq_len=64 * BS)
    ids = np.array([cache.add_sequence() for _ in range(max_seqs)], np.int32)
    for _ in range(total * BS):
        s = ids[rng.integers(max_seqs)]
        if sum(cache.seq_len(int(i)) // BS for i in ids) + ((cache.seq_len(int(s)) + 1) % BS == 0) > total:
            break
        cache.step(np.array([s], np.int32))  # raises HexcoreOOMError if a pool is too small
    cache.check_invariants()


def test_pool_blocks_for_presets_and_bad_values():
    from hexcore.host import pool_blocks_for

    assert pool_blocks_for("int2-aged", 32, 1024, 16) == {"fp16": 16, "int4": 192, "int2": 1024}
    assert pool_blocks_for("int4-aged", 32, 1024, 16) == {"fp16": 32, "int4": 1024}
    assert pool_blocks_for("int4-aged", 32, 20, 16) == {"fp16": 20, "int4": 20}  # never above the total
    for args, match in (((32, 0, 4), "total_blocks"), ((32, 8, 0), "max_seqs"), ((0, 8, 4), "block_size")):
        with pytest.raises(HexcoreInvalidArgumentError, match=match):
            pool_blocks_for("int2-aged", *args)
    with pytest.raises(HexcoreConfigError, match="format"):
        pool_blocks_for("int3", 32, 8, 4)


def _most_blocks_by_lengths(fmt, block_size):
    # the most blocks one sequence holds in each pool, over every length up to past the oldest tier
    from hexcore.host.tiered import block_pools, pool_kinds

    kinds = pool_kinds(fmt, block_size)
    horizon = (fmt.sink_blocks + 2) * block_size + max([t.min_age for t in fmt.tiers], default=0)
    most = np.zeros(len(kinds), np.int64)
    for length in range(horizon + 1):
        most = np.maximum(most, np.bincount(block_pools(fmt, length, block_size), minlength=len(kinds)))
    return most[:-1].tolist()


@pytest.mark.parametrize("fmt", [*FORMATS.values(), AGED3, KVFormat("s3", (AgeTier(0, 4, 4), AgeTier(32, 2, 2)), 3),
                                 KVFormat("y", (AgeTier(48, 4, 4), AgeTier(160, 2, 2)), 2)],
                         ids=lambda f: f.name)
def test_pool_blocks_for_is_the_most_any_length_holds(fmt):
    """pool_blocks_for's closed form equals the most blocks a sequence holds in each bounded
    pool over every length (what it once computed, in O(horizon**2))."""
    from hexcore.host import pool_blocks_for

    sizes = list(pool_blocks_for(fmt, BS, 10**6, 3).values())
    assert sizes[:-1] == [max(1, 3 * m) for m in _most_blocks_by_lengths(fmt, BS)] and sizes[-1] == 10**6


def test_pool_blocks_for_takes_far_ages_and_large_sinks_at_once():
    """A sink of a million blocks or a tier 2**40 tokens old once made pool_blocks_for loop
    over every length up to it (a hang); the sizes come in closed form."""
    from hexcore.host import pool_blocks_for

    assert pool_blocks_for(KVFormat("x", (AgeTier(16, 4, 4),), 10**6), BS, 8, 2) == {"fp16": 8, "int4": 8}
    far = KVFormat("x", (AgeTier(0, 4, 4), AgeTier(2**40, 2, 2)), 1)
    assert pool_blocks_for(far, BS, 2**50, 2) == {"fp16": 2, "int4": 2**37, "int2": 2**50}


@pytest.mark.parametrize("call", ["pool_kinds", "block_pools"])
@pytest.mark.parametrize("fmt", [None, 5, "int4-aged ", "INT8-AGED", object()])
def test_format_helpers_take_a_format_or_its_name_and_nothing_else(call, fmt):
    from hexcore.host import tiered

    fn = getattr(tiered, call)
    args = (64, BS) if call == "block_pools" else (BS,)
    assert np.array_equal(np.asarray(fn("INT4-AGED", *args)), np.asarray(fn(FORMATS["int4-aged"], *args)))
    with pytest.raises(HexcoreConfigError, match="format: expected a KVFormat"):
        fn(fmt, *args)


@pytest.mark.parametrize("block_size", [0, -16, None, 1.5, "16", True, np.zeros(2), [16]])
def test_format_helpers_check_block_size(block_size):
    from hexcore.host.tiered import block_pools, pool_kinds

    assert pool_kinds("int2-aged", np.uint8(16)) == pool_kinds("int2-aged", 16)  # (384 % uint8 once overflowed)
    for fn, args in ((pool_kinds, ()), (block_pools, (64,))):
        with pytest.raises(HexcoreInvalidArgumentError, match="block_size"):
            fn("int4-aged", *args, block_size)


def test_pool_blocks_with_keys_of_other_types_are_typed():
    with pytest.raises(HexcoreInvalidArgumentError, match="pool_blocks: expected a dict with the keys"):
        TieredKVCache(CONFIG, "int4-aged", {"fp16": 8, "int4": 8, None: 1}, 4)  # (sorted() once raised TypeError)


def test_a_format_returning_to_an_earlier_kind_is_a_config_error():
    """INT2, INT4, then INT2 again would need two pools named "int2" in ``pool_blocks`` (and
    pool_blocks_for's dict gave both the last one's size)."""
    back = KVFormat("back", (AgeTier(48, 2, 2), AgeTier(96, 4, 4), AgeTier(160, 2, 2)))
    with pytest.raises(HexcoreConfigError, match="tier 2 returns to int2"):
        TieredKVCache(CONFIG, back, {"fp16": 8, "int2": 8, "int4": 8}, 4)
