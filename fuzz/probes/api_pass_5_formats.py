"""Hostile values into formats by age and serving, added since pass 4 (pass 5, the formats
area): format names wherever a format is taken (``kv_format``, ``KVCacheConfig``'s
``kv_dtype``, ``pool_kinds``, ``block_pools``, ``pool_blocks_for``), ``TieredKVCache``
(constructor and every public method: ``add_sequence``, ``free_sequence``,
``fork_sequence``, ``step``, ``grow``, ``seq_len``, ``block_kinds``, ``tail_pools``,
``block_tables``), the Engine's ``format=`` / ``pool_blocks=`` path and its tiered
``add``/``fork``/``finish``/``prefill``/``step``/``attend``, ``hexcore.cuda``'s
``tiered_decode``, ``TieredDecodePlan``, ``run_tiered_ops`` and ``reseal_blocks``, the
serving layer (``Server``'s every argument and ``run``, ``Workload``,
``synthetic_workload``, ``TokenTable``, ``exact_attention``, ``FaultDrill``) and
``hexcore.demo``'s ``demo_shape`` / ``run_demo`` / ``warmup_workload``. A call still running
after ``HANG_SECONDS`` is cut short and reported as a hang (``Hang``).

Prints every call that ended in anything but a typed error, and every refused call that
left state changed: the tiered block manager (lengths, kinds, every pool's block states and
free counts, invariants); after a refused call a valid one must still work (checked per
section). Sections can be picked by name (``format tiered engine cuda serve demo``).

cd fuzz/probes && NUMBA_ENABLE_CUDASIM=1 nice -n 5 python api_pass_5_formats.py [SECTION ...]
"""
import dataclasses
import signal
import sys
import warnings

import numpy as np

from _probe import RAW, report
from _probe import t as _t
from hexcore import KVCacheConfig

warnings.simplefilter("ignore")
if __import__("os").environ.get("NUMBA_ENABLE_CUDASIM") == "1":
    from hexcore.cuda.simulated import use_fast_simulator

    use_fast_simulator()
from hexcore import cuda as hc  # noqa: E402
from hexcore.engine import Engine  # noqa: E402
from hexcore.host.tiered import TieredKVCache, block_pools, pool_blocks_for, pool_kinds  # noqa: E402
from hexcore.quant import AgeTier, KVFormat, kv_format  # noqa: E402

H = [None, True, np.bool_(False), 1.5, float("nan"), float("inf"), -1, 10**30, "3", b"1", [1], object(),
     np.array([1]), np.zeros((2, 2)), np.int64(2), np.uint8(1), np.float32(2.0), 0, 10**6]
NAMES = ["INT4-AGED", "int4-aged ", " int4-aged", "int4_aged", "int4aged", "int8-aged", "", "fp32", "aged",
         "int2-aged\0", "ｉｎｔ４-aged", "Int2-Aged"]
ARRAYS = [np.array([0, 1], np.int32), np.array([-1, 3], np.int32), np.array([1.5, 2.0]), np.array([10**9, 2]),
          np.zeros(0, np.int32), np.array([[1, 2]], np.int32), [0, 1], np.array([0, 0], np.int32),
          np.array([0, 1], np.int64), np.array([99], np.int32), np.arange(8, dtype=np.int32)[::2], None, 3,
          np.array([3], np.int32), np.array(["a", "b"])]
CFG = KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=64, block_size=16, group_size=32)
BS = CFG.block_size
SMALL2 = KVFormat("small2", (AgeTier(0, 4, 4), AgeTier(32, 2, 2)), sink_blocks=1)


class Hang(BaseException):
    """A call still running after ``HANG_SECONDS``: recorded as a raw outcome (a hang)."""


HANG_SECONDS = 60


def _alarm(signum, frame):
    raise Hang(f"still running after {HANG_SECONDS} s")


signal.signal(signal.SIGALRM, _alarm)


def t(label, fn):
    """_probe.t with the label on one line (arrays print on several), a hang cut short."""
    signal.alarm(HANG_SECONDS)
    try:
        _t(" ".join(str(label).split())[:200], fn)
    finally:
        signal.alarm(0)


SECTIONS = sys.argv[1:] or ["format", "tiered", "engine", "cuda", "serve", "demo"]


