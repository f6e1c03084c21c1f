"""Prefill over a cached prefix: the new tokens of a sequence attend causally over its
cached prefix (sealed FP16/INT4/INT2 blocks and its FP16 tail, in the store) plus themselves.

Two steps (``prefill_kernels.py``): a gather kernel dequantizes the prefix and copies the
new tokens' K/V into a contiguous FP16 scratch ``[H, prefix_len + n_new, D]``, then

- ``backend="sdpa"``: torch's ``scaled_dot_product_attention`` with a lower-right causal
  mask (``torch.nn.attention.bias.causal_lower_right``) and ``enable_gqa`` (flash or
  cuDNN kernels on tensor cores; torch is imported only here);
- ``backend="numba"``: the extend kernel on CUDA cores (float32), so nothing but numba
  is needed (and the simulator runs it);
- ``backend="auto"`` (default): ``sdpa`` when torch with CUDA is importable on a real
  GPU, else ``numba``.

A prefix cached by ``PagedKVCache.admit`` is whole blocks; a prefix with a partial tail
(a prompt prefilled in chunks, a conversation's next turn) reads ``prefix_len %
block_size`` tokens from the sequence's tail slot. The new tokens are attended exactly
(FP16, as the model computed them); their K/V are stored separately (``append``/``seal``
or ``Engine.prefill``), after this reads the prefix.
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import numpy as np
from numba import cuda

from ..._checks import as_int
from ...errors import HexcoreInvalidArgumentError
from ..arrays import (as_device_array, check_writes, checked, checked_layer, checked_store, device_pointer,
                      is_numba_array)
from ..launch import Launch
from ..store import flat_words
from ..uploads import upload_once
from ..streams import resolve_stream, torch_current_stream, torch_stream, torch_with_cuda
from .launcher import check_q_heads, checked_scale
from .prefill_kernels import (EXTEND_THREADS, GATHER_THREADS, extend_grid, extend_kernel, gather_batch_kernel,
                              gather_grid, gather_kernel)

BACKENDS = ("auto", "sdpa", "numba")

__all__ = ["BACKENDS", "BatchRows", "gather_prefix", "prefill_attention", "prefill_attention_batch", "sdpa_extend",
           "sdpa_extend_batch"]


def gather_prefix(store, layer: int, block_table, prefix_len: int, tail_slot: int | None = None, k_new=None,
                  v_new=None, k_out=None, v_out=None, stream=None):
    """A sequence's cached prefix (and optionally its new tokens) as contiguous float16 K, V.

    Parameters
    ----------
    store : the DeviceKVStore; ``layer`` selects the layer.
    block_table : int32 ``[>= prefix_len // block_size]``: the sequence's sealed block ids
        (host arrays are range-checked over the entries used; device ids out of range give NaN rows).
    prefix_len : cached tokens to gather (an int >= 0).
    tail_slot : the sequence's tail slot, read when ``prefix_len % block_size`` is not 0.
    k_new, v_new : optional float16 ``[n_new, H, D]``: placed after the prefix.
    k_out, v_out : optional float16 ``[H, prefix_len + n_new, D]`` device arrays to write
        (allocated when None).

    Returns ``(k_out, v_out)``: position ``p`` of head ``h`` is ``[h, p]``, sealed blocks
    dequantized (float32, rounded to float16), tail and new tokens as stored.
    """
    cfg = checked_store(store).config
    layer, _ = checked_layer(layer, cfg.num_layers)
    prefix_len, table, slot = _checked_prefix(store, block_table, prefix_len, tail_slot)
    n_new = 0
    if k_new is not None or v_new is not None:
        k_new, v_new, n_new = _checked_new(cfg, k_new, v_new)
    launch_stream = resolve_stream(stream, block_table, k_new, v_new, k_out, v_out)
    shape = (cfg.num_kv_heads, prefix_len + n_new, cfg.head_dim)
    k_out = cuda.device_array(shape, np.float16) if k_out is None else k_out
    v_out = cuda.device_array(shape, np.float16) if v_out is None else v_out
    outs = checked(k_out, "k_out", np.float16, shape, output=True), checked(v_out, "v_out", np.float16, shape,
                                                                            output=True)
    check_writes(store, {"k_out": outs[0], "v_out": outs[1]},  # (the gather writes both: one would overwrite the other)
                 {"k_new": k_new, "v_new": v_new, "block_table": table})
    _gather(store, layer, table, prefix_len, slot, k_new, v_new, *outs, launch_stream)
    return k_out, v_out


def prefill_attention(q, k_new, v_new, store, layer: int, block_table, prefix_len: int,
                      tail_slot: int | None = None, *, out=None, scale: float | None = None, backend: str = "auto",
                      stream=None):
    """Causal attention of ``n_new`` new tokens over a sequence's cached prefix plus themselves.

    Query ``i`` (absolute position ``prefix_len + i``) attends over the ``prefix_len``
    cached positions and new positions ``0 .. i``; query head ``hq`` reads KV head
    ``hq // (num_q_heads // H)`` (GQA/MQA).

    Parameters
    ----------
    q : float16 ``[n_new, num_q_heads, D]``, ``num_q_heads`` a multiple of the store's KV heads.
    k_new, v_new : float16 ``[n_new, H, D]``: the new tokens' keys and values.
    store, layer, block_table, prefix_len, tail_slot : the cached prefix (see :func:`gather_prefix`).
    out : optional float16 ``[n_new, num_q_heads, D]`` device array or CUDA tensor to write;
        allocated when None (a torch tensor when ``q`` is one).
    scale : softmax scale, ``1/sqrt(D)`` by default (a positive finite number).
    backend : ``"auto"``, ``"sdpa"`` or ``"numba"`` (module docstring).
    stream : the stream (``streams.resolve_stream``: torch's current one when an array is a tensor).

    Returns ``out``. Bad arguments raise HexcoreInvalidArgumentError before anything is
    launched. Allocates a scratch of ``2 * H * (prefix_len + n_new) * D`` float16 per call.
    """
    cfg = checked_store(store).config
    layer, _ = checked_layer(layer, cfg.num_layers)
    backend = _checked_backend(backend)
    prefix_len, table, slot = _checked_prefix(store, block_table, prefix_len, tail_slot)
    k_new, v_new, n_new = _checked_new(cfg, k_new, v_new)
    q_in = q
    q = checked(q, "q", np.float16, (n_new, None, cfg.head_dim))
    num_q_heads = q.shape[1]
    check_q_heads(num_q_heads, cfg.num_kv_heads, "q: num_q_heads ")
    scale = checked_scale(scale, cfg.head_dim)
    out_shape = (n_new, num_q_heads, cfg.head_dim)
    if out is None:
        out = _new_like(q_in, out_shape)
    out_dev = checked(out, "out", np.float16, out_shape)
    check_writes(store, {"out": out_dev}, {"q": q, "k_new": k_new, "v_new": v_new, "block_table": table})
    launch_stream = resolve_stream(stream, q_in, k_new, v_new, out)
    if n_new == 0:
        return out
    S = prefix_len + n_new
    if backend == "sdpa":
        _sdpa_path(store, layer, table, prefix_len, slot, (q_in, q), k_new, v_new, (out, out_dev), scale, stream,
                   launch_stream)
        return out
    k_s = cuda.device_array((cfg.num_kv_heads, S, cfg.head_dim), np.float16, stream=launch_stream.numba)
    v_s = cuda.device_array((cfg.num_kv_heads, S, cfg.head_dim), np.float16, stream=launch_stream.numba)
    _gather(store, layer, table, prefix_len, slot, k_new, v_new, k_s, v_s, launch_stream)
    group = num_q_heads // cfg.num_kv_heads
    extend_kernel(cfg.head_dim, group)[extend_grid(n_new, group, cfg.num_kv_heads), EXTEND_THREADS,
                                       launch_stream.numba](q, k_s, v_s, prefix_len, np.float32(scale), out_dev)
    return out


def prefill_attention_batch(q, k_new, v_new, store, layer: int, block_tables, prefix_lens, tail_slots, n_new, *,
                            out=None, scale: float | None = None, backend: str = "auto", stream=None, rows=None):
    """:func:`prefill_attention` of ``B`` sequences at once: one gather launch for all rows
    into a padded scratch, then one attention call (``sdpa``: one masked SDPA call;
    ``numba``: the extend kernel per row).

    Parameters
    ----------
    q : float16 ``[B, n_max, num_q_heads, D]``; k_new, v_new : float16 ``[B, n_max, H, D]``:
        row ``r``'s first ``n_new[r]`` entries are its new tokens, the rest padding.
    block_tables : host int32 ``[B, W]``, ``W >= prefix_lens[r] // block_size`` for every row.
    prefix_lens, tail_slots, n_new : host int32 ``[B]``: cached tokens, tail slot (read when
        a prefix ends inside a tail) and new tokens (at most ``n_max``) of each row.
    out, scale, backend, stream : as in :func:`prefill_attention`; ``out`` is ``[B, n_max,
        num_q_heads, D]``, and its padding rows are zeros (``numba``) or unspecified. Without
        ``out``, a new array (a tensor when ``q`` is one: on the ``sdpa`` path, on torch's
        current stream, SDPA's own output, with no copy).
    rows : a :class:`BatchRows` of this store, ``B`` and ``n_max`` (then ``block_tables``,
        ``prefix_lens``, ``tail_slots`` and ``n_new`` are None): the rows checked and
        copied to the device once, for every layer of a forward. Without it each call
        copies them (host-to-device copies that wait for the GPU's queued work). With it,
        a call that passes the very ``q``, ``k_new``, ``v_new`` (and ``out``) of the rows'
        previous call reuses that call's checks of them (:meth:`BatchRows.reuse`).

    Returns ``out``. Bad arguments raise HexcoreInvalidArgumentError before anything is
    launched. Allocates a scratch of ``2 * B * H * S_max * D`` float16, ``S_max`` the
    longest ``prefix_lens[r] + n_new[r]``.
    """
    cfg = checked_store(store).config
    layer, _ = checked_layer(layer, cfg.num_layers)
    args = _reused(rows, "args", (store, q, k_new, v_new, backend),
                   lambda: _checked_batch_args(cfg, q, k_new, v_new, backend))
    if rows is None:
        rows = BatchRows(store, args.batch, args.n_max, block_tables, prefix_lens, tail_slots, n_new)
    else:
        _check_prepared(rows, store, args.batch, args.n_max, (block_tables, prefix_lens, tail_slots, n_new))
    scale = checked_scale(scale, cfg.head_dim)
    shape = (args.batch, args.n_max, args.num_q_heads, cfg.head_dim)
    out_dev = None if out is None else _reused(rows, "out", (store, args, out),
                                               lambda: _checked_out(store, out, shape, args))
    launch_stream = resolve_stream(stream, q, args.k_new, args.v_new, out)
    if rows.S_max == 0 or args.n_max == 0:
        return _new_like(q, shape) if out is None else out
    if args.backend == "sdpa":
        return _sdpa_batch_path(store, layer, rows, args, (out, out_dev), shape, scale, stream, launch_stream)
    if out is None:  # made here: nothing to check
        out = _new_like(q, shape)
        out_dev = as_device_array(out, "out", output=True)
    _numba_batch_path(store, layer, rows, args, out_dev, scale, launch_stream)
    return out


class BatchArgs(NamedTuple):
    """The checked buffers of a :func:`prefill_attention_batch` call: ``q`` as given and
    ``q_dev`` ``[batch, n_max, num_q_heads, D]`` (its numba view, or ``q`` itself where a
    CUDA tensor is read by SDPA alone), the device ``k_new``, ``v_new`` ``[batch, n_max, H,
    D]``, ``num_q_heads`` and the resolved ``backend``."""

    q: object
    q_dev: object
    k_new: object
    v_new: object
    num_q_heads: int
    backend: str

    @property
    def batch(self) -> int:
        return self.k_new.shape[0]

    @property
    def n_max(self) -> int:
        return self.k_new.shape[1]


def _checked_batch_args(cfg, q, k_new, v_new, backend) -> BatchArgs:
    """``backend``, ``k_new``, ``v_new`` and ``q`` of :func:`prefill_attention_batch` checked, in that order."""
    backend = _checked_backend(backend)
    k_dev = checked(k_new, "k_new", np.float16, (None, None, cfg.num_kv_heads, cfg.head_dim))
    B, n_max = k_dev.shape[0], k_dev.shape[1]
    v_dev = checked(v_new, "v_new", np.float16, (B, n_max, cfg.num_kv_heads, cfg.head_dim))
    q_dev = checked(q, "q", np.float16, (B, n_max, None, cfg.head_dim), view=backend != "sdpa")
    num_q_heads = q_dev.shape[2]
    check_q_heads(num_q_heads, cfg.num_kv_heads, "q: num_q_heads ")
    return BatchArgs(q, q_dev, k_dev, v_dev, num_q_heads, backend)


def _checked_out(store, out, shape: tuple, args: BatchArgs):
    """A given ``out`` of ``shape`` checked, outside the store and apart from what the call
    reads (``args``): its numba view, or itself where a CUDA tensor is written by SDPA alone
    (``args.backend`` ``"sdpa"``)."""
    out_dev = checked(out, "out", np.float16, shape, view=args.backend != "sdpa")
    check_writes(store, {"out": out_dev}, {"q": args.q_dev, "k_new": args.k_new, "v_new": args.v_new})
    return out_dev


def _reused(rows, name: str, given: tuple, check):
    """``check()``, or through a BatchRows ``rows`` its :meth:`BatchRows.reuse`."""
    if isinstance(rows, BatchRows):
        return rows.reuse(name, given, check)
    return check()


def _fingerprint(x):
    """What a check of ``x`` depends on beyond its identity: ``()`` for a numba device array
    (its shape, strides and address are fixed) or a plain object (a store, a backend name,
    None, a BatchArgs); a CUDA tensor's address, shape, strides, dtype, device and
    ``requires_grad``; None (never reused) for a host array, copied to the device by each
    call, or any other array."""
    if isinstance(x, np.ndarray):
        return None
    if is_numba_array(x):
        return ()
    if type(x).__module__.startswith("torch"):
        if not getattr(x, "is_cuda", False):
            return None
        return x.data_ptr(), tuple(x.shape), x.stride(), x.dtype, x.get_device(), x.requires_grad
    return None if hasattr(x, "__cuda_array_interface__") else ()


class BatchRows:
    """The rows of a :func:`prefill_attention_batch` call, checked and copied to the device
    once, so that every layer of a forward reuses them.

    ``store``: the DeviceKVStore; ``batch`` (B) and ``n_max``: the calls' ``k_new.shape[:2]``;
    ``block_tables``, ``prefix_lens``, ``tail_slots``, ``n_new``: as that function takes them
    (host int32), every entry it reads range-checked here (HexcoreInvalidArgumentError).
    Holds the host ``prefix_lens``, ``tail_slots``, ``n_new`` ``[B]``, ``S_max`` (the longest
    ``prefix_lens[r] + n_new[r]``), the device ``tables`` ``[B, W]`` and ``packed``
    ``[3, B]`` (prefix_lens, tail_slots, n_new), both in one copy (``uploads.upload_once``).

    What every layer of a forward shares is also made once, at the first call that needs
    it: the SDPA mask, the gather's scratch (reused by the calls on one stream, each of
    which rewrites all of it; a call on another stream gets its own), the gather's
    prepared launch (reused while the calls pass the same ``k_new``/``v_new`` buffers, the
    layer set per call), the checks of the calls' buffers (:meth:`reuse`) and the zeros the
    ``numba`` path copies into padding rows.
    """

    def __init__(self, store, batch: int, n_max: int, block_tables, prefix_lens, tail_slots, n_new):
        self.store, self.batch, self.n_max = checked_store(store), as_int("batch", batch, 0), as_int("n_max", n_max, 0)
        self.prefix_lens, self.tail_slots, self.n_new, tables = _checked_rows(
            store, self.batch, self.n_max, block_tables, prefix_lens, tail_slots, n_new)
        self.tables, self.packed = upload_once([tables, np.stack([self.prefix_lens, self.tail_slots, self.n_new])])
        self.S_max = int((self.prefix_lens + self.n_new).max()) if self.batch else 0
        self._lengths = self._mask = self._scratch = self._gather = self._zeros = None
        self._checked: dict = {}  # name -> (given, their fingerprints, check's result): reuse()

    def lengths(self, device):
        """torch int64 ``(prefix_lens, n_new)`` on ``device``, copied the first time."""
        if self._lengths is None:
            import torch

            self._lengths = tuple(torch.from_numpy(x.astype(np.int64)).to(device) for x in (self.prefix_lens,
                                                                                             self.n_new))
        return self._lengths

    def mask(self, device):
        """The SDPA mask on ``device``, made the first time: where every row has the same
        prefix and ``n_max`` new tokens (a single row always), torch's lower-right causal
        bias, which materialises nothing and lets SDPA pick its flash kernel; else the
        boolean ``[B, 1, n_max, S_max]`` of :func:`extend_mask`."""
        if self._mask is None:
            if (self.n_new == self.n_max).all() and (self.prefix_lens == self.prefix_lens[0]).all():
                from torch.nn.attention.bias import causal_lower_right

                self._mask = causal_lower_right(self.n_max, self.S_max)
            else:
                self._mask = extend_mask(*self.lengths(device), self.n_max, self.S_max)
        return self._mask

    def scratch(self, stream, kind: str, make):
        """The gather's scratch of ``kind`` (the backend) for calls on ``stream`` (a resolved
        Stream): ``make()`` the first time and whenever either differs from the last call's,
        else the same."""
        key = (kind, _stream_key(stream))
        if self._scratch is None or self._scratch[0] != key:
            self._scratch = (key, make())
        return self._scratch[1]

    def prepared_gather(self, buffers, make):
        """The gather's prepared launch over ``buffers`` (its device arrays ``k_new``, ``v_new``,
        ``k_out``, ``v_out``): ``make().prepare()`` the first time and whenever a buffer's
        address or shape differs from the last call's, else the same (set its layer)."""
        if self._gather is not None and all(a is b for a, b in zip(self._gather[2], buffers)):
            return self._gather[1]  # the very arrays of the last call (a numba array's address is fixed)
        key = tuple((device_pointer(x) or id(x), x.shape) for x in buffers)  # (simulator: no address)
        if self._gather is None or self._gather[0] != key:
            self._gather = (key, make().prepare(), buffers)  # the buffers held: their ids stay theirs
        return self._gather[1]

    def reuse(self, name: str, given: tuple, check):
        """``check()``, the checks named ``name`` of the arguments ``given``; or, when the last
        call of that name passed the very same objects, unchanged, its result again.

        Unchanged means: a numba device array or a plain object (the store, a backend name)
        is the same object; a CUDA tensor is the same object at the same address with the
        same shape, strides, dtype and device. A host array is copied to the device by each
        call, so a call passing one always checks. A failed check raises and keeps nothing.
        One forward's layers pass the same buffers: the first checks, the others reuse."""
        prints = tuple(_fingerprint(x) for x in given)
        if any(p is None for p in prints):
            return check()
        last = self._checked.get(name)
        if last is not None and last[1] == prints and all(a is b for a, b in zip(last[0], given)):
            return last[2]
        result = check()
        self._checked[name] = (given, prints, result)  # the objects held: their ids stay theirs
        return result

    def zeros(self, shape: tuple, stream):
        """A float16 device array of zeros of ``shape`` for the copies on ``stream`` (a
        resolved Stream): copied to the device on that stream the first time and whenever
        either differs from the last call's, else the same."""
        key = (tuple(shape), _stream_key(stream))
        if self._zeros is None or self._zeros[0] != key:
            self._zeros = (key, cuda.to_device(np.zeros(shape, np.float16), stream=stream.numba))
        return self._zeros[1]


def _stream_key(stream):
    """A resolved Stream's key: its handle, or the simulator's stream object's id."""
    return id(stream.numba) if stream.handle is None else int(stream.handle)


def extend_mask(prefix_lens, n_new, n_max: int, S_max: int):
    """Boolean ``[B, 1, n_max, S_max]``: query ``i`` of row ``r`` sees positions ``0 ..
    prefix_lens[r] + i`` when ``i < n_new[r]``; a padding query sees position 0 alone (no
    NaN). ``prefix_lens``, ``n_new``: int tensors ``[B]`` on the mask's device."""
    import torch

    i = torch.arange(n_max, device=prefix_lens.device)[None, :, None]
    p = torch.arange(S_max, device=prefix_lens.device)[None, None, :]
    start, n = prefix_lens[:, None, None], n_new[:, None, None]
    allowed = ((p <= start + i) & (i < n)) | ((i >= n) & (p == 0))
    return allowed[:, None]


def sdpa_extend_batch(q, k, v, prefix_lens, n_new, scale: float | None = None):
    """Causal extend attention of a padded batch with torch SDPA: ``q`` ``[B, n_max, Hq, D]``
    over ``k``, ``v`` ``[B, H, S_max, D]`` (torch tensors, one device), query ``i`` of row
    ``r`` seeing positions ``0 .. prefix_lens[r] + i`` (``prefix_lens``, ``n_new``: int
    tensors ``[B]`` on that device); returns ``[B, n_max, Hq, D]`` (padding rows: the
    attention over position 0 alone)."""
    return _sdpa_masked(q, k, v, extend_mask(prefix_lens, n_new, q.shape[1], k.shape[2]), scale)


def _sdpa_masked(q, k, v, mask, scale):
    import torch.nn.functional as F

    result = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=mask, scale=scale,
                                            enable_gqa=q.shape[2] != k.shape[1])
    return result.transpose(1, 2)


