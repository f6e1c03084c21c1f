"""Persistent checkpoint-and-yield decode against paged_decode and the float64 reference.

On the simulator a SimulatedClock (every timer read advances it) forces slices to yield
after a few items, so the checkpoint and resume path runs in CI; every item carries a
counter. The `gpu` tests run the same on a real GPU, and check on an H200 that every
launch of a >= 20 ms decode with a 200 us budget ends within the budget plus one item.
"""

import dataclasses
import math

import numpy as np
import pytest
from numba import cuda

from hexcore import HexcoreInvalidArgumentError, KVCacheConfig
from hexcore.cuda import DecodeOptions, paged_decode
from hexcore.cuda.attention.persistent import BudgetError, PersistentDecode, persistent_decode
from hexcore.cuda.timer import SimulatedClock, global_timer_ns, use_clock
from tests import reference as ref
from tests.cuda.fill import random_cache

TOLERANCE = 2e-3
SPLIT = DecodeOptions(ctas_per_sm=64, split_blocks=1)  # one-block splits (items) at the tests' lengths
STEP_NS = 10_000  # each timer read advances the simulated clock 10 us
BUDGET_US = 15  # so the first CTA of a slice takes two items (reads at 0 and 10 us), and the others none


def _run_both(cfg, group, seq_lens, rng, options=SPLIT, **kwargs):
    """(persistent out, stats, paged_decode out, reference) for one random cache."""
    store, tables, tails, keys, values = random_cache(cfg, seq_lens, rng)
    q = rng.standard_normal((len(seq_lens), cfg.num_kv_heads * group, cfg.head_dim)).astype(np.float16)
    lens = np.array(seq_lens, np.int32)
    outs = [cuda.to_device(np.full(q.shape, np.nan, np.float16)) for _ in range(2)]
    paged_decode(q, store, 0, tables, lens, tails, out=outs[0], options=options)
    with use_clock(SimulatedClock(STEP_NS)):
        _, stats = persistent_decode(q, store, 0, tables, lens, tails, out=outs[1], options=options, **kwargs)
    expect = ref.decode_attention(q, keys, values, 1 / math.sqrt(cfg.head_dim))
    return outs[1].copy_to_host(), stats, outs[0].copy_to_host(), expect


SIM_CASES = [  # (kv_dtype, head_dim, block_size, group, seq_lens, group_size): every dtype, MHA/GQA/two head groups
    ("fp16", 64, 16, 1, [37, 0], 64),
    ("int4", 64, 16, 2, [35], 32),
    ("int2", 64, 16, 8, [33], 64),
    ("fp16", 64, 16, 9, [5], 64),
]


@pytest.mark.parametrize("dtype,head_dim,block_size,group,seq_lens,group_size,item",
                         [(*case, "call") for case in SIM_CASES] + [(*SIM_CASES[i], "inline") for i in (1, 3)])
def test_persistent_equals_paged_decode(dtype, head_dim, block_size, group, seq_lens, group_size, item, rng):
    """Same splits, same per-item code (called or inlined): the outputs are bit-identical to
    paged_decode's, whatever the slices, and within tolerance of the reference."""
    cfg = KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=head_dim, block_size=block_size, kv_dtype=dtype,
                        group_size=group_size)
    options = dataclasses.replace(SPLIT, persistent_item=item)
    got, stats, paged, expect = _run_both(cfg, group, seq_lens, rng, options=options, budget_us=BUDGET_US)
    assert not np.isnan(got).any(), "an output element was not written"
    assert np.array_equal(got, paged)
    assert ref.relative_l2(got, expect) <= TOLERANCE
    assert stats.drained and sum(stats.items_per_launch) == stats.items


def test_every_item_once_across_many_yields(rng):
    """A simulated clock that forces a yield every two items: each of the 8 items (2 KV
    heads x 4 one-block splits, a grid of 8 CTAs) is taken exactly once, every slice took
    its last item inside the budget, and the result is right. The simulator runs CTAs one
    after another: in the first slice CTA 0 takes its static item and the 7 later CTAs find
    the budget spent and owe theirs (a CTA never starts an item after the budget, not even
    its static one); the repair slices take them two at a time from the owed list."""
    cfg = KVCacheConfig(num_layers=1, num_kv_heads=2, head_dim=64, block_size=16, kv_dtype="fp16")
    got, stats, paged, expect = _run_both(cfg, 1, [60], rng, budget_us=BUDGET_US, count_items=True)
    assert stats.items == 8 and np.array_equal(stats.item_counts, np.ones(8, np.int32)), stats.item_counts
    assert stats.items_per_launch[:5] == (1, 2, 2, 2, 1) and stats.yields == 4, stats
    assert not any(stats.items_per_launch[5:]), stats
    assert sum(stats.items_per_launch) == stats.items
    assert all(0 <= t < BUDGET_US for t in stats.latest_take_us), stats.latest_take_us
    assert stats.longest_item_us > 0 and stats.longest_launch_us > 0
    assert np.array_equal(got, paged) and ref.relative_l2(got, expect) <= TOLERANCE


# the options of the tests of successive calls: checked first slices (the simulator's
# default), and eager ones on a one-CTA grid (so that a call still takes several slices)
CALL_OPTIONS = [SPLIT, DecodeOptions(ctas_per_sm=1, split_blocks=1, eager_first=True)]


@pytest.mark.parametrize("options", CALL_OPTIONS, ids=["checked", "eager"])
def test_each_slice_leaves_the_state_ready_for_the_next(options, rng):
    """The last CTA out of every slice clears the slice's fields and records the cursor:
    after a run of several slices (and after an abandoned one-slice call, whose owed items
    its LAST slice drops) START, EXITED, the maxima and the owed list's words are zero, SNAP
    is the cursor, DONE the cursor less the call's base (clipped to the call's items; less the
    owed items, which an abandoned call never took),
    LAUNCH the slices of the call; the log's items add up to the call's."""
    from hexcore.cuda.attention import persistent_kernels as p

    cfg = KVCacheConfig(num_layers=1, num_kv_heads=2, head_dim=64, block_size=16, kv_dtype="fp16")
    store, tables, tails, _, _ = random_cache(cfg, [60], rng)
    args = [cuda.to_device(a) for a in (rng.standard_normal((1, 2, 64)).astype(np.float16), tables,
                                        np.array([60], np.int32), tails)]
    plan = PersistentDecode(args[0], store, *args[1:], budget_us=BUDGET_US, max_seq_len=60, options=options)
    assert not plan.one_launch  # the eager case's grid of one CTA: the first slice is no one-launch call
    with use_clock(SimulatedClock(STEP_NS)):
        for slices in (None, 1, None):  # run, an abandoned enqueue, run
            plan.run(0) if slices is None else plan.enqueue(0, slices)
            state, stats = plan._state.copy_to_host(), plan.stats()
            assert (state[[p.START, p.EXITED, p.LONGEST, p.LATEST, p.REPAIR, p.OWED, p.REPAID]] == 0).all(), state
            assert state[p.SNAP] == state[p.CURSOR], state
            handed = min(state[p.CURSOR] - state[p.BASE], plan.num_items)  # owed items are not done
            assert state[p.DONE] == handed if stats.drained else state[p.DONE] < plan.num_items, state
            assert state[p.LAUNCH] == stats.launches == len(stats.items_per_launch), (state, stats)
            assert sum(stats.items_per_launch) == min(state[p.DONE], plan.num_items), (state, stats)
    assert stats.launches >= 4 and stats.drained


# (ctas_per_sm, budget_us, step_ns): grids smaller than the item count (3 of 8, 1 of 4, 2
# of 4) and equal to it (16 of 16); budgets that let the slice's first CTA take 1, 2, 3 or
# every item; a clock that never moves (no yield: static items, then the cursor)
STATIC_CASES = [(3, 15, STEP_NS), (3, 25, STEP_NS), (1, 15, STEP_NS), (2, 5, STEP_NS), (64, 35, STEP_NS),
                (3, 15, 0), (64, 15, 0)]


