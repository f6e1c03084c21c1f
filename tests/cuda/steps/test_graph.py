"""DecodeGraph: graph-replayed steps equal plain eager launches, step after step.

A scripted serving workload (as hexcore/serve.py: grow, seal, fork, finish, replace)
runs twice from identical stores: once through append / seal / copy_tails /
paged_decode calls, once through DecodeGraph (on the simulator: its bucketed launches,
run eagerly). The stores' bytes must be identical after every step; attention outputs
agree to float16 rounding: graph and eager may pick different split lengths (a graph's
grid is sized for its padded batch and context bucket), which changes the order of the
sums.
"""

import warnings

import numpy as np
import pytest

from hexcore import KVCacheConfig
from hexcore.cuda import (
    DecodeGraph,
    DecodeOptions,
    DeviceKVStore,
    SplitCosts,
    append,
    copy_tails,
    paged_decode,
    seal,
)
from hexcore.host import PagedKVCache

# Each step: finish, then admit (prefill), then fork, then one decode step of `batch`.
SCRIPT = [
    {"batch": "AB"},  # A grows; B's tail fills: a seal
    {"fork": {"C": "A"}, "batch": "ABC"},  # C shares A's blocks and copies A's tail; A and C seal
    {"finish": "B", "admit": {"D": 3}, "batch": "DAC"},  # B is replaced by D (in its slot); rows reorder
    {"finish": "C", "batch": "AD"},  # the batch shrinks back
]
PROMPTS = {"A": 22, "B": 15}  # block_size 16: A has a sealed block and 6 tail tokens


def prefill(cache, store, seq, n, rng):
    """Append ``n`` random tokens to ``seq`` tail by tail, sealing full tails (eager)."""
    cfg = store.config
    bs = cfg.block_size
    shape = (cfg.num_layers, n, cfg.num_kv_heads, cfg.head_dim)
    k, v = (rng.standard_normal(shape).astype(np.float16) for _ in range(2))
    done = cache.seq_len(seq)
    while k.shape[1]:
        take = min(k.shape[1], bs - done % bs)
        sealed = cache.grow_sequence(seq, done + take)
        append(store, np.ascontiguousarray(k[:, :take]), np.ascontiguousarray(v[:, :take]),
               np.full(take, seq, np.int32), np.arange(done % bs, done % bs + take, dtype=np.int32))
        if len(sealed):
            seal(store, np.array([seq], np.int32), np.ascontiguousarray(sealed[-1:], np.int32))
        done += take
        k, v = k[:, take:], v[:, take:]


def run_workload(cfg, num_q_heads, make_runner, seed, prompts=PROMPTS, script=SCRIPT, max_seqs=4, num_blocks=16):
    """Run ``script``; returns (outputs [L, B, Hq, D] per step, store bytes per step, runner)."""
    rng = np.random.default_rng(seed)
    cache = PagedKVCache(cfg, num_blocks=num_blocks, max_seqs=max_seqs)
    store = DeviceKVStore(cfg, num_blocks=num_blocks, max_seqs=max_seqs)
    store.poison()
    runner = make_runner(store, cache, num_q_heads)
    ids = {}
    for name, n in prompts.items():
        ids[name] = cache.add_sequence()
        prefill(cache, store, ids[name], n, rng)
    outputs, pools = [], []
    for event in script:
        for name in event.get("finish", ""):
            cache.free_sequence(ids.pop(name))
        for name, n in event.get("admit", {}).items():
            ids[name] = cache.add_sequence()
            prefill(cache, store, ids[name], n, rng)
        forks = []
        for child, parent in event.get("fork", {}).items():
            ids[child] = cache.fork_sequence(ids[parent])
            forks.append((ids[parent], ids[child]))
        result = cache.step(np.array([ids[n] for n in event["batch"]], np.int32))
        result.raise_for_status()
        L, B, H, D = cfg.num_layers, len(event["batch"]), cfg.num_kv_heads, cfg.head_dim
        q = rng.standard_normal((L, B, num_q_heads, D)).astype(np.float16)
        k, v = (rng.standard_normal((L, B, H, D)).astype(np.float16) for _ in range(2))
        outputs.append(runner(result, q, k, v, np.array(forks, np.int32).reshape(-1, 2)))
        pools.append(store.pool.copy_to_host())
    return outputs, pools, runner


