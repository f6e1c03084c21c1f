"""Decode attention over a format by age (``docs/formats.md``): a sequence's sealed blocks
lie in several pools, one store per kind of block (FP16, INT4, INT2).

Each pool is decoded by the decode kernel of its kind, specialised to write split-K
partials only (``kernel.decode_item_function(partials=True)``): pool ``p``'s splits take
the workspace's split slots ``[base_p, base_p + splits_p)`` of every query head's row, an
item past its sequence's splits an empty partial. Every slot of a row is then merged into
``out`` (``kernel.merge_function``): the same arithmetic as one decode over all the blocks
(attention does not depend on the order of its keys), by the last pool's launch itself, by
a merge launch after the pools', or by the one launch that runs every pool's items
(``DecodeOptions.tiered_merge``; the kernels and how the launches overlap:
``tiered_kernels.py``). The open tail is read from the store of the pool
it will be sealed into (``tail_pool``). With a merge launch and
``DecodeOptions(tiered_fp16="merge")`` an FP16 first pool (the sink, young blocks, tails:
little work per sequence) has no launch of its own: each merge CTA first computes its
(sequence, KV head, head group)'s FP16 partials, then merges (``fused_merge_kernel``).

    out = tiered_decode(q, stores, tables, counts, tail_lens, tail_pool, tail_slots, layer)

``tiered_decode_launches`` makes the launches without running them; ``TieredDecodePlan``
makes them once for every layer of a step (the index arrays checked and copied once). Host
index arrays only (this first version reads them to size each pool's launch).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ...errors import HexcoreInvalidArgumentError
from ..arrays import check_id_range, check_outside_store, checked, checked_layer, checked_store
from ..launch import Launch
from ..store import flat_words
from ..streams import resolve_stream
from ..uploads import upload_once
from ..views import flat, layer_of, sliced
from .kernel import GRID_REGISTERS, decode_kernel
from .launcher import (UNCAPPED_REGISTERS, Workspace, check_host_index, decode_launch, dependent_launches, policy_sms,
                       prepare_decode, register_cap, resident_slots, resolved_options)
from .options import DecodeOptions
from .shape import THREADS, DecodeShape
from .tiered_kernels import fused_merge_kernel, merge_kernel, one_launch_kernel, pool_kernel

_workspace = Workspace()


def tiered_decode(q, stores: list, tables: list, counts: list, tail_lens, tail_pool, tail_slots, layer: int = 0,
                  out=None, scale: float | None = None, stream=None, options: DecodeOptions | None = None):
    """Decode attention of one query token per sequence over blocks held in several pools.

    Parameters
    ----------
    q : float16 ``[B, num_q_heads, head_dim]``.
    stores : one DeviceKVStore per pool, alike but for their ``kv_dtype``.
    tables : per pool, int32 ``[B, n_p]`` host arrays: each sequence's blocks in that pool.
    counts : per pool, int32 ``[B]``: how many of ``tables[p][b]`` are its blocks.
    tail_lens : int32 ``[B]``: tokens in each sequence's open tail (``< block_size``).
    tail_pool : int32 ``[B]``: the pool whose store holds that tail.
    tail_slots : int32 ``[B]``: its tail slot in that store.
    layer : the layer to attend over.
    out : optional float16 ``[B, num_q_heads, head_dim]`` device array; allocated if None.

    Returns ``out``: ``softmax(q K^T * scale) V`` over every pool's blocks and the tail, zeros
    for a sequence with no token. Raises HexcoreInvalidArgumentError for inconsistent
    arguments (naming the pool) before anything runs.
    """
    launches, out = tiered_decode_launches(q, stores, tables, counts, tail_lens, tail_pool, tail_slots, layer, out,
                                           scale, options)
    stream = resolve_stream(stream, q, out)
    for launch in launches:
        launch.run(stream)
    return out


class TieredDecodePlan:
    """:func:`tiered_decode` for every layer of one step: the first ``run`` checks the index
    arrays, copies them to the device and makes the launches, marshalled once
    (``PreparedLaunch``); every later ``run`` only puts its ``q``, ``out`` and ``layer`` into
    them (``set_array``, ``set_scalar``) and enqueues them: no checks of the index arrays,
    no copies, no per-launch marshalling of the other arguments.

    ``stores``, ``tables``, ``counts``, ``tail_lens``, ``tail_pool``, ``tail_slots``,
    ``scale``, ``options``: as :func:`tiered_decode` takes them, fixed for the plan's life
    (the arrays are read at the first run). ``run(layer, q, out, stream=None)``: ``q`` and
    ``out`` float16 ``[B, num_q_heads, head_dim]`` device arrays (the same shape every run,
    checked); returns ``out``. With ``buffers=(q_all, out_all)``, float16 ``[L, B,
    num_q_heads, head_dim]`` device arrays checked once here, ``run(layer)`` reads
    ``q_all[layer]`` and writes ``out_all[layer]`` with no check per layer (the Engine's step).
    ``upload``: how the first run copies the index arrays (see ``tiered_decode_launches``).
    ``reuse``: an earlier plan whose launches this one takes over when they match (the
    same kernels, grids and scalars: only arrays change; ``PreparedLaunch.rebind``) instead
    of marshalling new ones; that plan is spent (a run of it raises).
    """

    def __init__(self, stores: list, tables: list, counts: list, tail_lens, tail_pool, tail_slots,
                 scale: float | None = None, options: DecodeOptions | None = None, buffers: tuple | None = None,
                 upload=None, reuse: "TieredDecodePlan | None" = None):
        if upload is not None and not callable(upload):
            raise HexcoreInvalidArgumentError(f"upload: expected a callable or None, got {type(upload).__name__}")
        if reuse is not None and not isinstance(reuse, TieredDecodePlan):
            raise HexcoreInvalidArgumentError(f"reuse: expected a TieredDecodePlan or None, got {type(reuse).__name__}")
        self._index = (stores, tables, counts, tail_lens, tail_pool, tail_slots)
        self._scale, self._options, self._upload, self._reuse = scale, resolved_options(options), upload, reuse
        self._launches = self._shape = None
        self._spent = False
        self._buffers = None if buffers is None else _checked_buffers(stores, buffers)

    def run(self, layer: int, q=None, out=None, stream=None):
        if self._spent:
            raise HexcoreInvalidArgumentError("run: this plan's launches were taken over by a later plan (reuse)")
        stores = self._index[0]
        layer, _ = checked_layer(layer, stores[0].config.num_layers)
        if q is None:
            if self._buffers is None:
                raise HexcoreInvalidArgumentError("q: needed by a plan made without buffers, got None")
            q, out = layer_of(self._buffers[0], layer), layer_of(self._buffers[1], layer)  # (kept: every step's)
        elif self._launches is not None:
            q = checked(q, "q", np.float16, self._shape)
            out = checked(out, "out", np.float16, self._shape, output=True)
            for store in stores:
                check_outside_store(store, out=out)
        if self._launches is None:
            launches, out = tiered_decode_launches(q, *self._index, layer=layer, out=out, scale=self._scale,
                                                   options=self._options, upload=self._upload)
            launches = [launch for launch in launches if not launch.empty]
            options = self._options
            merge = _plain_merge(stores[0].config, q.shape, dependent_launches(options))
            self._launches = self._taken_over(launches, layer) or [(prepare_decode(launch, options),
                                                                     launch.kernel is merge) for launch in launches]
            self._shape = tuple(q.shape)
        else:
            q_words, out_flat = flat_words(q), flat(out)
            for launch, is_merge in self._launches:
                _for_layer(launch, is_merge, q_words, out_flat, layer)
        stream = resolve_stream(stream, q, out)
        for launch, _ in self._launches:
            launch.run(stream)
        return out

    def _taken_over(self, launches: list, layer: int) -> list | None:
        """The reused plan's prepared launches rebound to ``launches`` (made for ``layer``)
        when each matches; else None."""
        old, self._reuse = self._reuse, None
        if old is None or old._spent or old._launches is None or len(old._launches) != len(launches):
            return None
        for prepared, is_merge in old._launches:  # (its runs set their layer anyway)
            if not is_merge:
                prepared.set_scalar(LAYER_ARG, layer)
        if not all(prepared.matches(launch) for (prepared, _), launch in zip(old._launches, launches)):
            return None
        for (prepared, _), launch in zip(old._launches, launches):
            prepared.rebind(launch.args)
        taken, old._launches, old._spent = old._launches, None, True
        return taken


def _checked_buffers(stores: list, buffers) -> tuple:
    """``(q_all, out_all)``: float16 ``[L, B, Hq, D]`` device arrays of one shape, ``L`` the stores'."""
    if not isinstance(buffers, tuple) or len(buffers) != 2:
        raise HexcoreInvalidArgumentError(f"buffers: expected (q, out), got {type(buffers).__name__}")
    cfg = stores[0].config
    q = checked(buffers[0], "buffers[0]", np.float16, (cfg.num_layers, None, None, cfg.head_dim))
    out = checked(buffers[1], "buffers[1]", np.float16, tuple(q.shape), output=True)
    for store in stores:
        check_outside_store(store, out=out)
    return q, out


def _for_layer(launch, is_merge: bool, q_words, out_flat, layer: int) -> None:
    """Put another layer's ``q``, ``out`` and layer number into a prepared ``launch`` (a
    pool's partials or merging launch, the fused merge or the one launch, all of which start
    with a decode kernel's arguments; or the merge, whose ``out`` is its argument 2)."""
    if is_merge:
        launch.set_array(2, out_flat)
    else:
        launch.set_array(Q_ARG, q_words)
        launch.set_array(OUT_ARG, out_flat)
        launch.set_scalar(LAYER_ARG, layer)


def _plain_merge(config, q_shape: tuple, dependent: bool):
    """The :func:`merge_kernel` a step of ``q_shape`` ``[B, Hq, D]`` launches last unless the
    FP16 pool is fused into it (whose ``out`` is its argument 2, not the decode kernel's)."""
    _, num_q_heads, head_dim = q_shape
    return merge_kernel(config.num_kv_heads, num_q_heads // config.num_kv_heads, head_dim, dependent)


# the decode and partials kernels' arguments (kernel.decode_kernel), by position
DECODE_ARGS = ("pool", "k_codes", "v_codes", "k_meta", "v_meta", "k_tails", "v_tails", "q", "block_tables", "seq_lens",
               "tail_slots", "out", "part_o", "part_ml", "counters", "layer", "num_blocks", "max_seqs", "split_blocks",
               "max_splits", "scale")
Q_ARG, OUT_ARG, COUNTERS_ARG, LAYER_ARG, SPLIT_BLOCKS_ARG = (DECODE_ARGS.index(name) for name in (
    "q", "out", "counters", "layer", "split_blocks"))
# a pool's own arguments of tiered_kernels.one_launch_kernel (the first pool's are all 21)
OWN_ARGS = tuple(DECODE_ARGS.index(name) for name in (
    "pool", "k_codes", "v_codes", "k_meta", "v_meta", "k_tails", "v_tails", "block_tables", "seq_lens", "part_o",
    "part_ml", "num_blocks", "max_seqs", "split_blocks"))


def tiered_decode_launches(q, stores: list, tables: list, counts: list, tail_lens, tail_pool, tail_slots,
                           layer: int = 0, out=None, scale: float | None = None,
                           options: DecodeOptions | None = None, upload=None) -> tuple:
    """:func:`tiered_decode`'s arguments checked and its launches made, not run: ``(launches,
    out)``, to run in order on one stream (each ``Launch.prepare()``-able, so a benchmark or a
    graph can replay them with the same arrays). The index arrays are checked on the host
    and copied to the device together by ``upload`` (a list of host int32 arrays -> device
    views, as ``uploads.upload_once``, the default, or ``Uploads.put``)."""
    options = resolved_options(options)
    tail_lens, tail_pool = np.asarray(tail_lens), np.asarray(tail_pool)
    _check(stores, tables, counts, tail_lens, tail_pool)
    q = checked(q, "q", np.float16, (tail_lens.shape[0], None, stores[0].config.head_dim))  # (a host q: copied once)
    bs, batch, n = stores[0].config.block_size, tail_lens.shape[0], len(stores)
    lens = [(counts[p].astype(np.int64) * bs + np.where(tail_pool == p, tail_lens, 0)).astype(np.int32)
            for p in range(n)]
    longest = [check_host_index(store, tables[p], lens[p], tail_slots, batch) for p, store in enumerate(stores)]
    seq_lens = (sum(c.astype(np.int64) for c in counts) * bs + tail_lens).astype(np.int32)
    longest_blocks = -(-int(seq_lens.max(initial=0)) // bs)
    host_tail = isinstance(tail_slots, np.ndarray)
    staged = (upload or upload_once)([*tables, *lens, seq_lens] + ([tail_slots] if host_tail else []))
    seq_lens, tail_slots = staged[2 * n], staged[2 * n + 1] if host_tail else tail_slots
    batch, num_q_heads, head_dim = q.shape
    cfg = stores[0].config
    shapes = [DecodeShape(store.config.kv_dtype.bits, cfg.num_kv_heads, head_dim, bs, num_q_heads // cfg.num_kv_heads,
                          cfg.group_size) for store in stores]
    items = batch * cfg.num_kv_heads * shapes[0].head_groups
    mode = options.tiered_mode(dependent_launches(options), items, items * longest_blocks / policy_sms(), n)
    one = mode in ("one", "packed") and 1 < n <= ONE_LAUNCH_POOLS  # (more: "last")

    def make(p: int, pool_options: DecodeOptions) -> Launch:  # pool p's own launch: its split count
        nonlocal out
        launch, out = decode_launch(q, stores[p], layer, staged[p], staged[n + p], tail_slots, out, scale,
                                    longest[p], pool_options, _workspace)
        return launch

    if one:  # (options from here with the one kernel's register cap)
        pools = _packed_pools if mode == "packed" else _one_launch_pools
        launches, options = pools(make, shapes, options, seq_lens, -(-longest[-1] // bs))
    else:
        launches = [make(p, options) for p in range(n)]
    merging_last = mode != "launch"
    order = [n - 1, *range(n - 1)] if merging_last else list(range(n))  # whose slots come first in a row
    bases, total = {}, 0
    for p in order:
        bases[p], total = total, total + launches[p].grid[0]
    part_o, part_ml, counters = _workspace.get(batch * num_q_heads, total, head_dim, items)
    runs = []
    for p, (launch, shape) in enumerate(zip(launches, shapes)):
        merging = (p == 0, p == n - 1, seq_lens, counters) if merging_last and not one else None
        runs.append(_partials(launch, shape, options, sliced(part_o, bases[p] * head_dim),
                              sliced(part_ml, bases[p] * 2), total, merging))
    if one:
        return [_one_launch(runs, shapes, options, seq_lens, counters, mode == "packed")], out
    if merging_last:
        return runs, out
    return _with_merge_launch(runs, shapes, options, seq_lens, (part_o, part_ml, flat(out), seq_lens, total)), out


def _with_merge_launch(runs: list, shapes: list, options: DecodeOptions, seq_lens, merge_args: tuple) -> list:
    # tiered_merge "launch": the pools' launches, then the merge launch of `merge_args`
    # (merge_kernel's), or, where pool 0 is an FP16 pool and tiered_fp16 says "merge", the
    # fused merge launch with pool 0's items (its partials arguments, seq_lens, its splits)
    grid, dependent = runs[0].grid[1:], dependent_launches(options)
    if options.tiered_fp16 == "merge" and shapes[0].bits == 16:
        kernel = fused_merge_kernel(shapes[0], options.max_registers, options.l2_prefetch, options.joint_softmax,
                                    dependent)
        return runs[1:] + [Launch(kernel, grid, THREADS, (*runs[0].args, seq_lens, runs[0].grid[0]))]
    shape = shapes[0]
    return runs + [Launch(merge_kernel(shape.H, shape.G, shape.D, dependent), grid, THREADS, merge_args)]


ONE_LAUNCH_POOLS = 3  # the most pools tiered_merge "one" runs in one launch (its kernel's arguments)
# the one kernel's register cap where its last pool's launch would run uncapped: the most at
# which an SM holds three CTAs of 128 threads (65,536 / 384, to a multiple of 8). Uncapped,
# ptxas gives the one kernel at D128 170-208 registers (two CTAs per SM) where its items alone
# take 156-166; at 168 none spills (sm_90, ptxas 13; int2-aged and int4-aged at D128 with
# blocks of 16/32/64 and groups of 1/4/8, and at D64, where it takes 133-149 either way;
# thirty-third session)
ONE_LAUNCH_UNCAPPED = 168


def _one_launch_pools(make, shapes: list, options: DecodeOptions, seq_lens, last_blocks: int) -> tuple:
    """tiered_merge "one": ``(launches, options)``, the pools' own launches (``make(p,
    options)``) split for one grid and ``options`` with the one kernel's register cap: the
    given ``max_registers``; else, where the last pool's own launch takes the uncapped
    kernel (``launcher.register_cap``: its items fit one wave of three CTAs per SM),
    ``ONE_LAUNCH_UNCAPPED`` (three CTAs per SM, no spills) unless 128 (four) makes a grid of
    fewer waves (``_one_grid``: with the younger pools' CTAs, B=32 x 32/8 4k int4-aged is two
    waves at 168 and one at 128); else 128."""
    n = len(shapes)
    last = make(n - 1, options)
    if options.max_registers is not None:
        return _one_grid(make, shapes, options, seq_lens, last_blocks, last)[:2]
    capped = dataclasses.replace(options, max_registers=GRID_REGISTERS)
    if register_cap(last, shapes[-1], options) != UNCAPPED_REGISTERS:
        return _one_grid(make, shapes, capped, seq_lens, last_blocks, last)[:2]
    wide = dataclasses.replace(options, max_registers=ONE_LAUNCH_UNCAPPED)  # (last was sized for 3 per SM)
    grids = (_one_grid(make, shapes, wide, seq_lens, last_blocks, last),
             _one_grid(make, shapes, capped, seq_lens, last_blocks, make(n - 1, capped)))
    return min(grids, key=lambda grid: grid[2])[:2]  # (among equals the first: 168)


def _one_grid(make, shapes: list, options: DecodeOptions, seq_lens, last_blocks: int, last: Launch) -> tuple:
    """``(launches, options, waves)`` of ``_one_launch_pools`` at the cap
    ``options.max_registers``, ``last`` the last pool's launch sized for it. The last pool is
    split by the policy; a younger one (the sink, young blocks: a few blocks per sequence,
    bounded by the format's ages) into runs no shorter than the last pool's splits, unless
    ``split_blocks`` is set (sized alone, each pool would fill the SMs, together more than a
    wave: int2-aged at 8 x 32/8 4k, 64 items of 6 + 2 + 1 splits, 576 CTAs for 528 slots).
    Where the grid is then more than one wave of the one kernel's resident CTAs and fewer
    splits of the last pool (of ``last_blocks``, its longest sequence's blocks) make it one,
    the last pool gets those (int4-aged at 32 x 32/8 4k: 256 items of 2 + 1 CTAs, 768; one
    INT4 split, 512), the younger pools keeping theirs (then possibly longer)."""
    n = len(shapes)
    young = _young_pools(make, n, options, last, last_blocks)
    splits, items, extra = last.grid[0], last.grid[1] * last.grid[2], sum(y.grid[0] for y in young)
    probe = _one_launch([*young, last], shapes, options, seq_lens, last.args[COUNTERS_ARG])  # its kernel, types
    slots = resident_slots(probe, options)
    fit = slots // items - extra
    if options.split_blocks is None and items * (splits + extra) > slots and 1 <= fit < splits:
        last = make(n - 1, _fixed_splits(options, -(-last_blocks // fit)))
    return [*young, last], options, -(-items * (last.grid[0] + extra) // max(1, slots))


def _young_pools(make, n: int, options: DecodeOptions, last: Launch, last_blocks: int) -> list:
    """The launches of pools ``0 .. n - 2`` (``make(p, options)``) in runs no shorter than
    the splits of ``last`` (the last pool's launch; its longest sequence ``last_blocks``
    blocks), or of ``options.split_blocks`` where set."""
    fixed = options.split_blocks
    if fixed is None and last_blocks > 0:
        fixed = max(last.args[SPLIT_BLOCKS_ARG], options.min_split_blocks)
    return [make(p, options if fixed is None else _fixed_splits(options, fixed)) for p in range(n - 1)]


def _packed_pools(make, shapes: list, options: DecodeOptions, seq_lens, last_blocks: int) -> tuple:
    """tiered_merge "packed": ``(launches, options)`` as ``_one_launch_pools`` gives them, for
    a grid of the last pool's splits alone (``_one_launch(packed=True)``): the one kernel at
    ``max_registers``, else 128 (four CTAs per SM: the packed grid is for steps whose last
    pool fills the SMs); the last pool split by the policy at that cap (its CTAs also run the
    younger pools' slots, which the policy does not price), the younger pools in runs no
    shorter than its splits (``_young_pools``: at B=64 x 32/8 4k int2-aged one FP16 and one
    INT4 slot a row beside one INT2 split)."""
    if options.max_registers is None:
        options = dataclasses.replace(options, max_registers=GRID_REGISTERS)
    last = make(len(shapes) - 1, options)
    return [*_young_pools(make, len(shapes), options, last, last_blocks), last], options


def _fixed_splits(options: DecodeOptions, split_blocks: int) -> DecodeOptions:
    # options that split every item in runs of split_blocks; with ctas_per_sm set (to any
    # value: a fixed split count prices nothing), so that no pool kernel is compiled only to
    # ask its occupancy (the one kernel runs in its place)
    return dataclasses.replace(options, split_blocks=split_blocks, ctas_per_sm=options.ctas_per_sm or 1)


def _one_launch(runs: list, shapes: list, options: DecodeOptions, seq_lens, counters, packed: bool = False) -> Launch:
    # tiered_merge "one": the pools' partials launches `runs` (slots in the order last pool,
    # then pool 0, 1, ...) as one launch of tiered_kernels.one_launch_kernel, at the cap their
    # splits were sized for; "packed": a grid of the last pool's splits, each CTA running the
    # slots that fall to it
    last, rest = runs[-1], runs[:-1]
    order = (shapes[-1], *shapes[:-1])
    kernel = one_launch_kernel(order, options.max_registers, options.l2_prefetch, options.joint_softmax,
                               dependent_launches(options), packed)
    args = list(last.args)
    args[COUNTERS_ARG] = counters
    own = [tuple(run.args[i] for i in OWN_ARGS) for run in (rest * 2)[:2]]  # two pools: pool 0's twice (unused)
    grid = (last.grid[0] if packed else sum(run.grid[0] for run in runs), *last.grid[1:])
    return Launch(kernel, grid, last.block, (*args, seq_lens, last.grid[0], rest[0].grid[0], *own[0], *own[1]))


def _partials(launch: Launch, shape: DecodeShape, options: DecodeOptions, part_o, part_ml, total: int,
              merging: tuple | None = None) -> Launch:
    # the pool's launch with the partials kernel at the register cap its split count was
    # sized for (uncapped where the grid launch is: launcher.register_cap), its partial arrays
    # starting at its first slot, and a row stride of every pool's slots (`total`); a
    # dependent launch's kernel where the grid decode's is (``DecodeOptions.dependent_launch``).
    # merging: None for tiered_merge "launch", else (first, last, seq_lens, counters): the
    # pool's launch of tiered_merge "last" (tiered_kernels.pool_kernel)
    cap, dependent = register_cap(launch, shape, options), dependent_launches(options)
    args = list(launch.args)
    args[12], args[13], args[19] = part_o, part_ml, total
    if merging is None:
        kernel = decode_kernel(shape, cap, options.l2_prefetch, options.joint_softmax, partials=True,
                               dependent=dependent)
    else:
        first, last, seq_lens, args[14] = merging
        kernel = pool_kernel(shape, cap, options.l2_prefetch, options.joint_softmax, dependent, first, last)
        args.append(seq_lens)
    return Launch(kernel, launch.grid, launch.block, tuple(args))


def _check(stores, tables, counts, tail_lens, tail_pool) -> None:
    if not isinstance(stores, (list, tuple)) or not stores:
        raise HexcoreInvalidArgumentError(f"stores: expected a non-empty list of DeviceKVStore, got {stores!r:.60}")
    first = checked_store(stores[0]).config
    for p, store in enumerate(stores):
        cfg = checked_store(store).config
        same = (cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, cfg.block_size, cfg.group_size)
        if same != (first.num_layers, first.num_kv_heads, first.head_dim, first.block_size, first.group_size):
            raise HexcoreInvalidArgumentError(f"stores[{p}]: its shape differs from stores[0]'s (only kv_dtype may)")
    if not (isinstance(tables, (list, tuple)) and isinstance(counts, (list, tuple))
            and len(tables) == len(counts) == len(stores)):
        raise HexcoreInvalidArgumentError(f"tables, counts: expected one per store ({len(stores)})")
    check_id_range(tail_lens, "tail_lens", None, first.block_size)  # int32 [B] in [0, block_size)
    batch = tail_lens.shape[0]
    check_id_range(tail_pool, "tail_pool", batch, len(stores))
    for p, (table, count) in enumerate(zip(tables, counts)):
        if not (isinstance(table, np.ndarray) and isinstance(count, np.ndarray)):
            raise HexcoreInvalidArgumentError(f"tables[{p}], counts[{p}]: expected host numpy arrays")
        if table.ndim != 2 or table.shape[0] != batch:
            raise HexcoreInvalidArgumentError(f"tables[{p}]: expected shape ({batch}, *), got {table.shape}")
        check_id_range(count, f"counts[{p}]", batch, table.shape[1] + 1)  # (at most tables[p]'s width)
