"""The tensor-core head digest of a quantized block: what the decode checks INT blocks with.

The head digest of ``checksum.py`` costs a mixer (two multiplies, three xorshifts) a word.
For an INT4/INT2 block the decode kernel already has the head's words in shared memory
(its ring), so here the words go through the integer tensor-core mma instead, 512 bytes an
instruction, and the mixer runs only on the 128 accumulator entries at the end.

The staged sequence
-------------------
The decode stages a sealed block into its ring a *chunk* at a time: chunk ``c`` holds the
block's tokens ``[c T, (c + 1) T)``, ``T = min(BS, 32)``, as (little-endian uint32 words)::

    key codes    T * RW words   rows c T .. of k_codes[layer, block, h]   (RW = D * bits / 32)
    value codes  T * RW words   the same rows of v_codes
    key meta     D words        all of k_meta[layer, block, h]            (in every chunk)
    value meta   T * NG words   the same rows of v_meta

padded with zero words to a multiple of 128 words. Each 128 words are one *step*: the A
operand (16 x 32 unsigned bytes) of one ``mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32``,
lane ``L = 4 g + t`` contributing words ``4 L .. 4 L + 3`` of the step as its fragments:
word ``4 L + q``, byte ``i`` is ``A[g + 8 (q % 2), 4 t + 16 (q // 2) + i]``.

The weights
-----------
The B operand (32 x 8 signed bytes) of step ``s`` of chunk ``c`` is two words a lane (its
fragments ``b0``, ``b1``: byte ``i`` of ``b_j`` is ``B[16 j + 4 t + i, g]``), generated::

    m          = head_term(32 c + L, DENSE_SALT)               (checksum.head_term)
    base_0     = m | 0x01010101,          base_1 = (m * DENSE_C1) | 0x01010101
    r_0        = m * DENSE_C2,            r_1    = m * DENSE_C3          (mod 2**32)
    b_j(s)     = base_j ^ (rotl(r_j, 2 s + 1) & 0xFEFEFEFE)

so every weight byte is odd (never zero) and a lane makes its two words a step in two
instructions each (a funnel shift, a three-input logic op). A multiply in place of the
rotation (``r_j * (2 s + 1)``, or a random odd constant a step) left 96 to 128 pairs of a
row's bytes parallel at INT4 D=128 BS=32, which the rotation does not. ``C[16 x 8] = sum over the block's steps of A_step B_step`` (exact: the
sums stay far below 2**31).

The digest
----------
Entry ``e = 8 row + col`` of ``C`` (lane ``L`` holds entries ``2 L``, ``2 L + 1``,
``2 L + 64``, ``2 L + 65``) goes through the head digest's mixer with its index::

    digest = sum over e of head_term(e, C[e] mod 2**32)  mod 2**32

What it guarantees: a change of a block's bytes moves each row of ``C`` by ``sum delta_b
E_b`` over the changed bytes ``b`` of that row, ``E_b`` the sum of byte ``b``'s weight
vectors over the steps it is staged in (once, or once a chunk for key metadata). When no
``E_b`` is zero, every single-byte change -- every single-bit flip -- is caught for certain;
when no two ``E_b`` of a row are parallel, so is every change of two bytes of a row; when no
three are dependent, three. ``dependence(config)`` checks those for a layout exactly (the
tests do for the layouts the decode supports); beyond them a change escapes only if the 128
mixed entries sum the same, about ``2**-32``.
"""

from __future__ import annotations

import numpy as np

from .checksum import MASK32, head_term

STEP_WORDS = 128  # words of one mma step (16 x 32 bytes)
CHUNK_TOKENS = 32  # tokens of a staged chunk at most
DENSE_SALT = 0x2545F491  # the word whose term, at index 32 c + L, seeds lane L's weights in chunk c
DENSE_C1, DENSE_C2, DENSE_C3 = 0x9E3779B1, 0x85EBCA6B, 0xC2B2AE35  # odd: derive the other words
ODD_BYTES, EVEN_BYTES = 0x01010101, 0xFEFEFEFE
MAX_STEPS = 16  # steps of a chunk with distinct rotations


def chunk_tokens(block_size: int) -> int:
    """Tokens of one staged chunk (``min(block_size, 32)``)."""
    return min(block_size, CHUNK_TOKENS)


