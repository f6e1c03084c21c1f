"""Issue 19: int2-aged's one launch at B=1 32/8 32k stalls on instruction fetch ("no
instruction" 3.2-4.0 a issue against INT2's 0.2, with ncu's cache flush and without: s46
call 3). Is it the kernel's code, or its young-pool CTAs running other code beside the INT2
ones on the same SMs? This runs the one launch as built (grid 34 x 8: 32 INT2 slots, the FP16
and INT4 slots) and the same kernel, arguments and code with a grid of the INT2 slots alone
(32 x 8: the young slots never run; the row's last CTA still merges, stale partials in the
young slots: timing only, the output is not read), then the INT2 pool's own partials kernel (tiered_merge
"launch"'s second launch) for the same work, then one-launch kernels of two and of three
copies of the INT2 item on the INT2 slots alone (code size without other pools' code), then
the one kernel's body cut to the INT2 item alone, at its cap of 168 and uncapped (the
structure without the size; the forty-sixth session ran all but these two):

    python3 benchmarks/experiments/2026-12-06-s46/one_probe.py [--ncu] [--shape B,Hq,Hkv,ctx]

``--ncu``: three launches of each, for ncu's counters (grid size tells them apart); else
each timed with CUDA events over 5 rounds of 200 launches, alternating (us a launch)."""
import sys

import numpy as np
from numba import cuda, uint32

from benchmarks.bench_decode import tiered_case
from hexcore.cuda.attention.options import DecodeOptions
from hexcore.cuda.attention.kernel import decode_item_function, ring_words
from hexcore.cuda.attention.tiered import OWN_ARGS
from hexcore.cuda.device import SHARED_ALIGN16, SIMULATOR, allow_dependent_grids, wait_prior_grids
from hexcore.cuda.attention.tiered_kernels import _ONE_LAUNCH_KERNELS, last_merge_function, one_launch_kernel


def one_launches(shape):
    """(as built, INT2 slots only): the one launch of int2-aged at ``shape``, prepared."""
    _run, _nbytes, (_stores, prepared), _info = tiered_case("int2-aged", *shape)
    one = [p for p in prepared if p.as_launch().kernel in _ONE_LAUNCH_KERNELS.values()]
    assert len(one) == 1, f"expected one one-launch kernel, got {len(prepared)} launches"
    launch = one[0].as_launch()
    n_a = launch.args[22]
    print(f"one launch grid {launch.grid}, n_a {n_a}, n_b {launch.args[23]}")
    dependent = getattr(launch.kernel, "waits_for_prior_grids", False)
    int2_only = launch._replace(grid=(n_a, *launch.grid[1:]))
    return (launch.prepare(dependent=dependent), int2_only.prepare(dependent=dependent),
            *(int2_copies(int2_only, pools).prepare(dependent=dependent) for pools in (2, 3)),
            *(one_item(int2_only, cap).prepare(dependent=dependent) for cap in (168, None)))


def one_item(launch, cap):
    """``launch`` (the one launch, INT2 slots only) with the one kernel's body cut to one
    pool: the INT2 item with its ring passed in (``ring_arg``) and the last CTA's merge, at
    register cap ``cap`` (None: uncapped), waiting for the grid before it where the one kernel
    does: the one kernel's structure without other items' code."""
    shapes, _cap, l2_prefetch, joint_softmax, dependent, _packed = next(
        k for k, v in _ONE_LAUNCH_KERNELS.items() if v is launch.kernel)
    kernel = one_item_kernel(shapes[0], cap, l2_prefetch, joint_softmax, dependent)
    return launch._replace(kernel=kernel, args=launch.args[:22])


