"""The sealed code order (hexcore/layout.py): documented examples, and a bijection for every shape."""

import numpy as np

from hexcore import layout
from tests import reference as ref


def test_code_order_documented():
    """Key rows interleave channel pairs within a word: INT4 channels 0..7 of a word sit in
    nibbles 0,4,1,5,2,6,3,7; values follow the decode kernel's fragments (layout.py)."""
    assert [layout.key_code_field(d, 4) for d in range(8)] == [(0, 0), (0, 4), (0, 1), (0, 5), (0, 2), (0, 6),
                                                                (0, 3), (0, 7)]
    assert [layout.key_code_field(d, 2)[1] for d in range(4)] == [0, 8, 1, 9]
    codes = np.arange(8, dtype=np.uint8)[None]  # channel c holds code c
    word = int(ref.pack_key_rows(codes, 4).view("<u4")[0, 0])
    assert [(word >> (4 * f)) & 15 for f in range(8)] == [0, 2, 4, 6, 1, 3, 5, 7]
    # values: tokens 0 and 1 of channel 0 share fragment register 0 of lane 0 (fields 0 and 4)
    assert layout.value_code_field(0, 0, 4, 64, 8) == (0, 0)
    assert layout.value_code_field(1, 0, 4, 64, 8) == (0, 4)
    assert layout.value_code_field(2, 0, 4, 64, 8) == (4, 0)  # tokens 2, 3: lane 1 (4 words per lane)
    for bits in (4, 2):
        for chunk in (2, 4, 8):
            t, d = np.meshgrid(np.arange(32), np.arange(64), indexing="ij")
            word, field = layout.value_code_field(t, d, bits, 64, chunk)
            assert len(set(zip(word.ravel(), field.ravel()))) == t.size  # a bijection onto the block's fields
            np.testing.assert_array_equal(layout.value_code_token_dim(word, field, bits, 64, chunk), (t, d))


def test_int2_value_rows_one_shift_apart():
    """INT2 value words: the two registers of an mma row (slots 0 and 2: channel c, tokens
    t and t + 8; slots 1 and 3: channel c + 1) lie exactly 8 bits apart, and the word's
    first tile sits below its second, so the decode's one shift by 8 a word lines them up
    (layout.value_code_field); INT4 keeps register order."""
    head_dim, chunk = 64, 8
    for tile in range(2):  # tiles 0 and 1 of lane 0's first word: channels 2 * tile, + 1
        for slot in range(4):
            dim, token = 2 * tile + slot % 2, 8 * (slot // 2)
            word, field = layout.value_code_field(token, dim, 2, head_dim, chunk)
            assert word == 0
            assert field == 2 * tile + slot % 2 + 4 * (slot // 2)  # bit 2 * field
            assert layout.value_code_field(token + 1, dim, 2, head_dim, chunk) == (0, field + 8)  # next token
    assert [layout.value_code_field(8 * (s // 2), s % 2, 4, head_dim, chunk)[1] for s in range(4)] == [0, 1, 2, 3]
