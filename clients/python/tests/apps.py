# mypy: disallow-untyped-calls=False
"""The handler of the conformance table in each framework (Starlette, FastAPI, Flask, Django),
behind the package's middleware, and the real servers that serve them over TCP (uvicorn for the
ASGI applications, werkzeug's threaded server for Flask, waitress for Django).

The handler answers ``200``, ``content-type: text/plain; charset=utf-8``, body ``ok``; it reports
the actual cost of ``x-used``, waits on the gate named by ``x-hold`` until the test lets it go,
and ``/stream`` never ends (a line every 20 ms until the client goes away). An outer layer copies
the middleware's shadow denials into ``x-test-shadow-denials``, as a logging layer would read
them.
"""

import asyncio
import http.client
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from ratelimit_client import AsyncClient, Client
from ratelimit_client.asgi import RateLimitMiddleware as AsgiMiddleware
from ratelimit_client.middleware import report_cost
from ratelimit_client.wsgi import RateLimitMiddleware as WsgiMiddleware

ASGI_FLAVORS = ("starlette", "fastapi")
WSGI_FLAVORS = ("flask", "django")


class Gates:
    """Requests held in their handler: each sets ``entered`` and waits for ``release``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._gates: dict[str, tuple[threading.Event, threading.Event]] = {}

    def get(self, name: str) -> tuple[threading.Event, threading.Event]:
        with self._lock:
            return self._gates.setdefault(name, (threading.Event(), threading.Event()))

    def release_all(self) -> None:
        with self._lock:
            for _, release in self._gates.values():
                release.set()


# The gates of the run in progress (one run at a time).
CURRENT = {"gates": Gates()}


def _cost(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None


# ASGI --------------------------------------------------------------------------------------


async def _hold_async(name: str | None) -> None:
    if name:
        entered, release = CURRENT["gates"].get(name)
        entered.set()
        while not release.is_set():
            await asyncio.sleep(0.002)


def starlette_app() -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse, Response, StreamingResponse
    from starlette.routing import Route

    async def handler(request: Request) -> Response:
        await _hold_async(request.headers.get("x-hold"))
        used = _cost(request.headers.get("x-used"))
        if used is not None:
            report_cost(request, used)
        if request.url.path == "/stream":
            return StreamingResponse(_ticks_async(), media_type="text/plain")
        return PlainTextResponse("ok")

    return Starlette(routes=[Route("/{path:path}", handler)])


def fastapi_app() -> Any:
    from fastapi import FastAPI, Request
    from fastapi.responses import PlainTextResponse, Response, StreamingResponse

    app = FastAPI()

    @app.get("/{path:path}")
    async def handler(request: Request, path: str) -> Response:
        await _hold_async(request.headers.get("x-hold"))
        used = _cost(request.headers.get("x-used"))
        if used is not None:
            report_cost(request, used)
        if path == "stream":
            return StreamingResponse(_ticks_async(), media_type="text/plain")
        return PlainTextResponse("ok")

    return app


async def _ticks_async() -> Any:
    while True:
        yield "tick\n"
        await asyncio.sleep(0.02)


def expose_shadow_asgi(app: Any) -> Any:
    async def outer(scope: Any, receive: Any, send: Any) -> None:
        async def send_and_expose(message: Any) -> None:
            state = scope.get("ratelimit")
            if message["type"] == "http.response.start" and state is not None and state.shadow_denials:
                value = ",".join(state.shadow_denials).encode()
                message = {**message, "headers": [*message.get("headers", []), (b"x-test-shadow-denials", value)]}
            await send(message)

        await app(scope, receive, send_and_expose)

    return outer


def asgi_app(flavor: str, client: AsyncClient, options: dict[str, Any]) -> Any:
    """The flavor's application behind the middleware (``options`` are the middleware's)."""
    if flavor == "starlette":
        from starlette.middleware import Middleware

        app = starlette_app()
        app.user_middleware.insert(0, Middleware(AsgiMiddleware, client=client, **options))
    else:
        app = fastapi_app()
        app.add_middleware(AsgiMiddleware, client=client, **options)
    return expose_shadow_asgi(app)


# WSGI --------------------------------------------------------------------------------------


def _hold_sync(name: str | None) -> None:
    if name:
        entered, release = CURRENT["gates"].get(name)
        entered.set()
        release.wait(30)


def _ticks() -> Iterator[bytes]:
    while True:
        yield b"tick\n"
        time.sleep(0.02)


def flask_app() -> Any:
    from flask import Flask, Response, request

    app = Flask("conformance")

    @app.route("/", defaults={"path": ""})
    @app.route("/<path:path>")
    def handler(path: str) -> Response:
        _hold_sync(request.headers.get("x-hold"))
        used = _cost(request.headers.get("x-used"))
        if used is not None:
            report_cost(request, used)
        if path == "stream":
            return Response(_ticks(), content_type="text/plain; charset=utf-8")
        return Response("ok", content_type="text/plain; charset=utf-8")

    return app


_DJANGO_READY = False


def django_app() -> Any:
    global _DJANGO_READY
    if not _DJANGO_READY:
        import django
        from django.conf import settings

        settings.configure(
            DEBUG=False,
            ALLOWED_HOSTS=["*"],
            ROOT_URLCONF=__name__,
            MIDDLEWARE=[],
            INSTALLED_APPS=[],
            SECRET_KEY="tests",
            USE_TZ=True,
            LOGGING_CONFIG=None,
        )
        django.setup()
        _DJANGO_READY = True
    from django.core.wsgi import get_wsgi_application

    return get_wsgi_application()


#: The Django view that the URL configuration serves (a test may put its own).
DJANGO_VIEW: dict[str, Callable[..., Any]] = {}


def _django_view(request: Any, path: str = "") -> Any:
    view = DJANGO_VIEW.get("current", _table_view)
    return view(request, path)


def _table_view(request: Any, path: str = "") -> Any:
    from django.http import HttpResponse, StreamingHttpResponse

    _hold_sync(request.headers.get("x-hold"))
    used = _cost(request.headers.get("x-used"))
    if used is not None:
        report_cost(request, used)
    if path == "stream":
        return StreamingHttpResponse(_ticks(), content_type="text/plain; charset=utf-8")
    return HttpResponse("ok", content_type="text/plain; charset=utf-8")


def _urlpatterns() -> list[Any]:
    from django.urls import re_path

    return [re_path(r"^(?P<path>.*)$", _django_view)]


def __getattr__(name: str) -> Any:
    # Django reads ROOT_URLCONF's urlpatterns lazily, once settings are configured.
    if name == "urlpatterns":
        return _urlpatterns()
    raise AttributeError(name)


def expose_shadow_wsgi(app: Callable[..., Any]) -> Callable[..., Any]:
    def outer(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            state = environ.get("ratelimit")
            if state is not None and state.shadow_denials:
                headers = [*headers, ("x-test-shadow-denials", ",".join(state.shadow_denials))]
            return start_response(status, headers, exc_info) if exc_info else start_response(status, headers)

        return app(environ, start)

    return outer


def wsgi_app(flavor: str, client: Client, options: dict[str, Any]) -> Any:
    if flavor == "flask":
        app = flask_app()
        WsgiMiddleware(client=client, **options).init_app(app)
        return expose_shadow_wsgi(app)
    return expose_shadow_wsgi(WsgiMiddleware(django_app(), client=client, **options))


# The client ----------------------------------------------------------------------------------

#: The response fields a reply shows, when present.
FIELDS = (
    "ratelimit-policy",
    "ratelimit",
    "ratelimit-partition",
    "ratelimit-limit",
    "ratelimit-remaining",
    "ratelimit-reset",
    "ratelimit-degraded",
    "retry-after",
    "content-type",
)


def send_request(port: int, r: dict[str, Any]) -> dict[str, Any]:
    """One request of the table over TCP from its peer address; a stream is read up to its first
    line, then the client goes away."""
    peer = r.get("peer", "127.0.0.1")
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10, source_address=(peer, 0))
    headers = dict(r.get("headers", {}))
    if "used" in r:
        headers["x-used"] = str(r["used"])
    if "hold" in r:
        headers["x-hold"] = r["hold"]
    conn.request("GET", r.get("path", "/"), headers=headers)
    resp = conn.getresponse()
    got: dict[str, list[str]] = {}
    for name, value in resp.getheaders():
        got.setdefault(name.lower(), []).append(value)
    obs: dict[str, Any] = {
        "status": resp.status,
        # A field sent twice shows as both values, and so mismatches.
        "headers": {n: "\n".join(got[n]) for n in FIELDS if n in got},
    }
    if r.get("stream"):
        line = resp.readline()
        assert line, "the stream sent nothing"
        conn.sock.close() if conn.sock else None
        resp.close()
        conn.close()
    else:
        obs["body"] = resp.read().decode("utf-8")
        conn.close()
    if "x-test-shadow-denials" in got:
        obs["shadow_denials"] = got["x-test-shadow-denials"][0].split(",")
    return obs


# Servers -----------------------------------------------------------------------------------


class Dispatch:
    """The application a server runs: whichever the run in progress set."""

    def __init__(self) -> None:
        self.current: Any = None


class AsgiServer:
    """uvicorn on a loopback port, in a thread with its own event loop."""

    def __init__(self, lifespan: bool = False, app: Any = None) -> None:
        import socket

        import uvicorn

        self.dispatch = Dispatch()
        self.dispatch.current = app

        async def dispatch(scope: Any, receive: Any, send: Any) -> None:
            await self.dispatch.current(scope, receive, send)

        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(dispatch, log_level="critical", lifespan="on" if lifespan else "off", access_log=False)
        self.server = uvicorn.Server(config)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=lambda: self.loop.run_until_complete(self.server.serve(sockets=[sock])), daemon=True
        )
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)

    def run(self, coro: Any) -> Any:
        """Runs a coroutine on the server's loop (closing a client opened there)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.loop.close()


class WerkzeugServer:
    """werkzeug's threaded WSGI server (Flask's) on a loopback port."""

    def __init__(self) -> None:
        import logging

        from werkzeug.serving import make_server

        logging.getLogger("werkzeug").setLevel(logging.CRITICAL)
        self.dispatch = Dispatch()
        self.server = make_server("127.0.0.1", 0, lambda e, s: self.dispatch.current(e, s), threaded=True)
        self.port = self.server.server_port
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.thread.join(10)


class WaitressServer:
    """waitress on a loopback port, with enough threads for the held requests."""

    def __init__(self) -> None:
        import logging

        from waitress.server import create_server

        logging.getLogger("waitress").setLevel(logging.CRITICAL)
        self.dispatch = Dispatch()
        self.server = create_server(
            lambda e, s: self.dispatch.current(e, s),
            host="127.0.0.1",
            port=0,
            threads=8,
            channel_timeout=30,
            # waitress drops X-Forwarded-* from peers it does not trust itself; the middleware
            # decides which proxies it trusts.
            clear_untrusted_proxy_headers=False,
        )
        self.port = self.server.effective_port
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.close()
        self.server.task_dispatcher.shutdown()
