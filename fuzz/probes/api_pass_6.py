"""Hostile values into what was added or changed since pass 5 (commit 86aa01e): whole
layers checked in turn inside the decode -- FaultTolerantKVCache(decode_layers=),
phases, step_phase, sample_step, graph_step / graph_load / check_graph of a layered
graph; DecodeGraph(verify_heads=, verify_layers=), its step / load / warmup ``phase``,
checked_layers; StepVerify (head_sums, layers_per_step), StepBuffers.head_record_launch,
DecodeStep.at / enqueue / enqueue_all ``phase``, PhaseStep; integrity's head record
``layer=`` and the checksum launch's ``flags`` / ``found``; the decode's DecodeVerify;
DecodeOptions (split_overhead, tiered_merge "packed", tiered_mode); Engine(fault_tolerance=
{"decode_layers": ...}) and its steps; views.layer_of, checked_layer, the shared ``shown``.

Prints every call that ended in anything but a typed error, and every refused call that
left state changed: the block manager (block states, free count, lengths, invariants),
the store's pool, the fault cache's digests, head digests, books and phase rounds, and the
graph's step count (its next phase) and verification buffers; after the refused calls a
valid one must still work (checked per section). Sections by name (``fault graph steps
integrity decode engine misc``); all by default.

cd fuzz/probes && NUMBA_ENABLE_CUDASIM=1 nice -n 5 python api_pass_6.py [SECTION ...]
"""
import sys
import warnings

import numpy as np

from _probe import RAW, refused_unchanged, report
from _probe import t as _t
from hexcore import FaultTolerantKVCache, KVCacheConfig, PagedKVCache

warnings.simplefilter("ignore")
if __import__("os").environ.get("NUMBA_ENABLE_CUDASIM") == "1":
    from hexcore.cuda.simulated import use_fast_simulator

    use_fast_simulator()  # as tests/conftest.py: 4.5x faster launches
from numba import cuda  # noqa: E402 (after the simulator is chosen by the environment)

from hexcore import cuda as hc  # noqa: E402
from hexcore.cuda import integrity, views  # noqa: E402
from hexcore.cuda.steps import DecodeGraph, PhaseStep, StepBuffers, StepVerify  # noqa: E402
from hexcore.engine import Engine  # noqa: E402

H = [None, True, np.bool_(False), 1.5, float("nan"), float("inf"), -1, 2**40, 10**400, "1", b"1", [1], object(),
     np.array([1]), np.zeros((2, 2)), np.int64(1), np.uint8(1), np.float32(1.0), 0, 2, 3]
CFG = KVCacheConfig(num_layers=2, num_kv_heads=1, head_dim=64, block_size=16, kv_dtype="int4", group_size=32)
BS, L = CFG.block_size, CFG.num_layers
SECTIONS = sys.argv[1:] or ["fault", "graph", "steps", "integrity", "decode", "engine", "misc"]


def t(label, fn):
    """_probe.t with the label on one line (2-D arrays print on several)."""
    _t(" ".join(label.split()), fn)


def ids(*values):
    return np.array(values, np.int32)


def host(a):
    return None if a is None else a.copy_to_host().tobytes()