def ids(*values):
    return np.array(values, np.int32)


def pools_of(fmt, n=12):
    return {k.value: n for k in pool_kinds(kv_format(fmt), BS)}


# -- the tiered block manager ------------------------------------------------------------
def fresh(fmt="int4-aged") -> TieredKVCache:
    """Two sequences: 0 of 70 tokens (sink, re-sealed blocks, a tail), 1 of 5."""
    cache = TieredKVCache(CFG, fmt, pools_of(fmt), 4, max_seq_len=256)
    a, b = cache.add_sequence(), cache.add_sequence()
    cache.grow(a, 70)
    cache.grow(b, 5)
    return cache


def state(cache: TieredKVCache):
    return (cache._lens.copy(), cache._kind.copy(), [p.block_states().copy() for p in cache.pools],
            [p.num_free_blocks for p in cache.pools], [p._tables.copy() for p in cache.pools])


def same(a, b) -> bool:
    return (np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and a[3] == b[3]
            and all(np.array_equal(x, y) for x, y in zip(a[2], b[2]))
            and all(np.array_equal(x, y) for x, y in zip(a[4], b[4])))


def unchanged(label: str, cache: TieredKVCache, fn) -> None:
    """``fn()`` must leave the tiered cache as it found it when it raises, and a valid step work."""
    before = state(cache)
    try:
        fn()
    except Exception:
        if not same(before, state(cache)):
            RAW.append(f"{label}: state changed by a refused call")
        raise
    finally:
        try:
            cache.check_invariants()
            live = np.flatnonzero(cache._lens >= 0).astype(np.int32)
            live = live[cache._lens[live] < cache.max_seq_len]
            if live.size:
                cache.step(live)
                cache.check_invariants()
        except Exception as e:  # noqa: BLE001
            RAW.append(f"{label}: after: {type(e).__name__}: {str(e)[:100]}")


def probe_format():
    for h in H + NAMES:
        t(f"kv_format({h!r})", lambda: kv_format(h))
        t(f"KVCacheConfig(kv_dtype={h!r})", lambda: KVCacheConfig(1, 1, 64, 16, kv_dtype=h, group_size=32))
        t(f"pool_kinds({h!r}, 16)", lambda: pool_kinds(h, 16))
        t(f"block_pools({h!r}, 64, 16)", lambda: block_pools(h, 64, 16))
        t(f"pool_blocks_for({h!r}, 16, 8, 2)", lambda: pool_blocks_for(h, 16, 8, 2))
        for fmt in ("int4-aged", "int2-aged"):
            f = kv_format(fmt)
            t(f"pool_kinds({fmt}, bs={h!r})", lambda: pool_kinds(f, h))
            t(f"block_pools({fmt}, length={h!r})", lambda: block_pools(f, h, 16))
            t(f"block_pools({fmt}, bs={h!r})", lambda: block_pools(f, 64, h))
            t(f"pool_blocks_for({fmt}, bs={h!r})", lambda: pool_blocks_for(fmt, h, 8, 2))
            t(f"pool_blocks_for({fmt}, total={h!r})", lambda: pool_blocks_for(fmt, 16, h, 2))
            t(f"pool_blocks_for({fmt}, max_seqs={h!r})", lambda: pool_blocks_for(fmt, 16, 8, h))
    for bs in (7, 12, 48, 2**40, 0):
        t(f"pool_kinds(int4-aged, {bs})", lambda: pool_kinds(kv_format("int4-aged"), bs))
        t(f"pool_blocks_for(int4-aged, {bs})", lambda: pool_blocks_for("int4-aged", bs, 8, 2))
    t("KVFormat(tiers=(AgeTier(0,4,2),)) pool_kinds",
      lambda: pool_kinds(KVFormat("x", (AgeTier(0, 4, 2),)), 16))
    t("KVFormat(sink=-1)", lambda: pool_kinds(KVFormat("x", (AgeTier(16, 4, 4),), sink_blocks=-1), 16))
    t("KVFormat(sink=1.5)", lambda: pool_kinds(KVFormat("x", (AgeTier(16, 4, 4),), sink_blocks=1.5), 16))
    t("KVFormat(sink=None) blocks", lambda: block_pools(KVFormat("x", (AgeTier(16, 4, 4),), sink_blocks=None), 64, 16))
    t("KVFormat(fitted='yes')", lambda: KVFormat("x", (), fitted_keys="yes"))
    t("KVFormat(tiers=None)", lambda: KVFormat("x", None))
    t("KVFormat(tiers=5)", lambda: KVFormat("x", 5))
    t("pool_blocks_for(sink=10**6)", lambda: pool_blocks_for(KVFormat("x", (AgeTier(16, 4, 4),), 10**6), 16, 8, 2))
    t("pool_blocks_for(age=2**40)", lambda: pool_blocks_for(KVFormat("x", (AgeTier(2**40, 4, 4),), 1), 16, 8, 2))