@pytest.mark.parametrize("ctas_per_sm,budget,step", STATIC_CASES)
def test_static_and_dynamic_items_each_once(ctas_per_sm, budget, step, rng):
    """Every CTA's first item of a normal slice is static (no atomic), later ones come from
    the cursor past the slice's static items, late CTAs owe their static item to a repair
    slice: whatever the grid, budget and clock, every item is taken exactly once
    (``count_items``), no item is taken after its slice's budget, and the output is
    paged_decode's, bit for bit."""
    cfg = KVCacheConfig(num_layers=1, num_kv_heads=2, head_dim=64, block_size=16, kv_dtype="fp16")
    options = DecodeOptions(ctas_per_sm=ctas_per_sm, split_blocks=1)
    store, tables, tails, keys, values = random_cache(cfg, [60, 33], rng)
    q = rng.standard_normal((2, 2, 64)).astype(np.float16)
    lens = np.array([60, 33], np.int32)
    paged = paged_decode(q, store, 0, tables, lens, tails, options=options).copy_to_host()
    out = cuda.to_device(np.full(q.shape, np.nan, np.float16))
    with use_clock(SimulatedClock(step)):
        _, stats = persistent_decode(q, store, 0, tables, lens, tails, out=out, budget_us=budget, options=options,
                                     count_items=True)
    assert np.array_equal(stats.item_counts, np.ones(stats.items, np.int32)), stats.item_counts
    assert stats.drained and sum(stats.items_per_launch) == stats.items, stats
    assert all(t < budget for t in stats.latest_take_us), stats.latest_take_us
    assert np.array_equal(out.copy_to_host(), paged)
    if step == 0:
        assert stats.launches == 1 and stats.yields == 0, stats


# (ctas_per_sm, budget_us, step_ns, items taken by the first slice): a grid of 3 CTAs over 8
# items (CTA 0 takes one item from the cursor after its static one, inside the budget); a grid
# of every item; a clock that never moves (one slice)
EAGER_CASES = [(3, 15, STEP_NS, 4), (3, 5, STEP_NS, 3), (64, 15, STEP_NS, 8), (3, 15, 0, 8)]


@pytest.mark.parametrize("ctas_per_sm,budget,step,first", EAGER_CASES)
def test_eager_first_slice_takes_every_static_item(ctas_per_sm, budget, step, first, rng):
    """``eager_first`` (the GPU's default): the first slice's CTAs take their static items
    without waiting for the slice's start, so on the simulator, whose later CTAs start past
    the budget, none owes its item; later slices take the rest from the cursor and repair
    nothing. Every item once, the output paged_decode's bit for bit, the state cleared."""
    from hexcore.cuda.attention import persistent_kernels as p

    cfg = KVCacheConfig(num_layers=1, num_kv_heads=2, head_dim=64, block_size=16, kv_dtype="int4", group_size=32)
    options = DecodeOptions(ctas_per_sm=ctas_per_sm, split_blocks=2, eager_first=True)
    store, tables, tails, keys, values = random_cache(cfg, [60, 33], rng)
    q = rng.standard_normal((2, 2, 64)).astype(np.float16)
    lens = np.array([60, 33], np.int32)
    paged = paged_decode(q, store, 0, tables, lens, tails, options=options).copy_to_host()
    args = [cuda.to_device(a) for a in (q, tables, lens, tails)]
    plan = PersistentDecode(args[0], store, *args[1:], budget_us=budget, max_seq_len=60, options=options,
                            count_items=True)
    assert plan.num_items == 8 and plan._first == p.FIRST | p.EAGER
    plan.out.copy_to_device(np.full(q.shape, np.nan, np.float16))
    with use_clock(SimulatedClock(step)):
        plan.run(0)
        stats = plan.stats()
    assert stats.items_per_launch[0] == first and stats.drained, stats
    assert np.array_equal(stats.item_counts, np.ones(8, np.int32)), stats.item_counts
    assert all(t < budget for t in stats.latest_take_us[1:]), stats.latest_take_us
    state = plan._state.copy_to_host()
    assert (state[[p.START, p.EXITED, p.REPAIR, p.OWED, p.REPAID]] == 0).all(), state
    assert np.array_equal(plan.out.copy_to_host(), paged)
    assert ref.relative_l2(paged, ref.decode_attention(q, keys, values, 1 / 8)) <= TOLERANCE


def test_eager_first_defaults_to_the_gpu_only():
    """None: eager on a GPU with the grid at the occupancy (``ctas_per_sm`` unset), where a
    slice's CTAs start together; checked with ``ctas_per_sm`` set and on the simulator."""
    from hexcore.cuda.attention import persistent_kernels as p
    from hexcore.cuda.device import SIMULATOR

    cfg = KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=64, block_size=16)
    args = [cuda.to_device(a) for a in (np.zeros((1, 1, 64), np.float16), np.zeros((1, 1), np.int32),
                                        np.array([3], np.int32), np.array([0], np.int32))]
    for eager, ctas, flags in ((None, None, p.FIRST if SIMULATOR else p.FIRST | p.EAGER), (None, 2, p.FIRST),
                               (False, None, p.FIRST), (True, 2, p.FIRST | p.EAGER)):
        plan = PersistentDecode(args[0], _store(cfg), *args[1:], budget_us=100,
                                options=DecodeOptions(eager_first=eager, ctas_per_sm=ctas))
        assert plan._first == flags, (eager, ctas)
        assert plan.one_launch == bool(flags & p.EAGER), (eager, ctas)  # one item, a grid of one


@pytest.mark.parametrize("budget,taken", [(15, (2, 2, 2, 2)), (25, (3, 3, 2))])
def test_static_items_late_ctas_and_repair_slices(budget, taken, rng):
    """8 items on a grid of 3 CTAs, the simulator running them in order: in a normal slice
    CTA 0 takes its static item, then items past the grid's static ones from the cursor
    while the budget lasts; CTAs 1 and 2 start late and owe theirs; the next slice repairs
    them (from the owed list, then the cursor). With budget 25 the third slice, a normal one,
    starts at item 6 and no CTA takes from the cursor (no item past the static ones): CTA 0
    takes item 6 and leaves (two clock readings), so CTA 1 starts inside the budget and
    takes 7, and CTA 2's static item (8) is past the call's items, neither taken nor owed."""
    from hexcore.cuda.attention import persistent_kernels as p

    cfg = KVCacheConfig(num_layers=1, num_kv_heads=2, head_dim=64, block_size=16, kv_dtype="fp16")
    options = DecodeOptions(ctas_per_sm=3, split_blocks=2)  # two splits of 2 blocks per (sequence, head)
    store, tables, tails, keys, values = random_cache(cfg, [60, 33], rng)
    q = rng.standard_normal((2, 2, 64)).astype(np.float16)
    args = [cuda.to_device(a) for a in (q, tables, np.array([60, 33], np.int32), tails)]
    plan = PersistentDecode(args[0], store, *args[1:], budget_us=budget, max_seq_len=60, options=options,
                            count_items=True)
    assert plan.num_items == 8 and plan._sized[1] == 3
    with use_clock(SimulatedClock(STEP_NS)):
        plan.enqueue(0, slices=6)
        stats = plan.stats()
    assert stats.items_per_launch == taken + (0,) * (6 - len(taken)) and stats.drained, stats
    assert np.array_equal(stats.item_counts, np.ones(8, np.int32)), stats.item_counts
    state = plan._state.copy_to_host()
    assert (state[[p.REPAIR, p.OWED, p.REPAID]] == 0).all(), state
    expect = ref.decode_attention(q, keys, values, 1 / 8)
    assert ref.relative_l2(plan.out.copy_to_host(), expect) <= TOLERANCE


