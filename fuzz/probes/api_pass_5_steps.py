"""Hostile values into what was added or grown since pass 4 (pass 5, the steps area):
FaultTolerantKVCache (verify / try_verify under each policy, scrub / try_scrub, record,
prepare_verify, check_results, migrate_sequence, refill, fault injection, decode_graph,
sample_step, graph_step, graph_load, check_graph / try_check_graph, stats), the host
launchers of hexcore.cuda.integrity, the decode-step layer (DecodeGraph, DecodeStep,
StepBuffers), the Engine's public methods, the store operations exported by hexcore.cuda
(copies, prepared appends and seals, seal_rows, nonfinite_flags, dequantize_blocks, the
layout checks, uploads, views) and the ``hexcore`` command's flags.

Prints every call that ended in anything but a typed error, and every refused call that
left state changed: the block manager (block states, free count, lengths, invariants),
the device store's pool, the recorded digests, the quarantine set and the fault cache's
own books; after a refused call a valid one must still work (checked per section).
Sections can be picked by name (``fault integrity steps engine store cli``); all by default.

cd fuzz/probes && NUMBA_ENABLE_CUDASIM=1 nice -n 5 python api_pass_5_steps.py [SECTION ...]
"""
import contextlib
import io
import sys
import warnings

import numpy as np

from _probe import RAW, refused_unchanged, report
from _probe import t as _t
from hexcore import FaultTolerantKVCache, KVCacheConfig, PagedKVCache
from hexcore.errors import HexcoreError

warnings.simplefilter("ignore")
if __import__("os").environ.get("NUMBA_ENABLE_CUDASIM") == "1":
    from hexcore.cuda.simulated import use_fast_simulator

    use_fast_simulator()  # as tests/conftest.py: 4.5x faster launches
from numba import cuda  # noqa: E402 (after the simulator is chosen by the environment)

from hexcore import cuda as hc  # noqa: E402
from hexcore.cuda import integrity, uploads, views  # noqa: E402
from hexcore.cuda.steps import DecodeGraph, StepBuffers  # noqa: E402
from hexcore.engine import Engine  # noqa: E402

H = [None, True, np.bool_(False), 1.5, float("nan"), float("inf"), -1, 10**30, "3", b"1", [1], object(),
     np.array([1]), np.zeros((2, 2)), np.int64(2), np.uint8(1), np.float32(2.0), 0, 10**6]
ARRAYS = [np.array([0, 1], np.int32), np.array([-1, 3], np.int32), np.array([1.5, 2.0]), np.array([10**9, 2]),
          np.zeros(0, np.int32), np.array([[1, 2]], np.int32), [2, 3], np.array([2, 2], np.int32),
          np.array([3, 4], np.int64), np.array([99], np.int32), np.arange(8, dtype=np.int32)[::2], None, 3]
CFG = KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=64, block_size=16, kv_dtype="int4", group_size=32)
BS = CFG.block_size


def t(label, fn):
    """_probe.t with the label on one line (2-D arrays print on several)."""
    _t(" ".join(label.split()), fn)


SECTIONS = sys.argv[1:] or ["fault", "integrity", "steps", "engine", "store", "cli"]


def ids(*values):
    return np.array(values, np.int32)


class Rig:
    """A cache of 10 blocks and 3 slots, its store and a FaultTolerantKVCache; seq 0 holds
    two recorded sealed blocks and 3 tail tokens, seq 1 one block and a fork of seq 0 is seq 2."""

    def __init__(self, prefix=False, **kwargs):
        self.cache = PagedKVCache(CFG, 10, 3, prefix_cache=prefix)
        self.store = hc.DeviceKVStore(CFG, 10, 3)
        rng = np.random.default_rng(0)
        words = rng.integers(0, 1 << 32, self.store.pool.shape[0], dtype=np.uint32)
        self.store.pool.copy_to_device(words & ~np.uint32(0x40004000))  # finite float16
        self.store.fill_guards()
        self.ft = FaultTolerantKVCache(self.cache, self.store, **kwargs)
        a, b = self.cache.add_sequence(), self.cache.add_sequence()
        for seq, n in ((a, 35), (b, 16)):
            toks = np.arange(n, dtype=np.int32) if prefix else None
            starts = ids(0, n) if prefix else None
            r = self.cache.step(ids(seq), ids(n), tokens=toks, token_starts=starts)
            r.raise_for_status()
            hc.seal(self.store, r.seal_slots, r.seal_blocks)
            self.ft.record_seals(r)
        self.fork = self.cache.fork_sequence(a)

    def state(self):
        c, ft = self.cache, self.ft
        lens = tuple(c.seq_len(s) if c.is_live(s) else -1 for s in range(c.max_seqs))
        return (c.block_states().tobytes(), c.num_free_blocks, lens, self.store.pool.copy_to_host().tobytes(),
                ft.sums.copy_to_host().tobytes(), ft.recorded.tobytes(), dict(ft._bad), dict(ft._lost),
                tuple(ft.quarantined), ft._calls, ft._scrub_at, dict(ft._stats))


def unchanged(label, rig, fn):
    """``fn()`` must leave the rig as it found it when it raises; the invariants must hold."""
    names = ("states", "free", "lens", "pool", "sums", "recorded", "bad", "lost", "quarantined", "calls",
             "scrub_at", "stats")
    refused_unchanged(label, fn, rig.state, rig.ft.check_invariants, names)


