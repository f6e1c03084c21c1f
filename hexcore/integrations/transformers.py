"""hexcore as the KV cache of a Hugging Face transformers model.

Importing this module registers the attention implementation ``"hexcore"`` (with the
matching ``AttentionMaskInterface`` entry, SDPA's masks), so::

    import hexcore.integrations.transformers  # registers "hexcore"
    from hexcore.integrations.transformers import HexcoreCache

    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="hexcore",
                                             torch_dtype=torch.float16).cuda()
    cache = HexcoreCache(model.config, kv_dtype="int4", max_tokens=65536, max_seqs=8)
    out = model.generate(ids, attention_mask=mask, past_key_values=cache, max_new_tokens=32)

How a ``generate()`` call runs on it (one :class:`hexcore.Engine` per cache):

- **prefill** (the prompt, ``T`` tokens per row, left padding allowed): each layer's
  attention is SDPA over the prompt's own K/V; the real (unpadded) K/V of each row are
  staged, and after the last layer each row's prompt goes into the store with
  ``Engine.prefill`` (append + seal for all layers at once, a tail's worth per launch).
- **decode** (one token per row): layer 0's ``update`` runs the block manager's step
  (``Engine.step``: one njit call, index arrays copied to the device asynchronously); each
  layer writes its K/V and query into the step's buffers and ``EngineStep.attend(layer)``
  enqueues append, seal and paged decode on torch's current stream. No host
  synchronisation per layer.
- **beam search** (``reorder_cache``), ``batch_select_indices`` and
  ``batch_repeat_interleave``: rows map onto ``Engine.fork`` (sealed blocks shared by
  reference, the tail copied with the next step) and ``Engine.finish``; no block copies.
- **more tokens on rows that hold some** (a prompt's later chunks with
  ``prefill_chunk_size``, a generate() that continues a used cache, the uncached rest of
  an admitted prompt): per layer each row's real new tokens attend over what the row
  holds plus themselves (``Engine.prefill_attention``), and are stored after the last
  layer with ``Engine.prefill``.
- **finished rows**: :meth:`HexcoreCache.release` frees a row's blocks (its later
  attention outputs are zeros); :meth:`HexcoreCache.release_finished` is a stopping
  criterion that does it for rows that produced an end-of-sequence token.
- **rows filled outside transformers** (``cache.engine.prefill(seq, k, v)``):
  :meth:`HexcoreCache.adopt` makes those sequences the rows, and the next forward decodes them.

Prefix cache (``HexcoreCache(model, ..., prefix_cache=True)``, kept across generate()
calls): sealed blocks are cached by their token ids, which a forward pre-hook on the model
hands the cache; ``cache.admit(input_ids, attention_mask)`` before a generate() shares
each row's cached prefix, and generate() then runs only the rest of the prompt::

    cache = HexcoreCache(model, kv_dtype="int4", max_tokens=65536, prefix_cache=True)
    for ids in turns:                      # each turn's prompt extends the last one
        cache.admit(ids)                   # -> cached tokens per row
        out = model.generate(ids, past_key_values=cache, max_new_tokens=64)

- **crop** (assisted decoding, ``generate(..., assistant_model=...)``): rows shrink in the
  block manager (``truncate_sequence``); a cut inside a sealed block goes back to the
  block's start and stores the kept tokens again from the row's journal, the float16 K/V
  of its last ``max_rollback`` positions (``_hf_crop.py``).

Refused with a typed error (``HexcoreConfigError`` at construction,
``HexcoreInvalidArgumentError`` at run time): sliding-window, chunked or other non-full
attention layers, encoder-decoder models, softcapped or biased attention, a softmax
scale other than the configured one, head_dim other than 64 or 128, and a ``crop`` deeper
than a row's journal. docs/transformers.md says why.
"""

from __future__ import annotations

import math
import threading

import torch
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.cache_utils import Cache
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

from .._checks import as_int
from ..config import KVCacheConfig, KVDtype
from ..engine import Engine
from ..errors import HexcoreConfigError, HexcoreInvalidArgumentError
from ..host.prefix import DEFAULT_PRIORITY, check_namespace, check_priority
from ..host.tiered import pool_blocks_for
from ..quant import FORMATS, KVFormat
from ._hf_crop import crop as crop_rows
from ._hf_crop import record
from ._hf_parts import HexcoreLayer, Prefill, ReleaseFinished, model_kv_shape, read_buffer, write_buffer
from ._hf_prefix import Extend, admit_batch, install_token_hook

