"""Hostile arguments into the decode API (fuzz/probes/api_pass_5_decode.py's findings): each
raises a typed hexcore error naming the argument and leaves the state as it was."""

import numpy as np
import pytest
from numba import cuda

from hexcore import HexcoreConfigError, HexcoreInvalidArgumentError, KVCacheConfig
from hexcore.cuda import (DecodeOptions, DecodePlan, gather_prefix, paged_decode, prefill_attention,
                          prefill_attention_batch)
from hexcore.cuda.attention.persistent import BudgetError, PersistentDecode, persistent_decode
from tests.cuda.fill import random_cache

CFG = KVCacheConfig(num_layers=2, num_kv_heads=1, head_dim=64, block_size=16, kv_dtype="fp16")
SPLIT = DecodeOptions(ctas_per_sm=4, split_blocks=1)


@pytest.fixture
def case(rng):
    """(store, q, tables, lens, tails): two sequences of 37 and 16 tokens, two query heads."""
    store, tables, tails, _, _ = random_cache(CFG, [37, 16], rng)
    q = rng.standard_normal((2, 2, 64)).astype(np.float16)
    return store, q, tables, np.array([37, 16], np.int32), tails


@pytest.mark.parametrize("field", ["l2_prefetch", "launch_path", "persistent_item", "tiered_fp16", "tiered_merge"])
def test_choice_field_refuses_an_array(field):
    """A 2-D array is no choice: a config error naming the field, not numpy's ambiguous truth value."""
    with pytest.raises(HexcoreConfigError, match=field):
        DecodeOptions(**{field: np.zeros((2, 2))})


@pytest.mark.parametrize("field", ["ctas_per_sm", "max_registers", "split_blocks", "min_split_blocks"])
def test_int_fields_take_numpy_ints_and_refuse_the_rest(field):
    """As every integer argument (``_checks.as_int``): numpy integers kept as Python ints;
    bools, floats, strings, 0 and (for the register cap) past the GPU's 255 refused."""
    value = getattr(DecodeOptions(**{field: np.int64(8)}), field)
    assert value == 8 and type(value) is int
    bad = [True, 1.5, "8", 0, -1] + ([256] if field == "max_registers" else [])
    for value in bad:
        with pytest.raises(HexcoreConfigError, match=field):
            DecodeOptions(**{field: value})


@pytest.mark.parametrize("name, value", [("items", "1"), ("items", None), ("items", -1), ("items", np.zeros(2)),
                                         ("pools", [1]), ("pools", 0), ("blocks_per_sm", "2"),
                                         ("blocks_per_sm", float("nan")), ("blocks_per_sm", float("inf")),
                                         ("blocks_per_sm", -0.5), ("dependent", np.zeros(2)), ("dependent", 1)])
def test_tiered_mode_refuses_what_is_no_count(name, value):
    """The format-by-age merge policy's inputs (sixth adversarial pass: TypeError before):
    a typed error naming the argument; numpy integers are counts."""
    arguments = dict(dependent=np.bool_(True), items=np.int32(4), blocks_per_sm=np.float32(1.5), pools=np.int64(2))
    assert DecodeOptions().tiered_mode(**arguments) in ("one", "last", "launch")
    with pytest.raises(HexcoreInvalidArgumentError, match=name):
        DecodeOptions().tiered_mode(**{**arguments, name: value})


@pytest.mark.parametrize("options", [0, "", False, np.zeros((2, 2)), object()])
def test_options_other_than_decode_options_are_refused(case, options):
    """Falsy values are not taken for the defaults, and arrays raise a typed error."""
    store, q, tables, lens, tails = case
    with pytest.raises(HexcoreInvalidArgumentError, match="options"):
        paged_decode(q, store, 0, tables, lens, tails, options=options)
    dev = [cuda.to_device(a) for a in (q, tables, lens, tails)]
    with pytest.raises(HexcoreInvalidArgumentError, match="options"):
        DecodePlan(dev[0], store, *dev[1:], max_seq_len=37, options=options)
    with pytest.raises(HexcoreInvalidArgumentError, match="options"):
        persistent_decode(q, store, 0, tables, lens, tails, budget_us=1e5, options=options)


def test_empty_batch_is_refused(case):
    """No sequences: a typed error naming q, not a ZeroDivisionError in the split policy."""
    store, _, tables, lens, tails = case
    with pytest.raises(HexcoreInvalidArgumentError, match="q: expected at least one sequence"):
        paged_decode(np.zeros((0, 2, 64), np.float16), store, 0, tables[:0], lens[:0], tails[:0])


@pytest.mark.parametrize("name,value", [("workspace", object()), ("workspace", np.zeros((2, 2))),
                                        ("count_items", np.zeros((2, 2))), ("count_items", "yes")])