def works(label, fn):
    """A valid call after the hostile ones must work."""
    try:
        fn()
    except BaseException as e:  # noqa: BLE001
        RAW.append(f"{label[:70]}: a valid call failed after refused ones: {type(e).__name__}: {str(e)[:100]}")


def probe(label, rig, fn):
    t(label, lambda: unchanged(label, rig, fn))


# -- FaultTolerantKVCache --------------------------------------------------------------
def fault_section():
    for h in H:
        c = PagedKVCache(CFG, 10, 3)
        s = hc.DeviceKVStore(CFG, 10, 3)
        for kw in ("policy", "sample_every", "scrub_blocks", "metrics"):
            t(f"FaultTolerantKVCache({kw}={h!r})", lambda: FaultTolerantKVCache(c, s, **{kw: h}))
        t(f"FaultTolerantKVCache(cache={h!r})", lambda: FaultTolerantKVCache(h, s))
        t(f"FaultTolerantKVCache(store={h!r})", lambda: FaultTolerantKVCache(c, h))
    for policy in ("always", "sampled", "off"):
        rig = Rig(policy=policy, sample_every=2)
        for a in ARRAYS + H + [ids(7), ids(0, 0), ids(0, 1, 2, 0)]:
            probe(f"verify({a!r}, policy={policy})", rig, lambda: rig.ft.verify(a))
            t(f"try_verify({a!r}, policy={policy})", lambda: _status(rig.ft.try_verify(a)))
        rig.cache.free_sequence(1)
        probe(f"verify(freed, policy={policy})", rig, lambda: rig.ft.verify(ids(1)))
        for h in H:
            probe(f"verify(stream={h!r})", rig, lambda: rig.ft.verify(ids(0), stream=h))
        works(f"verify after, policy={policy}", lambda: rig.ft.verify(ids(0, 2)))
    rig = Rig(prefix=True, policy="sampled", sample_every=3)
    for a in ARRAYS + [ids(0, 1, 2)]:
        probe(f"verify({a!r}, prefix)", rig, lambda: rig.ft.verify(a))
    for h in H:
        probe(f"scrub({h!r}, prefix)", rig, lambda: rig.ft.scrub(h))
    works("verify after, prefix", lambda: rig.ft.verify(ids(0, 1, 2)))
    rig = Rig()
    for h in H:
        probe(f"scrub({h!r})", rig, lambda: rig.ft.scrub(h))
        t(f"try_scrub({h!r})", lambda: _status(rig.ft.try_scrub(h)))
        probe(f"scrub(stream={h!r})", rig, lambda: rig.ft.scrub(1, stream=h))
    works("scrub after", lambda: rig.ft.scrub())
    rig = Rig()
    for a in ARRAYS + H + [ids(10), ids(-1)]:
        probe(f"record({a!r})", rig, lambda: rig.ft.record(a))
        probe(f"record_seals({a!r})", rig, lambda: rig.ft.record_seals(a))
        probe(f"prepare_verify({a!r}, out)", rig,
              lambda: rig.ft.prepare_verify(a, cuda.device_array((2, 1), np.uint32)))
        probe(f"prepare_verify(ids, out={a!r})", rig, lambda: rig.ft.prepare_verify(cuda.to_device(ids(0, 1)), a))
        probe(f"check_results({a!r}, zeros)", rig, lambda: rig.ft.check_results(a, np.zeros((2, 1), np.uint32)))
        probe(f"check_results(ids, {a!r})", rig, lambda: rig.ft.check_results(ids(0, 1), a))
    works("record after", lambda: rig.ft.record(ids(0)))
    for h in H + [5, 2**31]:
        for prefix in (False, True):
            rig = Rig(prefix=prefix)
            probe(f"migrate_sequence({h!r}, prefix={prefix})", rig, lambda: rig.ft.migrate_sequence(h))
    rig = Rig()
    probe("migrate_sequence(stream='x')", rig, lambda: rig.ft.migrate_sequence(0, stream="x"))
    works("migrate_sequence after", lambda: rig.ft.migrate_sequence(0))
    rig = Rig()
    kv = np.zeros((1, BS, 1, 64), np.float16)
    for h in H:
        probe(f"refill(seq={h!r})", rig, lambda: rig.ft.refill(h, 0, kv, kv))
        probe(f"refill(logical={h!r})", rig, lambda: rig.ft.refill(0, h, kv, kv))
        probe(f"refill(k={h!r})", rig, lambda: rig.ft.refill(0, 0, h, kv))
    bad = int(rig.cache.block_table(0)[0])
    rig.ft.flip_bit("k_codes", 0, bad, 0, 0)
    with contextlib.suppress(HexcoreError):
        rig.ft.verify(ids(0))
    moved = rig.ft.migrate_sequence(0)
    logical = moved["lost"][0][0]
    for name, kk, vv in (("k wrong shape", np.zeros((1, BS - 1, 1, 64), np.float16), kv),
                         ("k float32", np.zeros((1, BS, 1, 64), np.float32), kv), ("v None", kv, None),
                         ("k list", [1], kv)):
        probe(f"refill({name})", rig, lambda: rig.ft.refill(0, logical, kk, vv))
    works("refill after", lambda: rig.ft.refill(0, logical, kv, kv))
    rig = Rig()
    for h in H + [4, 2**20, 10**9, "k_tails", "pool"]:
        probe(f"flip_bit(name={h!r})", rig, lambda: rig.ft.flip_bit(h, 0, 0, 0, 0))
        probe(f"flip_bit(layer={h!r})", rig, lambda: rig.ft.flip_bit("k_codes", h, 0, 0, 0))
        probe(f"flip_bit(unit={h!r})", rig, lambda: rig.ft.flip_bit("k_codes", 0, h, 0, 0))
        probe(f"flip_bit(byte={h!r})", rig, lambda: rig.ft.flip_bit("k_codes", 0, 0, h, 0))
        probe(f"flip_bit(bit={h!r})", rig, lambda: rig.ft.flip_bit("k_codes", 0, 0, 0, h))
        probe(f"flip_byte(byte={h!r})", rig, lambda: rig.ft.flip_byte("v_meta", 0, 0, h))
        probe(f"flip_word(word={h!r})", rig, lambda: rig.ft.flip_word("k_tails", 0, 0, h))
        probe(f"clobber_canary(region={h!r})", rig, lambda: rig.ft.clobber_canary(h))
        probe(f"clobber_canary(index={h!r})", rig, lambda: rig.ft.clobber_canary(0, h))
        probe(f"clobber_canary(value={h!r})", rig, lambda: rig.ft.clobber_canary(0, 0, h))
    for word in range(0, 200, 7):  # words whose last bytes pass the run's end
        probe(f"flip_word(k_codes, word={word})", rig, lambda: _flip_and_back(rig, "k_codes", word))
    works("flip_bit after", lambda: rig.ft.flip_bit("k_codes", 0, 0, 0, 0))
    t("stats", lambda: rig.ft.stats())
    t("prometheus_collector", lambda: list(rig.ft.prometheus_collector().collect()))
    graph_section_of_fault()