def probe_tiered():
    for h in H + NAMES[:3]:
        t(f"TieredKVCache(config={h!r})", lambda: TieredKVCache(h, "int4-aged", pools_of("int4-aged"), 4))
        t(f"TieredKVCache(format={h!r})", lambda: TieredKVCache(CFG, h, pools_of("int4-aged"), 4))
        t(f"TieredKVCache(pool_blocks={h!r})", lambda: TieredKVCache(CFG, "int4-aged", h, 4))
        t(f"TieredKVCache(pool_blocks[int4]={h!r})",
          lambda: TieredKVCache(CFG, "int4-aged", {"fp16": 8, "int4": h}, 4))
        t(f"TieredKVCache(max_seqs={h!r})", lambda: TieredKVCache(CFG, "int4-aged", pools_of("int4-aged"), h))
        t(f"TieredKVCache(max_seq_len={h!r})",
          lambda: TieredKVCache(CFG, "int4-aged", pools_of("int4-aged"), 4, max_seq_len=h))
    for pb in ({"FP16": 8, "INT4": 8}, {"fp16": 8, "int4": 8, "int2": 8}, {"fp16": 8}, {1: 2, 3: 4},
               {"fp16": 2**40, "int4": 8}, {"fp16": 8, "int4": 8, None: 1}):
        t(f"TieredKVCache(pool_blocks={pb!r})", lambda: TieredKVCache(CFG, "int4-aged", pb, 4))
    t("TieredKVCache(config int4 head_dim 64 group 64)",
      lambda: TieredKVCache(KVCacheConfig(1, 1, 64, 16), "int2-aged", pools_of("int2-aged"), 4))
    t("TieredKVCache(head_dim 32)", lambda: TieredKVCache(KVCacheConfig(1, 1, 32, 16, group_size=32), "int4-aged",
                                                          pools_of("int4-aged"), 4))
    t("TieredKVCache(block 32, int4-aged-ish age 48)",
      lambda: TieredKVCache(KVCacheConfig(1, 1, 64, 32, group_size=32), KVFormat("x", (AgeTier(48, 4, 4),), 1),
                            {"fp16": 8, "int4": 8}, 4))
    for fmt in ("int4-aged", SMALL2):
        for h in H:
            for name in ("add_sequence", "free_sequence", "fork_sequence", "seq_len", "block_kinds"):
                c = fresh(fmt)
                t(f"{name}({h!r})", lambda: unchanged(name, c, lambda: getattr(c, name)(h)))
            c = fresh(fmt)
            t(f"fork_sequence(0, {h!r})", lambda: unchanged("fork", c, lambda: c.fork_sequence(0, h)))
            c = fresh(fmt)
            t(f"grow({h!r}, 80)", lambda: unchanged("grow", c, lambda: c.grow(h, 80)))
            c = fresh(fmt)
            t(f"grow(0, {h!r})", lambda: unchanged("grow", c, lambda: c.grow(0, h)))
        for a in ARRAYS + H:
            for name in ("step", "tail_pools", "block_tables"):
                c = fresh(fmt)
                t(f"{name}({a!r})", lambda: unchanged(name, c, lambda: getattr(c, name)(a)))
        for sid in (2, 3, 4, -1, 10**6):  # never added, or out of range
            for name in ("free_sequence", "fork_sequence", "seq_len", "block_kinds"):
                c = fresh(fmt)
                t(f"{name}({sid}) never added", lambda: unchanged(name, c, lambda: getattr(c, name)(sid)))
            c = fresh(fmt)
            t(f"step([{sid}])", lambda: unchanged("step", c, lambda: c.step(ids(sid))))
        c = fresh(fmt)
        c.free_sequence(1)
        for name in ("free_sequence", "fork_sequence", "seq_len", "block_kinds"):
            t(f"{name}(1) freed", lambda: unchanged(name, c, lambda: getattr(c, name)(1)))
        t("step([1]) freed", lambda: unchanged("step", c, lambda: c.step(ids(0, 1))))
        t("tail_pools([1]) freed", lambda: unchanged("tail_pools", c, lambda: c.tail_pools(ids(1))))
        t("block_tables([1]) freed", lambda: unchanged("block_tables", c, lambda: c.block_tables(ids(1))))
        t("grow(1) freed", lambda: unchanged("grow", c, lambda: c.grow(1, 20)))
        c = fresh(fmt)
        for n in (69, 0, 257, 2**31, 2**40):  # shrinking, past max_seq_len
            t(f"grow(0, {n})", lambda: unchanged("grow", c, lambda: c.grow(0, n)))
        c = fresh(fmt)
        t("add_sequence(0) taken", lambda: unchanged("add", c, lambda: c.add_sequence(0)))
        t("fork_sequence(0, 1) taken", lambda: unchanged("fork", c, lambda: c.fork_sequence(0, 1)))
        t("fork_sequence(0, 0)", lambda: unchanged("fork", c, lambda: c.fork_sequence(0, 0)))
        c = fresh(fmt)
        c.add_sequence()
        c.add_sequence()
        t("add_sequence() full", lambda: unchanged("add", c, lambda: c.add_sequence()))
        t("fork_sequence(0) full", lambda: unchanged("fork", c, lambda: c.fork_sequence(0)))
        small = TieredKVCache(CFG, fmt, pools_of(fmt, 3), 4, max_seq_len=256)
        s = small.add_sequence()
        t("grow past pools (OOM)", lambda: unchanged("grow", small, lambda: small.grow(s, 250)))
        full = TieredKVCache(CFG, fmt, pools_of(fmt), 2, max_seq_len=32)
        s = full.add_sequence()
        full.grow(s, 32)
        t("step at max_seq_len", lambda: unchanged("step", full, lambda: full.step(ids(s))))