class Rig:
    """A cache of 12 blocks and 4 slots, its store, a FaultTolerantKVCache with ``decode_layers``
    (default 1: two phases over the 2 layers) and its layered graph; seq 0 holds two recorded
    sealed blocks and 3 tail tokens, seq 1 one block, seq 2 is a fork of seq 0."""

    def __init__(self, decode_layers=1, buckets=(1, 2, 4), **kwargs):
        self.cache = PagedKVCache(CFG, 12, 4)
        self.store = hc.DeviceKVStore(CFG, 12, 4)
        rng = np.random.default_rng(0)
        words = rng.integers(0, 1 << 32, self.store.pool.shape[0], dtype=np.uint32)
        self.store.pool.copy_to_device(words & ~np.uint32(0x40004000))  # finite float16
        self.store.fill_guards()
        self.ft = FaultTolerantKVCache(self.cache, self.store, decode_layers=decode_layers, **kwargs)
        a, b = self.cache.add_sequence(), self.cache.add_sequence()
        for seq, n in ((a, 35), (b, 16)):
            r = self.cache.step(ids(seq), ids(n))
            r.raise_for_status()
            hc.seal(self.store, r.seal_slots, r.seal_blocks)
            self.ft.record_seals(r)
        self.fork = self.cache.fork_sequence(a)
        self.graph = self.ft.decode_graph(1, max_verify_blocks=4, batch_buckets=buckets, backend="eager")

    def state(self):
        c, ft, g = self.cache, self.ft, self.graph
        lens = tuple(c.seq_len(s) if c.is_live(s) else -1 for s in range(c.max_seqs))
        v = g._verify
        return (c.block_states().tobytes(), c.num_free_blocks, lens, host(self.store.pool), host(ft.sums),
                host(ft.head_sums), ft.recorded.tobytes(), dict(ft._bad), dict(ft._lost), tuple(ft.quarantined),
                ft._calls, dict(ft._stats), ft._missing.tobytes(), ft._round_start.tobytes(), ft._layered_steps,
                ft._layer_checks, g._steps_run, host(v.flags), host(v.found))

    NAMES = ("states", "free", "lens", "pool", "sums", "head_sums", "recorded", "bad", "lost", "quarantined", "calls",
             "stats", "missing", "round_start", "layered_steps", "layer_checks", "graph steps", "flags", "found")


def probe(label, rig, fn):
    """``fn()`` must leave the rig as it found it when it raises; the invariants must hold."""
    t(label, lambda: refused_unchanged(label, fn, rig.state, rig.ft.check_invariants, Rig.NAMES))


def refused(label, rig, fn):
    """``fn()`` must be refused (an alias of the store or of another buffer, an out-of-range
    value that a check would take silently): taking it is recorded, as is a refused call
    that changed state."""
    accepted = []
    probe(label, rig, lambda: accepted.append(fn()))
    if accepted:
        RAW.append(f"{label[:70]}: accepted (expected a typed refusal)")


def works(label, fn):
    """A valid call after the hostile ones must work."""
    try:
        fn()
    except BaseException as e:  # noqa: BLE001
        RAW.append(f"{label[:70]}: a valid call failed after refused ones: {type(e).__name__}: {str(e)[:100]}")


def pool_view(store, shape, dtype=np.uint32):
    """A device view of the store's own words, shaped as an output (an alias of the cache)."""
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize // 4
    return store.pool[:n].view(dtype).reshape(shape) if dtype != np.uint32 else store.pool[:n].reshape(shape)


