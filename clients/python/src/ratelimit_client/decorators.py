"""``@limit(...)``: the limits of a single view or function, as Flask-Limiter and slowapi users
write them.

    @app.route("/login", methods=["POST"])
    @limit(client, "5/minute", key=client_ip())        # Flask: the client IP, 429 when refused
    def login(): ...

    @limit(client, Policy("burst", TokenBucket(10, 1)), key=lambda request: request.user.username)
    def export(request): ...                           # Django view

    @app.get("/search")
    @limit(async_client, "5/minute;100/hour", key=header("x-api-key"))   # FastAPI / Starlette:
    async def search(request: Request): ...            # takes `request: Request`

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
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, cast

from ._http import (
    MARK,
    STATE_KEY,
    Admission,
    Headers,
    LimitSpec,
    Policy,
    RateLimitState,
    RequestInfo,
    RequestKey,
    Rules,
    admit,
    client_ip,
    exempt,
    finish,
    header,
    parse_rates,
    policies_of,
    release_async,
    release_sync,
    run_async,
    run_sync,
)
from ._types import Decision, MultiOutcome, RateLimitError
from .aio import AsyncClient
from .client import Client
from .metrics import Metrics

F = TypeVar("F", bound=Callable[..., Any])


def parse_rate(text: str) -> Policy:
    """One rate (``"5/minute"``, ``"100 per hour"``, ``"1/2 seconds"``): a fixed window named by
    its text (:func:`~ratelimit_client.middleware.parse_rates` reads several)."""
    policies = parse_rates(text)
    if len(policies) != 1:
        raise ValueError(f"one rate, not {len(policies)}: {text!r} (parse_rates reads several)")
    return policies[0]


class RateLimited(RateLimitError):
    """Raised by a limited function that is not a view (no framework response to answer with):
    the refusal, with the response a view would have given (``status``, ``headers``, ``body``)
    and the decision behind it (``outcome``, ``decision``, ``limit``)."""

    def __init__(
        self,
        status: int,
        headers: Headers,
        body: bytes,
        outcome: MultiOutcome | None = None,
        limit: str | None = None,
    ) -> None:
        super().__init__(f"rate limited ({status})" if limit is None else f"rate limit {limit!r} exceeded ({status})")
        self.status = status
        self.headers = headers
        self.body = body
        #: Every enforced limit's decision (``None`` on a 500: Redis refused a limit).
        self.outcome = outcome
        #: The name of the limit that refused.
        self.limit = limit

    @property
    def decision(self) -> Decision | None:
        """The refusing limit's decision, with the exact milliseconds: ``retry_after_ms`` (-1 when
        this cost can never be admitted) and ``reset_after_ms``."""
        if self.outcome is None or self.outcome.denied_by == 0:
            return None
        return self.outcome.decisions[self.outcome.denied_by - 1]

    @property
    def retry_after(self) -> int | None:
        """Whole seconds until a retry may be admitted, as the ``Retry-After`` field says them: the
        decision's ``retry_after_ms`` rounded up, at least 1 (its ``reset_after_ms`` when the cost
        can never be admitted); ``None`` when the refusal was not a 429. :attr:`decision` has the
        milliseconds."""
        for name, value in self.headers:
            if name == "retry-after":
                return int(value)
        return None

    def __repr__(self) -> str:
        return (
            f"RateLimited(status={self.status}, limit={self.limit!r}, retry_after={self.retry_after}, "
            f"decision={self.decision!r})"
        )


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


def _check_key(key: object, fn: Callable[..., Any], route: str) -> None:
    """A key that cannot take the function's arguments is refused at decoration time (when both
    signatures can be read and the function's parameters are plain positional ones)."""
    if isinstance(key, RequestKey):
        return
    try:
        params = list(inspect.signature(fn).parameters.values())
        key_sig = inspect.signature(cast(Callable[..., Any], key))
    except (TypeError, ValueError):
        return
    plain = inspect.Parameter.POSITIONAL_OR_KEYWORD
    if all(p.kind is plain and p.default is inspect.Parameter.empty for p in params):
        try:
            key_sig.bind(*params)
        except TypeError as e:
            raise TypeError(
                f"the key of {route} is called with its arguments ({', '.join(p.name for p in params)}): {e}"
            ) from None