# -- the Engine's format path --------------------------------------------------------------
def engine(fmt="int4-aged", **kw):
    return Engine(CFG, 0, 4, 2, format=fmt, pool_blocks=pools_of(fmt), max_seq_len=256, **kw)


def kv(n, rng=np.random.default_rng(0)):
    return tuple(rng.standard_normal((1, n, 1, 64)).astype(np.float16) for _ in range(2))


def engine_ok(e, label):
    """A valid prefill and step still work on ``e`` after a refused call."""
    try:
        s = e.add()
        e.prefill(s, *kv(20))
        step = e.step([s])
        step.write(np.zeros((1, 1, 2, 64), np.float16), *kv(1))
        step.run()
        e.finish(s)
        e.cache.check_invariants()
    except Exception as exc:  # noqa: BLE001
        RAW.append(f"{label}: after: {type(exc).__name__}: {str(exc)[:100]}")


def held(label: str, e, fn) -> None:
    """``fn()`` on Engine ``e`` must leave its block manager as it found it when it raises."""
    before = state(e.cache)
    try:
        fn()
    except Exception:
        if not same(before, state(e.cache)):
            RAW.append(f"{label}: state changed by a refused call")
        raise


def probe_engine():
    for h in H + NAMES:
        t(f"Engine(format={h!r})", lambda: Engine(CFG, 0, 4, 2, format=h, pool_blocks=pools_of("int4-aged")))
    for h in H + [{"fp16": 8}, {"FP16": 8, "INT4": 8}, {"fp16": 8, "int4": -1}, {"fp16": 8, "int4": 10**30}]:
        t(f"Engine(pool_blocks={h!r})", lambda: Engine(CFG, 0, 4, 2, format="int4-aged", pool_blocks=h))
    t("Engine(format=, no pool_blocks)", lambda: Engine(CFG, 0, 4, 2, format="int4-aged"))
    t("Engine(format=, num_blocks=8)", lambda: Engine(CFG, 8, 4, 2, format="int4-aged",
                                                       pool_blocks=pools_of("int4-aged")))
    t("Engine(pool_blocks= without format)", lambda: Engine(CFG, 8, 4, 2, pool_blocks=pools_of("int4-aged")))
    for kw in ({"prefix_cache": True}, {"speculative": True}, {"fault_tolerance": True}):
        t(f"Engine(format=, {kw})", lambda: engine(**kw))
    for h in (H, NAMES[:2])[0]:
        e = engine()
        e.prefill(e.add(), *kv(20))
        for name, call in (("prefill(h, k, v)", lambda: e.prefill(h, *kv(20))),
                           ("prefill(0, h, v)", lambda: e.prefill(0, h, kv(20)[1])),
                           ("fork(h)", lambda: e.fork(h)), ("finish(h)", lambda: e.finish(h)),
                           ("step(h)", lambda: e.step(h)), ("seq_len(h)", lambda: e.seq_len(h)),
                           ("buffers(h)", lambda: e.buffers(h))):
            t(f"engine.{name} h={h!r}", lambda: held(f"engine.{name} h={h!r}", e, call))
        engine_ok(e, f"engine after {h!r}")
    e = engine()
    s = e.add()
    for bad in (np.zeros((1, 20, 1, 64), np.float32), np.zeros((2, 20, 1, 64), np.float16),
                np.zeros((1, 20, 2, 64), np.float16), np.zeros((1, 300, 1, 64), np.float16),
                np.zeros((20, 64), np.float16), np.full((1, 20, 1, 64), np.nan, np.float16),
                np.zeros((1, 0, 1, 64), np.float16)):
        t(f"engine.prefill(k={bad.shape} {bad.dtype})", lambda: e.prefill(s, bad, bad.copy()))
        t(f"engine.prefill(v={bad.shape} {bad.dtype})", lambda: e.prefill(s, np.zeros((1, 20, 1, 64), np.float16),
                                                                          bad))
    t("engine.prefill(tokens=)", lambda: e.prefill(s, *kv(20), tokens=np.arange(20, dtype=np.int32)))
    t("engine.prefill(never added 3)", lambda: e.prefill(3, *kv(20)))
    q1 = np.zeros((20, 2, 64), np.float16)
    for name, call in (("admit", lambda: e.admit(np.arange(20, dtype=np.int32))),
                       ("truncate", lambda: e.truncate(s, 0)), ("check", lambda: e.check()),
                       ("prefill_attention", lambda: e.prefill_attention(s, 0, q1, *kv(20))),
                       ("batch_rows", lambda: e.batch_rows([s], [1], 1))):
        t(f"engine.{name}(...) with a format", call)
    engine_ok(e, "engine after prefill shapes")
    e = engine()
    s = e.add()
    e.prefill(s, *kv(20))
    step = e.step([s])
    for h in H:
        if not (isinstance(h, (int, np.integer)) and h == 0):  # (a valid layer loads the step)
            t(f"step.attend({h!r})", lambda: step.attend(h))
        t(f"step.run(stream={h!r})", lambda: step.run(stream=h))
        t(f"step.write({h!r}, k, v)", lambda: step.write(h, *kv(1)))
    t("step.write valid", lambda: step.write(np.zeros((1, 1, 2, 64), np.float16), *kv(1)))
    t("step.run() (maybe run by stream=0 above)", lambda: step.run())
    t("step.run() twice", lambda: step.run())
    t("step.attend(0) after run", lambda: step.attend(0))
    e.finish(s)
    t("engine.step([freed])", lambda: e.step([s]))
    t("engine.fork(freed)", lambda: e.fork(s))
    t("engine.finish(freed)", lambda: e.finish(s))
    engine_ok(e, "engine after a freed id")