# -- FaultTolerantKVCache with decode_layers -------------------------------------------
def fault_section():
    c, s = PagedKVCache(CFG, 12, 4), hc.DeviceKVStore(CFG, 12, 4)
    for h in H:
        t(f"FaultTolerantKVCache(decode_layers={h!r})", lambda: FaultTolerantKVCache(c, s, decode_layers=h))
    rig = Rig()
    ft, graph, cache = rig.ft, rig.graph, rig.cache
    other = PagedKVCache(KVCacheConfig(num_layers=2, num_kv_heads=1, head_dim=64, block_size=16, kv_dtype="int4",
                                       group_size=32), 64, 4)
    o = other.add_sequence()
    for _ in range(3):
        other.step(ids(o), ids(40)).raise_for_status()  # block ids past this cache's 12
    big = other.step(ids(o))
    result = cache.step(ids(0, 1))
    for h in [*H, big, result.block_tables]:
        probe(f"step_phase({h!r:.40})", rig, lambda: ft.step_phase(h))
        probe(f"sample_step({h!r:.40}, layered)", rig, lambda: ft.sample_step(h))
        probe(f"graph_step(result={h!r:.40}, layered)", rig, lambda: ft.graph_step(graph, h))
        probe(f"graph_load(result={h!r:.40}, layered)", rig, lambda: ft.graph_load(graph, h))
    for h in H:
        probe(f"graph_step(stream={h!r}, layered)", rig, lambda: ft.graph_step(graph, result, stream=h))
        probe(f"graph_load(stream={h!r}, layered)", rig, lambda: ft.graph_load(graph, result, stream=h))
        probe(f"graph_step(fork_src={h!r:.40}, layered)", rig, lambda: ft.graph_step(graph, result, h, ids(3)))
        probe(f"check_graph(stream={h!r}, layered)", rig, lambda: ft.check_graph(graph, stream=h))
        probe(f"decode_graph(num_q_heads={h!r}, layered)", rig, lambda: ft.decode_graph(h))
        probe(f"decode_graph(max_verify_blocks={h!r}, layered)", rig, lambda: ft.decode_graph(1, h))
        probe(f"decode_graph(batch_buckets={h!r:.40}, layered)", rig, lambda: ft.decode_graph(1, batch_buckets=h))
    for kw in ("verify_heads", "verify_layers", "verify_sums", "phase"):
        probe(f"decode_graph({kw}=...)", rig, lambda: ft.decode_graph(1, **{kw: None}))
    plain = FaultTolerantKVCache(cache, rig.store)
    other_graphs = [plain.decode_graph(1, backend="eager"),
                    DecodeGraph(rig.store, 1, cache.max_blocks_per_seq, verify_sums=ft.sums, verify_heads=ft.head_sums,
                                verify_layers=2, backend="eager"),
                    DecodeGraph(rig.store, 1, cache.max_blocks_per_seq, verify_sums=ft.sums,
                                verify_heads=cuda.to_device(np.zeros((12, L, 1), np.uint32)), verify_layers=1,
                                backend="eager")]
    for g in other_graphs:
        probe(f"graph_step(graph of {g.verify_layers} layers, other heads)", rig, lambda: ft.graph_step(g, result))
        probe(f"check_graph(graph of {g.verify_layers} layers, other heads)", rig, lambda: ft.check_graph(g))
    probe("plain ft.graph_step(layered graph)", rig, lambda: plain.graph_step(graph, result))
    # an unrecorded block in the tables (sealed outside ft), then a refused layered step
    r = cache.step(ids(1), ids(32))
    hc.seal(rig.store, r.seal_slots, r.seal_blocks)
    result = cache.step(ids(0, 1, 2))
    # three seals in a batch of two (bucket 2), seq 1's unrecorded block in the tables
    many = cache.step(ids(0, 1), ids(cache.seq_len(0) + 3 * BS, cache.seq_len(1) + 1))
    many.raise_for_status()
    probe("graph_step(unrecorded, a sequence sealing three blocks)", rig, lambda: ft.graph_step(graph, many))
    from hexcore.host._step import StepResult

    res = cache.step(ids(0, 1))
    seals = np.array([[0, 1, 3], [0, 0, 0], [7, 8, 9]], np.int32)  # (slot, logical, block) rows: 3 seals, bucket 2
    forged = StepResult(res.statuses, seals, res.block_tables, res.seq_lens, res.tail_slots, res.seq_ids, 0, 3, 0)
    probe("graph_step(unrecorded, more seals than the bucket's rows)", rig, lambda: ft.graph_step(graph, forged))
    probe("graph_load(unrecorded, more seals than the bucket's rows)", rig, lambda: ft.graph_load(graph, forged))
    probe("graph_step(unrecorded, fork_dst bad)", rig, lambda: ft.graph_step(graph, result, ids(0), ids(9)))
    small = ft.decode_graph(1, batch_buckets=(1,), backend="eager")
    probe("graph_load(unrecorded, batch above the buckets)", rig, lambda: ft.graph_load(small, result))
    result = cache.step(ids(0, 1, 2))
    works("graph_step after (layered)", lambda: ft.graph_step(graph, result))
    works("check_graph after (layered)", lambda: ft.check_graph(graph))
    works("step_phase after (layered)", lambda: ft.step_phase(cache.step(ids(0))))


