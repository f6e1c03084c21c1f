"""DecodeGraph: whole decode steps (append, seal, decode of every layer) replayed as CUDA graphs.

At small batch the host sets decode latency: a 32-layer step is about 70 launches, and
a numba launch costs 25-55 us of host time (DESIGN.md §4). A CUDA graph replays them
all with one call. A DecodeGraph keeps static buffers per batch-size bucket (vLLM's
capture sizes) and one graph per (batch bucket, context bucket); a step costs one njit
call that validates and pads its index arrays into pinned memory, one async copy of
them, and one graph launch::

    graph = DecodeGraph(store, num_q_heads=32, max_blocks_per_seq=cache.max_blocks_per_seq)
    result = cache.step(seq_ids); result.raise_for_status()
    q, k, v, _ = graph.buffers(len(seq_ids))     # [L, B, heads, D] views: fill them
    out = graph.step(result.block_tables, result.seq_lens, result.tail_slots,
                     seal_slots=result.seal_slots, seal_blocks=result.seal_blocks)

With ``verify_sums`` (``FaultTolerantKVCache.sums``: the digests recorded at seal) a step
also records the digests of the blocks it seals and verifies the blocks given as
``verify_blocks``: two checksum launches captured with the step, ids carried in the same
index copy, nothing read back until ``verify_results()`` (``verify.py``). With
``verify_heads`` and ``verify_layers`` k as well, step ``n`` decodes layers ``[p * k, (p +
1) * k)``, ``p = n % ceil(L / k)``, with the decode kernel's verify variant, which checks every
sealed block it reads against its head digests (recorded by the step at seal): whole layers
in turn, one captured graph per phase. Without them the graph is exactly what it was.

The context bucket (next power of two >= the longest sequence, at least one block)
sizes the decode grid, so B=1 at 4k does not launch the splits of 128k. A bucket
pair's first step runs eagerly (its warm-up), then is captured; ``warmup`` captures
ahead of time. Batches above the largest bucket run the eager launchers.
"""

from __future__ import annotations

import bisect
from typing import NamedTuple

import numpy as np
from numba import cuda

from ..._checks import as_int, int_value, shown
from ...errors import HexcoreInvalidArgumentError
from ..attention.launcher import Workspace, check_q_heads, checked_scale, paged_decode, resolved_options
from ..arrays import checked_store
from ..attention.options import DecodeOptions
from ..blocks import copy_tails
from ..streams import resolve_stream, torch_current_stream, torch_stream
from ..write import append, seal
from .capture import DriverGraph, TorchGraph, choose_backend
from .indices import NO_IDS, Staging, StepIndices, check_step
from .step import MAX_BATCH, MAX_TABLE_WIDTH, DecodeStep, PhaseStep, StepBuffers
from .verify import MAX_CAPACITY, StepVerify, VerifyResults

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
MAX_BUCKETS = 64  # batch bucket sizes one graph takes (each may own buffers and graphs)


class StepViews(NamedTuple):
    """A step's buffers for ``B`` sequences: q, out ``[L, B, num_q_heads, D]``, k, v
    ``[L, B, num_kv_heads, D]`` float16 (torch tensors whenever torch with CUDA is
    installed, whatever the backend; numba device arrays otherwise)."""

    q: object
    k: object
    v: object
    out: object