def sdpa_extend(q, k, v, scale: float | None = None):
    """Causal extend attention with torch SDPA: ``q`` ``[n, Hq, D]`` over ``k``, ``v``
    ``[H, S, D]`` (torch tensors, one device), query ``i`` seeing positions ``0 .. S - n + i``;
    returns ``[n, Hq, D]`` (a strided view of SDPA's output)."""
    import torch.nn.functional as F
    from torch.nn.attention.bias import causal_lower_right

    n, num_q_heads, _ = q.shape
    num_kv_heads, S, _ = k.shape
    mask = causal_lower_right(n, S)
    result = F.scaled_dot_product_attention(q.transpose(0, 1).unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0),
                                            attn_mask=mask, scale=scale, enable_gqa=num_q_heads != num_kv_heads)
    return result[0].transpose(0, 1)


# -- the two paths --------------------------------------------------------------------
def _gather(store, layer, table, prefix_len, slot, k_new, v_new, k_out, v_out, stream) -> None:
    if k_out.shape[1]:
        gather_launch(store, layer, table, prefix_len, slot, k_new, v_new, k_out, v_out).run(stream)


def gather_launch(store, layer, table, prefix_len, slot, k_new, v_new, k_out, v_out) -> Launch:
    """The gather kernel's launch over checked device arrays (``gather_prefix`` checks them):
    ``table`` int32 ``[>= prefix_len // block_size]``, ``k_new``, ``v_new`` ``[n_new, H, D]``
    or None, ``k_out``, ``v_out`` ``[H, prefix_len + n_new, D]`` float16. A benchmark times
    the kernel alone through it (``benchmarks/bench_prefill.py``)."""
    cfg = store.config
    total = k_out.shape[1]
    if k_new is None:  # nothing past the prefix: any float16 array serves
        k_new = v_new = k_out
    w = store.words
    meta = w.get("k_meta", w["k_tails"]), w.get("v_meta", w["v_tails"])  # (FP16 stores have none)
    if table.shape[0] == 0:  # no sealed block is read; the kernel still takes an array
        table = _placeholder_table(store)
    return Launch(gather_kernel(cfg), gather_grid(cfg, total), GATHER_THREADS, (
        w["k_codes"], w["v_codes"], *meta, w["k_tails"], w["v_tails"], table, layer, store.num_blocks,
        store.max_seqs, slot, prefix_len, flat_words(k_new), flat_words(v_new), flat_words(k_out), flat_words(v_out),
        total))


