"""Hostile values into the decode API (pass 5, the decode area): every field of
DecodeOptions and SplitCosts, paged_decode, DecodePlan (constructor, launch, run),
persistent_decode, PersistentDecode (constructor with budget_us, count_items, workspace;
launches, run, enqueue(layer, slices), stats), prefill_attention, prefill_attention_batch
(and BatchRows) and gather_prefix, on a small FP16 store of two layers (two sequences:
37 and 16 tokens).

Prints every call that ended in anything but a typed error, and every refused call that
left state changed: the store's pool, the merge counters of the decode workspaces (all
zero between calls), a plan's prepared layers, its workspace's ``has_mid_call`` and its own ``_mid_call`` mark; after
every section a valid call must still give the output it gave before the section.

cd fuzz/probes && NUMBA_ENABLE_CUDASIM=1 nice -n 5 python api_pass_5_decode.py [SECTION ...]
(sections: options decode plan persistent prefill; all by default)
"""
import os
import sys
import warnings

import numpy as np

from _probe import RAW, report
from _probe import t as _t

warnings.simplefilter("ignore")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
    from hexcore.cuda.simulated import use_fast_simulator

    use_fast_simulator()
from numba import cuda  # noqa: E402

from hexcore import KVCacheConfig  # noqa: E402
from hexcore.cuda import (BatchRows, DecodeOptions, DecodePlan, PersistentDecode, SplitCosts,  # noqa: E402
                          gather_prefix, paged_decode, persistent_decode, prefill_attention, prefill_attention_batch)
from hexcore.cuda.attention import launcher, persistent  # noqa: E402
from tests.cuda.fill import random_cache  # noqa: E402

H = [None, True, np.bool_(False), 1.5, float("nan"), float("inf"), -1, 0, 10**30, 10**400, "3", b"1", [1],
     object(), np.array([1]), np.zeros((2, 2)), np.int64(2), np.uint8(1), np.float32(2.0), np.float64("nan")]
CFG = KVCacheConfig(num_layers=2, num_kv_heads=1, head_dim=64, block_size=16, kv_dtype="fp16")
SECTIONS = sys.argv[1:] or ["options", "decode", "plan", "persistent", "prefill"]
SPLIT = DecodeOptions(ctas_per_sm=4, split_blocks=1)


def t(label, fn):
    """_probe.t with the label on one line."""
    _t(" ".join(label.split()), fn)


rng = np.random.default_rng(0)
store, TABLES, TAILS, _, _ = random_cache(CFG, [37, 16], rng)
LENS = np.array([37, 16], np.int32)
Q = rng.standard_normal((2, 2, 64)).astype(np.float16)
POOL = store.pool.copy_to_host()


def arrays_like(x):
    """Hostile arrays for an argument whose valid value is ``x`` (host)."""
    return [x.astype(np.int64), x.astype(np.float32), x[None], x.reshape(-1)[:1], np.asfortranarray(np.stack([x, x]))
            if x.ndim == 1 else np.asfortranarray(x), cuda.to_device(x.astype(np.int64)), x.tolist(), x + 1000,
            -np.ones_like(x), np.zeros(0, x.dtype)]


def counters_zero():
    """Every merge counter of both decode workspaces is zero (a refused call may not leave one mid-merge)."""
    for ws in (launcher._workspace, persistent._workspace):
        for _, _, counters in ws._arrays.values():
            if counters.copy_to_host().any():
                return False
    return True


def unchanged(label, fn, *extra):
    """``fn()`` must leave the pool, the counters and ``extra`` (callables of state) as it found them."""
    before = [f() for f in extra]
    try:
        fn()
    except Exception:
        if not np.array_equal(store.pool.copy_to_host(), POOL):
            RAW.append(f"{label}: store pool changed by a refused call")
        if not counters_zero():
            RAW.append(f"{label}: merge counters left non-zero by a refused call")
        if [f() for f in extra] != before:
            RAW.append(f"{label}: state changed by a refused call: {before} -> {[f() for f in extra]}")
        raise


def check_still(label, fn, expect):
    """A valid call after a section gives ``expect``."""
    try:
        got = fn()
    except Exception as e:  # noqa: BLE001
        RAW.append(f"{label}: valid call after the section raised {type(e).__name__}: {e}")
        return
    if not np.array_equal(got, expect, equal_nan=True):
        RAW.append(f"{label}: valid call after the section gives another output")


