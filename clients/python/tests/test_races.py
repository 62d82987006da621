# mypy: disallow-untyped-calls=False
"""Many callers at once on one key: 200 threads through one synchronous client, 200 asyncio tasks
through one asyncio client, in the three modes, for every algorithm, RL.ALL and leases: exactly
``limit`` admitted, and the server's state says the same."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from ratelimit_client import (
    AsyncClient,
    Client,
    Concurrency,
    FixedWindow,
    Gcra,
    LeakyBucket,
    ModeChoice,
    Options,
    SlidingLog,
    SlidingWindow,
    TokenBucket,
    load_library,
)
from servers import Server

pytestmark = pytest.mark.heavy

RACERS = 200
LIMIT = 37
# Nothing refills or expires during a race.
SLOW = 1e-6
CASES: dict[str, Any] = {
    "token_bucket": TokenBucket(LIMIT, SLOW),
    "leaky_bucket": LeakyBucket(LIMIT, SLOW),
    "fixed_window": FixedWindow(LIMIT, 3600),
    "sliding_window": SlidingWindow(LIMIT, 3600),
    "sliding_log": SlidingLog(LIMIT, 3600),
    "gcra": Gcra(LIMIT - 1, 1, 3600),
    "all": [("{r}:a", TokenBucket(LIMIT, SLOW)), ("{r}:b", FixedWindow(LIMIT + 5, 3600))],
    "leases": Concurrency(LIMIT, 3600),
}
MODES = {"module": ModeChoice.MODULE, "function": ModeChoice.FUNCTION, "script": ModeChoice.SCRIPT}


@pytest.fixture(scope="module")
def race_server() -> Iterator[Server]:
    with Server() as s:
        load_library(s.connect())
        yield s


def sync_call(c: Client, case: str) -> tuple[bool, Any]:
    """Whether admitted, and by whom (None: Redis)."""
    a = CASES[case]
    if case == "all":
        m = c.check_all(a, 1)
        return m.allowed, m.degraded
    o = c.acquire("k", a).outcome if case == "leases" else c.check("k", a)
    return o.decision.allowed, o.degraded


async def async_call(c: AsyncClient, case: str) -> tuple[bool, Any]:
    a = CASES[case]
    if case == "all":
        m = await c.check_all(a, 1)
        return m.allowed, m.degraded
    o = (await c.acquire("k", a)).outcome if case == "leases" else await c.check("k", a)
    return o.decision.allowed, o.degraded


def left(s: Server, case: str) -> list[int]:
    """What the server says is left (peeks through the module)."""
    c = Client.from_url(s.url, Options(mode=ModeChoice.MODULE, timeout=5))
    if case == "all":
        return [d.remaining for d in c.check_all(CASES[case], 0).decisions]
    return [c.peek("k", CASES[case]).decision.remaining]


def expected_left(case: str) -> list[int]:
    return [0, 5] if case == "all" else [0]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", CASES)
def test_threads_admit_exactly_the_limit(race_server: Server, case: str, mode: str) -> None:
    race_server.connect().flushall()
    # A generous timeout: 200 connections open at once on two shared cores.
    c = Client.from_url(race_server.url, Options(mode=MODES[mode], timeout=10), max_connections=RACERS)
    start = threading.Barrier(RACERS)
    results: list[tuple[bool, Any]] = []
    lock = threading.Lock()

    def racer() -> None:
        start.wait()
        got = sync_call(c, case)
        with lock:
            results.append(got)

    threads = [threading.Thread(target=racer) for _ in range(RACERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert (len(results), results.count((True, None)), results.count((False, None))) == (RACERS, LIMIT, RACERS - LIMIT)
    assert left(race_server, case) == expected_left(case)
    c.close()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", CASES)
def test_tasks_admit_exactly_the_limit(race_server: Server, case: str, mode: str) -> None:
    race_server.connect().flushall()

    async def race() -> list[tuple[bool, Any]]:
        async with AsyncClient.from_url(race_server.url, Options(mode=MODES[mode], timeout=10)) as c:
            go = asyncio.Event()

            async def racer() -> tuple[bool, Any]:
                await go.wait()
                return await async_call(c, case)

            tasks = [asyncio.create_task(racer()) for _ in range(RACERS)]
            await asyncio.sleep(0)
            go.set()
            return await asyncio.gather(*tasks)

    results = asyncio.run(race())
    assert (len(results), results.count((True, None)), results.count((False, None))) == (RACERS, LIMIT, RACERS - LIMIT)
    assert left(race_server, case) == expected_left(case)
