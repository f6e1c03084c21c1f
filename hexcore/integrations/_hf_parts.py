"""The parts of ``hexcore.integrations.transformers`` below the cache: the model's KV
shape (and what is refused), a cache layer, a prompt's staging, the release criterion,
and the copies between torch tensors and the engine's buffers (torch views on a GPU,
numba arrays on the CUDA simulator)."""

from __future__ import annotations

import numpy as np
import torch
from transformers.cache_utils import CacheLayerMixin
from transformers.generation.stopping_criteria import StoppingCriteria

from .._checks import as_int
from ..errors import HexcoreConfigError, HexcoreInvalidArgumentError

DECODE_HEAD_DIMS = (64, 128)  # what the paged decode kernel serves
FULL_ATTENTION = "full_attention"


# -- the model ---------------------------------------------------------------------------
def _text_config(config):
    getter = getattr(config, "get_text_config", None)
    return getter(decoder=True) if getter is not None else config


def model_kv_shape(config) -> dict:
    """``num_layers``, ``num_kv_heads``, ``num_q_heads``, ``head_dim`` and ``scale`` of a
    transformers config, or HexcoreConfigError for an architecture hexcore cannot serve."""
    text = _text_config(config)
    if getattr(text, "is_encoder_decoder", False):
        raise HexcoreConfigError("config: encoder-decoder models are not supported (hexcore caches decoder "
                                 "self-attention only)")
    layer_types = getattr(text, "layer_types", None)
    other = sorted(set(layer_types or ()) - {FULL_ATTENTION})
    if other:
        raise HexcoreConfigError(f"config.layer_types: hexcore serves full attention only, got {other}")
    for name in ("attention_chunk_size", "attn_logit_softcapping"):
        if getattr(text, name, None) is not None:
            raise HexcoreConfigError(f"config.{name}: {getattr(text, name)!r} is not supported (full, "
                                     f"uncapped attention only)")
    q_heads = int(text.num_attention_heads)
    kv_heads = int(getattr(text, "num_key_value_heads", None) or q_heads)
    head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // q_heads)
    if head_dim not in DECODE_HEAD_DIMS:
        raise HexcoreConfigError(f"config.head_dim: the paged decode serves {DECODE_HEAD_DIMS}, got {head_dim}")
    scalar = getattr(text, "query_pre_attn_scalar", None)
    scale = (scalar if scalar is not None else head_dim) ** -0.5
    return dict(num_layers=int(text.num_hidden_layers), num_kv_heads=kv_heads, num_q_heads=q_heads,
                head_dim=head_dim, scale=scale, sliding_window=_sliding_window(text, layer_types))


def _sliding_window(text, layer_types):
    # the window of a config without layer_types (Mistral-style), None when it never slides
    if layer_types or not getattr(text, "use_sliding_window", True):
        return None
    return getattr(text, "sliding_window", None)


# -- the cache's pieces -----------------------------------------------------------------
class HexcoreLayer(CacheLayerMixin):
    """A layer of a HexcoreCache: what transformers asks of one layer, answered by the cache."""

    is_sliding = False
    is_compileable = False
    is_croppable = True  # HexcoreCache.crop; a cut it cannot make raises

    def __init__(self, cache, layer: int):
        super().__init__()
        self.cache, self.layer, self.is_initialized = cache, layer, True

    def lazy_initialization(self, key_states, value_states) -> None:
        """Nothing to allocate: the Engine holds the store."""

    def update(self, key_states, value_states, *args, **kwargs):
        return self.cache.update(key_states, value_states, self.layer)

    def get_mask_sizes(self, query_length, *args) -> tuple[int, int]:
        return self.cache.get_mask_sizes(query_length, self.layer)

    def get_seq_length(self) -> int:
        return self.cache.get_seq_length(self.layer)

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        """The cache resets all layers at once (HexcoreCache.reset)."""

    def reorder_cache(self, beam_idx) -> None:
        raise HexcoreInvalidArgumentError("reorder_cache: call it on the HexcoreCache, not on one layer")