# -- DecodeGraph's whole-layer arguments -------------------------------------------------
def graph_section():
    rig = Rig()
    store, ft, graph, cache = rig.store, rig.ft, rig.graph, rig.cache
    sums, heads = ft.sums, ft.head_sums
    bad_heads = [np.zeros((12, L, 1), np.uint32), cuda.device_array((12, L, 1), np.float32),
                 cuda.device_array((12, L), np.uint32), cuda.device_array((11, L, 1), np.uint32),
                 cuda.device_array((12, L, 2), np.uint32)[:, :, ::2], cuda.device_array((12, L + 1, 1), np.uint32),
                 pool_view(store, (12, L, 1)), sums, cuda.to_device(np.zeros((12, L, 1), np.uint32)).reshape(12, L, 1)]
    for h in H + bad_heads:
        probe(f"DecodeGraph(verify_heads={h!r:.40})", rig,
              lambda: DecodeGraph(store, 1, 4, verify_sums=sums, verify_heads=h, verify_layers=1))
        probe(f"DecodeGraph(verify_layers={h!r:.40})", rig,
              lambda: DecodeGraph(store, 1, 4, verify_sums=sums, verify_heads=heads, verify_layers=h))
        probe(f"DecodeGraph(verify_layers={h!r:.40}, no heads)", rig,
              lambda: DecodeGraph(store, 1, 4, verify_sums=sums, verify_layers=h))
        probe(f"DecodeGraph(verify_sums={h!r:.40}, heads)", rig,
              lambda: DecodeGraph(store, 1, 4, verify_sums=h, verify_heads=heads, verify_layers=1))
    refused("DecodeGraph(verify_sums=pool view, heads)", rig,
          lambda: DecodeGraph(store, 1, 4, verify_sums=pool_view(store, (12, L)), verify_heads=heads, verify_layers=1))
    refused("DecodeGraph(verify_heads = pool view)", rig,
            lambda: DecodeGraph(store, 1, 4, verify_sums=sums, verify_heads=pool_view(store, (12, L, 1)),
                                verify_layers=1))
    refused("DecodeGraph(verify_heads overlapping verify_sums)", rig,
          lambda: DecodeGraph(store, 1, 4, verify_sums=sums, verify_heads=sums.reshape(12, L, 1), verify_layers=1))
    result = cache.step(ids(0, 1))
    good = dict(block_tables=result.block_tables, seq_lens=result.seq_lens, tail_slots=result.tail_slots)
    for h in H + [np.int64(5), -2**63]:
        probe(f"graph.step(phase={h!r:.40})", rig, lambda: graph.step(**good, phase=h))
        probe(f"graph.load(phase={h!r:.40})", rig, lambda: graph.load(**good, phase=h))
        probe(f"graph.checked_layers({h!r:.40})", rig, lambda: graph.checked_layers(h))
        probe(f"graph.step(verify_blocks={h!r:.40}, layered)", rig, lambda: graph.step(**good, verify_blocks=h))
        probe(f"graph.warmup(1, {h!r:.40}, layered)", rig, lambda: graph.warmup(1, h))
        probe(f"graph.verify_results(stream={h!r:.40}, layered)", rig, lambda: graph.verify_results(h))
    plain = DecodeGraph(store, 1, 4, batch_buckets=(2,), backend="eager")
    for h in H:
        probe(f"plain graph.step(phase={h!r:.40})", rig, lambda: plain.step(**good, phase=h))
        probe(f"plain graph.checked_layers({h!r:.40})", rig, lambda: plain.checked_layers(h))
    works("graph.step(phase=1) after", lambda: graph.step(**good, phase=1))
    works("graph.step() after", lambda: graph.step(**good))
    works("graph.warmup after", lambda: graph.warmup(2, 40))