def _sdpa_path(store, layer, table, prefix_len, slot, q, k_new, v_new, out, scale, stream, launch_stream) -> None:
    import torch

    cfg = store.config
    (q, q_dev), (out, out_dev) = q, out  # (as given, as a numba device array)
    q, out = (x if isinstance(x, torch.Tensor) else torch.as_tensor(dev, device="cuda")
              for x, dev in ((q, q_dev), (out, out_dev)))
    shape = (cfg.num_kv_heads, prefix_len + q.shape[0], cfg.head_dim)
    with torch_stream(torch, stream, launch_stream):
        k_s = torch.empty(shape, dtype=torch.float16, device=q.device)
        v_s = torch.empty(shape, dtype=torch.float16, device=q.device)
        _gather(store, layer, table, prefix_len, slot, k_new, v_new, cuda.as_cuda_array(k_s),
                cuda.as_cuda_array(v_s), launch_stream)
        out.copy_(sdpa_extend(q, k_s, v_s, scale))


GATHER_LAYER_ARG = 7  # the layer's position among the batch gather kernel's arguments


def _gather_batch(store, layer, rows, k_new, v_new, k_out, v_out, stream) -> None:
    """The batch gather on ``stream`` through ``rows``' prepared launch: checked device
    arrays, ``k_out``, ``v_out`` ``[B, H, S_max, D]``."""
    prepared = rows.prepared_gather((k_new, v_new, k_out, v_out), lambda: _gather_batch_launch(
        store, layer, rows, k_new, v_new, k_out, v_out))
    prepared.set_scalar(GATHER_LAYER_ARG, int(layer))
    prepared.run(stream.numba)


