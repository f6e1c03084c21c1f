"""DecodeGraph's API: argument checks, buckets, warm-up, the per-layer enqueue, the simulator path."""

import re
import warnings

import numpy as np
import pytest

from hexcore import HexcoreInvalidArgumentError, KVCacheConfig
from hexcore.cuda import DecodeGraph, DeviceKVStore
from hexcore.cuda.steps import capture as capture_module
from hexcore.cuda.device import SIMULATOR
from hexcore.host import PagedKVCache
from tests.cuda.steps.test_graph import fill, prefill, to_host

CFG = KVCacheConfig(num_layers=2, num_kv_heads=1, head_dim=64, block_size=16, kv_dtype="int4", group_size=32)


def make_graph(cfg=CFG, buckets=(2, 4), num_q_heads=2, num_blocks=16, max_seqs=4, **kwargs):
    store = DeviceKVStore(cfg, num_blocks=num_blocks, max_seqs=max_seqs)
    words = np.random.default_rng(0).integers(0, 1 << 32, store.pool.shape[0], dtype=np.uint32)
    store.pool.copy_to_device(words & ~np.uint32(0x40004000))  # finite float16 everywhere, cheap on the simulator
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return DecodeGraph(store, num_q_heads, max_blocks_per_seq=8, batch_buckets=buckets, **kwargs)


def good_step():
    """A valid step of two sequences (lengths 17 and 4) on a 16-block, 4-slot store."""
    return {"block_tables": np.array([[3, 5, -1, -1], [-1, -1, -1, -1]], np.int32),
            "seq_lens": np.array([17, 4], np.int32), "tail_slots": np.array([2, 0], np.int32),
            "positions": np.array([0, 3], np.int32), "seal_slots": np.array([2], np.int32),
            "seal_blocks": np.array([5], np.int32), "fork_src": np.array([2], np.int32),
            "fork_dst": np.array([1], np.int32)}


