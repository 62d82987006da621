# mypy: disallow-untyped-calls=False
"""What users of limits, Flask-Limiter and slowapi expect: rate strings wherever limits are given,
app-wide default limits and exempt paths in both middleware (Flask through ``init_app``), the
decorator's arguments checked when it decorates, and results that print as what they hold."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from fastapi import Request, Response

from ratelimit_client import (
    AsyncClient,
    Client,
    Concurrency,
    Decision,
    FixedWindow,
    Mode,
    MultiOutcome,
    Outcome,
    SlidingWindow,
    TokenBucket,
)
from ratelimit_client.asgi import RateLimitMiddleware as AsgiMiddleware
from ratelimit_client.decorators import limit, parse_rate
from ratelimit_client.middleware import Policy, client_ip, exempt, header, parse_rates
from ratelimit_client.wsgi import RateLimitMiddleware as WsgiMiddleware
from servers import SLACK, Server, call

START_US = 1_800_000_000_000_000


@pytest.fixture
def clock() -> Any:
    with Server(test_clock=True) as s:
        call(s.raw(), "RL.TESTCLOCK", "SET", START_US)
        yield s


# 1. Rate strings -----------------------------------------------------------------------------


def test_rate_strings_as_limits_reads_them() -> None:
    assert parse_rates("5/minute") == [Policy("5/minute", FixedWindow(5, 60))]
    assert parse_rates("5/minute;100/hour") == [
        Policy("5/minute", FixedWindow(5, 60)),
        Policy("100/hour", FixedWindow(100, 3600)),
    ]
    assert parse_rates("10 per second, 1/2 seconds|3 per 5 MINUTES") == [
        Policy("10 per second", FixedWindow(10, 1)),
        Policy("1/2 seconds", FixedWindow(1, 2)),
        Policy("3 per 5 MINUTES", FixedWindow(3, 300)),
    ]
    assert parse_rates(" 2 / day ; 7/month;1/year") == [
        Policy("2 / day", FixedWindow(2, 86400)),
        Policy("7/month", FixedWindow(7, 2592000)),
        Policy("1/year", FixedWindow(1, 31104000)),
    ]
    assert parse_rate("100 per hour") == Policy("100 per hour", FixedWindow(100, 3600))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("5 a minute", "not a rate: '5 a minute' in '5 a minute'"),
        ("5/minute;", "not a rate: '' in '5/minute;'"),
        ("5/fortnight", "not a rate: '5/fortnight'"),
        ("five/minute", "not a rate: 'five/minute'"),
        ("0/minute", "an amount and a multiple of at least 1"),
        ("1/0 seconds", "an amount and a multiple of at least 1"),
        ("5/minute;5/minute", "two limits of one route are named '5/minute'"),
        ("", "not a rate: ''"),
    ],
)
def test_bad_rate_strings_are_refused(text: str, message: str) -> None:
    with pytest.raises(ValueError) as e:
        parse_rates(text)
    assert message in str(e.value)


def test_bad_limits_are_refused_when_the_middleware_is_made() -> None:
    client = Client.from_url("redis://127.0.0.1:1")  # never reached: construction fails first
    aclient = AsyncClient.from_url("redis://127.0.0.1:1")

    def app(environ: Any, start_response: Any) -> list[bytes]:
        return []

    with pytest.raises(ValueError, match=r"not a rate: '5/minutes;x'|not a rate: 'x' in '5/minutes;x'"):
        WsgiMiddleware(app, client=client, limits={("*", "*"): "5/minutes;x"})
    with pytest.raises(ValueError, match="not a rate: '1 every hour'"):
        AsgiMiddleware(app, client=aclient, default_limits="1 every hour")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="header_format is 'draft-11' or 'draft-12', not 'draft-13'"):
        WsgiMiddleware(app, client=client, header_format="draft-13")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="an exempt path starts with '/': 'health'"):
        WsgiMiddleware(app, client=client, exempt=["health"])
    with pytest.raises(TypeError, match="exempt is a list of paths, not the string '/health'"):
        WsgiMiddleware(app, client=client, exempt="/health")
    with pytest.raises(TypeError, match="a Policy, an algorithm or a rate such as '5/minute', not 5"):
        WsgiMiddleware(app, client=client, limits={("*", "*"): [5]})  # type: ignore[list-item]
    with pytest.raises(ValueError, match="the estimate of 'api' is a whole number of units, 0 or more, not -1"):
        WsgiMiddleware(app, client=client, estimates={"api": -1})


# 2. Default limits and exempt paths, through Flask (init_app) and Starlette -------------------


def flask_app() -> Any:
    from flask import Flask

    app = Flask("idioms")

    @app.route("/<path:path>")
    def handler(path: str) -> str:
        return "ok"

    return app


def test_flask_default_limits_exempt_paths_and_rate_strings(clock: Server) -> None:
    app = flask_app()
    limiter = WsgiMiddleware(
        client=Client.from_url(clock.url, SLACK),
        key=header("x-user"),
        route_class=lambda info: "search" if info.path.startswith("/search") else "other",
        limits={("*", "search"): "1/minute;10/hour"},
        default_limits="2/minute",
        exempt=["/health", "/metrics*"],
    )
    limiter.init_app(app)
    assert app.wsgi_app is limiter and app.extensions["ratelimit"] is limiter
    web = app.test_client()
    got = [web.get(p, headers={"x-user": "ann"}) for p in ("/a", "/b", "/c", "/search", "/search")]
    assert [r.status_code for r in got] == [200, 200, 429, 200, 429]
    assert [r.headers.get("ratelimit") for r in got] == [
        '"2/minute";r=1;t=60',
        '"2/minute";r=0;t=60',
        '"2/minute";r=0;t=60',
        '"1/minute";r=0;t=60, "10/hour";r=9;t=3600',
        '"1/minute";r=0;t=60, "10/hour";r=9;t=3600',
    ]
    assert got[4].headers["ratelimit-policy"] == '"1/minute";q=1;w=60, "10/hour";q=10;w=3600'
    # Exempt: never limited, no fields, no key in Redis.
    for path in ("/health", "/metrics", "/metrics/jobs", "/health", "/health"):
        r = web.get(path, headers={"x-user": "ann"})
        assert (r.status_code, r.headers.get("ratelimit")) == (200, None)
    assert sorted(clock.connect().keys("*")) == [
        "rl:{ann}:other:2/minute",
        "rl:{ann}:search:1/minute",
        "rl:{ann}:search:10/hour",
    ]
    with pytest.raises(RuntimeError, match="already wraps an application"):
        limiter.init_app(flask_app())
    with pytest.raises(RuntimeError, match="wraps no application"):
        WsgiMiddleware(client=Client.from_url(clock.url, SLACK))({}, lambda *a: lambda b: None)


def test_starlette_default_limits_and_exempt_paths(clock: Server) -> None:
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    async def handler(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    app = Starlette(routes=[Route("/{path:path}", handler)])
    app.add_middleware(
        AsgiMiddleware,
        client=AsyncClient.from_url(clock.url, SLACK),
        key=header("x-user"),
        limits={("pro", "*"): [Policy("burst", TokenBucket(5, 1)), "100/hour"]},
        plan=lambda info: info.header("x-plan") or "free",
        default_limits=["1/minute", SlidingWindow(50, 3600)],
        exempt=["/health"],
    )
    with TestClient(app, client=("127.0.0.1", 5000)) as web:
        free = [web.get("/x", headers={"x-user": "bob"}) for _ in range(2)]
        pro = web.get("/x", headers={"x-user": "cy", "x-plan": "pro"})
        health = [web.get("/health", headers={"x-user": "bob"}) for _ in range(3)]
    assert [r.status_code for r in free] == [200, 429]
    assert free[0].headers["ratelimit"] == '"1/minute";r=0;t=60, "slidingwindow";r=49;t=7200'
    assert free[1].headers["retry-after"] == "60"
    assert pro.headers["ratelimit"] == '"burst";r=4;t=1, "100/hour";r=99;t=3600'
    assert [(r.status_code, r.headers.get("ratelimit")) for r in health] == [(200, None)] * 3


# 3. The decorator's arguments, checked when it decorates --------------------------------------


def test_the_decorator_checks_its_arguments_when_it_decorates() -> None:
    client = Client.from_url("redis://127.0.0.1:1")  # never called

    with pytest.raises(TypeError, match="limit\\(\\) missing 1 required keyword-only argument: 'key'"):
        limit(client, "5/minute")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="limit\\(\\) needs key=: client_ip\\(\\) or header\\(name\\) for a view"):
        limit(client, "5/minute", key=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not a rate: '5 per fortnight'"):
        limit(client, "5 per fortnight", key=client_ip())
    with pytest.raises(TypeError, match="limit\\(\\) needs at least one limit"):
        limit(client, key=client_ip())
    with pytest.raises(ValueError, match="cost is a whole number of units, 0 or more, not -1"):
        limit(client, "5/minute", key=client_ip(), cost=-1)
    with pytest.raises(ValueError, match="name is a non-empty string, not ''"):
        limit(client, "5/minute", key=client_ip(), name="")
    with pytest.raises(TypeError, match="key is a function, not 'user'"):
        limit(client, "5/minute", key="user")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="limit\\(\\) takes a Client or an AsyncClient first"):
        limit("redis://127.0.0.1", "5/minute", key=client_ip())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="two limits of one route are named '5/minute'"):
        limit(client, "5/minute", Policy("5/minute", FixedWindow(1, 1)), key=client_ip())

    def send(user: str, text: str) -> None: ...

    with pytest.raises(TypeError, match=r"the key of .*send is called with its arguments \(user, text\): too many"):
        limit(client, "5/minute", key=lambda user: user)(send)
    limit(client, "5/minute", key=lambda user, text: user)(send)  # a key that fits is taken


# 4. Results that print as what they hold ------------------------------------------------------


def test_results_print_as_what_they_hold(clock: Server) -> None:
    client = Client.from_url(clock.url, SLACK)
    bucket = TokenBucket(10, 1)
    r = client.reserve("r", bucket, estimate=4)
    assert repr(r) == (
        "ReservationOutcome(outcome=Outcome(decision=Decision(allowed=True, remaining=6, retry_after_ms=0, "
        "reset_after_ms=4000, limit=10), degraded=None, mode=<Mode.MODULE: 'module'>, granted=4, "
        "answered_locally=None), reservation=Reservation(limits=[('r', TokenBucket(capacity=10, "
        "refill_per_sec=1))], estimate=4, degraded=None))"
    )
    held = client.acquire("slots", Concurrency(1, 30), lease_id="L1")
    assert repr(held) == (
        "LeaseOutcome(outcome=Outcome(decision=Decision(allowed=True, remaining=0, retry_after_ms=0, "
        "reset_after_ms=30000, limit=1), degraded=None, mode=<Mode.MODULE: 'module'>, granted=1, "
        "answered_locally=None), lease=Lease(id='L1', limits=[('slots', Concurrency(limit=1, lease_sec=30))], "
        "holds_slot=True))"
    )
    both = client.reserve_all([("{a}:1", bucket), ("{a}:2", FixedWindow(3, 60))], estimate=2)
    assert repr(both) == (
        "MultiReservationOutcome(outcome=MultiOutcome(allowed=True, denied_by=0, decisions=("
        "Decision(allowed=True, remaining=8, retry_after_ms=0, reset_after_ms=2000, limit=10), "
        "Decision(allowed=True, remaining=1, retry_after_ms=0, reset_after_ms=60000, limit=3)), degraded=None, "
        "mode=<Mode.MODULE: 'module'>, granted=2, answered_locally=None), reservation=Reservation(limits=[('{a}:1', "
        "TokenBucket(capacity=10, refill_per_sec=1)), ('{a}:2', FixedWindow(limit=3, window_sec=60))], estimate=2, "
        "degraded=None))"
    )
    refused = client.acquire_all([("{b}:c", Concurrency(1, 30)), ("{b}:w", FixedWindow(1, 60))])
    again = client.acquire_all([("{b}:c", Concurrency(1, 30)), ("{b}:w", FixedWindow(1, 60))])
    assert repr(again) == (
        "MultiLeaseOutcome(outcome=MultiOutcome(allowed=False, denied_by=1, decisions=(Decision(allowed=False, "
        "remaining=0, retry_after_ms=30000, reset_after_ms=30000, limit=1), Decision(allowed=False, remaining=0, "
        "retry_after_ms=60000, reset_after_ms=60000, limit=1)), degraded=None, "
        "mode=<Mode.MODULE: 'module'>, granted=0, answered_locally=None), lease=None)"
    )
    assert refused.allowed
    host = f"redis://127.0.0.1:{clock.port}/0"
    options = (
        "Options(timeout=2.0, policy=FailOpen(), breaker=BreakerConfig(failures=3, cooldown=1.0), "
        "mode=<ModeChoice.AUTO: 'auto'>, fail_closed_retry_ms=1000, max_in_flight=64)"
    )
    assert repr(client) == f"Client({host!r}, mode=<Mode.MODULE: 'module'>, options={options})"
    from ratelimit_client import Limiter

    assert (
        repr(Limiter(client, bucket))
        == f"Limiter(client={client!r}, algorithm=TokenBucket(capacity=10, refill_per_sec=1))"
    )

    async def run() -> list[str]:
        async with AsyncClient.from_url(clock.url, SLACK) as a:
            r = await a.reserve("ar", bucket, estimate=3)
            async with a.acquire("aslots", Concurrency(2, 30), lease_id="L2") as held:
                out = [repr(r), repr(held), repr(a)]
        return out

    ar, aheld, aclient = asyncio.run(run())
    assert ar == (
        "AsyncReservationOutcome(outcome=Outcome(decision=Decision(allowed=True, remaining=7, retry_after_ms=0, "
        "reset_after_ms=3000, limit=10), degraded=None, mode=<Mode.MODULE: 'module'>, granted=3, "
        "answered_locally=None), "
        "reservation=AsyncReservation(limits=[('ar', TokenBucket(capacity=10, refill_per_sec=1))], estimate=3, "
        "degraded=None))"
    )
    assert aheld == (
        "AsyncLeaseOutcome(outcome=Outcome(decision=Decision(allowed=True, remaining=1, retry_after_ms=0, "
        "reset_after_ms=30000, limit=2), degraded=None, mode=<Mode.MODULE: 'module'>, granted=1, "
        "answered_locally=None), "
        "lease=AsyncLease(id='L2', limits=[('aslots', Concurrency(limit=2, lease_sec=30))], holds_slot=True))"
    )
    assert aclient == f"AsyncClient({host!r}, mode=<Mode.MODULE: 'module'>, options={options})"
    assert repr(header("x-api-key")) == "header('x-api-key')"
    assert repr(client_ip(["10.0.0.1"])) == "client_ip(['10.0.0.1'])"
    assert isinstance(Outcome(Decision(True, 1, 0, 0, 1), None, Mode.MODULE), Outcome)
    assert MultiOutcome(True, 0, (), None, None).allowed


# The header format ------------------------------------------------------------------------------


def test_draft_12_fields_through_flask(clock: Server) -> None:
    """``header_format="draft-12"``: the same policies; ``RateLimit`` items with ``a``, ``w`` and
    ``c`` (the estimate taken, 1 for a concurrency policy, 0 from a policy that did not allow
    the request or on a refusal); ``RateLimit-Partition`` one ``client_id`` item per policy."""
    app = flask_app()
    WsgiMiddleware(
        client=Client.from_url(clock.url, SLACK),
        key=header("x-user"),
        limits={
            ("*", "*"): [
                Policy("burst", TokenBucket(5, 1)),
                Policy("inflight", Concurrency(2, 30)),
                Policy("new", FixedWindow(3, 60)).as_shadow(),
            ]
        },
        estimates={"*": 2},
        header_format="draft-12",
        legacy_headers=True,
    ).init_app(app)
    web = app.test_client()
    got = [web.get("/x", headers={"x-user": "ann"}) for _ in range(3)]
    fields = [
        {k: r.headers.get(k) for k in ("ratelimit-policy", "ratelimit", "ratelimit-partition", "ratelimit-remaining")}
        | {"status": r.status_code}
        for r in got
    ]
    policy = '"burst";q=5;w=5, "inflight";q=2;qu="concurrent-requests", "new";q=3;w=60'
    partition = '"burst";client_id, "inflight";client_id, "new";client_id'
    assert fields == [
        {
            "status": 200,
            "ratelimit-policy": policy,
            "ratelimit": '"burst";a=3;w=2;c=2, "inflight";a=1;w=30;c=1, "new";a=1;w=60;c=2',
            "ratelimit-partition": partition,
            "ratelimit-remaining": "1",
        },
        {
            "status": 200,
            "ratelimit-policy": policy,
            "ratelimit": '"burst";a=1;w=4;c=2, "inflight";a=1;w=30;c=1, "new";a=1;w=60;c=0',
            "ratelimit-partition": partition,
            "ratelimit-remaining": "1",
        },
        {
            "status": 429,
            "ratelimit-policy": '"burst";q=5;w=5, "inflight";q=2;qu="concurrent-requests", "new";q=3;w=60',
            "ratelimit": '"burst";a=1;w=4;c=0, "inflight";a=2;w=0;c=0, "new";a=1;w=60;c=0',
            "ratelimit-partition": partition,
            "ratelimit-remaining": "1",
        },
    ]


# Views marked exempt, and views with limits of their own (@limit) ------------------------------


def test_flask_views_exempt_or_with_their_own_limits(clock: Server) -> None:
    from flask import Flask

    client = Client.from_url(clock.url, SLACK)
    app = Flask("marks")

    @app.route("/health")
    @exempt
    def health() -> str:
        return "up"

    @app.route("/login", methods=["POST"])
    @limit(client, "3/minute", key=client_ip())
    def login() -> str:
        return "welcome"

    @app.route("/other")
    def other() -> str:
        return "ok"

    WsgiMiddleware(client=client, default_limits="1/minute").init_app(app)
    web = app.test_client()
    health_answers = [web.get("/health") for _ in range(3)]
    logins = [web.post("/login") for _ in range(2)]
    others = [web.get("/other") for _ in range(2)]
    assert [(r.status_code, r.headers.get("ratelimit")) for r in health_answers] == [(200, None)] * 3
    # The view's own limit alone: the default does not apply to it.
    assert [(r.status_code, r.headers.get("ratelimit")) for r in logins] == [
        (200, '"3/minute";r=2;t=60'),
        (200, '"3/minute";r=1;t=60'),
    ]
    assert [(r.status_code, r.headers.get("ratelimit")) for r in others] == [
        (200, '"1/minute";r=0;t=60'),
        (429, '"1/minute";r=0;t=60'),
    ]
    assert sorted(clock.connect().keys("*")) == [
        "rl:{127.0.0.1}:default:1/minute",
        "rl:{127.0.0.1}:test_flask_views_exempt_or_with_their_own_limits.<locals>.login:3/minute",
    ]


def test_fastapi_endpoints_exempt_or_with_their_own_limits(clock: Server) -> None:
    from fastapi import FastAPI
    from starlette.testclient import TestClient

    aclient = AsyncClient.from_url(clock.url, SLACK)
    app = FastAPI()

    @app.get("/metrics")
    @exempt
    async def metrics() -> str:
        return "up"

    @app.get("/search")
    @limit(aclient, "2/minute", key=header("x-user"), name="search")
    async def search(request: Request, response: Response) -> dict[str, str]:
        return {"found": "nothing"}

    @app.get("/items/{item}")
    async def item(item: str) -> dict[str, str]:
        return {"item": item}

    app.add_middleware(AsgiMiddleware, client=aclient, key=header("x-user"), default_limits="1/minute")
    with TestClient(app) as web:
        got = [
            web.get(p, headers={"x-user": "ann"}) for p in ("/metrics", "/metrics", "/search", "/items/a", "/items/b")
        ]
    assert [(r.status_code, r.headers.get("ratelimit")) for r in got] == [
        (200, None),
        (200, None),
        (200, '"2/minute";r=1;t=60'),  # its own limit's fields, not the default's
        (200, '"1/minute";r=0;t=60'),
        (429, '"1/minute";r=0;t=60'),
    ]
    assert sorted(clock.connect().keys("*")) == ["rl:{ann}:default:1/minute", "rl:{ann}:search:2/minute"]
