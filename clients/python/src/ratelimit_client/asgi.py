"""ASGI middleware (Starlette, FastAPI, any ASGI application) on the asyncio client.

    app.add_middleware(
        RateLimitMiddleware,
        client=AsyncClient.from_url("redis://127.0.0.1:6379"),
        key=header("x-api-key"),
        limits={("*", "*"): [Policy("per-minute", FixedWindow(60, 60))]},
    )

A concurrency limit among a route's policies counts requests in flight: its slot is taken before
the application runs and given back when the application has answered (the response sent to the
end, or the client gone). A route with an estimate reserves it before the application runs; the
application reports what the request really cost with :func:`report_cost` before it starts its
response, and the difference is settled before the response fields are written.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from typing import Any

from ._http import (
    DENY_CACHE_ENTRIES,
    FIELDS,
    STATE_KEY,
    Admission,
    HeaderFormat,
    Headers,
    KeyFunc,
    LimitsSpec,
    Policy,
    RateLimitState,
    RequestInfo,
    admit,
    client_ip,
    finish,
    header,
    keep_alive,
    make_rules,
    mark_of,
    release_async,
    report_cost,
    run_async,
    starlette_view,
)
from .aio import AsyncClient
from .metrics import Metrics, breaker_text

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

__all__ = ["Policy", "RateLimitMiddleware", "RateLimitState", "RequestInfo", "client_ip", "header", "report_cost"]


async def respond(send: Send, status: int, headers: Headers, body: bytes) -> None:
    raw = [(n.encode("latin-1"), v.encode("latin-1")) for n, v in headers]
    raw.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


class RateLimitMiddleware:
    """Rate limits HTTP requests in front of an ASGI application.

    Keyword options (as :class:`ratelimit_client.middleware.Rules`): ``key`` (default: the client
    IP, :func:`client_ip`), ``plan``, ``route_class``, ``limits`` (``{(plan, class): [Policy,
    ...]}``, or a rate string such as ``"5/minute;100/hour"`` in place of a list), ``limits_fn``,
    ``default_limits`` (for the routes with none of their own), ``exempt`` (paths never
    limited), ``estimates``, ``legacy_headers``, ``prefix``, ``lease_keep_alive``,
    ``header_format`` (``"draft-11"``, the default, or ``"draft-12"``); and ``metrics`` to share
    counters. ``deny_cache`` (on by default) denies again in the process, without calling
    Redis, a request whose limits Redis denied with ``retry_after_ms`` R, until R has passed on
    the process's clock (counted ``outcome="deny_cache"``); ``deny_cache_entries`` (10,000) bounds
    it, the least recently used evicted first. Turn it off where a test moves the server's clock.
    A limit or an option that cannot be read is refused here, not at the first request."""

    def __init__(
        self,
        app: ASGIApp,
        client: AsyncClient,
        *,
        key: KeyFunc | None = None,
        plan: Callable[[RequestInfo], str] | None = None,
        route_class: Callable[[RequestInfo], str] | None = None,
        limits: Mapping[tuple[str, str], LimitsSpec] | None = None,
        limits_fn: Callable[[str, str], LimitsSpec] | None = None,
        default_limits: LimitsSpec | None = None,
        exempt: Iterable[str] = (),
        estimates: Mapping[str, int] | None = None,
        legacy_headers: bool = False,
        prefix: str = "rl",
        lease_keep_alive: float | None = None,
        metrics: Metrics | None = None,
        header_format: HeaderFormat = "draft-11",
        deny_cache: bool = True,
        deny_cache_entries: int = DENY_CACHE_ENTRIES,
    ) -> None:
        self.app = app
        #: The client the middleware decides with (its deny cache and batches included): close
        #: it on shutdown to give back what the batches hold.
        self.client = client.with_deny_cache(deny_cache_entries) if deny_cache else client.without_deny_cache()
        self.rules = make_rules(
            key=key,
            plan=plan,
            route_class=route_class,
            limits=limits,
            limits_fn=limits_fn,
            estimates=estimates,
            legacy_headers=legacy_headers,
            prefix=prefix,
            lease_keep_alive=lease_keep_alive,
            default_limits=default_limits,
            exempt=exempt,
            header_format=header_format,
        )
        self.metrics = metrics if metrics is not None else Metrics()

    def render_prometheus(self) -> str:
        """What to serve on ``/metrics``: the middleware's counters
        (:meth:`Metrics.render_prometheus`), then ``ratelimit_breaker_open``, 1 while the
        client's circuit breaker is open (Redis failed repeatedly and the failure policy answers
        without asking it), else 0 (``docs/monitoring/client_alerts.yml`` alerts on it)."""
        return self.metrics.render_prometheus() + breaker_text(self.client.breaker_open())

    def register(self, registry: Any = None) -> Any:
        """The same through ``prometheus_client``: :meth:`Metrics.register` with the breaker's
        gauge."""
        return self.metrics.register(registry, self.client.breaker_open)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = RateLimitState()
        scope[STATE_KEY] = state
        mark = mark_of(starlette_view(scope))
        adm: Admission | None = await run_async(
            self.client, admit(self.rules, self.metrics, RequestInfo.from_scope(scope), mark)
        )
        if adm is None:
            await self.app(scope, receive, send)
            return
        state.outcome = adm.outcome
        state.shadow_denials = list(adm.denials)
        legacy = self.rules.legacy_headers
        if not adm.allowed:
            await respond(send, *adm.refusal(legacy))
            return
        keep_alive(adm, self.rules.lease_keep_alive)

        async def send_with_fields(message: Message) -> None:
            if message["type"] == "http.response.start":
                fields: Headers = await run_async(self.client, finish(adm, self.metrics, state.actual_cost, legacy))
                raw = [
                    (n, v) for n, v in message.get("headers", ()) if bytes(n).decode("latin-1").lower() not in FIELDS
                ]
                raw += [(n.encode("latin-1"), v.encode("latin-1")) for n, v in fields]
                message = {**message, "headers": raw}
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                # The slots come back before the response's end goes out: a client that has read
                # the whole response finds them free.
                await asyncio.shield(release_async(adm))
            await send(message)

        try:
            await self.app(scope, receive, send_with_fields)
        finally:
            # Else once the application is done: it failed, or the client went away (even if this
            # task is being cancelled).
            await asyncio.shield(release_async(adm))
