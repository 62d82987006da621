"""WSGI middleware (Flask, Django, any WSGI application) on the synchronous client.

    application = RateLimitMiddleware(
        get_wsgi_application(),
        client=Client.from_url("redis://127.0.0.1:6379"),
        key=header("x-api-key"),
        limits={("*", "*"): [Policy("per-minute", FixedWindow(60, 60))]},
    )

A concurrency limit's slot is taken before the application runs and given back when the server
closes the response (its body sent to the end, or the client gone). A route with an estimate
reserves it; the application reports the actual cost with :func:`report_cost` before it calls
``start_response``, and the difference is settled before the response fields are written.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from http import HTTPStatus
from typing import Any

from ._http import (
    FIELDS,
    STATE_KEY,
    Admission,
    Headers,
    Policy,
    RateLimitState,
    RequestInfo,
    admit,
    client_ip,
    finish,
    header,
    keep_alive,
    release_sync,
    report_cost,
    rules,
    run_sync,
)
from .client import Client
from .metrics import Metrics

Environ = dict[str, Any]
StartResponse = Callable[..., Callable[[bytes], object]]
WSGIApp = Callable[[Environ, StartResponse], Iterable[bytes]]

__all__ = ["RateLimitMiddleware", "Policy", "RateLimitState", "RequestInfo", "client_ip", "header", "report_cost"]


def status_line(status: int) -> str:
    return f"{status} {HTTPStatus(status).phrase}"


class _Released:
    """The application's response body; closing it (what a server does once the body was sent,
    or the client went away) gives the request's slots back."""

    def __init__(self, body: Iterable[bytes], adm: Admission) -> None:
        self._body = body
        self._adm = adm
        self._once = threading.Lock()

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._body)

    def close(self) -> None:
        try:
            close = getattr(self._body, "close", None)
            if close is not None:
                close()
        finally:
            if self._once.acquire(blocking=False):
                release_sync(self._adm)


class RateLimitMiddleware:
    """Rate limits HTTP requests in front of a WSGI application; the options are those of
    :class:`ratelimit_client.asgi.RateLimitMiddleware`."""

    def __init__(self, app: WSGIApp, client: Client, *, metrics: Metrics | None = None, **options: Any) -> None:
        self.app = app
        self.client = client
        self.rules = rules(**options)
        self.metrics = metrics if metrics is not None else Metrics()

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        state = RateLimitState()
        environ[STATE_KEY] = state
        adm: Admission | None = run_sync(self.client, admit(self.rules, self.metrics, RequestInfo.from_environ(environ)))
        if adm is None:
            return self.app(environ, start_response)
        state.outcome = adm.outcome
        state.shadow_denials = list(adm.denials)
        legacy = self.rules.legacy_headers
        if not adm.allowed:
            status, headers, body = adm.refusal(legacy)
            start_response(status_line(status), headers + [("content-length", str(len(body)))])
            return [body]
        keep_alive(adm, self.rules.lease_keep_alive)
        fields: list[Headers] = []

        def start_with_fields(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], object]:
            if not fields:
                fields.append(run_sync(self.client, finish(adm, self.metrics, state.actual_cost, legacy)))
            kept = [(n, v) for n, v in headers if n.lower() not in FIELDS]
            if exc_info is not None:
                return start_response(status, kept + fields[0], exc_info)
            return start_response(status, kept + fields[0])

        try:
            response = self.app(environ, start_with_fields)
        except BaseException:
            release_sync(adm)
            raise
        return _Released(response, adm)
