"""Typed errors and Status codes, and the integer-argument rule that every public entry point shares."""

import math
import re

import numpy as np
import pytest

import hexcore
from hexcore._checks import as_int, int_value, positive_real, range_message, real_value, shown
from hexcore.errors import (
    HexcoreCorruptionError,
    HexcoreError,
    HexcoreInvalidArgumentError,
    HexcoreInvalidBlockError,
    HexcoreInvalidSequenceError,
    HexcoreOOMError,
    Status,
    raise_for_status,
)


def test_ok_does_not_raise():
    raise_for_status(Status.OK)
    raise_for_status(0)


@pytest.mark.parametrize("status,error", [
    (Status.OUT_OF_MEMORY, HexcoreOOMError),
    (Status.INVALID_BLOCK, HexcoreInvalidBlockError),
    (Status.INVALID_SEQUENCE, HexcoreInvalidSequenceError),
    (Status.INVALID_ARGUMENT, HexcoreInvalidArgumentError),
    (Status.CORRUPTED, HexcoreCorruptionError),
])
def test_each_status_has_its_error(status, error):
    with pytest.raises(error, match="seq 7"):
        raise_for_status(int(status), "seq 7")
    assert issubclass(error, HexcoreError)


def test_unknown_status_is_an_error_naming_it():
    with pytest.raises(HexcoreInvalidArgumentError, match="99"):
        raise_for_status(99)


@pytest.mark.parametrize("status", [s for s in Status if s is not Status.OK])
def test_every_non_ok_status_is_mapped(status):
    with pytest.raises(HexcoreError):
        raise_for_status(status)


@pytest.mark.parametrize("name", hexcore.__all__)
def test_public_names_exported(name):
    assert getattr(hexcore, name) is not None


# -- the integer-argument rule (hexcore._checks) -------------------------------------------
@pytest.mark.parametrize("value", [5, np.int64(5), np.int8(5), np.uint64(5), np.intp(5)])
def test_as_int_accepts_ints_and_numpy_ints(value):
    got = as_int("n", value, 0, 9)
    assert got == 5 and type(got) is int


@pytest.mark.parametrize("value, shown", [
    (True, "True"), (np.bool_(False), "False"), (5.0, "float 5.0"), (np.float32(5), "float32 5.0"),
    ("5", "str '5'"), (None, "NoneType None"), ([5], "list [5]"),
])
def test_as_int_rejects_non_ints(value, shown):
    with pytest.raises(HexcoreInvalidArgumentError, match=rf"^n: expected an int, got {re.escape(shown)}$"):
        as_int("n", value, 0, 9)


@pytest.mark.parametrize("value, low, high, message", [
    (10, 0, 9, "n: expected an int in [0, 9], got 10"),
    (-1, 0, None, "n: expected an int >= 0, got -1"),
    (10, None, 9, "n: expected an int <= 9, got 10"),
    (2**62, None, None, f"n: expected an int in [{-2**62}, {2**62 - 1}], got {2**62}"),
    (2**70, 1, None, f"n: expected an int in [1, {2**62 - 1}], got {2**70}"),
    (-(2**70), None, 5, f"n: expected an int in [{-2**62}, 5], got {-(2**70)}"),
])
def test_as_int_out_of_range_names_range_and_value(value, low, high, message):
    with pytest.raises(HexcoreInvalidArgumentError, match=f"^{re.escape(message)}$"):
        as_int("n", value, low, high)
    assert range_message("n", value, low, high) == message


def test_int_value_has_no_range():
    assert int_value("n", np.int64(-3)) == -3 and int_value("n", 10**30) == 10**30


# -- the real-number rule (hexcore._checks) ------------------------------------------------
def test_real_value_is_nan_for_non_numbers_and_signed_infinity_past_floats():
    assert real_value(np.float32(1.5)) == 1.5 and real_value(np.int64(-3)) == -3.0
    assert real_value(10**400) == math.inf and real_value(-10**400) == -math.inf
    for value in (True, np.bool_(False), "1", None, [1], np.zeros(2), 1j):
        assert math.isnan(real_value(value)), value


def test_positive_real_names_the_argument_and_a_short_value():
    assert positive_real("x", 2) == 2.0
    for value in (0, -1.0, math.nan, math.inf, 10**400, True, "2"):
        with pytest.raises(HexcoreInvalidArgumentError, match="^x: expected a positive finite number, got "):
            positive_real("x", value)
    assert shown("a" * 100) == repr("a" * 100)[:60] + "..." and shown(5) == "5"


class _FailingRepr:
    def __repr__(self):
        raise RuntimeError("repr")


def test_a_value_whose_repr_raises_is_still_a_typed_error():
    """``shown`` (every message's value) and ``int_value`` show such a value by its type:
    the RuntimeError of its ``__repr__`` no longer replaces the typed error."""
    value = _FailingRepr()
    assert shown(value) == "<_FailingRepr whose repr raised>"
    with pytest.raises(HexcoreInvalidArgumentError, match="^n: expected an int, got _FailingRepr <_FailingRepr "):
        as_int("n", value)
    with pytest.raises(HexcoreInvalidArgumentError, match="^x: expected a positive finite number, got <_Failing"):
        positive_real("x", value)