def test_fixed_slices_report_whether_they_drained(rng):
    """``enqueue`` (the capture-safe form) runs a fixed number of slices; too few leave the
    queue undrained and say so, enough give the full result; a second call resets the queue."""
    cfg = KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=64, block_size=16, kv_dtype="fp16")
    store, tables, tails, keys, values = random_cache(cfg, [60], rng)
    q = rng.standard_normal((1, 1, 64)).astype(np.float16)
    args = [cuda.to_device(a) for a in (q, tables, np.array([60], np.int32), tails)]
    plan = PersistentDecode(args[0], store, *args[1:], budget_us=BUDGET_US, max_seq_len=60, options=SPLIT,
                            count_items=True)
    with use_clock(SimulatedClock(STEP_NS)):
        plan.enqueue(0, slices=1)
        short = plan.stats()
        plan.enqueue(0, slices=plan.num_items + 1)  # a slice takes at least one item
        full = plan.stats()
    assert not short.drained and short.launches == 1 and short.yields == 1
    assert full.drained and full.launches == plan.num_items + 1 and full.items_per_launch[-1] == 0
    assert np.array_equal(full.item_counts, np.ones(plan.num_items, np.int32))
    expect = ref.decode_attention(q, keys, values, 1 / 8)
    assert ref.relative_l2(plan.out.copy_to_host(), expect) <= TOLERANCE


@pytest.mark.parametrize("options", CALL_OPTIONS, ids=["checked", "eager"])
def test_calls_follow_one_another_without_a_reset(options, rng):
    """No reset launch between calls (the base is the cursor's device-side snapshot): run,
    an abandoned enqueue (too few slices), run again, each with a new query: every run is
    right, its base is the snapshot the call before left, and no reset was launched."""
    from hexcore.cuda.attention import persistent_kernels as p

    store, q, args, keys, values = _one_sequence_of_40(rng)
    plan = PersistentDecode(q, store, *args, budget_us=BUDGET_US, max_seq_len=40, options=options)
    with use_clock(SimulatedClock(STEP_NS)):
        for call in ("run", "abandon", "run"):
            q_host = rng.standard_normal((1, 1, 64)).astype(np.float16)
            q.copy_to_device(q_host)
            plan.out.copy_to_device(np.full((1, 1, 64), np.nan, np.float16))
            snap = plan._state.copy_to_host()[p.SNAP]
            if call == "abandon":
                plan.enqueue(0, slices=1)
                assert not plan.stats().drained
                continue
            plan.run(0)
            stats = plan.stats()
            assert stats.drained and sum(stats.items_per_launch) == stats.items == 3 and stats.yields >= 1, stats
            assert plan._state.copy_to_host()[p.BASE] == snap, (call, snap)
            expect = ref.decode_attention(q_host, keys, values, 1 / 8)
            assert ref.relative_l2(plan.out.copy_to_host(), expect) <= TOLERANCE, call
    assert plan.resets == 0


def test_one_launch_calls_leave_the_queue_where_it_was(rng):
    """Where an eager first slice's grid is one CTA an item (``ONESHOT``), ``run`` and a
    one-slice ``enqueue`` are that one launch, with no state read, atomic or last CTA out:
    the cursor and ``SNAP`` stay (the call took no cursor value), so the next call's base is
    the same; the stats come from the CTAs' start and end records (three CTAs one after
    another, two readings each, 10 us apart). A two-slice ``enqueue`` in between runs the
    normal protocol from that snapshot (its last CTA out reads it: the eager slice has no
    base). A bare later slice after a one-launch call finds no item: with a new query, the
    output stays the call's; it marks the plan, so the next call resets first. A one-launch
    call leaves nothing owed, whatever it found (stale owed words are planted before one).
    Every call is right."""
    from hexcore.cuda.attention import persistent_kernels as p

    store, q, args, keys, values = _one_sequence_of_40(rng)
    options = DecodeOptions(ctas_per_sm=64, split_blocks=1, eager_first=True)
    plan = PersistentDecode(q, store, *args, budget_us=BUDGET_US, max_seq_len=40, options=options)
    assert plan.one_launch and plan.num_items == plan._sized[1] == 3
    with use_clock(SimulatedClock(STEP_NS)):
        for call in ("run", "enqueue 1", "enqueue 2", "run", "bare"):
            if call == "enqueue 1":  # stale owed words, which the call must clear
                planted = plan._state.copy_to_host()
                planted[[p.REPAIR, p.OWED, p.REPAID]] = (2, 2, 1)
                plan._state.copy_to_device(planted)
            before, kept = plan._state.copy_to_host(), plan.out.copy_to_host()
            q_host = rng.standard_normal((1, 1, 64)).astype(np.float16)
            q.copy_to_device(q_host)
            if call == "bare":
                plan.launches(0)[1].run(0)
                assert np.array_equal(plan.out.copy_to_host(), kept)
                expect = kept
            else:
                plan.out.copy_to_device(np.full((1, 1, 64), np.nan, np.float16))
                plan.run(0) if call == "run" else plan.enqueue(0, int(call[-1]))
                expect = ref.decode_attention(q_host, keys, values, 1 / 8)
            stats, state = plan.stats(), plan._state.copy_to_host()
            assert stats.drained and sum(stats.items_per_launch) == 3 and stats.yields == 0, (call, stats)
            assert ref.relative_l2(plan.out.copy_to_host(), expect) <= TOLERANCE, call
            if call in ("run", "enqueue 1"):
                assert state[p.SHOT] == 1 and state[p.LAUNCH] == 1 and state[p.DONE] == 3, (call, state)
                assert (state[[p.REPAIR, p.OWED, p.REPAID]] == 0).all(), (call, state)
                assert state[p.BASE] == p.DRAINED_BASE and state[p.SNAP] == state[p.CURSOR] == before[p.SNAP]
                assert stats.launch_us == (50.0,) and stats.longest_item_us == 10.0, stats
                assert stats.latest_take_us == (40.0,) and stats.items_per_launch == (3,), stats
            elif call == "enqueue 2":
                assert state[p.SHOT] == 0 and state[p.BASE] == before[p.SNAP], (state, before)
                assert state[p.SNAP] == before[p.SNAP] + 6 and stats.items_per_launch == (3, 0), (state, stats)
            else:  # the bare slice: the one-launch call's row (CTA 0's view), then its own, empty
                assert state[p.SHOT] == 0 and stats.launches == 2 and stats.items_per_launch == (3, 0), stats
                assert state[p.SNAP] == before[p.SNAP] + 3, (state, before)
        assert (state[[p.START, p.EXITED, p.LONGEST, p.LATEST, p.REPAIR, p.OWED, p.REPAID]] == 0).all(), state
        assert plan.resets == 0
        q_host = rng.standard_normal((1, 1, 64)).astype(np.float16)
        q.copy_to_device(q_host)
        plan.run(0)
    assert plan.resets == 1
    assert ref.relative_l2(plan.out.copy_to_host(), ref.decode_attention(q_host, keys, values, 1 / 8)) <= TOLERANCE


@pytest.mark.parametrize("budget", [0, -5, float("nan"), float("inf"), 2e6, True, "100", None])
def test_bad_budgets_raise_before_launch(budget):
    cfg = KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=64, block_size=16)
    store = _store(cfg)
    out = cuda.to_device(np.full((1, 1, 64), np.nan, np.float16))
    with pytest.raises(BudgetError, match="budget_us"):
        persistent_decode(np.zeros((1, 1, 64), np.float16), store, 0, np.zeros((1, 1), np.int32),
                          np.array([3], np.int32), np.array([0], np.int32), budget_us=budget, out=out)
    assert np.isnan(out.copy_to_host()).all()


def test_budget_below_one_item_names_the_item_time():
    cfg = KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=64, block_size=16)
    with pytest.raises(BudgetError, match="below one work item"):
        persistent_decode(np.zeros((1, 1, 64), np.float16), _store(cfg), 0, np.zeros((1, 1), np.int32),
                          np.array([3], np.int32), np.array([0], np.int32), budget_us=1e-6)
    assert issubclass(BudgetError, HexcoreInvalidArgumentError)


def test_other_bad_arguments_are_paged_decodes_errors():
    cfg = KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=64, block_size=16)
    with pytest.raises(HexcoreInvalidArgumentError, match="layer"):
        persistent_decode(np.zeros((1, 1, 64), np.float16), _store(cfg), 3, np.zeros((1, 1), np.int32),
                          np.array([3], np.int32), np.array([0], np.int32), budget_us=100)
    with pytest.raises(HexcoreInvalidArgumentError, match="host numpy array"):
        PersistentDecode(np.zeros((1, 1, 64), np.float16), _store(cfg), cuda.to_device(np.zeros((1, 1), np.int32)),
                         cuda.to_device(np.array([3], np.int32)), cuda.to_device(np.array([0], np.int32)), 100)