def _gather_batch_launch(store, layer, rows, k_new, v_new, k_out, v_out) -> Launch:
    cfg = store.config
    prefix_lens, tail_slots, n_new = rows.packed[0], rows.packed[1], rows.packed[2]
    B, S_max = k_out.shape[0], k_out.shape[2]
    w = store.words
    meta = w.get("k_meta", w["k_tails"]), w.get("v_meta", w["v_tails"])  # (FP16 stores have none)
    args = (w["k_codes"], w["v_codes"], *meta, w["k_tails"], w["v_tails"], rows.tables, int(layer), store.num_blocks,
            store.max_seqs, tail_slots, prefix_lens, n_new, flat_words(k_new), flat_words(v_new), flat_words(k_out),
            flat_words(v_out), S_max, k_new.shape[1])
    return Launch(gather_batch_kernel(cfg), (gather_grid(cfg, S_max), B), GATHER_THREADS, args)


def _sdpa_batch_path(store, layer, rows, args, out, shape, scale, stream, launch_stream):
    """The gather into the rows' scratch, then one masked SDPA call, on ``launch_stream``
    (torch's work in ``torch_stream``'s context unless that is torch's current stream
    already). ``out``: (as given, as checked), or (None, None): then SDPA's own output is
    returned where ``q`` is a tensor on torch's current stream (a new tensor, as a new
    ``out`` would be, with no copy), else a new ``out`` of ``shape`` is written."""
    import torch

    out, out_dev = out
    q = args.q if isinstance(args.q, torch.Tensor) else torch.as_tensor(args.q_dev, device="cuda")
    current = _on_current_stream(launch_stream)
    direct = out is None and q is args.q and current
    if out is None and not direct:  # made before the launches, on the caller's stream
        out = out_dev = _new_like(args.q, shape)
    target = out if direct or isinstance(out, torch.Tensor) else torch.as_tensor(out_dev, device="cuda")
    scratch = (q.shape[0], store.config.num_kv_heads, rows.S_max, store.config.head_dim)
    with contextlib.nullcontext() if current else torch_stream(torch, stream, launch_stream):
        k_s, v_s, k_view, v_view = rows.scratch(launch_stream, "sdpa", lambda: _sdpa_scratch(torch, scratch, q.device))
        _gather_batch(store, layer, rows, args.k_new, args.v_new, k_view, v_view, launch_stream)
        result = _sdpa_masked(q, k_s, v_s, rows.mask(q.device), scale)
        if direct:
            return result.contiguous()
        target.copy_(result)
    return out


