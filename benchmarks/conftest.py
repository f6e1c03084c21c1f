"""Benchmarks share the tests' set-up: simulator without a GPU, `gpu` skipped there."""

from tests.conftest import pytest_collection_modifyitems  # noqa: F401