def eager_runner(store, cache, num_q_heads):
    """Steps through the plain launchers, host arrays in (what serve.py does)."""
    cfg = store.config

    def step(result, q, k, v, forks):
        if len(forks):
            copy_tails(store, np.ascontiguousarray(forks[:, 0]), np.ascontiguousarray(forks[:, 1]))
        append(store, k, v, result.tail_slots.copy(), ((result.seq_lens - 1) % cfg.block_size).astype(np.int32))
        if result.num_sealed:
            seal(store, result.seal_slots, result.seal_blocks)
        tables = np.ascontiguousarray(result.block_tables)
        return np.stack([paged_decode(q[layer], store, layer, tables, result.seq_lens.copy(),
                                      result.tail_slots.copy()).copy_to_host() for layer in range(cfg.num_layers)])

    return step


def graph_runner(buckets, backend="auto", options=None):
    """Steps through a DecodeGraph (``options``: its DecodeOptions); the runner keeps it as ``.graph``."""

    def make(store, cache, num_q_heads):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the simulator says it runs eagerly
            graph = DecodeGraph(store, num_q_heads, cache.max_blocks_per_seq, batch_buckets=buckets, backend=backend,
                                options=options)

        def step(result, q, k, v, forks):
            views = graph.buffers(q.shape[1])
            for view, host in zip(views[:3], (q, k, v)):
                fill(view, host)
            out = graph.step(result.block_tables, result.seq_lens, result.tail_slots,
                             positions=((result.seq_lens - 1) % store.config.block_size).astype(np.int32),
                             seal_slots=result.seal_slots, seal_blocks=result.seal_blocks,
                             fork_src=forks[:, 0].copy() if len(forks) else None,
                             fork_dst=forks[:, 1].copy() if len(forks) else None)
            return to_host(out)

        step.graph = graph
        return step

    return make


def fill(view, host):
    """Write host data into a step buffer view (torch tensor or numba array)."""
    if hasattr(view, "copy_"):
        import torch

        view.copy_(torch.from_numpy(host).cuda())
    else:
        for layer in range(host.shape[0]):
            view[layer].copy_to_device(host[layer])


def to_host(out):
    if hasattr(out, "cpu"):
        return out.cpu().numpy()
    return np.stack([out[layer].copy_to_host() for layer in range(out.shape[0])])


def expected_keys(buckets, block_size, script=SCRIPT, prompts=PROMPTS):
    """The (batch bucket, context bucket) pairs the script needs; batches above the
    largest bucket run eagerly and need none."""
    lens, keys = dict(prompts), set()
    for event in script:
        for name in event.get("finish", ""):
            del lens[name]
        lens.update(event.get("admit", {}))
        lens.update({child: lens[parent] for child, parent in event.get("fork", {}).items()})
        for name in event["batch"]:
            lens[name] += 1
        batch, longest = len(event["batch"]), max(lens[n] for n in event["batch"])
        if batch <= max(buckets):
            keys.add((min(b for b in buckets if b >= batch), max(block_size, 1 << (longest - 1).bit_length())))
    return tuple(sorted(keys))


def assert_same(eager, graph):
    (eager_outs, eager_pools, _), (graph_outs, graph_pools, _) = eager, graph
    for step, (a, b) in enumerate(zip(eager_outs, graph_outs)):
        assert a.shape == b.shape, f"step {step}"
        assert np.isfinite(a).all() and (np.abs(a).max(axis=-1) > 0).all(), f"step {step}: empty eager output"
        np.testing.assert_allclose(b.astype(np.float32), a.astype(np.float32), rtol=2e-3, atol=2e-3,
                                   err_msg=f"attention output of step {step}")
    for step, (a, b) in enumerate(zip(eager_pools, graph_pools)):
        assert np.array_equal(a, b), f"store bytes differ after step {step}"