def test_simulated_clock_drives_the_timer():
    @cuda.jit
    def read(out):
        out[cuda.threadIdx.x] = global_timer_ns()

    out = cuda.to_device(np.zeros(2, np.int64))
    with use_clock(SimulatedClock(5, start_ns=100)) as clock:
        read[1, 2](out)
    assert sorted(out.copy_to_host()) == [105, 110] and clock.reads == 2


def test_slice_kernel_takes_the_grid_launchs_register_cap(monkeypatch):
    """The slice kernel is compiled at the register cap of the grid launch it stands for:
    uncapped where that launch took the uncapped kernel (splits within one wave: B=1), the
    default cap where it did not: the items fill the GPU (512 items, 396 resident) or, for
    FP16, ``ctas_per_sm`` is set; an explicit ``max_registers`` as given."""
    from hexcore.cuda.attention import launcher
    from hexcore.cuda.attention.persistent_kernels import persistent_kernel
    from hexcore.cuda.attention.shape import DecodeShape

    monkeypatch.setattr(launcher, "_num_sms", lambda: 132)
    monkeypatch.setattr(launcher, "_ctas_per_sm", lambda kernel, args: 3)
    for dtype, batch, options, want in (("int4", 1, DecodeOptions(), 255), ("int2", 1, DecodeOptions(), 255),
                                        ("int4", 64, DecodeOptions(), None), ("fp16", 1, DecodeOptions(), 255),
                                        ("fp16", 64, DecodeOptions(), None),
                                        ("fp16", 1, DecodeOptions(ctas_per_sm=3), None),
                                        ("int4", 1, DecodeOptions(ctas_per_sm=3), 255),
                                        ("int4", 1, DecodeOptions(max_registers=128), 128)):
        cfg = KVCacheConfig(num_layers=1, num_kv_heads=8, head_dim=64, block_size=16, kv_dtype=dtype)
        shape = DecodeShape(cfg.kv_dtype.bits, 8, 64, 16, 4, cfg.group_size)
        q, tables, lens, slots = (cuda.to_device(a) for a in (
            np.zeros((batch, 32, 64), np.float16), np.zeros((batch, 1), np.int32), np.full(batch, 3, np.int32),
            np.zeros(batch, np.int32)))
        decode = PersistentDecode(q, _store(cfg), tables, lens, slots, 100, max_seq_len=3, options=options)
        expect = persistent_kernel(shape, want, "none", True, False, "inline", True)
        assert decode._sized[0] is expect, (dtype, batch, options.max_registers, want)
        reset, slice_launch = decode.launches(0)
        assert slice_launch.dependent and expect.waits_for_prior_grids and not reset.dependent
    plain = PersistentDecode(q, _store(cfg), tables, lens, slots, 100, max_seq_len=3,
                             options=DecodeOptions(dependent_launch=False))
    assert not plain.launches(0)[1].dependent and not plain._sized[0].waits_for_prior_grids


@pytest.mark.parametrize("batch, want", [(33, 255), (40, 168)])
def test_an_uncapped_slice_kernel_whose_items_take_two_rounds_is_capped(monkeypatch, batch, want):
    """Where the uncapped slice kernel holds fewer CTAs an SM than the grid kernel (2 against
    3 here, as INT2 and FP16 at D=128 G=4 on sm_90) and the items outnumber them (40 * 8 =
    320 items against 264 slots), the slice kernel is compiled at ``registers_keeping`` the
    grid kernel's 3 (168); where they fit (33 * 8 = 264), it stays uncapped. With an eager
    first slice both calls are one launch (the items fit the slice grid), and the one-launch
    kernel takes the slice kernel's cap, so its CTAs fit as the slice kernel's did."""
    from hexcore.cuda.attention import launcher
    from hexcore.cuda.attention.persistent_kernels import oneshot_kernel, persistent_kernel
    from hexcore.cuda.attention.shape import DecodeShape

    cfg = KVCacheConfig(num_layers=1, num_kv_heads=8, head_dim=64, block_size=16, kv_dtype="int2")
    shape = DecodeShape(cfg.kv_dtype.bits, 8, 64, 16, 4, cfg.group_size)
    uncapped = persistent_kernel(shape, 255, "none", True, False, "inline", True)
    monkeypatch.setattr(launcher, "_num_sms", lambda: 132)
    monkeypatch.setattr(launcher, "_ctas_per_sm", lambda kernel, args: 2 if kernel is uncapped else 3)
    q, tables, lens, slots = (cuda.to_device(a) for a in (
        np.zeros((batch, 32, 64), np.float16), np.zeros((batch, 1), np.int32), np.full(batch, 3, np.int32),
        np.zeros(batch, np.int32)))
    decode = PersistentDecode(q, _store(cfg), tables, lens, slots, 100, max_seq_len=3)
    assert decode.num_items == 8 * batch
    assert decode._sized[0] is persistent_kernel(shape, want, "none", True, False, "inline", True)
    assert not decode.one_launch and decode._oneshot_kernel is None
    eager = PersistentDecode(q, _store(cfg), tables, lens, slots, 100, max_seq_len=3,
                             options=DecodeOptions(eager_first=True))
    assert eager.one_launch and eager._oneshot_kernel is oneshot_kernel(shape, want, "none", True, False, True)
    assert eager._oneshot_kernel.waits_for_prior_grids


@pytest.mark.parametrize("ctas_per_sm, registers", [(1, 255), (2, 255), (3, 168), (4, 128), (5, 96), (8, 64)])
def test_registers_keeping_an_occupancy(ctas_per_sm, registers):
    """The cap that keeps ``ctas_per_sm`` CTAs of 128 threads on a 64k-register SM: a
    multiple of 8 (the allocation unit) at most 255, and one unit more would not fit."""
    from hexcore.cuda.attention.persistent import REGISTERS_PER_SM, registers_keeping

    assert registers_keeping(ctas_per_sm) == registers
    assert registers == 255 or ctas_per_sm * 128 * (registers + 8) > REGISTERS_PER_SM


def test_a_call_after_bare_slices_resets_first(rng):
    """Slices run from ``launches()`` are the caller's: they may stop undrained and leave the
    plan's queue and the workspace's merge counters mid-call. Running one marks the plan
    and the workspace's record of its counters, so the next call on either resets first,
    whichever plan makes it (two plans here share a workspace); handing the launches out
    alone costs no reset."""
    from hexcore.cuda.attention.launcher import Workspace

    store, q, args, keys, values = _one_sequence_of_40(rng)
    workspace = Workspace()
    plans = [PersistentDecode(q, store, *args, budget_us=BUDGET_US, max_seq_len=40, options=SPLIT,
                              workspace=workspace) for _ in range(2)]
    with use_clock(SimulatedClock(STEP_NS)):
        reset, bare = plans[0].launches(0)
        for plan, call in ((0, "run"), (None, "reset, bare"), (1, "run"), (None, "bare"), (0, "enqueue")):
            q_host = rng.standard_normal((1, 1, 64)).astype(np.float16)  # each call its own query
            q.copy_to_device(q_host)
            if plan is None:
                if call == "reset, bare":
                    reset.run()
                bare.run()  # a slice of the first plan's call of three items
                assert workspace.has_mid_call
                assert plans[0].stats().drained == (call == "bare"), call  # the first one slice: undrained
                continue
            plan = plans[plan]
            plan.out.copy_to_device(np.full((1, 1, 64), np.nan, np.float16))
            plan.run(0) if call == "run" else plan.enqueue(0, slices=plan.num_items + 1)
            assert plan.stats().drained and not workspace.has_mid_call, call
            expect = ref.decode_attention(q_host, keys, values, 1 / 8)
            assert ref.relative_l2(plan.out.copy_to_host(), expect) <= TOLERANCE, call
    assert [plan.resets for plan in plans] == [1, 1]