BAD = {  # case -> (changes to good_step(), text the error must contain)
    "lens dtype": ({"seq_lens": np.array([17, 4], np.int64)}, "int64"),
    "lens zero": ({"seq_lens": np.array([17, 0], np.int32)}, "seq_lens[1] = 0"),
    "lens past table": ({"seq_lens": np.array([80, 4], np.int32)}, "seq_lens[0] = 80"),
    "lens list": ({"seq_lens": [17, 4]}, "list"),
    "no sequences": ({"seq_lens": np.zeros(0, np.int32)}, "got 0"),
    "slot range": ({"tail_slots": np.array([2, 4], np.int32)}, "tail_slots[1] = 4"),
    "slot repeated": ({"tail_slots": np.array([2, 2], np.int32)}, "tail_slots[1] = 2"),
    "slots shape": ({"tail_slots": np.array([2], np.int32)}, "tail_slots"),
    "position": ({"positions": np.array([0, 2], np.int32)}, "positions[1] = 2"),
    "position range": ({"positions": np.array([16, 3], np.int32)}, "positions[0] = 16"),
    "table entry": ({"block_tables": np.array([[16, 5, -1, -1], [0, 0, 0, 0]], np.int32)}, "block_tables[0, 0] = 16"),
    "table rows": ({"block_tables": np.zeros((3, 4), np.int32)}, "block_tables"),
    "seal block": ({"seal_blocks": np.array([-1], np.int32)}, "seal_blocks[0] = -1"),
    "seal repeated": ({"seal_slots": np.array([2, 0], np.int32), "seal_blocks": np.array([5, 5], np.int32)},
                      "seal_blocks[1] = 5"),
    "seal pairs": ({"seal_blocks": np.array([5, 6], np.int32)}, "seal_blocks"),
    "seal count": ({"seal_slots": np.arange(3, dtype=np.int32), "seal_blocks": np.arange(3, dtype=np.int32)},
                   "3 entries exceed"),
    "fork range": ({"fork_src": np.array([9], np.int32)}, "fork_src[0] = 9"),
    "fork repeated": ({"fork_src": np.array([2, 3], np.int32), "fork_dst": np.array([1, 1], np.int32)},
                      "fork_dst[1] = 1"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_step_raises_naming_the_value_and_changes_nothing(case):
    changes, text = BAD[case]
    graph = make_graph(buckets=(2,))
    views = graph.buffers(2)  # data an early append would write into the store
    for view in views[:3]:
        fill(view, np.ones(view.shape, np.float16))
    index = graph._buckets[2].buffers.index
    before = graph.store.pool.copy_to_host(), index.copy_to_host()
    with pytest.raises(HexcoreInvalidArgumentError, match=re.escape(text)):
        graph.step(**{**good_step(), **changes})
    assert np.array_equal(graph.store.pool.copy_to_host(), before[0])
    assert np.array_equal(index.copy_to_host(), before[1])
    assert graph.prepared == ()


def test_constructor_rejects_bad_arguments():
    store = DeviceKVStore(KVCacheConfig(num_layers=1, num_kv_heads=2, head_dim=64, block_size=16), 4, 2)
    for kwargs, text in (({"num_q_heads": 3}, "num_q_heads"), ({"max_blocks_per_seq": 0}, "max_blocks_per_seq"),
                         ({"batch_buckets": ()}, "batch_buckets"), ({"batch_buckets": (0, 2)}, "batch_buckets"),
                         ({"batch_buckets": 4}, "batch_buckets"), ({"scale": "x"}, "scale"), ({"scale": -1.0}, "scale"),
                         ({"backend": "cudnn"}, "backend")):
        with pytest.raises(HexcoreInvalidArgumentError, match=text):
            DecodeGraph(store, **{"num_q_heads": 4, "max_blocks_per_seq": 4, **kwargs})


BAD_BUFFERS = [  # (StepBuffers arguments changed, text): were AttributeError, TypeError, ValueError, MemoryError
    ({"store": None}, "store: expected a DeviceKVStore, got NoneType"),
    ({"num_q_heads": 1.5}, "num_q_heads: expected an int, got float 1.5"),
    ({"num_q_heads": -1}, r"num_q_heads: expected an int in \[1, "),
    ({"num_q_heads": 3}, "num_q_heads: 3 is not a positive multiple of num_kv_heads 2"),
    ({"bucket": "3"}, "bucket: expected an int, got str"),
    ({"bucket": 2**31}, r"bucket: expected an int in \[1, 65535\], got 2147483648"),
    ({"bucket": True}, "bucket: expected an int, got True"),
    ({"max_blocks_per_seq": None}, "max_blocks_per_seq: expected an int, got NoneType"),
    ({"max_blocks_per_seq": 10**30}, "max_blocks_per_seq: expected an int in"),
    ({"verify": 3}, "verify: expected None or a StepVerify of this store, got int"),
]


@pytest.mark.parametrize("changes, text", BAD_BUFFERS)
def test_step_buffers_refuse_bad_arguments(changes, text):
    from hexcore.cuda.steps import StepBuffers

    store = DeviceKVStore(KVCacheConfig(num_layers=1, num_kv_heads=2, head_dim=64, block_size=16), 4, 2)
    args = {"store": store, "num_q_heads": 4, "bucket": 2, "max_blocks_per_seq": 4, "verify": None, **changes}
    with pytest.raises(HexcoreInvalidArgumentError, match=text):
        StepBuffers(**args)


def test_step_buffers_and_decode_step_methods_refuse_bad_counts():
    """Counts, widths and layers of StepBuffers' launches and DecodeStep.enqueue_all:
    were TypeError (unhashable, slice indices), ValueError (negative dimensions) or a
    MemoryError for a huge count; the DecodeStep constructor's were AttributeError."""
    from hexcore.cuda.attention.launcher import Workspace
    from hexcore.cuda.steps import DecodeStep

    graph = make_graph(buckets=(2,))
    key = graph.warmup(2, 20)
    step = graph._steps[key]
    buffers = step.buffers
    for call, text in ((lambda: buffers.tables(0), r"width: expected an int in \[1, 8\], got 0"),
                       (lambda: buffers.tables(9), "width"), (lambda: buffers.tables("3"), "width"),
                       (lambda: buffers.fork([1]), "count: expected an int, got list"),
                       (lambda: buffers.fork(3), r"count: expected an int in \[1, 2\], got 3"),
                       (lambda: buffers.seal(1.5), "count"), (lambda: buffers.seal(1, layer=[1]), "layer"),
                       (lambda: buffers.seal(1, layer=2), "layer"),
                       (lambda: buffers.record_launch(1), "record_launch: these buffers were made without"),
                       (lambda: buffers.verify_launch(1), "verify_launch: these buffers were made without"),
                       (lambda: step.enqueue_all(0, -1), r"num_seals: expected an int in \[0, 2\], got -1"),
                       (lambda: step.enqueue_all(0, 2**40), "num_seals"),
                       (lambda: step.enqueue_all(0, np.zeros((2, 2))), "num_seals"),
                       (lambda: step.enqueue_all(0, None, 1), r"num_verify: expected an int in \[0, 0\], got 1"),
                       (lambda: DecodeStep(None, buffers, 32, None, Workspace()), "store"),
                       (lambda: DecodeStep(graph.store, None, 32, None, Workspace()), "buffers"),
                       (lambda: DecodeStep(graph.store, buffers, 8, None, Workspace()), "max_seq_len"),
                       (lambda: DecodeStep(graph.store, buffers, 32, None, None), "workspace")):
        with pytest.raises(HexcoreInvalidArgumentError, match=text):
            call()
    assert buffers.tables(8).shape == (2, 8) and buffers.seal(1, layer=np.int64(1)) is buffers.seal(1, 1)


def test_buckets_and_buffers():
    graph = make_graph(buckets=(64, 2, 1))  # capped at max_seqs 4, sorted
    assert graph.batch_buckets == (1, 2, 4)
    assert [graph.context_bucket(n) for n in (1, 16, 17, 37, 64, 65, 200)] == [16, 16, 32, 64, 64, 128, 143]
    assert graph.capacity == 143  # 8 sealed blocks + 15 tail tokens
    q, k, v, out = graph.buffers(3)
    assert q.shape == out.shape == (2, 3, 2, 64) and k.shape == v.shape == (2, 3, 1, 64)
    assert graph.buffers(3).q is q  # views are made once
    assert graph.buffers(5).q.shape == (2, 5, 2, 64)  # above the largest bucket: exact buffers
    with pytest.raises(HexcoreInvalidArgumentError, match="batch"):
        graph.buffers(0)


def test_warmup_prepares_a_bucket_pair_and_leaves_the_store_alone():
    graph = make_graph(buckets=(1,), num_q_heads=1)
    before = graph.store.pool.copy_to_host()
    assert graph.warmup(1, 20) == (1, 32)
    assert graph.prepared == ((1, 32),)
    assert np.array_equal(graph.store.pool.copy_to_host(), before)  # every row was padding
    assert not to_host(graph.buffers(1).out).any()  # padding rows attend to nothing: zeros
    for batch, length in ((2, 20), (1, 200), (1, 0)):
        with pytest.raises(HexcoreInvalidArgumentError, match="warmup"):
            graph.warmup(batch, length)


def test_load_and_per_layer_enqueue_equal_step():
    """The engine path (load, then enqueue per layer) does what step does."""
    results = []
    for engine in (False, True):
        graph = make_graph(buckets=(1,), num_q_heads=1)
        cache = PagedKVCache(CFG, num_blocks=16, max_seqs=4)
        rng = np.random.default_rng(7)
        seq = cache.add_sequence()
        prefill(cache, graph.store, seq, 15, rng)
        result = cache.step(np.array([seq], np.int32))  # the tail fills: a seal
        q, k, v, out = graph.buffers(1)
        for view in (q, k, v):
            fill(view, rng.standard_normal(view.shape).astype(np.float16))
        args = (result.block_tables, result.seq_lens, result.tail_slots)
        seals = {"seal_slots": result.seal_slots, "seal_blocks": result.seal_blocks}
        if engine:
            step = graph.load(*args, **seals)
            assert step.key == (1, 16) and step.block_tables.shape == (1, 1)
            for layer in range(CFG.num_layers):
                step.enqueue(layer)
            for bad in (2, True, 1.0):  # also after layer 1 ran: its launches are cached
                with pytest.raises(HexcoreInvalidArgumentError, match="layer"):
                    step.enqueue(bad)
        else:
            out = graph.step(*args, **seals)
        results.append((to_host(out), graph.store.pool.copy_to_host()))
    assert np.abs(results[0][0]).max() > 0
    np.testing.assert_allclose(results[1][0].astype(np.float32), results[0][0].astype(np.float32), atol=2e-3,
                               rtol=2e-3)
    assert np.array_equal(results[1][1], results[0][1])


def test_load_rejects_a_batch_above_the_largest_bucket():
    graph = make_graph(buckets=(1,))
    with pytest.raises(HexcoreInvalidArgumentError, match="largest bucket 1"):
        graph.load(**good_step())


@pytest.mark.skipif(not SIMULATOR, reason="the simulator's fallback")
def test_simulator_runs_eagerly_and_says_so_once(monkeypatch):
    monkeypatch.setattr(capture_module, "_warned", [])
    store = DeviceKVStore(CFG, num_blocks=4, max_seqs=2)
    with pytest.warns(UserWarning, match="simulator") as record:
        graphs = [DecodeGraph(store, 2, 4, backend=b) for b in ("auto", "torch", "driver")]
    assert len(record) == 1 and {g.backend for g in graphs} == {"eager"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        DecodeGraph(store, 2, 4, backend="eager")  # asked for: nothing to say


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "int4"])
def test_engine_graph_holds_the_per_layer_enqueue_gpu(dtype, seed):
    """An engine captures hexcore's per-layer launches inside its own torch graph (one per
    key); load() copies the indices and runs forks outside it. Equal to eager steps."""
    torch = pytest.importorskip("torch")
    from numba import cuda

    from tests.cuda.steps.test_graph import SCRIPT, assert_same, eager_runner, run_workload

    def engine_runner(store, cache, num_q_heads):
        graph = DecodeGraph(store, num_q_heads, cache.max_blocks_per_seq, batch_buckets=(4,), backend="torch")
        captured = {}

        def step(result, q, k, v, forks):
            views = graph.buffers(q.shape[1])
            for view, host in zip(views[:3], (q, k, v)):
                fill(view, host)
            launches = graph.load(result.block_tables, result.seq_lens, result.tail_slots,
                                  seal_slots=result.seal_slots, seal_blocks=result.seal_blocks,
                                  fork_src=forks[:, 0].copy() if len(forks) else None,
                                  fork_dst=forks[:, 1].copy() if len(forks) else None)
            if launches.key in captured:
                captured[launches.key].replay()
                return to_host(views.out)
            current = cuda.external_stream(torch.cuda.current_stream().cuda_stream)
            for layer in range(cfg.num_layers):  # the warm-up is this step itself
                launches.enqueue(layer, current)
            side, engine_graph = torch.cuda.Stream(), torch.cuda.CUDAGraph()
            with torch.cuda.graph(engine_graph, stream=side):
                on_side = cuda.external_stream(side.cuda_stream)
                for layer in range(cfg.num_layers):  # an engine's own layer work would sit between these
                    launches.enqueue(layer, on_side)
            captured[launches.key] = engine_graph
            return to_host(views.out)

        return step

    cfg = KVCacheConfig(num_layers=3, num_kv_heads=8, head_dim=128, block_size=16, kv_dtype=dtype)
    kwargs = {"prompts": {"A": 40, "B": 15}, "script": SCRIPT + [{"batch": "AD"}] * 3, "max_seqs": 8,
              "num_blocks": 32}
    assert_same(run_workload(cfg, 32, eager_runner, seed, **kwargs), run_workload(cfg, 32, engine_runner, seed, **kwargs))


def test_phase_step_checks_its_step_and_phase():
    """PhaseStep (exported) was made of anything: a non-step raised AttributeError, and a
    phase out of range, a float or None made a step that failed only at its first enqueue."""
    from numba import cuda

    from hexcore.cuda.attention.launcher import Workspace
    from hexcore.cuda.steps import DecodeStep, PhaseStep, StepBuffers, StepVerify

    store = make_graph().store
    sums, heads = (cuda.to_device(np.zeros(shape, np.uint32)) for shape in ((16, 2), (16, 2, 1)))
    layered = DecodeStep(store, StepBuffers(store, 2, 2, 8, StepVerify(store, sums, 4, heads, 1)), 32, None,
                         Workspace())
    plain = DecodeStep(store, StepBuffers(store, 2, 2, 8), 32, None, Workspace())
    for step, phase, text in ((None, 0, "step: expected a DecodeStep, got NoneType"), (layered, 2, "phase"),
                              (layered, -1, "phase"), (layered, 0.5, "phase"), (layered, None, "phase"),
                              (layered, True, "phase"), (plain, 0, "^step: checks no layers in turn"),
                              (plain, None, "^step: checks no layers in turn")):
        with pytest.raises(HexcoreInvalidArgumentError, match=text):
            PhaseStep(step, phase)
    bound = PhaseStep(layered, np.int64(1))
    assert bound.phase == 1 and bound.key == (2, 32, 1) and layered.at(1).phase == 1
