"""DecodeOptions: the tuning choices of paged decode, in one documented object.

Pass one to ``paged_decode``, ``DecodePlan``, ``DecodeGraph`` or the ``Engine``; it is
part of the kernel cache key, so two options objects never share a compiled kernel
that one of them would have built differently.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ..._checks import as_int, real_value, shown
from ...errors import HexcoreConfigError, HexcoreInvalidArgumentError
from ..launch import PATHS

PREFETCH = ("quantized", "all", "none")
ITEM_CALLS = ("call", "inline")
TIERED_FP16 = ("launch", "merge")
TIERED_MERGE = ("launch", "last", "one", "packed")
MAX_REGISTERS = 255  # registers per thread a kernel can have on any CUDA GPU (ptxas's --maxrregcount)


@dataclasses.dataclass(frozen=True)
class SplitCosts:
    """What the split policy (``launcher.split_blocks_for``) charges a split count beside the
    blocks the busiest SM streams, in blocks of one SM's work at full occupancy.

    - ``cta``: each CTA's fixed cost on its SM (start, first loads, its partial).
    - ``merge``: the workspace merge's cost per split, per 4 query heads of a CTA (the last
      CTA of a (sequence, head group) reads every split's partial after the others finish).
    - ``cluster_merge``: the cluster merge's cost per split, per 4 query heads of a CTA.
    - ``cluster_saving``: what merging in a cluster saves once over the workspace merge (no
      fence, counter or last CTA's pass).
    - ``cluster_spread``: the share of the SMs that clusters of three or more CTAs spread
      evenly over (1: as evenly as single CTAs; clusters of two always spread so).
    """

    cta: float
    merge: float
    cluster_merge: float
    cluster_saving: float
    cluster_spread: float = 1.0

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e6:
                raise HexcoreConfigError(f"split_costs.{field.name}: expected a number in [0, 1e6), got {value!r}")
        if not 0 < self.cluster_spread <= 1:
            raise HexcoreConfigError(
                f"split_costs.cluster_spread: expected a share in (0, 1], got {self.cluster_spread!r}")

    def merge_cost(self, splits: int, heads: int, clustered: bool) -> float:
        """The merge's price for ``splits`` (> 1) splits of CTAs of ``heads`` query heads,
        in clusters or through the workspace."""
        if clustered:
            return splits * heads / 4 * self.cluster_merge - self.cluster_saving
        return splits * heads / 4 * self.merge


# each dtype's split costs (bits -> SplitCosts): one set of microsecond costs over each
# dtype's block time, fitted by benchmarks/split_fit.py (benchmarks/RESULTS.md, "twenty-ninth
# session", with the command) to 645 launches timed on the H200 whose CTAs were all resident
# at once, clustered ones only where the cluster rule launches them (29 shapes: B = 1-64, 4-32
# KV heads, 1k-128k tokens; 1-66 splits), a split's blocks priced as its busiest warp's:
# 0.78 us per CTA on the busiest SM, 0.037 us per split and 4 query heads (cluster merge
# 0.033), 1.86 us saved by a cluster merge; block time at head_dim 128, block 32: FP16 0.455,
# INT4 0.151, INT2 0.120 us; relative rms error 12.9%, 5.0%, 5.8%. At each of the 31 shapes
# timed the count the policy picks was timed too: on average 0.54% (FP16), 0.12% (INT4), 0.74%
# (INT2) slower than the fastest count timed there (the twenty-eighth session's costs: 0.64%,
# 0.18%, 0.84%), at most 6.6% (FP16 B=2 2k, 8 splits in clusters), 2.7% (INT4 B=4 4k, 8
# splits against 6 in clusters) and 9.7% (INT2 B=1 32/4 8k, 22 splits against 32)
SPLIT_COSTS = {16: SplitCosts(cta=1.72, merge=0.081, cluster_merge=0.073, cluster_saving=4.095),
               4: SplitCosts(cta=5.173, merge=0.243, cluster_merge=0.218, cluster_saving=12.313, cluster_spread=0.75),
               2: SplitCosts(cta=6.54, merge=0.307, cluster_merge=0.276, cluster_saving=15.565, cluster_spread=0.75)}

# an SM's time per block with k CTAs resident, relative to one CTA (k -> share; more than 4:
# the last), fitted with SPLIT_COSTS (each dtype's own fit: 1 / 0.68-0.71 / 0.63-0.66) and, for
# 4, from FP16's timings of 3 against 4 CTAs per SM at equal blocks (B=1 32k and 128k, 16 x
# 32/8 16k: 0.63-0.64): one CTA of four warps leaves an SM's bandwidth a third idle
SM_SHARE = {1: 1.0, 2: 0.69, 3: 0.65, 4: 0.635}


def sm_share(ctas: int) -> float:
    """:data:`SM_SHARE` of ``ctas`` resident CTAs per SM."""
    return SM_SHARE.get(ctas, SM_SHARE[max(SM_SHARE)]) if ctas >= 1 else 1.0


# the most of one wave of resident CTAs a grid may fill and still merge its splits in thread
# block clusters by default (DecodeOptions.cluster_merge None). On the H200 (twenty-sixth
# session) B=1 1k (64 CTAs of 528 slots) gained 25-30%, while grids filling the wave lost
# 28-41% (16 x 32/8 16k: 384 and 512 CTAs in clusters of 3 and 4); nothing between was
# measured, so the rule keeps to the half where no cluster placement can need a second wave
CLUSTER_MAX_FILL = 0.5
# a format by age's last pool merges (tiered_merge None) where TIERED_ONE_MAX_ITEMS does not
# take the step to one launch and it has at most TIERED_LAST_MAX_ITEMS (sequence, KV head,
# head group) items and they times its longest sequence's blocks come to at most
# TIERED_LAST_MAX_BLOCKS per SM: short, narrow launches
# (H200, thirtieth and thirty-first sessions, 32/8 heads: faster at 8-64 items of 31-62
# blocks per SM; mostly slower at 128-512 items, 32 x 1k too (256 items, 62 per SM), and
# at 248; int2-aged 4-5% faster at B=16 16k and B=64 1k)
TIERED_LAST_MAX_BLOCKS = 128
TIERED_LAST_MAX_ITEMS = 64
# a format by age's pools run in one launch (tiered_merge None) where, with dependent launches,
# its step has at most TIERED_ONE_MAX_ITEMS[pools] items, whatever their length (H200,
# thirty-fifth session, 32/8 heads, against the default before it: int2-aged, three pools,
# 8-19-25% faster at B=1 32k / B=8 4k / B=2 8k (8-64 items), 4% at B=1 128k, 10-110% slower
# at 128-512 items; int4-aged, two pools, 8% / 11% faster at B=1 32k / 128k (8 items), even
# at B=2 8k (16), 5% slower at B=8 4k (64) and 3-34% at 128-512)
TIERED_ONE_MAX_ITEMS = {2: 16, 3: 64}


@dataclasses.dataclass(frozen=True)
class DecodeOptions:
    """How paged decode splits its work and launches.

    A sequence is split into runs of blocks, one CTA each, so that the busiest SM finishes
    soonest (``launcher.split_blocks_for``).

    - ``ctas_per_sm``: resident CTAs per SM, for pricing each SM's load; None
      reads it off the compiled kernel's registers and shared memory.
    - ``min_split_blocks``: the shortest split, in blocks (splits shorter than the CTA's
      four warps leave warps idle).
    - ``split_blocks``: every split this many blocks long (fewer where the sequence is
      shorter), whatever the policy would price (``min_split_blocks`` and the one-wave limit
      of the uncapped kernel's count do not apply; the persistent decode may still cut
      splits shorter to fit its budget); None (the default): the policy's choice. For tests
      and sweeps that need a given split length (one-block splits, say, which the policy
      never picks: a split's blocks are priced as its busiest warp's). The split workspace
      grows with the count it gives (``B * Hq * splits * D`` float32 partials, kept per
      shape), which the policy bounds at four waves of CTAs and this does not.
    - ``split_overhead``: the persistent decode's fixed cost per work item, in blocks of
      work, for fitting its items into a time budget (``persistent.py``).
    - ``split_costs``: a :class:`SplitCosts`, what the split policy charges a split count
      beside the blocks the busiest SM streams (its CTAs' fixed costs, the merge's cost per
      split, what a cluster merge saves); None (the default) takes :data:`SPLIT_COSTS` for
      the cache's dtype, fitted on the H200. A prepared launch is priced with the cluster
      merge where it would merge in clusters (``cluster_merge``; the policy knows which);
      ``SplitCosts(0, 0, 0, 0)`` leaves the count to the SMs' load alone.
    - ``max_registers``: a register cap in [1, 255]; None takes each kernel's default: for the grid
      decode kernel 128 (four CTAs of 128 threads resident per SM; the 8-32 bytes it spills
      at head_dim 128 cost less than the warps it adds), except an INT4/INT2 launch whose
      splits fit in one wave of the uncapped kernel (few items: B=1, B=32 x 8 KV heads),
      which runs uncapped, with no spills, and an FP16 one whose wave keeps the capped
      kernel's split count or leaves short items unsplit, with ``ctas_per_sm`` unset
      (``launcher._choose_kernel``; measured on the H200: ``benchmarks/RESULTS.md``, "third",
      "twenty-first" and "thirty-second session"); for the persistent kernel with its item inlined the cap of the
      grid launch it stands for (128, or none where that one runs uncapped: 2-3 points off its
      B=1 ratio, twenty-second session), the compiler's choice with the item called (at 128 that one spills about 900
      bytes per thread); for a format by age's one launch (``tiered_merge`` "one") 168 or
      128 (below), for its packed launch ("packed") 128. 255 means no cap.
    - ``l2_prefetch``: which sealed blocks a warp asks L2 for one block ahead of its copies
      (INT4/INT2 blocks are copied one chunk ahead into shared memory anyway): "quantized",
      "all" (FP16 blocks too) or "none".
    - ``joint_softmax``: one softmax update per 32 tokens of a sealed INT block instead of
      one per 16 (fewer shuffles and a shorter loop; on by default since the tenth session,
      4-7% faster on every INT4/INT2 shape measured, FP16 unchanged: ``benchmarks/RESULTS.md``).
    - ``launch_path``: "raw" (one ``cuLaunchKernel``) or "core" (``cuda.core.launch``)
      for prepared launches.
    - ``persistent_item``: how the persistent slice kernel runs its items (``persistent_kernels.py``;
      a one-launch call, ``PersistentDecode.one_launch``, runs the grid kernel's item in a
      kernel of its own whatever this says):
      "inline" (the default: inlined, its thread index read volatile, capped at 128
      registers with 60-144 bytes of spill stores, where ``max_registers`` does not say
      otherwise) or "call" (out of line, 168 registers, 3 CTAs per SM). Measured on the H200
      against the grid kernel's time, no yield: inline
      1.04-1.13x at B=64 and 1.19-1.28x at B=1 32k, call 1.05-1.37x and 1.33-1.46x
      (``benchmarks/RESULTS.md``, "eleventh session").
    - ``eager_first``: whether a persistent decode call's first slice starts every CTA's
      static item at once, checking the slice's start and budget only after it (``persistent_kernels.py``,
      ``EAGER``), instead of one global round trip (a compare-and-swap) before it. None
      (the default): on a GPU with ``ctas_per_sm`` unset, where the first slice's grid is
      its resident CTAs and they start together; off with ``ctas_per_sm`` set (it may exceed
      the occupancy: later waves would each run an item past the budget) and on the
      simulator, which runs CTAs one after another (so its tests see late CTAs owe their
      items). Eager, a CTA that another stream keeps off its SM past the budget still runs
      its static item once it starts.
    - ``wide_one_launch``: whether a persistent decode call whose items outnumber the
      resident CTAs is one launch of the one-launch kernel over every item (``persistent.py``,
      a *wide* one-launch call) where the item model (``READ_BYTES_PER_US``) puts the whole
      call within ``ITEM_SHARE`` (a quarter) of its budget: the hardware schedules the items,
      as it does the grid decode's, with no slice protocol around them. Its CTAs check no
      budget (they read the clock only for their records), so its bound rests on the model:
      the launch keeps within the budget while the items take up to four times the model's
      time. None (the default): on a GPU with
      ``ctas_per_sm`` unset where the first slice is eager (``eager_first``), which checks no
      budget before its items either; off on the simulator (whose tests run slices), with
      ``ctas_per_sm`` set and with ``eager_first=False``. Measured (``benchmarks/RESULTS.md``, sixtieth and sixty-first
      sessions): at 128 x 32/8 2k and 64 x 32/32 4k, no yield, the slice protocol takes
      1.03-1.09x the grid decode's time on an H100 (1.06x INT4, 1.09x INT2 at 128 x 32/8 on the
      H200), the wide one-launch call 1.00-1.01x on the H200.
    - ``dependent_launch``: whether prepared decode launches (``DecodePlan``, ``DecodeGraph``,
      the engine's steps, the persistent decode's slices) are programmatic dependent launches
      (``launch.PreparedLaunch``, ``dependent``): the kernel waits for the one ahead of it on
      the stream before its first read (``device.wait_prior_grids``) and, once its work is
      done, lets the next one's CTAs be scheduled (``device.allow_dependent_grids``), so the
      next launch's latency overlaps this one's last CTAs. None (the default): on for the "raw" launch path on a GPU of
      compute capability 9.0 or newer (the PTX needs sm_90), off otherwise; True needs
      ``launch_path`` "raw". Measured on the H200 against plain launches (queued, 21 rows of
      the decode table): 0.2-6.5% faster at every row, about 1 us a launch (B=1 1k: 9.6 ->
      8.6 us; ``benchmarks/RESULTS.md``, twenty-fourth session). Eager ``paged_decode``
      launches are plain ones (a prepared verify launch follows its plain twin). ``DecodeGraph`` captures them into
      its graphs as programmatic edges (checked with the H200's driver 580, CUDA 13.0; an
      older driver that cannot capture them wants ``dependent_launch=False``).
    - ``tiered_fp16``: where a format by age decodes its FP16 pool (the sink, young blocks,
      tails; ``tiered.py``): "merge" (the default: inside the merge launch, each CTA its own
      (sequence, head) first, one launch fewer; 2-7% faster on grouped-query shapes, 0.5-1%
      slower with one query head per KV head, measured on the H200) or "launch" (its own
      partials launch before the merge); where the last pool merges (``tiered_merge``) the
      FP16 pool has its own launch.
    - ``tiered_merge``: what merges a format by age's pools (``tiered_kernels.py``):
      "launch" (a merge launch after the pools' launches), "last" (the last pool's launch:
      its last CTA of each (sequence, KV head, head group) merges every pool's partials; with
      ``dependent_launch`` the pools' launches overlap, each letting the next start as soon as
      it starts), "one", "packed" (below) or None (the default, with dependent launches):
      "one" where the step has at most ``TIERED_ONE_MAX_ITEMS[pools]`` (sequence, KV head, head group)
      items (16 with two pools, 64 with three), else "last" where it is short and narrow (at
      most ``TIERED_LAST_MAX_ITEMS`` items, and they times its longest sequence's blocks at
      most ``TIERED_LAST_MAX_BLOCKS`` per SM), else "launch"; "launch" with plain launches.
      Measured on the H200 with dependent launches, 32/8 heads
      (``benchmarks/RESULTS.md``, thirtieth and thirty-first sessions), "last" against
      "launch": int4-aged / int2-aged B=1 32k 23.8 -> 19.8 / 26.1 -> 22.9 us, B=2 8k -14% /
      -5%, B=8 4k -11% / -6% (8-64 items, 31-62 blocks per SM); B=1 128k +9% / +2% (248 per
      SM), B=32 1k +10% / +5% (256 items), B=32 4k +23% / +12%, B=16 16k +17% / -4%, B=64 1k
      0% / -5%, B=64 4k +1% / +2%. At B=32 4k int4-aged without dependent launches "last"
      is 3% slower than a merge launch, with them 22%: the overlap is most of the loss.
      "one": every pool's items in one launch (``tiered_kernels.one_launch_kernel``, the
      last CTA of each (sequence, KV head, head group) merging): no launch per pool and no
      pool waiting for another; its kernel holds every pool's item, at ``max_registers``
      (None: 168 where the last pool's launch would run uncapped, three CTAs per SM and no
      spills, unless 128 makes a grid of fewer waves; else 128), every pool's splits sized
      for that cap and the younger pools' no shorter than the last pool's
      (``tiered._one_launch_pools``); ``tiered_fp16`` does not apply.
      Two or three pools; a format of one pool, or of more than three, runs "last". On the
      H200 (thirty-fifth session, 32/8 heads) against the default before it: int2-aged B=1
      32k 22.6 -> 20.6 us, B=2 8k -25%, B=8 4k -19%, B=1 128k -4%; int4-aged B=1 32k 20.0 ->
      18.4 us, B=1 128k -11%, B=2 8k even, B=8 4k +5%; 10-110% slower at 128-512 items.
      "packed": one launch as "one", but its grid is the last pool's splits alone (the
      launch that pool would have at ``max_registers``, None: 128) and each CTA also runs
      the younger pools' slots that fall to it, one after the other
      (``tiered_kernels.one_launch_kernel``, ``packed``): no CTA and no launch per young
      pool, for steps whose last pool fills the SMs. Explicit only: on an H100 (thirty-
      sixth session) 0-4% faster than the default at B=64 x 32/8 4k and B=128 2k, up to 11%
      slower at B=32 1k-4k (``benchmarks/RESULTS.md``).
    - ``cluster_merge``: whether a prepared grid decode whose items have 2 to 8 splits
      (``kernel.MAX_CLUSTER``) launches each item's splits as one thread block cluster that
      merges through distributed shared memory (``kernel.decode_kernel``, ``cluster``)
      instead of the workspace and the last CTA's merge. None (the default): on for the
      "raw" launch path on compute capability 9.0 or newer where the grid fills at most
      ``CLUSTER_MAX_FILL`` of one wave of resident CTAs, off otherwise; True: wherever an
      item has 2 to 8 splits (needs the "raw" path: ``HexcoreConfigError`` here; and sm_90:
      ``HexcoreConfigError`` when a plan or step is made on an older GPU). Formats by age and the
      persistent decode never merge in clusters (a plan with verification does as its plain twin).
      Measured on the H200 (``benchmarks/RESULTS.md``, twenty-sixth session): B=1 1k 32/8,
      64 CTAs, 25-30% faster (FP16 8.6 -> 6.4 us); grids that fill the wave slower (16 x
      32/8 16k, 384-512 CTAs in clusters of 3-4: 28-41%), hence the fill rule. The simulator
      has no clusters and merges as before; so do eager ``paged_decode`` launches.
    """

    ctas_per_sm: int | None = None
    min_split_blocks: int = 4
    split_blocks: int | None = None
    split_overhead: float = 1.0
    split_costs: SplitCosts | None = None
    max_registers: int | None = None
    l2_prefetch: str = "none"
    joint_softmax: bool = True
    launch_path: str = "raw"
    persistent_item: str = "inline"
    eager_first: bool | None = None
    wide_one_launch: bool | None = None
    tiered_fp16: str = "merge"
    tiered_merge: str | None = None
    dependent_launch: bool | None = None
    cluster_merge: bool | None = None

    def __post_init__(self):
        value = real_value(self.split_overhead)
        if not 0 <= value < 1e6:  # (NaN fails too)
            raise HexcoreConfigError(f"split_overhead: expected a number in [0, 1e6), got {shown(self.split_overhead)}")
        object.__setattr__(self, "split_overhead", value)
        if not (self.split_costs is None or isinstance(self.split_costs, SplitCosts)):
            raise HexcoreConfigError(f"split_costs: expected a SplitCosts or None, got {self.split_costs!r}")
        for name, high in (("ctas_per_sm", None), ("max_registers", MAX_REGISTERS), ("split_blocks", None),
                           ("min_split_blocks", None)):
            value = getattr(self, name)
            if value is not None or name == "min_split_blocks":
                object.__setattr__(self, name, _config_int(name, value, high))
        for name, choices in (("l2_prefetch", PREFETCH), ("persistent_item", ITEM_CALLS),
                              ("tiered_fp16", TIERED_FP16), ("launch_path", PATHS)):
            _check_choice(name, getattr(self, name), choices)
        if not isinstance(self.joint_softmax, bool):
            raise HexcoreConfigError(f"joint_softmax: expected a bool, got {self.joint_softmax!r}")
        for name in ("eager_first", "wide_one_launch"):
            if not (getattr(self, name) is None or isinstance(getattr(self, name), bool)):
                raise HexcoreConfigError(f"{name}: expected None or a bool, got {getattr(self, name)!r}")
        if self.tiered_merge is not None:
            _check_choice("tiered_merge", self.tiered_merge, TIERED_MERGE, "None or ")
        if not (self.dependent_launch is None or isinstance(self.dependent_launch, bool)) \
                or (self.dependent_launch and self.launch_path != "raw"):
            raise HexcoreConfigError(f"dependent_launch: expected None or a bool, True only with launch_path 'raw', "
                                     f"got {self.dependent_launch!r} with launch_path {self.launch_path!r}")
        if not (self.cluster_merge is None or isinstance(self.cluster_merge, bool)) \
                or (self.cluster_merge and self.launch_path != "raw"):
            raise HexcoreConfigError(f"cluster_merge: expected None or a bool, True only with launch_path 'raw', "
                                     f"got {self.cluster_merge!r} with launch_path {self.launch_path!r}")

    def dependent(self, compute_capability: tuple[int, int]) -> bool:
        """Whether prepared decode launches on a GPU of ``compute_capability`` are
        programmatic dependent launches (``dependent_launch``, None resolved)."""
        sm90 = tuple(compute_capability) >= (9, 0)
        if self.dependent_launch and not sm90:
            raise HexcoreConfigError(f"dependent_launch: True needs compute capability 9.0 or newer (griddepcontrol), "
                                     f"got {tuple(compute_capability)}")
        if self.dependent_launch is not None:
            return self.dependent_launch
        return self.launch_path == "raw" and sm90

    def tiered_mode(self, dependent: bool, items: int, blocks_per_sm: float, pools: int) -> str:
        """What merges the ``pools`` pools of a format by age (``tiered_merge``, None
        resolved) in a step of ``items`` (sequence, KV head, head group) items and
        ``blocks_per_sm`` (items times the longest sequence's blocks, per SM) whose launches
        are dependent ones or not (``dependent``): "one", "last" or "launch" (or "packed"
        where ``tiered_merge`` says so). (The caller runs "one" and "packed" as "last" for a
        number of pools its one launch does not take.)

        Raises HexcoreInvalidArgumentError naming ``items`` or ``pools`` (ints, at least 0
        and 1), ``blocks_per_sm`` (a finite number at least 0) or ``dependent`` (a bool)."""
        items, pools = as_int("items", items, 0), as_int("pools", pools, 1)
        load = real_value(blocks_per_sm)
        if not (math.isfinite(load) and load >= 0):
            raise HexcoreInvalidArgumentError(f"blocks_per_sm: expected a finite number >= 0, "
                                              f"got {shown(blocks_per_sm)}")
        if not isinstance(dependent, (bool, np.bool_)):
            raise HexcoreInvalidArgumentError(f"dependent: expected a bool, got {shown(dependent)}")
        if self.tiered_merge is not None:
            return self.tiered_merge
        if dependent and items <= TIERED_ONE_MAX_ITEMS.get(pools, 0):
            return "one"
        if dependent and items <= TIERED_LAST_MAX_ITEMS and blocks_per_sm <= TIERED_LAST_MAX_BLOCKS:
            return "last"
        return "launch"

    def cluster(self, compute_capability: tuple[int, int], splits: int, max_cluster: int, fill: float) -> int:
        """The thread block cluster size of a prepared grid decode of ``splits`` splits per
        item whose CTAs fill ``fill`` of one wave of resident CTAs, on a GPU of
        ``compute_capability`` (``cluster_merge``, None resolved): ``splits`` where clusters
        are on and ``2 <= splits <= max_cluster``, else 1 (no clusters)."""
        sm90 = tuple(compute_capability) >= (9, 0)
        if self.cluster_merge and not sm90:
            raise HexcoreConfigError(f"cluster_merge: True needs compute capability 9.0 or newer (thread block "
                                     f"clusters), got {tuple(compute_capability)}")
        if self.cluster_merge is None:
            on = self.launch_path == "raw" and sm90 and fill <= CLUSTER_MAX_FILL
        else:
            on = self.cluster_merge
        return splits if on and 2 <= splits <= max_cluster else 1

    def costs(self, bits: int) -> SplitCosts:
        """``split_costs`` for a cache of ``bits`` (16, 4 or 2) per value (None resolved)."""
        return SPLIT_COSTS[bits] if self.split_costs is None else self.split_costs


def _config_int(name: str, value, high: int | None) -> int:
    """``value`` as an int in ``[1, high]`` (``_checks.as_int``'s rule: numpy integers too),
    else HexcoreConfigError with as_int's message."""
    try:
        return as_int(name, value, 1, high)
    except HexcoreInvalidArgumentError as exc:
        raise HexcoreConfigError(str(exc)) from None


def _check_choice(name: str, value, choices: tuple, also: str = "") -> None:
    """Raise HexcoreConfigError unless ``value`` is one of the strings ``choices`` (tested as
    a string first: ``in`` would compare an array elementwise and raise numpy's ValueError)."""
    if not isinstance(value, str) or value not in choices:
        raise HexcoreConfigError(f"{name}: expected {also}one of {choices}, got {value!r}")


DEFAULT_OPTIONS = DecodeOptions()