def test_a_plan_left_mid_call_resets_after_another_plan_ran(rng):
    """The plan's own state is marked too, not only the shared merge counters: a plan whose
    bare slice stopped mid-call resets on its next call even after another plan on the same
    counters ran (and reset them) in between. Without the plan's own mark its next call ran
    on its stale owed list and overflowed it: past the state array before the one-launch
    call's records followed the list (an IndexError on the simulator), into those records
    since (silently: the reset count is what shows it)."""
    from hexcore.cuda.attention.launcher import Workspace

    store, q, args, keys, values = _one_sequence_of_40(rng)
    workspace = Workspace()
    plans = [PersistentDecode(q, store, *args, budget_us=BUDGET_US, max_seq_len=40, options=SPLIT,
                              workspace=workspace) for _ in range(2)]
    assert plans[0]._partials[2] is plans[1]._partials[2]  # one set of merge counters
    with use_clock(SimulatedClock(STEP_NS)):
        reset, bare = plans[0].launches(0)
        reset.run()
        bare.run()
        assert not plans[0].stats().drained  # the first plan's call left mid-way
        for plan in (plans[1], plans[0]):
            q_host = rng.standard_normal((1, 1, 64)).astype(np.float16)
            q.copy_to_device(q_host)
            plan.out.copy_to_device(np.full((1, 1, 64), np.nan, np.float16))
            plan.run(0)
            expect = ref.decode_attention(q_host, keys, values, 1 / 8)
            assert ref.relative_l2(plan.out.copy_to_host(), expect) <= TOLERANCE
    assert [plan.resets for plan in plans] == [1, 1] and not workspace.has_mid_call


@pytest.mark.parametrize("entry", ["DecodePlan", "paged_decode"])
def test_a_decode_after_a_persistent_call_left_mid_call_is_right(entry, rng):
    """``paged_decode`` and a ``DecodePlan`` on a workspace whose merge counters a persistent
    call left mid-merge (a bare slice here) zero them first, so their merges are right; the
    persistent plan still resets on its next call (its own mark)."""
    from hexcore.cuda import DecodePlan, paged_decode
    from hexcore.cuda.attention import launcher

    store, q, args, keys, values = _one_sequence_of_40(rng)
    workspace = launcher._workspace if entry == "paged_decode" else launcher.Workspace()
    plan = PersistentDecode(q, store, *args, budget_us=BUDGET_US, max_seq_len=40, options=SPLIT,
                            workspace=workspace)
    decode = DecodePlan(q, store, *args, max_seq_len=40, options=SPLIT, workspace=workspace)
    assert workspace.get(1, 3, 64, 1)[2] is plan._partials[2]  # the decode's counters (3 splits of 1 item)
    calls = {"DecodePlan": lambda: decode.run(0),
             "paged_decode": lambda: paged_decode(q, store, 0, *args, out=decode.out, max_seq_len=40, options=SPLIT)}
    with use_clock(SimulatedClock(STEP_NS)):
        reset, bare = plan.launches(0)
        reset.run()
        bare.run()
        assert not plan.stats().drained and workspace.is_mid_call(plan._partials[2])
        for call in (calls[entry], lambda: plan.run(0)):
            q_host = rng.standard_normal((1, 1, 64)).astype(np.float16)
            q.copy_to_device(q_host)
            for out in (decode.out, plan.out):
                out.copy_to_device(np.full((1, 1, 64), np.nan, np.float16))
            got = call().copy_to_host()
            expect = ref.decode_attention(q_host, keys, values, 1 / 8)
            assert ref.relative_l2(got, expect) <= TOLERANCE
            assert not workspace.is_mid_call(plan._partials[2])
    assert plan.resets == 1


def test_an_enqueue_cut_short_between_slices_is_marked(rng, monkeypatch):
    """An ``enqueue`` whose later slice fails to launch (here its preparation raises) leaves
    the call mid-way: the plan and the workspace are marked, so the next call resets first
    and is right."""
    from hexcore.cuda.attention import persistent_kernels as p

    store, q, args, keys, values = _one_sequence_of_40(rng)
    plan = PersistentDecode(q, store, *args, budget_us=BUDGET_US, max_seq_len=40, options=SPLIT)
    slice_of = plan._slice

    def failing(layer, flags):
        if flags & p.LAST:
            raise RuntimeError("launch failed")
        return slice_of(layer, flags)

    with use_clock(SimulatedClock(STEP_NS)):
        monkeypatch.setattr(plan, "_slice", failing)
        with pytest.raises(RuntimeError, match="launch failed"):
            plan.enqueue(0, slices=2)
        monkeypatch.undo()
        assert plan._mid_call and plan._workspace.is_mid_call(plan._partials[2]) and not plan.stats().drained
        q_host = rng.standard_normal((1, 1, 64)).astype(np.float16)
        q.copy_to_device(q_host)
        plan.out.copy_to_device(np.full((1, 1, 64), np.nan, np.float16))
        plan.run(0)
    assert plan.resets == 1 and not plan._mid_call and not plan._workspace.is_mid_call(plan._partials[2])
    assert ref.relative_l2(plan.out.copy_to_host(), ref.decode_attention(q_host, keys, values, 1 / 8)) <= TOLERANCE


@pytest.mark.parametrize("wide", [False, True])
def test_a_bare_slice_right_after_a_one_launch_call_takes_no_item(wide, rng):
    """From a fresh plan: a one-launch call, then a bare later slice. The call left ``BASE``
    at ``DRAINED_BASE``, so the slice finds every item taken: its log row is empty and every
    item was counted once (without that store it counted -2 items). Also after a wide call,
    whose slice grid (one CTA) is smaller than its 24 items: the slice leaves ``DONE`` the
    items (counted from its grid, it said 1 of 24 done: rows (24, -23), not drained)."""
    if wide:
        store, q, args, _, _ = _wide_case(rng)
        options, items = WIDE, 24
    else:
        store, q, args, keys, values = _one_sequence_of_40(rng)
        options, items = DecodeOptions(ctas_per_sm=64, split_blocks=1, eager_first=True), 3
    plan = PersistentDecode(q, store, *args, budget_us=BUDGET_US, max_seq_len=40, options=options,
                            count_items=True)
    assert plan.one_launch and plan._wide == wide
    with use_clock(SimulatedClock(STEP_NS)):
        plan.run(0)
        plan.launches(0)[1].run()
        stats = plan.stats()
    assert stats.items_per_launch == (items, 0) and stats.drained and stats.yields == 0, stats
    assert np.array_equal(stats.item_counts, np.ones(items, np.int32)), stats.item_counts