def _flip_and_back(rig, name, word):
    """flip_word twice (a no-op when it works); refused: must leave the pool as it was."""
    rig.ft.flip_word(name, 0, 0, word)
    rig.ft.flip_word(name, 0, 0, word)


def _status(status):
    from hexcore import Status

    if not isinstance(status, Status):
        raise AssertionError(f"try_* returned {status!r}, not a Status")


def graph_section_of_fault():
    rig = Rig(policy="always")
    graph = rig.ft.decode_graph(2, max_verify_blocks=4, batch_buckets=(1, 2, 4))
    for h in H:
        probe(f"decode_graph(num_q_heads={h!r})", rig, lambda: rig.ft.decode_graph(h))
        probe(f"decode_graph(max_verify_blocks={h!r})", rig, lambda: rig.ft.decode_graph(2, h))
    probe("decode_graph(bogus=1)", rig, lambda: rig.ft.decode_graph(2, bogus=1))
    probe("decode_graph(verify_sums=x)", rig, lambda: rig.ft.decode_graph(2, verify_sums=None))
    other = DecodeGraph(rig.store, 2, rig.cache.max_blocks_per_seq, batch_buckets=(1,))
    result = rig.cache.step(ids(0, 2))
    for h in H + [other, graph.store]:
        probe(f"sample_step({h!r})", rig, lambda: rig.ft.sample_step(h))
        probe(f"graph_step(graph={h!r})", rig, lambda: rig.ft.graph_step(h, result))
        probe(f"graph_step(result={h!r})", rig, lambda: rig.ft.graph_step(graph, h))
        probe(f"graph_load(graph={h!r})", rig, lambda: rig.ft.graph_load(h, result))
        probe(f"check_graph({h!r})", rig, lambda: rig.ft.check_graph(h))
        t(f"try_check_graph({h!r})", lambda: _status(rig.ft.try_check_graph(h)))
    for a in ARRAYS:
        probe(f"graph_step(fork_src={a!r})", rig, lambda: rig.ft.graph_step(graph, result, a, ids(1)))
        probe(f"graph_step(fork_dst={a!r})", rig, lambda: rig.ft.graph_step(graph, result, ids(0), a))
        probe(f"graph_load(fork_src={a!r})", rig, lambda: rig.ft.graph_load(graph, result, a, ids(1)))
    for h in H:
        probe(f"graph_step(stream={h!r})", rig, lambda: rig.ft.graph_step(graph, result, stream=h))
        probe(f"check_graph(stream={h!r})", rig, lambda: rig.ft.check_graph(graph, stream=h))
    small = rig.ft.decode_graph(2, max_verify_blocks=1, batch_buckets=(2,))
    probe("graph_step(max_verify_blocks too small)", rig, lambda: rig.ft.graph_step(small, result))
    works("graph_step after", lambda: rig.ft.graph_step(graph, result))
    works("check_graph after", lambda: rig.ft.check_graph(graph))


