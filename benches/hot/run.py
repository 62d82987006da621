"""`make bench-hot` for Go, Python and Node.js: one hot key through each client's HTTP middleware,
the rows of clients/rust/examples/hot_key.rs for the other three languages, and a run with one
worker process killed (SIGKILL) while the others carry on.

    run.py --server <redis-server> --module <libredis_rate_limiter.so>
           --worker go=<command> --worker python=<command> --worker node=<command>
           [--seconds 2] [--rounds 1] [--rust-output <hot_key's output>]

It starts one redis-server with the module (no test clock). For each run it starts the worker
processes of one language (benches/hot/worker.go, worker.py, worker.mjs: the language's client
and middleware, requests made in the process and handed to the middleware as the HTTP server
would, without sockets), waits until each says it is ready, gives them one moment to start,
and reads their counts (one JSON line each) once they have closed their clients. Server calls
are INFO commandstats calls of RL.* in the run, so they are Redis's count, not the clients'.

With --http (make bench-hot HOT_HTTP=1) the requests go over HTTP/1.1 on loopback instead: each
worker serves its middleware (net/http's server, uvicorn, node:http's server) and sends the
requests to it from the same process over keep-alive connections, one per task.

Every language runs the same scenarios and offered loads as hot_key.rs (a token bucket far above
the load; a fixed window of 20,000 an hour; a fixed window of 1 a second used up before the run),
with fewer variants and shapes (1 process of 64 tasks below the limit, 4 processes of 16
everywhere) so that the three stay within a few minutes. Then "kill": 4 processes of 16 on the
fixed window of 20,000 an hour, batched with the deny cache (the middleware's default), one
worker killed with SIGKILL once Redis has counted a quarter of the limit. Every worker appends one
byte to a file per admitted request as it happens (a file's bytes survive the process), so the
dead one has told what it admitted up to the kill (a request admitted and not yet written when
the kill came is missing from it: at most its 16 tasks). Redis's count once the survivors closed
their clients, less what they admitted and lost, is what the dead one took: its admissions and
what its batch held. Admitted in all is what the survivors admitted plus what the dead one told;
over-admission is that above the limit (goal 0), and the dead one's told admissions above what
Redis says it took would be admissions Redis never granted.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

KEY = "rl:{hot}:default:hot"
ABOVE_LIMIT = 20_000
MAX_BATCH = 1024


class Redis:
    """A redis-server of its own on a free loopback port, and RESP over one socket."""

    def __init__(self, server: str, module: str) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.dir = tempfile.mkdtemp(prefix="hot-key-bench-")
        self.proc = subprocess.Popen(
            [
                server,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self.dir,
                "--loadmodule",
                os.path.abspath(module),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                self.sock = socket.create_connection(("127.0.0.1", self.port))
                self.buf = b""
                if self.cmd("PING") == "PONG":
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("redis-server did not start")
            time.sleep(0.02)

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _line(self) -> bytes:
        while b"\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("redis closed the connection")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _reply(self) -> Any:
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RuntimeError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            while len(self.buf) < n + 2:
                self.buf += self.sock.recv(65536)
            data, self.buf = self.buf[:n], self.buf[n + 2 :]
            return data.decode()
        if kind == b"*":
            return [self._reply() for _ in range(int(rest))]
        raise RuntimeError(f"unexpected reply {line!r}")

    def cmd(self, *args: object) -> Any:
        out = b"*%d\r\n" % len(args)
        for a in args:
            b = str(a).encode()
            out += b"$%d\r\n%s\r\n" % (len(b), b)
        self.sock.sendall(out)
        return self._reply()

    def info(self, section: str) -> str:
        return str(self.cmd("INFO", section))

    def calls(self) -> int:
        """Calls of the limiter commands (grants, checks, returns) since CONFIG RESETSTAT."""
        total = 0
        for line in self.info("commandstats").splitlines():
            if line.startswith("cmdstat_rl."):
                total += int(line.split("calls=")[1].split(",")[0])
        return total

    def cpu_us(self) -> float:
        secs = 0.0
        for line in self.info("cpu").splitlines():
            if line.startswith(("used_cpu_sys:", "used_cpu_user:")):
                secs += float(line.split(":")[1])
        return secs * 1e6

    def window_left(self, limit: int) -> int:
        """What the hot key's fixed window of ``limit`` an hour has left (a check of cost 0
        peeks)."""
        return int(self.cmd("RL.FIXEDWINDOW", KEY, limit, 3600, 0)[1])


def bucket_top(b: int) -> float:
    exp, mantissa = divmod(b, 16)
    return float(1 << exp) * (1.0 + (mantissa + 1.0) / 16.0)


def percentile(hist: dict[int, int], p: float) -> float:
    total = sum(hist.values())
    want = -(-total * p // 1)
    seen = 0
    for b in sorted(hist):
        seen += hist[b]
        if seen >= want:
            return bucket_top(b)
    return 0.0


@dataclass
class Row:
    lang: str
    scenario: str
    processes: int
    tasks: int
    variant: str
    requests: int = 0
    rps: float = 0.0
    admitted: int = 0
    exact: int | None = None
    counted: int | None = None
    held_at_end: int = 0
    lapsed: int = 0
    calls: int = 0
    steady_calls: int = 0
    steady_admitted: int = 0
    denied: int = 0
    degraded: int = 0
    p50_us: float = 0.0
    p99_us: float = 0.0
    cpu_us: float = 0.0
    kill: dict[str, int] = field(default_factory=dict)


class Bench:
    def __init__(
        self, r: Redis, workers: dict[str, list[str]], seconds: float, limits: dict[str, int], http: bool = False
    ) -> None:
        self.r, self.workers, self.seconds, self.limits, self.http = r, workers, seconds, limits, http

    def run(self, lang: str, scenario: str, variant: str, processes: int, tasks: int) -> Row:
        """One run; its workers killed if it fails (none outlives it)."""
        procs: list[subprocess.Popen[str]] = []
        files: list[str] = []
        try:
            return self._run(procs, files, lang, scenario, variant, processes, tasks)
        except BaseException:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            for path in files:
                if os.path.exists(path):
                    os.unlink(path)
            raise

    def _run(
        self,
        procs: list[subprocess.Popen[str]],
        files: list[str],
        lang: str,
        scenario: str,
        variant: str,
        processes: int,
        tasks: int,
    ) -> Row:
        r = self.r
        r.cmd("FLUSHALL")
        kill = scenario == "kill"
        limit = self.limits.get(lang, ABOVE_LIMIT)
        for _ in range(processes):
            argv = self.workers[lang] + [
                "--port",
                str(r.port),
                "--scenario",
                "above" if kill else scenario,
                "--variant",
                variant,
                "--tasks",
                str(tasks),
                "--seconds",
                str(self.seconds),
                "--limit",
                str(limit),
            ]
            if self.http:
                argv.append("--http")
            if kill:
                fd, path = tempfile.mkstemp(prefix="hot-admissions-")
                os.close(fd)
                files.append(path)
                argv += ["--admissions", path]
            procs.append(subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
        for p in procs:
            line = p.stdout.readline() if p.stdout else ""
            if line.strip() != "ready":
                raise SystemExit(f"{lang} worker: {line!r} instead of ready")
        if scenario == "flood":
            # The key used up as the run starts: every request is denied until its window ends.
            r.cmd("RL.FIXEDWINDOW", KEY, 1, 1, 1)
        # Counted from here: the workers' start-up (the mode's detection) calls no RL.* command.
        r.cmd("CONFIG", "RESETSTAT")
        server_cpu_before = r.cpu_us()
        start_ms = int(time.time() * 1000) + 300
        for p in procs:
            assert p.stdin
            p.stdin.write(f"{start_ms}\n")
            p.stdin.flush()
        killed_at = -1
        if kill:
            # One worker killed once Redis has counted a quarter of the limit (or half-way
            # through the run if it never does).
            deadline = start_ms / 1000 + self.seconds / 2
            while time.time() < deadline and limit - r.window_left(limit) < limit // 4:
                time.sleep(0.001)
            procs[0].send_signal(signal.SIGKILL)
            killed_at = limit - r.window_left(limit)
        else:
            time.sleep(max(0.0, start_ms / 1000 + 1 - time.time()))
        calls_after_one_second = r.calls()
        outs = []
        for i, p in enumerate(procs):
            text, _ = p.communicate()
            if kill and i == 0:
                continue
            lines = [line for line in text.splitlines() if line.strip()]
            if p.returncode != 0 or not lines:
                raise SystemExit(f"{lang} worker exited {p.returncode}: {text}")
            outs.append(json.loads(lines[-1]))
        calls = r.calls()
        server_cpu = r.cpu_us() - server_cpu_before

        def total(f: str) -> int:
            return sum(int(o.get(f, 0)) for o in outs)

        hist: dict[int, int] = {}
        for o in outs:
            for b, n in o["hist"]:
                hist[b] = hist.get(b, 0) + n
        row = Row(f"{lang} over HTTP" if self.http else lang, scenario, processes, tasks, variant)
        row.admitted, row.denied = total("admitted"), total("denied")
        row.requests = row.admitted + row.denied + total("other")
        row.rps = row.requests / self.seconds
        row.held_at_end, row.lapsed, row.degraded = total("held_at_end"), total("lapsed"), total("degraded")
        row.calls, row.steady_calls = calls, calls - calls_after_one_second
        row.p50_us, row.p99_us = percentile(hist, 0.5) / 1000, percentile(hist, 0.99) / 1000
        row.cpu_us = (total("cpu_us") + server_cpu) / max(1, row.requests)
        row.steady_admitted = total("admitted_after_1s")
        if scenario == "below":
            row.exact = row.requests
        elif scenario == "above":
            row.exact = min(limit, row.requests)
            row.counted = limit - r.window_left(limit)
        elif kill:
            counted = limit - r.window_left(limit)
            told = os.path.getsize(files[0])
            for path in files:
                os.unlink(path)
            row.counted = counted
            row.kill = {
                "killed_at": killed_at,
                "survivors": row.admitted,
                "survivors_lapsed": row.lapsed,
                "told": told,
                "took": counted - row.admitted - row.lapsed,
                "all": row.admitted + told,
            }
            row.admitted += told
            row.exact = limit
        return row


def ratio(calls: int, n: int) -> str:
    if n == 0:
        return "-"
    if calls == 0:
        return "0"
    if calls <= n:
        return f"1/{n / calls:.0f}"
    return f"{calls / n:.1f}"


HEADER = (
    "| language | scenario | processes × tasks | variant | requests | requests/s | CPU µs / request | p50 µs "
    "| p99 µs | admitted | exact | over | under | Redis counted | server calls | calls / admitted | calls / denied |"
)
RULE = "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"


def line(row: Row) -> str:
    if row.exact is None:
        over, under = "-", "-"
    else:
        over = str(max(0, row.admitted - row.exact))
        short = max(0, row.exact - row.admitted)
        under = f"{short} (held at the end {row.held_at_end}, lapsed {row.lapsed})" if short else "0"
        if row.kill:
            under = f"{short} (the dead one's batch and in-flight requests)" if short else "0"
    return (
        f"| {row.lang} | {row.scenario} | {row.processes} × {row.tasks} | {row.variant} | {row.requests} "
        f"| {row.rps:.0f} | {row.cpu_us:.2f} | {row.p50_us:.1f} | {row.p99_us:.1f} | {row.admitted} "
        f"| {'-' if row.exact is None else row.exact} | {over} | {under} "
        f"| {'-' if row.counted is None else row.counted} | {row.calls} | {ratio(row.calls, row.admitted)} "
        f"| {ratio(row.calls, row.denied)} |"
    )


# (scenario, processes, tasks, variants, rounds-able)
PLAN = [
    ("below", 1, 64, ["no limit", "headers only", "unbatched", "batched", "batched + deny cache"]),
    ("below", 4, 16, ["no limit", "headers only", "unbatched", "batched", "batched + deny cache"]),
    ("above", 4, 16, ["unbatched", "batched", "batched + deny cache"]),
    ("flood", 4, 16, ["unbatched", "deny cache", "batched + deny cache"]),
    ("kill", 4, 16, ["batched + deny cache"]),
]


def summary(rows: list[Row], seconds: float) -> list[str]:
    out = []

    def find(lang: str, s: str, p: int, v: str) -> Row | None:
        return next((r for r in rows if (r.lang, r.scenario, r.processes, r.variant) == (lang, s, p, v)), None)

    for lang in dict.fromkeys(r.lang for r in rows):
        for p in (1, 4):
            b, u = find(lang, "below", p, "batched"), find(lang, "below", p, "unbatched")
            if b and u:
                out.append(
                    f"{lang}, below, {p} process(es): batched {b.rps:.0f} requests/s = {b.rps / max(1, u.rps):.1f}x "
                    f"unbatched ({u.rps:.0f}); server calls per admitted request {ratio(b.calls, b.admitted)}, "
                    f"after the first second {ratio(b.steady_calls, b.steady_admitted) if seconds > 1 else '-'} "
                    "(goal at most 1/32)"
                )
                for floor in ("no limit", "headers only"):
                    f = find(lang, "below", p, floor)
                    if f:
                        out.append(
                            f"{lang}, below, {p} process(es): {floor} {f.rps:.0f} requests/s = "
                            f"{f.rps / max(1, u.rps):.1f}x unbatched; batched reaches "
                            f"{100 * b.rps / max(1, f.rps):.0f}% of it"
                        )
        for v in ("deny cache", "batched + deny cache"):
            f = find(lang, "flood", 4, v)
            u = find(lang, "flood", 4, "unbatched")
            if f and u:
                out.append(
                    f"{lang}, flood, 4 processes, {v}: {f.calls} server calls for {f.denied} denials "
                    f"({f.admitted} admitted; unbatched without it: {u.calls} for {u.denied}); after the first "
                    f"second {f'{f.steady_calls / 4 / (seconds - 1):.2f}' if seconds > 1 else '-'} calls per process "
                    "per second"
                )
        k = find(lang, "kill", 4, "batched + deny cache")
        if k:
            kk = k.kill
            out.append(
                f"{lang}, kill: one of 4 processes killed (SIGKILL) when Redis had counted {kk['killed_at']}; "
                f"survivors admitted {kk['survivors']} (lapsed {kk['survivors_lapsed']}), the dead one told "
                f"{kk['told']} admissions and Redis says it took {kk['took']}; admitted in all {kk['all']} "
                f"of {k.exact}: over {max(0, kk['all'] - (k.exact or 0))} (goal 0), the dead one's told above "
                f"its take {max(0, kk['told'] - kk['took'])} (goal 0)"
            )
    over = max((max(0, r.admitted - r.exact) for r in rows if r.exact is not None), default=0)
    miscounted = sum(1 for r in rows if r.scenario == "above" and r.counted != r.admitted)
    degraded = sum(r.degraded for r in rows)
    out.append(
        f"over-admitted in the worst run: {over} (goal 0); runs above the limit where Redis's count differs "
        f"from the admissions after close: {miscounted}; answers of the failure policy: {degraded}"
    )
    return out


def failures(rows: list[Row]) -> list[str]:
    """What --check fails on: a run without requests, an admission above the exact limit, Redis's
    count above the limit different from the admissions once the clients closed, a dead worker's
    told admissions above what Redis says it took, an answer of the failure policy."""
    out = []
    for r in rows:
        name = f"{r.lang}, {r.scenario}, {r.processes} × {r.tasks}, {r.variant}"
        if r.requests == 0:
            out.append(f"{name}: no requests")
        if r.exact is not None and r.admitted > r.exact:
            out.append(f"{name}: admitted {r.admitted}, above {r.exact}")
        if r.scenario == "above" and r.counted != r.admitted:
            out.append(f"{name}: Redis counted {r.counted}, admitted {r.admitted}")
        if r.kill and r.kill["told"] > r.kill["took"]:
            out.append(f"{name}: the dead one told {r.kill['told']} admissions, Redis says it took {r.kill['took']}")
        if r.degraded:
            out.append(f"{name}: {r.degraded} answers of the failure policy")
    return out


def rust_rows(path: str) -> list[str]:
    """hot_key.rs's rows with the language column, and its summary lines."""
    rows = []
    try:
        with open(path, encoding="utf-8") as f:
            for text in f:
                if text.startswith(("| below", "| above", "| flood")):
                    rows.append("| rust " + text.rstrip("\n"))
    except OSError:
        pass
    return rows