@pytest.mark.parametrize("split_blocks,budget_us,splits", [(2, BUDGET_US, 2), (8, 0.1, 3)])
def test_a_one_launch_call_runs_the_grid_kernels_items_over_its_grid(split_blocks, budget_us, splits, rng):
    """A one-launch call runs ``oneshot_kernel`` over the grid kernel's grid (splits, KV
    heads x head groups, batch), not the slice kernel: here ``splits`` x (2 KV heads x 2 head
    groups) x 2 sequences. The splits are the plan's: a budget of 0.1 us cuts the grid
    launch's one split of up to 8 blocks to three of one. Each CTA's item is its linear
    index (split fastest, as the queue numbers them): every item is counted once, and the
    records come in the simulator's CTA order (``np.ndindex`` over the grid: z fastest; each
    CTA reads the clock twice), so an index that took the grid's dimensions in another
    order fails. The output is, bit for bit, that of ``paged_decode`` at the plan's split
    size (one block where the budget cut it: the same splits, so the same merge)."""
    from hexcore.cuda.attention import persistent_kernels as p

    cfg = KVCacheConfig(num_layers=1, num_kv_heads=2, head_dim=64, block_size=16, kv_dtype="int4", group_size=32)
    store, tables, tails, keys, values = random_cache(cfg, [40, 17], rng)
    q_host = rng.standard_normal((2, 18, 64)).astype(np.float16)
    lens = np.array([40, 17], np.int32)
    options = DecodeOptions(ctas_per_sm=64, split_blocks=split_blocks, eager_first=True)
    q, args = cuda.to_device(q_host), [cuda.to_device(a) for a in (tables, lens, tails)]
    plan = PersistentDecode(q, store, *args, budget_us=budget_us, max_seq_len=40, options=options,
                            count_items=True)
    items = splits * 4 * 2
    assert plan.one_launch and plan.num_items == plan._sized[1] == items, (plan.num_items, plan._sized)
    same_splits = DecodeOptions(ctas_per_sm=64, split_blocks=plan._sized[2])
    paged = paged_decode(q_host, store, 0, tables, lens, tails, options=same_splits).copy_to_host()
    with use_clock(SimulatedClock(STEP_NS)):
        plan.run(0)
    launch = plan._slice(0, plan._first | p.ONESHOT | p.LAST)
    assert launch._dispatcher is plan._oneshot_kernel and launch.grid == (splits, 4, 2), launch.grid
    stats, state = plan.stats(), plan._state.copy_to_host()
    assert np.array_equal(stats.item_counts, np.ones(items, np.int32)), stats.item_counts
    starts, ends = (state[p.STATE_WORDS + k * items:p.STATE_WORDS + (k + 1) * items] for k in (1, 2))
    assert (ends > starts).all(), (starts, ends)
    j = np.arange(items)  # item j = (split x, row y, sequence z); the simulator runs z fastest
    ran = (j % splits * 4 + j // splits % 4) * 2 + j // (4 * splits)
    assert np.array_equal(np.argsort(np.argsort(starts)), ran), (starts, ran)
    assert stats.launches == 1 and stats.items_per_launch == (items,) and stats.drained, stats
    assert np.array_equal(plan.out.copy_to_host(), paged)
    assert ref.relative_l2(paged, ref.decode_attention(q_host, keys, values, 1 / 8)) <= TOLERANCE


def _wide_case(rng):
    """(store, q, device args, host q, (tables, lens, tails, keys, values)): 2 sequences (40 and 17 tokens) x 2 KV heads x
    2 head groups of INT4, for the wide one-launch tests: at one block a split, 3 x 4 x 2 = 24
    items on the simulator's grid of one resident CTA (``ctas_per_sm=1``)."""
    cfg = KVCacheConfig(num_layers=1, num_kv_heads=2, head_dim=64, block_size=16, kv_dtype="int4", group_size=32)
    store, tables, tails, keys, values = random_cache(cfg, [40, 17], rng)
    q_host = rng.standard_normal((2, 18, 64)).astype(np.float16)
    lens = np.array([40, 17], np.int32)
    q, args = cuda.to_device(q_host), [cuda.to_device(a) for a in (tables, lens, tails)]
    return store, q, args, q_host, (tables, lens, tails, keys, values)


WIDE = DecodeOptions(ctas_per_sm=1, split_blocks=1, wide_one_launch=True)


def test_a_call_the_model_puts_well_within_its_budget_is_one_wide_launch(rng):
    """``wide_one_launch``: 24 items outnumber the one resident CTA, but the item model puts
    the whole call (24 rounds of a one-block item) far inside a quarter of the budget, so the
    call is one launch of ``oneshot_kernel`` over every item, with no slice: each item
    counted once, the state's records sized for them, the output bit for bit
    ``paged_decode``'s at the same splits; ``item_times`` gives the records' words as they are
    (starts, then ends) in queue order (split fastest over the grid; the simulator runs z
    fastest, each CTA reading the clock twice) with the plan's splits. A 12-slice ``enqueue``
    of the same plan runs the slice protocol on the one resident CTA instead, is right too,
    and leaves no item times."""
    from hexcore.cuda.attention import persistent as pd, persistent_kernels as p

    store, q, args, q_host, (tables, lens, tails, keys, values) = _wide_case(rng)
    plan = PersistentDecode(q, store, *args, budget_us=BUDGET_US, max_seq_len=40, options=WIDE, count_items=True)
    call_us = plan._sized[5]
    assert 0 < call_us <= pd.ITEM_SHARE * BUDGET_US, call_us
    assert plan.one_launch and plan._first == p.FIRST, plan._first  # wide, though the first slice is not eager
    assert plan.num_items == 24 and plan._sized[1] == 1, plan._sized  # (a multi-slice enqueue's grid: 1)
    assert plan._state.shape[0] == p.STATE_WORDS + 3 * 24  # the records: a word each per item
    with use_clock(SimulatedClock(STEP_NS)):  # 48 clock reads: 480 us of simulated time, no check
        plan.run(0)
    launch = plan._slice(0, plan._first | p.ONESHOT | p.LAST)
    assert launch._dispatcher is plan._oneshot_kernel and launch.grid == (3, 4, 2), launch.grid
    stats = plan.stats()
    assert np.array_equal(stats.item_counts, np.ones(24, np.int32)), stats.item_counts
    assert stats.launches == 1 and stats.items_per_launch == (24,) and stats.drained, stats
    # the log row from the 24 CTAs' records (two clock reads each, 10 us apart, in order)
    assert stats.launch_us == (470.0,) and stats.longest_item_us == 10.0, stats
    assert stats.latest_take_us == (460.0,), stats
    times, state, at = plan.item_times(), plan._state.copy_to_host(), p.STATE_WORDS + 24
    assert times.splits == 3 and np.array_equal(times.starts, state[at:at + 24]), times
    assert np.array_equal(times.ends, state[at + 24:at + 48]) and (times.ends - times.starts == STEP_NS).all(), times
    j = np.arange(24)  # item j = (split x, row y, sequence z); the simulator runs z fastest
    assert np.array_equal(np.argsort(np.argsort(times.starts)), (j % 3 * 4 + j // 3 % 4) * 2 + j // 12), times
    paged = paged_decode(q_host, store, 0, tables, lens, tails,
                         options=DecodeOptions(ctas_per_sm=64, split_blocks=1)).copy_to_host()
    assert np.array_equal(plan.out.copy_to_host(), paged)
    assert ref.relative_l2(paged, ref.decode_attention(q_host, keys, values, 1 / 8)) <= TOLERANCE
    # a multi-slice enqueue keeps the normal protocol on the resident grid: two items a slice
    plan.out.copy_to_device(np.full(q_host.shape, np.nan, np.float16))
    with use_clock(SimulatedClock(STEP_NS)):
        plan.enqueue(0, 12)
    stats = plan.stats()
    assert plan._slice(0, plan._first).grid == (1, 1, 1), plan._slice(0, plan._first).grid
    assert stats.launches == 12 and stats.items_per_launch == (2,) * 12 and stats.drained, stats
    assert np.array_equal(stats.item_counts, np.ones(24, np.int32)), stats.item_counts
    assert np.array_equal(plan.out.copy_to_host(), paged) and plan.item_times() is None


@pytest.mark.parametrize("share,wide", [(0.99, False), (1.01, True)])
def test_a_wide_launch_needs_the_whole_call_within_a_quarter_of_the_budget(share, wide, rng):
    """At a budget just under the model's whole-call time over ``ITEM_SHARE`` the call runs in
    slices (the one resident CTA takes the items, yielding as the simulated clock passes
    the budget), just over it in one wide launch; both outputs are ``paged_decode``'s."""
    from hexcore.cuda.attention import persistent as pd

    store, q, args, q_host, (tables, lens, tails, _, _) = _wide_case(rng)
    call_us = PersistentDecode(q, store, *args, budget_us=BUDGET_US, max_seq_len=40, options=WIDE)._sized[5]
    budget = call_us / pd.ITEM_SHARE * share
    plan = PersistentDecode(q, store, *args, budget_us=budget, max_seq_len=40, options=WIDE, count_items=True)
    assert plan._sized[5] == call_us and plan.one_launch == wide and plan._sized[1] == 1
    with use_clock(SimulatedClock(STEP_NS)):
        plan.run(0)
    stats = plan.stats()
    assert np.array_equal(stats.item_counts, np.ones(24, np.int32)) and stats.drained, stats
    assert (stats.launches == 1) == wide, stats.launches
    paged = paged_decode(q_host, store, 0, tables, lens, tails,
                         options=DecodeOptions(ctas_per_sm=64, split_blocks=1)).copy_to_host()
    assert np.array_equal(plan.out.copy_to_host(), paged)


def test_wide_one_launch_defaults_to_the_gpu_where_the_first_slice_is_eager():
    """None: wide calls on a GPU with the slice grid at the occupancy (``ctas_per_sm`` unset)
    where the first slice is eager; off on the simulator, with ``ctas_per_sm`` set (eager or
    not) or a checked first slice asked for; on wherever it is True."""
    from hexcore.cuda.attention.persistent import wide_one_launch
    from hexcore.cuda.device import SIMULATOR

    for wide, ctas, eager, want in ((None, None, None, not SIMULATOR), (None, 2, None, False),
                                    (None, None, False, False), (None, 2, True, False), (False, None, True, False),
                                    (True, 2, False, True)):
        options = DecodeOptions(wide_one_launch=wide, ctas_per_sm=ctas, eager_first=eager)
        assert wide_one_launch(options) == want, (wide, ctas, eager)


def test_the_launches_handed_out_keep_their_setters_to_the_plan(rng):
    """``launches()`` hands out the plan's own reset and later-slice launches, which its calls
    run: they run and tell (``grid``, ``as_launch()``), but their setters (and anything else
    not in ``PlanLaunch.READABLE``) raise, so a caller
    cannot change what the plan's next call runs (``set_scalar`` of a slice's
    ``split_blocks`` to 3 forwarded unchecked gave a relative L2 error of 968), and the call
    after the attempts is right."""
    store, q, args, keys, values = _one_sequence_of_40(rng)
    plan = PersistentDecode(q, store, *args, budget_us=BUDGET_US, max_seq_len=40, options=SPLIT)
    reset, bare = plan.launches(0)
    for launch, call in ((bare, lambda l: l.set_scalar(18, 3)), (bare, lambda l: l.set_array(21, plan._log)),
                         (reset, lambda l: l.set_array(0, plan._log)), (bare, lambda l: l.rebind(l.as_launch().args)),
                         (bare, lambda l: l._args)):  # nor anything but what it may read (READABLE)
        with pytest.raises(AttributeError, match="a plan's own launch is not to be changed"):
            call(launch)
    assert bare.as_launch().args[18] == plan._sized[2] and reset.grid == plan.launches(0)[0].grid
    q_host = rng.standard_normal((1, 1, 64)).astype(np.float16)
    q.copy_to_device(q_host)
    with use_clock(SimulatedClock(STEP_NS)):
        plan.run(0)
    assert plan.stats().launches > 1  # later slices ran
    assert ref.relative_l2(plan.out.copy_to_host(), ref.decode_attention(q_host, keys, values, 1 / 8)) <= TOLERANCE


def _one_sequence_of_40(rng):
    """(store, q, [tables, lens, tails], keys, values): one FP16 sequence of 40 tokens, one KV
    head of 64 channels, block 16; q zeros on the device, for the test to fill per call."""
    cfg = KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=64, block_size=16, kv_dtype="fp16")
    store, tables, tails, keys, values = random_cache(cfg, [40], rng)
    q = cuda.to_device(np.zeros((1, 1, 64), np.float16))
    return store, q, [cuda.to_device(a) for a in (tables, np.array([40], np.int32), tails)], keys, values


def _store(cfg):
    from hexcore.cuda import DeviceKVStore

    store = DeviceKVStore(cfg, num_blocks=2, max_seqs=1)
    store.pool.copy_to_device(np.zeros(store.pool.shape, np.uint32))
    return store


# ---- real GPU --------------------------------------------------------------------------

GPU_MATRIX = [(dtype, group) for dtype in ("fp16", "int4", "int2") for group in (1, 4, 8, 12)]


@pytest.mark.gpu
@pytest.mark.parametrize("cap", [None, 128])
@pytest.mark.parametrize("item", ["call", "inline"])
@pytest.mark.parametrize("dtype,group", GPU_MATRIX)
def test_persistent_matches_reference_gpu(dtype, group, item, cap, rng):
    """Every dtype and GQA ratio (12: two head groups), the item called or inlined, the slice
    kernel at the default cap (its grid launch's: mostly uncapped at these few items) or at 128
    registers (the default past one wave), a 200 us budget: counts all one, within tolerance of the reference;
    bit-identical to paged_decode with the same options and a budget that leaves the splits alone
    (one launch: with its items within the slice grid, as here, that is ``oneshot_kernel``,
    which runs the grid kernel's item whatever ``item`` says)."""
    options = DecodeOptions(persistent_item=item, max_registers=cap)
    cfg = KVCacheConfig(num_layers=1, num_kv_heads=4, head_dim=128, block_size=32, kv_dtype=dtype, group_size=64)
    lens = [int(rng.integers(1, 8192)), 0, 300, 32 * 7, 8192, 1]
    store, tables, tails, keys, values = random_cache(cfg, lens, rng)
    q = rng.standard_normal((len(lens), 4 * group, 128)).astype(np.float16)
    expect = ref.decode_attention(q, keys, values, 1 / math.sqrt(128))
    out, stats = persistent_decode(q, store, 0, tables, np.array(lens, np.int32), tails, budget_us=200,
                                   count_items=True, options=options)
    assert np.array_equal(stats.item_counts, np.ones(stats.items, np.int32))
    assert ref.relative_l2(out.copy_to_host(), expect) <= TOLERANCE
    paged = paged_decode(q, store, 0, tables, np.array(lens, np.int32), tails, options=options).copy_to_host()
    out, stats = persistent_decode(q, store, 0, tables, np.array(lens, np.int32), tails, budget_us=1e6,
                                   options=options)
    assert np.array_equal(out.copy_to_host(), paged) and stats.launches == 1


def _big_case(batch=192, ctx=131072, num_blocks=65536):
    """llama-3-8b heads (32/8), FP16, block 32: ``batch`` sequences of ``ctx`` tokens over a
    pool of ``num_blocks`` random blocks (8 GiB, far above L2): about 23 ms on an H200."""
    from benchmarks.gpu_common import fill_store
    from hexcore.cuda import DeviceKVStore

    cfg = KVCacheConfig(num_layers=1, num_kv_heads=8, head_dim=128, block_size=32, kv_dtype="fp16")
    store = DeviceKVStore(cfg, num_blocks=num_blocks, max_seqs=batch)
    fill_store(store)
    rng = np.random.default_rng(0)
    tables = cuda.to_device(rng.integers(0, num_blocks, (batch, ctx // 32), dtype=np.int32))
    lens = cuda.to_device(np.full(batch, ctx, np.int32))
    slots = cuda.to_device(np.arange(batch, dtype=np.int32))
    q = cuda.to_device(rng.standard_normal((batch, 32, 128)).astype(np.float16))
    return store, q, tables, lens, slots, ctx


@pytest.mark.gpu
def test_every_launch_ends_within_budget_plus_one_item_gpu():
    """A >= 20 ms decode with a 200 us budget: every slice, by %globaltimer (first CTA's start
    to last CTA's end), ends within the budget plus its longest item (plus 5 us of timer
    granularity); every item taken once. Events around each launch are printed, not checked:
    on a GPU shared with other processes (``gpu-check -n 8``) they include the others' time
    slices (697 us seen for a 200 us budget, while the kernel's own clock said it kept it)."""
    from benchmarks.gpu_common import time_gpu

    store, q, tables, lens, slots, ctx = _big_case()
    whole = time_gpu(lambda: paged_decode(q, store, 0, tables, lens, slots, max_seq_len=ctx), 1, 3, 1)
    assert whole >= 20e-3, f"the workload ran {whole * 1e3:.1f} ms, below 20 ms"
    budget = 200.0
    plan = PersistentDecode(q, store, tables, lens, slots, budget, max_seq_len=ctx, count_items=True)
    reset, one = plan.launches(0)
    reset.run(0)
    event_us = []
    while not plan.stats().drained:
        start, stop = cuda.event(), cuda.event()
        start.record()
        one.run(0)
        stop.record()
        stop.synchronize()
        event_us.append(cuda.event_elapsed_time(start, stop) * 1e3)
    stats = plan.stats()
    log = np.array(list(zip(stats.launch_us, stats.latest_take_us)))
    assert np.array_equal(stats.item_counts, np.ones(stats.items, np.int32))
    assert stats.launches >= 20, stats.launches
    assert (log[:, 1] < budget).all(), "an item was taken after the budget"
    assert max(stats.launch_us) <= budget + stats.longest_item_us + 5, (max(stats.launch_us), stats.longest_item_us)
    print(f"\n{stats.launches} launches, longest {stats.longest_launch_us:.1f} us (events {max(event_us):.1f} us), "
          f"longest item {stats.longest_item_us:.1f} us, decode alone {whole * 1e3:.2f} ms")


@pytest.mark.gpu
def test_fixed_slices_capture_into_a_graph_gpu(rng):
    """``enqueue`` is capture-safe: a torch CUDA graph of N slices, replayed after new query
    values, gives the new result, also after a ``run`` between two replays."""
    torch = pytest.importorskip("torch")
    cfg = KVCacheConfig(num_layers=1, num_kv_heads=2, head_dim=128, block_size=32, kv_dtype="int4")
    store, tables, tails, keys, values = random_cache(cfg, [5000, 700], rng)
    q_host = rng.standard_normal((2, 8, 128)).astype(np.float16)
    q, d_tables = cuda.to_device(q_host), cuda.to_device(tables)
    lens, slots = cuda.to_device(np.array([5000, 700], np.int32)), cuda.to_device(tails)
    plan = PersistentDecode(q, store, d_tables, lens, slots, budget_us=100, max_seq_len=5000)
    plan.run(0)
    slices = plan.stats().launches + 4
    side, graph = torch.cuda.Stream(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        plan.enqueue(0, slices, stream=side)
    for step in ("replay", "run", "replay"):  # the base is on the device: a run between replays is fine
        q_host = rng.standard_normal(q_host.shape).astype(np.float16)
        q.copy_to_device(q_host)
        plan.out.copy_to_device(np.full(q_host.shape, np.nan, np.float16))
        graph.replay() if step == "replay" else plan.run(0)
        torch.cuda.synchronize()
        assert plan.stats().drained
        expect = ref.decode_attention(q_host, keys, values, 1 / math.sqrt(128))
        assert ref.relative_l2(plan.out.copy_to_host(), expect) <= TOLERANCE, step


@pytest.mark.gpu
@pytest.mark.parametrize("count_items", [True, False])
@pytest.mark.parametrize("dtype", ["fp16", "int4", "int2"])
def test_one_launch_calls_gpu(dtype, count_items, rng):
    """At batch 1 the default slice grid holds every item, so ``run`` is one launch
    (``ONESHOT``, no slice state): bit-identical to ``paged_decode``, a log row from the
    CTAs' records that makes sense (a positive span holding the longest item and the latest
    start), and a two-slice ``enqueue`` (the normal protocol) between two such calls right too.
    With ``count_items`` every call resets first (its counts are per call) and each item is
    counted once; without, no call resets, so the normal protocol runs on the state a
    one-launch call left, and the next one-launch call on the state it left."""
    cfg = KVCacheConfig(num_layers=1, num_kv_heads=8, head_dim=128, block_size=32, kv_dtype=dtype)
    store, tables, tails, keys, values = random_cache(cfg, [4000], rng)
    q_host = rng.standard_normal((1, 32, 128)).astype(np.float16)
    q, args = cuda.to_device(q_host), [cuda.to_device(a) for a in (tables, np.array([4000], np.int32), tails)]
    paged = paged_decode(q_host, store, 0, tables, np.array([4000], np.int32), tails).copy_to_host()
    from hexcore.cuda.attention import persistent_kernels as p

    plan = PersistentDecode(q, store, *args, budget_us=1e6, max_seq_len=4000, count_items=count_items)
    assert plan.one_launch, (plan.num_items, plan._sized[1])
    grid = plan._sized[1]
    for n, call in enumerate(("run", "enqueue 2", "run")):
        plan.out.copy_to_device(np.full(q_host.shape, np.nan, np.float16))
        plan.run(0) if call == "run" else plan.enqueue(0, 2)
        stats, state = plan.stats(), plan._state.copy_to_host()
        assert np.array_equal(plan.out.copy_to_host(), paged), call
        assert plan.resets == (n + 1 if count_items else 0), (call, plan.resets)
        if count_items:
            assert np.array_equal(stats.item_counts, np.ones(stats.items, np.int32)), call
        assert state[p.SHOT] == (call == "run"), (call, state[:p.STATE_WORDS])
        if call == "run":  # every CTA's record: a start, then an end after it
            starts, ends = (state[p.STATE_WORDS + k * grid:p.STATE_WORDS + (k + 1) * grid] for k in (1, 2))
            assert (starts > 0).all() and (ends > starts).all(), (starts, ends)
        assert stats.drained and stats.items_per_launch[0] == plan.num_items, (call, stats)
        assert stats.launches == (1 if call == "run" else 2), (call, stats)
        span = stats.launch_us[0]
        assert 0 < stats.longest_item_us <= span and 0 <= stats.latest_take_us[0] <= span, (call, stats)
    assert ref.relative_l2(paged, ref.decode_attention(q_host, keys, values, 1 / math.sqrt(128))) <= TOLERANCE


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "int4", "int2"])
def test_a_wide_one_launch_call_gpu(dtype):
    """128 sequences of 2k tokens, llama-3-8b heads (32/8): 1024 items, more than the slice
    grid's resident CTAs, and a budget the item model's whole call is far inside, so ``run``
    is one wide launch of ``oneshot_kernel`` over every item (``wide_one_launch``'s default on
    a GPU): bit-identical to ``paged_decode`` (the same splits, one a sequence), every item
    counted once, one launch. With ``wide_one_launch=False`` the same call is one slice of the
    slice kernel (no budget is spent), also bit-identical."""
    from benchmarks.bench_persistent import case

    store, q, tables, lens, slots = case(dtype, 128, 32, 8, 2048)
    paged = paged_decode(q, store, 0, tables, lens, slots, max_seq_len=2048).copy_to_host()
    for wide in (None, False):
        plan = PersistentDecode(q, store, tables, lens, slots, budget_us=1e6, max_seq_len=2048, count_items=True,
                                options=DecodeOptions(wide_one_launch=wide))
        assert plan.num_items == 1024 and plan._wide == (wide is None) and plan.one_launch == (wide is None)
        plan.out.copy_to_device(np.full(plan.out.shape, np.nan, np.float16))
        plan.run(0)
        stats = plan.stats()
        assert np.array_equal(plan.out.copy_to_host(), paged), wide
        assert np.array_equal(stats.item_counts, np.ones(1024, np.int32)) and stats.drained, (wide, stats)
        assert stats.launches == 1, (wide, stats.launches)  # (the slices: one, as no budget is spent)
        span = stats.launch_us[0]
        assert 0 < stats.longest_item_us <= span and 0 <= stats.latest_take_us[0] <= span, (wide, stats)


@pytest.mark.gpu
def test_one_launch_run_waits_for_its_stream_gpu(rng):
    """``run`` synchronises with its stream also where it is one launch and reads nothing
    back: on a torch stream (non-blocking, so nothing else would wait for it), held busy for
    about 25 ms before the call, the stream is idle when ``run`` returns, and the output is
    ``paged_decode``'s."""
    torch = pytest.importorskip("torch")
    cfg = KVCacheConfig(num_layers=1, num_kv_heads=8, head_dim=128, block_size=32, kv_dtype="int4")
    store, tables, tails, _, _ = random_cache(cfg, [30000], rng)
    q_host = rng.standard_normal((1, 32, 128)).astype(np.float16)
    paged = paged_decode(q_host, store, 0, tables, np.array([30000], np.int32), tails).copy_to_host()
    q, args = cuda.to_device(q_host), [cuda.to_device(a) for a in (tables, np.array([30000], np.int32), tails)]
    plan = PersistentDecode(q, store, *args, budget_us=1e6, max_seq_len=30000)
    assert plan.one_launch
    side = torch.cuda.Stream()
    for _ in range(3):
        plan.out.copy_to_device(np.full(q_host.shape, np.nan, np.float16))
        cuda.synchronize()
        with torch.cuda.stream(side):
            torch.cuda._sleep(50_000_000)  # GPU cycles: the launch below queues behind them
        plan.run(0, stream=side)
        assert side.query(), "run returned before its stream was done"
        assert np.array_equal(plan.out.copy_to_host(), paged)