# -- integrity launchers ---------------------------------------------------------------
def integrity_section():
    rig = Rig()
    store = rig.store
    hs = cuda.device_array((10, 1, 1), np.uint32)
    good = cuda.to_device(ids(0, 1))
    for a in ARRAYS + H + [ids(10), cuda.to_device(np.zeros(2, np.int64)), cuda.to_device(ids(0, 1, 2)[None])]:
        probe(f"head_record_launch(ids={a!r:.40})", rig, lambda: integrity.head_record_launch(store, a, hs))
        probe(f"record_head_sums(ids={a!r:.40})", rig, lambda: integrity.record_head_sums(store, a, hs))
        probe(f"prepare_head_record(ids={a!r:.40})", rig, lambda: integrity.prepare_head_record(store, a, hs))
        probe(f"checksum_blocks(ids={a!r:.40})", rig, lambda: integrity.checksum_blocks(store, a))
    for a in H + [np.zeros((10, 1, 1), np.uint32), cuda.device_array((10, 1, 1), np.float32),
                  cuda.device_array((9, 1, 1), np.uint32), cuda.device_array((10, 1), np.uint32)]:
        probe(f"record_head_sums(head_sums={a!r:.40})", rig, lambda: integrity.record_head_sums(store, good, a))
        probe(f"prepare_head_record(head_sums={a!r:.40})", rig,
              lambda: integrity.prepare_head_record(store, good, a))
    for h in H:
        probe(f"head_record_launch(store={h!r})", rig, lambda: integrity.head_record_launch(h, good, hs))
        probe(f"check_guards(store={h!r})", rig, lambda: integrity.check_guards(h))
        probe(f"check_guards(stream={h!r})", rig, lambda: integrity.check_guards(store, h))
        probe(f"checksum_blocks(stream={h!r})", rig, lambda: integrity.checksum_blocks(store, ids(0), h))
        probe(f"record_head_sums(stream={h!r})", rig, lambda: integrity.record_head_sums(store, good, hs, h))
    sums, out, gb = rig.ft.sums, cuda.device_array((2, 1), np.uint32), cuda.device_array(6, np.uint32)
    flags, found = cuda.device_array(2, np.uint32), cuda.device_array((4, 2), np.int32)
    for h in H + ["VERIFY", "record "]:
        probe(f"checksum_launch(mode={h!r})", rig, lambda: integrity.checksum_launch(store, good, sums, out, gb, h))
    for a in H + [np.zeros((10, 1), np.uint32), cuda.device_array((10, 2), np.uint32),
                  cuda.device_array((3,), np.uint32), cuda.device_array((10, 1), np.int32)]:
        for name in ("sums", "out", "guard_bad", "flags", "found"):
            args = dict(sums=sums, out=out, guard_bad=gb, flags=flags, found=found)
            args[name] = a
            probe(f"prepare_checksum({name}={a!r:.40})", rig,
                  lambda: integrity.prepare_checksum(store, good, mode="verify", **args))
    probe("checksum_launch(flags only)", rig,
          lambda: integrity.checksum_launch(store, good, sums, out, gb, "verify", flags, None))
    works("checksum_blocks after", lambda: integrity.checksum_blocks(store, ids(0, 1)))
    works("check_guards after", lambda: integrity.check_guards(store))