def load_average() -> str:
    """The machine's load averages (1, 5 and 15 minutes): the figures depend on what else runs."""
    with open("/proc/loadavg", encoding="ascii") as f:
        return " ".join(f.read().split()[:3])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", default="redis-server")
    ap.add_argument("--module", required=True)
    ap.add_argument("--worker", action="append", default=[], help="lang=command")
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--only", default="", help="comma-separated scenarios")
    ap.add_argument("--check", action="store_true", help="exit 1 on an over-admission or a miscount")
    ap.add_argument("--http", action="store_true", help="requests over HTTP on loopback, not handed over in process")
    ap.add_argument("--rust-output", default="")
    ap.add_argument(
        "--above-limit",
        action="append",
        default=[],
        help="lang=N: the fixed window of the above and kill runs (default 20000)",
    )
    a = ap.parse_args()
    workers = {}
    for w in a.worker:
        lang, _, command = w.partition("=")
        workers[lang] = shlex.split(command)
    limits = {lang: int(n) for lang, _, n in (x.partition("=") for x in a.above_limit)}
    rows: list[Row] = []
    r = Redis(a.server, a.module)
    try:
        version = next(
            (ln.split(":", 1)[1].strip() for ln in r.info("server").splitlines() if ln.startswith("redis_version:")), ""
        )
        print(
            f"one hot key through each client's HTTP middleware, {a.seconds:g} s per run, redis-server {version} "
            f"on 127.0.0.1 (module mode), policy fail-closed, timeout 2 s; batches: defaults (detected at 100 "
            f"calls/s, lease 200 ms, 8 to {MAX_BATCH} units, at most 1/8 of what remains); below the limit, the run "
            f"of median requests/s of {a.rounds} interleaved round(s); load average at the start: "
            f"{load_average()}\n",
            flush=True,
        )
        print(HEADER)
        print(RULE, flush=True)
        bench = Bench(r, workers, a.seconds, limits, a.http)
        only = set(filter(None, a.only.split(",")))
        for lang in workers:
            for scenario, processes, tasks, variants in PLAN:
                if only and scenario not in only:
                    continue
                rounds = max(1, a.rounds) if scenario == "below" else 1
                runs: list[list[Row]] = [[] for _ in variants]
                for _ in range(rounds):
                    for v, done in zip(variants, runs):
                        done.append(bench.run(lang, scenario, v, processes, tasks))
                for done in runs:
                    done.sort(key=lambda x: x.rps)
                    row = done[len(done) // 2]
                    print(line(row), flush=True)
                    if row.degraded:
                        print(f"  ({row.degraded} answers of the failure policy)")
                    rows.append(row)
        print()
        for s in summary(rows, a.seconds):
            print(s)
        print(f"load average at the end: {load_average()}")
        if a.rust_output:
            # hot_key's rows when it ran before (none with HOT_RUST=0), then these.
            rust = rust_rows(a.rust_output)
            source = "Rust from hot_key's run above, " if rust else ""
            print(f"\nevery language in one table ({source}kill rows Go, Python and Node.js only):\n")
            print(HEADER)
            print(RULE)
            for text in rust:
                print(text)
            for row in rows:
                print(line(row))
    finally:
        r.close()
    sys.stdout.flush()
    if a.check:
        wrong = failures(rows)
        for w in wrong:
            print(f"hot key check: {w}", file=sys.stderr)
        if wrong:
            sys.exit(1)


if __name__ == "__main__":
    main()
