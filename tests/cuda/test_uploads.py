"""hexcore.cuda.uploads: a step's index arrays to the device in one copy."""

import numpy as np
import pytest
from numba import cuda

from hexcore import HexcoreInvalidArgumentError
from hexcore.cuda.uploads import WORDS, Uploads, packed_offsets, upload_once


def arrays_of(rng, shapes):
    return [rng.integers(-2**31, 2**31 - 1, shape, dtype=np.int64).astype(np.int32) for shape in shapes]


SHAPES = [(5,), (0,), (3, 7), (1,), (63, 0), (4, 4)]


def test_each_array_starts_on_16_bytes():
    offsets, words = packed_offsets([np.zeros(s, np.int32) for s in SHAPES])
    assert offsets == [0, 8, 8, 32, 36, 36] and words == 52
    assert all(at % WORDS == 0 for at in offsets)


def test_upload_once_gives_views_equal_to_the_arrays(rng):
    arrays = arrays_of(rng, SHAPES)
    views = upload_once(arrays)
    for a, view in zip(arrays, views):
        assert view.shape == a.shape and view.dtype == np.int32
        np.testing.assert_array_equal(view.copy_to_host(), a)


def test_uploads_over_many_steps_and_growth_keep_every_step_s_arrays(rng):
    uploads = Uploads(words=8)  # grows within the first step
    for step in range(5):
        uploads.begin()
        first = arrays_of(rng, SHAPES)
        second = arrays_of(rng, [(40,), (2, 9)])
        views = uploads.put(first) + uploads.put(second)
        for a, view in zip(first + second, views):
            np.testing.assert_array_equal(view.copy_to_host(), a, err_msg=f"step {step}")


def test_scratch_arrays_of_one_step_do_not_overlap_and_grow(rng):
    uploads = Uploads()
    for step in range(3):
        uploads.begin()
        want = [rng.standard_normal(shape).astype(np.float16) for shape in [(4, 64, 8), (1 << 19,), (3, 5)]]
        got = [uploads.scratch(w.shape, np.float16) for w in want]  # the second outgrows 1 MiB with the first
        for w, g in zip(want, got):
            assert g.shape == w.shape and g.dtype == np.float16
            g.copy_to_device(w)
        for w, g in zip(want, got):
            np.testing.assert_array_equal(g.copy_to_host(), w, err_msg=f"step {step}")


def test_a_put_before_begin_and_a_bad_array_are_refused():
    uploads = Uploads()
    with pytest.raises(HexcoreInvalidArgumentError, match=r"put: call begin\(stream\) first"):
        uploads.put([np.zeros(3, np.int32)])
    with pytest.raises(HexcoreInvalidArgumentError, match=r"scratch: call begin\(stream\) first"):
        uploads.scratch((3,), np.float16)
    uploads.begin()
    with pytest.raises(HexcoreInvalidArgumentError, match="expected host int32 arrays, got a int64 array"):
        uploads.put([np.zeros(3, np.int32), np.zeros(3, np.int64)])
    with pytest.raises(HexcoreInvalidArgumentError, match="got a list"):
        upload_once([[1, 2]])


