"""A head digest the tensor cores could compute: a CPU prototype and its detection (issue 14).

Not part of hexcore. The in-decode check of a sampled INT4/INT2 block costs about 13 SASS
instructions a word (murmur3's fmix32 of every word: benchmarks/RESULTS.md, forty-first
session), so two checked layers of 32 cost 3.9% of a step on the H200 (3% wanted). This
prototype defines a digest whose per-word work is one integer mma (`mma.sync.m16n8k32`,
.u8 A x .s8 B -> .s32) per 128 words a warp, and measures what it detects:

- The head's words (hexcore's head-digest order) in steps of 128 words: word
  ``128 s + 4 L + j`` is lane L's A register j (m16n8k32 fragment: row ``L // 4 + 8 (j % 2)``,
  bytes k ``4 (L % 4) + 16 (j // 2) + 0..3``, little-endian).
- ``B_s[k, c]`` is zero unless ``c == k % 8``; the nonzero weights of one column over all
  steps are distinct odd numbers with random signs (at most 64 per column: 16 steps, 2048
  words a head; INT4 D=128 BS=32 is 1216 words, INT2 704). ``C = sum_s A_s B_s`` (int32 wraps).
- ``digest = sum over the 128 entries e of fmix32(C_e + key(e)) mod 2**32`` (hexcore's mixer
  and index key, once per entry instead of once per word).

Run: ``python benchmarks/experiments/2026-12-06-s49/tensor_digest.py`` (numpy only, ~1 min).
"""

import itertools
import sys

import numpy as np

M32 = 0xFFFFFFFF
STEP = 128  # words an m16n8k32 takes from a warp


def fmix(x):
    x = x.astype(np.uint64)
    x ^= x >> np.uint64(16)
    x = (x * np.uint64(0x85EBCA6B)) & np.uint64(M32)
    x ^= x >> np.uint64(13)
    x = (x * np.uint64(0xC2B2AE35)) & np.uint64(M32)
    return x ^ (x >> np.uint64(16))


