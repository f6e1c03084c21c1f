"""The parts of ``hexcore.integrations.transformers`` that let a forward add tokens to rows
that already hold some: the token-id hook, admission of a batch by its token ids (the
prefix cache), and ``Extend``, the attention of new tokens over what a row holds.

transformers hands a cache K/V, never token ids. The prefix cache needs them (a sealed
block is found again by its tokens), so a cache built with ``prefix_cache=True`` from the
model installs a forward pre-hook on it (:func:`install_token_hook`) that gives the
forward's ``input_ids`` to the HexcoreCache the forward uses.
"""

from __future__ import annotations

import numpy as np
import torch

from ..errors import HexcoreInvalidArgumentError
from ..host.prefix import as_tokens
from ._hf_parts import engine_view, for_engine, read_buffer, real_tokens

_HOOK_ATTRIBUTE = "_hexcore_token_hook"
CACHE_KWARGS = ("past_key_values", "cache")  # the forward's cache keyword: transformers 5.17, and 5.24


# -- token ids of each forward ------------------------------------------------------------
def install_token_hook(model) -> None:
    """Give each forward's ``input_ids`` ``[B, T]`` to the HexcoreCache it runs on (once per model)."""
    if getattr(model, _HOOK_ATTRIBUTE, None) is None:
        setattr(model, _HOOK_ATTRIBUTE, model.register_forward_pre_hook(_record_token_ids, with_kwargs=True))


def _record_token_ids(module, args, kwargs):
    cache = next((kwargs[name] for name in CACHE_KWARGS if kwargs.get(name) is not None), None)
    if hasattr(cache, "see_token_ids"):
        ids = kwargs.get("input_ids", args[0] if args else None)
        cache.see_token_ids(ids if isinstance(ids, torch.Tensor) and ids.dim() == 2 else None)


# -- admission of a batch -----------------------------------------------------------------
def prompt_rows(input_ids, attention_mask=None) -> tuple:
    """``(width, [(pads, tokens int32 [n]) per row])`` of a left-padded batch.

    ``input_ids``: int ``[B, T]`` (or ``[T]``); ``attention_mask``: 0/1 ``[B, T]`` or None (no
    padding). A row must be zeros then ones, with at least one real token.
    """
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() not in (1, 2) or input_ids.is_floating_point():
        raise HexcoreInvalidArgumentError(f"input_ids: expected an int tensor [B, T], got "
                                          f"{getattr(input_ids, 'dtype', type(input_ids).__name__)} "
                                          f"{tuple(getattr(input_ids, 'shape', ()))}")
    ids = input_ids.reshape(-1, input_ids.shape[-1]).cpu().numpy()
    if attention_mask is None:
        mask = np.ones(ids.shape, dtype=np.int64)
    else:
        mask = torch.as_tensor(attention_mask)
        mask = mask.reshape(-1, mask.shape[-1] if mask.dim() else 1).cpu().numpy()
        if mask.shape != ids.shape:
            raise HexcoreInvalidArgumentError(f"attention_mask: expected shape {ids.shape} like input_ids, got "
                                              f"{mask.shape}")
    rows = []
    for row, (tokens, real) in enumerate(zip(ids, mask)):
        pads = int(np.count_nonzero(real == 0))
        if pads == len(real):
            raise HexcoreInvalidArgumentError(f"attention_mask: row {row} is all padding (no token to compute)")
        if not (np.all(real[:pads] == 0) and np.all(real[pads:] == 1)):
            first = int(np.flatnonzero(real[pads:] != 1)[0]) + pads if np.any(real[pads:] != 1) else pads
            raise HexcoreInvalidArgumentError(f"attention_mask: row {row} is not left padding then real tokens "
                                              f"(value {real[first]} at position {first}); generate() needs left "
                                              f"padding")
        rows.append((pads, as_tokens(f"input_ids[{row}]", tokens[pads:])))
    return ids.shape[1], rows