def one_item_kernel(shape, cap, l2_prefetch: str = "none", joint_softmax: bool = True, dependent: bool = False):
    """The one kernel's body cut to one pool of ``shape`` at register cap ``cap`` (None:
    uncapped), with ``dependent`` waiting for the grid before it and letting the next start
    as the one kernel does; arguments: a partials launch's 21, then ``seq_lens``."""
    item = decode_item_function(shape, l2_prefetch, joint_softmax, partials=True, ring_arg=True)
    merge_if_last = last_merge_function(shape.H, shape.G, shape.D, False)
    HG, RING = shape.head_groups, ring_words(shape)

    @cuda.jit(**({} if cap is None or SIMULATOR else {"max_registers": cap}))
    def kernel(pool, k_codes, v_codes, k_meta, v_meta, k_tails, v_tails, q, block_tables, pool_lens, tail_slots, out,
               part_o, part_ml, counters, layer, num_blocks, max_seqs, split_blocks, total, scale, seq_lens):
        if dependent:
            wait_prior_grids()
        x, h, hg, b = cuda.blockIdx.x, cuda.blockIdx.y // HG, cuda.blockIdx.y % HG, cuda.blockIdx.z
        ring = cuda.shared.array(RING, uint32, alignment=SHARED_ALIGN16)
        item(pool, k_codes, v_codes, k_meta, v_meta, k_tails, v_tails, q, block_tables, pool_lens, tail_slots, out,
             part_o, part_ml, counters, layer, num_blocks, max_seqs, split_blocks, total, scale, x, h, hg, b, ring)
        merge_if_last(part_o, part_ml, out, counters, seq_lens, total)
        if dependent:
            allow_dependent_grids()

    kernel.waits_for_prior_grids = dependent
    return kernel


def int2_copies(launch, pools: int):
    """``launch`` (the one launch, INT2 slots only) with a one-launch kernel of ``pools``
    copies of the INT2 item (its other pools' arguments the INT2 pool's own): the same work
    and a kernel of about the same size as int2-aged's (three copies) or two thirds of it."""
    key = next(k for k, v in _ONE_LAUNCH_KERNELS.items() if v is launch.kernel)
    shapes, rest = key[0], key[1:]
    kernel = one_launch_kernel((shapes[0],) * pools, *rest)
    own = tuple(launch.args[i] for i in OWN_ARGS)  # pool a's (the INT2 pool's) own arguments
    return launch._replace(kernel=kernel, args=(*launch.args[:24], *own, *own))


def pool_launch(shape):
    """The INT2 pool's partials kernel of tiered_merge "launch" for the same case."""
    options = DecodeOptions(tiered_merge="launch")
    _run, _nbytes, (_stores, prepared), _info = tiered_case("int2-aged", *shape, options=options)
    grids = [p.as_launch().grid for p in prepared]
    print(f"merge launch grids {grids}")
    return max(prepared, key=lambda p: p.as_launch().grid[0])  # the INT2 pool: the most splits


def timed(launch, reps=200) -> float:
    start, end = cuda.event(), cuda.event()
    start.record()
    for _ in range(reps):
        launch.run()
    end.record()
    end.synchronize()
    return cuda.event_elapsed_time(start, end) * 1e3 / reps


def main(argv):
    shape = (1, 32, 8, 32768)
    if "--shape" in argv:  # B,Hq,Hkv,ctx (a small one for the simulator)
        shape = tuple(int(v) for v in argv[argv.index("--shape") + 1].split(","))
    built, int2_only, two_copies, three_copies, one_capped, one_uncapped = one_launches(shape)
    pool = pool_launch(shape)
    variants = {"one launch as built (34 x 8)": built, "one launch, INT2 slots only (32 x 8)": int2_only,
                "INT2 pool's own kernel": pool, "two INT2 items' kernel, INT2 slots only": two_copies,
                "three INT2 items' kernel, INT2 slots only": three_copies,
                "one INT2 item, ring passed in, merge, cap 168": one_capped,
                "one INT2 item, ring passed in, merge, uncapped": one_uncapped}
    for launch in variants.values():
        launch.run()
    cuda.synchronize()
    if "--ncu" in argv:
        for launch in variants.values():
            for _ in range(3):
                launch.run()
        cuda.synchronize()
        return
    times = {name: [] for name in variants}
    for _ in range(5):
        for name, launch in variants.items():
            times[name].append(timed(launch))
    for name, ts in times.items():
        print(f"{name}: median {np.median(ts):.2f} us a launch (rounds {', '.join(f'{t:.2f}' for t in ts)})")


if __name__ == "__main__":
    main(sys.argv[1:])
