# mypy: disallow-untyped-calls=False
"""A cluster of 3 masters through ``redis.cluster.RedisCluster`` (and its asyncio twin): keys on
every master, several limits under one hash tag, leases and reservations, in the three modes,
with and without the module; keys of several slots refused."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from ratelimit_client import (
    AsyncClient,
    Client,
    Concurrency,
    Decision,
    FixedWindow,
    Mode,
    ModeChoice,
    Options,
    Rejected,
    TokenBucket,
    Unsupported,
    load_library,
)
from servers import SLACK, Cluster, Server, call

START_US = 1_800_000_000_000_000
MODES = {"module": ModeChoice.MODULE, "function": ModeChoice.FUNCTION, "script": ModeChoice.SCRIPT}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """3 masters with the module under their test clocks, the library loaded on each."""
    c = Cluster(3, test_clock=True)
    for n in c.nodes:
        load_library(n.connect())
    yield c
    c.stop()


def reset(cluster: Cluster) -> None:
    for n in cluster.nodes:
        raw = n.raw()
        for args in (("FLUSHALL",), ("SCRIPT", "FLUSH"), ("RL.TESTCLOCK", "SET", START_US)):
            call(raw, *args)
        raw.disconnect()


def keys_on_each_master(cluster: Cluster) -> list[str]:
    """One key served by each master."""
    keys: dict[int, str] = {}
    for i in range(100):
        keys.setdefault(cluster.owner(f"user:{i}").port, f"user:{i}")
    assert len(keys) == 3
    return list(keys.values())


def owner(cluster: Cluster, key: str) -> Server:
    return cluster.owner(key)


BUCKET = TokenBucket(3, 0.5)
SLOTS = Concurrency(2, 30)


def scenario_sync(c: Client, cluster: Cluster) -> list[Any]:
    out: list[Any] = []
    for key in keys_on_each_master(cluster):
        out.append([c.check(key, BUCKET).decision for _ in range(4)])
        out.append(owner(cluster, key).connect().exists(key))
    both = [("{acme}:burst", BUCKET), ("{acme}:minute", FixedWindow(5, 60))]
    out.append([c.check_all(both, 2).decisions for _ in range(3)])
    with c.acquire("{acme}:jobs", SLOTS) as held:
        out.append((held.outcome.decision, owner(cluster, "{acme}:jobs").connect().zcard("{acme}:jobs")))
    out.append(owner(cluster, "{acme}:jobs").connect().exists("{acme}:jobs"))
    r = c.reserve_all([("{llm}:tokens", TokenBucket(10000, 100)), ("{llm}:minute", FixedWindow(12000, 60))], 4000)
    assert r.reservation is not None
    out.append((r.outcome.decisions, r.reservation.settle(1000).decisions))
    return out


async def scenario_async(c: AsyncClient, cluster: Cluster) -> list[Any]:
    out: list[Any] = []
    for key in keys_on_each_master(cluster):
        out.append([(await c.check(key, BUCKET)).decision for _ in range(4)])
        out.append(owner(cluster, key).connect().exists(key))
    both = [("{acme}:burst", BUCKET), ("{acme}:minute", FixedWindow(5, 60))]
    out.append([(await c.check_all(both, 2)).decisions for _ in range(3)])
    async with c.acquire("{acme}:jobs", SLOTS) as held:
        out.append((held.outcome.decision, owner(cluster, "{acme}:jobs").connect().zcard("{acme}:jobs")))
    out.append(owner(cluster, "{acme}:jobs").connect().exists("{acme}:jobs"))
    r = await c.reserve_all([("{llm}:tokens", TokenBucket(10000, 100)), ("{llm}:minute", FixedWindow(12000, 60))], 4000)
    assert r.reservation is not None
    out.append((r.outcome.decisions, (await r.reservation.settle(1000)).decisions))
    return out


def expected() -> list[Any]:
    bucket = [
        Decision(True, 2, 0, 2000, 3),
        Decision(True, 1, 0, 4000, 3),
        Decision(True, 0, 0, 6000, 3),
        Decision(False, 0, 2000, 6000, 3),
    ]
    out: list[Any] = []
    for _ in range(3):
        out += [bucket, 1]
    out.append(
        [
            (Decision(True, 1, 0, 4000, 3), Decision(True, 3, 0, 60000, 5)),
            (Decision(False, 1, 2000, 4000, 3), Decision(True, 3, 0, 60000, 5)),
            (Decision(False, 1, 2000, 4000, 3), Decision(True, 3, 0, 60000, 5)),
        ]
    )
    out.append((Decision(True, 1, 0, 30000, 2), 1))
    out.append(0)
    out.append(
        (
            (Decision(True, 6000, 0, 40000, 10000), Decision(True, 8000, 0, 60000, 12000)),
            (Decision(True, 9000, 0, 10000, 10000), Decision(True, 11000, 0, 60000, 12000)),
        )
    )
    return out


@pytest.mark.parametrize("mode", MODES)
def test_sync_client_on_a_cluster(cluster: Cluster, mode: str) -> None:
    reset(cluster)
    c = Client.from_url(cluster.nodes[0].url, Options(mode=MODES[mode], timeout=2.0), cluster=True)
    assert scenario_sync(c, cluster) == expected()
    with pytest.raises(Rejected) as e:
        c.check_all([("a", BUCKET), ("b", BUCKET)])
    assert e.value.message.startswith("CROSSSLOT ")
    with pytest.raises(Unsupported):
        c.top()
    c.close()


@pytest.mark.parametrize("mode", MODES)
def test_asyncio_client_on_a_cluster(cluster: Cluster, mode: str) -> None:
    reset(cluster)

    async def run() -> list[Any]:
        # open: the client learns the slots before the first call's deadline.
        opts = Options(mode=MODES[mode], timeout=2.0)
        async with await AsyncClient.open(cluster.nodes[0].url, opts, cluster=True) as c:
            out = await scenario_async(c, cluster)
            with pytest.raises(Rejected) as e:
                await c.check_all([("a", BUCKET), ("b", BUCKET)])
            assert e.value.message.startswith("CROSSSLOT ")
            return out

    assert asyncio.run(run()) == expected()


def test_detection_on_clusters_with_and_without_the_module(cluster: Cluster) -> None:
    reset(cluster)
    assert Client.from_url(cluster.nodes[0].url, SLACK, cluster=True).detect() is Mode.MODULE
    bare = Cluster(3, module=False)
    try:
        url = bare.nodes[0].url
        c = Client.from_url(url, SLACK, cluster=True)
        assert [c.check(k, BUCKET).decision.remaining for k in ("a", "b", "c")] == [2, 2, 2]
        assert c.mode is Mode.SCRIPT
        for n in bare.nodes:
            load_library(n.connect())
        c = Client.from_url(url, SLACK, cluster=True)
        assert [c.check(k, BUCKET).decision.remaining for k in ("a", "b", "c")] == [1, 1, 1]
        assert c.mode is Mode.FUNCTION

        async def detect() -> Mode | None:
            async with await AsyncClient.open(url, SLACK, cluster=True) as ac:
                return ac.mode

        assert asyncio.run(detect()) is Mode.FUNCTION
    finally:
        bare.stop()