def limit(
    client: Client | AsyncClient,
    *limits: LimitSpec,
    key: Callable[..., str | None],
    name: str | None = None,
    cost: int = 1,
    prefix: str = "rl",
    legacy_headers: bool = False,
    metrics: Metrics | None = None,
) -> Callable[[F], F]:
    """Limits a view or a function: all of ``limits`` at once (policies, algorithms named after
    their command, or rates such as ``"5/minute"`` and ``"5/minute;100/hour"``), each call
    costing ``cost`` (an estimate the view may settle with
    :func:`~ratelimit_client.middleware.report_cost`).

    ``key`` says who the call is counted against: :func:`client_ip` or :func:`header` for a
    view (taken from its request), or any function, called with the function's own arguments.
    A refused view answers ``429`` with the fields and the problem+json body (Flask, Django,
    Starlette, FastAPI); a refused function raises :class:`RateLimited`. An admitted view's
    response gets the ``RateLimit`` fields (for a FastAPI endpoint returning a plain value, on
    its ``response: Response`` parameter when it has one). Concurrency limits are held while the
    function runs.

    What can be checked before the first call is checked here (``TypeError``, ``ValueError``):
    the client, the limits and their rate strings, the key, the cost, the name; the client's
    kind against the function's (a coroutine function takes an :class:`AsyncClient`)."""
    if not isinstance(client, (Client, AsyncClient)):
        raise TypeError(f"limit() takes a Client or an AsyncClient first, not {client!r}")
    if not limits:
        raise TypeError("limit() needs at least one limit")
    policies = policies_of(list(limits))
    if key is None:
        raise TypeError(
            "limit() needs key=: client_ip() or header(name) for a view, or a function of the limited "
            "function's arguments returning who the call is counted against"
        )
    if not callable(key):
        raise TypeError(f"key is a function, not {key!r}")
    if isinstance(cost, bool) or not isinstance(cost, int) or cost < 0:
        raise ValueError(f"cost is a whole number of units, 0 or more, not {cost!r}")
    if name is not None and (not isinstance(name, str) or not name):
        raise ValueError(f"name is a non-empty string, not {name!r}")
    if not isinstance(prefix, str) or not prefix:
        raise ValueError(f"prefix is a non-empty string, not {prefix!r}")
    counters = metrics if metrics is not None else Metrics()
    from_request = isinstance(key, RequestKey)

    def decorate(fn: F) -> F:
        if not callable(fn):
            raise TypeError(f"limit() decorates a function, not {fn!r}")
        route = name or fn.__qualname__
        is_async = inspect.iscoroutinefunction(fn)
        if is_async and not isinstance(client, AsyncClient):
            raise TypeError(f"{route} is a coroutine function: limit it with an AsyncClient")
        if not is_async and not isinstance(client, Client):
            raise TypeError(f"{route} is a function: limit it with a Client (AsyncClient for coroutines)")
        _check_key(key, fn, route)

        def prepare(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[_Request | None, Rules, RequestInfo]:
            request = _find_request(args, kwargs)
            if from_request and request is None:
                raise TypeError(f"{route} has no request to take {key!r} from: give limit() a key of its arguments")
            who = None if from_request else key(*args, **kwargs)
            info = request.info() if request is not None else RequestInfo("CALL", route, {}, None, {})
            rules = Rules(
                key=cast(RequestKey, key) if from_request else (lambda _: who),
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
                denier = adm.enforced_policies[adm.outcome.denied_by - 1].name if adm.outcome.denied_by else None
                raise RateLimited(status, headers, body, None if adm.error else adm.outcome, denier)
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

            setattr(limited_async, MARK, "limited")
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

        setattr(limited, MARK, "limited")
        return cast(F, limited)

    return decorate


__all__ = ["RateLimited", "client_ip", "exempt", "header", "limit", "parse_rate", "parse_rates"]
