"""DecodeOptions: the tuning choices of paged decode, in one documented object.

Pass one to ``paged_decode``, ``DecodePlan``, ``DecodeGraph`` or the ``Engine``; it is
part of the kernel cache key, so two options objects never share a compiled kernel
that one of them would have built differently.
"""

from __future__ import annotations

import dataclasses

from ...errors import HexcoreConfigError
from ..launch import PATHS

PREFETCH = ("quantized", "all", "none")
ITEM_CALLS = ("call", "inline")
TIERED_FP16 = ("launch", "merge")


# the merge's cost per split in blocks of each dtype's work (bits -> blocks), for the split
# policy (``launcher.split_blocks_for``). On the H200 (benchmarks/RESULTS.md, "twenty-seventh
# session"; one run each, queued) the split counts of B=1 32/8 at 2k-32k were timed against
# the shorter runs of blocks the policy picked without a merge term for FP16 and INT4: fewer,
# longer splits won (INT4 2k 16 -> 8 splits: 7.56 -> 6.13 us, 4k 32 -> 8: 9.58 -> 7.96, 8k
# 43 -> 16: 12.83 -> 10.24, 32k 49 -> 32: 19.30 -> 17.59; FP16 8k 64 -> 32: 16.07 -> 13.07).
# These costs, with the cluster merge's at CLUSTER_MERGE_SHARE of them, pick for a prepared
# launch the fastest count timed at every INT4 and INT2 row of 2k-128k; for FP16 the fastest
# at 8k, a tie at 32k (64 splits, 42.74 us; 32: 42.72), 16 splits at 2k (4% slower than 8 in a
# cluster), 66 at 128k (2.5% slower than 64) and 22 at 4k (untimed; 16 and 32 within 3%).
# At 1k INT2 goes from 4 splits in a cluster (5.9 us) to 8 (untimed). INT2's 1.12 is the
# thirteenth session's fit, unchanged. Untimed: every batch above 1 where the count changes
# (B x KV heads x head groups up to about 64), and the launches that never merge in clusters
# (eager ``paged_decode``, the persistent decode, formats by age), which take these costs
# without the cluster share (B=1 32/8 INT4 at 4k: 32 -> 10 splits)
MERGE_COST = {16: 0.25, 4: 1.0, 2: 1.12}

# the cluster merge's cost per split as a share of the workspace merge's (``MERGE_COST``):
# fitted with it above (INT2 B=1 4k: 8 splits in a cluster, 7.5 us, over 10 merged in the
# workspace, 10.3 us; but at 8k 16 in the workspace, 9.6 us, over 8 in a cluster, 10.4 us)
CLUSTER_MERGE_SHARE = 0.5

# the most of one wave of resident CTAs a grid may fill and still merge its splits in thread
# block clusters by default (DecodeOptions.cluster_merge None). On the H200 (twenty-sixth
# session) B=1 1k (64 CTAs of 528 slots) gained 25-30%, while grids filling the wave lost
# 28-41% (16 x 32/8 16k: 384 and 512 CTAs in clusters of 3 and 4); nothing between was
# measured, so the rule keeps to the half where no cluster placement can need a second wave
CLUSTER_MAX_FILL = 0.5