# -- StepVerify, StepBuffers.head_record_launch, DecodeStep phases, PhaseStep -------------
def steps_section():
    rig = Rig()
    store, ft, graph, cache = rig.store, rig.ft, rig.graph, rig.cache
    sums, heads = ft.sums, ft.head_sums
    for h in H + [2**20 + 1]:
        probe(f"StepVerify(capacity={h!r:.40})", rig, lambda: StepVerify(store, sums, h))
        probe(f"StepVerify(layers_per_step={h!r:.40})", rig, lambda: StepVerify(store, sums, 4, heads, h))
        probe(f"StepVerify(head_sums={h!r:.40})", rig, lambda: StepVerify(store, sums, 4, h, 1))
        probe(f"StepVerify(store={h!r:.40})", rig, lambda: StepVerify(h, sums, 4))
        probe(f"StepVerify(sums={h!r:.40})", rig, lambda: StepVerify(store, h, 4))
    for capacity in (0, 2**20 + 1):
        refused(f"StepVerify(capacity={capacity})", rig, lambda: StepVerify(store, sums, capacity))
    refused("StepVerify(head_sums = sums' words)", rig, lambda: StepVerify(store, sums, 4, sums.reshape(12, L, 1), 1))
    refused("StepVerify(sums=pool view)", rig, lambda: StepVerify(store, pool_view(store, (12, L)), 4))
    refused("StepVerify(head_sums=pool view)", rig, lambda: StepVerify(store, sums, 4, pool_view(store, (12, L, 1)), 1))
    sv = graph._verify
    for h in H + [np.int64(5)]:
        probe(f"StepVerify.checked_layers({h!r:.40})", rig, lambda: sv.checked_layers(h))
        probe(f"StepVerify.prepare_head_record(layer={h!r:.40})", rig,
              lambda: sv.prepare_head_record(cuda.to_device(ids(-1, -1)), h))
        probe(f"StepVerify.prepare_head_record(ids={h!r:.40})", rig, lambda: sv.prepare_head_record(h))
        probe(f"StepVerify.prepare({h!r:.40})", rig, lambda: sv.prepare(h))
        probe(f"StepVerify.read(stream={h!r:.40})", rig, lambda: sv.read(h))
    result = cache.step(ids(0, 1))
    good = dict(block_tables=result.block_tables, seq_lens=result.seq_lens, tail_slots=result.tail_slots)
    loaded = graph.load(**good)
    step = loaded.step
    buffers = step.buffers
    for h in H + [np.int64(5), 2**31]:
        probe(f"StepBuffers.head_record_launch({h!r:.40})", rig, lambda: buffers.head_record_launch(h))
        probe(f"StepBuffers.head_record_launch(1, layer={h!r:.40})", rig, lambda: buffers.head_record_launch(1, h))
        probe(f"DecodeStep.at({h!r:.40})", rig, lambda: step.at(h))
        probe(f"DecodeStep.enqueue_all(phase={h!r:.40})", rig, lambda: step.enqueue_all(0, None, None, h))
        probe(f"DecodeStep.enqueue(0, phase={h!r:.40})", rig, lambda: step.enqueue(0, 0, h))
        probe(f"DecodeStep.enqueue(layer={h!r:.40}, phase=0)", rig, lambda: step.enqueue(h, 0, 0))
        probe(f"DecodeStep.enqueue_all(num_seals={h!r:.40}, phase=0)", rig, lambda: step.enqueue_all(0, h, None, 0))
        probe(f"DecodeStep.enqueue_all(num_verify={h!r:.40}, phase=0)", rig, lambda: step.enqueue_all(0, None, h, 0))
        probe(f"PhaseStep(step, phase={h!r:.40})", rig, lambda: PhaseStep(step, h).enqueue(0))
        probe(f"PhaseStep(step={h!r:.40}, 0)", rig, lambda: PhaseStep(h, 0))
        probe(f"PhaseStep.enqueue(layer={h!r:.40})", rig, lambda: loaded.enqueue(h))
        probe(f"PhaseStep.enqueue(stream={h!r:.40})", rig, lambda: loaded.enqueue(0, h))
        probe(f"PhaseStep.enqueue_all(stream={h!r:.40})", rig, lambda: loaded.enqueue_all(h))
        probe(f"PhaseStep.enqueue_all(num_seals={h!r:.40})", rig, lambda: loaded.enqueue_all(0, h))
    for phase in (2, -1, 0.5, None):
        refused(f"PhaseStep(step, {phase!r}) (was made, refused only at enqueue)", rig, lambda: PhaseStep(step, phase))
    plain = StepBuffers(store, 1, 1, 4)
    plain_v = StepBuffers(store, 1, 1, 4, StepVerify(store, sums, 4))
    for h in (1, None, 0):
        probe(f"StepBuffers(no verify).head_record_launch(1, {h!r})", rig, lambda: plain.head_record_launch(1, h))
        probe(f"StepBuffers(verify, no heads).head_record_launch(1, {h!r})", rig,
              lambda: plain_v.head_record_launch(1, h))
    works("PhaseStep.enqueue after", lambda: [loaded.enqueue(layer) for layer in range(L)])
    works("DecodeStep.enqueue_all(phase=1) after", lambda: step.enqueue_all(0, phase=1))