SIM_CASES = [  # (dtype, layers, query heads, buckets); the simulator costs ~0.3 s per CTA, so shapes are tiny
    ("fp16", 1, 1, (2, 3)),  # every batch fits a bucket exactly (several layers: test_engine, test_graph_api)
    ("int4", 1, 2, (4,)),  # every batch padded
    ("int2", 1, 1, (2,)),  # batches of 3 run the eager launchers, then the batch shrinks back into a bucket
]


@pytest.mark.parametrize("dtype,layers,heads,buckets", SIM_CASES, ids=[c[0] for c in SIM_CASES])
def test_graph_steps_equal_eager_steps(dtype, layers, heads, buckets, seed):
    cfg = KVCacheConfig(num_layers=layers, num_kv_heads=1, head_dim=64, block_size=16, kv_dtype=dtype, group_size=32)
    eager = run_workload(cfg, heads, eager_runner, seed)
    graph = run_workload(cfg, heads, graph_runner(buckets), seed)
    assert_same(eager, graph)
    assert graph[2].graph.prepared == expected_keys(buckets, cfg.block_size), f"seed {seed}"


@pytest.mark.gpu
@pytest.mark.parametrize("cluster", [False, True])
@pytest.mark.parametrize("backend", ["torch", "driver"])
@pytest.mark.parametrize("dtype", ["fp16", "int2"])
def test_graph_steps_with_dependent_launches_equal_eager_steps_gpu(dtype, backend, cluster, seed):
    """``DecodeOptions(dependent_launch=True)``: the captured step's decodes are programmatic
    dependent launches (each may start while the seal or the previous layer's decode, which
    shares its split workspace, finishes); the outputs are the eager steps'. ``cluster``:
    with ``cluster_merge``, the decodes of 2-8 splits are captured as cluster launches."""
    if backend == "torch":
        pytest.importorskip("torch")
    cfg = KVCacheConfig(num_layers=4, num_kv_heads=8, head_dim=128, block_size=16, kv_dtype=dtype, group_size=64)
    prompts = {"A": 300, "B": 95}
    script = SCRIPT + [{"batch": "AD"}] * 3
    kwargs = {"prompts": prompts, "script": script, "max_seqs": 8, "num_blocks": 64}
    eager = run_workload(cfg, 32, eager_runner, seed, **kwargs)
    options = DecodeOptions(dependent_launch=True, ctas_per_sm=16,  # 2-8 splits a sequence (4 at B=4-8)
                            split_costs=SplitCosts(0, 2.0, 2.0, 0), cluster_merge=cluster)
    graph = run_workload(cfg, 32, graph_runner((1, 2, 4, 8), backend, options), seed, **kwargs)
    assert_same(eager, graph)
    assert len(graph[2].graph.captured) < len(script), "no step replayed a graph"
    decodes = [p for step in graph[2].graph._steps.values() for p in step._decode]
    assert any(p.grid[0] > 1 for p in decodes), "no decode was split"
    assert any(p.cluster > 1 for p in decodes) is cluster, [(p.grid, p.cluster) for p in decodes]


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["torch", "driver"])
@pytest.mark.parametrize("dtype", ["fp16", "int4", "int2"])
def test_graph_steps_equal_eager_steps_gpu(dtype, backend, seed):
    """Real graphs (captured on a bucket pair's first step, replayed after), 4 layers,
    GQA 32/8, longer prompts, so contexts span several buckets and split counts."""
    if backend == "torch":
        pytest.importorskip("torch")
    cfg = KVCacheConfig(num_layers=4, num_kv_heads=8, head_dim=128, block_size=16, kv_dtype=dtype, group_size=64)
    prompts = {"A": 300, "B": 95}
    script = SCRIPT + [{"batch": "AD"}] * 3  # the same bucket pair again: replays
    kwargs = {"prompts": prompts, "script": script, "max_seqs": 8, "num_blocks": 64}
    eager = run_workload(cfg, 32, eager_runner, seed, **kwargs)
    graph = run_workload(cfg, 32, graph_runner((1, 2, 4, 8), backend), seed, **kwargs)
    assert_same(eager, graph)
    dg = graph[2].graph
    assert dg.backend == backend
    assert dg.captured == dg.prepared == expected_keys((1, 2, 4, 8), 16, script, prompts)
    assert len(dg.captured) < len(script), "no step replayed a graph"
