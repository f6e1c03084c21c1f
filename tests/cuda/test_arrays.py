"""hexcore.cuda.arrays: checks of arrays handed to a launch."""

import numpy as np
import pytest

from hexcore import HexcoreInvalidArgumentError
from hexcore.cuda.arrays import checked


class Exporter:
    """A CUDA-array exporter (as a torch tensor is) that no numba view is ever made of."""

    def __init__(self, shape, typestr="<f2", strides=None, ptr=0x10000, readonly=False):
        self.shape = shape
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "strides": strides,
                                         "data": (ptr, readonly), "version": 3}


def test_an_exporter_checked_without_a_view_is_returned_as_given():
    x = Exporter((2, 3, 8))
    assert checked(x, "q", np.float16, (2, None, 8), view=False) is x
    assert checked(x, "out", np.float16, (2, 3, 8), view=False) is x


@pytest.mark.parametrize("exporter, match", [
    (Exporter((2, 3, 8), typestr="<f4"), "q: expected dtype float16, got float32"),
    (Exporter((2, 4, 8)), r"q: expected shape .*7\), got \(2, 4, 8\)"),
    (Exporter((2, 3, 8), strides=(2, 96, 12)), "q: expected C-contiguous strides"),
    (Exporter((2, 3, 8), ptr=0x10002), "q: expected a 16-byte aligned address, got 0x10002"),
])
def test_an_exporter_checked_without_a_view_names_what_is_wrong(exporter, match):
    shape = (2, None, 7) if "shape" in match else (2, None, 8)
    with pytest.raises(HexcoreInvalidArgumentError, match=match):
        checked(exporter, "q", np.float16, shape, view=False)


def test_a_read_only_exporter_is_refused_as_an_output():
    with pytest.raises(HexcoreInvalidArgumentError, match="out: an output must be writable"):
        checked(Exporter((4,), readonly=True), "out", np.float16, (4,), view=False)


def test_check_separate_refuses_an_output_sharing_memory_and_skips_what_cannot():
    """An output overlapping another output or an input is refused, naming both (the output
    first); None, host and empty arrays are accepted (nothing of theirs is written in place)."""
    from numba import cuda

    from hexcore.cuda.arrays import check_separate

    words = cuda.to_device(np.zeros(16, np.uint32))
    a, b, c = words[:4], words[4:8], words[6:10]
    check_separate({"a": a, "b": b}, {"c": words[8:], "none": None, "host": np.zeros(4, np.uint32)})
    for outputs, inputs, text in (({"a": a, "b": c}, {}, None), ({"b": b, "c": c}, {}, "c: shares memory with b"),
                                  ({"a": a}, {"words": words}, "a: shares memory with words"),
                                  ({"b": b}, {"view": words[4:8].view(np.int32)}, "b: shares memory with view")):
        if text is None:
            check_separate(outputs, inputs)
            continue
        with pytest.raises(HexcoreInvalidArgumentError, match=f"^{text}; pass separate arrays$"):
            check_separate(outputs, inputs)
    check_separate({"empty": words[:0], "a": a}, {"words": words[4:]})
