"""What a structural decode bug costs at 128k, in float64 on random data (CPU, numpy only):
the relative L2 error of the attention output when one block of 32 tokens is read twice (in
place of its neighbour), when one block is dropped, and when one split of 128 (1,024 tokens)
is dropped. The bound beside the sealed formats' own error at 128k (1.45-2.14e-3 on the H200)
for test_decode's LONG_TOLERANCE (twenty-ninth session)."""
import numpy as np

rng = np.random.default_rng(0)
n, D, G = 131072, 128, 4
k, v, q = rng.standard_normal((n, D)), rng.standard_normal((n, D)), rng.standard_normal((G, D))


def attend(k, v):
    s = q @ k.T / np.sqrt(D)
    p = np.exp(s - s.max(1, keepdims=True))
    return (p @ v) / p.sum(1, keepdims=True)


exact = attend(k, v)
rel = lambda out: np.linalg.norm(out - exact) / np.linalg.norm(exact)  # noqa: E731
k2, v2 = k.copy(), v.copy()
k2[:32], v2[:32] = k[32:64], v[32:64]
print(f"one block read twice: {rel(attend(k2, v2)):.2e}")
print(f"one block dropped: {rel(attend(k[32:], v[32:])):.2e}")
print(f"one split of 128 dropped: {rel(attend(k[1024:], v[1024:])):.2e}")
