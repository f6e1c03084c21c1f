"""The Engine facade: prefill, fork, steps (whole or per layer), finish, all-or-nothing errors."""

import math
import warnings

import numpy as np
import pytest

from hexcore import HexcoreInvalidArgumentError, HexcoreInvalidSequenceError, HexcoreOOMError, KVCacheConfig
from hexcore.engine import Engine
from tests import reference as ref


def make_engine(dtype="int4", layers=2, num_blocks=12, max_seqs=4, block_size=16, heads=1, q_heads=2, head_dim=64,
                **kwargs):
    cfg = KVCacheConfig(num_layers=layers, num_kv_heads=heads, head_dim=head_dim, block_size=block_size,
                        kv_dtype=dtype, group_size=32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the simulator's eager graphs
        engine = Engine(cfg, num_blocks, max_seqs, q_heads, batch_buckets=(1, 2, 4), **kwargs)
    engine.store.poison()
    return engine


class Mirror:
    """The exact K/V an engine was given, per sequence: [L, n, H, D] float16."""

    def __init__(self):
        self.k, self.v = {}, {}

    def add(self, seq, k, v):
        self.k[seq] = np.concatenate([self.k[seq], k], axis=1) if seq in self.k else k
        self.v[seq] = np.concatenate([self.v[seq], v], axis=1) if seq in self.v else v

    def expect(self, engine, seqs, q, layer):
        """Attention over the cache as it holds it: sealed blocks dequantized, tails exact."""
        cfg = engine.config
        keys, values = [], []
        for seq in seqs:
            k = self.k[seq][layer].transpose(1, 0, 2)  # [H, n, D]
            v = self.v[seq][layer].transpose(1, 0, 2)
            n_sealed = (k.shape[1] // cfg.block_size) * cfg.block_size
            if cfg.kv_dtype.is_quantized and n_sealed:
                ks, vs = [], []
                for start in range(0, n_sealed, cfg.block_size):
                    blk_k, blk_v = k[:, start:start + cfg.block_size], v[:, start:start + cfg.block_size]
                    kc, km, vc, vm = ref.quantize_block(blk_k, blk_v, cfg.kv_dtype.bits, cfg.group_size)
                    ks.append(ref.dequantize_keys(kc, km, cfg.kv_dtype.bits))
                    vs.append(ref.dequantize_values(vc, vm, cfg.kv_dtype.bits, cfg.group_size))
                k = np.concatenate(ks + [k[:, n_sealed:].astype(np.float64)], axis=1)
                v = np.concatenate(vs + [v[:, n_sealed:].astype(np.float64)], axis=1)
            keys.append(np.asarray(k, np.float64))
            values.append(np.asarray(v, np.float64))
        return ref.decode_attention(q, keys, values, 1 / math.sqrt(cfg.head_dim))


def random_kv(rng, engine, n):
    cfg = engine.config
    shape = (cfg.num_layers, n, cfg.num_kv_heads, cfg.head_dim)
    return rng.standard_normal(shape).astype(np.float16), rng.standard_normal(shape).astype(np.float16)


def run_steps(engine, mirror, seqs, rng, steps, per_layer=False):
    """Decode steps for ``seqs``; asserts each step's output equals the reference."""
    cfg = engine.config
    for _ in range(steps):
        step = engine.step(seqs)
        q = rng.standard_normal((cfg.num_layers, len(seqs), engine.num_q_heads, cfg.head_dim)).astype(np.float16)
        k, v = random_kv(rng, engine, len(seqs))  # [L, B, H, D]: one new token per sequence
        step.write(q, k, v)
        if per_layer:
            for layer in range(cfg.num_layers):
                step.attend(layer)
        else:
            step.run()
        got = step.output()
        for j, seq in enumerate(seqs):
            mirror.add(seq, k[:, j:j + 1], v[:, j:j + 1])
        for layer in range(cfg.num_layers):
            expect = mirror.expect(engine, seqs, q[layer], layer)
            assert ref.relative_l2(got[layer], expect) <= 2e-3


@pytest.mark.parametrize("dtype,per_layer", [("fp16", False), ("int4", True)], ids=["fp16-whole", "int4-per-layer"])
def test_prefill_fork_steps_and_finish(dtype, per_layer, rng):
    engine, mirror = make_engine(dtype), Mirror()
    a = engine.add()
    k, v = random_kv(rng, engine, 37)  # two sealed blocks and 5 tail tokens, in three appends
    engine.prefill(a, k, v)
    mirror.add(a, k, v)
    assert engine.seq_len(a) == 37 and len(engine.cache.block_table(a)) == 2
    b = engine.fork(a)  # its tail copy rides in the next step
    mirror.add(b, mirror.k[a], mirror.v[a])
    run_steps(engine, mirror, [a, b], rng, 2, per_layer)
    engine.finish(a)
    run_steps(engine, mirror, [b], rng, 1, per_layer)
    engine.cache.check_invariants()


def test_prefill_onto_a_partial_tail_and_after_a_fork(rng):
    engine, mirror = make_engine("int2"), Mirror()
    a = engine.add()
    for n in (5, 27):  # 5 into the tail, then 11 to fill it (a seal), then 16 more: a second seal
        k, v = random_kv(rng, engine, n)
        engine.prefill(a, k, v)
        mirror.add(a, k, v)
    b = engine.fork(a)
    mirror.add(b, mirror.k[a], mirror.v[a])
    k, v = random_kv(rng, engine, 3)
    engine.prefill(b, k, v)  # the fork's tail is copied first
    mirror.add(b, k, v)
    run_steps(engine, mirror, [a, b], rng, 1)


def test_a_step_is_all_or_nothing():
    engine = make_engine(num_blocks=2)
    a, b = engine.add(), engine.add()
    k, v = np.zeros((2, 31, 1, 64), np.float16), np.zeros((2, 31, 1, 64), np.float16)
    engine.prefill(a, k, v)  # one sealed block, 15 tail tokens: the next token seals
    engine.prefill(b, k, v)  # the last free block
    before = engine.cache.seq_len(a), engine.cache.seq_len(b), engine.cache.num_free_blocks
    with pytest.raises(HexcoreOOMError, match="short of blocks"):
        engine.step([a, b])
    with pytest.raises(HexcoreInvalidSequenceError, match=r"seq_ids\[1\] = 3"):
        engine.step([a, 3])
    with pytest.raises(HexcoreInvalidArgumentError, match=r"seq_ids\[1\] = 0"):
        engine.step([a, a])
    assert (engine.cache.seq_len(a), engine.cache.seq_len(b), engine.cache.num_free_blocks) == before
    engine.cache.check_invariants()


def test_bad_prefill_changes_nothing():
    engine = make_engine()
    a = engine.add()
    for k, v, text in ((np.zeros((2, 4, 1, 64), np.float32), np.zeros((2, 4, 1, 64), np.float32), "dtype"),
                       (np.zeros((2, 4, 1, 32), np.float16), np.zeros((2, 4, 1, 32), np.float16), "shape"),
                       (np.zeros((2, 4, 1, 64), np.float16), np.zeros((2, 5, 1, 64), np.float16), "like k"),
                       (np.zeros((2, 500, 1, 64), np.float16), np.zeros((2, 500, 1, 64), np.float16), "max_seq_len")):
        with pytest.raises((HexcoreInvalidArgumentError, HexcoreInvalidSequenceError), match=text):
            engine.prefill(a, k, v)
    assert engine.seq_len(a) == 0 and engine.cache.num_free_blocks == 12


def test_a_step_runs_once():
    engine = make_engine()
    a = engine.add()
    engine.prefill(a, np.zeros((2, 3, 1, 64), np.float16), np.zeros((2, 3, 1, 64), np.float16))
    step = engine.step([a])
    step.run()
    with pytest.raises(HexcoreInvalidArgumentError, match="already"):
        step.attend(0)
    with pytest.raises(HexcoreInvalidArgumentError, match="float16"):
        engine.step([a]).write(np.zeros(3), np.zeros(3), np.zeros(3))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "int4", "int2"])
def test_engine_on_gpu(dtype, rng):
    """llama-3-8b attention heads, 3 layers: prefill, fork, graph-replayed and per-layer steps."""
    engine, mirror = make_engine(dtype, layers=3, num_blocks=64, max_seqs=8, block_size=32, heads=8, q_heads=32,
                                 head_dim=128), Mirror()
    seqs = []
    for n in (300, 95, 31):
        seq = engine.add()
        k, v = random_kv(rng, engine, n)
        engine.prefill(seq, k, v)
        mirror.add(seq, k, v)
        seqs.append(seq)
    child = engine.fork(seqs[0])
    mirror.add(child, mirror.k[seqs[0]], mirror.v[seqs[0]])
    run_steps(engine, mirror, seqs + [child], rng, 3)
    run_steps(engine, mirror, seqs + [child], rng, 1, per_layer=True)
    assert engine.graph.captured  # a step was replayed from a graph
