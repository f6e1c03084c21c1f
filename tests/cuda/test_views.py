"""hexcore.cuda.views: device views made once per array."""

import numpy as np
import pytest
from numba import cuda

from hexcore.cuda import views
from hexcore.cuda.store import flat_words


def test_a_view_is_made_once_per_array_and_key_and_shares_its_memory():
    base = cuda.to_device(np.arange(24, dtype=np.int32).reshape(4, 6))
    made = []

    def make(a):
        made.append(a)
        return a[1]

    first = views.memo(base, "row 1", make)
    assert views.memo(base, "row 1", make) is first and made == [base]
    assert views.layer_of(base, 1) is views.layer_of(base, 1) and views.layer_of(base, 2) is not first
    assert views.flat(base) is views.flat(base) and views.flat(base).shape == (24,)
    assert views.sliced(base, 1, 3).shape == (2, 6) and views.sliced(base, 1) is views.sliced(base, 1)
    assert flat_words(base) is flat_words(base) and flat_words(base).dtype == np.uint32
    first.copy_to_device(np.full(6, -1, np.int32))  # a view, not a copy: the base sees it
    np.testing.assert_array_equal(base.copy_to_host()[1], -1)
    other = cuda.to_device(np.arange(24, dtype=np.int32).reshape(4, 6))
    assert views.layer_of(other, 1) is not views.layer_of(base, 1)  # each array its own


def test_views_are_bounded_per_array_and_made_each_time_where_none_can_be_kept(monkeypatch):
    monkeypatch.setattr(views, "MAX_VIEWS", 4)
    base = cuda.to_device(np.arange(8, dtype=np.int32))
    kept = [views.sliced(base, i) for i in range(4)]
    assert views.sliced(base, 0) is kept[0]
    views.sliced(base, 4)  # the fifth: the four are dropped, then made anew
    assert views.sliced(base, 0) is not kept[0]
    assert len(vars(base)[views.ATTR]) == 2
    made = [views.memo(3, "k", lambda x: [x]) for _ in range(2)]  # an int holds no attributes
    assert made == [[3], [3]] and made[0] is not made[1]


@pytest.mark.parametrize("call, text", [
    (lambda a: views.sliced(a, "3"), "start: expected an int, got str"),
    (lambda a: views.sliced(a, 0, 1.5), "stop: expected an int, got float 1.5"),
    (lambda a: views.sliced(a, [1]), "start: expected an int, got list"),
    (lambda a: views.sliced(3, 0, 1), r"array: cannot take \[0:1\] of int"),
    (lambda a: views.layer_of(a, 2), r"index: 2 is outside the first axis of \w+ of shape \(2, 4\)"),
    (lambda a: views.layer_of(a, np.array([1])), "index: expected an int, got ndarray"),
    (lambda a: views.layer_of(a, True), "index: expected an int, got True"),
    (lambda a: views.layer_of(a, 1.5), "index: expected an int, got float 1.5"),
    (lambda a: views.flat(None), "array: expected a C-contiguous device array, got NoneType"),
    (lambda a: views.flat("ab"), "array: expected a C-contiguous device array, got str"),
])
def test_bad_indices_and_arrays_raise_typed_errors(call, text):
    """Were IndexError, TypeError (unhashable keys, slice indices) and AttributeError."""
    from hexcore import HexcoreInvalidArgumentError

    array = cuda.to_device(np.arange(8, dtype=np.int32).reshape(2, 4))
    with pytest.raises(HexcoreInvalidArgumentError, match=text):
        call(array)
    assert views.layer_of(array, np.int64(1)).shape == (4,) and views.sliced(array, np.int32(1)).shape == (1, 4)