# -- the device side ---------------------------------------------------------------------
def device_setup(fmt=SMALL2):
    from numba import cuda

    cache = fresh(fmt)
    stores = [hc.DeviceKVStore(dataclasses.replace(CFG, kv_dtype=k), p.num_blocks, 4)
              for k, p in zip(cache.kinds, cache.pools)]
    sids = ids(0, 1)
    tables = cache.block_tables(sids)
    args = dict(tables=[tb for tb, _ in tables], counts=[c for _, c in tables],
                tail_lens=(np.array([cache.seq_len(0), cache.seq_len(1)]) % BS).astype(np.int32),
                tail_pool=cache.tail_pools(sids), tail_slots=sids)
    q = cuda.to_device(np.zeros((2, 2, 64), np.float16))
    return cache, stores, q, args


def probe_cuda():
    from numba import cuda

    cache, stores, q, args = device_setup()
    t("tiered_decode valid", lambda: hc.tiered_decode(q, stores, **args))
    for name in ("tables", "counts", "tail_lens", "tail_pool", "tail_slots"):
        for a in ARRAYS + H + [[np.zeros((2, 1), np.int32)] * 3, [np.zeros(2, np.float32)] * 3,
                               [np.array([[0, 1]], np.int32)] * 3]:
            bad = dict(args, **{name: a})
            t(f"tiered_decode({name}={a!r})", lambda: hc.tiered_decode(q, stores, **bad))
    for h in H:
        t(f"tiered_decode(q={h!r})", lambda: hc.tiered_decode(h, stores, **args))
        t(f"tiered_decode(stores={h!r})", lambda: hc.tiered_decode(q, h, **args))
        t(f"tiered_decode(layer={h!r})", lambda: hc.tiered_decode(q, stores, **args, layer=h))
        t(f"tiered_decode(scale={h!r})", lambda: hc.tiered_decode(q, stores, **args, scale=h))
        t(f"tiered_decode(out={h!r})", lambda: hc.tiered_decode(q, stores, **args, out=h))
        t(f"tiered_decode(options={h!r})", lambda: hc.tiered_decode(q, stores, **args, options=h))
        t(f"TieredDecodePlan(buffers={h!r})", lambda: hc.TieredDecodePlan(stores, *args.values(), buffers=h))
        t(f"TieredDecodePlan(scale={h!r}).run", lambda: hc.TieredDecodePlan(stores, *args.values(), scale=h).run(0, q))
        t(f"TieredDecodePlan(options={h!r}).run",
          lambda: hc.TieredDecodePlan(stores, *args.values(), options=h).run(0, q))
        t(f"TieredDecodePlan(upload={h!r}).run",
          lambda: hc.TieredDecodePlan(stores, *args.values(), upload=h).run(0, q))
        t(f"TieredDecodePlan(reuse={h!r}).run", lambda: hc.TieredDecodePlan(stores, *args.values(), reuse=h).run(0, q))
        plan = hc.TieredDecodePlan(stores, *args.values())
        t(f"TieredDecodePlan.run(layer={h!r})", lambda: plan.run(h, q))
        plan = hc.TieredDecodePlan(stores, *args.values())
        t(f"TieredDecodePlan.run(q={h!r})", lambda: plan.run(0, h))
        plan = hc.TieredDecodePlan(stores, *args.values())
        plan.run(0, q, out=cuda.device_array((2, 2, 64), np.float16))
        t(f"TieredDecodePlan.run(q={h!r}) second",
          lambda: plan.run(0, h, out=cuda.device_array((2, 2, 64), np.float16)))
        t(f"TieredDecodePlan.run(out={h!r}) second", lambda: plan.run(0, q, out=h))
    t("tiered_decode q [3,2,64]", lambda: hc.tiered_decode(cuda.to_device(np.zeros((3, 2, 64), np.float16)), stores,
                                                            **args))
    t("tiered_decode q [2,3,64]", lambda: hc.tiered_decode(cuda.to_device(np.zeros((2, 3, 64), np.float16)), stores,
                                                            **args))
    t("tiered_decode q float32", lambda: hc.tiered_decode(cuda.to_device(np.zeros((2, 2, 64), np.float32)), stores,
                                                           **args))
    t("tiered_decode q host", lambda: hc.tiered_decode(np.zeros((2, 2, 64), np.float16), stores, **args))
    t("tiered_decode stores reversed", lambda: hc.tiered_decode(q, stores[::-1], **args))
    t("tiered_decode stores short", lambda: hc.tiered_decode(q, stores[:2], **args))
    t("tiered_decode store of another shape",
      lambda: hc.tiered_decode(q, [hc.DeviceKVStore(KVCacheConfig(1, 2, 64, 16, group_size=32), 12, 4)] + stores[1:],
                               **args))
    t("tiered_decode tail_slots 99", lambda: hc.tiered_decode(q, stores, **dict(args, tail_slots=ids(0, 99))))
    t("tiered_decode tables block 999", lambda: hc.tiered_decode(
        q, stores, **dict(args, tables=[np.full_like(x, 999) for x in args["tables"]])))
    # run_tiered_ops and reseal_blocks (hexcore/cuda/blocks.py)
    step = cache.step(ids(0, 1)).ops
    for h in ARRAYS + H + [np.zeros((2, 6), np.float64), np.zeros((2, 5), np.int32), np.full((1, 6), 99, np.int32),
                           np.array([[0, 4, 5, 0, 1, 0]], np.int32)]:
        t(f"run_tiered_ops(ops={h!r})", lambda: hc.run_tiered_ops(stores, h))
    for h in H:
        t(f"run_tiered_ops(stores={h!r})", lambda: hc.run_tiered_ops(h, step))
        t(f"run_tiered_ops(fitted_keys={h!r})", lambda: hc.run_tiered_ops(stores, step, h))
        t(f"run_tiered_ops(rows={h!r})", lambda: hc.run_tiered_ops(stores, step, rows=h))
        t(f"reseal_blocks(src={h!r})", lambda: hc.reseal_blocks(h, ids(0), stores[2], ids(1)))
        t(f"reseal_blocks(src_ids={h!r})", lambda: hc.reseal_blocks(stores[1], h, stores[2], ids(1)))
        t(f"reseal_blocks(dst_ids={h!r})", lambda: hc.reseal_blocks(stores[1], ids(0), stores[2], h))
        t(f"reseal_blocks(fitted_keys={h!r})", lambda: hc.reseal_blocks(stores[1], ids(0), stores[2], ids(1), h))
    t("reseal_blocks same store", lambda: hc.reseal_blocks(stores[1], ids(0), stores[1], ids(1)))
    t("reseal_blocks ids 99", lambda: hc.reseal_blocks(stores[1], ids(99), stores[2], ids(1)))
    t("reseal_blocks lengths differ", lambda: hc.reseal_blocks(stores[1], ids(0, 1), stores[2], ids(1)))
    t("tiered_decode valid after", lambda: hc.tiered_decode(q, stores, **args))