def decode(**kw):
    args = dict(q=Q, store=store, layer=0, block_tables=TABLES, seq_lens=LENS, tail_slots=TAILS)
    args.update(kw)
    return paged_decode(**args)


BASE = decode().copy_to_host()
BASE1 = decode(layer=1).copy_to_host()

if "options" in SECTIONS:
    fields = ("ctas_per_sm", "min_split_blocks", "split_blocks", "split_overhead", "split_costs", "max_registers",
              "l2_prefetch", "joint_softmax", "launch_path", "persistent_item", "tiered_fp16", "tiered_merge",
              "dependent_launch", "cluster_merge")
    for name in fields:
        for h in H + ["", "RAW", 256, 10**6]:
            t(f"DecodeOptions({name}={h!r})", lambda: decode(options=DecodeOptions(**{name: h})))
    for name in ("cta", "merge", "cluster_merge", "cluster_saving", "cluster_spread"):
        for h in H + [1e7]:
            kw = dict(cta=1.0, merge=0.1, cluster_merge=0.1, cluster_saving=1.0)
            kw[name] = h
            t(f"SplitCosts({name}={h!r})", lambda: decode(options=DecodeOptions(split_costs=SplitCosts(**kw))))
    t("DecodeOptions(dependent_launch=True, launch_path='core')",
      lambda: DecodeOptions(dependent_launch=True, launch_path="core"))
    check_still("options", lambda: decode().copy_to_host(), BASE)

if "decode" in SECTIONS:
    for h in H:
        for name in ("q", "store", "layer", "block_tables", "seq_lens", "tail_slots", "out", "scale", "max_seq_len",
                     "stream", "options", "verify"):
            t(f"paged_decode({name}={h!r})", lambda: unchanged(name, lambda: decode(**{name: h})))
    for name, x in (("block_tables", TABLES), ("seq_lens", LENS), ("tail_slots", TAILS), ("q", Q)):
        for a in arrays_like(x):
            t(f"paged_decode({name}={type(a).__name__} {getattr(a, 'dtype', '')} {getattr(a, 'shape', '')})",
              lambda: unchanged(name, lambda: decode(**{name: a})))
    for lens in ([500, 16], [48, 16], [37, 10**9], [-1, 0]):
        t(f"paged_decode(seq_lens={lens})", lambda: unchanged("seq_lens", lambda: decode(
            seq_lens=np.array(lens, np.int32))))
    bad = TABLES.copy()
    bad[0, 1] = 10**6
    t("paged_decode(table id out of range)", lambda: unchanged("tables", lambda: decode(block_tables=bad)))
    t("paged_decode(q 3 heads)", lambda: decode(q=np.zeros((2, 3, 64), np.float16)))
    t("paged_decode(q head_dim 32)", lambda: decode(q=np.zeros((2, 2, 32), np.float16)))
    t("paged_decode(q batch 0)", lambda: decode(q=np.zeros((0, 2, 64), np.float16), block_tables=TABLES[:0],
                                                seq_lens=LENS[:0], tail_slots=TAILS[:0]))
    t("paged_decode(out host)", lambda: decode(out=np.zeros((2, 2, 64), np.float16)))
    t("paged_decode(out = store view)", lambda: decode(out=store.arrays["k_tails"][0, :2, 0, :2]))
    t("paged_decode(max_seq_len=16 < lens)", lambda: decode(max_seq_len=16))
    dev = [cuda.to_device(a) for a in (TABLES, LENS, TAILS)]
    for h in (-1, 10**30, 0, 10**6):
        t(f"paged_decode(device, max_seq_len={h!r})", lambda: decode(block_tables=dev[0], seq_lens=dev[1],
                                                                      tail_slots=dev[2], max_seq_len=h))
    check_still("decode", lambda: decode().copy_to_host(), BASE)
    check_still("decode layer 1", lambda: decode(layer=1).copy_to_host(), BASE1)

DEV = dict(q=cuda.to_device(Q), block_tables=cuda.to_device(TABLES), seq_lens=cuda.to_device(LENS),
           tail_slots=cuda.to_device(TAILS))


def plan(**kw):
    args = dict(DEV, store=store, max_seq_len=37)
    args.update(kw)
    return DecodePlan(**args)


