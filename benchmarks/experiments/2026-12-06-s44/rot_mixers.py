"""Cheaper head-digest mixers built from rotations (one integer instruction, SHF.L.W or PRMT)
instead of xorshifts (two: SHF and LOP3), and with ``q(x) = x * (2x + 1)`` (two IMADs, no
integer-pipe instruction) as the non-linear step, counted the way the forty-second session's
``mixers.py`` counts fmix32: pairs of random words whose term changes by the same amount when
one bit is set in one and cleared in the other (uniform: about n**2 / 2**33). Every mixer
below is a bijection of 32-bit words (odd multiplies, rotations, xorshifts, ``q``), so every
single-bit flip changes the term. CPU only (issue 14).

    python benchmarks/experiments/2026-12-06-s44/rot_mixers.py [log2_n]
"""
import sys

import numpy as np

sys.path.insert(0, "benchmarks/experiments/2026-12-05-s42")
from mixers import BITS, MASK, M1, M2, equal_pairs, fmix32, xorshift  # noqa: E402

M3 = np.uint64(0x27D4EB2F)


def rot(x, r):
    return ((x << np.uint64(r)) | (x >> np.uint64(32 - r))) & MASK


def mul(x, m):
    return (x * m) & MASK


def q(x):  # Rivest's permutation polynomial x * (2x + 1) mod 2**32 (RC6): a bijection, two IMADs
    return mul(x, (2 * x + np.uint64(1)) & MASK)


MIXERS = {  # name: (mixer, integer-pipe instructions, multiplies)
    "fmix32 (xs16 m xs13 m xs16)": (fmix32, 6, 2),
    "m r16 m r16": (lambda x: rot(mul(rot(mul(x, M1), 16), M2), 16), 2, 2),
    "m r16 m xs16": (lambda x: xorshift(mul(rot(mul(x, M1), 16), M2), 16), 3, 2),
    "r16 m r16 m r16": (lambda x: rot(mul(rot(mul(rot(x, 16), M1), 16), M2), 16), 3, 2),
    "m r15 m r16 m": (lambda x: mul(rot(mul(rot(mul(x, M1), 15), M2), 16), M3), 2, 3),
    "m r16 m r16 m r16": (lambda x: rot(mul(rot(mul(rot(mul(x, M1), 16), M2), 16), M3), 16), 3, 3),
    "xs16 m r13 m xs16": (lambda x: xorshift(mul(rot(mul(xorshift(x, 16), M1), 13), M2), 16), 5, 2),
    "xs16 m r16 m r16": (lambda x: rot(mul(rot(mul(xorshift(x, 16), M1), 16), M2), 16), 4, 2),
    "q r16 q r16": (lambda x: rot(q(rot(q(x), 16)), 16), 2, 4),
    "q r16 q r16 q r16": (lambda x: rot(q(rot(q(rot(q(x), 16)), 16)), 16), 3, 6),
    "xs16 m xs16 q r16": (lambda x: rot(q(xorshift(mul(xorshift(x, 16), M1), 16)), 16), 5, 3),
}


def main(log2_n: int = 22) -> None:
    n = 1 << log2_n
    key = np.uint64(0x7F4A7C15)
    rng = np.random.default_rng(1)
    print(f"equal-D pairs of {n} random words a bit, key added (uniform: about {n * (n - 1) / 2 ** 33:.0f})")
    print("| mixer | int ops | multiplies | " + " | ".join(f"bit {b}" for b in BITS) + " |")
    print("|---" * (3 + len(BITS)) + "|")
    for name, (mix, ops, muls) in MIXERS.items():
        cells = [equal_pairs(mix, b, lambda w: (w + key) & MASK, rng, n) for b in BITS]
        print(f"| {name} | {ops} | {muls} | " + " | ".join(f"{c:,}" for c in cells) + " |", flush=True)


if __name__ == "__main__":
    main(*[int(a) for a in sys.argv[1:]])
