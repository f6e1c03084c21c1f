"""Every kernel once on small shapes, for compute-sanitizer (memcheck, racecheck,
initcheck, synccheck): append, seal (from tails and from rows), copy (blocks, tails), dequantize, the layout check,
paged decode (every dtype, MHA and GQA, one split and many, a head group of 9; the verify
variant checking every block against head digests the head-digest kernel recorded; a plan of
programmatic dependent launches), a
DecodeGraph step (and one that verifies blocks against their digests inside the step), prefill over a cached prefix (gather and extend kernels, one sequence and a batch), block
checksums and guard words, the persistent decode (several slices; a wide one-launch call past
the resident CTAs), and a format by age's
kernels (the seal with fitted keys, re-seals between pools, the partials decode and its merge).

    compute-sanitizer --tool racecheck python3 -m benchmarks.sanitize
"""

from __future__ import annotations

import dataclasses
import sys

import numpy as np
from numba import cuda

from hexcore import KVCacheConfig
from hexcore.cuda import (DecodeGraph, DecodeOptions, DeviceKVStore, PersistentDecode, TieredDecodePlan, append,
                          copy_blocks, copy_tails, dequantize_blocks, layout_agrees, nonfinite_flags, paged_decode,
                          persistent_decode, prefill_attention, prefill_attention_batch, reseal_blocks, seal, seal_rows,
                          tiered_decode)
from hexcore.cuda.attention import DecodeVerify
from hexcore.cuda.attention.persistent import MAX_BUDGET_US
from hexcore.cuda.device import SIMULATOR
from hexcore.cuda.integrity import check_guards, checksum_blocks, record_head_sums

SPLIT = DecodeOptions(ctas_per_sm=64, split_blocks=1)
CAPPED = DecodeOptions(max_registers=128)  # the grid kernel past one wave (these few items run uncapped)


def run_dtype(dtype: str, rng, only: str | None = None) -> None:
    cfg = KVCacheConfig(num_layers=2, num_kv_heads=2, head_dim=128, block_size=16, kv_dtype=dtype)
    store = DeviceKVStore(cfg, num_blocks=8, max_seqs=3)
    store.pool.copy_to_device(np.zeros(store.pool.shape, np.uint32))  # initcheck: every byte written once
    store.fill_guards()  # the zeros above overwrote the guard words
    k = rng.standard_normal((2, 16, 2, 128)).astype(np.float16)
    append(store, k, k, np.zeros(16, np.int32), np.arange(16, dtype=np.int32))
    flags = nonfinite_flags(store, 1)  # the seal kernels' non-finite report
    seal(store, np.array([0], np.int32), np.array([5], np.int32), nonfinite=flags)
    seal_rows(store, k, k, 0, np.array([7], np.int32), nonfinite=flags)  # a prompt's block, from its rows
    append(store, k[:, :3], k[:, :3], np.zeros(3, np.int32), np.arange(3, dtype=np.int32))
    copy_blocks(store, np.array([5], np.int32), np.array([6], np.int32))
    copy_tails(store, np.array([0], np.int32), np.array([1], np.int32))
    tables = np.array([[5, 6, 0], [6, 5, 0]], np.int32)
    if only == "new":
        return run_new_kernels(store, tables, rng)
    if only == "verify":
        return run_verify_decode(store, tables, rng)
    dequantize_blocks(store, 1, np.array([5, 6], np.int32))
    for group, options in ((1, None), (4, None), (4, SPLIT), (9, SPLIT), (4, CAPPED),
                           (4, dataclasses.replace(SPLIT, max_registers=128))):
        q = rng.standard_normal((2, 2 * group, 128)).astype(np.float16)
        out = paged_decode(q, store, 0, tables, np.array([35, 32], np.int32), np.array([0, 1], np.int32),
                           options=options)
        cuda.synchronize()
        assert not np.isnan(out.copy_to_host()).any(), (dtype, group)
    run_verify_decode(store, tables, rng)
    run_dependent_decode(store, tables, rng)
    run_new_kernels(store, tables, rng)
    graph = DecodeGraph(store, 8, max_blocks_per_seq=3, batch_buckets=(2,), backend="driver")
    views = graph.buffers(2)
    for view in views[:3]:
        data = rng.standard_normal(tuple(view.shape)).astype(np.float16)
        if hasattr(view, "copy_"):  # torch views (torch installed)
            import torch

            view.copy_(torch.from_numpy(data))
        else:
            for layer in range(cfg.num_layers):
                view[layer].copy_to_device(data[layer])
    for _ in range(2):  # warm-up (eager), then a captured replay
        graph.step(np.array([[5, 6, 0], [6, 5, 0]], np.int32), np.array([36, 33], np.int32),
                   np.array([0, 1], np.int32))
        cuda.synchronize()
    # the same step verifying blocks 5 and 6 against their digests inside the step (and
    # recording its seals' digests): the checksum kernel's verify outputs, captured
    sums = np.zeros((store.num_blocks, cfg.num_layers), np.uint32)
    sums[[5, 6]] = checksum_blocks(store, np.array([5, 6], np.int32))
    verifying = DecodeGraph(store, 8, max_blocks_per_seq=3, batch_buckets=(2,), backend="driver",
                            verify_sums=cuda.to_device(sums), max_verify_blocks=4)
    for view, source in zip(verifying.buffers(2)[:3], views[:3]):
        view.copy_(source) if hasattr(view, "copy_") else view.copy_to_device(source)
    for _ in range(2):
        verifying.step(np.array([[5, 6, 0], [6, 5, 0]], np.int32), np.array([36, 33], np.int32),
                       np.array([0, 1], np.int32), verify_blocks=np.array([5, 6], np.int32))
        cuda.synchronize()
    assert verifying.verify_results().ok, dtype


