"""Paged decode on the GPU: each shape's time against its byte floor (4.47 TB/s), with
torch SDPA on contiguous FP16 KV and paged FlexAttention as peers in the same run.

    python -m benchmarks.bench_decode [--shapes all|quick|gqa|b1|B,HQ,HKV,CTX[;...]]
        [--dtypes fp16,int4,int2,int2-aged,...]
        [--variants [--variant-names "default,no register cap,..."]] [--flex all|N|none] [--peers|--no-peers] [--name NAME]
        [--queued]

A dtype ending in ``-aged`` is a format by age (``docs/formats.md``): its blocks in a store per
pool, decoded by ``tiered_decode``'s prepared launches; ``int4+merge`` (any dtype + ``+merge``)
is that path with one pool: the partials kernel (no fused merge, no spills) and a separate
merge launch, against the fused merge of the plain row. ``-nomerge`` (e.g. ``int4-nomerge``)
times the plain row's launch with the partials kernel in place of the decode kernel (same
grid and arguments, every split's partial written, nothing merged): the fused merge's share
of the plain row is ``1 - nomerge / plain`` (issue 12 asks it under 3% at B=1).

``--queued`` times every row (peers too) with the calls enqueued before the GPU reaches them
(``gpu_common.time_gpu``'s ``queue_ns``, 2 ms): the device's time alone, where a call's host
time (a numba launch, a torch op) would otherwise set the pace of short decodes (B=1); rows
carry ``queued``.

``--shapes`` also takes shapes of one's own, ``batch,query heads,KV heads,context`` separated
by ``;`` (e.g. ``"32,32,8,4096;64,64,8,4096"``: the G=4 and G=8 layouts at one CTA load).
``--variants`` adds DecodeOptions variants (L2 prefetch, register cap, softmax per 16 tokens, the
split policy pricing the busiest SM's load alone (``load only``: no CTA or merge costs), a
format's FP16 pool inside the merge launch, programmatic
dependent launches or plain ones, splits sized for 2 or 3 resident CTAs per SM, splits of a fixed
21 or 16 blocks, capped at 128 registers for 16: 49 and 64 splits at B=1 32k) and the
decode kernel's verify variant (``verify 1/16``: every block's head digests recorded, the
blocks with ``block % 16 == 0`` checked as they are read, issue 14's sampled verification
inside the decode; ``verify every=1``: every block checked, what verifying whole layers in
turn would cost a layer; ``verify every=0``: the variant checking nothing, its fixed cost; the rows
carry ``verify_flags``, the mismatches found, which must be 0); ``--shapes
b1`` is the two B=1 shapes of the table (the split policy's costs matter most where batch x
KV heads x head groups is small); ``--name``
names the JSON
(decode_<name>.json under $OUT). The hexcore rows use only the API older versions share
(DecodePlan without options when none are given), so the same script measures a
previous commit's package: run it from a folder holding only that commit's ``hexcore/``
with this checkout on PYTHONPATH (``python -m`` puts the working folder first on
``sys.path``, ahead of PYTHONPATH, so from this checkout's root it imports this package).
"""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest

from hexcore import KVCacheConfig

D, BS = 128, 32
# (batch, query heads, KV heads, context): issue 12's table
SHAPES = [(64, 32, 32, 4096), (64, 32, 8, 4096), (128, 32, 8, 2048), (16, 32, 8, 16384), (32, 64, 8, 4096),
          (1, 32, 8, 32768), (1, 32, 8, 131072)]
QUICK = [SHAPES[0], SHAPES[1], SHAPES[5]]


def kv_bytes(cfg: KVCacheConfig, batch: int, ctx: int) -> int:
    """Bytes a decode must read: sealed codes and metadata plus tail rows, one layer."""
    sealed, tail = divmod(ctx, cfg.block_size)
    return batch * (sealed * cfg.block_bytes_per_layer + tail * 2 * cfg.num_kv_heads * cfg.head_dim * 2)


class VerifySample:
    """A ``--variants`` entry: the decode kernel's verify variant checking blocks with ``block
    % every == 0`` (``every`` 0: none) against their head digests; options: DecodeOptions."""

    def __init__(self, every: int, options=None):
        self.every, self.options = every, options