class Prefill:
    """A prompt on its way into the store: each row's real (unpadded) K/V staged per layer
    as float16 ``[L, n, H, D]``, committed after the last layer: a sequence per row
    (``Engine.admit`` by the row's token ids when the prefix cache is on: its cached whole
    blocks are shared, not stored again; else ``Engine.add``), then ``Engine.prefill``."""

    def __init__(self, cache, batch: int, tokens: int, ids=None):
        self.cache, self.batch, self.tokens, self.ids = cache, batch, tokens, ids
        self.keep = self.k = self.v = None

    def stage(self, layer: int, key, value, mask) -> None:
        if self.keep is None:
            self._start(key, mask)
        for row, index in enumerate(self.keep):
            if index.numel():
                self.k[row][layer] = key[row].index_select(1, index).transpose(0, 1)
                self.v[row][layer] = value[row].index_select(1, index).transpose(0, 1)

    def _start(self, key, mask) -> None:
        real = real_tokens(mask, self.batch, self.tokens, key.device)  # [B, T] bool
        self.keep = [torch.nonzero(real[row]).flatten() for row in range(self.batch)]
        cfg = self.cache.kv_config
        lengths = [int(index.numel()) for index in self.keep]  # one host synchronisation per prompt
        too_long = [n for n in lengths if n >= self.cache.capacity]
        if too_long:
            raise HexcoreInvalidArgumentError(f"prompt: {too_long[0]} tokens leave no room in the cache's longest "
                                              f"row ({self.cache.capacity} tokens; raise max_seq_len)")
        shape = (cfg.num_layers, None, cfg.num_kv_heads, cfg.head_dim)
        self.k = [key.new_empty(shape[:1] + (n,) + shape[2:], dtype=torch.float16) for n in lengths]
        self.v = [key.new_empty(shape[:1] + (n,) + shape[2:], dtype=torch.float16) for n in lengths]

    def _token_ids(self, row: int):
        if self.ids is None:
            return None
        return self.ids[row].index_select(0, self.keep[row]).to("cpu", torch.int32).numpy()

    def commit(self) -> None:
        engine, cache, rows, all_ids = self.cache.engine, self.cache, [], []
        stream = torch.cuda.current_stream(self.k[0].device) if self.k and self.k[0].is_cuda else None
        try:
            for row, (k, v) in enumerate(zip(self.k, self.v)):
                tokens = self._token_ids(row)
                all_ids.append(tokens)
                if tokens is None:
                    rows.append(engine.add())
                    cached = 0
                else:  # the whole prompt was computed: share what is cached, store the rest
                    rows.append(engine.admit(tokens, namespace=cache.namespace, priority=cache.priority,
                                             leave_last=False).seq_id)
                    cached = engine.seq_len(rows[-1])
                    tokens = tokens[cached:]
                if k.shape[1] > cached:  # on torch's stream: the staged tensors were written there
                    engine.prefill(rows[-1], for_engine(k[:, cached:]), for_engine(v[:, cached:]), stream=stream,
                                   tokens=tokens)
        except BaseException:
            for seq in rows:
                engine.finish(seq)
            cache._length = 0
            raise
        cache.rows, cache._journals = rows, [None] * len(rows)
        for row, (k, v, ids) in enumerate(zip(self.k, self.v, all_ids)):
            cache._remember(row, 0, k, v, ids)  # what a crop inside a sealed block stores again
            n = int(k.shape[1])
            if 0 < n < self.tokens and int(self.keep[row][0]) != self.tokens - n:
                cache._block_crops(f"row {row}'s prompt has padding after a real token (right padding)")


def real_tokens(mask, batch: int, tokens: int, device):
    """[B, T] bool: which prompt positions are real tokens, from the attention mask the
    model built (None: no padding; 4D bool or additive float: the last query's row)."""
    if mask is None:
        return torch.ones((batch, tokens), dtype=torch.bool, device=device)
    if not isinstance(mask, torch.Tensor) or mask.dim() != 4:
        raise HexcoreInvalidArgumentError(f"attention_mask: expected None or a 4D tensor, got "
                                          f"{type(mask).__name__}")
    last = mask[:, 0, -1, -tokens:]
    real = last if last.dtype == torch.bool else last == 0
    return real.expand(batch, tokens)


class ReleaseFinished(StoppingCriteria):
    """A stopping criterion that releases the cache rows whose last token is an
    end-of-sequence id (``HexcoreCache.release_finished``); it never stops generation."""

    def __init__(self, cache, eos_token_id):
        ids = eos_token_id if isinstance(eos_token_id, (list, tuple)) else [eos_token_id]
        self.cache, self.eos = cache, torch.tensor([as_int("eos_token_id", i, 0) for i in ids])

    def __call__(self, input_ids, scores, **kwargs):
        done = torch.isin(input_ids[:, -1], self.eos.to(input_ids.device))
        rows = torch.nonzero(done).flatten().tolist()
        if rows and len(self.cache.rows) == input_ids.shape[0]:
            self.cache.release(rows)
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


# -- torch tensors <-> the engine's buffers ------------------------------------------------
def write_buffer(view, tensor) -> None:
    """Copy ``tensor`` into a step buffer ``view`` (converting to float16)."""
    if hasattr(view, "copy_"):
        view.copy_(tensor)
    else:  # the CUDA simulator: a numba array over host memory
        view.copy_to_device(np.ascontiguousarray(tensor.detach().to(torch.float16).cpu().numpy()))


def read_buffer(view, like):
    """A step buffer as a torch tensor on ``like``'s device (a view on a GPU)."""
    if hasattr(view, "copy_"):
        return view
    return torch.from_numpy(view.copy_to_host()).to(like.device)


def engine_view(tensor):
    """A contiguous tensor as an array the Engine reads without converting or copying it
    again: a numba device view of a CUDA tensor's memory, or of a host tensor's on the CUDA
    simulator (whose device arrays are host memory), so that the simulator's calls reuse
    their checks and copy nothing per call, as a GPU's do (a host tensor beside a real GPU:
    a numpy view, copied by each call). Writes to ``tensor`` show through the view."""
    if tensor.is_cuda:
        from numba import cuda

        return cuda.as_cuda_array(tensor)
    from ..cuda.device import SIMULATOR

    if not SIMULATOR:  # a host tensor beside a GPU: the Engine copies it per call
        return tensor.numpy()
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

    return FakeCUDAArray(tensor.numpy())


def for_engine(tensor):
    """A tensor as the Engine takes it (contiguous): CUDA tensors as they are, host tensors
    (the simulator) as numpy arrays."""
    tensor = tensor.contiguous()
    return tensor if tensor.is_cuda else tensor.numpy()
