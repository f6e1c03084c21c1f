"""``paged_decode`` and ``DecodePlan``: validation, split sizing and the workspace of the
decode kernel (``kernel.py``)."""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np
from numba import cuda

from ..._checks import as_int, real_value, shown
from ...errors import HexcoreInvalidArgumentError
from ..arrays import (check_id_range, check_writes, checked, checked_ids, checked_layer, checked_store,
                      device_only)
from ..device import SIMULATOR
from ..launch import Launch, PreparedLaunch
from ..store import DeviceKVStore, flat_words
from ..streams import resolve_stream
from ..views import flat
from .kernel import MAX_CLUSTER, VERIFY_ARGS, decode_kernel
from .options import DEFAULT_OPTIONS, DecodeOptions, SplitCosts, sm_share
from .shape import HEADS_PER_CTA, THREADS, WARPS, DecodeShape, unsupported_reason

UNCAPPED_REGISTERS = 255  # the decode kernel's "no cap" (ptxas's own choice up to 255)
UNCAPPED_CTAS_PER_SM = 3  # the most CTAs per SM of the uncapped kernel (about 160 registers)
# FP16 uncapped and unsplit where the capped kernel would split: timed faster on the H200 up to
# items of this many blocks (4k tokens of 32; thirty-second session), not yet past it
FP16_UNSPLIT_MAX_BLOCKS = 128
# the SMs the split policy prices on the simulator (which runs CTAs one at a time on one): an
# H200's count, so that a decode there splits into as many CTAs as the grid of that GPU
# would hold (its occupancy stays the simulator's: one CTA per SM unless ctas_per_sm says)
SIMULATED_SMS = 132
COUNTERS_ARG = 14  # the decode launch's merge counters argument (after part_o and part_ml)


@functools.cache
def _num_sms() -> int:
    return 1 if SIMULATOR else cuda.get_current_device().MULTIPROCESSOR_COUNT


def dependent_launches(options: DecodeOptions) -> bool:
    """``options.dependent`` for the current GPU (the simulator stands for an sm_90 one)."""
    return options.dependent((9, 0) if SIMULATOR else cuda.get_current_device().compute_capability)


def prepare_decode(launch: Launch, options: DecodeOptions) -> PreparedLaunch:
    """``launch`` (a grid decode launch made with ``options``) prepared on ``options.launch_path``,
    as a programmatic dependent launch exactly when its kernel waits for the grid before it
    (``decode_kernel(dependent=True)``, which ``_choose_kernel`` picks by ``dependent_launches``),
    and on a GPU, where ``options.cluster`` says so for its split count and how much of a wave
    its CTAs fill, as the kernel's ``cluster_twin`` in clusters of one item's splits."""
    dependent = getattr(launch.kernel, "waits_for_prior_grids", False)
    cluster, clustered = 1, cluster_rule(options, launch.kernel)
    if clustered is not None:
        splits, heads, batch = launch.grid
        slots = resident_slots(launch, options)
        cluster = splits if clustered(splits, splits * heads * batch / slots) else 1
    if cluster > 1:
        launch = launch._replace(kernel=launch.kernel.cluster_twin())
    return launch.prepare(options.launch_path, dependent=dependent, cluster=cluster)


class DecodeVerify(NamedTuple):
    """The buffers of a decode that checks sampled sealed blocks as it reads them (the verify
    variant of ``kernel.decode_kernel``; docs/fault-tolerance.md, "Verification inside the
    decode kernel").

    - ``head_sums``: uint32 ``[num_blocks, num_layers, num_kv_heads]``, the recorded head
      digests (``integrity.head_record_launch``); read only.
    - ``vctl``: int32 ``[2]`` = (every, phase): sealed block ``b`` is checked iff ``every >
      0`` and ``(b + phase) % every == 0``; ``every`` 0 checks none. A device array, so a
      captured graph can change the phase per step; a host array is checked (``every >= 0``,
      ``0 <= phase``) and copied once.
    - ``flags``: uint32 ``[>= 1]``: ``flags[0]`` counts mismatches (atomic adds; never
      cleared by the kernel).
    - ``found``: int32 ``[F, 2]``: mismatch ``k < F`` writes its (block, layer) into row ``k``.

    ``flags`` and ``found`` lie outside the store and share no memory with each other, the
    decode's ``out``, ``head_sums`` or ``vctl`` (HexcoreInvalidArgumentError).
    """

    head_sums: object
    vctl: object
    flags: object
    found: object


