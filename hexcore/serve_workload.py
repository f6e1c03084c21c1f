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

from .config import KVCacheConfig

TABLE_ROWS = 997  # rows of the K/V table (prime, so (request, position) spreads over it)


@dataclasses.dataclass(frozen=True)
class Workload:
    """Requests of a serving run: ``arrivals`` (steps, non-decreasing), ``prompt_lens``,
    ``output_lens``: int64 [num_requests] each."""

    arrivals: np.ndarray
    prompt_lens: np.ndarray
    output_lens: np.ndarray

    @property
    def num_requests(self) -> int:
        return len(self.arrivals)


def synthetic_workload(num_requests: int, rng: np.random.Generator, prompt_mean: float, prompt_max: int,
                       output_mean: float, output_max: int, arrivals_per_step: float) -> Workload:
    """Log-normal prompt and output lengths (sigma 0.6, clipped to [1, max]) around their
    means, Poisson arrivals at ``arrivals_per_step`` (exponential gaps, in steps)."""

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
        rng = np.random.default_rng([seed, 1])
        shape = (TABLE_ROWS, cfg.num_layers, cfg.num_kv_heads, cfg.head_dim)
        self.k = rng.standard_normal(shape, np.float32).astype(np.float16)
        self.v = rng.standard_normal(shape, np.float32).astype(np.float16)

    @staticmethod
    def rows(req_id: int, positions: np.ndarray) -> np.ndarray:
        return (req_id * 7919 + positions * 104729) % TABLE_ROWS

    def span(self, req_id: int, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """K, V of positions [start, stop): float16 [L, n, H, D], C-contiguous."""
        rows = self.rows(req_id, np.arange(start, stop))
        return (np.ascontiguousarray(self.k[rows].transpose(1, 0, 2, 3)),
                np.ascontiguousarray(self.v[rows].transpose(1, 0, 2, 3)))


def exact_attention(q: np.ndarray, keys: np.ndarray, values: np.ndarray, scale: float) -> np.ndarray:
    """float64 attention of one layer: q [Hq, D]; keys, values [n, H, D] -> [Hq, D]."""
    group = q.shape[0] // keys.shape[1]
    k64, v64 = keys.astype(np.float64), values.astype(np.float64)
    out = np.empty(q.shape)
    for hq in range(q.shape[0]):
        s = k64[:, hq // group] @ q[hq].astype(np.float64) * scale
        p = np.exp(s - s.max())
        out[hq] = p / p.sum() @ v64[:, hq // group]
    return out