def placement():
    """(row, k) of each of a step's 512 bytes, in word order (word 4 L + j, byte b)."""
    rows, ks = [], []
    for lane, j, b in itertools.product(range(32), range(4), range(4)):
        rows.append(lane // 4 + 8 * (j % 2))
        ks.append(4 * (lane % 4) + 16 * (j // 2) + b)
    return np.array(rows), np.array(ks)


ROWS, KS = placement()


def weights(steps, seed=7):
    """B: int64 [steps, 32] (the one nonzero weight of byte column k, in column k % 8)."""
    rng = np.random.default_rng(seed)
    odd = np.arange(1, 128, 2)
    w = np.zeros((steps, 32), np.int64)
    for c in range(8):
        members = [(s, k) for s in range(steps) for k in range(c, 32, 8)]
        assert len(members) <= len(odd), "a column's weights must be distinct odd numbers"
        values = rng.permutation(odd)[:len(members)] * rng.choice([-1, 1], len(members))
        for (s, k), v in zip(members, values):
            w[s, k] = v
    return w


def entries(words, w):
    """C: int64 [16, 8] mod 2**32 of a head's words (uint32, padded to whole steps)."""
    steps = w.shape[0]
    padded = np.zeros(steps * STEP, np.uint32)
    padded[:words.size] = words
    data = padded.view(np.uint8).reshape(steps, 512).astype(np.int64)
    c = np.zeros((16, 8), np.int64)
    for s in range(steps):
        np.add.at(c, (ROWS, KS % 8), data[s] * w[s, KS])
    return c & M32


def digest(words, w):
    keys = (np.arange(128, dtype=np.uint64) * np.uint64(0x9E3779B1) + np.uint64(0x7F4A7C15)) & np.uint64(M32)
    x = (entries(words, w).reshape(-1).astype(np.uint64) + keys) & np.uint64(M32)
    return int(fmix(x).sum() & np.uint64(M32))


class Trials:
    """Damage to one head's ``words`` (uint32) and whether ``digest_of`` (words -> int) sees
    it; ``rng`` draws in a fixed order, so a seed repeats a run. ``steps``: the head's mma
    steps (positions of a step's 512 bytes: ``ROWS``, ``KS``)."""

    def __init__(self, words, steps, digest_of, rng):
        self.words, self.steps, self.digest_of, self.rng = words, steps, digest_of, rng
        self.base = digest_of(words)

    def single_flips_missed(self):
        """Every single-bit flip of every word, one at a time: how many leave the digest."""
        words, missed = self.words, 0
        for i in range(words.size):
            for b in range(32):
                words[i] ^= np.uint32(1 << b)
                missed += self.digest_of(words) == self.base
                words[i] ^= np.uint32(1 << b)
        return missed

    def missed(self, trials, make):
        """How many of ``trials`` copies damaged by ``make(copy)`` keep the digest."""
        miss = 0
        for _ in range(trials):
            bad = self.words.copy()
            make(bad)
            miss += self.digest_of(bad) == self.base
        return miss

    def flip_bytes_where(self, bad, flips, mask):
        """One random bit in each of ``flips`` distinct bytes whose place in a step (of 512)
        is in ``mask``, in any step."""
        cands = [s * 512 + p for s in range(self.steps) for p in np.flatnonzero(mask)]
        cands = [p for p in cands if p < 4 * self.words.size]
        view = bad.view(np.uint8)
        for p in self.rng.choice(cands, flips, replace=False):
            view[p] ^= np.uint8(1 << self.rng.integers(8))

    def same_entry(self, bad, flips):
        """Flips in bytes that feed one accumulator entry (row r, column c = k % 8)."""
        r, c = self.rng.integers(16), self.rng.integers(8)
        self.flip_bytes_where(bad, flips, (ROWS == r) & (KS % 8 == c))

    def same_row(self, bad, flips):
        """Flips in bytes of one accumulator row (any k)."""
        self.flip_bytes_where(bad, flips, ROWS == self.rng.integers(16))

    def words_damaged(self, bad, k):
        for i in self.rng.choice(self.words.size, k, replace=False):
            bad[i] = self.rng.integers(0, 2**32, dtype=np.uint64)

    def swap(self, bad):
        i, j = self.rng.choice(self.words.size, 2, replace=False)
        bad[i], bad[j] = bad[j], bad[i]

    def common(self):
        """The runs both prototypes print: random words replaced, two words swapped."""
        rng = self.rng
        print(f"2-8 random words replaced: 4000 trials, missed "
              f"{self.missed(4000, lambda b: self.words_damaged(b, int(rng.integers(2, 9))))}")
        print(f"two words swapped: 4000 trials, missed {self.missed(4000, self.swap)}")


def head_trials(n_words, seed, weights_of, digest_of):
    """(Trials, weights, steps) for ``n_words`` random words of seed ``seed``, the weights
    ``weights_of(steps)`` and the digest ``digest_of(words, weights)``."""
    rng = np.random.default_rng(seed)
    steps = -(-n_words // STEP)
    w = weights_of(steps)
    words = rng.integers(0, 2**32, n_words, dtype=np.uint64).astype(np.uint32)
    return Trials(words, steps, lambda x: digest_of(x, w), rng), w, steps


def main(n_words=1216, seed=0):
    t, _, steps = head_trials(n_words, seed, weights, digest)
    print(f"seed {seed}, {n_words} words ({steps} mma steps a warp)")
    # every single-bit flip (deterministic: one entry changes by an odd weight * 2**b)
    print(f"single-bit flips: {n_words * 32}, missed {t.single_flips_missed()}")
    print(f"2 flips feeding one entry (deterministic by distinct odd weights): 20000 trials, missed "
          f"{t.missed(20000, lambda b: t.same_entry(b, 2))}")
    print(f"3 flips feeding one entry: 20000 trials, missed {t.missed(20000, lambda b: t.same_entry(b, 3))}")
    t.common()


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:]))
