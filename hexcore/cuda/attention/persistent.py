"""Persistent checkpoint-and-yield decode: ``persistent_decode`` and ``PersistentDecode``.

One long attention launch (a 128k context at large batch) can hold every SM for tens of
milliseconds, and a GPU with a kernel-time watchdog kills a launch that runs too long. This
decode runs in *slices*, each a launch that ends within a time budget.

The work is the decode kernel's items, run in slices by the kernels of
``persistent_kernels.py`` (which describes the protocol); a finished item's partial is the
checkpoint, and the queue cursor the resume point. Where a call's eager first slice holds
one CTA an item, the call is one launch of ``oneshot_kernel`` (a *one-launch call*). A plan
resets its state and merge counters (a reset launch) before a call only after a call was cut
short or left by bare slices (its own mark, ``_mid_call``, and the workspace's record for
the counters, which another plan may share) and, with ``count_items``, before every call.

A call the item model predicts to finish within ``ITEM_SHARE`` of its budget is one launch
of ``oneshot_kernel`` over every item even where they outnumber the resident CTAs (a *wide*
one-launch call, ``DecodeOptions.wide_one_launch``): the hardware schedules the items, as it
does the grid decode's, and no slice protocol runs around them.

Host side: ``persistent_decode`` (and ``PersistentDecode.run``) enqueue slices and read the
state back until the queue is drained, so they synchronise with the stream (a one-launch
call reads nothing back and waits for the stream).
``PersistentDecode.enqueue(layer, slices)`` enqueues a fixed number of slices and reads
nothing back: capture-safe (a CUDA graph of a fixed number of slices); a slice that finds
the queue drained returns at once, and ``stats()`` says afterwards whether the slices were
enough (``drained``). See docs/persistent.md.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from numba import cuda

from ...errors import HexcoreInvalidArgumentError
from ..._checks import as_int, real_value, shown
from ..arrays import checked_layer, device_only
from ..device import SIMULATOR
from ..streams import resolve_stream
from . import launcher
from .kernel import GRID_REGISTERS
from .options import DecodeOptions
from .persistent_kernels import (DONE, EAGER, FIRST, LAST, LAUNCH, LOG_WORDS, MAX_LOGGED, ONESHOT, SHOT, STATE_WORDS,
                                 oneshot_kernel, persistent_kernel, reset_kernel)
from .shape import THREADS, DecodeShape

MAX_BUDGET_US = 1_000_000.0  # half the 2 s watchdog of a display GPU, room for the one-item overrun
READ_BYTES_PER_US = 4.4e6  # HBM read rate the item-size model assumes (4.4 TB/s, measured on the H200)
ITEM_SHARE = 0.25  # items are sized to at most this share of the budget (by that model)
REGISTERS_PER_SM = 65536  # the register file of an SM (sm_50 through sm_90)


class BudgetError(HexcoreInvalidArgumentError):
    """A time budget that is not a number in (0, MAX_BUDGET_US] or is shorter than one work item."""


class ItemTimes(NamedTuple):
    """A one-launch call's clock readings per item (``PersistentDecode.item_times``):
    ``starts`` and ``ends`` int64 ``[items]`` (``%globaltimer`` ns, queue order: split fastest)
    and ``splits``, the splits of each (sequence, KV head, head group)."""

    starts: np.ndarray
    ends: np.ndarray
    splits: int


class PersistentStats(NamedTuple):
    """What one persistent decode call did.

    ``launches``: slices launched (a slice that found the queue drained counts); ``yields``:
    slices that ended with work left in the queue; ``items``: work items of the call;
    ``items_per_launch``, ``launch_us``: per logged slice, the items it took and its span by
    ``%globaltimer`` (its first CTA's start to its last CTA's end; after a one-launch call
    followed by a bare ``launches`` slice, row 0 is that call's CTA 0's own view); ``longest_launch_us``,
    ``longest_item_us``: maxima over the call; ``latest_take_us``: per logged slice, how long
    after its start its last item was taken (below ``budget_us``: the protocol's
    invariant, except in an eager first slice, ``DecodeOptions.eager_first``, and a wide
    one-launch call, ``DecodeOptions.wide_one_launch``); ``drained``: every item was taken (always
    true after ``run``); ``item_counts``: int32 ``[items]``, how often each item was taken
    (with ``count_items``, else None).
    """

    launches: int
    yields: int
    items: int
    items_per_launch: tuple
    launch_us: tuple
    longest_launch_us: float
    longest_item_us: float
    latest_take_us: tuple
    budget_us: float
    drained: bool
    item_counts: np.ndarray | None


_workspace = launcher.Workspace()  # its own: an abandoned call's counters never reach paged_decode's


def registers_keeping(ctas_per_sm: int) -> int:
    """The most registers a thread (a multiple of 8, the allocation unit, at most 255) that
    still let ``ctas_per_sm`` CTAs of ``THREADS`` threads share an SM's register file: 168
    for 3, 128 for 4, 255 for 1 or 2."""
    return min(launcher.UNCAPPED_REGISTERS, REGISTERS_PER_SM // (max(1, ctas_per_sm) * THREADS) // 8 * 8)


class PersistentDecode:
    """``paged_decode`` in slices of at most ``budget_us`` microseconds each (plus one item;
    an eager first slice: see ``DecodeOptions.eager_first``; a wide one-launch call, whose
    bound rests on the item model: ``DecodeOptions.wide_one_launch``).

    Same arguments as ``DecodePlan`` (device arrays or CUDA tensors that keep their
    addresses; their contents may change between runs), plus ``budget_us``: a slice's time
    budget, a number in (0, 1e6] and at least the model's time of one item (else
    :class:`BudgetError`). ``count_items`` makes every slice count the items it takes
    (``stats().item_counts``). ``options.ctas_per_sm`` sets the slice grid (resident CTAs
    per SM; default: the compiled kernel's occupancy); ``options.dependent_launch`` makes the
    slices programmatic dependent launches (by default on sm_90+ with the raw launch path, as
    ``DecodePlan``'s decode).
    """

    def __init__(self, q, store, block_tables, seq_lens, tail_slots, budget_us, max_seq_len: int | None = None,
                 out=None, scale: float | None = None, options: DecodeOptions | None = None,
                 count_items: bool = False, workspace: launcher.Workspace | None = None):
        device_only(q=q, block_tables=block_tables, seq_lens=seq_lens, tail_slots=tail_slots, out=out)
        self.budget_us = checked_budget(budget_us)
        self.options = launcher.resolved_options(options)
        self._inputs = (q, store, block_tables, seq_lens, tail_slots)
        self._scale, self._max_seq_len, self._count = scale, max_seq_len, checked_count_items(count_items)
        self._workspace = launcher.checked_workspace(workspace, _workspace)
        launch, self.out = launcher.decode_launch(q, store, 0, block_tables, seq_lens, tail_slots, out, scale,
                                                  max_seq_len, self.options, self._workspace)
        self._mid_call = False  # True while this plan's state may hold a call left mid-way
        self._torch = next((a for a in (q, block_tables, seq_lens, tail_slots, self.out)
                            if type(a).__module__.startswith("torch")), None)
        self._layers: dict = {}
        self._first = FIRST | (EAGER if eager_first(self.options) else 0)  # a call's first slice
        self.resets = 0  # reset launches so far (after a call cut short, with count_items, or bare slices)
        self._log = cuda.to_device(np.zeros(LOG_WORDS * MAX_LOGGED, np.int64))
        self._counts = cuda.to_device(np.zeros(1, np.int32))
        shape = self._shape(store)
        self._sized, cap = self._size(launch, store, shape)
        # a call whose eager first slice holds one CTA an item is that one launch (ONESHOT),
        # over the grid kernel's grid: (splits, KV heads * head groups, batch); so is a wide one
        # (``_wide_call``), whose slices (a multi-slice ``enqueue``) keep the resident grid
        self._wide = self._wide_call()
        self._oneshot = self._wide or (bool(self._first & EAGER) and self._sized[1] == self._sized[4])
        self._oneshot_kernel = self._one_launch_kernel(shape, cap) if self._oneshot else None
        self._oneshot_grid = (self._sized[3], *launch.grid[1:])
        # the owed list (one word per CTA of the slice grid) and a one-launch call's starts
        # and ends (one word each per item: that call's grid is the items, ``_sized[4]``, which
        # a wide call's are past the slice grid, ``_sized[1]``). Every plan has the records'
        # words: where a caller replays bare slices in a graph (which marks nothing) and the
        # next call appends to a stale owed list, the overflow lands there and not past the
        # array (``begin_slice`` does not bound the list)
        records = self._sized[4] if self._oneshot else self._sized[1]
        self._state = cuda.to_device(np.zeros(STATE_WORDS + 3 * records, np.int64))
        batch, num_q_heads, head_dim = self.out.shape
        heads = launch.grid[1] * batch  # merge counters: (sequence, KV head, head group)
        self._partials = self._workspace.get(batch * num_q_heads, self._sized[3], head_dim, heads)
        if self._count:
            self._counts = cuda.to_device(np.zeros(self.num_items, np.int32))

    def _size(self, launch, store, shape):
        """((kernel, grid, split_blocks, splits, num_items, call_us), the kernel's register cap): the grid
        kernel's split choice, cut to items of at most ITEM_SHARE of the budget by the
        READ_BYTES_PER_US model, at the register cap of the grid launch
        (``launcher.register_cap``: uncapped where that launch fits one wave of the uncapped
        kernel: B=1, and FP16 only where that wave keeps its split count or leaves short items
        unsplit, ``ctas_per_sm`` unset; on the H200, thirty-first session, B=1 32/8 32k FP16 was
        1.062x the grid decode's time capped at 128 and 1.009x uncapped, and at B=64, items past
        one wave, 1.01-1.45x uncapped against 1.00-1.05x capped). Uncapped, the slice kernel
        takes more registers than the grid kernel (its own work: INT2 187 and FP16 188 at D=128
        G=4 against 156 / 166), two CTAs an SM against three; where its items then outnumber its
        resident CTAs it is compiled at ``registers_keeping`` the grid kernel's CTAs per SM
        instead (168 for three), so they fit one round as the grid launch's did (H100,
        fifty-first session: at B=1 128k INT2 59.5 -> 47.8 us, FP16 198.5 -> 190.7 us; where the
        items fit, at B=1 32k, the cap cost FP16 3.5% and INT4 and INT2 1.5-1.6%, so it is not
        taken there)."""
        o = self.options
        cap = launcher.register_cap(launch, shape, o)
        sized = self._fit(launch, store, shape, cap)
        if cap == launcher.UNCAPPED_REGISTERS and sized[4] > sized[1]:
            # the items would take two rounds where the grid launch took one wave: the slice
            # kernel's own work takes it past the grid kernel's registers and CTAs per SM
            cap = registers_keeping(launcher.launch_ctas_per_sm(launch, o))
            sized = self._fit(launch, store, shape, cap)
        return sized, cap

    def _wide_call(self) -> bool:
        """Whether a call is one launch over every item, however many the resident CTAs (the
        slice grid) are: with ``wide_one_launch`` on (``wide_one_launch``), where the item
        model's time of the whole call, ``call_us`` (``_fit``), is at most ``ITEM_SHARE`` of the
        budget. Its CTAs check no budget, so the launch's bound rests on that model, not the
        clock: it keeps within the budget while the items take up to 1 / ITEM_SHARE times the
        model's time."""
        call_us = self._sized[5]
        return wide_one_launch(self.options) and call_us <= ITEM_SHARE * self.budget_us

    def _shape(self, store) -> DecodeShape:
        """The decode shape of this plan's store and query heads."""
        cfg = store.config
        return DecodeShape(cfg.kv_dtype.bits, cfg.num_kv_heads, cfg.head_dim, cfg.block_size,
                           self.out.shape[1] // cfg.num_kv_heads, cfg.group_size)

    def _one_launch_kernel(self, shape, cap):
        """The one-launch call's kernel (``oneshot_kernel``) at the slice kernel's register
        cap ``cap`` (``_size``; None: ``GRID_REGISTERS``), whose occupancy made the call one
        launch: it takes no more registers than the slice kernel, so its CTAs fit as theirs did."""
        o = self.options
        return oneshot_kernel(shape, GRID_REGISTERS if cap is None else cap, o.l2_prefetch,
                              o.joint_softmax, self._count, launcher.dependent_launches(o))

    def _fit(self, launch, store, shape, cap):
        """``_size`` at register cap ``cap``, and the item model's time of the whole call in
        us: its rounds of ``resident`` CTAs times the time of an item of ``split_blocks``
        blocks (a bound: a shorter sequence's items are shorter)."""
        cfg, (splits, ys, batch), o = store.config, launch.grid, self.options
        kernel = persistent_kernel(shape, cap, o.l2_prefetch, o.joint_softmax, self._count, o.persistent_item,
                                   launcher.dependent_launches(o))
        split_blocks = launch.args[18]
        max_virtual = split_blocks * splits
        # (the state's size depends on the grid this sizes: the log, also int64 [n], stands in)
        probe = (*launch.args, self._log, self._log, self._counts, np.int64(1), np.int64(1), np.int64(0))
        resident = max(1, launcher.resident_slots(launcher.Launch(kernel, 1, THREADS, probe), o))
        block_us = cfg.block_bytes_per_layer / cfg.num_kv_heads * resident / READ_BYTES_PER_US
        one_item_us = (1 + o.split_overhead) * block_us
        if self.budget_us < one_item_us:
            raise BudgetError(f"budget_us: {self.budget_us} is below one work item (about {one_item_us:.3g} us for "
                              f"one block of {resident} CTAs sharing {READ_BYTES_PER_US / 1e6:g} TB/s)")
        fits = max(1, int(self.budget_us * ITEM_SHARE / block_us - o.split_overhead))
        if split_blocks > fits:
            split_blocks = fits
            splits = -(-max_virtual // split_blocks)
        items = splits * ys * batch
        call_us = -(-items // resident) * (split_blocks + o.split_overhead) * block_us
        return kernel, min(resident, items), split_blocks, splits, items, call_us

    @property
    def one_launch(self) -> bool:
        """Whether ``run`` and a one-slice ``enqueue`` are one launch that touches no slice
        state (``ONESHOT``): the first slice is eager and its grid is one CTA an item, or the
        call is wide (``DecodeOptions.wide_one_launch``: every item in that launch, even
        past the resident CTAs)."""
        return self._oneshot

    @property
    def num_items(self) -> int:
        """Work items of one call: batch * KV heads * head groups * splits."""
        return self._sized[4]

    def launches(self, layer: int):
        """(reset, slice): the layer's prepared reset launch and its slice launch with no
        flags (a call's later slice), made on first use; ``run`` and ``enqueue`` use them and
        the same slice with other flags (``layer``: an int in ``[0, num_layers)``, numpy
        integers accepted). The reset comes as a :class:`PlanLaunch` (run it, read it; its
        setters would change the plan's own launch), the slice as a :class:`BareSlice`: run
        bare, it may stop with its call undrained, so its ``run`` marks the plan's state and
        merge counters as possibly mid-call, and the next call on either resets first."""
        layer = self._layer(layer)
        return PlanLaunch(self._prepared(layer)[0]), BareSlice(self._slice(layer, 0), self._mark_mid_call)

    def _layer(self, layer) -> int:
        """``layer`` checked (``arrays.checked_layer``) before a call changes any state."""
        if type(layer) is int and layer in self._layers:
            return layer
        return checked_layer(layer, self._inputs[1].config.num_layers)[0]

    def _prepared(self, layer: int):
        """(reset, {flags: slice}) of ``layer``: its reset launch and the slice launches made so far."""
        found = self._layers.get(layer)
        if found is None:
            q, store, tables, lens, slots = self._inputs
            launch, _ = launcher.decode_launch(q, store, layer, tables, lens, slots, self.out, self._scale,
                                               self._max_seq_len, self.options, self._workspace)
            kernel, grid, split_blocks, splits, items, _ = self._sized
            args = list(launch.args)
            args[12:15] = self._partials
            args[18], args[19] = split_blocks, splits
            args += [self._state, self._log, self._counts, np.int64(round(self.budget_us * 1000)), np.int64(items)]
            words = max(self._partials[2].shape[0], self._counts.shape[0], self._state.shape[0])
            reset = launcher.Launch(reset_kernel, min(64, -(-words // 256)), 256,
                                    (self._state, self._log, args[14], self._counts))
            found = self._layers[layer] = (reset.prepare(self.options.launch_path), {},
                                           launcher.Launch(kernel, grid, THREADS, tuple(args)))
        return found

    def _slice(self, layer: int, flags: int):
        """The layer's prepared slice launch with ``flags``."""
        _, slices, launch = self._prepared(layer)
        if flags not in slices:
            kernel, grid = launch.kernel, launch.grid
            if flags & ONESHOT:
                kernel, grid = self._oneshot_kernel, self._oneshot_grid
            slices[flags] = launcher.prepare_decode(launcher.Launch(kernel, grid, launch.block,
                                                                    (*launch.args, np.int64(flags))), self.options)
        return slices[flags]

    def _start_call(self, layer: int, stream) -> None:
        """A reset launch first where one is needed: after this plan's call was cut short or
        its bare slices ran (``BareSlice``: its state may be mid-call), after another plan's
        did so on these merge counters (the workspace's record), and with ``count_items``
        (counts per call)."""
        counters = self._partials[2]
        if self._count or self._mid_call or self._workspace.is_mid_call(counters):
            self._prepared(layer)[0].run(stream)
            self._clear_mid_call()
            self.resets += 1

    def _mark_mid_call(self) -> None:
        """Mark this plan's state and its merge counters as possibly left mid-call."""
        self._mid_call = True
        self._workspace.mark_mid_call(self._partials[2])

    def _clear_mid_call(self) -> None:
        """Clear both marks: this plan's state and merge counters hold no call left mid-way
        (after a reset launch, or a call seen drained)."""
        self._mid_call = False
        self._workspace.clear_mid_call(self._partials[2])

    def enqueue(self, layer: int, slices: int, stream=None) -> None:
        """Enqueue ``slices`` slices (no host read: capture-safe). Whether they were enough
        shows in ``stats().drained``; the last one leaves the queue ready for the next call
        either way."""
        slices = as_int("slices", slices, 1, 1 << 20)
        layer = self._layer(layer)
        stream = resolve_stream(stream, self._torch)
        self._start_call(layer, stream)
        try:
            if slices == 1 and self._oneshot:
                self._slice(layer, self._first | ONESHOT | LAST).run(stream)
                return
            for i in range(slices):
                self._slice(layer, (self._first if i == 0 else 0) | (LAST if i == slices - 1 else 0)).run(stream)
        except BaseException:  # cut short between slices (a launch error, an interrupt): mid-call
            self._mark_mid_call()
            raise

    def run(self, layer: int, stream=None):
        """Decode ``layer`` into ``self.out``: slices until the queue is drained (reads the
        state back: synchronises with the stream; a one-launch call, ``one_launch``, reads
        nothing and waits for the stream). Returns ``self.out``."""
        layer = self._layer(layer)
        stream = resolve_stream(stream, self._torch)
        self._start_call(layer, stream)
        if self._oneshot:  # one launch, drained by construction: nothing to read back
            self._slice(layer, self._first | ONESHOT | LAST).run(stream)
            self._synchronize(stream)
            return self.out
        self._mark_mid_call()  # until the queue is seen drained
        self._slice(layer, self._first).run(stream)
        rest, items, launched, batch = self._slice(layer, 0), self.num_items, 1, 0
        while True:
            for _ in range(batch):
                rest.run(stream)
            launched += batch
            done = min(items, int(self._read(self._state, stream)[DONE]))
            if done >= items:
                break
            batch = min(64, max(1, math.ceil((items - done) * launched / max(done, 1))))  # at the rate so far
        self._clear_mid_call()
        return self.out

    def stats(self, stream=None) -> PersistentStats:
        """What the last ``run`` or ``enqueue`` did (reads the log back: synchronises)."""
        stream = resolve_stream(stream, self._torch)
        state = self._read(self._state, stream)
        launches = int(state[LAUNCH])
        if state[SHOT]:
            log = self._oneshot_log(state)
        else:
            log = self._read(self._log, stream).reshape(MAX_LOGGED, LOG_WORDS)[:min(launches, MAX_LOGGED)]
        done = np.cumsum(log[:, 2])
        spans = (log[:, 1] - log[:, 0]) / 1e3
        return PersistentStats(
            launches=launches, yields=int((done < self.num_items).sum()), items=self.num_items,
            items_per_launch=tuple(int(n) for n in log[:, 2]), launch_us=tuple(float(s) for s in spans),
            longest_launch_us=float(spans.max(initial=0)), longest_item_us=float(log[:, 3].max(initial=0)) / 1e3,
            latest_take_us=tuple(float(t) / 1e3 if n else 0.0 for t, n in zip(log[:, 4] - log[:, 0], log[:, 2])),
            budget_us=self.budget_us, drained=int(state[DONE]) >= self.num_items,
            item_counts=self._read(self._counts, stream)[:self.num_items] if self._count else None)

    def item_times(self, stream=None) -> ItemTimes | None:
        """Where the last call's time went, item by item, if it was one launch
        (``one_launch``): thread 0's ``%globaltimer`` readings (int64 ns) before and after each
        item, ``starts`` and ``ends`` ``[num_items]`` in queue order (split fastest, so item
        ``i`` is split ``i % splits`` of (sequence, KV head, head group) ``i // splits``). An
        item's end includes its merge where its split was the last of its row to finish.
        None after a call of slices (``stats`` logs those per slice). Reads the state back:
        synchronises."""
        state = self._read(self._state, resolve_stream(stream, self._torch))
        if not state[SHOT]:
            return None
        starts, ends = self._records(state)
        return ItemTimes(starts.copy(), ends.copy(), int(self._sized[3]))

    def _records(self, state):
        """A one-launch call's per-item records (``end_oneshot``): (starts, ends), views of
        ``state`` (the call's grid: one CTA an item)."""
        n = self.num_items
        return state[STATE_WORDS + n:STATE_WORDS + 2 * n], state[STATE_WORDS + 2 * n:STATE_WORDS + 3 * n]

    def _oneshot_log(self, state):
        """A one-launch call's log row from its CTAs' records: the first start, the last end,
        the items, the longest item, the latest start."""
        starts, ends = self._records(state)
        return np.array([[starts.min(), ends.max(), self.num_items, (ends - starts).max(), starts.max()]], np.int64)

    @staticmethod
    def _synchronize(stream):
        """Wait for ``stream``: ``run``'s contract where it reads nothing back."""
        if not SIMULATOR:
            (stream.numba if stream.numba != 0 else cuda.default_stream()).synchronize()

    @staticmethod
    def _read(array, stream):
        host = array.copy_to_host(stream=stream.numba) if not SIMULATOR else array.copy_to_host()
        if not SIMULATOR and stream.numba != 0:
            stream.numba.synchronize()
        return host


class PlanLaunch:
    """A prepared launch that a plan owns and its own calls run, as
    ``PersistentDecode.launches`` hands it out (the reset launch): ``run(stream)`` and what
    the launch tells (``READABLE``: ``dependent``, ``grid``, ``block``, ``cluster``,
    ``as_launch()``...), nothing else: its setters (``set_scalar``, ``set_array``,
    ``rebind``) would change the launch under the plan's own calls (a slice's
    ``split_blocks`` set to 3 gave a relative L2 error of 968 on the simulator).
    ``as_launch()`` gives its kernel and arguments to prepare a copy of one's own."""

    READABLE = frozenset({"dependent", "grid", "block", "cluster", "name", "as_launch", "matches",
                          "max_active_clusters"})

    def __init__(self, launch):
        self._launch = launch

    def run(self, stream=0) -> None:
        """Enqueue the launch on ``stream`` (the prepared launch's ``run``)."""
        self._launch.run(stream)

    def __getattr__(self, name):
        if name not in PlanLaunch.READABLE:
            raise AttributeError(f"{name}: a plan's own launch is not to be changed (its calls run it), only run "
                                 f"or read ({', '.join(sorted(PlanLaunch.READABLE))}); prepare a copy from "
                                 f"as_launch() instead")
        return getattr(self._launch, name)


class BareSlice(PlanLaunch):
    """A plan's later-slice launch as ``PersistentDecode.launches`` hands it out, for a
    caller that drives the slices itself (after the reset launch). ``run(stream)`` enqueues
    it and marks the plan's state and merge counters as possibly mid-call (the slice may
    stop with its call undrained, which no plan can see), so the plan's next ``run`` or
    ``enqueue``, and the next call of any plan on those counters, resets first, and
    ``paged_decode`` or a ``DecodePlan`` on the workspace zeroes them first. So another
    launch on the workspace between two bare slices abandons their call. A graph that
    captures bare slices marks nothing when replayed: run the reset launch before the next
    call. Other attributes as :class:`PlanLaunch`'s."""

    def __init__(self, launch, mark_mid_call):
        super().__init__(launch)
        self._mark_mid_call = mark_mid_call

    def run(self, stream=0) -> None:
        """Enqueue the slice on ``stream`` (the prepared launch's ``run``); marks the plan."""
        self._mark_mid_call()
        self._launch.run(stream)


def persistent_decode(q, store, layer: int, block_tables, seq_lens, tail_slots, budget_us, out=None,
                      scale: float | None = None, max_seq_len: int | None = None, stream=None,
                      options: DecodeOptions | None = None, count_items: bool = False):
    """``paged_decode`` in launches of at most ``budget_us`` microseconds (plus one work item;
    an eager first slice: see ``DecodeOptions.eager_first``; a wide one-launch call, whose
    bound rests on the item model: ``DecodeOptions.wide_one_launch``);
    returns ``(out, PersistentStats)``. Host arrays are checked and copied once, as by
    ``paged_decode``; device arrays are trusted (the kernel clamps bad ids, see kernel.py).

    Parameters are ``paged_decode``'s (``q`` float16 ``[B, num_q_heads, head_dim]``,
    ``block_tables`` int32 ``[B, max_blocks]``, ``seq_lens`` and ``tail_slots`` int32 ``[B]``,
    ``out`` float16 like ``q``), plus ``budget_us``: each launch's time budget (a number in
    (0, 1e6], at least one item's time, else :class:`BudgetError`) and ``count_items`` (see
    :class:`PersistentStats`). Synchronises with the stream (it reads the queue cursor).
    """
    checked_budget(budget_us)
    checked_count_items(count_items)
    options = launcher.resolved_options(options)
    launcher.decode_launch(q, store, layer, block_tables, seq_lens, tail_slots, out, scale, max_seq_len, options,
                           _workspace)  # host arrays are range-checked here, before they are copied
    if isinstance(seq_lens, np.ndarray) and max_seq_len is None:
        max_seq_len = int(seq_lens.max(initial=0))
    q, block_tables, seq_lens, tail_slots = (cuda.to_device(np.ascontiguousarray(a)) if isinstance(a, np.ndarray)
                                             else a for a in (q, block_tables, seq_lens, tail_slots))
    plan = PersistentDecode(q, store, block_tables, seq_lens, tail_slots, budget_us, max_seq_len, out, scale,
                            options, count_items)
    plan.run(layer, stream)
    return plan.out, plan.stats(stream)


def eager_first(options: DecodeOptions) -> bool:
    """Whether a call's first slice is eager: ``options.eager_first``, or where None, on a
    GPU with the slice grid at the kernel's occupancy (``ctas_per_sm`` unset), so that its
    CTAs are resident together and none starts late unless another stream holds SMs."""
    if options.eager_first is not None:
        return options.eager_first
    return not SIMULATOR and options.ctas_per_sm is None


def wide_one_launch(options: DecodeOptions) -> bool:
    """Whether a call may be a wide one-launch call: ``options.wide_one_launch``, or where None,
    on a GPU with ``ctas_per_sm`` unset where the first slice is eager (``eager_first``), which
    checks no budget before its items either: the simulator's tests of slices, a caller who
    sets the slice grid and one who asks for a checked first slice get slices."""
    if options.wide_one_launch is not None:
        return options.wide_one_launch
    return not SIMULATOR and options.ctas_per_sm is None and eager_first(options)


def checked_budget(budget_us) -> float:
    """``budget_us`` as a float in (0, MAX_BUDGET_US], else BudgetError naming the value."""
    value = real_value(budget_us)
    if not (math.isfinite(value) and 0 < value <= MAX_BUDGET_US):
        raise BudgetError(f"budget_us: expected a number of microseconds in (0, {MAX_BUDGET_US:g}], got "
                          f"{shown(budget_us)}")
    return value


def checked_count_items(count_items) -> bool:
    """``count_items`` as a bool (numpy's accepted), else HexcoreInvalidArgumentError naming it."""
    if not isinstance(count_items, (bool, np.bool_)):
        raise HexcoreInvalidArgumentError(f"count_items: expected a bool, got {shown(count_items)}")
    return bool(count_items)
