"""The exception tree and the Status codes of hexcore's no-raise ``try_*`` API.

njit code cannot raise usefully, so it returns a :class:`Status`; the thin Python
classes turn a non-OK status into its exception with :func:`raise_for_status`.
"""

from __future__ import annotations

import enum


class HexcoreError(Exception):
    """Base class of every error hexcore raises on purpose."""


class HexcoreConfigError(HexcoreError, ValueError):
    """A configuration field has a bad value; the message names field and value."""


class HexcoreOOMError(HexcoreError, MemoryError):
    """The block pool (or the tail slots) cannot serve a request."""


class HexcoreInvalidBlockError(HexcoreError, ValueError):
    """A block id is out of range, free when it should be live, or live when free."""


class HexcoreInvalidSequenceError(HexcoreError, ValueError):
    """A sequence id is unknown, freed, out of range, or asked for a bad length."""


class HexcoreInvalidArgumentError(HexcoreError, ValueError):
    """An argument has the wrong type, dtype, shape, strides, device or alignment."""


class HexcoreCorruptionError(HexcoreError):
    """A checksum or canary does not match: cache memory was corrupted."""


class HexcoreCudaError(HexcoreError, RuntimeError):
    """A CUDA driver call failed; the message names the call and its CUresult."""


class Status(enum.IntEnum):
    """Result codes shared by njit code, ``try_*`` methods and batch calls."""

    OK = 0
    OUT_OF_MEMORY = 1
    INVALID_BLOCK = 2
    INVALID_SEQUENCE = 3
    INVALID_ARGUMENT = 4
    CORRUPTED = 5


_ERROR_FOR_STATUS = {
    Status.OUT_OF_MEMORY: HexcoreOOMError,
    Status.INVALID_BLOCK: HexcoreInvalidBlockError,
    Status.INVALID_SEQUENCE: HexcoreInvalidSequenceError,
    Status.INVALID_ARGUMENT: HexcoreInvalidArgumentError,
    Status.CORRUPTED: HexcoreCorruptionError,
}


def raise_for_status(status: int, message: str = "") -> None:
    """Raise the exception that ``status`` stands for; return quietly for ``OK``.

    An int that is not a Status value raises :class:`HexcoreInvalidArgumentError`
    naming it, so a corrupted status never passes for success.
    """
    from ._checks import int_value  # _checks imports this module

    try:
        status = Status(int_value("status", status))
    except ValueError:
        raise HexcoreInvalidArgumentError(f"unknown status code {status!r}") from None
    if status is Status.OK:
        return
    raise _ERROR_FOR_STATUS[status](message or status.name.lower().replace("_", " "))
