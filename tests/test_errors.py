import pytest

import hexcore
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


def test_every_non_ok_status_is_mapped():
    for status in Status:
        if status is not Status.OK:
            with pytest.raises(HexcoreError):
                raise_for_status(status)


def test_public_names_exported():
    for name in hexcore.__all__:
        assert getattr(hexcore, name) is not None or name == "__version__"