def run_verify_decode(store, tables, rng) -> None:
    """The head-digest RECORD kernel (a -1 padding row; all layers, then the last alone),
    then the decode kernel's verify variant checking every sealed block (one split and
    many, eager, then as a plan of dependent launches merging in clusters): no mismatch,
    and the same output as the plain kernel, bit for bit."""
    cfg = store.config
    head_sums = cuda.to_device(np.zeros((store.num_blocks, cfg.num_layers, cfg.num_kv_heads), np.uint32))
    record_head_sums(store, cuda.to_device(np.array([5, -1, 6], np.int32)), head_sums)
    record_head_sums(store, cuda.to_device(np.array([-1, 6], np.int32)), head_sums, layer=cfg.num_layers - 1)
    verify = DecodeVerify(head_sums, cuda.to_device(np.array([1, 0], np.int32)),
                          cuda.to_device(np.zeros(1, np.uint32)), cuda.to_device(np.zeros((4, 2), np.int32)))
    q = rng.standard_normal((2, 8, 128)).astype(np.float16)
    for options in (None, SPLIT):
        args = (q, store, 0, tables, np.array([35, 32], np.int32), np.array([0, 1], np.int32))
        plain = paged_decode(*args, options=options).copy_to_host()
        checked = paged_decode(*args, options=options, verify=verify).copy_to_host()
        cuda.synchronize()
        assert np.array_equal(plain.view(np.uint16), checked.view(np.uint16)), store.config.kv_dtype
    from hexcore.cuda import DecodePlan

    d = [cuda.to_device(a) for a in (q, tables, np.array([35, 32], np.int32), np.array([0, 1], np.int32))]
    clustered = dataclasses.replace(SPLIT, dependent_launch=True, cluster_merge=True)
    plain, checked = (DecodePlan(*d[:1], store, *d[1:], max_seq_len=35, options=clustered, verify=v).run(0)
                      .copy_to_host() for v in (None, verify))
    cuda.synchronize()
    assert np.array_equal(plain.view(np.uint16), checked.view(np.uint16)), store.config.kv_dtype
    assert verify.flags.copy_to_host()[0] == 0, store.config.kv_dtype