def test_bad_sizes_shapes_dtypes_and_array_lists_raise_typed_errors():
    """Were TypeError, ValueError (negative dimensions) and numpy's dtype errors."""
    for words in ("3", -1, 1.5, None, 10**30, True):
        with pytest.raises(HexcoreInvalidArgumentError, match="words: expected an int"):
            Uploads(words)
    for arrays in (None, 3, np.zeros(3, np.int32), "ab"):
        with pytest.raises(HexcoreInvalidArgumentError, match="arrays: expected a list of host int32 arrays"):
            packed_offsets(arrays)
        with pytest.raises(HexcoreInvalidArgumentError, match="arrays: expected a list"):
            upload_once(arrays)
    uploads = Uploads(64)
    uploads.begin()
    with pytest.raises(HexcoreInvalidArgumentError, match="arrays: expected a list"):
        uploads.put(None)
    for shape, text in ((3, "shape: expected a tuple of ints, got int"), (None, "shape: expected a tuple"),
                        ((2, -1), r"shape\[1\]: expected an int in \[0, "), ((1.5,), r"shape\[0\]: expected an int"),
                        ([[1, 2]], r"shape\[0\]: expected an int")):
        with pytest.raises(HexcoreInvalidArgumentError, match=text):
            uploads.scratch(shape, np.float16)
    for dtype in ("3", object, -1, [1], "U4"):
        with pytest.raises(HexcoreInvalidArgumentError, match="dtype: expected a numeric numpy dtype"):
            uploads.scratch((2, 2), dtype)
    assert uploads.scratch([2, 3], np.float16).shape == (2, 3)


@pytest.mark.parametrize("stream", ["x", 1.5, True, [0]])
def test_a_bad_stream_is_refused_before_the_turn_changes(stream):
    """begin flipped its turn (and recorded on the old stream) before the stream raised."""
    uploads = Uploads()
    uploads.begin()
    turn = uploads.turn
    with pytest.raises(HexcoreInvalidArgumentError, match="stream"):
        uploads.begin(stream)
    assert uploads.turn == turn
    uploads.begin()
    assert uploads.turn == turn ^ 1


@cuda.jit
def _slow_copy(src, dst, naps):
    """dst = src, read after ``naps`` sleeps of 10 us."""
    for _ in range(naps):
        cuda.nanosleep(10000)
    i = cuda.grid(1)
    if i < src.shape[0]:
        dst[i] = src[i]


@pytest.mark.gpu
def test_a_turn_is_not_overwritten_while_another_stream_reads_it_gpu(rng):
    # step A's kernel reads its views for ~20 ms on stream s1; steps B and C run on s2,
    # and C takes A's turn again: its copy must wait for A's kernel (an event, not stream
    # order: the streams differ), or A's kernel would read C's values.
    s1, s2 = cuda.stream(), cuda.stream()
    uploads = Uploads()
    a, b, c = arrays_of(rng, [(256,)] * 3)
    out = cuda.device_array(256, np.int32)
    uploads.begin(s1)
    (view,) = uploads.put([a])
    _slow_copy[1, 256, s1](view, out, 2000)
    uploads.begin(s2)
    uploads.put([b])
    uploads.begin(s2)
    (view_c,) = uploads.put([c])
    cuda.synchronize()
    np.testing.assert_array_equal(out.copy_to_host(), a)
    np.testing.assert_array_equal(view_c.copy_to_host(), c)


def test_a_turn_gives_the_same_views_for_the_same_shapes_and_new_ones_after_growth(rng):
    """A serving loop puts the same shapes every step: two steps apart (the same turn) the
    views are the same objects (numba makes each in Python; a prepared launch finds them
    unchanged), with the new step's values; a grown buffer gives new views, right too."""
    uploads = Uploads(words=64)
    steps = []
    for step in range(4):
        uploads.begin()
        arrays = arrays_of(rng, [(5,), (3, 7)] + ([(80,)] if step == 3 else []))  # step 3 grows turn 1
        steps.append((uploads.put(arrays), uploads.scratch((2, 8), np.float16)))
        for a, view in zip(arrays, steps[-1][0]):
            np.testing.assert_array_equal(view.copy_to_host(), a, err_msg=f"step {step}")
    (views0, scratch0), (views1, scratch1), (views2, scratch2), (views3, scratch3) = steps
    assert all(a is b for a, b in zip(views0, views2)) and scratch0 is scratch2  # turn 0, twice
    assert not any(a is b for a, b in zip(views0, views1))  # the other turn's buffer
    assert not any(a is b for a, b in zip(views1, views3[:2]))  # turn 1 grew: a new buffer
    assert scratch1 is scratch3  # (its scratch did not grow)