def test_persistent_decode_refuses_workspace_and_count_items(case, name, value):
    store, q, tables, lens, tails = case
    dev = [cuda.to_device(a) for a in (q, tables, lens, tails)]
    with pytest.raises(HexcoreInvalidArgumentError, match=name):
        PersistentDecode(dev[0], store, *dev[1:], budget_us=1e5, max_seq_len=37, options=SPLIT, **{name: value})


def test_huge_int_budget_and_scale_are_typed_errors(case):
    """An int too large for a float is out of range, not an OverflowError."""
    store, q, tables, lens, tails = case
    with pytest.raises(BudgetError, match="budget_us"):
        persistent_decode(q, store, 0, tables, lens, tails, budget_us=10**400)
    new = np.zeros((3, 1, 64), np.float16)
    with pytest.raises(HexcoreInvalidArgumentError, match="scale"):
        prefill_attention(np.zeros((3, 2, 64), np.float16), new, new, store, 0, tables[0], 37, int(tails[0]),
                          scale=10**400, backend="numba")


@pytest.mark.parametrize("layer", [[0], np.zeros((2, 2)), 0.0, False, 2])
def test_persistent_bad_layer_leaves_the_plan_as_it_was(case, layer):
    """A bad layer raises the layer error before a call changes anything: the workspace stays
    clean (no reset launch owed by the next call) and 0.0 is not taken for layer 0."""
    store, q, tables, lens, tails = case
    dev = [cuda.to_device(a) for a in (q, tables, lens, tails)]
    plan = PersistentDecode(dev[0], store, *dev[1:], budget_us=1e5, max_seq_len=37, options=SPLIT)
    plan.run(0)
    expect = plan.out.copy_to_host()
    for call in (lambda: plan.run(layer), lambda: plan.enqueue(layer, 2), lambda: plan.launches(layer)):
        with pytest.raises(HexcoreInvalidArgumentError, match="layer"):
            call()
        assert not plan._workspace.is_mid_call(plan._partials[2]) and not plan._mid_call  # nothing marked mid-call
        assert plan.resets == 0 and sorted(plan._layers) == [0]
    assert np.array_equal(plan.run(np.int64(0)).copy_to_host(), expect)


def test_gather_refuses_one_array_for_both_outputs(case):
    """k_out and v_out sharing memory would give K overwritten by V with no error."""
    store, _, tables, _, tails = case
    out = cuda.device_array((1, 37, 64), np.float16)
    with pytest.raises(HexcoreInvalidArgumentError, match="v_out: shares memory with k_out"):
        gather_prefix(store, 0, tables[0], 37, int(tails[0]), k_out=out, v_out=out)
    both = cuda.device_array((2, 1, 37, 64), np.float16)
    k, _ = gather_prefix(store, 0, tables[0], 37, int(tails[0]), k_out=both[0], v_out=both[1])
    assert np.array_equal(k.copy_to_host(), gather_prefix(store, 0, tables[0], 37, int(tails[0]))[0].copy_to_host())


def test_outputs_over_what_the_launch_reads_are_refused(case):
    """An output that is a view of an input the same launch reads (sixth pass's open items):
    decode's ``out`` over ``q``, the gather's outputs over the new tokens, prefill's ``out``
    over ``q``; each a typed error naming both arrays, with nothing launched."""
    store, q, tables, lens, tails = case
    q_dev = cuda.to_device(q)
    with pytest.raises(HexcoreInvalidArgumentError, match="out: shares memory with q"):
        paged_decode(q_dev, store, 0, tables, lens, tails, out=q_dev)
    assert np.array_equal(q_dev.copy_to_host(), q)
    buffer = cuda.to_device(np.ones(40 * 64, np.float16))
    new = buffer[:3 * 64].reshape(3, 1, 64)  # [n_new, H, D], inside what v_out is
    with pytest.raises(HexcoreInvalidArgumentError, match="v_out: shares memory with k_new"):
        gather_prefix(store, 0, tables[0], 37, int(tails[0]), new, new, v_out=buffer.reshape(1, 40, 64))
    q_new = cuda.to_device(np.ones((3, 2, 64), np.float16))
    with pytest.raises(HexcoreInvalidArgumentError, match="out: shares memory with q"):
        prefill_attention(q_new, new, new, store, 0, tables[0], 37, int(tails[0]), out=q_new, backend="numba")
    assert np.array_equal(buffer.copy_to_host(), np.ones(40 * 64, np.float16))
    q_batch = cuda.to_device(np.ones((2, 3, 2, 64), np.float16))  # [B, n_max, num_q_heads, D]
    new_batch = cuda.to_device(np.ones((2, 3, 1, 64), np.float16))
    with pytest.raises(HexcoreInvalidArgumentError, match="out: shares memory with q"):
        prefill_attention_batch(q_batch, new_batch, new_batch, store, 0, tables, np.array([37, 16], np.int32), tails,
                                np.array([3, 3], np.int32), out=q_batch, backend="numba")
