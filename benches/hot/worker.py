"""One worker process of benches/hot/run.py for Python: ``--tasks`` asyncio tasks sending requests
through the package's ASGI middleware (``ratelimit_client.asgi.RateLimitMiddleware``, called with
a scope, receive and send as an ASGI server such as uvicorn calls it, without sockets) on one key
until the run ends; its counts as one JSON line. Run with the package's virtualenv
(clients/python/.venv).

With ``--http`` the requests go over HTTP/1.1 on loopback instead: uvicorn (the server of the
package's tests) serving the middleware in the same event loop, and one keep-alive connection per
task writing requests and reading the responses.

Protocol (the same in every language): it prints ``ready`` once its client has detected the mode,
reads the start (Unix ms) from stdin, runs ``--seconds`` from then, closes its client (what the
batches hold goes back) and prints the JSON line. With ``--admissions FILE`` it appends one byte to
FILE per admitted request as it happens.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "clients" / "python" / "src"))

from ratelimit_client import (
    AsyncClient,
    Batching,
    Decision,
    FailClosed,
    FixedWindow,
    MultiOutcome,
    Options,
    TokenBucket,
)
from ratelimit_client.asgi import Policy, RateLimitMiddleware, header
from ratelimit_client.middleware import rate_limit_headers


def algorithm(scenario: str, above_limit: int) -> Any:
    if scenario == "below":
        return TokenBucket(1_000_000_000_000, 1_000_000_000_000.0)
    if scenario == "above":
        return FixedWindow(above_limit, 3600)
    return FixedWindow(1, 1)


def bucket(ns: int) -> int:
    """16 buckets per power of two of nanoseconds (as hot_key.rs)."""
    ns = max(ns, 1)
    exp = ns.bit_length() - 1
    mantissa = (ns >> (exp - 4)) & 15 if exp >= 4 else 0
    return exp * 16 + mantissa


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=6379)
    ap.add_argument("--scenario", default="below")
    ap.add_argument("--variant", default="unbatched")
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--admissions", default="")
    ap.add_argument("--limit", type=int, default=20_000)
    ap.add_argument("--http", action="store_true")
    a = ap.parse_args()

    # Generous: an answer of the policy would not be Redis's.
    client = AsyncClient.from_url(f"redis://127.0.0.1:{a.port}", Options(timeout=2.0, policy=FailClosed()))
    if await client.detect() is None:
        raise SystemExit("hot worker (python): no mode detected")
    if a.variant.startswith("batched"):
        # Detected hot: 100 calls a second from this process, the default.
        client = client.with_batching(Batching())
    # "no limit": the route has no limit, the middleware lets it through untouched (its floor);
    # "headers only" adds the draft fields to that (the floor with what a limit owes).
    route = "other" if a.variant in ("no limit", "headers only") else "*"
    policies = [Policy("hot", algorithm(a.scenario, a.limit))]
    plain = [(b"content-type", b"text/plain"), (b"content-length", b"2")]
    if a.variant == "headers only":
        outcome = MultiOutcome(True, 0, (Decision(True, 999_999_999, 0, 1, 1_000_000_000),), None, None, 1)
        head = plain + [
            (n.encode("latin-1"), v.encode("latin-1")) for n, v in rate_limit_headers(policies, outcome, False)
        ]
    else:
        head = plain

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": head})
        await send({"type": "http.response.body", "body": b"ok"})

    mw = RateLimitMiddleware(
        app,
        client,
        key=header("x-api-key"),
        limits={("*", route): policies},
        deny_cache=a.variant.endswith("deny cache"),
    )
    told = os.open(a.admissions, os.O_WRONLY | os.O_APPEND) if a.admissions else None
    server: Any = None
    listener: socket.socket | None = None
    if a.http:
        import uvicorn

        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        server = uvicorn.Server(uvicorn.Config(mw, log_level="critical", access_log=False, lifespan="off"))
        serving = asyncio.ensure_future(server.serve(sockets=[listener]))
        while not server.started:
            await asyncio.sleep(0.01)

    print("ready", flush=True)
    start_ms = int(await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline))
    await asyncio.sleep(max(0.0, start_ms / 1000 - time.time()))
    cpu0 = time.process_time()
    began = time.monotonic()
    steady, end = began + 1, began + a.seconds
    counts = {"admitted": 0, "admitted_after_1s": 0, "denied": 0, "other": 0, "degraded": 0}
    hist: dict[int, int] = {}

    async def receive() -> Any:
        return {"type": "http.request", "body": b"", "more_body": False}

    def sender(response: dict[str, Any]) -> Any:
        async def send(message: Any) -> None:
            if message["type"] == "http.response.start":
                response["status"] = message["status"]
                response["headers"] = message.get("headers", ())

        return send

    async def over_http() -> None:
        """One task's requests over one keep-alive connection."""
        assert listener is not None
        reader, writer = await asyncio.open_connection(*listener.getsockname())
        request = b"GET / HTTP/1.1\r\nhost: hot\r\nx-api-key: hot\r\n\r\n"
        while time.monotonic() < end:
            t0 = time.perf_counter_ns()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            fields = {n.lower(): v.strip() for n, _, v in (x.partition(":") for x in lines[1:] if x)}
            await reader.readexactly(int(fields.get("content-length", "0")))
            b = bucket(time.perf_counter_ns() - t0)
            done = time.monotonic()
            hist[b] = hist.get(b, 0) + 1
            if "ratelimit-degraded" in fields:
                counts["degraded"] += 1
            status = int(lines[0].split()[1])
            if status == 200:
                counts["admitted"] += 1
                if done > steady:
                    counts["admitted_after_1s"] += 1
                if told is not None:
                    os.write(told, b"a")
            elif status == 429:
                counts["denied"] += 1
            else:
                counts["other"] += 1
        writer.close()

    async def task() -> None:
        while time.monotonic() < end:
            # A server reads each request from its socket: one pass through the event loop per
            # request. Without it, a task whose requests the middleware answers in the process
            # (from a batch or the deny cache) never suspends and holds the loop: the other
            # tasks' calls to Redis wait for it.
            await asyncio.sleep(0)
            scope = {
                "type": "http",
                "asgi": {"version": "3.0"},
                "http_version": "1.1",
                "method": "GET",
                "scheme": "http",
                "path": "/",
                "raw_path": b"/",
                "query_string": b"",
                "root_path": "",
                "headers": [(b"host", b"hot"), (b"x-api-key", b"hot")],
                "client": ("127.0.0.1", 50000),
                "server": ("127.0.0.1", 80),
            }
            response: dict[str, Any] = {}
            send = sender(response)

            t0 = time.perf_counter_ns()
            await mw(scope, receive, send)
            b = bucket(time.perf_counter_ns() - t0)
            done = time.monotonic()
            hist[b] = hist.get(b, 0) + 1
            if any(bytes(n).lower() == b"ratelimit-degraded" for n, _ in response.get("headers", ())):
                counts["degraded"] += 1
            status = response.get("status")
            if status == 200:
                counts["admitted"] += 1
                if done > steady:
                    counts["admitted_after_1s"] += 1
                if told is not None:
                    os.write(told, b"a")
            elif status == 429:
                counts["denied"] += 1
            else:
                counts["other"] += 1

    await asyncio.gather(*((over_http() if a.http else task()) for _ in range(a.tasks)))
    cpu_us = int((time.process_time() - cpu0) * 1e6)
    stats = mw.client.batch_stats()
    returned = await mw.client.aclose()
    if server is not None:
        server.should_exit = True
        await serving
    print(
        json.dumps(
            {
                **counts,
                "held_at_end": stats.held,
                "returned_at_end": returned,
                "lapsed": stats.lapsed + (stats.held - returned),
                "refills": stats.refills,
                "cpu_us": cpu_us,
                "hist": sorted([b, n] for b, n in hist.items()),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    asyncio.run(main())
