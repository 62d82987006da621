# mypy: disallow-untyped-calls=False
"""The middleware's metrics text as an application serves it: the counters with
``outcome="batch"`` and ``outcome="deny_cache"``, then the breaker's gauge, byte for byte, on a
real server and on a closed port (the breaker open); and the same through prometheus_client."""

from __future__ import annotations

from typing import Any

from flask import Flask
from prometheus_client import CollectorRegistry, generate_latest

from ratelimit_client import Batching, Client, FailClosed, FixedWindow, Options
from ratelimit_client.metrics import DECISIONS_HELP
from ratelimit_client.middleware import Policy, header
from ratelimit_client.wsgi import RateLimitMiddleware
from servers import SLACK, Server

BREAKER = (
    "# HELP ratelimit_breaker_open Whether the client's circuit breaker is open: Redis failed repeatedly and the "
    "failure policy answers without asking it.\n"
    "# TYPE ratelimit_breaker_open gauge\n"
    "ratelimit_breaker_open {}\n"
)


def app_with(client: Client) -> tuple[Any, RateLimitMiddleware]:
    app = Flask(__name__)

    @app.route("/")
    def index() -> str:
        return "ok"

    mw = RateLimitMiddleware(
        client=client, key=header("x-api-key"), limits={("*", "*"): [Policy("pm", FixedWindow(100, 3600))]}
    )
    mw.init_app(app)
    return app.test_client(), mw


def test_the_counters_then_the_breaker_gauge(server: Server) -> None:
    client = Client.from_url(server.url, SLACK).with_batching(Batching(hot_keys=["rl:{alice}:default:pm"]))
    http, mw = app_with(client)
    server.connect().execute_command("RL.FIXEDWINDOW", "rl:{bob}:default:pm", 100, 3600, 100)
    statuses = [http.get("/", headers={"x-api-key": who}).status_code for who in ["alice"] * 3 + ["bob"] * 2]
    assert statuses == [200, 200, 200, 429, 429]
    assert mw.render_prometheus() == (
        f"# HELP ratelimit_decisions_total {DECISIONS_HELP}\n"
        "# TYPE ratelimit_decisions_total counter\n"
        'ratelimit_decisions_total{limit="pm",outcome="allowed"} 3\n'
        'ratelimit_decisions_total{limit="pm",outcome="denied"} 2\n'
        'ratelimit_decisions_total{limit="pm",outcome="degraded"} 0\n'
        'ratelimit_decisions_total{limit="pm",outcome="batch"} 2\n'
        'ratelimit_decisions_total{limit="pm",outcome="deny_cache"} 1\n' + BREAKER.format(0)
    )
    assert client.close() == 5  # the batch of 8 took 3 for alice
    registry = CollectorRegistry()
    mw.register(registry)
    text = generate_latest(registry).decode()
    assert 'ratelimit_decisions_total{limit="pm",outcome="batch"} 2.0\n' in text
    assert "\nratelimit_breaker_open 0.0\n" in text


def test_the_gauge_is_1_while_the_breaker_is_open() -> None:
    http, mw = app_with(Client.from_url("redis://127.0.0.1:1", Options(policy=FailClosed())))
    assert mw.render_prometheus().endswith(BREAKER.format(0))
    assert [http.get("/", headers={"x-api-key": "a"}).status_code for _ in range(3)] == [429] * 3
    assert mw.render_prometheus() == (
        f"# HELP ratelimit_decisions_total {DECISIONS_HELP}\n"
        "# TYPE ratelimit_decisions_total counter\n"
        'ratelimit_decisions_total{limit="pm",outcome="allowed"} 0\n'
        'ratelimit_decisions_total{limit="pm",outcome="denied"} 3\n'
        'ratelimit_decisions_total{limit="pm",outcome="degraded"} 3\n' + BREAKER.format(1)
    )
    registry = CollectorRegistry()
    mw.register(registry)
    assert "\nratelimit_breaker_open 1.0\n" in generate_latest(registry).decode()