def run_dependent_decode(store, tables, rng) -> None:
    """A DecodePlan of programmatic dependent launches (``DecodeOptions.dependent_launch``),
    one split and many, three runs back to back: each may start while the one before it
    finishes, and waits for it: the many splits merged in the workspace by the last CTA, then
    as clusters merging in distributed shared memory (``DecodeOptions.cluster_merge``)."""
    from hexcore.cuda import DecodePlan

    q = cuda.to_device(rng.standard_normal((2, 8, 128)).astype(np.float16))
    d = [cuda.to_device(a) for a in (tables, np.array([35, 32], np.int32), np.array([0, 1], np.int32))]
    for options in (DecodeOptions(dependent_launch=True),
                    dataclasses.replace(SPLIT, dependent_launch=True, cluster_merge=False),  # the workspace merge
                    dataclasses.replace(SPLIT, dependent_launch=True, cluster_merge=True)):
        plan = DecodePlan(q, store, *d, max_seq_len=35, options=options)
        for _ in range(3):
            plan.run(0)
        cuda.synchronize()
        assert not np.isnan(plan.out.copy_to_host()).any(), store.config.kv_dtype


def run_new_kernels(store, tables, rng) -> None:
    """Prefill (numba extend path), checksums and guards, and the persistent decode."""
    q = rng.standard_normal((5, 8, 128)).astype(np.float16)
    kv = rng.standard_normal((5, 2, 128)).astype(np.float16)
    out = prefill_attention(q, kv, kv, store, 0, tables[0], 35, 0, backend="numba")
    cuda.synchronize()
    assert not np.isnan(out.copy_to_host()).any()
    qb, kvb = np.stack([q, q]), np.stack([kv, kv])  # two rows, one padded: the batched gather and extend
    out = prefill_attention_batch(qb, kvb, kvb, store, 0, tables, np.array([35, 32], np.int32),
                                  np.array([0, 1], np.int32), np.array([5, 3], np.int32), backend="numba")
    cuda.synchronize()
    assert not np.isnan(out.copy_to_host()).any()
    checksum_blocks(store, np.array([5, 6], np.int32))
    assert not check_guards(store).any()
    q = rng.standard_normal((2, 8, 128)).astype(np.float16)
    # the item out of line and inlined (DecodeOptions.persistent_item) over many one-block
    # splits, at 128 registers too (SPLIT's ctas_per_sm keeps FP16's grid launch, and so its
    # slice kernel, at the cap anyway), and at the default options (these few items: every
    # dtype's grid launch uncapped; with its eager first slice the call is one launch of
    # oneshot_kernel, uncapped; with the checked first slice, the slice kernel uncapped)
    for options in (dataclasses.replace(SPLIT, persistent_item="call"), SPLIT,
                    dataclasses.replace(SPLIT, max_registers=128), DecodeOptions(),
                    DecodeOptions(eager_first=False)):
        out, stats = persistent_decode(q, store, 0, tables, np.array([35, 32], np.int32),
                                       np.array([0, 1], np.int32), budget_us=1000.0, options=options)
        cuda.synchronize()
        assert not np.isnan(out.copy_to_host()).any() and stats.launches >= 1
    # one plan's calls with no reset between them: run, an enqueue of one slice (flags FIRST and
    # LAST), run again (each first slice's base from the cursor's snapshot)
    d = [cuda.to_device(a) for a in (q, tables, np.array([35, 32], np.int32), np.array([0, 1], np.int32))]
    plan = PersistentDecode(*d[:1], store, *d[1:], budget_us=1000.0, max_seq_len=35, options=SPLIT)
    plan.run(0)
    plan.enqueue(0, slices=1)
    plan.run(0)
    cuda.synchronize()
    assert plan.stats().drained and plan.resets == 0 and not np.isnan(plan.out.copy_to_host()).any()
    # one-launch calls (an eager first slice of one CTA an item: no slice state touched) between
    # a two-slice enqueue's normal protocol
    plan = PersistentDecode(*d[:1], store, *d[1:], budget_us=1000.0, max_seq_len=35,
                            options=DecodeOptions(ctas_per_sm=64, split_blocks=1, eager_first=True))
    assert plan.one_launch, "expected a grid of one CTA an item"
    plan.run(0)
    plan.out.copy_to_device(np.full(plan.out.shape, np.nan, np.float16))
    plan.enqueue(0, slices=2)
    cuda.synchronize()
    assert plan.stats().launches == 2 and not np.isnan(plan.out.copy_to_host()).any()
    plan.out.copy_to_device(np.full(plan.out.shape, np.nan, np.float16))
    plan.enqueue(0, slices=1)
    cuda.synchronize()
    assert plan.stats().drained and not np.isnan(plan.out.copy_to_host()).any()
    run_wide_call(store, rng)