class DecodeGraph:
    """Decode steps for ``store`` captured as CUDA graphs per batch and context bucket.

    ``num_q_heads``: query heads (a multiple of the store's KV heads);
    ``max_blocks_per_seq``: block-table width (``PagedKVCache.max_blocks_per_seq``);
    ``batch_buckets``: batch sizes to capture (capped at the store's ``max_seqs``);
    ``backend``: "torch" (torch.cuda.CUDAGraph), "driver" (cuda.bindings stream
    capture), "eager" (no capture) or "auto" (torch if installed, else driver; eager on
    the simulator). Steps of one DecodeGraph must run one after another on one stream.
    ``verify_sums``: device uint32 ``[num_blocks, L]``, the recorded digests
    (``FaultTolerantKVCache.sums``: each step writes its seals' digests there and checks
    its ``verify_blocks`` against them), or None (no verification); ``max_verify_blocks``:
    block ids one step may verify (an int in [1, 2**20]; a row of that many ids in every
    bucket's index buffer, and the captured checksum grid, are sized by it).
    ``verify_heads``: device uint32 ``[num_blocks, L, H]``, the recorded head digests
    (``FaultTolerantKVCache.head_sums``), with ``verify_layers``: layers each step checks
    inside its decode, in turn (an int in [1, L]; 0 without ``verify_heads``); needs
    ``verify_sums``.
    """

    def __init__(self, store, num_q_heads: int, max_blocks_per_seq: int, batch_buckets=DEFAULT_BUCKETS,
                 scale: float | None = None, backend: str = "auto", options: DecodeOptions | None = None,
                 verify_sums=None, max_verify_blocks: int = 1024, verify_heads=None, verify_layers: int = 0):
        cfg = checked_store(store).config
        num_q_heads = _positive("num_q_heads", num_q_heads)
        check_q_heads(num_q_heads, cfg.num_kv_heads)
        max_blocks_per_seq = _positive("max_blocks_per_seq", max_blocks_per_seq, MAX_TABLE_WIDTH)
        if not isinstance(batch_buckets, (tuple, list, range)) or not batch_buckets:
            raise HexcoreInvalidArgumentError(f"batch_buckets: expected a non-empty sequence of sizes, got "
                                              f"{shown(batch_buckets, 100)}")
        if len(batch_buckets) > MAX_BUCKETS:
            raise HexcoreInvalidArgumentError(f"batch_buckets: expected at most {MAX_BUCKETS} sizes, got "
                                              f"{len(batch_buckets)}")
        batch_buckets = [_positive("batch_buckets", size) for size in batch_buckets]
        checked_scale(scale, store.config.head_dim)  # (None stays None: each launch takes 1/sqrt(head_dim))
        options = resolved_options(options)
        max_verify_blocks = _positive("max_verify_blocks", max_verify_blocks, MAX_CAPACITY)
        verify_layers = as_int("verify_layers", verify_layers, 0, cfg.num_layers)
        if verify_sums is None and (verify_heads is not None or verify_layers):
            raise HexcoreInvalidArgumentError(f"verify_heads, verify_layers ({verify_layers}): checking layers in "
                                              "turn needs verify_sums")
        verify = None if verify_sums is None else StepVerify(store, verify_sums, max_verify_blocks, verify_heads,
                                                             verify_layers)
        self.store, self.num_q_heads, self.scale = store, num_q_heads, scale
        self.max_blocks_per_seq = max_blocks_per_seq
        self.options = options
        self.batch_buckets = tuple(sorted({min(int(b), store.max_seqs) for b in batch_buckets}))
        self.capacity = (max_blocks_per_seq + 1) * cfg.block_size - 1  # longest sequence a table can describe
        self.backend, self._torch = choose_backend(backend)
        self._buckets: dict = {}  # bucket size -> _Bucket
        self._steps: dict = {}  # (bucket, context) -> DecodeStep
        self._graphs: dict = {}  # (bucket, context) -> DriverGraph | TorchGraph
        self._workspace, self._capture_stream, self._overflow = Workspace(), None, None
        self._verify = verify
        self._steps_run = 0  # steps enqueued so far: the next one's phase

    @property
    def verify_sums(self):
        """The recorded digests this graph verifies against (device array), or None."""
        return None if self._verify is None else self._verify.sums

    @property
    def verify_heads(self):
        """The recorded head digests the decode checks whole layers against (device array), or None."""
        return None if self._verify is None else self._verify.head_sums

    @property
    def verify_layers(self) -> int:
        """Layers each step checks inside its decode, in turn; 0 without."""
        return 0 if self._verify is None else self._verify.layers_per_step

    @property
    def max_verify_blocks(self) -> int:
        """Block ids one step may verify; 0 without verification."""
        return 0 if self._verify is None else self._verify.capacity

    def verify_results(self, stream=None) -> VerifyResults:
        """What the verifications of the steps since the last call found, once the work
        queued on ``stream`` is done (synchronises; one 8-byte read when all is well), and
        clears it. HexcoreInvalidArgumentError for a graph made without ``verify_sums``."""
        if self._verify is None:
            raise HexcoreInvalidArgumentError("verify_results: this DecodeGraph was made without verify_sums")
        return self._verify.read(self._resolve(stream))

    @property
    def phases(self) -> int:
        """Steps in a round of whole-layer checks (``ceil(L / verify_layers)``); 0 without."""
        return 0 if self._verify is None else self._verify.phases

    @property
    def phase(self) -> int | None:
        """The phase of the next step in turn (None without whole-layer checks)."""
        return self._steps_run % self.phases if self.phases else None

    def _phase(self, phase) -> int | None:
        # a step's phase: ``phase`` checked (an int in [0, phases), only with whole-layer
        # checks), or the next in turn for None
        if phase is None:
            return self.phase
        if not self.phases:
            raise HexcoreInvalidArgumentError(f"phase: {shown(phase, 40)} given, but this DecodeGraph checks no layers "
                                              "in turn (verify_layers 0)")
        return as_int("phase", phase, 0, self.phases - 1)

    def checked_layers(self, phase: int | None) -> range:
        """The layers a step of ``phase`` decodes with the verify variant (none for None)."""
        return self._verify.checked_layers(phase) if self.phases else range(0)

    @property
    def captured(self) -> tuple:
        """The (batch bucket, context bucket) pairs captured so far, with the phase as a
        third entry when checking layers in turn."""
        return tuple(sorted(self._graphs))

    @property
    def prepared(self) -> tuple:
        """The (batch bucket, context bucket) pairs whose launches are prepared."""
        return tuple(sorted(self._steps))

    def context_bucket(self, longest: int) -> int:
        """The context bucket of a step whose longest sequence has ``longest`` tokens."""
        longest = as_int("longest", longest, 0)
        bucket = self.store.config.block_size
        while bucket < longest:
            bucket *= 2
        return min(bucket, self.capacity)

    def buffers(self, batch: int) -> StepViews:
        """The q, k, v, out views a step of ``batch`` sequences reads and writes: fill
        q, k, v (row i for ``seq_lens[i]``) before ``step``; ``out`` holds its result.
        ``batch``: an int in [1, 65535] (the decode grid's limit)."""
        batch = _positive("batch", batch, MAX_BATCH)
        if batch > self.batch_buckets[-1]:
            return self._overflow_buffers(batch)[1]
        return self._bucket(batch).views(batch)

    def step(self, block_tables, seq_lens, tail_slots, positions=None, seal_slots=None, seal_blocks=None,
             fork_src=None, fork_dst=None, stream=None, verify_blocks=None, phase=None):
        """One decode step: fork copies, append, seal, then attention for every layer.

        Parameters (host numpy int32, as ``PagedKVCache.step`` gives them)
        ----------
        block_tables : ``[B, >= 1]`` sealed block ids; seq_lens : ``[B]`` lengths after
            the step (>= 1); tail_slots : ``[B]`` distinct tail slots; positions : ``[B]``
            optional, checked to equal ``(seq_lens - 1) % block_size``.
        seal_slots, seal_blocks : ``[S]`` tails that filled and their distinct blocks
            (``result.seal_slots`` and ``result.seal_blocks``).
        fork_src, fork_dst : ``[F]`` tails to copy before the append (forks made before
            this step).
        stream : numba or torch stream; default torch's current stream under torch,
            else the default stream.
        verify_blocks : ``[n]`` sealed, recorded block ids to verify against
            ``verify_sums`` (n <= ``max_verify_blocks``; not this step's ``seal_blocks``,
            whose digests are not recorded yet); only on a graph made with ``verify_sums``.
            Read the outcome with :meth:`verify_results`.
        phase : with ``verify_layers``, the phase of whole-layer checks this step runs (an
            int in [0, ``phases``); ``checked_layers(phase)`` are decoded by the verify
            variant); None (the default): the next in turn, ``graph.phase``. A caller that
            steps several batches in turn picks each batch's own (``FaultTolerantKVCache``
            does, per block), or a batch stepped every other step may never see some phases.

        Returns ``out`` of ``buffers(B)``. Bad input raises HexcoreInvalidArgumentError
        before anything is enqueued.
        """
        indices = self._checked(block_tables, seq_lens, tail_slots, positions, seal_slots, seal_blocks, fork_src,
                                fork_dst, verify_blocks)
        phase = self._phase(phase)
        batch = indices.seq_lens.shape[0]
        resolved = self._resolve(stream)
        if batch > self.batch_buckets[-1]:
            out = self._eager_step(indices, resolved, phase)
            self._steps_run += 1
            return out
        launches = self._load(indices, resolved, phase=phase)
        graph = self._graphs.get(launches.key)
        if graph is None:  # eager, and the warm-up of a capture (which must launch everything)
            eager = self.backend == "eager"
            launches.enqueue_all(resolved.numba, indices.seal_slots.shape[0] if eager else None,
                                 indices.verify_blocks.shape[0] if eager else None)
            if self.backend != "eager":
                self._graphs[launches.key] = self._capture(launches)
        elif self.backend == "driver":
            graph.replay(resolved.handle)
        elif stream is None:
            graph.replay()
        else:
            with torch_stream(self._torch, stream, resolved):
                graph.replay()
        self._steps_run += 1
        return self._buckets[launches.key[0]].views(batch).out

    def load(self, block_tables, seq_lens, tail_slots, positions=None, seal_slots=None, seal_blocks=None,
             fork_src=None, fork_dst=None, stream=None, verify_blocks=None, phase=None) -> DecodeStep | PhaseStep:
        """``step`` without the attention: copy the step's index arrays into its bucket's
        buffer and run its fork copies on ``stream``; returns the :class:`DecodeStep`
        (a :class:`PhaseStep` when checking layers in turn: this step's phase) whose
        ``enqueue(layer, stream)`` an engine captures in its own graph (one per ``key``).
        Same parameters as ``step``; batches above the largest bucket raise. Counts as a
        step (a step with ``phase=None`` takes the next in turn)."""
        indices = self._checked(block_tables, seq_lens, tail_slots, positions, seal_slots, seal_blocks, fork_src,
                                fork_dst, verify_blocks, load=True)
        phase = self._phase(phase)
        launches = self._load(indices, self._resolve(stream), phase=phase)
        self._steps_run += 1
        return launches

    def warmup(self, batch: int, max_seq_len: int, stream=None) -> tuple:
        """Prepare and capture the step for ``batch`` sequences of up to ``max_seq_len``
        tokens ahead of time (as an engine does at start-up); returns its (batch bucket,
        context bucket). Runs the step once with every row padding, which changes nothing
        in the store (once per phase when checking layers in turn)."""
        batch = _positive("batch", batch, MAX_BATCH)
        max_seq_len = int_value("max_seq_len", max_seq_len)
        if batch > self.batch_buckets[-1] or not 1 <= max_seq_len <= self.capacity:
            raise HexcoreInvalidArgumentError(f"warmup: expected batch <= {self.batch_buckets[-1]} and max_seq_len "
                                              f"in [1, {self.capacity}], got {batch}, {max_seq_len}")
        resolved = self._resolve(stream)
        padding = StepIndices(np.zeros((0, 1), np.int32), *(NO_IDS,) * 6, max_seq_len)
        for phase in range(self.phases) if self.phases else (None,):
            launches = self._load(padding, resolved, self._bucket(batch), phase)
            if launches.key not in self._graphs:
                launches.enqueue_all(resolved.numba)
                if self.backend != "eager":
                    self._graphs[launches.key] = self._capture(launches)
        return launches.key[:2]

    # -- internals ------------------------------------------------------------------
    def _checked(self, block_tables, seq_lens, tail_slots, positions, seal_slots, seal_blocks, fork_src, fork_dst,
                 verify_blocks, load: bool = False) -> StepIndices:
        # a step's (``load``: a load's) input checked, as StepIndices
        if verify_blocks is not None and self._verify is None:
            raise HexcoreInvalidArgumentError("verify_blocks: this DecodeGraph was made without verify_sums")
        indices = check_step(self.store, self.max_blocks_per_seq, block_tables, seq_lens, tail_slots, positions,
                             seal_slots, seal_blocks, fork_src, fork_dst, verify_blocks)
        if indices.verify_blocks.shape[0] and self.phases:
            raise HexcoreInvalidArgumentError("verify_blocks: this DecodeGraph checks whole layers in turn "
                                              "(verify_layers); it takes no verify_blocks")
        if indices.verify_blocks.shape[0] > self.max_verify_blocks:
            raise HexcoreInvalidArgumentError(f"verify_blocks: {indices.verify_blocks.shape[0]} ids exceed "
                                              f"max_verify_blocks {self.max_verify_blocks}")
        self._check_bucket_rows(indices, load)
        return indices

    def _check_bucket_rows(self, indices: StepIndices, load: bool) -> None:
        # a batch above the largest bucket runs eagerly (a load refuses it); else its seals and
        # forks must fit its bucket's rows (checked here, before a caller acts on the step)
        batch = indices.seq_lens.shape[0]
        if batch > self.batch_buckets[-1]:
            if load:
                raise HexcoreInvalidArgumentError(f"seq_lens: batch {batch} exceeds the largest bucket "
                                                  f"{self.batch_buckets[-1]} (step() runs such batches eagerly)")
            return
        size = self._bucket_size(batch)
        for name, ids in (("seal_slots", indices.seal_slots), ("fork_src", indices.fork_src)):
            if ids.shape[0] > size:
                raise HexcoreInvalidArgumentError(f"{name}: {ids.shape[0]} entries exceed the batch bucket of {size} "
                                                  "rows")

    def _bucket_size(self, batch: int) -> int:
        # the smallest bucket that holds ``batch`` rows (batch at most the largest bucket)
        return self.batch_buckets[bisect.bisect_left(self.batch_buckets, batch)]

    def _bucket(self, batch: int):
        size = self._bucket_size(batch)
        bucket = self._buckets.get(size)
        if bucket is None:
            bucket = self._buckets[size] = _Bucket(self, size)
        return bucket

    def _load(self, indices: StepIndices, resolved, bucket=None, phase=None) -> DecodeStep | PhaseStep:
        # copy a checked step into its bucket's index buffer, run its forks; its launches (of ``phase``)
        bucket = bucket or self._bucket(indices.seq_lens.shape[0])  # (its rows fit: _check_bucket_rows)
        key = (bucket.size, self.context_bucket(indices.longest))
        launches = self._steps.get(key)
        if launches is None:
            launches = self._steps[key] = DecodeStep(self.store, bucket.buffers, key[1], self.scale,
                                                     self._workspace, self.options)
        bucket.staging.upload(indices, bucket.size, launches.width, resolved.handle)
        if indices.fork_src.shape[0]:
            bucket.buffers.fork(indices.fork_src.shape[0]).run(resolved.numba)
        return launches.at(phase)

    def _capture(self, launches):
        if self.backend == "driver":
            if self._capture_stream is None:
                self._capture_stream = cuda.stream()
            return DriverGraph(launches.enqueue_all, self._capture_stream)
        if self._capture_stream is None:
            side = self._torch.cuda.Stream()
            self._capture_stream = (side, cuda.external_stream(side.cuda_stream))
        return TorchGraph(launches.enqueue_all, *self._capture_stream)

    def _resolve(self, stream):
        # the step's stream; with torch driving the graphs, torch's current stream by default
        if stream is None and self._torch is not None:
            return resolve_stream(torch_current_stream())
        return resolve_stream(stream)

    def _overflow_buffers(self, batch: int) -> tuple:
        if self._overflow is None or self._overflow[0].q.shape[1] != batch:
            cfg = self.store.config
            shapes = [(self.num_q_heads,), (cfg.num_kv_heads,), (cfg.num_kv_heads,), (self.num_q_heads,)]
            arrays = StepViews(*(cuda.device_array((cfg.num_layers, batch, h, cfg.head_dim), np.float16)
                                 for (h,) in shapes))
            self._overflow = (arrays, _as_views(self, arrays))
        return self._overflow

    def _eager_step(self, indices: StepIndices, resolved, phase):
        # a batch above the largest bucket: the eager launchers, on exact-size buffers
        tables, seq_lens, tail_slots, seal_slots, seal_blocks, fork_src, fork_dst, _, verify_blocks = indices
        (q, k, v, out), views = self._overflow_buffers(seq_lens.shape[0])
        store, block_size = self.store, self.store.config.block_size
        if fork_src.shape[0]:
            copy_tails(store, fork_src, fork_dst, stream=resolved)
        append(store, k, v, tail_slots, ((seq_lens - 1) % block_size).astype(np.int32), stream=resolved)
        if seal_slots.shape[0]:
            seal(store, seal_slots, seal_blocks, stream=resolved)
        if self._verify is not None:
            self._verify.run_eager(seal_blocks, verify_blocks, resolved)
        checked = self.checked_layers(phase)
        for layer in range(store.config.num_layers):
            paged_decode(q[layer], store, layer, tables, seq_lens, tail_slots, out=out[layer], scale=self.scale,
                         stream=resolved, options=self.options,
                         verify=self._verify.decode_verify if layer in checked else None)
        return views.out


class _Bucket:
    """A batch bucket: its StepBuffers, their staging, and views per batch size."""

    def __init__(self, graph: DecodeGraph, size: int):
        self.size = size
        self.buffers = b = StepBuffers(graph.store, graph.num_q_heads, size, graph.max_blocks_per_seq, graph._verify)
        self.staging = Staging(b.index, graph.store.config.block_size, graph.max_verify_blocks)
        self.arrays = _as_views(graph, StepViews(b.q, b.k, b.v, b.out))
        self._views: dict = {}

    def views(self, batch: int) -> StepViews:
        """The buffers' first ``batch`` rows (cached)."""
        found = self._views.get(batch)
        if found is None:
            found = self._views[batch] = StepViews(*(a[:, :batch] for a in self.arrays))
        return found


def _as_views(graph, arrays: StepViews) -> StepViews:
    """torch views of the buffers when torch drives the graphs, else the arrays."""
    if graph._torch is None:
        return arrays
    return StepViews(*(graph._torch.as_tensor(a, device="cuda") for a in arrays))


def _positive(name: str, value, high: int | None = None) -> int:
    # value as an int in [1, high] (the integer rule of hexcore._checks)
    return as_int(name, value, 1, high)


