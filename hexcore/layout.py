"""Byte offsets of every element of the cache: one set of functions for CPU and GPU.

These are plain integer functions. The host calls them as Python (or compiles them
with ``numba.njit``); ``hexcore.cuda`` compiles the very same functions with
``cuda.jit(device=True)``, so the two sides cannot disagree about a byte.

Each pool is one allocation per kind with the layer as its leading axis, head-major
within a block ("HND"), so one (block, head) is one contiguous run::

    sealed codes  [num_layers, num_blocks, num_kv_heads, block_size, row_bytes] uint8
                  (FP16 pools: [..., block_size, head_dim] float16, same bytes)
    key meta      [num_layers, num_blocks, num_kv_heads, 2, head_dim]        float16
                  row 0 = per-channel scale, row 1 = per-channel min
    value meta    [num_layers, num_blocks, num_kv_heads, block_size, 2, num_groups]
                  float16: per token, num_groups scales then num_groups mins
    tails         [num_layers, max_seqs, num_kv_heads, block_size, head_dim] float16

K and V each have their own codes, metadata and tails, with identical layouts.
"""

from __future__ import annotations

FP16_BYTES = 2


def code_offset(layer, block, head, token, num_blocks, num_kv_heads, block_size, row_bytes):
    """Byte offset of the code row of (layer, block, head, token) in a sealed pool."""
    return (((layer * num_blocks + block) * num_kv_heads + head) * block_size + token) * row_bytes


def key_meta_offset(layer, block, head, num_blocks, num_kv_heads, head_dim):
    """Byte offset of the key scale row of (layer, block, head); the min row follows."""
    return ((layer * num_blocks + block) * num_kv_heads + head) * 2 * head_dim * FP16_BYTES


def value_meta_offset(layer, block, head, token, num_blocks, num_kv_heads, block_size, num_groups):
    """Byte offset of the value scales of (layer, block, head, token); the mins follow."""
    row = ((layer * num_blocks + block) * num_kv_heads + head) * block_size + token
    return row * 2 * num_groups * FP16_BYTES


def tail_offset(layer, slot, head, token, max_seqs, num_kv_heads, block_size, head_dim):
    """Byte offset of the FP16 row of (layer, tail slot, head, token) in a tail pool."""
    return (((layer * max_seqs + slot) * num_kv_heads + head) * block_size + token) * head_dim * FP16_BYTES


# -- where each code sits inside a sealed block --------------------------------------
# INT4/INT2 codes are packed into little-endian 32-bit words of E = 32 // bits fields;
# field f occupies bits [f * bits, (f + 1) * bits). The field order is chosen by the
# decode kernel's tensor-core fragments (docs/design-notes.md, "Sealed format"), so that
# one mask puts two codes into the two float16 halves of a register.

def key_code_field(dim, bits):
    """(word, field) of key channel ``dim`` in its token's code row.

    Within each word, fields ``f`` and ``f + E/2`` hold the adjacent channels ``2f`` and
    ``2f + 1`` of the word's ``E`` channels (interleaved), so a mask of bits
    ``f * bits`` and ``16 + f * bits`` extracts a channel pair.
    """
    per_word = 32 // bits
    e = dim % per_word
    return dim // per_word, e // 2 + (per_word // 2) * (e % 2)


def key_code_dim(word, field, bits):
    """The key channel that :func:`key_code_field` stores in ``(word, field)``."""
    half = 16 // bits
    return word * (32 // bits) + 2 * (field % half) + field // half


def value_chunk_dims(group_size):
    """Channels of one value row a decode lane holds contiguously (2, 4 or 8): a tensor-core
    tile of 16 channels must lie within one quantization group of ``group_size``."""
    return min(8, group_size // 8)


def value_code_field(token, dim, bits, head_dim, chunk):
    """(word, field) of value (``token``, ``dim``) within its (block, head) run of code words.

    Values are stored in the order the decode kernel's lanes read them (mma A fragments
    of ``V^T``, 16 tokens per k-step): k-step ``token // 16`` holds 32 lanes' runs of
    ``head_dim // (4 * R)`` words (``R = 16 // bits`` fragment registers per word), lane
    ``4 * gid + tig`` holding tokens ``2tig, 2tig+1, 2tig+8, 2tig+9`` of the channels
    ``chunk * (8c + gid) .. + chunk`` for every c. A word holds ``R / 4`` tiles' registers
    (``j = 4 * tile + slot``: channel ``+ slot % 2``, token ``+ 8 * (slot // 2)``); register
    ``j`` is field ``f = 2 * (j // 4) + j % 2 + (R / 2) * (slot // 2)`` and its next token
    field ``f + R``. So INT4 (``R = 4``) keeps fields in register order, and INT2 (``R = 8``)
    puts slots 2 and 3 of each tile 8 bits above slots 0 and 1: after one shift by 8 that
    the word's slot-2/3 registers share, the two registers of an mma row (slots 0 and 2,
    or 1 and 3) sit at the same bit, which the decode kernel needs (one ``shf`` a word
    where register order took three). ``chunk`` is :func:`value_chunk_dims`.
    """
    per_word = 16 // bits
    lane_words = head_dim // (4 * per_word)
    kstep, r = token // 16, token % 16
    q, rem = dim // chunk, dim % chunk
    tile = (q // 8) * (chunk // 2) + rem // 2
    slot = rem % 2 + 2 * (r // 8)
    reg = 4 * tile + slot
    lane = 4 * (q % 8) + (r % 8) // 2
    field = 2 * ((reg % per_word) // 4) + slot % 2 + (per_word // 2) * (slot // 2)
    return (kstep * 32 + lane) * lane_words + reg // per_word, field + per_word * (r % 2)


def value_code_token_dim(word, field, bits, head_dim, chunk):
    """The (token, dim) that :func:`value_code_field` stores in ``(word, field)``."""
    per_word = 16 // bits
    lane_words = head_dim // (4 * per_word)
    kstep, lane = word // (32 * lane_words), (word // lane_words) % 32
    f = field % per_word
    high, low = f // (per_word // 2), f % (per_word // 2)  # slot // 2; 2 * (tile in the word) + slot % 2
    reg = (word % lane_words) * per_word + 4 * (low // 2) + 2 * high + low % 2
    tile, slot = reg // 4, reg % 4
    dim = chunk * (8 * (tile // (chunk // 2)) + lane // 4) + 2 * (tile % (chunk // 2)) + slot % 2
    token = 16 * kstep + 8 * (slot // 2) + 2 * (lane % 4) + field // per_word
    return token, dim
