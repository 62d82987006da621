# mypy: disallow-untyped-calls=False
"""Durable admissions against a real master and its replica (``--replicaof``): ``WAIT`` after
every admission on a connection of the client's lane; an admission the replica did not
acknowledge (the replica frozen) denied, admitted and counted, or answered by the failure
policy, as ``ShortAck`` says; ``WAITAOF`` where the server has it, ``WAIT`` where it does not
(Redis 7.0); both clients."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from ratelimit_client import (
    AsyncClient,
    Client,
    Degraded,
    Durability,
    DurabilityStats,
    FixedWindow,
    Options,
    ShortAck,
    Unsupported,
)
from servers import SLACK, Cluster, Server, call


@pytest.fixture
def pair() -> Iterator[tuple[Server, Server]]:
    """A master and its replica (append-only, fsynced at every write, so that WAITAOF too is
    acknowledged in time)."""
    with Server(extra=["--repl-diskless-sync-delay", "0"]) as master:
        extra = ["--replicaof", "127.0.0.1", str(master.port), "--repl-diskless-sync-delay", "0"]
        extra += ["--appendonly", "yes", "--appendfsync", "always"]
        with Server(extra=extra) as replica:
            deadline = time.monotonic() + 10
            # Synced, and taken as online by the master (its first REPLCONF ACK came): only then
            # does WAIT count it.
            while "master_link_status:up" not in info(replica, "replication") or "state=online" not in info(
                master, "replication"
            ):
                assert time.monotonic() < deadline, "the replica never synced"
                time.sleep(0.02)
            # The append-only file the replica rewrites after the sync is done (WAITAOF counts
            # what it has fsynced in it).
            while any(
                f"{k}:0" not in info(replica, "persistence")
                for k in ("aof_rewrite_in_progress", "aof_rewrite_scheduled")
            ):
                assert time.monotonic() < deadline, "the replica never rewrote its append-only file"
                time.sleep(0.02)
            yield master, replica


def info(s: Server, section: str) -> str:
    conn = s.raw()
    try:
        raw = call(conn, "INFO", section)
    finally:
        conn.disconnect()
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def calls(s: Server, command: str) -> int:
    for line in info(s, "commandstats").splitlines():
        if line.startswith(f"cmdstat_{command}:calls="):
            return int(line.split("=", 1)[1].split(",", 1)[0])
    return 0


def has_waitaof(s: Server) -> bool:
    conn = s.raw()
    try:
        return bool(call(conn, "COMMAND", "INFO", "waitaof")[0] is not None)
    finally:
        conn.disconnect()


WINDOW = FixedWindow(5, 3600)


def test_admissions_wait_for_the_replica(pair: tuple[Server, Server]) -> None:
    master, replica = pair
    c = Client.from_url(master.url, SLACK).with_durability(Durability(replicas=1, timeout=1.5))
    assert [c.check("k", WINDOW).decision.allowed for _ in range(6)] == [True] * 5 + [False]
    # Five admissions waited (one WAIT each); the denial was answered at once.
    assert (c.durability_stats(), calls(master, "wait")) == (DurabilityStats(acknowledged=5, short=0), 5)
    assert replica.connect().get("k") == master.connect().get("k")
    assert c.check_upto("u", WINDOW, 3).granted == 3 and c.durability_stats().acknowledged == 6
    assert c.check_all([("{a}1", WINDOW), ("{a}2", WINDOW)]).allowed and calls(master, "wait") == 7


@pytest.mark.parametrize(
    ("short", "allowed", "degraded"),
    [(ShortAck.DENY, False, None), (ShortAck.ADMIT, True, None), (ShortAck.FAILURE_POLICY, True, Degraded.FAIL_OPEN)],
)
def test_an_unacknowledged_admission_is_what_short_says(
    pair: tuple[Server, Server], short: ShortAck, allowed: bool, degraded: Degraded | None
) -> None:
    master, replica = pair
    c = Client.from_url(master.url, SLACK).with_durability(Durability(replicas=1, timeout=0.2, short=short))
    replica.freeze()
    try:
        o = c.check("k", WINDOW)
    finally:
        replica.thaw()
    assert (o.decision.allowed, o.degraded, c.durability_stats()) == (allowed, degraded, DurabilityStats(0, 1))
    if short is ShortAck.DENY:
        # Refused as fail-closed refuses; the unit stays spent on the master (never over-admits).
        assert (o.decision.retry_after_ms, o.decision.remaining, o.granted) == (1000, 4, 0)
    assert str(master.connect().get("k")).split(" ")[1] == "1"


def test_waitaof_or_wait_where_the_server_has_none(pair: tuple[Server, Server]) -> None:
    master, _ = pair
    c = Client.from_url(master.url, SLACK).with_durability(Durability(replicas=1, timeout=1.5, aof=True))
    assert [c.check("k", WINDOW).decision.allowed for _ in range(2)] == [True, True]
    assert c.durability_stats() == DurabilityStats(acknowledged=2, short=0)
    if has_waitaof(master):
        assert (calls(master, "waitaof"), calls(master, "wait")) == (2, 0)
    else:  # Redis 7.0: unknown command once, then WAIT on every call
        assert calls(master, "wait") == 2


def test_the_asyncio_client_waits_alike(pair: tuple[Server, Server]) -> None:
    master, replica = pair

    async def run() -> tuple[list[bool], DurabilityStats]:
        c = AsyncClient.from_url(master.url, SLACK).with_durability(Durability(replicas=1, timeout=1.5))
        got = await asyncio.gather(*(c.check("k", WINDOW) for _ in range(6)))
        stats = c.durability_stats()
        await c.aclose()
        return sorted(o.decision.allowed for o in got), stats

    assert asyncio.run(run()) == ([False] + [True] * 5, DurabilityStats(5, 0))
    assert calls(master, "wait") == 5 and replica.connect().get("k") == master.connect().get("k")


def test_what_cannot_be_durable() -> None:
    c = Client.from_url("redis://127.0.0.1:1", Options(timeout=0.1))
    with pytest.raises(Unsupported):
        c.with_durability(Durability(replicas=1, timeout=0.1))
    with pytest.raises(Unsupported):
        c.with_durability(Durability(replicas=0, timeout=0.05))


def keys_of(cluster: Cluster) -> tuple[str, str]:
    """A key of the master with the replica, and one of a master without."""
    first = cluster.nodes[0].port
    on = next(f"d:{i}" for i in range(1000) if cluster.owner(f"d:{i}").port == first)
    off = next(f"d:{i}" for i in range(1000) if cluster.owner(f"d:{i}").port != first)
    return on, off


def test_durable_admissions_on_a_cluster_wait_on_the_master_of_the_key(
    replicated_cluster: tuple[Cluster, Server],
) -> None:
    """The call and its WAIT go to the master of the key, on a connection of their own: on the
    master with a replica every admission is acknowledged; on one without, none is (denied, as
    ShortAck.DENY says)."""
    cluster, replica = replicated_cluster
    master = cluster.nodes[0]
    on, off = keys_of(cluster)
    c = Client.from_url(master.url, SLACK, cluster=True).with_durability(Durability(replicas=1, timeout=0.3))
    assert [c.check(on, WINDOW).decision.allowed for _ in range(6)] == [True] * 5 + [False]
    assert (c.durability_stats(), calls(master, "wait")) == (DurabilityStats(acknowledged=5, short=0), 5)
    conn = replica.raw()
    call(conn, "READONLY")
    assert call(conn, "GET", on).decode() == master.connect().get(on)
    conn.disconnect()
    o = c.check(off, WINDOW)
    assert (o.decision.allowed, o.decision.retry_after_ms, o.degraded) == (False, 1000, None)
    assert c.durability_stats() == DurabilityStats(acknowledged=5, short=1)
    assert calls(cluster.owner(off), "wait") == 1 and calls(master, "wait") == 5
    both = [("{" + on + "}:a", WINDOW), ("{" + on + "}:b", WINDOW)]
    assert c.check_all(both).allowed and calls(master, "wait") == 6

    async def run() -> tuple[list[bool], bool, DurabilityStats]:
        a = AsyncClient.from_url(master.url, SLACK, cluster=True).with_durability(Durability(replicas=1, timeout=0.3))
        got = await asyncio.gather(*(a.check("{" + on + "}:async", WINDOW) for _ in range(6)))
        short = await a.check("{" + off + "}:async", WINDOW)
        stats = a.durability_stats()
        await a.aclose()
        return sorted(o.decision.allowed for o in got), short.decision.allowed, stats

    assert asyncio.run(run()) == ([False] + [True] * 5, False, DurabilityStats(5, 1))
    assert calls(master, "wait") == 11