def run_wide_call(store, rng) -> None:
    """A wide one-launch persistent call (``DecodeOptions.wide_one_launch``): more items than
    the resident CTAs (``ctas_per_sm=1`` makes those one an SM; rows of blocks 5 and 6, one-block
    splits: rows * 2 KV heads * 3 items), one launch of every item with a record each; then a
    two-slice ``enqueue`` of the same plan (the normal protocol on the resident grid) and a
    one-slice one (one launch again)."""
    sms = 1 if SIMULATOR else cuda.get_current_device().MULTIPROCESSOR_COUNT
    rows = sms // 6 + 1
    index = (np.tile(np.array([[5, 6, 0]], np.int32), (rows, 1)), np.full(rows, 35, np.int32),
             np.arange(rows, dtype=np.int32) % 2)
    q = rng.standard_normal((rows, 8, 128)).astype(np.float16)
    options = DecodeOptions(ctas_per_sm=1, split_blocks=1, eager_first=True, wide_one_launch=True)
    # (the longest budget: the two-slice enqueue drains in its first slice however slow the tool)
    plan = PersistentDecode(cuda.to_device(q), store, *(cuda.to_device(a) for a in index), budget_us=MAX_BUDGET_US,
                            max_seq_len=35, options=options)
    assert plan.one_launch and plan.num_items > sms, (plan.one_launch, plan.num_items, sms)
    for slices in (None, 2, 1):
        plan.out.copy_to_device(np.full(plan.out.shape, np.nan, np.float16))
        plan.run(0) if slices is None else plan.enqueue(0, slices=slices)
        cuda.synchronize()
        assert plan.stats().drained and not np.isnan(plan.out.copy_to_host()).any(), slices


