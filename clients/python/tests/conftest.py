# mypy: disallow-untyped-calls=False
"""Fixtures: servers that the tests start themselves (see servers.py), and the ``heavy`` marker
for the tests that make test-python runs on one server of the matrix only."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from servers import Cluster, Server, call


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


def _text(raw: object) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def _info(s: Server, section: str) -> str:
    conn = s.raw()
    try:
        return _text(call(conn, "INFO", section))
    finally:
        conn.disconnect()


@pytest.fixture
def replicated_cluster() -> Iterator[tuple[Cluster, Server]]:
    """3 masters with the module, the first with a replica (met, then made its replica with
    CLUSTER REPLICATE, synced and online)."""
    cluster = Cluster(3)
    try:
        master = cluster.nodes[0]
        with Server(cluster=True, extra=["--repl-diskless-sync-delay", "0"]) as replica:
            conn = replica.raw()
            call(conn, "CLUSTER", "MEET", "127.0.0.1", master.port)
            deadline = time.monotonic() + 20
            mconn = master.raw()
            wanted = _text(call(mconn, "CLUSTER", "MYID"))
            mconn.disconnect()
            while wanted not in _text(call(conn, "CLUSTER", "NODES")):
                assert time.monotonic() < deadline, "the replica never met the master"
                time.sleep(0.05)
            call(conn, "CLUSTER", "REPLICATE", wanted)
            conn.disconnect()
            while "master_link_status:up" not in _info(replica, "replication") or "state=online" not in _info(
                master, "replication"
            ):
                assert time.monotonic() < deadline, "the replica never synced"
                time.sleep(0.05)
            yield cluster, replica
    finally:
        cluster.stop()
