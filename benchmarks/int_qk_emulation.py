"""CPU go/no-go for an integer-mma q.k in the INT4/INT2 decode (issue 12): q*s (per block) quantized to int8 per
(head, block) by absmax, codes as u8, int32 accumulation, the mins term exact. Prints the output's relative L2
error against float64 attention over the same dequantized K/V (the decode contract: 2e-3).

    python -m benchmarks.int_qk_emulation
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests import reference as ref  # noqa: E402


def run(seed, n=4096, D=128, G=4, bits=4, BS=32, key_scale=1.0, outliers=0, qbits=8) -> float:
    """Relative L2 error of G query heads' outputs over ``n`` tokens (keys ``bits``-bit per
    channel over blocks of BS, values per token in groups of 64) with q*s quantized to
    ``qbits``, against the same attention in float64."""
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((n, D)) * key_scale
    if outliers:
        k[:, :outliers] *= 20
    v = rng.standard_normal((n, D))
    q = rng.standard_normal((G, D))
    k16, v16 = k.astype(np.float16), v.astype(np.float16)
    kb = k16.reshape(n // BS, BS, D)[None]
    # keys: per channel per block (reference quantizer)
    K = ref.fake_quantize(kb, bits, axis=2)[0].reshape(n, D)
    V = ref.fake_quantize(v16.reshape(1, n, D // 64, 64), bits, axis=3).reshape(n, D)
    x = kb[0].astype(np.float32)
    s, m = ref.quant_params(x.min(axis=1), x.max(axis=1), bits)  # [NB, D]
    codes = ref.quantize(x, s[:, None], m[:, None], bits).astype(np.float64)  # [NB, BS, D]
    scale = 1 / np.sqrt(D)
    exact, approx = np.zeros((G, D)), np.zeros((G, D))
    top = (1 << (qbits - 1)) - 1
    for g in range(G):
        s_exact = (K @ q[g]) * scale
        qs = q[g][None, :] * s.astype(np.float64)  # [NB, D]
        amax = np.abs(qs).max(axis=1, keepdims=True)
        qi = np.round(qs / amax * top)  # int8
        dot = np.einsum("bd,btd->bt", qi, codes) * (amax / top)  # [NB, BS]
        mins = (q[g][None, :] * m.astype(np.float64)).sum(axis=1, keepdims=True)
        s_apx = (dot + mins).reshape(n) * scale
        for sc, out in ((s_exact, exact), (s_apx, approx)):
            p = np.exp(sc - sc.max())
            out[g] = (p / p.sum()) @ V
    return ref.relative_l2(approx, exact)


def main() -> None:
    """The relative error over 5 seeds for each case (max and mean)."""
    for label, kw in [("gaussian", {}), ("keys x10", dict(key_scale=10)), ("4 outlier channels x20", dict(outliers=4)),
                      ("int6 q", dict(qbits=6)), ("INT2 keys", dict(bits=2)), ("short 512", dict(n=512))]:
        errs = [run(seed, **kw) for seed in range(5)]
        print(f"{label:26s} rel L2 max {max(errs):.2e} mean {np.mean(errs):.2e}")


if __name__ == "__main__":
    main()