def checked_verify(verify, store) -> tuple:
    """The four device arrays of ``verify`` (a DecodeVerify) checked against ``store``."""
    if not isinstance(verify, DecodeVerify):
        raise HexcoreInvalidArgumentError(f"verify: expected a DecodeVerify or None, got {type(verify).__name__}")
    cfg = store.config
    head_sums = checked(verify.head_sums, "verify.head_sums", np.uint32,
                        (store.num_blocks, cfg.num_layers, cfg.num_kv_heads), align=4, output=False)
    vctl = verify.vctl
    if isinstance(vctl, np.ndarray) and vctl.dtype == np.int32 and vctl.shape == (2,) and \
            (vctl[0] < 0 or vctl[1] < 0):
        raise HexcoreInvalidArgumentError(
            f"verify.vctl: expected (every >= 0, phase >= 0), got ({int(vctl[0])}, {int(vctl[1])})")
    vctl = checked(vctl, "verify.vctl", np.int32, (2,), align=4, output=False)
    flags = checked(verify.flags, "verify.flags", np.uint32, (None,), align=4, output=True)
    if flags.shape[0] < 1:
        raise HexcoreInvalidArgumentError(f"verify.flags: expected shape (n >= 1,), got {tuple(flags.shape)}")
    found = checked(verify.found, "verify.found", np.int32, (None, 2), align=4, output=True)
    return head_sums, vctl, flags, found


class Workspace:
    """Split partials and merge counters, allocated once per shape and reused.

    Launches that share a workspace must run one after another (one stream): the
    counters let the last CTA of each sequence merge its splits, and return to zero
    after every launch. The module's default one serves ``paged_decode`` and ``DecodePlan``.
    A persistent decode call that was cut short (an exception) or left by bare slices
    (``persistent.BareSlice``) may leave its counters mid-merge: the workspace records them
    (``has_mid_call`` is True) until they are zeroed, by the next persistent call that uses them
    (its reset launch) or by ``paged_decode`` and ``DecodePlan.run``, which zero their own
    counters on their stream before they launch if recorded (:meth:`zero_mid_call`). Other
    launches on the workspace (a ``DecodeStep``, a prepared launch run directly, a graph
    replay) do not look.
    """

    def __init__(self):
        self._arrays = {}
        self._mid_call: dict = {}  # id(counters) -> counters, for arrays left mid-merge

    def get(self, rows: int, splits: int, head_dim: int, items: int):
        """(part_o float32 ``[rows * splits * head_dim]``, part_ml float32 ``[rows * splits * 2]``,
        counters int32 ``[items]``, zeroed)."""
        key = (rows, splits, head_dim, items)
        if key not in self._arrays:
            self._arrays[key] = (cuda.device_array(rows * splits * head_dim, np.float32),
                                 cuda.device_array(rows * splits * 2, np.float32),
                                 cuda.to_device(np.zeros(items, np.int32)))
        return self._arrays[key]

    @property
    def has_mid_call(self) -> bool:
        """Whether any counters are recorded as left mid-merge."""
        return bool(self._mid_call)

    def mark_mid_call(self, counters) -> None:
        """Record ``counters`` (one of this workspace's) as possibly left mid-merge."""
        self._mid_call[id(counters)] = counters

    def is_mid_call(self, counters) -> bool:
        """Whether ``counters`` are recorded as left mid-merge."""
        return id(counters) in self._mid_call

    def clear_mid_call(self, counters) -> None:
        """Forget ``counters``' record: the caller zeroed them (a reset launch) or saw its call
        end with every merge done (a drained call)."""
        self._mid_call.pop(id(counters), None)

    def zero_mid_call(self, counters, stream) -> None:
        """Zero ``counters`` on ``stream`` (a ``streams.Stream``) and forget their record, if
        they are recorded (a host-to-device copy: not for a stream under graph capture)."""
        if id(counters) in self._mid_call:
            zeros = np.zeros(counters.shape, np.int32)
            counters.copy_to_device(zeros) if SIMULATOR else counters.copy_to_device(zeros, stream=stream.numba)
            del self._mid_call[id(counters)]


_workspace = Workspace()


def policy_sms() -> int:
    """The SMs the split policy prices: this GPU's, or on the simulator :data:`SIMULATED_SMS`."""
    return SIMULATED_SMS if SIMULATOR else _num_sms()