def _sdpa_scratch(torch, shape: tuple, device) -> tuple:
    """Two float16 tensors of ``shape`` on ``device`` for SDPA, then numba views of them for the gather."""
    made = [torch.empty(shape, dtype=torch.float16, device=device) for _ in range(2)]
    return (*made, *(cuda.as_cuda_array(t) for t in made))


def _on_current_stream(stream) -> bool:
    """Whether ``stream`` (a resolved Stream) is torch's current stream."""
    return stream.handle is not None and int(stream.handle) == torch_current_stream()


def _numba_batch_path(store, layer, rows, args, out_dev, scale, launch_stream) -> None:
    """The gather into the rows' scratch, then the extend kernel per row into ``out_dev``
    ``[B, n_max, num_q_heads, D]`` (a padding row's tail: zeros, device to device)."""
    cfg = store.config
    B, n_max = args.batch, args.n_max
    shape = (B, cfg.num_kv_heads, rows.S_max, cfg.head_dim)
    k_s, v_s = rows.scratch(launch_stream, "numba", lambda: tuple(
        cuda.device_array(shape, np.float16, stream=launch_stream.numba) for _ in range(2)))
    _gather_batch(store, layer, rows, args.k_new, args.v_new, k_s, v_s, launch_stream)
    group = args.num_q_heads // cfg.num_kv_heads
    prefix_lens, n_new = rows.prefix_lens, rows.n_new
    for r in range(B):
        n = int(n_new[r])
        if n < n_max:  # padding rows: zeros
            out_dev[r].copy_to_device(rows.zeros(out_dev.shape[1:], launch_stream), stream=launch_stream.numba)
        if n:
            extend_kernel(cfg.head_dim, group)[extend_grid(n, group, cfg.num_kv_heads), EXTEND_THREADS,
                                               launch_stream.numba](
                args.q_dev[r, :n], k_s[r, :, :int(prefix_lens[r]) + n], v_s[r, :, :int(prefix_lens[r]) + n],
                int(prefix_lens[r]), np.float32(scale), out_dev[r, :n])


