"""``@limit(...)``: the limits of a single view or function, as Flask-Limiter and slowapi users
write them.

    @app.route("/login", methods=["POST"])
    @limit(client, "5/minute")                         # Flask: the client IP, 429 when refused
    def login(): ...

    @limit(client, Policy("burst", TokenBucket(10, 1)), key=lambda request: request.user.username)
    def export(request): ...                           # Django view

    @app.get("/search")
    @limit(async_client, "100/hour")                   # FastAPI / Starlette: takes `request: Request`
    async def search(request: Request): ...

    @limit(client, "10/second", key=lambda user_id: f"user:{user_id}")
    def send_sms(user_id: str): ...                     # any function: raises RateLimited

The view's limits are decided like the middleware's (one ``RL.ALL`` for several, the same
fields, the same ``429`` and problem+json body); Redis keys are ``rl:{<key>}:<name>:<policy>``,
``<name>`` the function's qualified name unless given. A synchronous function takes a
:class:`~ratelimit_client.Client`, a coroutine function an :class:`~ratelimit_client.AsyncClient`.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, cast

from ._http import (
    STATE_KEY,
    Admission,
    Headers,
    Policy,
    RateLimitState,
    RequestInfo,
    Rules,
    admit,
    client_ip,
    finish,
    release_async,
    release_sync,
    run_async,
    run_sync,
)
from ._types import RateLimitError
from .aio import AsyncClient
from .algorithms import Algorithm, FixedWindow
from .client import Client
from .metrics import Metrics

F = TypeVar("F", bound=Callable[..., Any])

_UNITS = {"second": 1, "minute": 60, "hour": 3600, "day": 86400}
_RATE = re.compile(r"^\s*(\d+)\s*(?:/|per)\s*(\d+)?\s*(second|minute|hour|day)s?\s*$", re.IGNORECASE)


def parse_rate(text: str) -> Policy:
    """``"5/minute"``, ``"5 per minute"``, ``"100/2 hours"``: a fixed window (Flask-Limiter's
    default strategy), named by the text."""
    m = _RATE.match(text)
    if m is None:
        raise ValueError(f"not a rate: {text!r} (expected such as '5/minute' or '100 per hour')")
    count, every, unit = int(m.group(1)), int(m.group(2) or 1), m.group(3).lower()
    return Policy(text.strip(), FixedWindow(count, every * _UNITS[unit]))


def _policy(p: Policy | Algorithm | str) -> Policy:
    if isinstance(p, Policy):
        return p
    if isinstance(p, str):
        return parse_rate(p)
    if isinstance(p, Algorithm):
        return Policy(p.keyword.lower(), p)
    raise TypeError(f"a Policy, an algorithm or a rate such as '5/minute', not {p!r}")


class RateLimited(RateLimitError):
    """Raised by a limited function that is not a view (no framework response to answer with):
    the refusal, with the response a view would have given."""

    def __init__(self, status: int, headers: Headers, body: bytes) -> None:
        super().__init__(f"rate limited ({status})")
        self.status = status
        self.headers = headers
        self.body = body

    @property
    def retry_after(self) -> int | None:
        """Seconds until a retry may be admitted (``Retry-After``), when the refusal was a 429."""
        for name, value in self.headers:
            if name == "retry-after":
                return int(value)
        return None


# Frameworks: found from the call's arguments, imported only when seen.


class _Request:
    """The framework request of a call, and how to answer it."""

    def __init__(self, kind: str, request: Any, raw: Mapping[str, Any]) -> None:
        self.kind = kind
        self.request = request
        self.raw = raw

    def info(self) -> RequestInfo:
        if self.kind == "asgi":
            return RequestInfo.from_scope(self.raw)
        return RequestInfo.from_environ(self.raw)

    def respond(self, status: int, headers: Headers, body: bytes) -> Any:
        if self.kind == "django":
            response = importlib.import_module("django.http").HttpResponse(body, status=status)
        elif self.kind == "flask":
            response = importlib.import_module("flask").Response(body, status=status)
        else:
            response = importlib.import_module("starlette.responses").Response(body, status_code=status)
        return self.add_headers(response, headers, None)

    def add_headers(self, response: Any, headers: Headers, kwargs: Mapping[str, Any] | None) -> Any:
        if self.kind == "flask":
            response = importlib.import_module("flask").make_response(response)
        target = response
        if self.kind == "asgi" and not hasattr(response, "headers"):
            # FastAPI returning a plain value: the fields go on its `response: Response` parameter.
            target = next((v for v in (kwargs or {}).values() if _is_starlette_response(v)), None)
            if target is None:
                return response
        for name, value in headers:
            if self.kind == "django":
                target[name] = value
            else:
                target.headers[name] = value
        return response


def _is_starlette_response(v: Any) -> bool:
    return (
        type(v).__module__.startswith(("starlette.", "fastapi."))
        and hasattr(v, "headers")
        and hasattr(v, "status_code")
    )


def _find_request(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> _Request | None:
    for v in (*args, *kwargs.values()):
        scope = getattr(v, "scope", None)
        if isinstance(scope, dict) and scope.get("type") == "http":
            return _Request("asgi", v, scope)
        meta = getattr(v, "META", None)
        if isinstance(meta, dict) and "REQUEST_METHOD" in meta and hasattr(v, "method"):
            return _Request("django", v, meta)
    try:
        flask = importlib.import_module("flask")
    except ImportError:
        return None
    if flask.has_request_context():
        environ = flask.request.environ
        return _Request("flask", flask.request, environ)
    return None


def limit(
    client: Client | AsyncClient,
    *limits: Policy | Algorithm | str,
    key: Callable[..., str | None] | None = None,
    name: str | None = None,
    cost: int = 1,
    prefix: str = "rl",
    legacy_headers: bool = False,
    metrics: Metrics | None = None,
) -> Callable[[F], F]:
    """Limits a view or a function: all of ``limits`` at once (policies, algorithms named after
    their command, or rates such as ``"5/minute"``), each call costing ``cost`` (an estimate the
    view may settle with :func:`~ratelimit_client.middleware.report_cost`).

    ``key`` is called with the function's own arguments and returns who the call is counted
    against; without it, a view's client IP. A refused view answers ``429`` with the fields and
    the problem+json body (Flask, Django, Starlette, FastAPI); a refused function raises
    :class:`RateLimited`. An admitted view's response gets the ``RateLimit`` fields (for a
    FastAPI endpoint returning a plain value, on its ``response: Response`` parameter when it has
    one). Concurrency limits are held while the function runs."""
    policies = [_policy(p) for p in limits]
    if not policies:
        raise TypeError("limit() needs at least one limit")
    counters = metrics if metrics is not None else Metrics()

    def decorate(fn: F) -> F:
        route = name or fn.__qualname__
        is_async = inspect.iscoroutinefunction(fn)
        if is_async and not isinstance(client, AsyncClient):
            raise TypeError(f"{route} is a coroutine function: limit it with an AsyncClient")
        if not is_async and not isinstance(client, Client):
            raise TypeError(f"{route} is a function: limit it with a Client (AsyncClient for coroutines)")

        def prepare(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[_Request | None, Rules, RequestInfo]:
            request = _find_request(args, kwargs)
            if key is None and request is None:
                raise TypeError(f"{route} has no request to take a client IP from: give limit() a key=")
            who = key(*args, **kwargs) if key is not None else None
            info = request.info() if request is not None else RequestInfo("CALL", route, {}, None, {})
            rules = Rules(
                key=(lambda _: who) if key is not None else client_ip(),
                route_class=lambda _: route,
                limits={("*", "*"): policies},
                estimates={"*": cost},
                legacy_headers=legacy_headers,
                prefix=prefix,
            )
            return request, rules, info

        def refused(request: _Request | None, adm: Admission) -> Any:
            status, headers, body = adm.refusal(legacy_headers)
            if request is None:
                raise RateLimited(status, headers, body)
            return request.respond(status, headers, body)

        def state_for(request: _Request | None) -> RateLimitState:
            state = RateLimitState()
            if request is not None and isinstance(request.raw, dict):
                request.raw[STATE_KEY] = state
            return state

        if is_async:
            aclient = cast(AsyncClient, client)

            @functools.wraps(fn)
            async def limited_async(*args: Any, **kwargs: Any) -> Any:
                request, rules, info = prepare(args, kwargs)
                state = state_for(request)
                adm: Admission = await run_async(aclient, admit(rules, counters, info))
                state.outcome, state.shadow_denials = adm.outcome, list(adm.denials)
                if not adm.allowed:
                    return refused(request, adm)
                try:
                    result = await fn(*args, **kwargs)
                    fields: Headers = await run_async(aclient, finish(adm, counters, state.actual_cost, legacy_headers))
                finally:
                    await release_async(adm)
                return request.add_headers(result, fields, kwargs) if request is not None else result

            return cast(F, limited_async)

        sclient = cast(Client, client)

        @functools.wraps(fn)
        def limited(*args: Any, **kwargs: Any) -> Any:
            request, rules, info = prepare(args, kwargs)
            state = state_for(request)
            adm: Admission = run_sync(sclient, admit(rules, counters, info))
            state.outcome, state.shadow_denials = adm.outcome, list(adm.denials)
            if not adm.allowed:
                return refused(request, adm)
            try:
                result = fn(*args, **kwargs)
                fields: Headers = run_sync(sclient, finish(adm, counters, state.actual_cost, legacy_headers))
            finally:
                release_sync(adm)
            return request.add_headers(result, fields, kwargs) if request is not None else result

        return cast(F, limited)

    return decorate


__all__ = ["RateLimited", "limit", "parse_rate"]
