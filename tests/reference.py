"""Slow, obviously-right numpy references that kernels and njit code are checked against."""

from __future__ import annotations

import numpy as np

from hexcore import layout


def levels(bits: int) -> int:
    """Largest code of a ``bits``-bit unsigned integer."""
    return (1 << bits) - 1


def quant_params(lo: np.ndarray, hi: np.ndarray, bits: int):
    """float16 (scale, min) of groups with float32 extremes ``lo``, ``hi``."""
    scale = ((hi - lo) / np.float32(levels(bits))).astype(np.float16)
    return scale, lo.astype(np.float16)


def quantize(x: np.ndarray, scale: np.ndarray, lo: np.ndarray, bits: int) -> np.ndarray:
    """Codes of float32 ``x`` with float16 ``scale``/``lo`` broadcast against it (uint8)."""
    s, m = scale.astype(np.float32), lo.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.floor((x.astype(np.float32) - m) / s + np.float32(0.5))
    q = np.where(s > 0, q, 0)
    return np.clip(q, 0, levels(bits)).astype(np.uint8)


def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """Pack codes along the last axis in plain order: element i at bit (i * bits) % 8 of
    byte i*bits//8 (the order of the tails' neighbours in other libraries; used by tests)."""
    per_byte = 8 // bits
    c = codes.reshape(codes.shape[:-1] + (codes.shape[-1] // per_byte, per_byte)).astype(np.uint8)
    shifts = (np.arange(per_byte) * bits).astype(np.uint8)
    return np.bitwise_or.reduce(c << shifts, axis=-1).astype(np.uint8)


def unpack(packed: np.ndarray, bits: int) -> np.ndarray:
    """Inverse of :func:`pack`."""
    per_byte = 8 // bits
    shifts = (np.arange(per_byte) * bits).astype(np.uint8)
    c = (packed[..., None] >> shifts) & levels(bits)
    return c.reshape(packed.shape[:-1] + (packed.shape[-1] * per_byte,)).astype(np.uint8)


def _words_to_bytes(words: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(words.astype("<u4")).view(np.uint8)


def pack_key_rows(codes: np.ndarray, bits: int) -> np.ndarray:
    """Key code rows ``[..., D]`` packed as sealed blocks hold them (layout.key_code_field)."""
    D = codes.shape[-1]
    word, field = layout.key_code_field(np.arange(D), bits)
    words = np.zeros(codes.shape[:-1] + (D * bits // 32,), np.uint64)
    for d in range(D):
        words[..., word[d]] |= codes[..., d].astype(np.uint64) << np.uint64(field[d] * bits)
    return _words_to_bytes(words).reshape(codes.shape[:-1] + (D * bits // 8,))


def unpack_key_rows(packed: np.ndarray, bits: int) -> np.ndarray:
    """Inverse of :func:`pack_key_rows`: codes ``[..., D]``."""
    D = packed.shape[-1] * 8 // bits
    words = np.ascontiguousarray(packed).view("<u4").astype(np.uint64)
    word, field = layout.key_code_field(np.arange(D), bits)
    return ((words[..., word] >> (field * bits).astype(np.uint64)) & levels(bits)).astype(np.uint8)


def pack_value_block(codes: np.ndarray, bits: int, group_size: int) -> np.ndarray:
    """One block's value codes ``[H, BS, D]`` in the decode kernel's fragment order
    (layout.value_code_field); returned as ``[H, BS, D * bits / 8]`` bytes like the store."""
    H, BS, D = codes.shape
    t, d = np.meshgrid(np.arange(BS), np.arange(D), indexing="ij")
    word, field = layout.value_code_field(t, d, bits, D, layout.value_chunk_dims(group_size))
    words = np.zeros((H, BS * D * bits // 32), np.uint64)
    shifted = codes.astype(np.uint64) << (field * bits).astype(np.uint64)[None]
    for h in range(H):
        np.bitwise_or.at(words[h], word.ravel(), shifted[h].ravel())
    return _words_to_bytes(words).reshape(H, BS, D * bits // 8)


def unpack_value_block(packed: np.ndarray, bits: int, group_size: int) -> np.ndarray:
    """Inverse of :func:`pack_value_block`: codes ``[H, BS, D]``."""
    H, BS, row = packed.shape
    D = row * 8 // bits
    words = np.ascontiguousarray(packed).reshape(H, -1).view("<u4").astype(np.uint64)
    t, d = np.meshgrid(np.arange(BS), np.arange(D), indexing="ij")
    word, field = layout.value_code_field(t, d, bits, D, layout.value_chunk_dims(group_size))
    return ((words[:, word] >> (field * bits).astype(np.uint64)) & levels(bits)).astype(np.uint8)


def quantize_keys(k: np.ndarray, bits: int):
    """Per-channel key quantization of one block: ``k`` [H, BS, D] float16.

    Returns (packed codes [H, BS, D*bits/8] uint8 (:func:`pack_key_rows`), meta [H, 2, D]
    float16: scale, min).
    """
    x = k.astype(np.float32)
    scale, lo = quant_params(x.min(axis=1), x.max(axis=1), bits)  # [H, D]
    codes = quantize(x, scale[:, None, :], lo[:, None, :], bits)
    return pack_key_rows(codes, bits), np.stack([scale, lo], axis=1)


def quantize_values(v: np.ndarray, bits: int, group_size: int):
    """Per-token value quantization over channel groups: ``v`` [H, BS, D] float16.

    Returns (packed codes [H, BS, D*bits/8] uint8 (:func:`pack_value_block`), meta
    [H, BS, 2, D/group_size] float16).
    """
    H, BS, D = v.shape
    x = v.astype(np.float32).reshape(H, BS, D // group_size, group_size)
    scale, lo = quant_params(x.min(axis=-1), x.max(axis=-1), bits)  # [H, BS, NG]
    codes = quantize(x, scale[..., None], lo[..., None], bits).reshape(H, BS, D)
    return pack_value_block(codes, bits, group_size), np.stack([scale, lo], axis=2)


def dequantize_keys(packed: np.ndarray, meta: np.ndarray, bits: int) -> np.ndarray:
    """float64 keys [H, BS, D] from :func:`quantize_keys` output."""
    q = unpack_key_rows(packed, bits).astype(np.float64)
    return meta[:, 0, None, :].astype(np.float64) * q + meta[:, 1, None, :].astype(np.float64)


def dequantize_values(packed: np.ndarray, meta: np.ndarray, bits: int, group_size: int) -> np.ndarray:
    """float64 values [H, BS, D] from :func:`quantize_values` output."""
    q = unpack_value_block(packed, bits, group_size).astype(np.float64)
    scale = np.repeat(meta[:, :, 0, :].astype(np.float64), group_size, axis=-1)
    lo = np.repeat(meta[:, :, 1, :].astype(np.float64), group_size, axis=-1)
    return scale * q + lo


def quantize_keys_per_token(k: np.ndarray, bits: int, group_size: int) -> np.ndarray:
    """Keys quantized like values (per token over channel groups), dequantized: the
    scheme KIVI rejects for keys, kept to show why."""
    x = k.astype(np.float32).reshape(k.shape[:-1] + (k.shape[-1] // group_size, group_size))
    scale, lo = quant_params(x.min(axis=-1), x.max(axis=-1), bits)
    codes = quantize(x, scale[..., None], lo[..., None], bits).astype(np.float64)
    return (codes * scale[..., None].astype(np.float64) + lo[..., None].astype(np.float64)).reshape(k.shape)


def relative_l2(x: np.ndarray, ref: np.ndarray) -> float:
    """||x - ref|| / ||ref|| in float64."""
    ref = np.asarray(ref, np.float64)
    return float(np.linalg.norm(np.asarray(x, np.float64) - ref) / np.linalg.norm(ref))


def quantize_block(k: np.ndarray, v: np.ndarray, bits: int, group_size: int):
    """KIVI quantization of one block's K and V [H, BS, D]: (kc, km, vc, vm) as the store holds them."""
    kc, km = quantize_keys(k, bits)
    vc, vm = quantize_values(v, bits, group_size)
    return kc, km, vc, vm


def decode_attention(q: np.ndarray, keys: list, values: list, scale: float) -> np.ndarray:
    """float64 decode attention: q [B, Hq, D]; keys[b], values[b]: [H, n_b, D] float64.

    Query head ``hq`` reads KV head ``hq // (Hq // H)``; an empty sequence gives zeros.
    """
    B, Hq, D = q.shape
    out = np.zeros((B, Hq, D))
    for b in range(B):
        k, v = keys[b], values[b]
        if k.shape[1] == 0:
            continue
        group = Hq // k.shape[0]
        for hq in range(Hq):
            s = k[hq // group] @ q[b, hq].astype(np.float64) * scale
            p = np.exp(s - s.max())
            out[b, hq] = (p / p.sum()) @ v[hq // group]
    return out


def fake_quantize(x: np.ndarray, bits: int, axis: int) -> np.ndarray:
    """float64 dequantization of float16 ``x`` quantized in groups along ``axis`` by
    :func:`quant_params` and :func:`quantize` (no packing): keys ``[H, NB, BS, D]`` with
    ``axis=2`` give :func:`quantize_keys` then :func:`dequantize_keys` of each block; values
    ``[H, S, D / G, G]`` with ``axis=3`` give :func:`quantize_values` then
    :func:`dequantize_values`."""
    xf = x.astype(np.float16).astype(np.float32)
    scale, lo = quant_params(xf.min(axis=axis, keepdims=True), xf.max(axis=axis, keepdims=True), bits)
    q = quantize(xf, scale, lo, bits).astype(np.float64)
    return scale.astype(np.float64) * q + lo.astype(np.float64)


# -- formats by age (hexcore.quant.KVFormat) ---------------------------------------------------
def fit_key_params(k: np.ndarray, bits: int, steps: int = 3):
    """float16 (scale, min) ``[..., D]`` of each key channel of blocks ``k`` ``[..., BS, D]``
    (float16 values), fitted by ``steps`` Lloyd steps (``KVFormat.fitted_keys``).

    The levels ``min + scale * c``, ``c = 0 .. 2**bits - 1``, start from the channel's mean
    and standard deviation (``scale = std / std(c)``, ``min = mean - scale * mean(c)``). Each
    step codes every token with :func:`quantize` under the pair rounded to float16 (its
    nearest level), then sets the pair to the least-squares line through (code, x):
    ``scale = max(cov(code, x), 0) / var(code)`` (0 when every code is equal), ``min = mean(x)
    - scale * mean(code)``. Statistics in float64 (sums in token order), every pair rounded
    to float32 and then to float16 (as a kernel stores a float64: :func:`_half`). A channel
    whose pair is not finite in float16 at any step (a range near float16's largest value)
    takes :func:`quant_params` of its extremes instead. Non-finite keys are the seal's
    non-finite policy's business (``hexcore.cuda.write``), not this function's.
    """
    x = np.asarray(k, np.float16).astype(np.float32)
    xd = x.astype(np.float64)
    top = levels(bits)
    mean = xd.mean(axis=-2)
    scale = xd.std(axis=-2) / np.sqrt(((top + 1) ** 2 - 1) / 12)  # std of 0..top
    lo = mean - scale * (top / 2)
    bad = np.zeros(mean.shape, bool)
    with np.errstate(invalid="ignore"):
        for _ in range(steps):
            scale16, lo16 = _half(scale), _half(lo)
            bad |= ~(np.isfinite(scale16) & np.isfinite(lo16))
            c = quantize(x, scale16[..., None, :], lo16[..., None, :], bits).astype(np.float64)
            cm = c.mean(axis=-2)
            var = ((c - cm[..., None, :]) ** 2).mean(axis=-2)
            cov = ((c - cm[..., None, :]) * xd).mean(axis=-2)  # sum(c - cm) = 0 exactly; each product exact
            scale = np.where(var > 0, np.maximum(cov, 0) / np.where(var > 0, var, 1), 0.0)
            lo = mean - scale * cm
        scale16, lo16 = _half(scale), _half(lo)
    bad |= ~(np.isfinite(scale16) & np.isfinite(lo16))
    plain_scale, plain_lo = quant_params(x.min(axis=-2), x.max(axis=-2), bits)
    return np.where(bad, plain_scale, scale16), np.where(bad, plain_lo, lo16)


def _half(x: np.ndarray) -> np.ndarray:
    # float64 -> float32 -> float16, both round-to-nearest-even (a kernel's two conversions)
    with np.errstate(over="ignore"):
        return np.asarray(x, np.float64).astype(np.float32).astype(np.float16)


def seal_tier_block(k: np.ndarray, v: np.ndarray, tier, group_size: int, fitted_keys: bool = False):
    """One block's FP16 rows ``k``, ``v`` ``[H, BS, D]`` sealed at ``tier`` (a
    ``hexcore.quant.AgeTier``): (kc, km, vc, vm) as the store holds them; 2-bit keys take
    :func:`fit_key_params` when ``fitted_keys``."""
    if fitted_keys and tier.key_bits == 2:
        x = k.astype(np.float32)
        scale, lo = fit_key_params(k, 2)
        kc, km = pack_key_rows(quantize(x, scale[:, None, :], lo[:, None, :], 2), 2), np.stack([scale, lo], axis=1)
    else:
        kc, km = quantize_keys(k, tier.key_bits)
    vc, vm = quantize_values(v, tier.value_bits, group_size)
    return kc, km, vc, vm


def unseal_rows(kc, km, vc, vm, tier, group_size: int):
    """A sealed block back to FP16 rows ``[H, BS, D]`` as a re-seal reads it:
    ``float16(float32(scale) * code + float32(min))`` (the product is exact in float32)."""
    kq = unpack_key_rows(kc, tier.key_bits).astype(np.float32)
    k = km[:, 0, None, :].astype(np.float32) * kq + km[:, 1, None, :].astype(np.float32)
    vq = unpack_value_block(vc, tier.value_bits, group_size).astype(np.float32)
    vs = np.repeat(vm[:, :, 0, :].astype(np.float32), group_size, axis=-1)
    vl = np.repeat(vm[:, :, 1, :].astype(np.float32), group_size, axis=-1)
    return k.astype(np.float16), (vs * vq + vl).astype(np.float16)


def tiered_kv(k: np.ndarray, v: np.ndarray, fmt, block_size: int, group_size: int):
    """float64 K, V ``[H, n, D]`` as a cache of format ``fmt`` (a ``hexcore.quant.KVFormat``)
    holds a sequence of ``n`` tokens whose FP16 rows are ``k``, ``v`` ``[H, n, D]``.

    Sealed block ``j`` is FP16 while ``fmt.block_tiers(n, block_size)[j]`` is -1; otherwise it
    went through tiers ``0 .. level`` in order: sealed from its FP16 rows at the first, then
    re-sealed from :func:`unseal_rows` of the one before at each later one. The open tail
    (``n % block_size`` tokens) is FP16.
    """
    k, v = np.asarray(k, np.float16), np.asarray(v, np.float16)
    out_k, out_v = k.astype(np.float64), v.astype(np.float64)
    for j, level in enumerate(fmt.block_tiers(k.shape[1], block_size)):
        if level < 0:
            continue
        rows = slice(j * block_size, (j + 1) * block_size)
        bk, bv = k[:, rows], v[:, rows]
        for i, tier in enumerate(fmt.tiers[:level + 1]):
            if i:
                bk, bv = unseal_rows(*sealed, fmt.tiers[i - 1], group_size)
            sealed = seal_tier_block(bk, bv, tier, group_size, fmt.fitted_keys)
        kc, km, vc, vm = sealed
        out_k[:, rows] = dequantize_keys(kc, km, fmt.tiers[level].key_bits)
        out_v[:, rows] = dequantize_values(vc, vm, fmt.tiers[level].value_bits, group_size)
    return out_k, out_v
