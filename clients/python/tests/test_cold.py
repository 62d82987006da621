# mypy: disallow-untyped-calls=False
"""A cold start under a burst: a fresh client with the default options, made as the docs show
(``Client.from_url``, ``AsyncClient.from_url``, the ASGI and WSGI middleware given one), takes 200
concurrent first calls on one key of capacity 50 while a CPU burner keeps every core busy, in the
three modes (the module; the Functions library on a server without the module; the scripts,
flushed first, on a server without the module). Exactly 50 are admitted, none is answered by the
failure policy, and the server saw at most one ``COMMAND INFO``, one ``FUNCTION LIST`` and one
``SCRIPT LOAD`` of the script, and no ``EVAL`` or ``FUNCTION LOAD``.

``RL_COLD_ROUNDS`` rounds of each (default 2; ``make cold-python`` runs 20). ``RL_COLD_REPORT``
names a file that gets one line per round: what was admitted and degraded, the commands the
server counted, and the time to the first decision and to the last."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from apps import AsgiServer, WerkzeugServer, asgi_app, wsgi_app
from ratelimit_client import AsyncClient, Client, Mode, TokenBucket, load_library
from ratelimit_client.middleware import Policy
from servers import Server

pytestmark = pytest.mark.heavy

ROUNDS = int(os.environ.get("RL_COLD_ROUNDS") or "2")
CALLERS = 200
CAPACITY = 50
# Nothing refills during a round.
BUCKET = TokenBucket(CAPACITY, 1e-6)
KEY = "cold"
MODES = {"module": Mode.MODULE, "function": Mode.FUNCTION, "script": Mode.SCRIPT}
# The start-up commands a client may send, and what the calls themselves are sent as.
COUNTED = ("command|info", "function|list", "script|load", "function|load", "eval", "evalsha", "fcall")


@contextlib.contextmanager
def burner() -> Iterator[None]:
    """Keeps every core busy: one spinning process per core, killed at the end."""
    spinners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL)
        for _ in range(os.cpu_count() or 2)
    ]
    try:
        time.sleep(0.2)  # running before the burst
        yield
    finally:
        for p in spinners:
            p.kill()
        for p in spinners:
            p.wait()


class Servers:
    """The module on one server; the library on a server without the module; the scripts on
    another without either: each started when a test first needs it."""

    def __init__(self) -> None:
        self.started: dict[str, Server] = {}

    def __getitem__(self, mode: str) -> Server:
        if mode not in self.started:
            s = Server(module=mode == "module")
            if mode == "function":
                load_library(s.connect())
            self.started[mode] = s
        return self.started[mode]


@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    started = Servers()
    try:
        yield started
    finally:
        for s in started.started.values():
            s.stop()


def prepare(s: Server, mode: str) -> None:
    """A fresh key, the script cache empty in script mode, the counters at zero."""
    r = s.connect()
    r.flushall()
    if mode == "script":
        r.execute_command("SCRIPT", "FLUSH")
    r.execute_command("CONFIG", "RESETSTAT")


def counted(s: Server) -> dict[str, int]:
    info = s.connect().execute_command("INFO", "commandstats")
    stats = {k[len("cmdstat_") :]: v["calls"] for k, v in info.items()}
    return {name: stats.get(name, 0) for name in COUNTED}


@dataclass
class Round:
    """What one round saw: per call whether admitted, by whom (None: Redis), in which mode."""

    answers: list[tuple[bool, str | None, Mode | None]] = field(default_factory=list)
    first: float = 0.0
    last: float = 0.0

    @property
    def admitted(self) -> int:
        return sum(1 for a, _, _ in self.answers if a)

    @property
    def degraded(self) -> int:
        return sum(1 for _, d, _ in self.answers if d is not None)


def report(kind: str, mode: str, n: int, r: Round, stats: dict[str, int]) -> str:
    line = (
        f"cold {kind} mode={mode} round={n} admitted={r.admitted} degraded={r.degraded} "
        + " ".join(f"{k.replace('|', '_')}={v}" for k, v in stats.items())
        + f" first_ms={r.first * 1000:.1f} last_ms={r.last * 1000:.1f}"
    )
    path = os.environ.get("RL_COLD_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")
    return line


def check(kind: str, mode: str, s: Server, burst: Callable[[], Round]) -> None:
    failures = []
    for n in range(1, ROUNDS + 1):
        prepare(s, mode)
        with burner():
            r = burst()
        stats = counted(s)
        line = report(kind, mode, n, r, stats)
        want_modes = {MODES[mode]} if kind in ("threads", "tasks") else {None}
        ok = (
            (len(r.answers), r.admitted, r.degraded) == (CALLERS, CAPACITY, 0)
            and {m for _, _, m in r.answers} == want_modes
            and stats["command|info"] <= 1
            and stats["function|list"] <= 1
            and stats["script|load"] == (1 if mode == "script" else 0)
            and (stats["function|load"], stats["eval"]) == (0, 0)
        )
        if not ok:
            failures.append(line)
    assert not failures, "\n".join(failures)


def timed(answers: list[tuple[float, tuple[bool, str | None, Mode | None]]], start: float) -> Round:
    times = sorted(t for t, _ in answers)
    return Round([a for _, a in answers], times[0] - start, times[-1] - start)


# The clients ----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_200_threads_on_a_cold_client(servers: Servers, mode: str) -> None:
    s = servers[mode]

    def burst() -> Round:
        c = Client.from_url(s.url)
        go = threading.Barrier(CALLERS + 1)
        got: list[tuple[float, tuple[bool, str | None, Mode | None]]] = []
        lock = threading.Lock()

        def caller() -> None:
            go.wait()
            o = c.check(KEY, BUCKET)
            answer = (o.decision.allowed, o.degraded.value if o.degraded else None, o.mode)
            with lock:
                got.append((time.monotonic(), answer))

        threads = [threading.Thread(target=caller) for _ in range(CALLERS)]
        for t in threads:
            t.start()
        go.wait()
        start = time.monotonic()
        for t in threads:
            t.join()
        c.close()
        return timed(got, start)

    check("threads", mode, s, burst)


@pytest.mark.parametrize("mode", MODES)
def test_200_tasks_on_a_cold_client(servers: Servers, mode: str) -> None:
    s = servers[mode]

    async def race() -> Round:
        c = AsyncClient.from_url(s.url)
        go = asyncio.Event()

        async def caller() -> tuple[float, tuple[bool, str | None, Mode | None]]:
            await go.wait()
            o = await c.check(KEY, BUCKET)
            return time.monotonic(), (o.decision.allowed, o.degraded.value if o.degraded else None, o.mode)

        tasks = [asyncio.create_task(caller()) for _ in range(CALLERS)]
        await asyncio.sleep(0)
        start = time.monotonic()
        go.set()
        got = await asyncio.gather(*tasks)
        await c.aclose()
        return timed(list(got), start)

    check("tasks", mode, s, lambda: asyncio.run(race()))


# The middleware, over HTTP --------------------------------------------------------------------

LIMITS = {("*", "*"): [Policy("cold", BUCKET)]}


async def http_burst(port: int) -> Round:
    """200 requests at once, each on a connection of its own opened beforehand: admitted when
    200, degraded when the response says so."""
    conns = await asyncio.gather(*(asyncio.open_connection("127.0.0.1", port) for _ in range(CALLERS)))
    request = b"GET /cold HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n"

    async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> tuple[float, Any]:
        writer.write(request)
        raw = await reader.read()
        writer.close()
        head = raw.split(b"\r\n\r\n", 1)[0].decode("latin-1").lower().split("\r\n")
        status = int(head[0].split(" ")[1])
        fields = dict(line.split(": ", 1) for line in head[1:] if ": " in line)
        return time.monotonic(), (status == 200, fields.get("ratelimit-degraded"), None)

    start = time.monotonic()
    got = await asyncio.gather(*(one(r, w) for r, w in conns))
    return timed(list(got), start)


@pytest.mark.parametrize("mode", MODES)
def test_200_requests_through_the_asgi_middleware_on_a_cold_client(servers: Servers, mode: str) -> None:
    s = servers[mode]
    web = AsgiServer()
    try:

        def burst() -> Round:
            client = AsyncClient.from_url(s.url)
            web.dispatch.current = asgi_app("starlette", client, {"limits": LIMITS})
            r = asyncio.run(http_burst(web.port))
            web.run(client.aclose())
            return r

        check("asgi", mode, s, burst)
    finally:
        web.stop()


@pytest.mark.parametrize("mode", MODES)
def test_200_requests_through_the_wsgi_middleware_on_a_cold_client(servers: Servers, mode: str) -> None:
    s = servers[mode]
    web = WerkzeugServer()
    try:

        def burst() -> Round:
            client = Client.from_url(s.url)
            web.dispatch.current = wsgi_app("flask", client, {"limits": LIMITS})
            r = asyncio.run(http_burst(web.port))
            client.close()
            return r

        check("wsgi", mode, s, burst)
    finally:
        web.stop()