if "plan" in SECTIONS:
    for h in H:
        for name in ("q", "store", "block_tables", "seq_lens", "tail_slots", "max_seq_len", "out", "scale",
                     "workspace", "options", "verify"):
            t(f"DecodePlan({name}={h!r})", lambda: unchanged(name, lambda: plan(**{name: h})))
    p = plan()
    p.run(0)
    ran = p.out.copy_to_host()
    for h in H + [2, np.int64(5), 1.0]:
        t(f"DecodePlan.run({h!r})", lambda: unchanged("run", lambda: p.run(h), lambda: sorted(p._layers)))
        t(f"DecodePlan.launch({h!r})", lambda: unchanged("launch", lambda: p.launch(h), lambda: sorted(p._layers)))
        t(f"DecodePlan.run(0, stream={h!r})", lambda: unchanged("run", lambda: p.run(0, stream=h)))
    check_still("plan", lambda: p.run(0).copy_to_host(), BASE)
    check_still("plan", lambda: plan().run(np.int64(1)).copy_to_host(), BASE1)

if "persistent" in SECTIONS:
    def pdecode(**kw):
        args = dict(q=Q, store=store, layer=0, block_tables=TABLES, seq_lens=LENS, tail_slots=TAILS, budget_us=1e5,
                    options=SPLIT)
        args.update(kw)
        return persistent_decode(**args)[0]

    def pplan(**kw):
        args = dict(DEV, store=store, budget_us=1e5, max_seq_len=37, options=SPLIT)
        args.update(kw)
        return PersistentDecode(**args)

    for h in H + [1e-9, 2e6]:
        t(f"persistent_decode(budget_us={h!r})", lambda: unchanged("budget", lambda: pdecode(budget_us=h)))
        t(f"PersistentDecode(budget_us={h!r})", lambda: unchanged("budget", lambda: pplan(budget_us=h)))
    entries = (("persistent_decode", pdecode, ("q", "store", "layer", "block_tables", "seq_lens", "tail_slots",
                                               "out", "scale", "max_seq_len", "options", "count_items", "stream"),
                "stream"),
               ("PersistentDecode", pplan, ("q", "store", "block_tables", "seq_lens", "tail_slots", "max_seq_len",
                                            "out", "scale", "options", "count_items", "workspace"), "workspace"))
    for h in H:
        for label, call, names, last in entries:  # (None is the default of out, scale, ... and of `last`)
            for name in names:
                if h is None and name in ("out", "scale", "max_seq_len", "options", last):
                    continue
                if name == "count_items" and isinstance(h, (bool, np.bool_)):
                    continue
                t(f"{label}({name}={h!r})", lambda: unchanged(name, lambda: call(**{name: h})))
    for name in ("ctas_per_sm", "split_blocks", "min_split_blocks", "max_registers", "split_overhead"):
        for h in (1, 10**30, 999999, 0.0):
            t(f"persistent_decode(options {name}={h!r})", lambda: unchanged(name, lambda: pdecode(
                options=DecodeOptions(**{name: h}))))
    t("persistent_decode(batch 0)", lambda: pdecode(q=Q[:0], block_tables=TABLES[:0], seq_lens=LENS[:0],
                                                    tail_slots=TAILS[:0]))
    pp = pplan()
    pp.run(0)
    pstate = (lambda: sorted(pp._layers), lambda: pp._workspace.has_mid_call, lambda: pp._mid_call, lambda: pp.resets)
    for h in H + [2, 1.0]:
        t(f"PersistentDecode.run({h!r})", lambda: unchanged("prun", lambda: pp.run(h), *pstate))
        t(f"PersistentDecode.launches({h!r})", lambda: unchanged("plaunches", lambda: pp.launches(h), *pstate))
        t(f"PersistentDecode.enqueue({h!r}, 4)", lambda: unchanged("penq", lambda: pp.enqueue(h, 4), *pstate))
        t(f"PersistentDecode.enqueue(0, {h!r})", lambda: unchanged("penq", lambda: pp.enqueue(0, h), *pstate))
        t(f"PersistentDecode.run(0, stream={h!r})", lambda: unchanged("prun", lambda: pp.run(0, stream=h), *pstate))
        t(f"PersistentDecode.stats(stream={h!r})", lambda: pp.stats(stream=h))
    check_still("persistent plan", lambda: pp.run(0).copy_to_host(), BASE)
    check_still("persistent", lambda: pdecode().copy_to_host(), BASE)