def common_cached_length(width: int, pads: list, hits: list, block_size: int) -> int:
    """The longest ``c < width`` that every row can start from: row ``i`` (``pads[i]``
    padding positions, ``hits[i]`` cached real tokens, whole blocks) either is all padding
    up to ``c`` or holds exactly ``c - pads[i]`` cached tokens, a whole number of blocks.

    transformers gives every row of a batch the same past length, so a batch starts from
    the longest such ``c`` (for one row or unpadded rows: their shortest hit)."""
    candidates = {0} | {p + m * block_size for p, h in zip(pads, hits) for m in range(h // block_size + 1)}

    def fits(c: int) -> bool:
        return all(c <= p or ((c - p) % block_size == 0 and c - p <= h) for p, h in zip(pads, hits))

    return max(c for c in candidates if c < width and fits(c))


def admit_batch(cache, input_ids, attention_mask=None) -> list:
    """``HexcoreCache.admit``: free ``cache``'s rows, then start each row of the batch from
    its cached prefix, all at the batch's common start position; cached tokens per row."""
    width, rows = prompt_rows(input_ids, attention_mask)
    engine, block = cache.engine, cache.kv_config.block_size
    if len(rows) > engine.cache.max_seqs:
        raise HexcoreInvalidArgumentError(f"input_ids: {len(rows)} rows exceed the cache's max_seqs "
                                          f"{engine.cache.max_seqs}")
    cache.reset()
    hits = [min(engine.cache.match_prefix(tokens, namespace=cache.namespace), (len(tokens) - 1) // block * block)
            for _, tokens in rows]  # never the last token: the model computes its logits
    start = common_cached_length(width, [pads for pads, _ in rows], hits, block)
    if start == 0:  # the prompt runs whole (its commit still shares cached blocks: memory, not compute)
        return [0] * len(rows)
    seqs = []
    try:
        for (pads, tokens), hit in zip(rows, hits):
            share = max(0, start - pads)
            if share != hit:  # only the blocks the batch's start position covers
                tokens = tokens[:share]
            seqs.append(engine.admit(tokens, namespace=cache.namespace, priority=cache.priority,
                                     leave_last=share == hit).seq_id)
    except BaseException:
        for seq in seqs:
            engine.finish(seq)
        raise
    cache.rows, cache._length, cache._journals = seqs, start, [None] * len(seqs)
    return [engine.seq_len(seq) for seq in seqs]


# -- new tokens over what rows hold ---------------------------------------------------------
def _real(x, index, tokens: int):
    """``x`` ``[heads, tokens, D]`` at the real positions ``index`` (sorted, distinct): ``x``
    itself when every position is real, else a gathered copy."""
    return x if index.numel() == tokens else x.index_select(1, index)


class Extend:
    """``tokens`` new positions per row on rows that hold some already (a prompt's later
    chunk, the uncached rest of an admitted prompt, a continuation).

    Per layer the live rows' real new tokens attend over what each row holds plus
    themselves, causally, all rows in one call (``Engine.prefill_attention_batch``: one
    gather launch, one attention call, over ``Engine.batch_rows`` made at the first layer,
    into buffers made at the first layer: the rows' prepared gather and scratch serve every
    layer); their K/V are staged as float16 ``[L, n, H, D]`` per row and stored after the
    last layer (``Engine.prefill``, with their token ids when the prefix cache tracks the
    row). Padding positions and released rows get zeros.

    When every row is live and every new position real (no padding: a single row, or an
    unpadded batch), a layer costs the same few torch ops whatever the batch: the query and
    K/V copied into the engine's buffers and the K/V into the staging, one op each for all
    rows, and the engine's output returned as it is (no zeros, no copies back).
    """

    def __init__(self, cache, batch: int, tokens: int, ids):
        self.cache, self.batch, self.tokens, self.ids = cache, batch, tokens, ids
        self.keep = self.k = self.v = self.token_ids = self.rows = None
        self.live = self.stage = self.staged = None  # [(row, seq, index)], the engine's buffers, [B, L, T, H, D] K/V
        self.whole = False  # every row live, every new position real
        self.seqs = self.lengths = None

    def attend(self, layer: int, query, key, value, mask):
        """Output ``[B, T, num_q_heads, D]`` of layer ``layer`` (``query`` ``[B, Hq, T, D]``,
        ``key``/``value`` ``[B, H, T, D]``, ``mask`` transformers' 4D mask or None)."""
        if self.keep is None:
            self._start(query, key, mask)
        if not self.live:
            return query.new_zeros((self.batch, self.tokens, query.shape[1], query.shape[3]))
        q, k, v, q_arg, k_view, v_view = self.stage
        if self.whole:  # all rows at once
            q.copy_(query.transpose(1, 2))
            k.copy_(key.transpose(1, 2))
            v.copy_(value.transpose(1, 2))
            self.staged[0][:, layer] = k
            self.staged[1][:, layer] = v
        else:  # each live row's real tokens, padded to the longest
            for j, (row, _, index) in enumerate(self.live):
                n = self.lengths[j]
                self.k[row][layer] = _real(key[row], index, self.tokens).transpose(0, 1)
                self.v[row][layer] = _real(value[row], index, self.tokens).transpose(0, 1)
                q[j, :n] = _real(query[row], index, self.tokens).transpose(0, 1)
                k[j, :n], v[j, :n] = self.k[row][layer], self.v[row][layer]
        stream = torch.cuda.current_stream(query.device) if query.is_cuda else None  # pending fork copies too
        got = read_buffer(self.cache.engine.prefill_attention_batch(self.seqs, layer, q_arg, k_view, v_view, None,
                                                                    stream=stream, rows=self.rows), query)
        if self.whole:  # [B, T, Hq, D] already
            return got if got.dtype == query.dtype else got.to(query.dtype)
        out = query.new_zeros((self.batch, self.tokens, query.shape[1], query.shape[3]))
        for j, (row, _, index) in enumerate(self.live):
            if self.lengths[j] == self.tokens:  # every position real (no padding): in order
                out[row].copy_(got[j])
            else:
                out[row].index_copy_(0, index, got[j, :self.lengths[j]].to(out.dtype))
        return out

    def _start(self, query, key, mask) -> None:
        # layer 0: the checks, then every buffer and the engine's rows, made once per forward
        check_held_positions(self.cache, mask, self.batch, self.tokens)
        real = real_tokens(mask, self.batch, self.tokens, key.device)
        keep = [torch.nonzero(real[row]).flatten() for row in range(self.batch)]
        counts = [int(index.numel()) for index in keep]  # one host synchronisation per forward
        cfg, engine = self.cache.kv_config, self.cache.engine
        for row, seq in enumerate(self.cache.rows):
            if seq >= 0 and engine.seq_len(seq) + counts[row] >= self.cache.capacity:
                raise HexcoreInvalidArgumentError(
                    f"input: row {row} would hold {engine.seq_len(seq) + counts[row]} tokens, which leaves no room "
                    f"in the cache's longest row ({self.cache.capacity} tokens; raise max_seq_len)")
        live = [(row, seq, keep[row]) for row, seq in enumerate(self.cache.rows) if seq >= 0 and counts[row]]
        lengths = [counts[row] for row, _, _ in live]
        whole = len(live) == self.batch and all(n == self.tokens for n in lengths)
        H, D = cfg.num_kv_heads, cfg.head_dim
        if whole:  # one staging of every row's K/V, row r's [L, T, H, D] contiguous
            self.staged = tuple(key.new_empty((self.batch, cfg.num_layers, self.tokens, H, D), dtype=torch.float16)
                                for _ in range(2))
            k_rows, v_rows = list(self.staged[0]), list(self.staged[1])
        else:
            k_rows = [key.new_empty((cfg.num_layers, n, H, D), dtype=torch.float16) for n in counts]
            v_rows = [torch.empty_like(k) for k in k_rows]
        token_ids = None
        if self.ids is not None:
            token_ids = [self.ids[row].index_select(0, i).to("cpu", torch.int32).numpy() for row, i in enumerate(keep)]
        stage = rows = None
        if live:  # the engine's buffers (zeros once: each layer rewrites the rows' real tokens only) and rows
            n_max = max(lengths)
            q = query.new_zeros((len(live), n_max, query.shape[1], D), dtype=torch.float16)
            k, v = (key.new_zeros((len(live), n_max, H, D), dtype=torch.float16) for _ in range(2))
            stage = (q, k, v, for_engine(q) if q.is_cuda else engine_view(q), engine_view(k), engine_view(v))
            rows = engine.batch_rows([seq for _, seq, _ in live], np.array(lengths, np.int32), n_max)
        self.keep, self.k, self.v, self.token_ids, self.live, self.lengths = keep, k_rows, v_rows, token_ids, live, \
            lengths
        self.whole, self.stage, self.rows, self.seqs = whole, stage, rows, [seq for _, seq, _ in live]

    def commit(self) -> None:
        """Store every row's new K/V (after the last layer); a failure empties the cache."""
        engine, cache = self.cache.engine, self.cache
        stream = torch.cuda.current_stream(self.k[0].device) if self.k and self.k[0].is_cuda else None
        try:
            for row, seq in enumerate(cache.rows):
                n = int(self.k[row].shape[1])
                if seq < 0:
                    continue
                start = engine.seq_len(seq)
                if n:
                    tokens = None if self.token_ids is None else self.token_ids[row]
                    engine.prefill(seq, for_engine(self.k[row]), for_engine(self.v[row]), stream=stream,
                                   tokens=tokens)
                    cache._remember(row, start, self.k[row], self.v[row], tokens)
                if n < self.tokens and (start or (n and int(self.keep[row][0]) != self.tokens - n)):
                    cache._block_crops(f"row {row} has padding after a real token (its {n} real tokens of a "
                                      f"forward of {self.tokens} positions follow {start} it held)")
        except BaseException:
            cache.reset()
            raise


def check_held_positions(cache, mask, batch: int, tokens: int) -> None:
    """Refuse a forward whose attention mask hides a token some row of ``cache`` holds.

    hexcore stores only a row's real tokens and cannot hide one later, so the positions
    before this forward's ``tokens`` new ones that ``mask`` (transformers' 4D mask or None)
    hides must be exactly the ones the row never stored (its padding): as many as those
    positions minus the tokens the row holds. A hidden held token (say a padding id among
    the ids of an earlier turn, which generate() masks when it is given no mask) raises
    HexcoreInvalidArgumentError naming the row; attending to it anyway would silently
    give other results than transformers' own caches. One host read of the mask."""
    before = cache.get_seq_length() - tokens
    if mask is None or before <= 0:
        return
    cached = mask[:, 0, -1, :before].expand(batch, before)
    hidden = (~cached if cached.dtype == torch.bool else cached != 0).sum(dim=1).tolist()
    for row, seq in enumerate(cache.rows):
        if seq < 0:  # a released row holds nothing
            continue
        held = cache.engine.seq_len(seq)
        if hidden[row] != before - held:
            raise HexcoreInvalidArgumentError(
                f"attention_mask: row {row} hides {hidden[row]} of the {before} positions before its new tokens, "
                f"but the cache holds {held} tokens there ({before - held} padding); hexcore cannot hide a token "
                f"it holds (pass generate() the mask given to admit(), with 1 for every real token)")