# -- the decode-step layer ---------------------------------------------------------------
def steps_section():
    rig = Rig()
    store = rig.store
    for h in H + [[], [0], [1, -1], (1,) * 65, "12", range(0)]:
        for kw in ("num_q_heads", "max_blocks_per_seq", "batch_buckets", "scale", "backend", "options",
                   "verify_sums", "max_verify_blocks"):
            base = dict(num_q_heads=2, max_blocks_per_seq=4)
            base[kw] = h
            probe(f"DecodeGraph({kw}={h!r:.40})", rig, lambda: DecodeGraph(store, **base))
    for a in (np.zeros((10, 1), np.uint32), cuda.device_array((10, 1), np.int32), cuda.device_array(10, np.uint32)):
        probe(f"DecodeGraph(verify_sums={a!r:.40})", rig, lambda: DecodeGraph(store, 2, 4, verify_sums=a))
    graph = rig.ft.decode_graph(2, max_verify_blocks=4, batch_buckets=(1, 2))
    for h in H + [65536, 2**31, 3]:
        probe(f"graph.buffers({h!r})", rig, lambda: graph.buffers(h))
        probe(f"graph.context_bucket({h!r})", rig, lambda: graph.context_bucket(h))
        probe(f"graph.warmup(batch={h!r})", rig, lambda: graph.warmup(h, 16))
        probe(f"graph.warmup(max_seq_len={h!r})", rig, lambda: graph.warmup(1, h))
        probe(f"graph.verify_results(stream={h!r})", rig, lambda: graph.verify_results(h))
    result = rig.cache.step(ids(0, 2))
    good = dict(block_tables=result.block_tables, seq_lens=result.seq_lens, tail_slots=result.tail_slots)
    names = ("block_tables", "seq_lens", "tail_slots", "positions", "seal_slots", "seal_blocks", "fork_src",
             "fork_dst", "verify_blocks")
    for name in names:
        for a in ARRAYS + [np.zeros((2, 3), np.int32), np.full((2, 4), 99, np.int32), ids(0, 1), ids(2**31 - 1)]:
            args = dict(good)
            args[name] = a
            probe(f"graph.step({name}={a!r:.40})", rig, lambda: graph.step(**args))
            probe(f"graph.load({name}={a!r:.40})", rig, lambda: graph.load(**args))
    for h in H:
        probe(f"graph.step(stream={h!r})", rig, lambda: graph.step(**good, stream=h))
    works("graph.step after", lambda: graph.step(**good))
    loaded = graph.load(**good)
    for h in H + [1, 2**40]:
        probe(f"DecodeStep.enqueue(layer={h!r})", rig, lambda: loaded.enqueue(h))
        probe(f"DecodeStep.enqueue(stream={h!r})", rig, lambda: loaded.enqueue(0, h))
        probe(f"DecodeStep.enqueue_all(stream={h!r})", rig, lambda: loaded.enqueue_all(h))
        probe(f"DecodeStep.enqueue_all(num_seals={h!r})", rig, lambda: loaded.enqueue_all(0, h))
        probe(f"DecodeStep.enqueue_all(num_verify={h!r})", rig, lambda: loaded.enqueue_all(0, None, h))
    buffers = loaded.buffers
    for h in H + [2**31, 3, 5]:
        probe(f"StepBuffers.tables({h!r})", rig, lambda: buffers.tables(h))
        probe(f"StepBuffers.fork({h!r})", rig, lambda: buffers.fork(h))
        probe(f"StepBuffers.seal({h!r})", rig, lambda: buffers.seal(h))
        probe(f"StepBuffers.seal(1, layer={h!r})", rig, lambda: buffers.seal(1, h))
        probe(f"StepBuffers.record_launch({h!r})", rig, lambda: buffers.record_launch(h))
        probe(f"StepBuffers.verify_launch({h!r})", rig, lambda: buffers.verify_launch(h))
        for kw in ("num_q_heads", "bucket", "max_blocks_per_seq", "verify"):
            args = dict(num_q_heads=2, bucket=1, max_blocks_per_seq=4, verify=None)
            args[kw] = h
            probe(f"StepBuffers({kw}={h!r})", rig, lambda: StepBuffers(store, **args))
        probe(f"StepBuffers(store={h!r})", rig, lambda: StepBuffers(h, 2, 1, 4))
    from hexcore.cuda.attention.launcher import Workspace
    from hexcore.cuda.steps import DecodeStep

    for h in H + [15, 16, 79, 80, 2**31]:
        probe(f"DecodeStep(max_seq_len={h!r})", rig, lambda: DecodeStep(store, buffers, h, None, Workspace()))
        probe(f"DecodeStep(scale={h!r})", rig, lambda: DecodeStep(store, buffers, 32, h, Workspace()))
        probe(f"DecodeStep(store={h!r})", rig, lambda: DecodeStep(h, buffers, 32, None, Workspace()))
        probe(f"DecodeStep(buffers={h!r})", rig, lambda: DecodeStep(store, h, 32, None, Workspace()))
        probe(f"DecodeStep(workspace={h!r})", rig, lambda: DecodeStep(store, buffers, 32, None, h))
        probe(f"DecodeStep(options={h!r})", rig, lambda: DecodeStep(store, buffers, 32, None, Workspace(), h))
    works("graph.step after all", lambda: graph.step(**good))


# -- the Engine --------------------------------------------------------------------------
def make_engine(**kwargs):
    engine = Engine(CFG, 10, 3, 2, batch_buckets=(1, 2), **kwargs)
    a = engine.add()
    k = np.random.default_rng(1).standard_normal((1, 20, 1, 64)).astype(np.float16)
    engine.prefill(a, k, k)
    return engine, a


def engine_state(engine):
    c = engine.cache
    lens = tuple(c.seq_len(s) if c.is_live(s) else -1 for s in range(c.max_seqs))
    return (c.block_states().tobytes(), c.num_free_blocks, lens, engine.store.pool.copy_to_host().tobytes(),
            tuple(engine._forks))


def eprobe(label, engine, fn):
    t(label, lambda: refused_unchanged(label, fn, lambda: engine_state(engine), engine.cache.check_invariants))