if "prefill" in SECTIONS:
    NEW = rng.standard_normal((3, 1, 64)).astype(np.float16)
    QP = rng.standard_normal((3, 2, 64)).astype(np.float16)

    def gather(**kw):
        args = dict(store=store, layer=0, block_table=TABLES[0], prefix_len=37, tail_slot=int(TAILS[0]))
        args.update(kw)
        return gather_prefix(**args)

    def prefill(**kw):
        args = dict(q=QP, k_new=NEW, v_new=NEW, store=store, layer=0, block_table=TABLES[0], prefix_len=37,
                    tail_slot=int(TAILS[0]), backend="numba")
        args.update(kw)
        return prefill_attention(**args)

    QB, NB = QP[None].repeat(2, 0), NEW[None].repeat(2, 0)
    ROWS = dict(block_tables=TABLES, prefix_lens=LENS, tail_slots=TAILS, n_new=np.array([3, 2], np.int32))

    def batch(**kw):
        args = dict(q=QB, k_new=NB, v_new=NB, store=store, layer=0, backend="numba", **ROWS)
        args.update(kw)
        return prefill_attention_batch(**args)

    GBASE = gather()[0].copy_to_host()
    PBASE = prefill().copy_to_host()
    BBASE = batch().copy_to_host()
    for h in H:
        for name in ("store", "layer", "block_table", "prefix_len", "tail_slot", "k_new", "v_new", "k_out", "v_out",
                     "stream"):
            if h is None and name in ("tail_slot", "k_new", "v_new", "k_out", "v_out", "stream"):
                continue
            t(f"gather_prefix({name}={h!r})", lambda: unchanged(name, lambda: gather(**{name: h})))
        for name in ("q", "k_new", "v_new", "store", "layer", "block_table", "prefix_len", "tail_slot", "out",
                     "scale", "backend", "stream"):
            if h is None and name in ("tail_slot", "out", "scale", "stream"):
                continue
            t(f"prefill_attention({name}={h!r})", lambda: unchanged(name, lambda: prefill(**{name: h})))
        for name in ("q", "k_new", "v_new", "store", "layer", "block_tables", "prefix_lens", "tail_slots", "n_new",
                     "out", "scale", "backend", "stream", "rows"):
            if h is None and name in ("out", "scale", "stream", "rows"):
                continue
            t(f"prefill_attention_batch({name}={h!r})", lambda: unchanged(name, lambda: batch(**{name: h})))
        for name in ("batch", "n_max"):
            kw = dict(store=store, batch=2, n_max=3, **ROWS)
            kw[name] = h
            t(f"BatchRows({name}={h!r})", lambda: BatchRows(**kw))
    for name, x in (("block_tables", TABLES), ("prefix_lens", LENS), ("tail_slots", TAILS),
                    ("n_new", np.array([3, 2], np.int32))):
        for a in arrays_like(x):
            t(f"prefill_attention_batch({name}={type(a).__name__} {getattr(a, 'shape', '')})",
              lambda: unchanged(name, lambda: batch(**{name: a})))
    for a in arrays_like(TABLES[0]):
        t(f"gather_prefix(block_table={type(a).__name__} {getattr(a, 'shape', '')})",
          lambda: unchanged("bt", lambda: gather(block_table=a)))
    for n in (-1, 10**9, 2**31, 2**62, 48):
        t(f"gather_prefix(prefix_len={n})", lambda: unchanged("pl", lambda: gather(prefix_len=n)))
    one = cuda.device_array((1, 37, 64), np.float16)
    t("gather_prefix(k_out is v_out)", lambda: gather(k_out=one, v_out=one))
    t("gather_prefix(k_out = store view)", lambda: gather(k_out=store.arrays["k_codes"][0, :1, :, :37]))
    t("prefill_attention(q 3 heads)", lambda: prefill(q=np.zeros((3, 3, 64), np.float16)))
    t("prefill_attention(v_new n 2)", lambda: prefill(v_new=NEW[:2]))
    rows = BatchRows(store, 2, 3, **ROWS)
    t("prefill_attention_batch(rows + tables)", lambda: batch(rows=rows))
    t("prefill_attention_batch(rows of 2x2)", lambda: batch(rows=BatchRows(store, 2, 2, **{**ROWS, "n_new": np.array(
        [2, 2], np.int32)}), **{k: None for k in ROWS}))
    check_still("gather", lambda: gather()[0].copy_to_host(), GBASE)
    check_still("prefill", lambda: prefill().copy_to_host(), PBASE)
    check_still("batch", lambda: batch().copy_to_host(), BBASE)
    check_still("batch rows", lambda: batch(rows=rows, **{k: None for k in ROWS}).copy_to_host(), BBASE)
report()