ATTN_IMPLEMENTATION = "hexcore"
PLAIN = tuple(d.value for d in KVDtype)  # kv_dtype names that are not formats by age

_handoff = threading.local()  # update() -> attention function of the same layer: (cache, layer, key)


# -- the cache ---------------------------------------------------------------------------
def format_by_age(kv_dtype):
    """The KVFormat ``kv_dtype`` names when it is a format by age (a ``KVFormat`` or a name
    in ``hexcore.quant.FORMATS`` other than a plain dtype's), else None."""
    if isinstance(kv_dtype, KVFormat):
        return kv_dtype
    if isinstance(kv_dtype, str) and kv_dtype.lower() in FORMATS and kv_dtype.lower() not in PLAIN:
        return FORMATS[kv_dtype.lower()]
    return None


class HexcoreCache(Cache):
    """A transformers ``Cache`` whose keys and values live in a hexcore :class:`~hexcore.Engine`.

    Parameters
    ----------
    config : the model's config (``model.config``), or the model itself (needed for
        ``prefix_cache``); its decoder must be full attention.
    kv_dtype : "fp16", "int4" or "int2": how sealed blocks are stored (tails are FP16); or a
        format by age (``"int4-aged"``, ``"int2-aged"`` or a ``hexcore.quant.KVFormat``,
        ``docs/formats.md``): the Engine then holds a pool per kind of block, sized by
        ``hexcore.host.pool_blocks_for`` for ``max_tokens`` and ``max_seqs``, and runs its
        steps eagerly; the prefix cache, chunked prefill, continued prompts and ``crop``
        are refused with HexcoreConfigError.
    max_tokens : tokens the sealed pool holds, all rows together (blocks of ``block_size``).
    max_seqs : rows at once, forks included (beam search needs ``batch * num_beams``, plus
        the forks of one reorder); each costs one FP16 tail per layer.
    block_size, group_size : hexcore's block size and INT value group (``KVCacheConfig``).
    max_seq_len : longest row (default: what the pool holds, up to 131072).
    options : DecodeOptions for the decode kernel.
    prefix_cache : keep sealed blocks by their token ids and share them with later prompts
        (``Engine(prefix_cache=True)``): build the cache from the model, keep it across
        generate() calls, and call :meth:`admit` before each one so that only the uncached
        rest of the prompt runs through the model.
    namespace, priority : the prefix cache's namespace (e.g. a model or adapter id; blocks
        are shared within one) and eviction priority 0..7 of this cache's requests.
    max_rollback : tokens a :meth:`crop` can remove when the cut falls inside a sealed block
        (assisted decoding's rejected draft tokens): each row keeps the float16 K/V of its
        last ``max_rollback`` positions (plus the rest of their block) from the latest
        forward; 0 keeps none (a crop then cuts inside the open tail or on a block boundary).

    Attributes: ``engine`` (the Engine), ``kv_config`` (its KVCacheConfig), ``rows`` (the
    sequence id of each batch row, -1 for a released row).
    """

    def __init__(self, config, kv_dtype="int4", max_tokens: int = 32768, max_seqs: int = 16, *,
                 block_size: int = 32, group_size: int = 64, max_seq_len: int | None = None, options=None,
                 prefix_cache: bool = False, namespace: int = 0, priority: int = DEFAULT_PRIORITY,
                 max_rollback: int = 256):
        model, config = (config, config.config) if isinstance(config, torch.nn.Module) else (None, config)
        if type(prefix_cache) is not bool:
            raise HexcoreConfigError(f"prefix_cache: expected a bool, got {prefix_cache!r}")
        if prefix_cache and model is None:
            raise HexcoreConfigError("prefix_cache=True: build the cache from the model (HexcoreCache(model, ...)), "
                                     "not its config: the cache reads the token ids of each forward from it")
        self.namespace, self.priority = check_namespace(namespace), check_priority(priority)
        self.max_rollback = as_int("max_rollback", max_rollback, 0)
        shape = model_kv_shape(config)
        block_size = as_int("block_size", block_size, 16, 256)
        max_tokens = as_int("max_tokens", max_tokens, 1)
        fmt = format_by_age(kv_dtype)
        self.kv_config = KVCacheConfig(num_layers=shape["num_layers"], num_kv_heads=shape["num_kv_heads"],
                                       head_dim=shape["head_dim"], block_size=block_size,
                                       kv_dtype="fp16" if fmt else kv_dtype,
                                       group_size=min(as_int("group_size", group_size, 1), shape["head_dim"]))
        blocks, max_seqs = -(-max_tokens // block_size), as_int("max_seqs", max_seqs, 1)
        tiered = dict(format=fmt, pool_blocks=pool_blocks_for(fmt, block_size, blocks, max_seqs)) if fmt else {}
        self.engine = Engine(self.kv_config, 0 if fmt else blocks, max_seqs, shape["num_q_heads"],
                             max_seq_len=max_seq_len, scale=shape["scale"], options=options, prefix_cache=prefix_cache,
                             **tiered)
        self.scale, self.capacity = shape["scale"], self.engine.cache.max_seq_len
        window = shape["sliding_window"]
        if window is not None and window < self.capacity:
            raise HexcoreConfigError(f"config.sliding_window: {window} is shorter than the cache's longest row "
                                     f"{self.capacity}; hexcore serves full attention only (pass max_seq_len <= "
                                     f"{window} or use a config without a sliding window)")
        super().__init__(layers=[HexcoreLayer(self, layer) for layer in range(shape["num_layers"])])
        self.rows: list[int] = []
        self._length = 0  # tokens per row as transformers counts them (padding included)
        self._prefill = None  # the prompt being staged (a Prefill)
        self._step = None  # the decode step in progress (an EngineStep) and its live rows
        self._live = None
        self._extend = None  # new tokens on rows that hold some (an Extend)
        self._ids = None  # the token ids of the coming forward, [B, T] (prefix cache only)
        self._journals: list = []  # per row: its latest positions' K/V for crop (a _hf_crop.Journal), or None
        self._crop_blocked = None  # why a crop cannot map positions onto rows' tokens, None when it can
        if model is not None and prefix_cache:
            install_token_hook(model)

    # -- what transformers asks -------------------------------------------------------
    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Tokens per row, prompt padding included (transformers' positions)."""
        return self._length

    def get_max_length(self, layer_idx: int | None = None) -> int:
        """-1: the cache grows block by block (bounded by ``max_tokens`` and ``max_seq_len``)."""
        return -1

    def get_mask_sizes(self, query_length, layer_idx: int = 0) -> tuple[int, int]:
        """(kv_length, kv_offset) of the mask for ``query_length`` new tokens (an int, or
        the ``cache_position`` tensor of older transformers)."""
        if isinstance(query_length, torch.Tensor):
            query_length = int(query_length.shape[0])
        return self._length + int(query_length), 0

    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        """Take layer ``layer_idx``'s new K/V, ``[B, num_kv_heads, T, head_dim]``.

        A prompt (empty cache) is returned as it is: the attention function runs SDPA over
        it and stages it. More tokens on rows that hold some: returned too; the attention
        function attends over the store plus them. One token per row: written into the
        decode step's buffers; the attention function attends over the store."""
        batch, tokens = int(key_states.shape[0]), int(key_states.shape[2])
        if layer_idx == 0:
            self._begin(batch, tokens, key_states.device)
        if self._step is not None:
            views = self._step.buffers
            rows = self._live
            write_buffer(views.k[layer_idx], key_states[:, :, 0] if rows is None else key_states[rows, :, 0])
            write_buffer(views.v[layer_idx], value_states[:, :, 0] if rows is None else value_states[rows, :, 0])
        _handoff.cache, _handoff.layer, _handoff.key = self, layer_idx, key_states
        return key_states, value_states

    def _begin(self, batch: int, tokens: int, device) -> None:
        # layer 0 of a forward: a prompt, more tokens for rows that hold some, or a decode step
        if self._prefill is not None or self._extend is not None:
            raise HexcoreInvalidArgumentError("update: the prompt's K/V never reached the store (the model must "
                                              "be loaded with attn_implementation='hexcore')")
        ids = self._take_token_ids(batch, tokens)
        if not self.rows:
            self._prefill = Prefill(self, batch, tokens, ids)
        elif batch != len(self.rows):
            raise HexcoreInvalidArgumentError(f"update: batch {batch} differs from the cache's {len(self.rows)} rows")
        elif tokens != 1:
            self._extend = Extend(self, batch, tokens, ids)
        else:
            live = [i for i, seq in enumerate(self.rows) if seq >= 0]
            step_tokens = None if ids is None else ids[:, 0].to("cpu", torch.int32).numpy()[live]
            self._step = self.engine.step([self.rows[i] for i in live], tokens=step_tokens)
            self._live = None if len(live) == batch else torch.tensor(live, dtype=torch.long, device=device)
        self._length += tokens

    def see_token_ids(self, input_ids) -> None:
        """Called by the model's forward pre-hook (prefix cache): the coming forward's
        ``input_ids`` ``[B, T]`` (None: unknown; the rows stop being cached by content)."""
        self._ids = input_ids if self.engine.cache.prefix_cache_enabled else None

    def _take_token_ids(self, batch: int, tokens: int):
        ids, self._ids = self._ids, None
        if ids is None or tuple(ids.shape) != (batch, tokens):
            return None
        return ids

    # -- attention (called by hexcore_attention) ----------------------------------------
    def _attend(self, layer: int, query):
        """Paged decode of layer ``layer`` for ``query`` ``[B, num_q_heads, 1, head_dim]``:
        the output ``[B, 1, num_q_heads, head_dim]`` (zeros for released rows)."""
        step, rows = self._step, self._live
        write_buffer(step.buffers.q[layer], query[:, :, 0] if rows is None else query[rows, :, 0])
        out = read_buffer(step.attend(layer), query).to(query.dtype)
        if layer == self.kv_config.num_layers - 1:
            self._step = self._live = None
        if rows is None:
            return out.unsqueeze(1)
        full = query.new_zeros((query.shape[0], 1, query.shape[1], query.shape[3]))
        full[rows, 0] = out
        return full

    def _extend_rows(self, layer: int, query, key, value, mask):
        try:
            out = self._extend.attend(layer, query, key, value, mask)
        except BaseException:  # nothing was stored yet: the rows stay as they were
            self._length -= self._extend.tokens
            self._extend = None
            raise
        if layer == self.kv_config.num_layers - 1:
            extend, self._extend = self._extend, None
            extend.commit()
        return out

    def _stage_prompt(self, layer: int, key, value, mask) -> None:
        prefill = self._prefill
        if prefill is None:
            raise HexcoreInvalidArgumentError(f"attention: layer {layer} saw a prompt the cache did not expect")
        prefill.stage(layer, key, value, mask)
        if layer == self.kv_config.num_layers - 1:
            self._prefill = None
            prefill.commit()

    # -- rows: beam search, selection, release ------------------------------------------
    def reorder_cache(self, beam_idx) -> None:
        """Row ``i`` continues old row ``beam_idx[i]`` (beam search): a row's first use keeps
        its sequence, later uses fork it (shared blocks), unused rows are freed. Reads
        ``beam_idx`` on the host (one synchronisation per call)."""
        self._reindex([int(i) for i in beam_idx.tolist()])

    def batch_select_indices(self, indices) -> None:
        """Keep the rows ``indices`` (in that order); the others are freed."""
        self._reindex([int(i) for i in torch.as_tensor(indices).tolist()])

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Each row ``repeats`` times in a row (forks: no copies of sealed blocks)."""
        repeats = as_int("repeats", repeats, 1)
        self._reindex([i for i in range(len(self.rows)) for _ in range(repeats)])

    def _reindex(self, order: list) -> None:
        old = self.rows
        bad = [i for i in order if not 0 <= i < len(old)]
        if bad:
            raise HexcoreInvalidArgumentError(f"rows: index {bad[0]} is outside the cache's {len(old)} rows")
        if self._in_forward():
            raise HexcoreInvalidArgumentError("rows: cannot reorder in the middle of a forward pass")
        keep = {old[i] for i in order} - {-1}
        for seq in old:
            if seq >= 0 and seq not in keep:
                self.engine.finish(seq)  # first, so their slots serve the forks below
        seen, rows = set(), []
        for i in order:
            seq = old[i]
            if seq >= 0 and seq in seen:
                seq = self.engine.fork(seq)
            seen.add(old[i])
            rows.append(seq)
        self.rows = rows
        journals = self._journals
        self._journals = [journals[i] if i < len(journals) else None for i in order]

    def release(self, rows) -> None:
        """Free the blocks of batch rows ``rows`` (finished sequences). Their attention
        outputs are zeros from then on (generate() pads what such rows produce)."""
        for row in rows:
            row = as_int("row", row, 0, len(self.rows) - 1)
            if self.rows[row] >= 0:
                self.engine.finish(self.rows[row])
                self.rows[row] = -1
                if row < len(self._journals):
                    self._journals[row] = None

    def release_finished(self, eos_token_id) -> ReleaseFinished:
        """A stopping criterion for ``generate(stopping_criteria=[...])`` that releases each
        row the step it emits ``eos_token_id`` (an int or a list); it never stops anything."""
        return ReleaseFinished(self, eos_token_id)

    def crop(self, max_length: int) -> None:
        """Remove the last positions of every row (assisted decoding's rejected draft tokens).

        ``max_length``: negative removes that many (transformers 5.x); positive is the length
        to keep (the older convention; at least ``get_seq_length()`` removes nothing); 0
        removes nothing. A row's cut inside its open tail or on a block boundary only
        shrinks it (:meth:`hexcore.host.PagedKVCache.truncate_sequence`); a cut inside a
        sealed block goes back to the block's start and stores the kept tokens again from
        the row's journal (``max_rollback``). A cut the cache cannot make (deeper than the
        journal, or into a row's prompt padding) raises HexcoreInvalidArgumentError naming
        ``max_length`` before any row changes; a cache in a format by age raises
        HexcoreConfigError (its blocks cannot be cut back).
        """
        if self.engine.format is not None:
            raise HexcoreConfigError(f"crop: not with a format by age ({self.engine.format.name})")
        crop_rows(self, max_length)

    def _remember(self, row: int, start: int, k, v, ids) -> None:
        # row's positions [start, start + n) were stored from k, v [L, n, H, D] (ids int32 [n] or None)
        self._journals += [None] * (row + 1 - len(self._journals))
        self._journals[row] = record(self._journals[row], start, k, v, ids, self.max_rollback,
                                     self.kv_config.block_size)

    def _block_crops(self, reason: str) -> None:
        """Refuse crops until :meth:`reset` (or :meth:`admit`): a forward put padding after a
        row's real tokens, so positions no longer map onto each row's tokens; ``reason`` says which."""
        if self._crop_blocked is None:
            self._crop_blocked = reason

    def reset(self) -> None:
        """Free every row; the cache is empty (ready for another generate()). With the
        prefix cache on, the rows' sealed blocks stay cached for later prompts."""
        for seq in self.rows:
            if seq >= 0:
                self.engine.finish(seq)
        self.rows, self._length, self._prefill, self._step, self._live = [], 0, None, None, None
        self._extend = self._ids = self._crop_blocked = None
        self._journals = []

    def adopt(self, seq_ids) -> None:
        """Make engine sequences that already hold tokens the cache's rows: the next forward,
        one token per row (a decode step), continues them.

        ``seq_ids``: ``B`` distinct live sequences of ``cache.engine`` holding the same number
        of tokens ``n >= 1``, e.g. filled outside transformers::

            seq = cache.engine.add()
            cache.engine.prefill(seq, k, v)    # float16 [num_layers, n, num_kv_heads, head_dim]
            cache.adopt([seq, ...])            # row i is seq_ids[i]; get_seq_length() == n
            model(ids, past_key_values=cache, position_ids=...)   # ids [B, 1] at position n

        Frees the current rows as :meth:`reset` does (a current row listed in ``seq_ids``
        stays, as that row). The adopted rows have no journal (a :meth:`crop` inside a sealed
        block is refused) and, without the token ids, are not cached by content. Everything
        is checked first (``Engine.live_seq_ids``, then the lengths): a bad value raises
        HexcoreInvalidArgumentError naming it (HexcoreInvalidSequenceError for an id that is
        not live), and so does a call in the middle of a forward; the cache is then unchanged.
        """
        if self._in_forward():
            raise HexcoreInvalidArgumentError("adopt: cannot adopt rows in the middle of a forward pass")
        rows, length = self._adoptable(seq_ids)
        kept = set(rows)
        self.rows = [seq for seq in self.rows if seq not in kept]  # reset() frees the others
        self.reset()
        self.rows, self._length, self._journals = rows, length, [None] * len(rows)

    def _adoptable(self, seq_ids) -> tuple[list, int]:
        """(``seq_ids`` as a list of ints, their common token count), or raise naming the bad value."""
        ids = self.engine.live_seq_ids(seq_ids)
        lengths = [self.engine.seq_len(seq) for seq in ids]
        for i, n in enumerate(lengths):
            if n != lengths[0]:
                raise HexcoreInvalidArgumentError(f"seq_ids[{i}]: sequence {ids[i]} holds {n} tokens, seq_ids[0] "
                                                  f"holds {lengths[0]}; adopted rows must hold the same count")
        if lengths[0] < 1:
            raise HexcoreInvalidArgumentError(f"seq_ids: the sequences hold no tokens; a decode step continues "
                                              f"rows that hold some (got {ids})")
        return ids, lengths[0]

    # -- the prefix cache -----------------------------------------------------------------
    def admit(self, input_ids, attention_mask=None) -> list:
        """Start a generate() of ``input_ids`` from the prefix cache; returns the cached
        tokens of each row (list of ints).

        ``input_ids``: int ``[B, T]`` (or ``[T]``), left padded; ``attention_mask``: 0/1
        ``[B, T]`` or None (no padding) -- what you pass to generate(). Frees the cache's
        rows (as :meth:`reset`), then each row shares its longest cached prefix (whole
        blocks, never the last token): ``get_seq_length()`` becomes that many positions, and
        generate(), given the same ``input_ids`` and mask, runs only the rest through the
        model (transformers' continuation from a filled cache). A batch starts every row at
        one position (:func:`common_cached_length`), so a ragged batch may share less than
        each row has cached. With the prefix cache off this is :meth:`reset` (zeros).
        """
        if self._in_forward():
            raise HexcoreInvalidArgumentError("admit: cannot admit in the middle of a forward pass")
        return admit_batch(self, input_ids, attention_mask)

    def _in_forward(self) -> bool:
        return self._step is not None or self._prefill is not None or self._extend is not None

    @property
    def is_compileable(self) -> bool:
        """False: decode steps run hexcore's own launches (torch.compile cannot trace them)."""
        return False


# -- the attention function --------------------------------------------------------------
def hexcore_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """The ``"hexcore"`` attention implementation (transformers' attention-function signature).

    ``query`` ``[B, num_q_heads, T, D]``, ``key``/``value`` as the cache's ``update``
    returned them. With a HexcoreCache: a prompt is SDPA over its own K/V (then staged
    for the store); a decode step is hexcore's paged decode. Without one (another cache,
    or none): plain SDPA. Returns ``(output [B, T, num_q_heads, D], None)``.
    """
    cache = getattr(_handoff, "cache", None)
    layer = getattr(module, "layer_idx", None)
    if cache is None or getattr(_handoff, "key", None) is not key or _handoff.layer != layer:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    _handoff.cache = _handoff.key = None
    _check_supported(cache, dropout, scaling, kwargs)
    if cache._extend is not None:
        return cache._extend_rows(layer, query, key, value, attention_mask), None
    if cache._step is None:
        out = sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                     **kwargs)
        cache._stage_prompt(layer, key, value, attention_mask)
        return out
    return cache._attend(layer, query), None


def _check_supported(cache: HexcoreCache, dropout, scaling, kwargs) -> None:
    if dropout:
        raise HexcoreInvalidArgumentError(f"attention: dropout {dropout} is not supported (inference only)")
    if scaling is not None and not math.isclose(float(scaling), cache.scale, rel_tol=1e-6):
        raise HexcoreInvalidArgumentError(f"attention: softmax scale {scaling} differs from the cache's "
                                          f"{cache.scale} (from the config)")
    for name in ("softcap", "position_bias", "sinks", "s_aux"):
        if kwargs.get(name) is not None:
            raise HexcoreInvalidArgumentError(f"attention: {name} is not supported by hexcore's paged decode")
    window = kwargs.get("sliding_window")
    if window is not None and window < cache.capacity:
        raise HexcoreInvalidArgumentError(f"attention: sliding_window {window} is not supported (full attention)")


def register() -> None:
    """Register ``"hexcore"`` with transformers' attention and mask interfaces (done on import)."""
    AttentionInterface.register(ATTN_IMPLEMENTATION, hexcore_attention)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)


register()
