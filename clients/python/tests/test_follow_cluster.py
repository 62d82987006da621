# mypy: disallow-untyped-calls=False
"""Following a cluster failover: 3 masters, the first with a replica. A manual ``CLUSTER
FAILOVER`` (the old master answers ``MOVED``, which redis-py's cluster client follows), and a
master frozen with SIGSTOP whose replica takes over with ``CLUSTER FAILOVER FORCE`` (the frozen
master answers nothing: the calls are answered by the failure policy until the slot map read
again names the new master); both clients carry on from the replicated count, to the unit."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from ratelimit_client import AsyncClient, Client, Degraded, FixedWindow, Options, Outcome
from servers import Cluster, Server, call

WINDOW = FixedWindow(100, 3600)
OPTS = Options(timeout=0.2)


def text(raw: object) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def role(s: Server) -> str:
    conn = s.raw()
    try:
        return text(call(conn, "ROLE")[0])
    finally:
        conn.disconnect()


def key_of(cluster: Cluster, prefix: str) -> str:
    """A key of the first master (the one with the replica)."""
    first = cluster.nodes[0].port
    return next(f"{prefix}:{i}" for i in range(1000) if cluster.owner(f"{prefix}:{i}").port == first)


def replicated(master: Server) -> None:
    """Every write of the master so far is on its replica."""
    conn = master.raw()
    try:
        assert call(conn, "WAIT", 1, 5000) == 1
    finally:
        conn.disconnect()


def promote(replica: Server, how: tuple[str, ...], others: list[Server]) -> None:
    """``CLUSTER FAILOVER [FORCE]`` on the replica, until it is a master that the other
    masters know as one."""
    conn = replica.raw()
    call(conn, "CLUSTER", "FAILOVER", *how)
    conn.disconnect()
    deadline = time.monotonic() + 20
    while True:
        ok = role(replica) == "master"
        for o in others:
            c = o.raw()
            nodes = text(call(c, "CLUSTER", "NODES"))
            c.disconnect()
            line = next((ln for ln in nodes.splitlines() if f":{replica.port}@" in ln), "")
            ok = ok and "master" in line.split(" ")[2] if line else False
        if ok:
            return
        assert time.monotonic() < deadline, "the replica never took over"
        time.sleep(0.05)


def until_decided(call_once: Callable[[], Outcome], within: float = 20.0) -> tuple[Outcome, int]:
    """Calls until Redis decides: that outcome, and how many the policy answered before."""
    deadline = time.monotonic() + within
    answered = 0
    while True:
        o = call_once()
        if o.degraded is None:
            return o, answered
        assert o.degraded is Degraded.FAIL_OPEN
        answered += 1
        assert time.monotonic() < deadline, "Redis never decided"
        time.sleep(0.05)


async def until_decided_async(call_once: Callable[[], Awaitable[Outcome]], within: float = 20.0) -> Outcome:
    deadline = time.monotonic() + within
    while True:
        o = await call_once()
        if o.degraded is None:
            return o
        assert o.degraded is Degraded.FAIL_OPEN
        assert time.monotonic() < deadline, "Redis never decided"
        await asyncio.sleep(0.05)


def test_a_manual_failover_is_followed(replicated_cluster: tuple[Cluster, Server]) -> None:
    cluster, replica = replicated_cluster
    master, others = cluster.nodes[0], cluster.nodes[1:]
    k = key_of(cluster, "manual")
    c = Client.from_url(master.url, OPTS, cluster=True)
    assert [c.check(k, WINDOW).decision.remaining for _ in range(10)][-1] == 90

    async def before() -> tuple[AsyncClient, int]:
        a = await AsyncClient.open(master.url, OPTS, cluster=True)
        got = [(await a.check("{" + k + "}:a", WINDOW)).decision.remaining for _ in range(10)]
        return a, got[-1]

    loop = asyncio.new_event_loop()
    try:
        a, left = loop.run_until_complete(before())
        assert left == 90
        replicated(master)
        promote(replica, (), others)
        assert role(master) != "master" or role(replica) == "master"
        # The old master answers MOVED; the client follows it to the new one, from 90.
        o = c.check(k, WINDOW)
        assert (o.degraded, o.decision.remaining) == (None, 89)
        assert c.check(k, WINDOW).decision.remaining == 88
        oa = loop.run_until_complete(until_decided_async(lambda: a.check("{" + k + "}:a", WINDOW)))
        assert oa.decision.remaining == 89
        loop.run_until_complete(a.aclose())
    finally:
        loop.close()
    c.close()


def test_a_frozen_master_replaced_by_its_replica_is_followed(replicated_cluster: tuple[Cluster, Server]) -> None:
    cluster, replica = replicated_cluster
    master, others = cluster.nodes[0], cluster.nodes[1:]
    k = key_of(cluster, "frozen")
    c = Client.from_url(master.url, OPTS, cluster=True)
    assert [c.check(k, WINDOW).decision.remaining for _ in range(10)][-1] == 90

    async def before() -> tuple[AsyncClient, int]:
        a = await AsyncClient.open(master.url, OPTS, cluster=True)
        got = [(await a.check("{" + k + "}:a", WINDOW)).decision.remaining for _ in range(10)]
        return a, got[-1]

    loop = asyncio.new_event_loop()
    try:
        a, left = loop.run_until_complete(before())
        assert left == 90
        replicated(master)
        master.freeze()
        try:
            # The frozen master answers nothing: the policy answers, within the deadline.
            t = time.monotonic()
            o = c.check(k, WINDOW)
            assert o.degraded is Degraded.FAIL_OPEN and time.monotonic() - t < 2.0
            oa = loop.run_until_complete(a.check("{" + k + "}:a", WINDOW))
            assert oa.degraded is Degraded.FAIL_OPEN
            promote(replica, ("FORCE",), others)
            # The new master carries on from the replicated count: nothing the frozen one was
            # sent reached it.
            o, _ = until_decided(lambda: c.check(k, WINDOW))
            assert o.decision.remaining == 89
            assert c.check(k, WINDOW).decision.remaining == 88
            oa = loop.run_until_complete(until_decided_async(lambda: a.check("{" + k + "}:a", WINDOW)))
            assert oa.decision.remaining == 89
            assert loop.run_until_complete(a.check("{" + k + "}:a", WINDOW)).decision.remaining == 88
        finally:
            master.thaw()
        loop.run_until_complete(a.aclose())
    finally:
        loop.close()
    c.close()