@dataclasses.dataclass(frozen=True)
class DecodeOptions:
    """How paged decode splits its work and launches.

    A sequence is split into runs of blocks, one CTA each, so that the grid's waves of
    resident CTAs finish soonest (``launcher.split_blocks_for``).

    - ``ctas_per_sm``: resident CTAs per SM, for sizing splits into whole waves; None
      reads it off the compiled kernel's registers and shared memory.
    - ``min_split_blocks``: the shortest split, in blocks (splits shorter than the CTA's
      four warps leave warps idle).
    - ``split_overhead``: a CTA's fixed cost (start, combine, merge) in blocks of work, for
      choosing the split count.
    - ``split_merge_cost``: the merge's cost per split of a (sequence, head), in blocks of
      work, added once per split count: the last CTA of a head reads every split's partial
      after the others finish, so at B=1 more splits lengthen the tail even within one
      wave. None (the default) takes :data:`MERGE_COST` for the cache's dtype, timed on the
      H200 at B=1; 0 leaves the choice to the waves alone.
    - ``cluster_merge_share``: the cluster merge's cost per split as a share of
      ``split_merge_cost``, for the split counts a prepared launch would merge in clusters
      (``cluster_merge``; the policy knows which): :data:`CLUSTER_MERGE_SHARE` by default, 1
      prices both merges alike.
    - ``max_registers``: a register cap; None takes each kernel's default: for the grid
      decode kernel 128 (four CTAs of 128 threads resident per SM; the 8-32 bytes it spills
      at head_dim 128 cost less than the warps it adds), except an INT4/INT2 launch whose
      splits fit in one wave of the uncapped kernel (few items: B=1, B=32 x 8 KV heads),
      which runs uncapped, with no spills (``launcher._choose_kernel``; measured on the
      H200: ``benchmarks/RESULTS.md``, "third" and "twenty-first session"); for the
      persistent kernel with its item inlined the cap of the grid launch it stands for (128,
      or none where that one runs uncapped: 2-3 points off its B=1 ratio, twenty-second
      session), the compiler's choice with the item called (at 128 that one spills about 900
      bytes per thread). 255 means no cap.
    - ``l2_prefetch``: which sealed blocks a warp asks L2 for one block ahead of its copies
      (INT4/INT2 blocks are copied one chunk ahead into shared memory anyway): "quantized",
      "all" (FP16 blocks too) or "none".
    - ``joint_softmax``: one softmax update per 32 tokens of a sealed INT block instead of
      one per 16 (fewer shuffles and a shorter loop; on by default since the tenth session,
      4-7% faster on every INT4/INT2 shape measured, FP16 unchanged: ``benchmarks/RESULTS.md``).
    - ``launch_path``: "raw" (one ``cuLaunchKernel``) or "core" (``cuda.core.launch``)
      for prepared launches.
    - ``persistent_item``: how the persistent kernel runs its items (``persistent.py``):
      "inline" (the default: inlined, its thread index read volatile, capped at 128
      registers with 60-144 bytes of spill stores) or "call" (out of line, 168 registers, 3
      CTAs per SM). Measured on the H200 against the grid kernel's time, no yield: inline
      1.04-1.13x at B=64 and 1.19-1.28x at B=1 32k, call 1.05-1.37x and 1.33-1.46x
      (``benchmarks/RESULTS.md``, "eleventh session").
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
      launches and the verify variant's are plain ones. ``DecodeGraph`` captures them into
      its graphs as programmatic edges (checked with the H200's driver 580, CUDA 13.0; an
      older driver that cannot capture them wants ``dependent_launch=False``).
    - ``tiered_fp16``: where a format by age decodes its FP16 pool (the sink, young blocks,
      tails; ``tiered.py``): "merge" (the default: inside the merge launch, each CTA its own
      (sequence, head) first, one launch fewer; 2-7% faster on grouped-query shapes, 0.5-1%
      slower with one query head per KV head, measured on the H200) or "launch" (its own
      partials launch before the merge).
    - ``cluster_merge``: whether a prepared grid decode whose items have 2 to 8 splits
      (``kernel.MAX_CLUSTER``) launches each item's splits as one thread block cluster that
      merges through distributed shared memory (``kernel.decode_kernel``, ``cluster``)
      instead of the workspace and the last CTA's merge. None (the default): on for the
      "raw" launch path on compute capability 9.0 or newer where the grid fills at most
      ``CLUSTER_MAX_FILL`` of one wave of resident CTAs, off otherwise; True: wherever an
      item has 2 to 8 splits (needs the "raw" path: ``HexcoreConfigError`` here; and sm_90:
      ``HexcoreConfigError`` when a plan or step is made on an older GPU). Plans with verification,
      formats by age and the persistent decode never merge in clusters.
      Measured on the H200 (``benchmarks/RESULTS.md``, twenty-sixth session): B=1 1k 32/8,
      64 CTAs, 25-30% faster (FP16 8.6 -> 6.4 us); grids that fill the wave slower (16 x
      32/8 16k, 384-512 CTAs in clusters of 3-4: 28-41%), hence the fill rule. The simulator
      has no clusters and merges as before; so do eager ``paged_decode`` launches.
    """

    ctas_per_sm: int | None = None
    min_split_blocks: int = 4
    split_overhead: float = 1.0
    split_merge_cost: float | None = None
    cluster_merge_share: float = CLUSTER_MERGE_SHARE
    max_registers: int | None = None
    l2_prefetch: str = "none"
    joint_softmax: bool = True
    launch_path: str = "raw"
    persistent_item: str = "inline"
    tiered_fp16: str = "merge"
    dependent_launch: bool | None = None
    cluster_merge: bool | None = None

    def __post_init__(self):
        for name in ("split_overhead", "split_merge_cost", "cluster_merge_share"):
            value = getattr(self, name)
            if value is None and name == "split_merge_cost":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e6:
                raise HexcoreConfigError(f"{name}: expected a number in [0, 1e6), got {value!r}")
        for name in ("ctas_per_sm", "max_registers"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise HexcoreConfigError(f"{name}: expected a positive int or None, got {value!r}")
        if isinstance(self.min_split_blocks, bool) or not isinstance(self.min_split_blocks, int) \
                or self.min_split_blocks < 1:
            raise HexcoreConfigError(f"min_split_blocks: expected a positive int, got {self.min_split_blocks!r}")
        if self.l2_prefetch not in PREFETCH:
            raise HexcoreConfigError(f"l2_prefetch: expected one of {PREFETCH}, got {self.l2_prefetch!r}")
        if not isinstance(self.joint_softmax, bool):
            raise HexcoreConfigError(f"joint_softmax: expected a bool, got {self.joint_softmax!r}")
        if self.persistent_item not in ITEM_CALLS:
            raise HexcoreConfigError(f"persistent_item: expected one of {ITEM_CALLS}, got {self.persistent_item!r}")
        if self.tiered_fp16 not in TIERED_FP16:
            raise HexcoreConfigError(f"tiered_fp16: expected one of {TIERED_FP16}, got {self.tiered_fp16!r}")
        if self.launch_path not in PATHS:
            raise HexcoreConfigError(f"launch_path: expected one of {PATHS}, got {self.launch_path!r}")
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

    def merge_cost(self, bits: int, clustered: bool = False) -> float:
        """``split_merge_cost`` for a cache of ``bits`` (16, 4 or 2) per value, times
        ``cluster_merge_share`` where the splits merge in a cluster (``clustered``)."""
        cost = MERGE_COST[bits] if self.split_merge_cost is None else float(self.split_merge_cost)
        return cost * self.cluster_merge_share if clustered else cost


DEFAULT_OPTIONS = DecodeOptions()