def steps_per_chunk(block_size: int, head_dim: int, bits: int, num_groups: int) -> int:
    """mma steps of one chunk: its words (``chunk_words``) in whole steps of 128."""
    return -(-chunk_words(block_size, head_dim, bits, num_groups) // STEP_WORDS)


def chunk_words(block_size: int, head_dim: int, bits: int, num_groups: int) -> int:
    """Words of one staged chunk before padding: key codes, value codes, key meta, value meta."""
    T = chunk_tokens(block_size)
    return 2 * T * head_dim * bits // 32 + head_dim + T * num_groups


def lane_weights(chunk: int, steps: int) -> np.ndarray:
    """The B words of chunk ``chunk``'s steps: uint32 ``[steps, 32 lanes, 2]`` (module docstring)."""
    m = np.array([head_term(32 * chunk + L, DENSE_SALT) for L in range(32)], np.uint64)
    base = np.stack([m | ODD_BYTES, ((m * DENSE_C1) & MASK32) | ODD_BYTES], axis=1)  # [32, 2]
    r = np.stack([(m * DENSE_C2) & MASK32, (m * DENSE_C3) & MASK32], axis=1)
    turns = np.array([step_rotation(s) for s in range(steps)], np.uint64)[:, None, None]
    rotated = ((r[None] << turns) | (r[None] >> (np.uint64(32) - turns))) & MASK32
    return (base[None] ^ (rotated & EVEN_BYTES)).astype(np.uint32)


def step_rotation(step: int) -> int:
    """The left rotation of ``r_j`` in step ``step``: ``2 step + 1``, odd and in [1, 31]
    (distinct for the at most 16 steps of a chunk)."""
    if not 0 <= step < MAX_STEPS:
        raise ValueError(f"step {step}: a chunk has at most {MAX_STEPS} steps")
    return 2 * step + 1


def b_matrices(chunk: int, steps: int) -> np.ndarray:
    """The weights as matrices: int64 ``[steps, 32 (k), 8 (n)]``, ``B[s, 16 j + 4 t + i, g]`` =
    signed byte ``i`` of lane ``4 g + t``'s word ``b_j`` of step ``s``."""
    b = lane_weights(chunk, steps).view(np.int8).reshape(steps, 8, 4, 2, 4)  # [s, g, t, j, i]
    return b.transpose(0, 3, 2, 4, 1).reshape(steps, 32, 8).astype(np.int64)  # [s, (j, t, i), g]


def a_matrices(words: np.ndarray) -> np.ndarray:
    """The A operands of staged words (uint32 ``[steps * 128]``): int64 ``[steps, 16, 32]``."""
    b = words.view(np.uint8).reshape(-1, 8, 4, 2, 2, 4).astype(np.int64)  # [s, g, t, q//2, q%2, i]
    return b.transpose(0, 4, 1, 3, 2, 5).reshape(-1, 16, 32)  # [s, (q%2, g), (q//2, t, i)]


def staged_chunks(k_codes, v_codes, k_meta, v_meta) -> list:
    """One head's staged chunks: a list of uint32 ``[steps * 128]`` (zero-padded), from
    ``k_codes``, ``v_codes`` ``[BS, row]`` (uint8), ``k_meta`` ``[2, D]``, ``v_meta``
    ``[BS, 2, NG]`` (float16): ``store.k_codes[layer, block, h]`` and its kin on the host."""
    words = [np.ascontiguousarray(a).reshape(a.shape[0], -1).view(np.uint32) for a in (k_codes, v_codes, v_meta)]
    k_rows, v_rows, vm_rows = words
    km = np.ascontiguousarray(k_meta).reshape(-1).view(np.uint32)
    BS = k_rows.shape[0]
    T = chunk_tokens(BS)
    chunks = []
    for c in range(BS // T):
        rows = slice(c * T, (c + 1) * T)
        staged = np.concatenate([k_rows[rows].reshape(-1), v_rows[rows].reshape(-1), km, vm_rows[rows].reshape(-1)])
        padded = np.zeros(-(-staged.size // STEP_WORDS) * STEP_WORDS, np.uint32)
        padded[:staged.size] = staged
        chunks.append(padded)
    return chunks


def entries(chunks) -> np.ndarray:
    """``C`` of staged chunks: int64 ``[16, 8]`` (exact)."""
    total = np.zeros((16, 8), np.int64)
    for c, words in enumerate(chunks):
        a = a_matrices(words)
        total += np.einsum("srk,skn->rn", a, b_matrices(c, a.shape[0]))
    return total


def digest_of_entries(c) -> int:
    """The digest of accumulator entries ``c`` (``[16, 8]``, any integer dtype): the sum of
    ``head_term(e, c[e] mod 2**32)`` over ``e = 8 row + col``, mod 2**32."""
    flat = (np.asarray(c, np.int64).reshape(-1) & MASK32).tolist()
    return sum(head_term(e, w) for e, w in enumerate(flat)) & MASK32


def tensor_head_digest(k_codes, v_codes, k_meta, v_meta) -> int:
    """The tensor-core head digest of one (block, layer, KV head) of a quantized cache
    (module docstring), from its arrays as ``staged_chunks`` takes them."""
    return digest_of_entries(entries(staged_chunks(k_codes, v_codes, k_meta, v_meta)))


def effective_vectors(block_size: int, head_dim: int, bits: int, num_groups: int) -> tuple:
    """``(E, rows)``: each byte of a head's words (key codes, value codes, key meta, value
    meta, in that order), its summed weight vector int64 ``[bytes, 8]`` and its row of ``C``
    ``[bytes]``: what ``dependence`` checks."""
    T, RW, D, NG = chunk_tokens(block_size), head_dim * bits // 32, head_dim, num_groups
    code, vm = block_size * RW, block_size * NG
    total = 2 * code + D + vm
    steps = steps_per_chunk(block_size, head_dim, bits, num_groups)
    E = np.zeros((4 * total, 8), np.int64)
    rows = np.full(4 * total, -1, np.int64)
    pos = np.arange(STEP_WORDS * steps * 4)  # a byte's place in a chunk's staged words
    word, byte = pos // 4, pos % 4
    step, lane, q = word // STEP_WORDS, (word % STEP_WORDS) // 4, word % 4
    row = lane // 4 + 8 * (q % 2)
    k = 4 * (lane % 4) + 16 * (q // 2) + byte
    for c in range(block_size // T):
        b = b_matrices(c, steps)[step, k]  # [pos, 8]
        head_word = _head_word_of_staged(word, c, T, RW, D, NG, code)
        ok = head_word >= 0
        at = 4 * head_word[ok] + byte[ok]
        np.add.at(E, at, b[ok])
        rows[at] = row[ok]
    return E, rows


def _head_word_of_staged(word, c, T, RW, D, NG, code):
    """The head word (index into key codes, value codes, key meta, value meta) that staged
    word ``word`` of chunk ``c`` holds, -1 for padding."""
    kc, vc, km = T * RW, T * RW, D
    out = np.full(word.shape, -1, np.int64)
    parts = ((0, kc, c * kc), (kc, vc, code + c * vc), (kc + vc, km, 2 * code), (kc + vc + km, T * NG, 2 * code + D + c * T * NG))
    for start, size, first in parts:
        inside = (word >= start) & (word < start + size)
        out[inside] = first + word[inside] - start
    return out


def dependence(block_size: int, head_dim: int, bits: int, num_groups: int, triples: bool = True) -> dict:
    """Exact checks of the guarantees for one layout: ``zero`` (bytes whose change would
    not move ``C``), ``parallel`` (pairs of one row's bytes whose changes could cancel),
    ``dependent`` (triples of one row of rank < 3; only with ``triples``): each should be 0.
    Exact integer Gram determinants: weight bytes below 2**7 in size (summed over at most 8
    chunks: 2**10), Gram entries below 2**23; the triples' 3 x 3 determinants stay below
    2**63 only for one-chunk blocks (``block_size <= 32``: below 2**53), so ``triples`` needs one."""
    if triples and block_size > CHUNK_TOKENS:
        raise ValueError(f"block_size {block_size}: the triple check is exact for blocks of one chunk only")
    E, rows = effective_vectors(block_size, head_dim, bits, num_groups)
    out = {"bytes": len(E), "zero": int(np.sum(~E.any(axis=1))), "parallel": 0, "dependent": 0}
    for r in range(16):
        v = E[rows == r]
        g = v @ v.T
        i, j = np.triu_indices(len(v), 1)
        out["parallel"] += int(np.sum(g[i, i] * g[j, j] - g[i, j] ** 2 == 0))
        if triples:
            out["dependent"] += _dependent_triples(g)
    return out


def _dependent_triples(g) -> int:
    n, found = len(g), 0
    for a in range(n):
        b, c = np.triu_indices(n - a - 1, 1)
        b, c = b + a + 1, c + a + 1
        det = (g[a, a] * (g[b, b] * g[c, c] - g[b, c] ** 2) - g[a, b] * (g[a, b] * g[c, c] - g[b, c] * g[a, c])
               + g[a, c] * (g[a, b] * g[b, c] - g[b, b] * g[a, c]))
        found += int(np.sum(det == 0))
    return found


__all__ = ["CHUNK_TOKENS", "DENSE_C1", "DENSE_C2", "DENSE_C3", "DENSE_SALT", "MAX_STEPS", "STEP_WORDS", "a_matrices",
           "b_matrices", "chunk_tokens", "chunk_words", "dependence", "digest_of_entries", "effective_vectors",
           "entries", "lane_weights", "staged_chunks", "step_rotation", "steps_per_chunk", "tensor_head_digest"]