# -- integrity: head record layer=, checksum flags/found, outputs inside the store --------
def integrity_section():
    rig = Rig()
    store, ft = rig.store, rig.ft
    hs = cuda.device_array((12, L, 1), np.uint32)
    good = cuda.to_device(ids(0, 1))
    for h in H + [np.int64(5), -2**63]:
        probe(f"head_record_launch(layer={h!r:.40})", rig, lambda: integrity.head_record_launch(store, good, hs, h))
        probe(f"prepare_head_record(layer={h!r:.40})", rig, lambda: integrity.prepare_head_record(store, good, hs, h))
        probe(f"record_head_sums(layer={h!r:.40})", rig,
              lambda: integrity.record_head_sums(store, ids(0, 1), hs, None, h))
        probe(f"record_head_sums(stream={h!r:.40}, layer=1)", rig,
              lambda: integrity.record_head_sums(store, ids(0, 1), hs, h, 1))
    ft_view = ft.sums.reshape(12, L, 1)
    for a in (pool_view(store, (12, L, 1)), ft_view):
        check = probe if a is ft_view else refused  # (the launcher cannot know the sums are another's)
        check(f"record_head_sums(head_sums=view of {'pool' if a is not ft_view else 'sums'})", rig,
              lambda: integrity.record_head_sums(store, ids(0, 1), a, None, 0))
    sums, out, gb = ft.sums, cuda.device_array((2, L), np.uint32), cuda.device_array(6, np.uint32)
    flags, found = cuda.to_device(np.zeros(2, np.uint32)), cuda.to_device(np.zeros((4, 2), np.int32))
    pool_outs = {"sums": pool_view(store, (12, L)), "out": pool_view(store, (2, L)),
                 "guard_bad": pool_view(store, (len(store.guard_offsets),)), "flags": pool_view(store, (2,)),
                 "found": pool_view(store, (4, 2), np.int32)}
    for name, a in pool_outs.items():
        for mode in ("record", "verify"):
            args = dict(sums=sums, out=out, guard_bad=gb, flags=flags, found=found)
            args[name] = a
            check = probe if (name, mode) == ("sums", "verify") else refused  # (verify only reads sums)
            check(f"checksum_launch({name}=pool view, {mode})", rig,
                  lambda: integrity.checksum_launch(store, good, mode=mode, **args).run(0))
    refused("checksum_launch(out = sums rows, verify)", rig,
          lambda: integrity.checksum_launch(store, good, sums, sums[:2], gb, "verify", flags, found).run(0))
    refused("checksum_launch(flags = out's words)", rig,
          lambda: integrity.checksum_launch(store, good, sums, out, gb, "verify", out.reshape(2 * L)[:2],
                                            found).run(0))
    for h in H + [cuda.device_array(1, np.uint32), cuda.device_array(3, np.uint32),
                  cuda.device_array((2, 1), np.uint32), cuda.device_array(4, np.uint32)[::2]]:
        probe(f"checksum_launch(flags={h!r:.40})", rig,
              lambda: integrity.checksum_launch(store, good, sums, out, gb, "verify", h, found))
    for h in H + [cuda.device_array((0, 2), np.int32), cuda.device_array((4, 3), np.int32),
                  cuda.device_array((4, 2), np.uint32), cuda.device_array((4, 4), np.int32)[:, ::2]]:
        probe(f"checksum_launch(found={h!r:.40})", rig,
              lambda: integrity.checksum_launch(store, good, sums, out, gb, "verify", flags, h))
    works("record_head_sums(layer=1) after", lambda: integrity.record_head_sums(store, ids(0, 1), hs, None, 1))
    works("checksum_launch(flags) after", lambda: integrity.checksum_launch(
        store, good, sums, out, gb, "verify", flags, found).run(0))


