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
from collections.abc import Callable, Iterable, Iterator, Mapping
from http import HTTPStatus
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
    flask_view,
    header,
    keep_alive,
    make_rules,
    mark_of,
    release_sync,
    report_cost,
    run_sync,
)
from .client import Client
from .metrics import Metrics, breaker_text

Environ = dict[str, Any]
StartResponse = Callable[..., Callable[[bytes], object]]
WSGIApp = Callable[[Environ, StartResponse], Iterable[bytes]]

__all__ = ["Policy", "RateLimitMiddleware", "RateLimitState", "RequestInfo", "client_ip", "header", "report_cost"]


def status_line(status: int) -> str:
    return f"{status} {HTTPStatus(status).phrase}"


def _always() -> bool:
    return True


class _Released:
    """The application's response body, which gives the request's slots back when it ends: a body
    that is not a stream (a ``Content-Length``, a list, or Django's non-streaming response) just
    before its last chunk, so that a client that has read the whole response finds the slot
    free; a stream once it is exhausted; and any at the latest when the server closes it (the
    body sent, or the client gone)."""

    def __init__(self, body: Iterable[bytes], adm: Admission, sized: Callable[[], bool]) -> None:
        self._body = body
        self._adm = adm
        whole = isinstance(body, (list, tuple)) or getattr(body, "streaming", None) is False
        self._sized: Callable[[], bool] = _always if whole else sized
        self._once = threading.Lock()

    def _release(self) -> None:
        if self._once.acquire(blocking=False):
            release_sync(self._adm)

    def __iter__(self) -> Iterator[bytes]:
        chunks = iter(self._body)
        if not self._adm.leases:
            yield from chunks
            return
        for chunk in chunks:
            if not self._sized():
                # A stream: its chunks go out as they come; the slot comes back at its end.
                yield chunk
                yield from chunks
                break
            # One chunk ahead, to know which is the last.
            for following in chunks:
                yield chunk
                chunk = following
            self._release()
            yield chunk
            return
        self._release()

    def close(self) -> None:
        try:
            close = getattr(self._body, "close", None)
            if close is not None:
                close()
        finally:
            self._release()


class RateLimitMiddleware:
    """Rate limits HTTP requests in front of a WSGI application; the options are those of
    :class:`ratelimit_client.asgi.RateLimitMiddleware`.

    ``RateLimitMiddleware(app, client=...)`` wraps a WSGI application (Django's
    ``get_wsgi_application()``); ``RateLimitMiddleware(client=...)`` then :meth:`init_app`
    installs itself in a Flask application, as Flask extensions do."""

    def __init__(
        self,
        app: WSGIApp | None = None,
        *,
        client: Client,
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
        #: The Flask application of init_app, where a request's view is found (exempt, @limit).
        self._flask: Any = None

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

    def init_app(self, app: Any) -> None:
        """Installs the middleware in front of a Flask application's ``wsgi_app`` (and as its
        extension ``"ratelimit"``)."""
        if self.app is not None:
            raise RuntimeError("this middleware already wraps an application")
        if not callable(getattr(app, "wsgi_app", None)):
            raise TypeError(f"init_app takes a Flask application (with a wsgi_app), not {app!r}")
        self.app = app.wsgi_app
        self._flask = app
        app.wsgi_app = self
        extensions = getattr(app, "extensions", None)
        if isinstance(extensions, dict):
            extensions["ratelimit"] = self

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        app = self.app
        if app is None:
            raise RuntimeError("the middleware wraps no application: give it one, or call init_app(app)")
        state = RateLimitState()
        environ[STATE_KEY] = state
        mark = mark_of(flask_view(self._flask, environ)) if self._flask is not None else None
        adm: Admission | None = run_sync(
            self.client, admit(self.rules, self.metrics, RequestInfo.from_environ(environ), mark)
        )
        if adm is None:
            return app(environ, start_response)
        state.outcome = adm.outcome
        state.shadow_denials = list(adm.denials)
        legacy = self.rules.legacy_headers
        if not adm.allowed:
            status, headers, body = adm.refusal(legacy)
            start_response(status_line(status), [*headers, ("content-length", str(len(body)))])
            return [body]
        keep_alive(adm, self.rules.lease_keep_alive)
        fields: list[Headers] = []
        sized: list[bool] = []

        def start_with_fields(
            status: str, headers: list[tuple[str, str]], exc_info: Any = None
        ) -> Callable[[bytes], object]:
            if not fields:
                fields.append(run_sync(self.client, finish(adm, self.metrics, state.actual_cost, legacy)))
            sized[:] = [any(n.lower() == "content-length" for n, _ in headers)]
            kept = [(n, v) for n, v in headers if n.lower() not in FIELDS]
            if exc_info is not None:
                return start_response(status, kept + fields[0], exc_info)
            return start_response(status, kept + fields[0])

        try:
            response = app(environ, start_with_fields)
        except BaseException:
            release_sync(adm)
            raise
        return _Released(response, adm, lambda: bool(sized and sized[0]))
