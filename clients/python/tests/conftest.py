# mypy: disallow-untyped-calls=False
"""Fixtures: servers that the tests start themselves (see servers.py), and the ``heavy`` marker
for the tests that make test-python runs on one server of the matrix only."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from servers import Server


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "heavy: what tests the package alone, whatever the server: 200 racers, the frameworks, the wheel in a "
        "fresh venv (make test-python runs them on Redis 7.0 only)",
    )


@pytest.fixture
def server() -> Iterator[Server]:
    """A server with the module, on the real clock."""
    with Server() as s:
        yield s


@pytest.fixture
def bare_server() -> Iterator[Server]:
    """A server without the module."""
    with Server(module=False) as s:
        yield s


@pytest.fixture
def clock_server() -> Iterator[Server]:
    """A server with the module under its test clock."""
    with Server(test_clock=True) as s:
        yield s
