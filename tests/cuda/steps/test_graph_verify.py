"""DecodeGraph with in-step verification: the default graph unchanged, the verify row of
the index buffer, verify_results, and typed errors for bad input (no simulator steps:
tests/test_fault.py runs verifying steps end to end)."""

import re

import numpy as np
import pytest
from numba import cuda

from hexcore import HexcoreInvalidArgumentError
from hexcore.cuda.steps import step as step_module
from tests.cuda.steps.test_graph_api import CFG, good_step, make_graph


def sums_for(graph):
    return cuda.to_device(np.zeros((graph.store.num_blocks, CFG.num_layers), np.uint32))


def test_the_default_graph_is_unchanged():
    """No verify_sums: the index buffer and the step's launches are those of before."""
    graph = make_graph(buckets=(2,))
    assert graph.verify_sums is None and graph.max_verify_blocks == 0
    key = graph.warmup(2, 20)
    buffers, launches = graph._buckets[2].buffers, graph._steps[key]
    assert buffers.index.shape == (step_module.TABLES_ROW * 2 + 2 * 8,) and buffers.verify_ids is None
    assert launches._record is None and launches._verify is None
    assert buffers.tables(launches.width).shape == (2, launches.width)
    with pytest.raises(HexcoreInvalidArgumentError, match="made without verify_sums"):
        graph.verify_results()


def test_a_verifying_graph_adds_one_row_of_ids_before_the_tables():
    sums = sums_for(make_graph())
    verifying = make_graph(buckets=(2,), verify_sums=sums, max_verify_blocks=5)
    assert verifying.verify_sums is sums and verifying.max_verify_blocks == 5
    key = verifying.warmup(2, 20)  # all padding: nothing verified
    assert verifying.verify_results().guard_words == 6 * 64  # make_graph wrote random words over the guards
    verifying.store.fill_guards()
    verifying.warmup(2, 20)
    buffers = verifying._buckets[2].buffers
    base = step_module.TABLES_ROW * 2
    assert buffers.index.shape == (base + 5 + 2 * 8,) and buffers.tables_at == base + 5
    assert buffers.verify_ids.shape == (5,) and (buffers.verify_ids.copy_to_host() == -1).all()
    assert verifying._steps[key]._verify is not None and verifying._steps[key]._record is not None
    assert verifying.verify_results().ok


BAD = {  # case -> (graph kwargs, step changes, text)
    "ids without verification": ({}, {"verify_blocks": np.array([1], np.int32)}, "made without verify_sums"),
    "id range": (None, {"verify_blocks": np.array([3, 16], np.int32)}, "verify_blocks[1] = 16 is outside [0, 16)"),
    "id negative": (None, {"verify_blocks": np.array([-1], np.int32)}, "verify_blocks[0] = -1"),
    "ids dtype": (None, {"verify_blocks": np.array([1], np.int64)}, "verify_blocks: expected a host int32"),
    "ids list": (None, {"verify_blocks": [1]}, "got list"),
    "too many ids": (None, {"verify_blocks": np.arange(4, dtype=np.int32)}, "4 ids exceed max_verify_blocks 3"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_verify_input_raises_naming_the_value_and_changes_nothing(case):
    kwargs, changes, text = BAD[case]
    graph = make_graph(buckets=(2,))
    if kwargs is None:
        graph = make_graph(buckets=(2,), verify_sums=sums_for(graph), max_verify_blocks=3)
    index = graph._bucket(2).buffers.index
    before = graph.store.pool.copy_to_host(), index.copy_to_host()
    for call in (graph.step, graph.load):
        with pytest.raises(HexcoreInvalidArgumentError, match=re.escape(text)):
            call(**{**good_step(), **changes})
    assert np.array_equal(graph.store.pool.copy_to_host(), before[0])
    assert np.array_equal(index.copy_to_host(), before[1])
    assert graph.prepared == ()


def test_constructor_rejects_bad_verify_arguments():
    graph = make_graph()
    host = np.zeros((16, CFG.num_layers), np.uint32)
    for kwargs, text in (({"verify_sums": host}, "verify_sums: expected a device array"),
                         ({"verify_sums": cuda.to_device(host[:3])}, "verify_sums: expected shape (16, 2)"),
                         ({"verify_sums": cuda.to_device(host.astype(np.int32))}, "verify_sums: expected dtype uint32"),
                         ({"max_verify_blocks": 0}, "max_verify_blocks"),
                         ({"max_verify_blocks": True}, "max_verify_blocks"),
                         ({"max_verify_blocks": 2**20 + 1}, "max_verify_blocks")):
        with pytest.raises(HexcoreInvalidArgumentError, match=re.escape(text)):
            make_graph(**kwargs)


def test_step_verify_checks_its_own_arguments():
    """StepVerify (exported): store and capacity checked (raw AttributeError / TypeError /
    MemoryError before, capacity 0 and 2**20 + 1 taken), digests outside the store and apart
    (a step's records would write into the cache), ``prepare`` of a non-array or of more ids
    than its capacity typed, ``read`` of an unresolved stream."""
    from hexcore.cuda.steps import DecodeGraph, StepVerify

    graph = make_graph()
    store, L = graph.store, CFG.num_layers
    sums, heads = sums_for(graph), cuda.to_device(np.zeros((16, L, 1), np.uint32))
    pool = store.pool
    for args, text in (((None, sums, 4), "store: expected a DeviceKVStore"),
                       ((store, sums, None), "capacity: expected an int"),
                       ((store, sums, 0), "capacity: expected an int in [1, 1048576]"),
                       ((store, sums, 2**20 + 1), "capacity: expected an int in [1, 1048576]"),
                       ((store, sums, True), "capacity: expected an int"),
                       ((store, pool[:16 * L].reshape(16, L), 4), "verify_sums: lies inside the store's memory"),
                       ((store, sums, 4, pool[:16 * L].reshape(16, L, 1), 1), "verify_heads: lies inside the store"),
                       ((store, sums, 4, sums.reshape(16, L, 1), 1), "verify_heads: shares memory with verify_sums")):
        with pytest.raises(HexcoreInvalidArgumentError, match=re.escape(text)):
            StepVerify(*args)
    with pytest.raises(HexcoreInvalidArgumentError, match=re.escape("verify_sums: lies inside the store's memory")):
        DecodeGraph(store, 2, 8, verify_sums=pool[:16 * L].reshape(16, L), verify_heads=heads, verify_layers=1)
    verify = StepVerify(store, sums, 2, heads, 1)
    for ids, text in ((np.int64(1), "block_ids: expected"), ([1], "block_ids: expected"),
                      (np.array([1], np.int32), "block_ids: a prepared launch needs a device array"),
                      (cuda.to_device(np.zeros(3, np.int32)), "block_ids: 3 ids exceed the capacity 2")):
        with pytest.raises(HexcoreInvalidArgumentError, match=re.escape(text)):
            verify.prepare(ids)
    with pytest.raises(HexcoreInvalidArgumentError, match="stream"):
        verify.read("x")
    assert verify.read(None).ok and verify.prepare(cuda.to_device(np.zeros(2, np.int32))).grid[0] == 3  # + guards