def decode_case(dtype: str, batch: int, num_q_heads: int, num_kv_heads: int, ctx: int, options=None):
    """(run, bytes, store, kernel info) for one shape: a filled store, shuffled block tables."""
    from numba import cuda

    from benchmarks.gpu_common import fill_store
    from hexcore.cuda import DecodePlan, DeviceKVStore

    sample = options if isinstance(options, VerifySample) else None
    if sample is not None:
        options = sample.options

    merge = not dtype.endswith("-nomerge")
    dtype = dtype.removesuffix("-nomerge")
    cfg = KVCacheConfig(num_layers=1, num_kv_heads=num_kv_heads, head_dim=D, block_size=BS, kv_dtype=dtype)
    per_seq = -(-ctx // BS)
    store = DeviceKVStore(cfg, num_blocks=batch * per_seq, max_seqs=batch)
    fill_store(store)
    rng = np.random.default_rng(0)
    tables = cuda.to_device(rng.permutation(batch * per_seq).astype(np.int32).reshape(batch, per_seq))
    lens = cuda.to_device(np.full(batch, ctx, np.int32))
    slots = cuda.to_device(np.arange(batch, dtype=np.int32))
    q = cuda.to_device(rng.standard_normal((batch, num_q_heads, D)).astype(np.float16))
    kwargs = {} if options is None else {"options": options}
    if sample is not None:
        from hexcore.cuda.attention import DecodeVerify
        from hexcore.cuda.integrity import record_head_sums

        head_sums = cuda.device_array((store.num_blocks, 1, num_kv_heads), np.uint32)
        record_head_sums(store, np.arange(store.num_blocks, dtype=np.int32), head_sums)
        kwargs["verify"] = DecodeVerify(head_sums, cuda.to_device(np.array([sample.every, 0], np.int32)),
                                        cuda.to_device(np.zeros(1, np.uint32)), cuda.device_array((16, 2), np.int32))
    plan = DecodePlan(q, store, tables, lens, slots, max_seq_len=ctx, **kwargs)
    plan.run(0)
    info = kernel_info(plan)
    info["out_finite"] = lambda: out_finite(plan.out)  # read after the timing (a plain run's output)
    if sample is not None:
        flags = kwargs["verify"].flags

        def run():
            plan.run(0)

        info["verify_every"] = sample.every
        info["verify_flags"] = lambda: int(flags.copy_to_host()[0])  # read after the timing
        return run, kv_bytes(cfg, batch, ctx), store, info
    if not merge:
        launch = without_merge(plan, cfg, num_q_heads, options)
        return launch.run, kv_bytes(cfg, batch, ctx), store, info
    return (lambda: plan.run(0)), kv_bytes(cfg, batch, ctx), store, info


def out_finite(out) -> bool:
    """Whether every element of a decode's output (a device array or CUDA tensor) is finite:
    a row whose inputs were garbage says so."""
    host = out.cpu().numpy() if hasattr(out, "cpu") else out.copy_to_host()
    return bool(np.isfinite(host.astype(np.float32)).all())


def without_merge(plan, cfg: KVCacheConfig, num_q_heads: int, options=None):
    """The plan's layer-0 launch with the partials kernel (``decode_kernel(partials=True)``)
    in place of its decode kernel: the same grid, arguments, register cap and launch kind
    (plain or dependent), no fused merge."""
    from hexcore.cuda.attention.kernel import decode_kernel
    from hexcore.cuda.attention.launcher import prepare_decode, register_cap
    from hexcore.cuda.attention.options import DEFAULT_OPTIONS
    from hexcore.cuda.attention.shape import DecodeShape

    o = options or DEFAULT_OPTIONS
    shape = DecodeShape(cfg.kv_dtype.bits, cfg.num_kv_heads, cfg.head_dim, cfg.block_size,
                        num_q_heads // cfg.num_kv_heads, cfg.group_size)
    launch = plan.launch(0).as_launch()
    kernel = decode_kernel(shape, register_cap(launch, shape, o), o.l2_prefetch, o.joint_softmax, partials=True,
                           dependent=launch.kernel.waits_for_prior_grids)
    return prepare_decode(launch._replace(kernel=kernel), o)


def case_for(dtype: str):
    """The case function of ``dtype``: ``tiered_case`` for a format by age (``-aged``) or a
    ``+merge`` dtype, else ``decode_case``."""
    return tiered_case if dtype.endswith(("-aged", "+merge")) else decode_case


def tiered_case(name: str, batch: int, num_q_heads: int, num_kv_heads: int, ctx: int, options=None):
    """(run, bytes, stores, info) for a format by age (``hexcore.quant.FORMATS``, e.g.
    int2-aged): a store per pool holding each sequence's blocks of that kind (``ctx``
    tokens: blocks by ``KVFormat.block_tiers``), shuffled tables, and ``tiered_decode``'s
    launches prepared once as a plan prepares them (each pool's partials launch, then the
    merge, or the last pool's launch merging: ``tiered_merge``; dependent launches where
    the options make them)."""
    import dataclasses

    from benchmarks.gpu_common import fill_store
    from hexcore.cuda import DeviceKVStore
    from hexcore.cuda.attention.launcher import prepare_decode
    from hexcore.cuda.attention.options import DEFAULT_OPTIONS
    from hexcore.cuda.attention.tiered import tiered_decode_launches
    from hexcore.host.tiered import block_pools, pool_kinds
    from hexcore.quant import kv_format

    fmt = kv_format(name.removesuffix("+merge"))
    base = KVCacheConfig(num_layers=1, num_kv_heads=num_kv_heads, head_dim=D, block_size=BS)
    kinds = pool_kinds(fmt, BS)
    pools = block_pools(fmt, ctx, BS)
    rng = np.random.default_rng(0)
    stores, tables, counts, nbytes = [], [], [], 0
    for p, kind in enumerate(kinds):
        per_seq = int((pools == p).sum())
        cfg = dataclasses.replace(base, kv_dtype=kind)
        store = DeviceKVStore(cfg, num_blocks=max(1, batch * per_seq), max_seqs=batch)
        fill_store(store)
        stores.append(store)
        ids = rng.permutation(max(1, batch * per_seq)).astype(np.int32)
        tables.append(ids[: batch * per_seq].reshape(batch, per_seq) if per_seq else np.full((batch, 1), -1, np.int32))
        counts.append(np.full(batch, per_seq, np.int32))
        nbytes += batch * per_seq * cfg.block_bytes_per_layer
    tail = ctx % BS
    q = rng.standard_normal((batch, num_q_heads, D)).astype(np.float16)
    launches, _ = tiered_decode_launches(q, stores, tables, counts, np.full(batch, tail, np.int32),
                                         np.zeros(batch, np.int32), np.arange(batch, dtype=np.int32),
                                         options=options)
    prepared = [prepare_decode(launch, options or DEFAULT_OPTIONS) for launch in launches if not launch.empty]

    def run():
        for launch in prepared:
            launch.run()

    run()
    nbytes += batch * tail * 2 * num_kv_heads * D * 2
    return run, nbytes, (stores, prepared), dict(launches=len(prepared))


def kernel_info(plan) -> dict:
    """Registers, local memory and resident CTAs per SM of the plan's kernel (new API only)."""
    try:
        launch = plan.launch(0).as_launch()
        kernel = launch.kernel
        compiled = kernel.compile(tuple(kernel.typeof_pyval(a) for a in launch.args))
        from numba import cuda

        sms = cuda.get_current_device().MULTIPROCESSOR_COUNT
        attrs = compiled._codelibrary.get_cufunc().attrs
        return dict(regs=attrs.regs, local=attrs.local, smem=attrs.shared, grid=list(launch.grid),
                    ctas_per_sm=compiled.max_cooperative_grid_blocks(launch.block[0]) // sms,
                    cluster=getattr(plan.launch(0), "cluster", 1), max_clusters=_max_clusters(plan.launch(0)))
    except Exception:  # an older package: no such details
        return {}


def _max_clusters(prepared) -> int | str | None:
    """The clusters a cluster launch's GPU holds at once (``PreparedLaunch.max_active_clusters``),
    None for a plain launch, or the driver's error as text."""
    query = getattr(prepared, "max_active_clusters", None)  # (an older package: none)
    try:
        return query() if query is not None else None
    except Exception as exc:  # reported in the row, never a failed benchmark
        return f"{type(exc).__name__}: {exc}"[:120]


def sdpa_case(batch: int, num_q_heads: int, num_kv_heads: int, ctx: int):
    """torch SDPA (default backend) on contiguous FP16 KV of the same shape."""
    import torch
    import torch.nn.functional as F

    q = torch.randn(batch, num_q_heads, 1, D, device="cuda", dtype=torch.float16)
    k = torch.randn(batch, num_kv_heads, ctx, D, device="cuda", dtype=torch.float16)
    v = torch.randn_like(k)
    gqa = num_kv_heads != num_q_heads
    return (lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)), 2 * k.numel() * 2, (q, k, v)


def flex_case(batch: int, num_q_heads: int, num_kv_heads: int, ctx: int, page: int = BS):
    """FlexAttention over torch's PagedAttention (pages of ``page`` tokens, shuffled), compiled."""
    import torch
    from torch.nn.attention.experimental._paged_attention import PagedAttention
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    pages = ctx // page
    paged = PagedAttention(batch * pages, page, batch, device="cuda")
    for b in range(batch):
        paged.reserve(torch.tensor(b, device="cuda"), torch.tensor(ctx, device="cuda"))
    perm = torch.randperm(batch * pages, device="cuda").view(batch, pages)
    paged.page_table[:, :pages] = perm
    paged.physical_to_logical.fill_(-1)
    paged.physical_to_logical.scatter_(1, perm, torch.arange(pages, device="cuda").expand(batch, pages))
    k = torch.randn(1, num_kv_heads, batch * ctx, D, device="cuda", dtype=torch.float16)
    v = torch.randn_like(k)
    q = torch.randn(batch, num_q_heads, 1, D, device="cuda", dtype=torch.float16)
    logical = create_block_mask(lambda b, h, q_idx, kv_idx: kv_idx >= 0, batch, None, 1, ctx, device="cuda",
                                BLOCK_SIZE=(128, page))
    mask = paged.convert_logical_block_mask(logical)
    attend = torch.compile(flex_attention)
    gqa = num_kv_heads != num_q_heads
    attend(q, k, v, block_mask=mask, enable_gqa=gqa)
    return (lambda: attend(q, k, v, block_mask=mask, enable_gqa=gqa)), 2 * k.numel() * 2, (q, k, v, mask)


def _row(kernel, shape, seconds, nbytes, floor_bytes, sdpa_seconds=None, **extra):
    from benchmarks.gpu_common import CEILING_READ_TBS

    batch, hq, hkv, ctx = shape
    floor = floor_bytes / (CEILING_READ_TBS * 1e12)
    row = dict(kernel=kernel, B=batch, Hq=hq, Hkv=hkv, ctx=ctx, ms=seconds * 1e3, floor_ms=floor * 1e3,
               of_floor=floor / seconds, TBs=nbytes / seconds / 1e12, vs_sdpa=(sdpa_seconds / seconds)
               if sdpa_seconds else float("nan"))
    row.update(extra)
    return row


def rows_for(shape, dtypes=("fp16", "int4", "int2"), variants=None, peers=True, flex=True, queue_ns=0):
    """Rows of one shape: hexcore per dtype (and options variant), SDPA, paged FlexAttention;
    ``queue_ns``: ``time_gpu``'s (0: the calls timed as the host enqueues them)."""
    import functools
    import gc

    from benchmarks.gpu_common import time_gpu

    time_gpu = functools.partial(time_gpu, queue_ns=queue_ns)

    rows, sdpa_seconds = [], None
    if peers:
        try:
            run, nbytes, keep = sdpa_case(*shape)
            sdpa_seconds = time_gpu(run)
            rows.append(_row("torch SDPA fp16 contiguous", shape, sdpa_seconds, nbytes, nbytes, sdpa_seconds))
            del keep
        except Exception as exc:  # torch missing: say so, keep hexcore's rows
            print(f"SDPA peer skipped: {type(exc).__name__}: {exc}")
    for dtype in dtypes:
        for name, options in (variants or {"": None}).items():
            case = case_for(dtype)
            if isinstance(options, VerifySample) and case is tiered_case:
                continue  # (the verify variant is the grid decode kernel's)
            run, nbytes, store, info = case(dtype, *shape, options=options)
            seconds = time_gpu(run)
            info = {k: v() if callable(v) else v for k, v in info.items()}
            rows.append(_row(f"hexcore {dtype}{name}", shape, seconds, nbytes, nbytes, sdpa_seconds, **info))
            del store
            gc.collect()
    if peers and flex:
        try:
            run, nbytes, keep = flex_case(*shape)
            rows.append(_row(f"FlexAttention paged (page {BS})", shape, time_gpu(run), nbytes, nbytes, sdpa_seconds))
            del keep
        except Exception as exc:
            print(f"FlexAttention peer skipped: {type(exc).__name__}: {exc}")
    gc.collect()
    return rows


def option_variants():
    """DecodeOptions variants compared by ``--variants`` (the default first)."""
    from hexcore.cuda import DecodeOptions, SplitCosts

    return {"": DecodeOptions(), " prefetch=quantized": DecodeOptions(l2_prefetch="quantized"),
            " prefetch=all": DecodeOptions(l2_prefetch="all"), " no register cap": DecodeOptions(max_registers=255),
            " cap 128": DecodeOptions(max_registers=128),
            " unsplit uncapped": DecodeOptions(max_registers=255, split_blocks=1 << 20),
            " per-16 softmax": DecodeOptions(joint_softmax=False),
            " load only": DecodeOptions(split_costs=SplitCosts(0, 0, 0, 0)),
            " fp16 in merge": DecodeOptions(tiered_fp16="merge", tiered_merge="launch"),  # formats by age only
            " fp16 launch": DecodeOptions(tiered_fp16="launch", tiered_merge="launch"),
            " merge launch": DecodeOptions(tiered_merge="launch"),
            " last pool merges": DecodeOptions(tiered_merge="last"),
            " last pool merges plain": DecodeOptions(tiered_merge="last", dependent_launch=False),
            " last pool merges cap 128": DecodeOptions(tiered_merge="last", max_registers=128),
            " one launch": DecodeOptions(tiered_merge="one"),
            " one launch cap 128": DecodeOptions(tiered_merge="one", max_registers=128),
            " packed": DecodeOptions(tiered_merge="packed"),
            " packed cap 168": DecodeOptions(tiered_merge="packed", max_registers=168),
            " dependent launch": DecodeOptions(dependent_launch=True),
            " plain launch": DecodeOptions(dependent_launch=False),
            " ctas 2": DecodeOptions(ctas_per_sm=2), " ctas 3": DecodeOptions(ctas_per_sm=3),
            " split 21 blocks": DecodeOptions(split_blocks=21),  # 49 splits at 32k (block 32)
            " split 16 blocks cap 128": DecodeOptions(max_registers=128, split_blocks=16),  # 64 at 32k
            " cluster merge": DecodeOptions(cluster_merge=True),
            " no cluster merge": DecodeOptions(cluster_merge=False),
            " verify 1/16": VerifySample(16), " verify every=1": VerifySample(1), " verify every=0": VerifySample(0)}


def parse_shapes(text: str) -> list:
    """``--shapes``: a named set (all, quick, gqa, b1) or ``B,HQ,HKV,CTX`` tuples joined by ``;``."""
    named = {"all": SHAPES, "quick": QUICK, "gqa": [SHAPES[1], SHAPES[5]], "b1": SHAPES[5:]}
    if text in named:
        return named[text]
    shapes = []
    for item in text.split(";"):
        try:
            shape = tuple(int(x) for x in item.split(","))
        except ValueError:
            shape = ()
        if len(shape) != 4 or min(shape) < 1 or shape[1] % shape[2]:
            raise SystemExit(f"--shapes: {item!r} is neither a named set ({', '.join(named)}) nor B,HQ,HKV,CTX "
                             "with positive values and HKV dividing HQ")
        shapes.append(shape)
    return shapes


def main(argv) -> None:
    from benchmarks.gpu_common import QUEUE_NS, flag_value, save

    def arg(flag, default):
        return flag_value(argv, flag, default)

    shapes = parse_shapes(arg("--shapes", "all"))
    dtypes = tuple(arg("--dtypes", "fp16,int4,int2").split(","))
    flex = arg("--flex", "all")
    variants = option_variants() if "--variants" in argv else None
    if variants and "--variant-names" in argv:  # e.g. "default,no register cap"
        keep = arg("--variant-names", "").split(",")
        variants = {k: v for k, v in variants.items() if (k.strip() or "default") in keep}
    rows, name = [], f"decode_{arg('--name', 'table')}"
    for i, shape in enumerate(shapes):  # saved shape by shape: a run cut by a time limit keeps what it timed
        use_flex = flex == "all" or (flex.isdigit() and i < int(flex))
        done = rows_for(shape, dtypes, variants, peers="--no-peers" not in argv, flex=use_flex,
                        queue_ns=QUEUE_NS if "--queued" in argv else 0)
        for row in done:
            row["queued"] = "--queued" in argv
            print(f"timed ({i + 1}/{len(shapes)}): {row['kernel']} {shape}: {row['ms']:.4g} ms",
                  flush=True)
        rows += done
        save(name, rows, table=i == len(shapes) - 1)


@pytest.mark.gpu
def test_decode_bandwidth():
    from benchmarks.gpu_common import save

    rows = []
    for shape in SHAPES:
        rows += rows_for(shape, flex=False)
    save("decode", rows)
    assert all(math.isfinite(r["ms"]) for r in rows)


if __name__ == "__main__":
    main(sys.argv[1:])