# -- serving -------------------------------------------------------------------------------
def probe_serve():
    from hexcore.serve import Server
    from hexcore.serve_workload import TokenTable, Workload, exact_attention, synthetic_workload

    work = Workload(np.array([0, 0]), np.array([20, 5]), np.array([2, 2]))
    base = dict(cfg=CFG, num_q_heads=2, num_blocks=8, max_seqs=2, workload=work, check_every=1, format="int4-aged")

    def served(**kw):
        server = Server(**dict(base, **kw))
        server.run(max_steps=3)

    t("Server valid", lambda: served())
    for h in H + NAMES[:3]:
        for name in ("cfg", "num_q_heads", "num_blocks", "max_seqs", "workload", "seed", "max_prefill_tokens",
                     "check_every", "check_seqs", "batch_buckets", "on_step", "fault_tolerance", "sample_every",
                     "inject_at", "format"):
            if not (type(h) is int and h == 10**6 and name in ("num_blocks", "max_seqs")):  # (GBs of device memory)
                t(f"Server({name}={h!r})", lambda: served(**{name: h}))
        t(f"Server.run(max_steps={h!r})", lambda: Server(**base).run(max_steps=h))
    for fields in (([0], [0], [2]), ([0], [-5], [2]), ([0], [20], [0]), ([0], [20.5], [2]), ([], [], []),
                   ([0, 1], [20], [2]), ([5, 0], [20, 20], [2, 2]), ([-1], [20], [2]), (None, None, None),
                   ([0], [10**9], [2]), ([0], [np.nan], [2]), ([0], [2**62], [2**62]), ([[0]], [20], [2])):
        t(f"Server(workload=Workload{fields!r})", lambda: served(workload=Workload(*map(np.asarray, fields))))
    t("Server(num_q_heads=3)", lambda: served(num_q_heads=3))
    for fmt in (None, "int2-aged"):
        t(f"Server(format={fmt}, cfg int4 group 64)", lambda: served(format=fmt, cfg=KVCacheConfig(1, 1, 64, 16)))
    rng = np.random.default_rng(0)
    good = (4, rng, 20, 30, 5, 8, 1.0)
    for h in H:
        for i, name in enumerate(("num_requests", "rng", "prompt_mean", "prompt_max", "output_mean", "output_max",
                                  "arrivals_per_step")):
            bad = good[:i] + (h,) + good[i + 1:]
            t(f"synthetic_workload({name}={h!r})", lambda: synthetic_workload(*bad))
        t(f"TokenTable(cfg={h!r})", lambda: TokenTable(h, 0))
        t(f"TokenTable(seed={h!r})", lambda: TokenTable(CFG, h))
        tt = TokenTable(CFG, 0)
        t(f"TokenTable.span({h!r}, 0, 4)", lambda: tt.span(h, 0, 4))
        t(f"TokenTable.span(0, 0, {h!r})", lambda: tt.span(0, 0, h))
        t(f"exact_attention(scale={h!r})",
          lambda: exact_attention(np.zeros((2, 64)), np.zeros((3, 1, 64)), np.zeros((3, 1, 64)), h))
        t(f"exact_attention(q={h!r})", lambda: exact_attention(h, np.zeros((3, 1, 64)), np.zeros((3, 1, 64)), 1.0))
    for mean, mx in ((0, 8), (-1, 8), (20, 0), (20, -3)):
        t(f"synthetic_workload(prompt_mean={mean}, prompt_max={mx})",
          lambda: synthetic_workload(4, rng, mean, mx, 5, 8, 1.0))
    t("synthetic_workload(arrivals 0)", lambda: synthetic_workload(4, rng, 20, 30, 5, 8, 0.0))
    t("exact_attention(empty keys)", lambda: exact_attention(np.zeros((2, 64)), np.zeros((0, 1, 64)),
                                                             np.zeros((0, 1, 64)), 1.0))
    from hexcore.serve_faults import FaultDrill

    plain = Server(CFG, 2, 8, 2, work, check_every=1)  # (no format: the fault drill's cache)
    for h in H:
        t(f"FaultDrill(sample_every={h!r})", lambda: FaultDrill(plain, h, 3))
        t(f"FaultDrill(inject_at={h!r}).inject", lambda: FaultDrill(plain, 2, h).inject(1))
        t(f"FaultDrill(server={h!r})", lambda: FaultDrill(h, 2, 3))
    t("Server valid after", lambda: served())