# -- decode: DecodeVerify, DecodeOptions -----------------------------------------------
def decode_section():
    from hexcore.cuda.attention.launcher import DecodeVerify
    from hexcore.cuda.attention.options import DecodeOptions

    rig = Rig()
    store, ft, cache = rig.store, rig.ft, rig.cache
    tables = np.stack([np.pad(cache.block_table(s), (0, 4 - len(cache.block_table(s))), constant_values=-1)
                       for s in (0, 1)]).astype(np.int32)
    lens, tails = ids(cache.seq_len(0), cache.seq_len(1)), ids(0, 1)
    q = cuda.to_device(np.zeros((2, 1, 64), np.float16))
    out = cuda.device_array((2, 1, 64), np.float16)
    vctl = cuda.to_device(ids(1, 0))
    flags, found = cuda.to_device(np.zeros(2, np.uint32)), cuda.to_device(np.zeros((4, 2), np.int32))
    base = dict(head_sums=ft.head_sums, vctl=vctl, flags=flags, found=found)
    bad = {"head_sums": [out],
           "vctl": [ids(-1, 0), ids(1, -5), np.array([1, 0]), [1, 0], ids(2**31 - 1, 0)],
           "flags": [cuda.device_array(0, np.uint32), out, cuda.device_array(4, np.uint32)[::2]],
           "found": [cuda.device_array((0, 2), np.int32), out, cuda.device_array((4, 4), np.int32)[:, ::2]]}
    for name, values in bad.items():
        for a in H[:6] + values:
            args = dict(base)
            args[name] = a
            probe(f"paged_decode(verify.{name}={a!r:.40})", rig,
                  lambda: hc.paged_decode(q, store, 0, tables, lens, tails, out=out, verify=DecodeVerify(**args)))
            probe(f"DecodePlan(verify.{name}={a!r:.40})", rig,
                  lambda: hc.DecodePlan(q, store, tables, lens, tails, 64, out=out, verify=DecodeVerify(**args)).run(0))
    words = cuda.to_device(np.zeros(64, np.uint32))
    aliases = {"flags in the store": dict(flags=pool_view(store, (2,))),
               "found in the store": dict(found=pool_view(store, (4, 2), np.int32)),
               "flags = head_sums' words": dict(flags=ft.head_sums.reshape(12 * L)[:2]),
               "found = vctl's words": dict(found=vctl.reshape(1, 2)),
               "found overlapping flags": dict(flags=words[:2], found=words[:8].view(np.int32).reshape(4, 2))}
    for what, change in aliases.items():
        args = {**base, **change}
        refused(f"paged_decode(verify: {what})", rig,
                lambda: hc.paged_decode(q, store, 0, tables, lens, tails, out=out, verify=DecodeVerify(**args)))
    for h in H + [-0.0, 1e6, 999999.9, np.float64("nan"), 10**300, -10**400]:
        t(f"DecodeOptions(split_overhead={h!r:.40})", lambda: DecodeOptions(split_overhead=h))
    for h in H + ["packed", "PACKED", "one "]:
        t(f"DecodeOptions(tiered_merge={h!r:.40})", lambda: DecodeOptions(tiered_merge=h))
    opts = DecodeOptions()
    for h in H:
        t(f"DecodeOptions.tiered_mode(items={h!r:.40})", lambda: opts.tiered_mode(True, h, 1.0, 2))
        t(f"DecodeOptions.tiered_mode(pools={h!r:.40})", lambda: opts.tiered_mode(True, 4, 1.0, h))
        t(f"DecodeOptions.tiered_mode(blocks_per_sm={h!r:.40})", lambda: opts.tiered_mode(True, 100, h, 2))
    works("paged_decode(verify) after", lambda: hc.paged_decode(q, store, 0, tables, lens, tails, out=out,
                                                                verify=DecodeVerify(**base)))