def _is_int(value, n) -> bool:
    """True for an int or numpy integer (not a bool) equal to ``n``."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)) and int(value) == n


def engine_section():
    for h in H + [{}, {"policy": "off"}, {"max_verify_blocks": 2**21}]:
        for kw in ("num_blocks", "max_seqs", "num_q_heads", "max_seq_len", "batch_buckets", "backend", "scale",
                   "options", "metrics", "prefix_cache", "speculative", "fault_tolerance"):
            args = dict(num_blocks=10, max_seqs=3, num_q_heads=2)
            args[kw] = h
            t(f"Engine({kw}={h!r:.40})", lambda: Engine(CFG, **args))
        t(f"Engine(config={h!r:.40})", lambda: Engine(h, 10, 3, 2))
    for faults in (False, {"policy": "always", "max_verify_blocks": 16}):
        engine, a = make_engine(fault_tolerance=faults)
        kv = np.zeros((1, 3, 1, 64), np.float16)
        for h in H + [5, 2**31, 2]:
            eprobe(f"engine.add({h!r})", engine, lambda: None if _is_int(h, 2) else engine.add(h))
            eprobe(f"engine.fork({h!r})", engine, lambda: engine.fork(h))
            eprobe(f"engine.finish({h!r})", engine, lambda: None if _is_int(h, 0) else engine.finish(h))
            eprobe(f"engine.seq_len({h!r})", engine, lambda: engine.seq_len(h))
            eprobe(f"engine.prefill(seq={h!r})", engine, lambda: engine.prefill(h, kv, kv))
            eprobe(f"engine.prefill(k={h!r})", engine, lambda: engine.prefill(a, h, kv))
            eprobe(f"engine.prefill(v={h!r})", engine, lambda: engine.prefill(a, kv, h))
            eprobe(f"engine.prefill(tokens={h!r})", engine, lambda: engine.prefill(a, kv, kv, tokens=h))
            eprobe(f"engine.prefill(stream={h!r})", engine, lambda: engine.prefill(a, kv, kv, stream=h))
            eprobe(f"engine.buffers({h!r})", engine, lambda: engine.buffers(h))
            eprobe(f"engine.step({h!r})", engine, lambda: engine.step(h))
            eprobe(f"engine.step(tokens={h!r})", engine, lambda: engine.step([a], tokens=h))
            eprobe(f"engine.live_seq_ids({h!r})", engine, lambda: engine.live_seq_ids(h))
            eprobe(f"engine.live_seq_ids(allow_empty={h!r})", engine, lambda: engine.live_seq_ids([], h))
            eprobe(f"engine.check(stream={h!r})", engine, lambda: engine.check(h))
            eprobe(f"engine.batch_rows(seq_ids={h!r})", engine, lambda: engine.batch_rows(h, ids(1), 1))
            eprobe(f"engine.batch_rows(n_new={h!r})", engine, lambda: engine.batch_rows([a], h, 1))
            eprobe(f"engine.batch_rows(n_max={h!r})", engine, lambda: engine.batch_rows([a], ids(1), h))
            eprobe(f"engine.admit({h!r})", engine, lambda: engine.admit(h))
        for kk, vv in ((np.zeros((1, 3, 1, 64), np.float32), kv), (kv, np.zeros((1, 4, 1, 64), np.float16)),
                       (np.full((1, 3, 1, 64), np.inf, np.float16), kv), (kv[:, :, :, ::2], kv),
                       (np.zeros((1, 40, 1, 64), np.float16),) * 2):
            eprobe(f"engine.prefill({kk.dtype} {kk.shape} / {vv.shape})", engine, lambda: engine.prefill(a, kk, vv))
        step = engine.step([a])
        for h in H + [np.zeros((1, 1, 2, 64), np.float16)]:
            eprobe(f"EngineStep.write(q={h!r:.40})", engine, lambda: step.write(h, h, h))
            eprobe(f"EngineStep.attend(layer={h!r:.40})", engine, lambda: step.attend(h))
        step2 = engine.step([a])
        for h in [x for x in H if x is not None and type(x) is not int or x == -1]:  # (None, ints >= 0: streams)
            eprobe(f"EngineStep.run(stream={h!r:.40})", engine, lambda: step2.run(h))
        works(f"EngineStep.run after refused ones (faults={bool(faults)})", lambda: step2.run())
        works(f"engine steps after (faults={bool(faults)})", lambda: engine.step([a]).run())
        if faults:
            works("engine.check after", lambda: engine.check())
    engine, a = make_engine(prefix_cache=True)
    q, kv = np.zeros((3, 2, 64), np.float16), np.zeros((3, 1, 64), np.float16)
    child = engine.fork(a)  # a pending tail copy: a refused call must not run it
    for h in H + [np.zeros((3, 2, 64), np.float32), np.zeros((4, 2, 64), np.float16), q[:, :, ::2]]:
        eprobe(f"engine.prefill_attention(q={h!r:.40})", engine, lambda: engine.prefill_attention(a, 0, h, kv, kv))
        eprobe(f"engine.prefill_attention(layer={h!r:.40})", engine, lambda: engine.prefill_attention(a, h, q, kv, kv))
        eprobe(f"engine.prefill_attention(seq={h!r:.40})", engine, lambda: engine.prefill_attention(h, 0, q, kv, kv))
        eprobe(f"engine.prefill_attention(backend={h!r:.40})", engine,
               lambda: engine.prefill_attention(a, 0, q, kv, kv, backend=h))
        eprobe(f"engine.prefill_attention(stream={h!r:.40})", engine,
               lambda: engine.prefill_attention(a, 0, q, kv, kv, stream=h))
        eprobe(f"engine.prefill_attention_batch(n_new={h!r:.40})", engine,
               lambda: engine.prefill_attention_batch([a], 0, q[None], kv[None], kv[None], h))
        eprobe(f"engine.admit({h!r:.40}, prefix)", engine, lambda: engine.admit(h))
        eprobe(f"engine.admit(namespace={h!r:.40})", engine, lambda: engine.admit([1, 2, 3], namespace=h))
        eprobe(f"engine.admit(priority={h!r:.40})", engine, lambda: engine.admit([1, 2, 3], priority=h))
        eprobe(f"engine.step(tokens={h!r:.40}, prefix)", engine, lambda: engine.step([a, child], tokens=h))
    works("prefill_attention after", lambda: engine.prefill_attention(a, 0, q, kv, kv))


# -- store operations ------------------------------------------------------------------
def store_section():
    rig = Rig()
    store = rig.store
    for a in ARRAYS + H + [ids(10), cuda.to_device(ids(7, 8))]:
        probe(f"copy_blocks(src={a!r:.40})", rig, lambda: hc.copy_blocks(store, a, ids(8, 9)))
        probe(f"copy_blocks(dst={a!r:.40})", rig, lambda: hc.copy_blocks(store, ids(5, 6), a))
        probe(f"copy_tails(src={a!r:.40})", rig, lambda: hc.copy_tails(store, a, ids(2)))
        probe(f"prepare_copy_blocks(src={a!r:.40})", rig,
              lambda: hc.prepare_copy_blocks(store, a, cuda.to_device(ids(8, 9))))
        probe(f"prepare_copy_tails(dst={a!r:.40})", rig,
              lambda: hc.prepare_copy_tails(store, cuda.to_device(ids(0)), a))
        probe(f"dequantize_blocks(ids={a!r:.40})", rig, lambda: hc.dequantize_blocks(store, 0, a))
    for h in H:
        probe(f"copy_blocks(store={h!r})", rig, lambda: hc.copy_blocks(h, ids(5), ids(8)))
        probe(f"copy_blocks(stream={h!r})", rig, lambda: hc.copy_blocks(store, ids(5), ids(8), stream=h))
        probe(f"dequantize_blocks(layer={h!r})", rig, lambda: hc.dequantize_blocks(store, h, ids(0)))
        probe(f"nonfinite_flags(num_seals={h!r})", rig, lambda: hc.nonfinite_flags(store, h))
        probe(f"nonfinite_flags(layer={h!r})", rig, lambda: hc.nonfinite_flags(store, 1, h))
    dk = cuda.device_array((1, 4, 1, 64), np.float16)
    dslots, dpos = cuda.to_device(ids(0, 0, 1, 1)), cuda.to_device(ids(3, 4, 0, 1))
    for a in H + [np.zeros((1, 4, 1, 64), np.float16), cuda.device_array((1, 4, 1, 64), np.float32),
                  cuda.device_array((1, 4, 2, 64), np.float16), cuda.device_array((4, 1, 64), np.float16),
                  store.k_tails, cuda.device_array((1, 0, 1, 64), np.float16)]:
        probe(f"prepare_append(k={a!r:.40})", rig, lambda: hc.prepare_append(store, a, dk, dslots, dpos))
        probe(f"prepare_append(slots={a!r:.40})", rig, lambda: hc.prepare_append(store, dk, dk, a, dpos))
        probe(f"prepare_append(layer={a!r:.40})", rig, lambda: hc.prepare_append(store, dk, dk, dslots, dpos, a))
        probe(f"prepare_seal(slots={a!r:.40})", rig,
              lambda: hc.prepare_seal(store, a, cuda.to_device(ids(9))))
        probe(f"prepare_seal(layer={a!r:.40})", rig,
              lambda: hc.prepare_seal(store, cuda.to_device(ids(0)), cuda.to_device(ids(9)), a))
        probe(f"prepare_seal(nonfinite={a!r:.40})", rig,
              lambda: hc.prepare_seal(store, cuda.to_device(ids(0)), cuda.to_device(ids(9)), None, a))
        probe(f"prepare_seal(fitted_keys={a!r:.40})", rig,
              lambda: hc.prepare_seal(store, cuda.to_device(ids(0)), cuda.to_device(ids(9)), None, None, a))
    rows = np.zeros((1, 32, 1, 64), np.float16)
    for h in H + [17, 32, 2**63, -2**63]:
        probe(f"seal_rows(first_row={h!r})", rig, lambda: hc.seal_rows(store, rows, rows, h, ids(9)))
        probe(f"seal_rows(layer={h!r})", rig, lambda: hc.seal_rows(store, rows[0], rows[0], 0, ids(9), h))
        probe(f"seal_rows(fitted_keys={h!r})", rig, lambda: hc.seal_rows(store, rows, rows, 0, ids(9), fitted_keys=h))
    for a in ARRAYS + H + [ids(9, 9)]:
        probe(f"seal_rows(block_ids={a!r:.40})", rig, lambda: hc.seal_rows(store, rows, rows, 0, a))
    for h in [x for x in H if x is not H[-1]] + [2**31, 3, 2**20 + 1]:  # (10**6 blocks: 16M simulated threads)
        t(f"layout_agrees(num_blocks={h!r})", lambda: hc.layout_agrees(CFG, h))
        t(f"device_layout_offsets(num_blocks={h!r})", lambda: hc.device_layout_offsets(CFG, h))
        t(f"host_layout_offsets(num_blocks={h!r})", lambda: hc.host_layout_offsets(CFG, h))
        t(f"layout_agrees(config={h!r})", lambda: hc.layout_agrees(h))
        t(f"host_layout_offsets(config={h!r})", lambda: hc.host_layout_offsets(h, 2))
    up = uploads.Uploads(64)
    for h in H + [[np.zeros(3, np.int64)], [np.zeros((2, 2), np.int32)], [np.zeros(10**3, np.int32)], [[1, 2]],
                  (np.zeros(2, np.int32),), [np.zeros(2, np.int32)[::2]]]:
        t(f"Uploads(words={h!r:.40})", lambda: uploads.Uploads(h))
        t(f"Uploads.begin(stream={h!r:.40})", lambda: up.begin(h))
        t(f"Uploads.put({h!r:.40})", lambda: (up.begin(), up.put(h)))
        t(f"Uploads.scratch(shape={h!r:.40})", lambda: (up.begin(), up.scratch(h, np.float16)))
        t(f"Uploads.scratch(dtype={h!r:.40})", lambda: (up.begin(), up.scratch((2, 2), h)))
        t(f"upload_once({h!r:.40})", lambda: uploads.upload_once(h))
        t(f"packed_offsets({h!r:.40})", lambda: uploads.packed_offsets(h))
        arr = cuda.device_array(8, np.int32)
        t(f"views.sliced(start={h!r:.40})", lambda: views.sliced(arr, h))
        t(f"views.layer_of(index={h!r:.40})", lambda: views.layer_of(store.k_codes, h))
        t(f"views.flat({h!r:.40})", lambda: views.flat(h))
    works("copy_blocks after", lambda: hc.copy_blocks(store, ids(5), ids(8)))


# -- the hexcore command ---------------------------------------------------------------
def cli_section():
    from hexcore import cli

    bad = [["plan", "--memory", x] for x in ("", "x", "nan", "inf", "-1GiB", "1e400", "0", "80XB", "1e-40b",
                                             "  ", "1..2GiB", "0x10", "1_000", "1e30TiB")]
    bad += [["plan", "--context", x] for x in ("0", "-1", "1.5", "9" * 40, "", "nan", "0x10")]
    bad += [["plan", "--budget-gib", x] for x in ("nan", "-inf", "0", "1e400", "", "0x1", "4294967296")]
    bad += [["plan", "--max-seqs", x] for x in ("0", "-1", "1e3", "2147483648", "")]
    bad += [["plan", "--block-size", x] for x in ("8", "0", "16.0", "", "1e9")]
    bad += [["plan", "--preset", "nope"], ["plan", "--bogus"], ["plan", "extra"], [], ["nope"], ["plan", "--context"]]
    bad += [["demo", flag, x] for flag in ("--requests", "--seed", "--steps") for x in ("-1", "x", "1e3", "", "nan")]
    bad += [["demo", "--kv-dtype", "int3"], ["demo", "--format", "fp16"], ["demo", "--format", "nope"],
            ["demo", "--json", "/nonexistent/x.json"], ["demo", "--json", ""], ["demo", "--json", "/tmp"],
            ["demo", "--no-progress=1"], ["demo", "--requests", "100001"], ["demo", "--seed", str(2**63)]]
    bad += [["bench", "--out", ""], ["bench", "--out", "/etc/passwd"], ["bench", "--quick=1"], ["bench", "--nope"]]
    bad += [["plan", "--memory", "1TiB", "--context", "2147483647", "--block-size", "16"],  # edge, must work
            ["plan", "--memory", "1b"], ["plan", "--budget-gib", "9.32e-10"], ["plan", "--context", "1"]]
    for argv in bad:
        t(f"cli.main({argv!r})", lambda: _cli(cli, argv))
    for argv in (None, "plan", [b"plan"], [1], ["plan", None]):
        t(f"cli.main({argv!r}) (non-list)", lambda: _cli(cli, argv, allow_ok=argv is None))
    for h in H:
        t(f"capacity_table(budget_gib={h!r:.40})", lambda: cli.capacity_table("llama-3-8b", h, 4, 16))
        t(f"capacity_table(max_seqs={h!r:.40})", lambda: cli.capacity_table("llama-3-8b", 1.0, h, 16))
        t(f"capacity_table(block_size={h!r:.40})", lambda: cli.capacity_table("llama-3-8b", 1.0, 4, h))
        t(f"capacity_table(context={h!r:.40})", lambda: cli.capacity_table("llama-3-8b", 1.0, 4, 16, h))
        t(f"capacity_table(preset={h!r:.40})", lambda: cli.capacity_table(h, 1.0, 4, 16))
        t(f"format_rows(context={h!r:.40})", lambda: cli.format_rows("llama-3-8b", 2**30, 16, h))
        t(f"format_rows(budget_bytes={h!r:.40})", lambda: cli.format_rows("llama-3-8b", h, 16, 4096))
        t(f"format_rows(block_size={h!r:.40})", lambda: cli.format_rows("llama-3-8b", 2**30, h, 4096))
        t(f"format_rows(preset={h!r:.40})", lambda: cli.format_rows(h, 2**30, 16, 4096))
        cfg = KVCacheConfig.from_preset("llama-3-8b")
        t(f"sequences_at_context(cfg={h!r:.40})", lambda: cli.sequences_at_context(h, 2**30, 4096))
        t(f"sequences_at_context(budget_bytes={h!r:.40})", lambda: cli.sequences_at_context(cfg, h, 4096))
        t(f"sequences_at_context(context={h!r:.40})", lambda: cli.sequences_at_context(cfg, 2**30, h))


def _cli(cli, argv, allow_ok=False):
    """A bad command line: status 2 and one stderr line without a traceback; a good one: 0."""
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        status = cli.main(argv)
    text = err.getvalue()
    if "Traceback" in text or "Traceback" in out.getvalue():
        raise AssertionError(f"traceback printed: {text[-200:]}")
    ok_expected = allow_ok or (argv and argv[0] == "plan" and "--memory" in argv and argv[-1] in ("1b", "16")) \
        or argv in (["plan", "--budget-gib", "9.32e-10"], ["plan", "--context", "1"])
    if ok_expected:
        if status != 0 and not (argv is None and status == 2):
            raise AssertionError(f"status {status} for a good command line: {text[:200]}")
    elif status == 0:
        raise AssertionError("status 0 for a bad command line")
    elif text.count("\n") > 1:
        raise AssertionError(f"more than one line: {text[:200]!r}")


if __name__ == "__main__":
    for section in SECTIONS:
        globals()[f"{section}_section"]()
        print(f"-- {section}: {len(RAW)} raw so far", flush=True)
    report()
