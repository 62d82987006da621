# mypy: disallow-untyped-calls=False
"""Following a Sentinel failover: a master with the module, its replica and a Sentinel (the
server binary with ``--sentinel``); a client made by ``Client.sentinel`` / ``AsyncClient.sentinel``
carries on, after ``SENTINEL FAILOVER``, on the new master from the replicated count, to the
unit; the calls that met the old master's end are answered by the failure policy, none sent
twice."""

from __future__ import annotations

import asyncio
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from ratelimit_client import AsyncClient, Client, Durability, DurabilityStats, FixedWindow, Options
from servers import Server, call, free_port, server_binary

WINDOW = FixedWindow(100, 3600)


def role(s: Server) -> str:
    conn = s.raw()
    try:
        r = call(conn, "ROLE")
    finally:
        conn.disconnect()
    first = r[0]
    return first.decode() if isinstance(first, bytes) else str(first)


class Sentinel:
    def __init__(self, master: Server) -> None:
        self.dir = tempfile.mkdtemp(prefix="rl-py-sentinel-")
        self.port = free_port()
        conf = os.path.join(self.dir, "sentinel.conf")
        with open(conf, "w") as f:
            f.write(
                f"port {self.port}\nbind 127.0.0.1\ndir {self.dir}\n"
                f"sentinel monitor mymaster 127.0.0.1 {master.port} 1\n"
                "sentinel down-after-milliseconds mymaster 400\nsentinel failover-timeout mymaster 2000\n"
            )
        log = open(os.path.join(self.dir, "log"), "w")
        self.process = subprocess.Popen([server_binary(), conf, "--sentinel"], stdout=log, stderr=log)
        self.conn = redis.Redis(host="127.0.0.1", port=self.port, decode_responses=True, socket_timeout=5)
        deadline = time.monotonic() + 10
        while True:
            try:
                if self.conn.execute_command("SENTINEL", "REPLICAS", "mymaster"):
                    return
            except redis.RedisError:
                pass
            assert time.monotonic() < deadline, "the Sentinel never saw the replica"
            time.sleep(0.05)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def master_port(self) -> int:
        return int(self.conn.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", "mymaster")[1])

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


@pytest.fixture
def group() -> Iterator[tuple[Server, Server, Sentinel]]:
    with Server(extra=["--repl-diskless-sync-delay", "0"]) as master:
        with Server(extra=["--replicaof", "127.0.0.1", str(master.port), "--repl-diskless-sync-delay", "0"]) as replica:
            sentinel = Sentinel(master)
            try:
                yield master, replica, sentinel
            finally:
                sentinel.stop()


def fail_over(master: Server, replica: Server, sentinel: Sentinel) -> None:
    """``SENTINEL FAILOVER``, once the replica has every write."""
    assert master.connect().execute_command("WAIT", 1, 2000) == 1
    deadline = time.monotonic() + 15
    while True:
        try:
            assert sentinel.conn.execute_command("SENTINEL", "FAILOVER", "mymaster")
            break
        except redis.ResponseError as e:
            # Until the Sentinel has the replica's first INFO: NOGOODSLAVE.
            assert "NOGOODSLAVE" in str(e) and time.monotonic() < deadline, str(e)
            time.sleep(0.1)
    # Until the replica is master and the old master its replica (the Sentinel reconfigured it:
    # a write it took meanwhile would be lost with its data set).
    while sentinel.master_port() != replica.port or role(replica) != "master" or role(master) != "slave":
        assert time.monotonic() < deadline, "no failover"
        time.sleep(0.05)


def used(s: Server) -> int:
    return int(str(s.connect().get("k")).split(" ")[1])


def carry_on(check: Any) -> tuple[Any, list[Any]]:
    """Checks until one is answered by Redis (at most 50, 50 ms apart): the policy's answers
    before it, and it."""
    degraded: list[Any] = []
    for _ in range(50):
        o = check()
        if o.degraded is None:
            return o, degraded
        degraded.append(o.degraded)
        time.sleep(0.05)
    raise AssertionError("never answered by the new master")


@pytest.mark.heavy
def test_the_client_follows_a_sentinel_failover(group: tuple[Server, Server, Sentinel]) -> None:
    master, replica, sentinel = group
    c = Client.sentinel([sentinel.url], "mymaster", Options(timeout=2.0))
    assert [c.check("k", WINDOW).decision.remaining for _ in range(3)] == [99, 98, 97]
    # The durable lane opens its connections to the master the Sentinels name.
    durable = c.with_durability(Durability(replicas=1, timeout=1.5))
    assert durable.check("d", WINDOW).decision.allowed and durable.durability_stats() == DurabilityStats(1, 0)
    fail_over(master, replica, sentinel)
    o, degraded = carry_on(lambda: c.check("k", WINDOW))
    # The new master carries on from the replicated count: the policy's answers took nothing.
    assert o.decision.remaining == 96 and used(replica) == 4
    assert len(degraded) <= 1
    print(f"\nafter the failover: {len(degraded)} answer(s) of the failure policy ({degraded}), then the new master")
    assert [c.check("k", WINDOW).decision.remaining for _ in range(2)] == [95, 94]
    assert used(replica) == 6


@pytest.mark.heavy
def test_the_asyncio_client_follows_alike(group: tuple[Server, Server, Sentinel]) -> None:
    master, replica, sentinel = group

    async def run() -> tuple[int, Any, int]:
        c = AsyncClient.sentinel([sentinel.url], "mymaster", Options(timeout=2.0))
        before = (await c.check("k", WINDOW)).decision.remaining
        await asyncio.to_thread(fail_over, master, replica, sentinel)
        for _ in range(50):
            o = await c.check("k", WINDOW)
            if o.degraded is None:
                break
            await asyncio.sleep(0.05)
        after = (await c.check("k", WINDOW)).decision.remaining
        await c.aclose()
        return before, o.decision.remaining, after

    assert asyncio.run(run()) == (99, 98, 97)
    assert used(replica) == 3
