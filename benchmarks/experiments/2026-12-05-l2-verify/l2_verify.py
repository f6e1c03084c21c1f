"""Does a block that a layer's decode has just read verify from L2? (issue 14; thirty-sixth
session, written for the next GPU session.)

Issue 14 asks for sampled verification at 1 in 16 inside a B=64 32-layer step for under 3%
of the step's GPU time. A separate check launch that reads its 1/16 of the blocks from HBM
cannot get there (an FP16 step runs at about 98.6% of the read ceiling, and 1/16 more bytes
is 6.25%), and checking inside the decode cost 6-30% (fifteenth session). A third design:
check, right after each layer's decode, the blocks that decode read *last*, while they are
still in the H200's 50 MB L2 (a B=64 x 32/8 4k FP16 layer reads 240 MB; its last 1/16 is
15 MB); rotating each split's walk by a phase per step would make "read last" cover every
block in 16 steps. This measures the premise only, for one layer:

- ``decode``: the layer's ``DecodePlan.run`` alone;
- ``+ last-read``: the decode, then a ``checksum_launch(..., "verify")`` of each split's last
  ``ceil(run / 16)`` blocks (the blocks its warps read last: warp ``w`` takes blocks ``w, w +
  4, ...`` of its split's run);
- ``+ spread``: the decode, then the same count of blocks spread over the whole cache (the
  block ids ``(id + 1) % 16 == 0`` of the step's sealed blocks, as ``FaultTolerantKVCache``'s
  1-in-16 sample picks them, a random permutation table making them random positions);
- the verify launches alone, back to back (their sample stays in L2 between runs: the L2
  rate) for scale.

The premise holds if ``+ last-read`` costs clearly less than ``+ spread`` and at most about
2% of the decode (leaving room for the walk's rotation and 32 launches a step). Each
call's sample must verify clean (``mismatches`` 0). One-layer stores; llama-3-8b's KV heads
(32/8, D 128, block 32); timed with ``benchmarks.gpu_common.time_gpu`` (queued).

    python benchmarks/experiments/2026-12-05-l2-verify/l2_verify.py [--shapes "64,32,8,4096;..."]
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))  # the repo root
import numpy as np  # noqa: E402
from numba import cuda  # noqa: E402

from benchmarks.gpu_common import QUEUE_NS, fill_store, save, time_gpu  # noqa: E402
from hexcore import KVCacheConfig  # noqa: E402
from hexcore.cuda import DecodePlan, DeviceKVStore  # noqa: E402
from hexcore.cuda.integrity import checksum_launch  # noqa: E402

D, BS, EVERY = 128, 32, 16
SPLIT_BLOCKS_ARG = 18  # the decode kernel's split length argument (tiered.DECODE_ARGS)


def last_read(tables: np.ndarray, split_blocks: int, every: int = EVERY) -> np.ndarray:
    """Each split's last ``ceil(run / every)`` blocks: ``tables`` int32 ``[B, n]`` cut into
    runs of ``split_blocks``."""
    picks = []
    for row in tables:
        for start in range(0, row.shape[0], split_blocks):
            run = row[start:start + split_blocks]
            last = -(-run.shape[0] // every)
            picks.extend(run[-last:].tolist())
    return np.array(picks, np.int32)


def spread(tables: np.ndarray, count: int, every: int = EVERY) -> np.ndarray:
    """``count`` of the blocks ``(id + 1) % every == 0`` (the 1-in-N sample's), in table order."""
    ids = tables.reshape(-1)
    return np.ascontiguousarray(ids[(ids + 1) % every == 0][:count]).astype(np.int32)


def rows_for(batch: int, num_q_heads: int, num_kv_heads: int, ctx: int, dtype: str) -> list[dict]:
    cfg = KVCacheConfig(num_layers=1, num_kv_heads=num_kv_heads, head_dim=D, block_size=BS, kv_dtype=dtype)
    per_seq = ctx // BS
    store = DeviceKVStore(cfg, num_blocks=batch * per_seq, max_seqs=batch)
    fill_store(store)
    rng = np.random.default_rng(0)
    host_tables = rng.permutation(batch * per_seq).astype(np.int32).reshape(batch, per_seq)
    tables, lens = cuda.to_device(host_tables), cuda.to_device(np.full(batch, ctx, np.int32))
    q = cuda.to_device(rng.standard_normal((batch, num_q_heads, D)).astype(np.float16))
    plan = DecodePlan(q, store, tables, lens, cuda.to_device(np.arange(batch, dtype=np.int32)), max_seq_len=ctx)
    plan.run(0)
    split_blocks = int(plan.launch(0).as_launch().args[SPLIT_BLOCKS_ARG])
    every = np.arange(store.num_blocks, dtype=np.int32)
    sums = cuda.device_array((store.num_blocks, 1), np.uint32)
    bad = cuda.device_array(len(store.guard_offsets), np.uint32)
    checksum_launch(store, every, sums, cuda.device_array((store.num_blocks, 1), np.uint32), bad, "record").run(0)
    late = last_read(host_tables, split_blocks)
    samples = {"last-read": late, "spread": spread(host_tables, late.shape[0])}  # (the row says each count)
    flags = cuda.to_device(np.zeros(2, np.uint32))
    found = cuda.device_array((16, 2), np.int32)
    verify = {name: checksum_launch(store, ids, sums, cuda.device_array((ids.shape[0], 1), np.uint32), bad, "verify",
                                    flags, found).prepare() for name, ids in samples.items()}
    shape = f"{batch},{num_q_heads},{num_kv_heads},{ctx}"
    decode_s = time_gpu(lambda: plan.run(0), queue_ns=QUEUE_NS)
    rows = [dict(shape=shape, dtype=dtype, case="decode", split_blocks=split_blocks, us=decode_s * 1e6)]
    for name, launch in verify.items():
        both = time_gpu(lambda: (plan.run(0), launch.run(0)), queue_ns=QUEUE_NS)
        alone = time_gpu(lambda: launch.run(0), queue_ns=QUEUE_NS)
        nbytes = samples[name].shape[0] * cfg.block_bytes
        rows.append(dict(shape=shape, dtype=dtype, case=f"+ {name}", blocks=int(samples[name].shape[0]),
                         MB=nbytes / 1e6, us=both * 1e6, overhead=both / decode_s - 1,
                         verify_alone_us=alone * 1e6, alone_TBs=nbytes / alone / 1e12))
    cuda.synchronize()
    mismatches = int(flags.copy_to_host()[0])
    for row in rows:
        row["mismatches"] = mismatches
    return rows


def main(argv: list[str]) -> None:
    text = argv[argv.index("--shapes") + 1] if "--shapes" in argv else "64,32,8,4096;16,32,8,16384"
    rows = []
    for shape in text.split(";"):
        batch, hq, hkv, ctx = (int(x) for x in shape.split(","))
        for dtype in ("fp16", "int4", "int2"):
            rows += rows_for(batch, hq, hkv, ctx, dtype)
            save("l2_verify", rows, table=False)
            print(rows[-3:], flush=True)
    save("l2_verify", rows)


if __name__ == "__main__":
    main(sys.argv[1:])