def probe_demo():
    from hexcore.demo import demo_shape, run_demo, warmup_workload

    for h in H + NAMES[:3]:
        t(f"demo_shape(True, format={h!r})", lambda: demo_shape(True, format=h))
        t(f"demo_shape(False, format={h!r})", lambda: demo_shape(False, format=h))
        t(f"demo_shape(False, preset={h!r})", lambda: demo_shape(False, preset=h))
        t(f"demo_shape(True, kv_dtype={h!r})", lambda: demo_shape(True, kv_dtype=h))
        t(f"demo_shape(False, block_size={h!r})", lambda: demo_shape(False, block_size=h))
        t(f"demo_shape(False, layers={h!r})", lambda: demo_shape(False, layers=h))
        t(f"warmup_workload(format={h!r})",
          lambda: warmup_workload(dataclasses.replace(demo_shape(True), format=h)))
        shape = demo_shape(True, format="int4-aged")
        t(f"run_demo(num_requests={h!r})", lambda: run_demo(shape, h, max_steps=2, progress=False))
        t(f"run_demo(seed={h!r})", lambda: run_demo(shape, 1, seed=h, max_steps=2, progress=False))
        t(f"run_demo(max_steps={h!r})", lambda: run_demo(shape, 1, max_steps=h, progress=False))
        t(f"run_demo(shape={h!r})", lambda: run_demo(h, 1, max_steps=2, progress=False))


PROBES = {"format": probe_format, "tiered": probe_tiered, "engine": probe_engine, "cuda": probe_cuda,
          "serve": probe_serve, "demo": probe_demo}
for section in SECTIONS:
    before = len(RAW)
    PROBES[section]()
    print(f"[{section}] raw {len(RAW) - before}", *sorted(set(RAW[before:])), sep="\n  ", flush=True)
report()