# -- the Engine with decode_layers ---------------------------------------------------------
def engine_state(engine):
    c, ft = engine.cache, engine.faults
    lens = tuple(c.seq_len(s) if c.is_live(s) else -1 for s in range(c.max_seqs))
    extra = () if ft is None else (host(ft.sums), host(ft.head_sums), ft._missing.tobytes(), ft._layered_steps,
                                   ft.recorded.tobytes())
    return (c.block_states().tobytes(), c.num_free_blocks, lens, host(engine.store.pool), tuple(engine._forks), *extra)


def eprobe(label, engine, fn):
    t(label, lambda: refused_unchanged(label, fn, lambda: engine_state(engine), engine.cache.check_invariants))


def engine_section():
    for h in H:
        t(f"Engine(fault_tolerance={{'decode_layers': {h!r:.40}}})",
          lambda: Engine(CFG, 12, 4, 1, batch_buckets=(1, 2), fault_tolerance={"decode_layers": h}))
    engine = Engine(CFG, 12, 4, 1, batch_buckets=(1, 2), fault_tolerance={"decode_layers": 1})
    a = engine.add()
    k = np.random.default_rng(1).standard_normal((L, 20, 1, 64)).astype(np.float16)
    engine.prefill(a, k, k)
    step = engine.step([a])
    for h in H:
        eprobe(f"EngineStep.attend(layer={h!r:.40}, layered)", engine, lambda: step.attend(h))
        eprobe(f"engine.check(stream={h!r:.40}, layered)", engine, lambda: engine.check(h))
    step2 = engine.step([a])
    for h in [x for x in H if x is not None and type(x) is not int or x == -1]:
        eprobe(f"EngineStep.run(stream={h!r:.40}, layered)", engine, lambda: step2.run(h))
    works("EngineStep.run after (layered)", lambda: step2.run())
    works("engine steps after (layered)", lambda: [engine.step([a]).run() for _ in range(2)])
    works("engine.check after (layered)", lambda: engine.check())


# -- views, arrays, the shared helpers -------------------------------------------------------
def misc_section():
    from hexcore._checks import positive_real, real_value, shown
    from hexcore.cuda.arrays import checked_layer

    rig = Rig()
    store = rig.store

    class Loud:
        def __repr__(self):
            raise RuntimeError("repr")

    for h in H + [Loud(), -10**400, np.int64(-1)]:
        t(f"checked_layer({h!r:.40})" if not isinstance(h, Loud) else "checked_layer(Loud)",
          lambda: checked_layer(h, 2))
        t("positive_real(Loud)" if isinstance(h, Loud) else f"positive_real({h!r:.40})",
          lambda: positive_real("x", h))
        t("real_value(Loud)" if isinstance(h, Loud) else f"real_value({h!r:.40})", lambda: real_value(h))
        t("shown(Loud)" if isinstance(h, Loud) else f"shown({h!r:.40})", lambda: shown(h))
        probe("layer_of(Loud)" if isinstance(h, Loud) else f"views.layer_of(k_codes, {h!r:.40})", rig,
              lambda: views.layer_of(store.k_codes, h))
        probe("layer_of(Loud array)" if isinstance(h, Loud) else f"views.layer_of({h!r:.40}, 0)", rig,
              lambda: views.layer_of(h, 0))


if __name__ == "__main__":
    for section in SECTIONS:
        globals()[f"{section}_section"]()
        print(f"-- {section}: {len(RAW)} raw so far", flush=True)
    report()
