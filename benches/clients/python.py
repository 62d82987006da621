"""The Python client's cost per call: the asyncio client's check of one token bucket
(``AsyncClient.check``) next to the bare ``RL.TOKENBUCKET`` sent through the same redis-py client
and pool (``execute_command``), and next to the floor: the bare command bounded by asyncio's own
deadline (``asyncio.timeout``, the cheapest the standard library has: ``wait_for`` costs more), what
a call with a timeout costs at least without the client. One call at a time and with 64
concurrent callers, in blocks of each in turn. One line per measurement:

    client-cost lang=python mode=<sequential|concurrent64> what=<raw|floor|client>
        p50_us=.. p99_us=.. calls_per_s=.. client_cpu_us_per_call=..

Run with the package's venv (``make test-python`` makes it):

    clients/python/.venv/bin/python benches/clients/python.py

``RL_BENCH_URL`` is a server with the module to use; without it the bench starts one
(``RL_REDIS_SERVER``, default ``redis-server``, with ``RL_MODULE``, default the workspace's release
build) on a free port, pinned to the second core while the bench runs on the first, and stops it
at the end. ``RL_BENCH_CALLS`` is the calls per measurement (default 40000), in blocks of
``RL_BENCH_BLOCK`` (1000).
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "clients" / "python" / "src"))

import redis  # noqa: E402

from ratelimit_client import AsyncClient, ModeChoice, Options, TokenBucket  # noqa: E402

CALLERS = 64
# Never empties during a run: every check is admitted.
BUCKET = TokenBucket(1_000_000_000, 1_000_000)
KEY = "bench:python"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start_server() -> tuple[subprocess.Popen[bytes], str]:
    binary = os.environ.get("RL_REDIS_SERVER") or "redis-server"
    module = os.environ.get("RL_MODULE") or str(ROOT / "target" / "release" / "libredis_rate_limiter.so")
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="rl-bench-py-")
    cores = sorted(os.sched_getaffinity(0))
    server_core = {cores[-1]} if len(cores) > 1 else set(cores)

    def pin() -> None:
        os.sched_setaffinity(0, server_core)

    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    args += ["--dir", workdir, "--loadmodule", module]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=pin)
    deadline = time.monotonic() + 10
    while True:
        try:
            if redis.Redis(port=port, socket_timeout=1).ping():
                break
        except redis.RedisError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{binary} did not start")
        time.sleep(0.02)
    if len(cores) > 1:
        os.sched_setaffinity(0, {cores[0]})
    return proc, f"redis://127.0.0.1:{port}"


class Tally:
    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.wall = 0.0
        self.cpu = 0.0

    def line(self, mode: str, what: str) -> str:
        lat = sorted(self.latencies)
        n = len(lat)
        p50 = lat[n // 2] * 1e6
        p99 = lat[min(n - 1, (n * 99) // 100)] * 1e6
        return (
            f"client-cost lang=python mode={mode} what={what} p50_us={p50:.1f} p99_us={p99:.1f} "
            f"calls_per_s={n / self.wall:.0f} client_cpu_us_per_call={self.cpu / n * 1e6:.1f}"
        )


async def block(call: Callable[[], Awaitable[object]], calls: int, callers: int, tally: Tally) -> None:
    left = calls
    lat = tally.latencies
    clock = time.perf_counter

    async def caller() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            t = clock()
            await call()
            lat.append(clock() - t)

    wall, cpu = clock(), time.process_time()
    await asyncio.gather(*(caller() for _ in range(callers)))
    tally.wall += clock() - wall
    tally.cpu += time.process_time() - cpu


async def run(url: str, calls: int, size: int) -> None:
    # A deadline no run on a loaded machine reaches: the bench measures the decided path.
    client = AsyncClient.from_url(url, Options(mode=ModeChoice.MODULE, timeout=1.0))
    raw_args = ("RL.TOKENBUCKET", KEY, *BUCKET.params(), "1")

    async def check() -> object:
        o = await client.check(KEY, BUCKET)
        if o.degraded is not None or not o.decision.allowed:
            raise SystemExit(f"the client's check was not admitted by Redis: {o}")
        return o

    async def raw() -> object:
        return await client.redis.execute_command(*raw_args)

    async def floor() -> object:
        async with asyncio.timeout(1.0):
            return await client.redis.execute_command(*raw_args)

    calls_of = {"raw": raw, "floor": floor, "client": check}
    # Warm: the connections opened, the code paths run.
    for callers in (1, CALLERS):
        for call in calls_of.values():
            await block(call, 2000, callers, Tally())
    for mode, callers in (("sequential", 1), ("concurrent64", CALLERS)):
        tallies = {what: Tally() for what in calls_of}
        done = 0
        while done < calls:
            n = min(size, calls - done)
            for what, call in calls_of.items():
                await block(call, n, callers, tallies[what])
            done += n
        for what, tally in tallies.items():
            print(tally.line(mode, what), flush=True)
    await client.aclose()


def main() -> None:
    calls = int(os.environ.get("RL_BENCH_CALLS") or "40000")
    size = int(os.environ.get("RL_BENCH_BLOCK") or "1000")
    url = os.environ.get("RL_BENCH_URL")
    proc = None
    if not url:
        proc, url = start_server()
    try:
        asyncio.run(run(url, calls, size))
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    main()
