"""How often a same-bit double flip cancels in the head digest, for the mixer as defined and
for cheaper variants (issue 14, CPU only).

A bit set in one word (0 -> 1) and cleared in another (1 -> 0) changes the digest by
``D(w_a) - D(w_b)`` with ``D(w) = term(w | bit) - term(w & ~bit) mod 2**32``: it cancels when
the two ``D`` are equal. For ``n`` random words per bit this counts the pairs with equal
``D``; a mixer whose ``D`` is uniform over 2**32 values gives about ``n**2 / 2**33`` (2048 at
the default n = 2**22). Keys enter by XOR (``x``) or by a mod-2**32 add (``a``).

    python benchmarks/experiments/2026-12-05-s42/mixers.py [log2_n]
"""

import sys

import numpy as np

MASK, M1, M2 = np.uint64(0xFFFFFFFF), np.uint64(0x85EBCA6B), np.uint64(0xC2B2AE35)
KEY = np.uint64(0x7F4A7C15)
BITS = (31, 30, 24, 16, 15, 13, 8, 0)


def xorshift(x, s):
    return x ^ (x >> np.uint64(s))


def fmix32(x):  # the head digest's mixer (checksum.head_term)
    return xorshift((xorshift((xorshift(x, 16) * M1) & MASK, 13) * M2) & MASK, 16)


def without_last_xorshift(x):  # the product could then go into the sum with one IMAD
    return (xorshift((xorshift(x, 16) * M1) & MASK, 13) * M2) & MASK


def without_first_xorshift(x):  # the variant the head digest had before the 2026-12-02 fix
    return xorshift((xorshift((x * M1) & MASK, 13) * M2) & MASK, 16)


def one_multiply(x):
    return xorshift((xorshift(x, 16) * M1) & MASK, 15)


MIXERS = {"fmix32": fmix32, "no last xorshift": without_last_xorshift,
          "no first xorshift": without_first_xorshift, "one multiply": one_multiply}


def equal_pairs(mix, bit, keyed, rng, n):
    w = rng.integers(0, 1 << 32, n, dtype=np.uint64)
    b = np.uint64(1 << bit)
    hi, lo = keyed(w | b), keyed(w & ~b)
    _, counts = np.unique((mix(hi) - mix(lo)) & MASK, return_counts=True)
    return int((counts * (counts - 1) // 2).sum())


def main(log2_n: int = 22) -> None:
    n = 1 << log2_n
    keyings = {"x": lambda w: w ^ KEY, "a": lambda w: (w + KEY) & MASK}
    rng = np.random.default_rng(1)
    print(f"equal-D pairs of {n} random words a bit (uniform: about {n * (n - 1) / 2 ** 33:.0f})")
    print("| mixer | " + " | ".join(f"bit {b} {k}" for b in BITS for k in keyings) + " |")
    print("|---" * (1 + len(BITS) * len(keyings)) + "|")
    for name, mix in MIXERS.items():
        cells = [equal_pairs(mix, b, keyings[k], rng, n) for b in BITS for k in keyings]
        print(f"| {name} | " + " | ".join(str(c) for c in cells) + " |", flush=True)


if __name__ == "__main__":
    main(*[int(a) for a in sys.argv[1:]])
