"""The integer-argument rule of every public entry point, in one place.

An integer argument is a Python int or a numpy integer (never a bool, a float or a
string); out of range it raises HexcoreInvalidArgumentError naming the argument, the
range and the value, so the message is the same wherever it comes from:
``"<name>: expected an int in [low, high], got <value>"``.

Callers with their own error type (a config field raises HexcoreConfigError, a
sequence id out of range is a sequence error) catch and convert, or build the same
message with :func:`range_message`. Hot paths may test ``type(x) is int`` and a range
inline, as long as anything else ends in :func:`as_int`.
"""

from __future__ import annotations

import math
import numbers
import operator

import numpy as np

from .errors import HexcoreInvalidArgumentError

INT_LIMIT = 2**62  # beyond this nothing in hexcore is a valid count or id (and int64 math stays exact)


def as_int(name: str, value, low: int | None = None, high: int | None = None) -> int:
    """``value`` as a Python int in ``[low, high]`` (either bound optional), or raise.

    Raises HexcoreInvalidArgumentError: ``"<name>: expected an int in [low, high], got <value>"``
    (the bounds shown as the caller gave them; ``>= low`` or ``<= high`` when one is None,
    and the limit ``2**62`` in their place when it is what the value broke).
    """
    value = int_value(name, value)
    if (low is not None and value < low) or (high is not None and value > high) or not -INT_LIMIT <= value < INT_LIMIT:
        raise HexcoreInvalidArgumentError(range_message(name, value, low, high))
    return value


def int_value(name: str, value) -> int:
    """``value`` as a Python int of any size (numpy integers converted), or raise.

    Raises HexcoreInvalidArgumentError ``"<name>: expected an int, got <type> <value>"``
    for bools, floats, strings, None and every other non-integer.
    """
    if type(value) is int:
        return value
    if isinstance(value, (bool, np.bool_)):
        raise HexcoreInvalidArgumentError(f"{name}: expected an int, got {bool(value)}")
    try:
        return operator.index(value)
    except TypeError:
        text = str(value) if isinstance(value, np.generic) else shown(value, 1000)  # float64 2.0, not np.float64(2.0)
        raise HexcoreInvalidArgumentError(f"{name}: expected an int, got {type(value).__name__} {text}") from None


def shown(value, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters (with "..."), for error messages; a
    value whose ``__repr__`` raises is shown by its type (the message must still be typed)."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 (the caller's object: any exception)
        text = f"<{type(value).__name__} whose repr raised>"
    return text if len(text) <= limit else text[:limit] + "..."


def real_value(value) -> float:
    """``value`` as a float when it is a real number (Python's or numpy's, never a bool); NaN
    for anything else, infinity for an int too large for a float. For range checks that
    then need only ``math.isfinite`` and comparisons."""
    if not isinstance(value, numbers.Real) or isinstance(value, (bool, np.bool_)):
        return math.nan
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def positive_real(name: str, value) -> float:
    """``value`` as a positive finite float, or HexcoreInvalidArgumentError
    ``"<name>: expected a positive finite number, got <value>"``."""
    number = real_value(value)
    if not (math.isfinite(number) and number > 0):
        raise HexcoreInvalidArgumentError(f"{name}: expected a positive finite number, got {shown(value)}")
    return number


def range_message(name: str, value: int, low: int | None, high: int | None) -> str:
    """The out-of-range message: ``"<name>: expected an int in [low, high], got <value>"``."""
    beyond_limit = not -INT_LIMIT <= value < INT_LIMIT
    if beyond_limit and (low is None or high is None):
        low = -INT_LIMIT if low is None else low
        high = INT_LIMIT - 1 if high is None else high
    return f"{name}: expected an int {_range(low, high)}, got {value}"


def _range(low, high) -> str:
    if low is not None and high is not None:
        return f"in [{low}, {high}]"
    if low is not None:
        return f">= {low}"
    if high is not None:
        return f"<= {high}"
    return f"in [{-INT_LIMIT}, {INT_LIMIT})"