def split_cost(items: int, splits: int, max_virtual: int, ctas_per_sm: int, costs: SplitCosts, heads: int = 4,
               clustered: bool = False, sms: int | None = None) -> float:
    """The split policy's price of ``splits`` splits per item for ``items`` (sequence, KV
    head, head group) CTAs of ``heads`` query heads and ``max_virtual`` blocks, ``ctas_per_sm``
    resident per SM, merged in clusters or not (``clustered``), on ``sms`` SMs (None:
    :func:`policy_sms`), in blocks of one SM's work at full occupancy: the busiest SM runs
    ``k = ceil(items * splits / SMs)`` CTAs (SMs times ``costs.cluster_spread`` for clusters of
    three or more) of ``ceil(max_virtual / splits)`` blocks (rounded up to a multiple of
    ``WARPS``: the CTA's warps take every ``WARPS``-th block, so its busiest warp sets its
    time) in rounds of ``ctas_per_sm``, a block of a round of ``j`` CTAs costing
    ``sm_share(j) / sm_share(ctas_per_sm)``; plus ``k`` times ``costs.cta`` and, for more
    than one split, ``costs.merge_cost``."""
    if splits < 1 or ctas_per_sm < 1:
        raise HexcoreInvalidArgumentError(f"split_cost: expected splits >= 1 and ctas_per_sm >= 1, "
                                          f"got {splits} and {ctas_per_sm}")
    sms = policy_sms() if sms is None else sms
    per_split = -(-max_virtual // splits)
    blocks = -(-per_split // WARPS) * WARPS  # warp w takes blocks w, w + WARPS, ...: the busiest warp's, WARPS times
    spread = costs.cluster_spread if clustered and splits > 2 else 1.0
    per_sm = -(-items * splits // max(1, int(sms * spread)))
    rounds, last = divmod(per_sm, ctas_per_sm)  # full rounds of resident CTAs, and the rest
    cost = blocks * (rounds * ctas_per_sm + last * sm_share(last) / sm_share(ctas_per_sm)) + per_sm * costs.cta
    return cost + (costs.merge_cost(splits, heads, clustered) if splits > 1 else 0.0)


def split_blocks_for(items: int, max_virtual: int, ctas_per_sm: int, options: DecodeOptions, bits: int = 16,
                     one_wave: bool = False, clustered=None, heads: int = 4) -> int:
    """Blocks per split for ``items`` (sequence, KV head, head group) CTAs of ``heads`` query
    heads and up to ``max_virtual`` blocks each of a ``bits`` cache, ``ctas_per_sm`` of them
    resident per SM: the split count whose busiest SM finishes first, by :func:`split_cost`
    with ``options.costs(bits)``; no split shorter than ``options.min_split_blocks`` (the
    fewest splits among equals). ``one_wave``: only split counts whose CTAs are all resident
    at once (one split when even that is not). ``clustered``: None, or ``clustered(splits,
    fill)``, whether a launch of ``splits`` splits per item whose CTAs fill ``fill`` of one
    wave merges them in clusters (``prepare_decode``'s rule), which prices their merge as a
    cluster's. Without ``clustered`` (eager launches, every call) the answer is cached.
    ``options.split_blocks`` set: that, at most ``max_virtual`` (no search)."""
    if options.split_blocks is not None:
        return max(1, min(options.split_blocks, max_virtual))
    sms = policy_sms()
    if clustered is None:
        return _unclustered_split_blocks(items, max_virtual, ctas_per_sm, options, bits, one_wave, heads, sms)
    return _search_split_blocks(items, max_virtual, ctas_per_sm, options, bits, one_wave, clustered, heads, sms)


@functools.lru_cache(maxsize=4096)
def _unclustered_split_blocks(items, max_virtual, ctas_per_sm, options, bits, one_wave, heads, sms) -> int:
    """``_search_split_blocks`` without clusters, cached per sizes (a search is ~0.1-0.4 ms)."""
    return _search_split_blocks(items, max_virtual, ctas_per_sm, options, bits, one_wave, None, heads, sms)


def _search_split_blocks(items, max_virtual, ctas_per_sm, options, bits, one_wave, clustered, heads, sms) -> int:
    """``split_blocks_for``'s search over split counts on ``sms`` SMs."""
    slots = max(1, ctas_per_sm * sms)
    costs = options.costs(bits)
    best, best_cost = max_virtual, None
    for splits in range(1, min(max_virtual, -(-4 * slots // items)) + 1):  # more than 4 waves never pay
        blocks = -(-max_virtual // splits)
        if (blocks < options.min_split_blocks or (one_wave and items * splits > slots)) and splits > 1:
            break
        if -(-max_virtual // blocks) < splits:
            continue  # launched as fewer splits of the same length, already priced as such
        in_cluster = splits > 1 and clustered is not None and clustered(splits, items * splits / slots)
        cost = split_cost(items, splits, max_virtual, ctas_per_sm, costs, heads, in_cluster, sms)
        if best_cost is None or cost < best_cost:
            best, best_cost = blocks, cost
    return best


def cluster_rule(options: DecodeOptions, kernel):
    """``split_blocks_for``'s ``clustered`` for a prepared launch of ``kernel``: None where
    it never merges in clusters (the simulator, a kernel without a cluster twin), else
    whether ``options.cluster`` gives a cluster for (splits, fill) on this GPU."""
    if SIMULATOR or not hasattr(kernel, "cluster_twin"):
        return None
    cc = cuda.get_current_device().compute_capability
    return lambda splits, fill: options.cluster(cc, splits, MAX_CLUSTER, fill) > 1


def _choose_kernel(shape: DecodeShape, options: DecodeOptions, items: int, max_virtual: int, args: list,
                   verify: bool, prepared: bool = False):
    """(kernel, resident CTAs per SM, blocks per split) of a launch of ``items`` (sequence,
    KV head, head group) CTAs of up to ``max_virtual`` blocks each.

    ``options.max_registers`` None: an INT4/INT2 launch whose items fit in one wave of the
    uncapped kernel's resident CTAs (155-180 registers, no spills, two or three CTAs per SM)
    takes that kernel, with the split count the policy prices cheapest among those that fit one
    wave (``split_blocks_for``, ``one_wave``); an FP16 launch too (168 registers, three CTAs per
    SM) where that count is the capped kernel's (the same work, no spills) or one for items of
    at most ``FP16_UNSPLIT_MAX_BLOCKS`` (no merge), and ``ctas_per_sm`` is unset (it would price
    both kernels alike); every other launch the 128-register one (four
    CTAs per SM, 8-32 spilled bytes). Where the SMs would hold fewer CTAs than they could anyway
    (few items: B=1, B=32 x 8 KV heads), a warp that spills nothing finishes its blocks sooner;
    where the items fill the SMs the fourth CTA is worth more (H200, ``benchmarks/RESULTS.md``,
    twenty-first session: uncapped 2.7-12.5% faster at the shapes this rule takes it, but INT2
    at 16 x 32/8 16k, +1.2%; 1.6-4.9% slower on the same grid, 14-33% with more splits, at the
    shapes it leaves capped; twenty-fourth session: INT4 at 32 x 64/8 4k, one wave of 256
    unsplit uncapped CTAs, 10% faster than two waves' worth of splits capped; thirty-second
    session, FP16 32/8, two runs each: uncapped at the same split count 6.2% faster at B=1 32k
    and 5.1% at B=4 8k (there capped in clusters of 8, uncapped through the workspace), level
    at B=1 128k; where its wave cuts the splits 1.4% slower at B=8 8k
    and 2.0% at B=16 16k, 3.9% faster at B=2 16k; unsplit 2.5% faster at B=32 4k and 3-5% at
    32 x 64/8 4k, untimed at longer items). ``prepared``: the launch will be prepared
    (``prepare_decode``), so the split policy knows which split counts would merge in clusters.
    ``verify``: the chosen plain kernel's ``verify_twin`` (the plain choice, so a checked
    layer's output is bit-identical to an unchecked one's; compiled with at most
    ``kernel.VERIFY_MAX_REGISTERS``, it holds at least as many CTAs an SM as the plain one)."""
    kernel, ctas_per_sm, split_blocks = _choose_plain_kernel(shape, options, items, max_virtual, args, prepared)
    return (kernel.verify_twin() if verify else kernel), ctas_per_sm, split_blocks


def _choose_plain_kernel(shape: DecodeShape, options: DecodeOptions, items: int, max_virtual: int, args: list,
                         prepared: bool):
    # _choose_kernel's choice among the plain kernels
    def sized(cap, one_wave=False):
        kernel = decode_kernel(shape, cap, options.l2_prefetch, options.joint_softmax,
                               dependent=dependent_launches(options))
        ctas_per_sm = options.ctas_per_sm or _ctas_per_sm(kernel, args)
        clustered = cluster_rule(options, kernel) if prepared else None
        return kernel, ctas_per_sm, split_blocks_for(items, max_virtual, ctas_per_sm, options, shape.bits, one_wave,
                                                     clustered, heads=min(shape.G, HEADS_PER_CTA))

    if options.max_registers is None and items <= UNCAPPED_CTAS_PER_SM * _num_sms():
        uncapped = sized(UNCAPPED_REGISTERS, one_wave=True)
        _, ctas_per_sm, split_blocks = uncapped
        splits = -(-max_virtual // split_blocks)
        if items * splits <= ctas_per_sm * _num_sms():  # one wave
            if shape.quantized:
                return uncapped
            if options.ctas_per_sm is None:  # FP16: set, it would stand in for both kernels' occupancy
                capped = sized(None)
                unsplit = splits == 1 and max_virtual <= FP16_UNSPLIT_MAX_BLOCKS
                return uncapped if unsplit or splits >= -(-max_virtual // capped[2]) else capped
    return sized(options.max_registers)


def register_cap(launch: Launch, shape: DecodeShape, options: DecodeOptions) -> int | None:
    """The register cap ``launch`` (a grid decode launch of ``shape`` made with ``options``,
    no verification) was compiled with: ``options.max_registers``, or ``UNCAPPED_REGISTERS``
    where ``_choose_kernel`` took the uncapped kernel (or ``prepare_decode`` its cluster twin)
    for it, else None (the kernel's own)."""
    if options.max_registers is None:
        uncapped = decode_kernel(shape, UNCAPPED_REGISTERS, options.l2_prefetch, options.joint_softmax, verify=False,
                                 dependent=dependent_launches(options))
        return UNCAPPED_REGISTERS if launch.kernel in (uncapped, uncapped.cluster_twin()) else None
    return options.max_registers


def paged_decode(q, store: DeviceKVStore, layer: int, block_tables, seq_lens, tail_slots, out=None,
                 scale: float | None = None, max_seq_len: int | None = None, stream=None,
                 options: DecodeOptions | None = None, verify: DecodeVerify | None = None):
    """Decode attention of one new query token per sequence over its paged KV cache.

    Each sequence ``b`` attends over its ``seq_lens[b] // block_size`` sealed blocks
    (``block_tables[b, :n]``, dequantized on the fly) and the ``seq_lens[b] % block_size``
    tokens of its tail ``tail_slots[b]``. Float32 accumulation; GQA/MQA by head grouping.

    Parameters
    ----------
    q : float16 ``[B, num_q_heads, head_dim]``, ``num_q_heads`` a multiple of the store's KV heads.
    store : the DeviceKVStore; ``layer`` selects the layer.
    block_tables : int32 ``[B, max_blocks]``: sealed block ids per sequence.
    seq_lens : int32 ``[B]``: tokens per sequence (0 gives a zero output).
    tail_slots : int32 ``[B]``: each sequence's tail slot.
    out : optional float16 ``[B, num_q_heads, head_dim]`` to write; allocated if None.
    scale : softmax scale, ``1/sqrt(head_dim)`` by default (a positive finite number).
    max_seq_len : the longest ``seq_lens`` entry when they live on the device (sizes the
        grid without reading them back); taken from host arrays directly.
    stream : the stream to launch on (``streams.resolve_stream``: by default torch's
        current stream when any argument is a torch tensor, else the default stream).
    options : DecodeOptions (split policy, register cap).
    verify : DecodeVerify or None: check the sampled sealed blocks against their head
        digests while reading them (the kernel's verify variant; outputs unchanged).

    Returns ``out``. Host (numpy) index arrays are range-checked before the launch; device
    arrays are trusted (checking them would synchronise): kernels never read outside the
    store, but a wrong id gives a wrong output. Each call validates and marshals its
    arguments (tens of us of host time); :class:`DecodePlan` does that once.
    """
    launch, out = decode_launch(q, store, layer, block_tables, seq_lens, tail_slots, out, scale, max_seq_len,
                                resolved_options(options), _workspace, verify)
    stream = resolve_stream(stream, q, block_tables, seq_lens, tail_slots, out)
    if _workspace.has_mid_call:  # a persistent call left merge counters mid-merge: these?
        _workspace.zero_mid_call(launch.args[COUNTERS_ARG], stream)
    launch.run(stream)
    return out


class DecodePlan:
    """``paged_decode`` for device buffers that keep their addresses between steps.

    Arguments are validated and marshalled once per layer; ``run(layer)`` only enqueues
    the kernel (capture-safe; but see the end). Change the contents of ``q``,
    ``block_tables``, ``seq_lens`` and ``tail_slots`` between runs, never the arrays; every
    ``seq_lens`` entry must stay at most ``max_seq_len``. All arrays must be device arrays
    or CUDA tensors (a host array would be copied once and later changes to it ignored). ``workspace`` holds the
    split partials (default: the module's, shared with ``paged_decode``). ``verify``: a
    DecodeVerify of device arrays (every layer's launch checks its sampled blocks; change
    ``vctl``'s contents between runs to move the sample). A run whose merge counters a
    persistent call on the same workspace left mid-merge zeroes them first
    (``Workspace.zero_mid_call``: a host copy, so not under graph capture).
    """

    def __init__(self, q, store: DeviceKVStore, block_tables, seq_lens, tail_slots, max_seq_len: int, out=None,
                 scale: float | None = None, workspace: Workspace | None = None,
                 options: DecodeOptions | None = None, verify: DecodeVerify | None = None):
        device_only(q=q, block_tables=block_tables, seq_lens=seq_lens, tail_slots=tail_slots, out=out)
        if verify is not None:
            if not isinstance(verify, DecodeVerify):
                raise HexcoreInvalidArgumentError(
                    f"verify: expected a DecodeVerify or None, got {type(verify).__name__}")
            device_only(**{f"verify.{name}": a for name, a in verify._asdict().items()})
        self._verify = verify
        self.store, self.options = checked_store(store), resolved_options(options)
        self._inputs = (q, block_tables, seq_lens, tail_slots)
        self._scale, self._max_seq_len, self._workspace = scale, max_seq_len, checked_workspace(workspace, _workspace)
        _, self.out = decode_launch(q, store, 0, block_tables, seq_lens, tail_slots, out, scale, max_seq_len,
                                    self.options, self._workspace, verify, prepared=True)
        self._torch = next((a for a in (*self._inputs, out) if type(a).__module__.startswith("torch")), None)
        self._layers: dict = {}
        self._counters: dict = {}  # layer -> its launch's merge counters (the workspace's)

    def launch(self, layer: int):
        """The layer's prepared launch, made on first use (``layer``: an int in
        ``[0, num_layers)``, numpy integers accepted)."""
        prepared = self._layers.get(layer) if type(layer) is int else None
        if prepared is None:
            layer, _ = checked_layer(layer, self.store.config.num_layers)
            prepared = self._layers.get(layer)
        if prepared is None:
            launch, _ = decode_launch(self._inputs[0], self.store, layer, *self._inputs[1:], self.out, self._scale,
                                      self._max_seq_len, self.options, self._workspace, self._verify,
                                      prepared=True)
            prepared = self._layers[layer] = prepare_decode(launch, self.options)
            self._counters[layer] = launch.args[COUNTERS_ARG]
        return prepared

    def run(self, layer: int, stream=None):
        """Enqueue attention for ``layer`` into ``self.out``; returns ``self.out``.

        ``stream``: see ``streams.resolve_stream`` (torch's current stream by default when
        the plan was built from torch tensors)."""
        prepared = self._layers.get(layer) if type(layer) is int else None
        prepared = prepared or self.launch(layer)
        stream = resolve_stream(stream, self._torch)
        if self._workspace.has_mid_call:  # a persistent call left merge counters mid-merge: these?
            self._workspace.zero_mid_call(self._counters[layer if type(layer) is int else int(layer)], stream)
        prepared.run(stream)
        return self.out


def decode_launch(q, store, layer, block_tables, seq_lens, tail_slots, out, scale, max_seq_len,
                  options: DecodeOptions, workspace: Workspace, verify: DecodeVerify | None = None,
                  prepared: bool = False) -> tuple[Launch, object]:
    """Validate paged_decode's arguments; returns (the launch, out). ``verify``: a
    DecodeVerify picks the kernel's verify variant (its four arrays appended to the
    arguments). ``prepared``: the launch is for ``prepare_decode`` (its split count priced
    knowing the cluster merge; an eager launch never merges in clusters)."""
    cfg = checked_store(store).config
    if not isinstance(options, DecodeOptions):
        raise HexcoreInvalidArgumentError(f"options: expected DecodeOptions, got {type(options).__name__}")
    layer, _ = checked_layer(layer, cfg.num_layers)
    reason = unsupported_reason(cfg.kv_dtype.bits, cfg.head_dim, cfg.block_size, cfg.group_size)
    if reason:
        raise HexcoreInvalidArgumentError(f"paged_decode does not support {reason}")
    q = checked(q, "q", np.float16, (None, None, cfg.head_dim))
    batch, num_q_heads = q.shape[0], q.shape[1]
    check_q_heads(num_q_heads, cfg.num_kv_heads, "q: num_q_heads ")
    if batch == 0:  # a grid of no CTAs is no launch (and the split policy divides by the items)
        raise HexcoreInvalidArgumentError(f"q: expected at least one sequence, got shape {tuple(q.shape)}")
    max_blocks = _max_blocks(block_tables, batch)
    capacity = (max_blocks + 1) * cfg.block_size - 1
    host_lens = seq_lens if isinstance(seq_lens, np.ndarray) else None
    seq_lens = checked_ids(seq_lens, "seq_lens", batch, capacity + 1)
    tail_slots = checked_ids(tail_slots, "tail_slots", batch, store.max_seqs)
    host_tables = block_tables if isinstance(block_tables, np.ndarray) else None
    block_tables = checked(block_tables, "block_tables", np.int32, (batch, max_blocks), align=4)
    if host_tables is not None and host_lens is not None:
        _check_tables(host_tables, host_lens, cfg.block_size, store.num_blocks)
    longest = int(host_lens.max(initial=0)) if host_lens is not None else None
    max_seq_len = _checked_max_seq_len(max_seq_len, longest, capacity)
    scale = checked_scale(scale, cfg.head_dim)
    if out is None:
        out = cuda.device_array((batch, num_q_heads, cfg.head_dim), np.float16)
    out = checked(out, "out", np.float16, (batch, num_q_heads, cfg.head_dim), output=True)
    reads = {"q": q, "block_tables": block_tables, "seq_lens": seq_lens, "tail_slots": tail_slots}
    checks = () if verify is None else checked_verify(verify, store)
    writes = {"out": out}
    if checks:  # a verify decode also writes the mismatch flags and list, and reads the digests and vctl
        head_sums, vctl, flags, found = checks
        writes.update({"verify.flags": flags, "verify.found": found})
        reads.update({"verify.head_sums": head_sums, "verify.vctl": vctl})
    check_writes(store, writes, reads)

    shape = DecodeShape(cfg.kv_dtype.bits, cfg.num_kv_heads, cfg.head_dim, cfg.block_size,
                        num_q_heads // cfg.num_kv_heads, cfg.group_size)
    items = batch * cfg.num_kv_heads * shape.head_groups
    max_virtual = max(1, -(-max_seq_len // cfg.block_size))
    part_o, part_ml, counters = workspace.get(1, 1, 1, 1)  # placeholders to size the kernel's occupancy
    args = [store.pool, *(store.word_offsets.get(n, 0) for n in ("k_codes", "v_codes", "k_meta", "v_meta",
                                                                   "k_tails", "v_tails")),
            flat_words(q), block_tables, seq_lens, tail_slots, flat(out), part_o, part_ml, counters,
            int(layer), store.num_blocks, store.max_seqs, 1, 1, np.float32(scale)]
    kernel, ctas_per_sm, split_blocks = _choose_kernel(shape, options, items, max_virtual, args, bool(checks),
                                                       prepared)
    splits = -(-max_virtual // split_blocks)
    args[12:15] = workspace.get(batch * num_q_heads, splits, cfg.head_dim, items)  # 14: COUNTERS_ARG
    args[18], args[19] = split_blocks, splits
    args += checks
    return Launch(kernel, (splits, cfg.num_kv_heads * shape.head_groups, batch), THREADS, tuple(args)), out


_occupancy: dict = {}  # decode kernel -> resident CTAs per SM (one specialization each)


def resident_slots(launch: Launch, options: DecodeOptions) -> int:
    """CTAs of ``launch``'s kernel the GPU holds at once (one wave): ``launch_ctas_per_sm``
    times the SMs (on the simulator 1 x 1)."""
    return launch_ctas_per_sm(launch, options) * _num_sms()


def launch_ctas_per_sm(launch: Launch, options: DecodeOptions) -> int:
    """CTAs of ``launch``'s kernel an SM holds at once: ``options.ctas_per_sm`` or the compiled
    kernel's occupancy. A verify kernel counts as its ``plain_twin`` (its launch takes the
    plain launch's choices)."""
    kernel, args = launch.kernel, list(launch.args)
    plain = getattr(kernel, "plain_twin", None)
    if plain is not None:
        kernel, args = plain(), args[:-VERIFY_ARGS]
    return options.ctas_per_sm or _ctas_per_sm(kernel, args)


def _ctas_per_sm(kernel, args) -> int:
    """Resident CTAs per SM of the compiled kernel (registers and shared memory); worked out
    once per kernel (typing the arguments and asking the driver costs ~100s of us)."""
    if SIMULATOR:
        return 1
    found = _occupancy.get(kernel)
    if found is None:
        compiled = kernel.compile(tuple(kernel.typeof_pyval(a) for a in args))
        found = _occupancy[kernel] = max(1, compiled.max_cooperative_grid_blocks(THREADS) // _num_sms())
    return found


def resolved_options(options) -> DecodeOptions:
    """``options`` (a DecodeOptions), or :data:`DEFAULT_OPTIONS` for None; anything else
    raises HexcoreInvalidArgumentError (``options or DEFAULT_OPTIONS`` would take 0 or ""
    for the defaults and raise numpy's ValueError for an array)."""
    if options is None:
        return DEFAULT_OPTIONS
    if not isinstance(options, DecodeOptions):
        raise HexcoreInvalidArgumentError(f"options: expected DecodeOptions or None, got {type(options).__name__}")
    return options


def checked_workspace(workspace, default: Workspace) -> Workspace:
    """``workspace`` (a Workspace), or ``default`` for None; else HexcoreInvalidArgumentError."""
    if workspace is None:
        return default
    if not isinstance(workspace, Workspace):
        raise HexcoreInvalidArgumentError(f"workspace: expected a Workspace or None, got {type(workspace).__name__}")
    return workspace


def check_q_heads(num_q_heads: int, num_kv_heads: int, name: str = "num_q_heads: ") -> None:
    """The query-head rule of every attention entry point: ``num_q_heads`` (an int) a
    positive multiple of ``num_kv_heads``, else HexcoreInvalidArgumentError starting with
    ``name`` (``"q: num_q_heads "`` where the count is q's shape)."""
    if num_q_heads <= 0 or num_q_heads % num_kv_heads:
        raise HexcoreInvalidArgumentError(f"{name}{num_q_heads} is not a positive multiple of num_kv_heads "
                                          f"{num_kv_heads}")


def checked_scale(scale, head_dim: int) -> float:
    """The softmax scale of every attention entry point: ``1 / sqrt(head_dim)`` for None,
    else ``scale`` as a positive finite float (HexcoreInvalidArgumentError naming it)."""
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    value = real_value(scale)
    if not (math.isfinite(value) and value > 0):
        raise HexcoreInvalidArgumentError(f"scale: expected a positive finite number or None, got {shown(scale)}")
    return value


def _checked_max_seq_len(max_seq_len, longest: int | None, capacity: int) -> int:
    if max_seq_len is None:
        return longest if longest is not None else capacity
    try:
        max_seq_len = as_int("max_seq_len", max_seq_len, 0, capacity)
    except HexcoreInvalidArgumentError as exc:
        raise HexcoreInvalidArgumentError(f"{exc} (at most what block_tables can describe)") from None
    if longest is not None and longest > max_seq_len:
        raise HexcoreInvalidArgumentError(f"max_seq_len: {max_seq_len} is below the longest seq_lens entry {longest}")
    return int(max_seq_len)


def _max_blocks(block_tables, batch: int) -> int:
    shape = tuple(getattr(block_tables, "shape", ()))
    if len(shape) != 2 or shape[0] != batch:
        raise HexcoreInvalidArgumentError(f"block_tables: expected shape ({batch}, max_blocks), got {shape}")
    return shape[1]


def check_host_index(store, block_tables: np.ndarray, seq_lens: np.ndarray, tail_slots, batch: int) -> int:
    """:func:`decode_launch`'s checks of its host index arrays, for a caller that copies them
    to the device itself (``tiered_decode``: one copy for every pool): ``block_tables`` int32
    ``[batch, max_blocks]``, ``seq_lens`` int32 ``[batch]`` within what the tables describe,
    ``tail_slots`` int32 ``[batch]`` (when a host array). Returns the longest ``seq_lens``."""
    cfg = store.config
    max_blocks = _max_blocks(block_tables, batch)
    check_id_range(seq_lens, "seq_lens", batch, (max_blocks + 1) * cfg.block_size)
    if isinstance(tail_slots, np.ndarray):
        check_id_range(tail_slots, "tail_slots", batch, store.max_seqs)
    if block_tables.dtype != np.int32:
        raise HexcoreInvalidArgumentError(f"block_tables: expected dtype int32, got {block_tables.dtype}")
    _check_tables(block_tables, seq_lens, cfg.block_size, store.num_blocks)
    return int(seq_lens.max(initial=0))


def _check_tables(tables: np.ndarray, lens: np.ndarray, block_size: int, num_blocks: int) -> None:
    used = np.arange(tables.shape[1])[None, :] < (lens // block_size)[:, None]
    bad = np.argwhere(used & ((tables < 0) | (tables >= num_blocks)))
    if bad.size:
        b, j = bad[0]
        raise HexcoreInvalidArgumentError(
            f"block_tables[{b}, {j}] = {tables[b, j]} is outside [0, {num_blocks}) for seq_len {lens[b]}")