def _check_prepared(rows, store, batch: int, n_max: int, given) -> None:
    """``rows`` must be a BatchRows of ``store`` for ``batch`` x ``n_max``, the per-call row
    arguments ``given`` all None."""
    if not isinstance(rows, BatchRows):
        raise HexcoreInvalidArgumentError(f"rows: expected a BatchRows or None, got {type(rows).__name__}")
    if any(x is not None for x in given):
        raise HexcoreInvalidArgumentError("rows: given with block_tables, prefix_lens, tail_slots or n_new "
                                          "(pass those as None)")
    if rows.store is not store or (rows.batch, rows.n_max) != (batch, n_max):
        raise HexcoreInvalidArgumentError(f"rows: made for another store or for batch {rows.batch} x n_max "
                                          f"{rows.n_max}, got {batch} x {n_max}")


# -- checks ---------------------------------------------------------------------------
def _checked_prefix(store, block_table, prefix_len, tail_slot):
    """(prefix_len, device table, tail slot or 0)."""
    cfg = store.config
    prefix_len = as_int("prefix_len", prefix_len, low=0)
    num_sealed = prefix_len // cfg.block_size
    length = tuple(getattr(block_table, "shape", ()))
    if len(length) != 1 or length[0] < num_sealed:
        raise HexcoreInvalidArgumentError(
            f"block_table: expected shape (>= {num_sealed},) for prefix_len {prefix_len} (block_size "
            f"{cfg.block_size}), got {length}")
    if isinstance(block_table, np.ndarray):  # range-checked over the entries used; those are copied
        if block_table.dtype != np.int32:
            raise HexcoreInvalidArgumentError(f"block_table: expected dtype int32, got {block_table.dtype}")
        used = block_table[:num_sealed]
        bad = np.flatnonzero((used < 0) | (used >= store.num_blocks))
        if bad.size:
            raise HexcoreInvalidArgumentError(f"block_table[{bad[0]}] = {used[bad[0]]} is outside "
                                              f"[0, {store.num_blocks}) for prefix_len {prefix_len}")
        table = checked(np.ascontiguousarray(used), "block_table", np.int32, (None,), align=4) if num_sealed \
            else _placeholder_table(store)
    else:
        table = checked(block_table, "block_table", np.int32, (None,), align=4)
    if prefix_len % cfg.block_size == 0:
        return prefix_len, table, 0
    if tail_slot is None:
        raise HexcoreInvalidArgumentError(
            f"tail_slot: prefix_len {prefix_len} ends inside a tail (block_size {cfg.block_size}); give the "
            f"sequence's tail slot")
    return prefix_len, table, as_int("tail_slot", tail_slot, low=0, high=store.max_seqs - 1)


