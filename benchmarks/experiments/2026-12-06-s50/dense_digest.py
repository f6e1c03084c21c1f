"""The tensor-core head digest with dense weights: a CPU prototype and its detection (issue 14).

Not part of hexcore. The forty-ninth session's prototype (``../2026-12-06-s49/tensor_digest.py``)
gave each byte of a head one weight in one of the 8 accumulator columns (a sparse B of the
integer mma ``mma.sync.m16n8k32``, .u8 A x .s8 B -> .s32): single flips and two flips feeding
one entry are caught for certain, but three flips feeding one entry escaped 5 times in 20,000.
Here B is dense: byte ``k`` of step ``s`` weighs into all 8 columns, ``W[s, k, :]``, random
nonzero int8 values. It costs the mma the same (a B fragment is two registers a lane either
way) and changes what it can miss:

- A change of one row's bytes moves that row's 8 entries by ``sum_i delta_i W[s_i, k_i, :]``,
  exactly (each term is below 2**15 in size, so no sum of fewer than 2**16 terms wraps mod
  2**32). Rows are independent: a change escapes only if every row it touches cancels alone.
- So a change touching at most ``m`` bytes of some row is caught for certain when every ``m``
  of that row's weight vectors (``steps * 32`` of them, 8 long) are linearly independent. This
  script checks that exhaustively for m = 2 and m = 3 (every pair not parallel, every triple of
  rank 3, by exact integer Gram determinants), then samples larger sets; for m <= 8 dependence
  among random vectors is a measure-zero accident that the check would show.
- Beyond that, a change that moves the entries is caught unless the 128 fmix32-mixed entries
  sum the same (about 2**-32).

Run: ``python benchmarks/experiments/2026-12-06-s50/dense_digest.py [WORDS] [SEED]``
(numpy only; INT4 D=128 BS=32 is 1216 words a head, INT2 704).
"""

import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "2026-12-06-s49"))
from tensor_digest import KS, M32, ROWS, STEP, fmix, head_trials  # noqa: E402 (mixer, placement, damage)


def weights(steps, seed=11):
    """W: int64 [steps, 32, 8], nonzero int8 values (the B operand of each step)."""
    rng = np.random.default_rng(seed)
    w = rng.integers(1, 128, (steps, 32, 8)) * rng.choice([-1, 1], (steps, 32, 8))
    return w.astype(np.int64)


def entries(words, w):
    """C: int64 [16, 8] mod 2**32 of a head's words (uint32, padded to whole steps)."""
    steps = w.shape[0]
    padded = np.zeros(steps * STEP, np.uint32)
    padded[:words.size] = words
    data = padded.view(np.uint8).reshape(steps, 512).astype(np.int64)
    a = np.zeros((steps, 16, 32), np.int64)
    a[:, ROWS, KS] = data
    return np.einsum("srk,skc->rc", a, w) & M32


KEYS = (np.arange(128, dtype=np.uint64) * np.uint64(0x9E3779B1) + np.uint64(0x7F4A7C15)) & np.uint64(M32)


def digest(words, w):
    x = (entries(words, w).reshape(-1).astype(np.uint64) + KEYS) & np.uint64(M32)
    return int(fmix(x).sum() & np.uint64(M32))


def independence(w, samples=200_000, seed=5):
    """Exact checks on one row's weight vectors V = W reshaped [steps * 32, 8]: pairs never
    parallel, triples always rank 3 (Gram determinants, exact in int64: entries below 2**17,
    a 3 x 3 determinant below 2**53); then ``samples`` random sets of 4..8 by float rank."""
    v = w.reshape(-1, 8)
    n = len(v)
    g = v @ v.T  # exact (|entry| <= 8 * 127**2)
    i, j = np.triu_indices(n, 1)
    parallel = int(np.sum(g[i, i] * g[j, j] - g[i, j] ** 2 == 0))
    dependent3 = 0
    for a in range(n):  # triples a < b < c
        b, c = np.triu_indices(n - a - 1, 1)
        b, c = b + a + 1, c + a + 1
        det = (g[a, a] * (g[b, b] * g[c, c] - g[b, c] ** 2) - g[a, b] * (g[a, b] * g[c, c] - g[b, c] * g[a, c])
               + g[a, c] * (g[a, b] * g[b, c] - g[b, b] * g[a, c]))
        dependent3 += int(np.sum(det == 0))
    rng = np.random.default_rng(seed)
    low_rank = 0
    for m in range(4, 9):
        sets = np.array([rng.choice(n, m, replace=False) for _ in range(samples // 5)])
        low_rank += int(np.sum(np.linalg.matrix_rank(v[sets].astype(np.float64)) < m))
    return n, n * (n - 1) // 2, parallel, n * (n - 1) * (n - 2) // 6, dependent3, samples // 5 * 5, low_rank


def main(n_words=1216, seed=0):
    t, w, steps = head_trials(n_words, seed, weights, digest)
    print(f"seed {seed}, {n_words} words ({steps} mma steps a warp), dense int8 weights")
    t0 = time.time()
    n, pairs, parallel, triples, dependent3, sets, low_rank = independence(w)
    print(f"a row's {n} weight vectors: {pairs} pairs, {parallel} parallel; {triples} triples, {dependent3} "
          f"of rank < 3; {sets} random sets of 4-8, {low_rank} dependent ({time.time() - t0:.0f} s)")
    print(f"single-bit flips: {n_words * 32}, missed {t.single_flips_missed()}")
    for flips in (2, 3, 4, 8):
        print(f"{flips} flips in one row: 20000 trials, missed {t.missed(20000, lambda b: t.same_row(b, flips))}")
    print(f"3 flips in one row and k % 8 (the sparse digest's weak case): 20000 trials, missed "
          f"{t.missed(20000, lambda b: t.same_entry(b, 3))}")
    t.common()


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:]))
