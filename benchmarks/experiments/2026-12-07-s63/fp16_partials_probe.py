"""CPU probe: relative L2 error that FP16 partials (each split's output normalised by its l,
rounded to float16) add to a split decode's merge, against float64; seeds printed."""
import numpy as np

def run(seed, ctx, splits, D=128, heads=4, vscale=1.0, kscale=1.0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((heads, D)) * kscale
    k = rng.standard_normal((ctx, D)).astype(np.float16).astype(np.float64)
    v = (rng.standard_normal((ctx, D)) * vscale).astype(np.float16).astype(np.float64)
    s = q @ k.T / np.sqrt(D)                      # [heads, ctx]
    p = np.exp(s - s.max(1, keepdims=True))
    exact = p @ v / p.sum(1, keepdims=True)
    bounds = np.linspace(0, ctx, splits + 1).astype(int)
    m = np.stack([s[:, a:b].max(1) for a, b in zip(bounds, bounds[1:])], 1)  # [heads, splits]
    out32 = np.zeros_like(exact); out16 = np.zeros_like(exact)
    M = m.max(1, keepdims=True)
    L = 0
    for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
        pi = np.exp(s[:, a:b] - m[:, i:i + 1]); li = pi.sum(1, keepdims=True)
        oi = pi @ v[a:b]                           # unnormalised partial
        w = np.exp(m[:, i:i + 1] - M)
        out32 += w * oi.astype(np.float32)
        out16 += w * li * (oi / li).astype(np.float16).astype(np.float64)
        L = L + w * li
    rel = lambda x: np.linalg.norm(x / L - exact) / np.linalg.norm(exact)
    return rel(out32), rel(out16)

for seed, ctx, splits, vs in [(1, 32768, 32, 1.0), (2, 32768, 64, 1.0), (3, 131072, 49, 1.0),
                              (4, 4096, 8, 1.0), (5, 32768, 32, 100.0), (6, 1024, 263, 1.0)]:
    e32, e16 = run(seed, ctx, splits, vscale=vs)
    print(f"seed {seed} ctx {ctx} splits {splits} v*{vs}: float32 partials {e32:.2e}, fp16 normalised {e16:.2e}")