def _checked_rows(store, B: int, n_max: int, block_tables, prefix_lens, tail_slots, n_new):
    """Host int32 (prefix_lens, tail_slots, n_new) [B] and tables [B, >= 1] (contiguous, the
    entries not read zeroed) of :func:`prefill_attention_batch`, every entry it reads
    range-checked."""
    cfg = store.config
    arrays = []
    for name, x in (("prefix_lens", prefix_lens), ("tail_slots", tail_slots), ("n_new", n_new)):
        if not isinstance(x, np.ndarray) or x.dtype != np.int32 or x.shape != (B,):
            got = f"{x.dtype} {x.shape}" if isinstance(x, np.ndarray) else type(x).__name__
            raise HexcoreInvalidArgumentError(f"{name}: expected a host int32 array of shape ({B},), got {got}")
        arrays.append(x)
    prefix_lens, tail_slots, n_new = arrays
    for name, x, low, high in (("prefix_lens", prefix_lens, 0, 2**31 - 1 - n_max), ("n_new", n_new, 0, n_max)):
        bad = np.flatnonzero((x < low) | (x > high))
        if bad.size:
            raise HexcoreInvalidArgumentError(f"{name}[{bad[0]}] = {x[bad[0]]} is outside [{low}, {high}]")
    in_tail = np.flatnonzero((prefix_lens % cfg.block_size != 0)
                             & ((tail_slots < 0) | (tail_slots >= store.max_seqs)))
    if in_tail.size:
        r = in_tail[0]
        raise HexcoreInvalidArgumentError(f"tail_slots[{r}] = {tail_slots[r]} is outside [0, {store.max_seqs}) for "
                                          f"prefix_lens[{r}] = {prefix_lens[r]}, which ends inside a tail")
    sealed = prefix_lens // cfg.block_size
    if not isinstance(block_tables, np.ndarray) or block_tables.dtype != np.int32 or block_tables.ndim != 2 \
            or block_tables.shape[0] != B or block_tables.shape[1] < max(int(sealed.max(initial=0)), 1):
        got = f"{block_tables.dtype} {block_tables.shape}" if isinstance(block_tables, np.ndarray) else \
            type(block_tables).__name__
        raise HexcoreInvalidArgumentError(f"block_tables: expected a host int32 array of shape ({B}, >= "
                                          f"{max(int(sealed.max(initial=0)), 1)}), got {got}")
    used = np.arange(block_tables.shape[1])[None, :] < sealed[:, None]
    bad = np.argwhere(used & ((block_tables < 0) | (block_tables >= store.num_blocks)))
    if bad.size:
        r, j = bad[0]
        raise HexcoreInvalidArgumentError(f"block_tables[{r}, {j}] = {block_tables[r, j]} is outside "
                                          f"[0, {store.num_blocks}) for prefix_lens[{r}] = {prefix_lens[r]}")
    return prefix_lens, tail_slots, n_new, np.ascontiguousarray(np.where(used, block_tables, 0), np.int32)


def _checked_new(cfg, k_new, v_new):
    k_new = checked(k_new, "k_new", np.float16, (None, cfg.num_kv_heads, cfg.head_dim))
    n_new = k_new.shape[0]
    v_new = checked(v_new, "v_new", np.float16, (n_new, cfg.num_kv_heads, cfg.head_dim))
    return k_new, v_new, n_new


def _checked_backend(backend) -> str:
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise HexcoreInvalidArgumentError(f"backend: expected one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        return "sdpa" if torch_with_cuda() else "numba"
    if backend == "sdpa" and torch_with_cuda() is None:
        raise HexcoreInvalidArgumentError("backend: 'sdpa' needs torch with CUDA on a GPU (not the simulator); "
                                          "use 'numba'")
    return backend


def _new_like(q, shape):
    if type(q).__module__.startswith("torch"):
        import torch

        return torch.empty(shape, dtype=torch.float16, device=q.device)
    return cuda.device_array(shape, np.float16)


def _placeholder_table(store):
    found = store.constants.get("prefill_table")
    if found is None:
        found = store.constants["prefill_table"] = cuda.to_device(np.zeros(1, np.int32))
    return found
