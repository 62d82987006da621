# mypy: disallow-untyped-calls=False
"""The decorator on a Flask view (werkzeug), a Django view (waitress), a FastAPI endpoint and a
Starlette endpoint (uvicorn), and plain functions; the middleware's lease keep-alive, a failing
handler, other ASGI scopes, and its counters through prometheus_client."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from fastapi import Request, Response

from apps import DJANGO_VIEW, AsgiServer, WaitressServer, WerkzeugServer, django_app, send_request
from ratelimit_client import AsyncClient, Client, Concurrency, Decision, FixedWindow, Mode, MultiOutcome, TokenBucket
from ratelimit_client.asgi import RateLimitMiddleware as AsgiMiddleware
from ratelimit_client.decorators import RateLimited, limit, parse_rate
from ratelimit_client.middleware import Metrics, Policy, client_ip, header, report_cost
from ratelimit_client.wsgi import RateLimitMiddleware as WsgiMiddleware
from servers import SLACK, Server, call

pytestmark = pytest.mark.heavy

START_US = 1_800_000_000_000_000


@pytest.fixture
def clock() -> Iterator[Server]:
    with Server(test_clock=True) as s:
        call(s.raw(), "RL.TESTCLOCK", "SET", START_US)
        yield s


def problem(name: str, secs: int) -> str:
    return json.dumps(
        {
            "detail": f"rate limit '{name}' exceeded; retry in {secs} s",
            "limit": name,
            "retry_after": secs,
            "status": 429,
            "title": "Too Many Requests",
            "type": "about:blank",
        },
        separators=(",", ":"),
    )


def two_per_minute(r: int, status: int = 200, body: str = "welcome", legacy: bool = True) -> dict[str, Any]:
    """The answer of a view limited to 2 per minute with ``r`` left."""
    headers = {"ratelimit-policy": '"2/minute";q=2;w=60', "ratelimit": f'"2/minute";r={r};t=60'}
    if legacy:
        headers.update({"ratelimit-limit": "2", "ratelimit-remaining": str(r), "ratelimit-reset": "60"})
    if status == 429:
        headers.update({"content-type": "application/problem+json", "retry-after": "60"})
        body = problem("2/minute", 60)
    else:
        headers["content-type"] = "text/html; charset=utf-8"
    return {"status": status, "headers": headers, "body": body}


def test_rates_read_as_fixed_windows() -> None:
    assert parse_rate("5/minute") == Policy("5/minute", FixedWindow(5, 60))
    assert parse_rate("100 per hour") == Policy("100 per hour", FixedWindow(100, 3600))
    assert parse_rate("10/5 seconds") == Policy("10/5 seconds", FixedWindow(10, 5))
    with pytest.raises(ValueError):
        parse_rate("5 a minute")


def test_a_flask_view(clock: Server) -> None:
    from flask import Flask

    client = Client.from_url(clock.url, SLACK)
    app = Flask("decorated")

    @app.route("/login")
    @limit(client, "2/minute", key=client_ip(), legacy_headers=True)
    def login() -> str:
        return "welcome"

    server = WerkzeugServer()
    server.dispatch.current = app
    try:
        got = [send_request(server.port, {"path": "/login"}) for _ in range(3)]
    finally:
        server.stop()
    assert got == [two_per_minute(1), two_per_minute(0), two_per_minute(0, 429)]
    assert clock.connect().keys("*") == ["rl:{127.0.0.1}:test_a_flask_view.<locals>.login:2/minute"]


def test_a_django_view_settles_the_cost_it_reports(clock: Server) -> None:
    django_app()
    from django.http import HttpResponse

    client = Client.from_url(clock.url, SLACK)
    tokens = Policy("tokens", TokenBucket(100, 1))

    @limit(client, tokens, key=lambda request, path: request.headers["x-user"], cost=10, name="complete")
    def complete(request: Any, path: str) -> Any:
        report_cost(request, int(request.headers["x-used"]))
        return HttpResponse("done", content_type="text/plain; charset=utf-8")

    DJANGO_VIEW["current"] = complete
    server = WaitressServer()
    server.dispatch.current = django_app()
    try:
        first = send_request(server.port, {"path": "/complete", "headers": {"x-user": "ann"}, "used": 3})
        second = send_request(server.port, {"path": "/complete", "headers": {"x-user": "ann"}, "used": 95})
        third = send_request(server.port, {"path": "/complete", "headers": {"x-user": "ann"}, "used": 1})
    finally:
        server.stop()
        DJANGO_VIEW.clear()
    fields = '"tokens";q=100;w=100'
    assert first == {
        "status": 200,
        "body": "done",
        "headers": {
            "content-type": "text/plain; charset=utf-8",
            "ratelimit-policy": fields,
            "ratelimit": '"tokens";r=97;t=3',
        },
    }
    # 10 reserved from 97, 95 used: 85 more charged, 2 left.
    assert second == {
        "status": 200,
        "body": "done",
        "headers": {
            "content-type": "text/plain; charset=utf-8",
            "ratelimit-policy": fields,
            "ratelimit": '"tokens";r=2;t=98',
        },
    }
    assert third["status"] == 429 and third["headers"]["retry-after"] == "8"
    assert third["body"] == problem("tokens", 8)


def test_fastapi_and_starlette_endpoints(clock: Server) -> None:
    from fastapi import FastAPI
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    aclient = AsyncClient.from_url(clock.url, SLACK)
    api = FastAPI()

    @api.get("/search")
    @limit(aclient, "2/minute", key=client_ip(), name="search")
    async def search(request: Request, response: Response) -> dict[str, str]:
        return {"found": "nothing"}

    @limit(aclient, "2/minute", key=client_ip(), name="plain")
    async def plain(request: Request) -> PlainTextResponse:
        return PlainTextResponse("welcome")

    starlette = Starlette(routes=[Route("/plain", plain)])
    server = AsgiServer()
    try:
        server.dispatch.current = api
        fast = [send_request(server.port, {"path": "/search"}) for _ in range(3)]
        server.dispatch.current = starlette
        star = [send_request(server.port, {"path": "/plain"}) for _ in range(3)]
        server.run(aclient.aclose())
    finally:
        server.stop()
    ok_json = {"status": 200, "body": '{"found":"nothing"}'}
    assert [{k: v for k, v in r.items() if k != "headers"} for r in fast[:2]] == [ok_json, ok_json]
    assert [r["headers"]["ratelimit"] for r in fast] == [
        '"2/minute";r=1;t=60',
        '"2/minute";r=0;t=60',
        '"2/minute";r=0;t=60',
    ]
    assert fast[2]["status"] == 429 and fast[2]["body"] == problem("2/minute", 60)
    expected = [two_per_minute(1, legacy=False), two_per_minute(0, legacy=False), two_per_minute(0, 429, legacy=False)]
    for e in expected[:2]:
        e["headers"]["content-type"] = "text/plain; charset=utf-8"
    assert star == expected
    assert sorted(clock.connect().keys("*")) == ["rl:{127.0.0.1}:plain:2/minute", "rl:{127.0.0.1}:search:2/minute"]


def test_plain_functions_raise(clock: Server) -> None:
    client = Client.from_url(clock.url, SLACK)

    @limit(client, "2/minute", key=lambda user: f"user:{user}")
    def send_sms(user: str) -> str:
        return f"sent to {user}"

    assert [send_sms("ann"), send_sms("ann"), send_sms("bob")] == ["sent to ann", "sent to ann", "sent to bob"]
    with pytest.raises(RateLimited) as e:
        send_sms("ann")
    assert (e.value.status, e.value.retry_after, e.value.body.decode()) == (429, 60, problem("2/minute", 60))
    # The decision behind it, with the exact milliseconds (the test clock stands still).
    refused = Decision(allowed=False, remaining=0, retry_after_ms=60000, reset_after_ms=60000, limit=2)
    assert (e.value.limit, e.value.decision) == ("2/minute", refused)
    assert e.value.outcome == MultiOutcome(False, 1, (refused,), None, Mode.MODULE)
    assert repr(e.value) == (
        "RateLimited(status=429, limit='2/minute', retry_after=60, decision=Decision(allowed=False, remaining=0, "
        "retry_after_ms=60000, reset_after_ms=60000, limit=2))"
    )
    assert str(e.value) == "rate limit '2/minute' exceeded (429)"

    aclient = AsyncClient.from_url(clock.url, SLACK)

    @limit(aclient, Policy("one", FixedWindow(1, 10)), key=lambda job: job)
    async def run_job(job: str) -> str:
        return job

    async def twice() -> tuple[str, int | None]:
        first = await run_job("j")
        try:
            await run_job("j")
        except RateLimited as refused:
            return first, refused.retry_after
        finally:
            await aclient.aclose()
        raise AssertionError("not refused")

    assert asyncio.run(twice()) == ("j", 10)
    with pytest.raises(TypeError, match="is a coroutine function: limit it with an AsyncClient"):
        limit(client, "1/second", key=lambda job: job)(run_job.__wrapped__)  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match="is a function: limit it with a Client"):
        limit(aclient, "1/second", key=lambda: "k")(lambda: None)
    # A key of the request on a function that has none: known only when it is called.
    no_request = limit(client, "1/second", key=client_ip())(send_sms.__wrapped__)  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match=r"send_sms has no request to take client_ip\(\[\]\) from"):
        no_request("ann")


def test_leases_kept_alive_and_given_back_after_a_failure(server: Server) -> None:
    """On the real clock: a lease of 0.6 s renewed every 0.1 s outlives a slow request; a handler
    that fails gives its slot back."""
    from flask import Flask

    client = Client.from_url(server.url, SLACK)
    app = Flask("slow")

    @app.route("/<path:path>")
    def handler(path: str) -> str:
        if path == "slow":
            time.sleep(1.3)
        if path == "fail":
            raise RuntimeError("the handler failed")
        return "ok"

    WsgiMiddleware(
        client=client,
        key=header("x-api-key"),
        limits={("*", "*"): [Policy("inflight", Concurrency(1, 0.6))]},
        lease_keep_alive=0.1,
    ).init_app(app)
    web = WerkzeugServer()
    web.dispatch.current = app
    try:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(1) as pool:
            slow = pool.submit(send_request, web.port, {"path": "/slow", "headers": {"x-api-key": "a"}})
            time.sleep(0.9)  # past the lease's first expiry: renewed meanwhile
            refused = send_request(web.port, {"path": "/ok", "headers": {"x-api-key": "a"}})
            assert slow.result(5)["status"] == 200
        assert refused["status"] == 429
        deadline = time.monotonic() + 2
        while server.connect().exists("rl:{a}:default:inflight"):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        failed = send_request(web.port, {"path": "/fail", "headers": {"x-api-key": "a"}})
        assert failed["status"] == 500
        assert send_request(web.port, {"path": "/ok", "headers": {"x-api-key": "a"}})["status"] == 200
    finally:
        web.stop()


def test_asgi_keep_alive_other_scopes_and_prometheus(server: Server) -> None:
    from prometheus_client import CollectorRegistry, generate_latest
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    async def slow(request: Request) -> PlainTextResponse:
        await asyncio.sleep(1.3)
        return PlainTextResponse("ok")

    started: list[str] = []

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        started.append("up")
        yield

    metrics = Metrics()
    registry = CollectorRegistry()
    metrics.register(registry)
    aclient = AsyncClient.from_url(server.url, SLACK)
    app = Starlette(routes=[Route("/{p:path}", slow)], lifespan=lifespan)
    app.add_middleware(
        AsgiMiddleware,
        client=aclient,
        key=header("x-api-key"),
        limits={("*", "*"): [Policy("inflight", Concurrency(1, 0.6))]},
        lease_keep_alive=0.1,
        metrics=metrics,
    )

    async def with_lifespan(scope: Any, receive: Any, send: Any) -> None:
        await app(scope, receive, send)

    web = AsgiServer(lifespan=True, app=with_lifespan)
    try:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(1) as pool:
            slow_one = pool.submit(send_request, web.port, {"path": "/", "headers": {"x-api-key": "a"}})
            time.sleep(0.9)
            refused = send_request(web.port, {"path": "/", "headers": {"x-api-key": "a"}})
            assert slow_one.result(5)["status"] == 200
        assert refused["status"] == 429
        web.run(aclient.aclose())
    finally:
        web.stop()
    assert started == ["up"], "the lifespan scope went through the middleware"
    text = generate_latest(registry).decode()
    assert 'ratelimit_decisions_total{limit="inflight",outcome="allowed"} 1.0' in text
    assert 'ratelimit_decisions_total{limit="inflight",outcome="denied"} 1.0' in text
    assert 'ratelimit_decisions_total{limit="inflight",outcome="degraded"} 0.0' in text
    assert metrics.render_prometheus().splitlines()[2:] == [
        'ratelimit_decisions_total{limit="inflight",outcome="allowed"} 1',
        'ratelimit_decisions_total{limit="inflight",outcome="denied"} 1',
        'ratelimit_decisions_total{limit="inflight",outcome="degraded"} 0',
    ]


def test_keys_limits_and_classes_from_functions(clock: Server) -> None:
    from flask import Flask

    client = Client.from_url(clock.url, SLACK)
    app = Flask("functions")

    @app.route("/<path:path>")
    def handler(path: str) -> str:
        return "ok"

    def per_route(plan: str, route_class: str) -> list[Policy]:
        return (
            [Policy(f"{plan}-{route_class}", FixedWindow(1 if plan == "free" else 2, 60))]
            if route_class == "api"
            else []
        )

    WsgiMiddleware(
        client=client,
        key=lambda info: f"user-{info.header('x-user')}" if info.header("x-user") else None,
        plan=lambda info: info.header("x-plan") or "free",
        route_class=lambda info: "api" if info.path.startswith("/api/") else "assets",
        limits_fn=per_route,
    ).init_app(app)
    web = WerkzeugServer()
    web.dispatch.current = app
    try:
        statuses = [
            send_request(web.port, {"path": p, "headers": h})["status"]
            for p, h in [
                ("/api/a", {"x-user": "ann"}),
                ("/api/a", {"x-user": "ann"}),
                ("/api/a", {"x-user": "bob", "x-plan": "pro"}),
                ("/api/a", {"x-user": "bob", "x-plan": "pro"}),
                ("/api/a", {"x-user": "bob", "x-plan": "pro"}),
                ("/api/a", {}),
                ("/assets/x", {"x-user": "ann"}),
            ]
        ]
        untouched = send_request(web.port, {"path": "/assets/x"})
    finally:
        web.stop()
    assert statuses == [200, 429, 200, 200, 429, 200, 200]
    assert "ratelimit" not in untouched["headers"] and untouched["status"] == 200
    assert sorted(clock.connect().keys("*")) == [
        "rl:{anonymous}:api:free-api",
        "rl:{user-ann}:api:free-api",
        "rl:{user-bob}:api:pro-api",
    ]
