# mypy: disallow-untyped-calls=False
"""A client started while Redis is down, the asyncio client and the ASGI middleware across event
loops (one Starlette ``TestClient`` session after another), and a lease released while its
keep-alive renewal is on its way."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from ratelimit_client import AsyncClient, Client, Concurrency, Degraded, Mode, TokenBucket
from ratelimit_client.asgi import RateLimitMiddleware
from ratelimit_client.middleware import Policy
from servers import SLACK, Server, free_port

BUCKET = TokenBucket(10, 1e-6)


def until_decided(call: Any, within: float = 5.0) -> Any:
    """Calls until Redis decides (the breaker's cooldown, then its trial)."""
    deadline = time.monotonic() + within
    while True:
        o = call()
        if o.degraded is None:
            return o
        assert time.monotonic() < deadline, "Redis never decided"
        time.sleep(0.05)


def test_a_client_started_while_redis_is_down() -> None:
    """The documented start (``Client.from_url``, default options) starts; its calls are
    answered by the policy within the deadline until Redis is there, then Redis decides."""
    port = free_port()
    c = Client.from_url(f"redis://127.0.0.1:{port}")
    assert c.detect() is None
    for _ in range(5):
        t = time.monotonic()
        o = c.check("k", BUCKET)
        took = time.monotonic() - t
        assert (o.degraded, o.decision.allowed, o.mode) == (Degraded.FAIL_OPEN, True, None)
        assert took < 1.0, took
    with Server(port=port):
        o = until_decided(lambda: c.check("k", BUCKET))
        assert (o.mode, o.decision.remaining) == (Mode.MODULE, 9)
        assert c.mode is Mode.MODULE and not c.breaker_open()
    c.close()


def test_an_asyncio_client_started_while_redis_is_down() -> None:
    port = free_port()

    async def run() -> None:
        t = time.monotonic()
        c = await AsyncClient.open(f"redis://127.0.0.1:{port}")
        assert c.mode is None and time.monotonic() - t < 1.0
        for _ in range(5):
            t = time.monotonic()
            o = await c.check("k", BUCKET)
            assert (o.degraded, o.decision.allowed) == (Degraded.FAIL_OPEN, True)
            assert time.monotonic() - t < 1.0
        with Server(port=port):
            deadline = time.monotonic() + 5
            while (o := await c.check("k", BUCKET)).degraded is not None:
                assert time.monotonic() < deadline, "Redis never decided"
                await asyncio.sleep(0.05)
            assert (o.mode, o.decision.remaining) == (Mode.MODULE, 9)
            await c.aclose()

    asyncio.run(run())


def test_an_asyncio_client_on_one_loop_after_another(server: Server) -> None:
    """Made outside any loop, used by ``asyncio.run`` three times, then by two loops at once."""
    c = AsyncClient.from_url(server.url, SLACK)

    async def one() -> tuple[int, Degraded | None]:
        o = await c.check("k", BUCKET)
        return o.decision.remaining, o.degraded

    assert [asyncio.run(one()) for _ in range(3)] == [(9, None), (8, None), (7, None)]

    import threading

    got: list[tuple[int, Degraded | None]] = []
    lock = threading.Lock()

    def in_a_thread() -> None:
        r = asyncio.run(one())
        with lock:
            got.append(r)

    threads = [threading.Thread(target=in_a_thread) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == [(5, None), (6, None)]
    asyncio.run(c.aclose())


def test_the_asgi_middleware_across_test_client_sessions(server: Server) -> None:
    """One ``TestClient`` session per test is Starlette's usual pattern: each runs its own event
    loop. The client given to the middleware keeps working when the loop it first ran on is
    gone, leases and their keep-alive included."""
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    async def hello(request: Any) -> PlainTextResponse:
        return PlainTextResponse("ok")

    client = AsyncClient.from_url(server.url, SLACK)
    app = Starlette(routes=[Route("/", hello)])
    app.add_middleware(
        RateLimitMiddleware,
        client=client,
        limits={("*", "*"): [Policy("bucket", BUCKET), Policy("inflight", Concurrency(2, 5))]},
        lease_keep_alive=0.01,
    )
    seen = []
    for _ in range(4):
        with TestClient(app) as http:
            for _ in range(2):
                r = http.get("/")
                seen.append((r.status_code, r.headers["ratelimit"], r.headers.get("ratelimit-degraded")))
    assert [(status, fields.split(";t=")[0], fields.split(", ")[1], degraded) for status, fields, degraded in seen] == [
        (200, f'"bucket";r={9 - i}', '"inflight";r=1;t=5', None) for i in range(8)
    ]
    assert server.connect().zcard("inflight") == 0


RELEASES = 40


def test_a_release_waits_for_a_renewal_on_its_way(server: Server) -> None:
    """A lease renewed every millisecond, released: no renewal lands after the release (the
    slot is free once ``release`` returns, and stays free)."""
    c = Client.from_url(server.url, SLACK)
    slots = Concurrency(1, 30)
    r = server.connect()
    retaken = 0
    for i in range(RELEASES):
        held = c.acquire(f"slot{i}", slots)
        assert held.lease is not None
        held.lease.keep_alive(0.001)
        time.sleep(0.003 + (i % 5) * 0.001)
        assert held.lease.release() is True
        time.sleep(0.02)
        retaken += r.zcard(f"slot{i}")
    assert retaken == 0


def test_an_asyncio_release_waits_for_a_renewal_on_its_way(server: Server) -> None:
    slots = Concurrency(1, 30)
    r = server.connect()

    async def run() -> int:
        retaken = 0
        async with AsyncClient.from_url(server.url, SLACK) as c:
            for i in range(RELEASES):
                held = await c.acquire(f"slot{i}", slots)
                assert held.lease is not None
                held.lease.keep_alive(0.001)
                await asyncio.sleep(0.003 + (i % 5) * 0.001)
                assert await held.lease.release() is True
                await asyncio.sleep(0.02)
                retaken += r.zcard(f"slot{i}")
        return retaken

    assert asyncio.run(run()) == 0


@pytest.mark.parametrize("every", [0.0005])
def test_a_released_lease_is_not_renewed_by_a_later_tick(server: Server, every: float) -> None:
    """After a release returns, the keep-alive sends nothing more."""
    c = Client.from_url(server.url, SLACK)
    held = c.acquire("quiet", Concurrency(1, 30))
    assert held.lease is not None
    held.lease.keep_alive(every)
    time.sleep(0.01)
    held.lease.release()
    server.connect().execute_command("CONFIG", "RESETSTAT")
    time.sleep(0.05)
    info = server.connect().execute_command("INFO", "commandstats")
    assert "cmdstat_rl.acquire" not in info


@pytest.mark.heavy
@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
def test_a_burst_on_a_frozen_server_is_answered_by_the_policy(warm: bool) -> None:
    """200 threads and 200 tasks on a frozen server (SIGSTOP), through a client that has
    answered before or not: every call answered by the policy, each within a second and a half
    (the calls in flight within the timeout, the ones waiting for a connection once the
    breaker opens), and the breaker open."""
    import threading

    with Server() as s:
        c = Client.from_url(s.url)
        if warm:
            assert c.check("w", BUCKET).degraded is None
        s.freeze()
        try:
            took: list[tuple[float, Degraded | None]] = []
            lock = threading.Lock()
            go = threading.Barrier(201)

            def caller() -> None:
                go.wait()
                t = time.monotonic()
                o = c.check("k", BUCKET)
                with lock:
                    took.append((time.monotonic() - t, o.degraded))

            threads = [threading.Thread(target=caller) for _ in range(200)]
            for t in threads:
                t.start()
            go.wait()
            for t in threads:
                t.join()
            assert {d for _, d in took} == {Degraded.FAIL_OPEN}
            assert max(t for t, _ in took) < 1.5, sorted(t for t, _ in took)[-5:]
            assert c.breaker_open()

            async def tasks() -> list[tuple[float, Degraded | None]]:
                a = AsyncClient.from_url(s.url)
                if warm:
                    s.thaw()
                    assert (await a.check("w", BUCKET)).degraded is None
                    s.freeze()

                async def one() -> tuple[float, Degraded | None]:
                    t = time.monotonic()
                    o = await a.check("k", BUCKET)
                    return time.monotonic() - t, o.degraded

                got = await asyncio.gather(*(one() for _ in range(200)))
                assert a.breaker_open()
                return list(got)

            got = asyncio.run(tasks())
            assert {d for _, d in got} == {Degraded.FAIL_OPEN}
            assert max(t for t, _ in got) < 1.5, sorted(t for t, _ in got)[-5:]
        finally:
            s.thaw()