def run_tiered(rng) -> None:
    """A pool per kind (FP16, INT4, INT2): rows sealed into each (INT2 with fitted keys),
    re-seals FP16 -> INT4 and INT4 -> INT2 (fitted), then tiered_decode over the three (the
    FP16 pool decoded by its own launch and inside the merge launch; the last pool's launch
    merging; every pool in one launch), eagerly and as a TieredDecodePlan (programmatic
    dependent launches on sm_90) run three times."""
    base = KVCacheConfig(num_layers=2, num_kv_heads=2, head_dim=128, block_size=16)
    stores = []
    for kind in ("fp16", "int4", "int2"):
        store = DeviceKVStore(dataclasses.replace(base, kv_dtype=kind), num_blocks=6, max_seqs=2)
        store.pool.copy_to_device(np.zeros(store.pool.shape, np.uint32))  # initcheck: every byte written once
        store.fill_guards()
        stores.append(store)
    k = rng.standard_normal((2, 32, 2, 128)).astype(np.float16)
    for store in stores:
        fit = store.config.kv_dtype.bits == 2
        seal_rows(store, k, k, 0, np.array([0, 1], np.int32), fitted_keys=fit)
        append(store, k[:, :5], k[:, :5], np.zeros(5, np.int32), np.arange(5, dtype=np.int32))
    reseal_blocks(stores[0], np.array([0, 1], np.int32), stores[1], np.array([2, 3], np.int32))
    reseal_blocks(stores[1], np.array([2], np.int32), stores[2], np.array([2], np.int32), fitted_keys=True)
    tables = [np.array([[0, 1], [1, 0]], np.int32), np.array([[2, 3], [3, 0]], np.int32),
              np.array([[2, 0], [1, 0]], np.int32)]
    counts = [np.array([2, 1], np.int32), np.array([2, 1], np.int32), np.array([1, 2], np.int32)]
    q = rng.standard_normal((2, 8, 128)).astype(np.float16)
    index = (tables, counts, np.array([5, 0], np.int32), np.array([1, 0], np.int32), np.array([0, 1], np.int32))
    for options in (DecodeOptions(tiered_fp16="launch", tiered_merge="launch"),
                    DecodeOptions(tiered_fp16="merge", tiered_merge="launch"), DecodeOptions(tiered_merge="last"),
                    DecodeOptions(tiered_merge="one"), DecodeOptions(tiered_merge="packed")):
        out = tiered_decode(q, stores, *index, layer=1, options=options)
        cuda.synchronize()
        assert not np.isnan(out.copy_to_host()).any()
        plan = TieredDecodePlan(stores, *index, options=options)  # dependent launches on sm_90, run back to back
        for layer in (1, 0, 1):
            out = plan.run(layer, cuda.to_device(q), out)
        cuda.synchronize()
        assert not np.isnan(out.copy_to_host()).any()
    assert not any(check_guards(store).any() for store in stores)


DTYPES = ("fp16", "int4", "int2")


def main(argv=None) -> None:
    """``--new``: only the kernels added on 2026-12-01 (prefill, checksums, persistent);
    ``--verify``: only the decode's verify variant (``run_verify_decode``); ``--tiered``:
    only the format by age's (``run_tiered``); ``--dtypes fp16,int2``: the per-dtype runs of
    these dtypes only; ``--no-tiered``: without the format by age's run. The last two split
    a sanitizer's pass over everything into calls that each fit a time limit."""
    rng = np.random.default_rng(0)
    argv = sys.argv[1:] if argv is None else list(argv)
    only = next((flag[2:] for flag in ("--new", "--verify") if flag in argv), None)
    dtypes = () if "--tiered" in argv else chosen_dtypes(argv)
    for dtype in dtypes:
        run_dtype(dtype, rng, only)
        assert layout_agrees(KVCacheConfig(num_layers=2, num_kv_heads=2, head_dim=128, block_size=16, kv_dtype=dtype))
    if only != "verify" and "--no-tiered" not in argv:
        run_tiered(rng)
    print(f"sanitize run complete: {', '.join(dtypes) or 'no dtype'}"
          f"{'' if only == 'verify' or '--no-tiered' in argv else ', tiered'}")


def chosen_dtypes(argv: list) -> tuple:
    """The dtypes of ``--dtypes a,b`` in ``argv`` (every one of DTYPES without the flag);
    SystemExit naming the flag for a missing or unknown value."""
    if "--dtypes" not in argv:
        return DTYPES
    at = argv.index("--dtypes") + 1
    names = tuple(argv[at].split(",")) if at < len(argv) else ()
    if not names or not set(names) <= set(DTYPES):
        raise SystemExit(f"--dtypes: expected a comma-separated subset of {', '.join(DTYPES)}, "
                         f"got {argv[at] if at < len(argv) else 'nothing'}")
    return tuple(d for d in DTYPES if d in names)


if __name__ == "__main__":
    main()
