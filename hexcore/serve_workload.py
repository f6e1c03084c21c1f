"""The synthetic workload a serving run serves, and the exact attention it is checked against.

There is no model: a token's K/V is a row of a fixed random table chosen by (request,
position) (:class:`TokenTable`), so a recomputed prefix has the same K/V as the first time
and the exact reference of any sequence can be rebuilt (:func:`exact_attention`). Requests
arrive over time with prompt and output lengths drawn from log-normal distributions
(:func:`synthetic_workload`).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ._checks import INT_LIMIT, as_int, positive_real
from .config import KVCacheConfig
from .errors import HexcoreInvalidArgumentError

TABLE_ROWS = 997  # rows of the K/V table (prime, so (request, position) spreads over it)
MAX_TOKENS = 2**31 - 1  # a prompt or an output: at most what one sequence can hold
MAX_REQUESTS = 2**24  # a synthetic workload's requests (its arrays are drawn at once)


@dataclasses.dataclass(frozen=True)
class Workload:
    """Requests of a serving run: ``arrivals`` (steps >= 0, non-decreasing), ``prompt_lens``,
    ``output_lens`` (tokens, in [1, MAX_TOKENS]): int64 [num_requests] each (integer arrays
    or lists are converted). Anything else raises HexcoreInvalidArgumentError naming the
    field and the first bad entry."""

    arrivals: np.ndarray
    prompt_lens: np.ndarray
    output_lens: np.ndarray

    def __post_init__(self) -> None:
        object.__setattr__(self, "arrivals", _int_array("arrivals", self.arrivals, 0, INT_LIMIT - 1))
        for name in ("prompt_lens", "output_lens"):
            array = _int_array(name, getattr(self, name), 1, MAX_TOKENS)
            if array.shape != self.arrivals.shape:
                raise HexcoreInvalidArgumentError(f"{name}: expected {self.arrivals.shape[0]} entries (one per "
                                                  f"arrival), got {array.shape[0]}")
            object.__setattr__(self, name, array)
        late = np.flatnonzero(np.diff(self.arrivals) < 0)
        if late.size:
            i = int(late[0]) + 1
            raise HexcoreInvalidArgumentError(f"arrivals: expected non-decreasing steps, arrivals[{i}] = "
                                              f"{self.arrivals[i]} < arrivals[{i - 1}] = {self.arrivals[i - 1]}")

    @property
    def num_requests(self) -> int:
        return len(self.arrivals)


def synthetic_workload(num_requests: int, rng: np.random.Generator, prompt_mean: float, prompt_max: int,
                       output_mean: float, output_max: int, arrivals_per_step: float) -> Workload:
    """Log-normal prompt and output lengths (sigma 0.6, clipped to [1, max]) around their
    means, Poisson arrivals at ``arrivals_per_step`` (exponential gaps, in steps).

    ``num_requests`` an int in [1, MAX_REQUESTS], ``rng`` a numpy Generator, the means and
    ``arrivals_per_step`` positive finite numbers, the maxima ints in [1, MAX_TOKENS]; else
    HexcoreInvalidArgumentError naming the argument and its value."""
    num_requests = as_int("num_requests", num_requests, 1, MAX_REQUESTS)
    if not isinstance(rng, np.random.Generator):
        raise HexcoreInvalidArgumentError(f"rng: expected a numpy.random.Generator, got {type(rng).__name__}")
    prompt_mean, output_mean = positive_real("prompt_mean", prompt_mean), positive_real("output_mean", output_mean)
    arrivals_per_step = positive_real("arrivals_per_step", arrivals_per_step)
    prompt_max, output_max = as_int("prompt_max", prompt_max, 1, MAX_TOKENS), as_int("output_max", output_max, 1,
                                                                                     MAX_TOKENS)

    def lengths(mean, high):
        drawn = rng.lognormal(math.log(mean) - 0.18, 0.6, num_requests)
        return np.clip(np.rint(drawn), 1, high).astype(np.int64)

    prompts, outputs = lengths(prompt_mean, prompt_max), lengths(output_mean, output_max)
    arrivals = np.floor(np.cumsum(rng.exponential(1.0 / arrivals_per_step, num_requests))).astype(np.int64)
    return Workload(arrivals - arrivals[0], prompts, outputs)


class TokenTable:
    """The K/V of token (request, position): rows of two fixed float16 tables
    ``[TABLE_ROWS, L, H, D]`` (standard normal)."""

    def __init__(self, cfg: KVCacheConfig, seed: int):
        if not isinstance(cfg, KVCacheConfig):
            raise HexcoreInvalidArgumentError(f"cfg: expected KVCacheConfig, got {type(cfg).__name__}")
        rng = np.random.default_rng([as_int("seed", seed, low=0), 1])
        shape = (TABLE_ROWS, cfg.num_layers, cfg.num_kv_heads, cfg.head_dim)
        self.k = rng.standard_normal(shape, np.float32).astype(np.float16)
        self.v = rng.standard_normal(shape, np.float32).astype(np.float16)

    @staticmethod
    def rows(req_id: int, positions: np.ndarray) -> np.ndarray:
        return (req_id * 7919 + positions * 104729) % TABLE_ROWS

    def span(self, req_id: int, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """K, V of positions [start, stop): float16 [L, n, H, D], C-contiguous (ints: ``req_id``
        >= 0, ``0 <= start <= stop <= MAX_TOKENS``; HexcoreInvalidArgumentError otherwise)."""
        req_id = as_int("req_id", req_id, low=0)
        stop = as_int("stop", stop, 0, MAX_TOKENS)
        rows = self.rows(req_id, np.arange(as_int("start", start, 0, stop), stop))
        return (np.ascontiguousarray(self.k[rows].transpose(1, 0, 2, 3)),
                np.ascontiguousarray(self.v[rows].transpose(1, 0, 2, 3)))


def _int_array(name: str, value, low: int, high: int) -> np.ndarray:
    """``value`` (an integer ndarray, list or tuple) as int64 ``[n]`` with entries in ``[low, high]``."""
    array = np.asarray(value) if isinstance(value, (np.ndarray, list, tuple)) else None
    if array is None or array.ndim != 1 or not (array.dtype.kind in "iu" or array.size == 0):
        shown = f"{array.dtype} array of shape {array.shape}" if array is not None else type(value).__name__
        raise HexcoreInvalidArgumentError(f"{name}: expected a 1-D integer array, got {shown}")
    bad = np.flatnonzero((array < low) | (array > high))
    if bad.size:
        raise HexcoreInvalidArgumentError(f"{name}[{bad[0]}] = {array[bad[0]]} is outside [{low}, {high}]")
    return array.astype(np.int64)


def exact_attention(q: np.ndarray, keys: np.ndarray, values: np.ndarray, scale: float) -> np.ndarray:
    """float64 attention of one layer: q [Hq, D]; keys, values [n, H, D] -> [Hq, D] (real
    arrays, ``n >= 1``, ``Hq`` a multiple of ``H``; ``scale`` a positive finite number;
    HexcoreInvalidArgumentError naming the argument otherwise)."""
    _check_attention_shapes(q, keys, values)
    scale = positive_real("scale", scale)
    group = q.shape[0] // keys.shape[1]
    k64, v64 = keys.astype(np.float64), values.astype(np.float64)
    out = np.empty(q.shape)
    for hq in range(q.shape[0]):
        s = k64[:, hq // group] @ q[hq].astype(np.float64) * scale
        p = np.exp(s - s.max())
        out[hq] = p / p.sum() @ v64[:, hq // group]
    return out


def _check_attention_shapes(q, keys, values) -> None:
    """:func:`exact_attention`'s arrays: real ``q [Hq, D]``, ``keys``/``values [n >= 1, H, D]``, ``Hq % H == 0``."""
    for name, x, ndim in (("q", q, 2), ("keys", keys, 3), ("values", values, 3)):
        if not isinstance(x, np.ndarray) or x.ndim != ndim or x.dtype.kind not in "fiu":
            shown = f"{x.dtype} array of shape {x.shape}" if isinstance(x, np.ndarray) else type(x).__name__
            raise HexcoreInvalidArgumentError(f"{name}: expected a real {ndim}-D array, got {shown}")
    n, heads, dim = keys.shape
    if values.shape != keys.shape or n == 0 or q.shape[1] != dim or heads == 0 or q.shape[0] % heads:
        raise HexcoreInvalidArgumentError(f"q, keys, values: expected [Hq, D], [n >= 1, H, D] twice with Hq a multiple "
                                          f"of H, got {q.shape}, {keys.shape}, {values.shape}")
