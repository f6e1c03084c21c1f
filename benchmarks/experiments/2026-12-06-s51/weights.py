"""How the tensor-core head digest makes a step's weights from a lane's words (issue 14).

Not part of hexcore. ``hexcore/host/tensor_digest.py`` makes lane L's two B words of step s
as ``base_j ^ (f(r_j, s) & 0xFEFEFEFE)``. This script puts four choices of ``f`` through
``tensor_digest.dependence`` (exact: zero weight vectors, parallel pairs of one row's bytes,
dependent triples) on the decode's usual layouts:

- ``multiply``: ``r * (2 s + 1)`` (a multiply-add a word);
- ``random odd``: ``r * K_s``, ``K_s`` a random odd constant a step;
- ``add``: ``r + K_s``;
- ``rotate``: ``rotl(r, 2 s + 1)`` (what hexcore uses: a funnel shift a word).

Run: ``PYTHONPATH=. python benchmarks/experiments/2026-12-06-s51/weights.py`` (numpy only).
"""

import time

import numpy as np

import hexcore.host.tensor_digest as td
from hexcore.host.checksum import MASK32, head_term


def lane_weights_with(step_word):
    def lane_weights(chunk, steps):
        m = np.array([head_term(32 * chunk + L, td.DENSE_SALT) for L in range(32)], np.uint64)
        base = np.stack([m | td.ODD_BYTES, ((m * td.DENSE_C1) & MASK32) | td.ODD_BYTES], axis=1)
        r = np.stack([(m * td.DENSE_C2) & MASK32, (m * td.DENSE_C3) & MASK32], axis=1)
        made = np.array([step_word(r, s) for s in range(steps)], np.uint64) & MASK32
        return (base[None] ^ (made & td.EVEN_BYTES)).astype(np.uint32)

    return lane_weights


def rotl(r, n):
    n = np.uint64(n)
    return ((r << n) | (r >> (np.uint64(32) - n))) & MASK32


RANDOM = [head_term(1000 + s, 0) | 1 for s in range(td.MAX_STEPS)]
CHOICES = {"multiply": lambda r, s: r * np.uint64(2 * s + 1), "random odd": lambda r, s: r * np.uint64(RANDOM[s]),
           "add": lambda r, s: r + np.uint64(RANDOM[s]), "rotate": lambda r, s: rotl(r, 2 * s + 1)}
LAYOUTS = [(32, 128, 4, 2, True), (32, 128, 2, 2, True), (64, 128, 4, 2, False), (128, 128, 4, 2, False),
           (32, 128, 4, 8, False), (16, 64, 4, 1, True)]


def main():
    kept = td.lane_weights
    try:
        for name, step_word in CHOICES.items():
            td.lane_weights = lane_weights_with(step_word)
            for bs, d, bits, ng, triples in LAYOUTS:
                t0 = time.time()
                found = td.dependence(bs, d, bits, ng, triples=triples)
                note = "" if triples else " (triples not checked)"
                print(f"{name:10s} INT{bits} D={d} BS={bs} NG={ng}: {found}{note} ({time.time() - t0:.1f} s)",
                      flush=True)
    finally:
        td.lane_weights = kept


if __name__ == "__main__":
    main()
