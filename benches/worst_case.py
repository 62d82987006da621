#!/usr/bin/env python3
"""The worst case of each command: the slowest of N calls at its largest accepted arguments, on
the state that makes it do the most work, as the server's SLOWLOG times it (the span of the
command's own function), on every server given; each through the module and through its Lua
twin (EVALSHA of its script; FCALL of the library's function for the calls made to hurt).

A call a caller can make must never block the server for long: the budget is 10 ms per call on
this machine. Each case sets its keys up (server-side, with EVAL loops), then sends N calls one
by one; SLOWLOG (slowlog-log-slower-than 0) records every call, and the table shows the largest.

Usage: python3 benches/worst_case.py --module PATH --server NAME=BINARY [--server ...]
                                     [--calls N] [--only SUBSTRING] [--skip SUBSTRING ...]
                                     [--lua DIR]
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

BUDGET_US = 10_000
# An EVAL that adds `count` entries `<t>:<i>` at score t (a time long past: out of any window a
# call of window `window_sec` looks at) to each key, in batches that unpack() takes, and gives
# the key an expiry (every set of the module has one).
FILL_LOG = """
local t, count = tonumber(ARGV[1]), tonumber(ARGV[2])
for _, key in ipairs(KEYS) do
  local batch = {}
  for i = 0, count - 1 do
    batch[#batch + 1] = string.format('%.0f', t)
    batch[#batch + 1] = string.format('%.0f', t) .. ':' .. i
    if #batch == 2000 then redis.call('ZADD', key, unpack(batch)) batch = {} end
  end
  if #batch > 0 then redis.call('ZADD', key, unpack(batch)) end
  redis.call('PEXPIRE', key, 100000000)
end
return 1
"""
# The same for a lease set: `count` leases `old-<i>` expired at t.
FILL_LEASES = FILL_LOG.replace("string.format('%.0f', t) .. ':' .. i", "'old-' .. i")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, binary: str, module: Path, workdir: Path):
        self.port = free_port()
        self.workdir = workdir
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(workdir), "--loadmodule", str(module),
             "--slowlog-log-slower-than", "0", "--slowlog-max-len", "100000"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while self.cli("PING", check=False) != "PONG":
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise SystemExit(f"{binary} did not start")
            time.sleep(0.05)

    def cli(self, *args: str, check: bool = True) -> str:
        out = subprocess.run(
            ["redis-cli", "-p", str(self.port), *args], capture_output=True, timeout=600
        )
        text = out.stdout.decode(errors="replace").strip()
        if check and (out.returncode != 0 or text.startswith(("ERR", "WRONGTYPE", "OOM"))):
            raise SystemExit(f"redis-cli {' '.join(args[:4])}...: {text}")
        return text

    def pipe(self, commands: list[list[str | bytes]]) -> None:
        """Sends the commands through redis-cli --pipe (one connection, no replies read)."""
        data = b"".join(resp(c) for c in commands)
        # Exits 1 when a reply is an error (a call made to hurt is refused); every call answered
        # is what counts.
        out = subprocess.run(
            ["redis-cli", "-p", str(self.port), "--pipe", "--pipe-timeout", "600"], input=data,
            capture_output=True, timeout=1200,
        )  # fmt: skip
        if f"replies: {len(commands)}" not in out.stdout.decode(errors="replace"):
            raise SystemExit(f"redis-cli --pipe: {out.stdout!r} {out.stderr!r}")

    def slowest(self, command: str) -> int:
        """The largest duration (µs) SLOWLOG holds for `command`."""
        out = self.cli("SLOWLOG", "GET", "100000")
        # redis-cli prints each entry as id, time, duration, then the arguments, one per line.
        lines = out.splitlines()
        worst = 0
        for i, line in enumerate(lines):
            if line.strip().lower() == command.lower() and i >= 1:
                # The duration is the line before the argument list's first line (and after the
                # timestamp); find the nearest integer two lines up.
                try:
                    worst = max(worst, int(lines[i - 1].strip()))
                except ValueError:
                    continue
        return worst

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def resp(args: list[str | bytes]) -> bytes:
    out = [f"*{len(args)}\r\n".encode()]
    for a in args:
        b = a if isinstance(a, bytes) else a.encode()
        out.append(f"${len(b)}\r\n".encode() + b + b"\r\n")
    return b"".join(out)


@dataclass
class Case:
    label: str
    command: str
    # Setup, run once before the calls.
    setup: list[list[str]] = field(default_factory=list)
    # The call, sent `calls` times; `{i}` is replaced by the call's number.
    call: list[str] = field(default_factory=list)
    # How many calls, when not the run's number (the calls of a 256 MiB argument).
    calls: int | None = None
    # Arguments appended to the call as they are (not formatted): a huge one, or a million.
    tail: list[bytes] = field(default_factory=list)


# The twin of each command: its script, and its function in the library.
TWINS = {
    "RL.TOKENBUCKET": ("token_bucket.lua", "rl_tokenbucket"),
    "RL.LEAKYBUCKET": ("leaky_bucket.lua", "rl_leakybucket"),
    "RL.FIXEDWINDOW": ("fixed_window.lua", "rl_fixedwindow"),
    "RL.SLIDINGWINDOW": ("sliding_window.lua", "rl_slidingwindow"),
    "RL.SLIDINGLOG": ("sliding_log.lua", "rl_slidinglog"),
    "RL.GCRA": ("gcra.lua", "rl_gcra"),
    "CL.THROTTLE": ("throttle.lua", "cl_throttle"),
    "RL.ACQUIRE": ("acquire.lua", "rl_acquire"),
    "RL.RELEASE": ("release.lua", "rl_release"),
    "RL.ALL": ("all.lua", "rl_all"),
    "RL.SETTLE": ("settle.lua", "rl_settle"),
}
LUA_DIR = Path(__file__).resolve().parent.parent / "lua-reference"


def through(case: Case, path: str) -> Case:
    """The case through a twin: `script` (EVALSHA; `{sha}` is replaced once loaded) or
    `function` (FCALL). RL.ALL and RL.SETTLE take numkeys as the module does; the others one key."""
    script, function = TWINS[case.command]
    head = ["EVALSHA", "{sha:" + script + "}"] if path == "script" else ["FCALL", function]
    numkeys = [] if case.command in ("RL.ALL", "RL.SETTLE") else ["1"]
    return Case(f"{case.label} ({path})", head[0], case.setup, head + numkeys + case.call[1:],
                case.calls, case.tail)


def logs(prefix: str, n: int) -> list[str]:
    return [f"{{{prefix}}}log{i}" for i in range(n)]


def cases() -> list[Case]:
    long_ago = "1000000000000000"  # 2001: out of any window but the longest.
    big = "1000000000000000"
    out = []
    for name, params in [
        ("RL.TOKENBUCKET", [big, big]),
        ("RL.LEAKYBUCKET", [big, big]),
        ("RL.FIXEDWINDOW", [big, "10000000000"]),
        ("RL.SLIDINGWINDOW", [big, "10000000000"]),
    ]:
        out.append(Case(f"{name}, largest limit and cost, a new key each call", name,
                        call=[name, "new:{i}", *params, big]))
    out.append(Case("RL.GCRA, largest burst and cost, a new key each call", "RL.GCRA",
                    call=["RL.GCRA", "new:{i}", "999999999", "1", "1", "1000000000"]))
    out.append(Case("CL.THROTTLE, largest burst and quantity, a new key each call", "CL.THROTTLE",
                    call=["CL.THROTTLE", "new:{i}", "999999999", "1", "1", "1000000000"]))
    limit = "10000"  # the largest limit of a sliding log or a lease set
    now = str(int(time.time() * 1e6))
    # Leases that expired a day ago (a lease's expiry is never before 2020).
    expired = str(int(time.time() * 1e6) - 86_400_000_000)
    # A sliding log of the largest limit, full of entries that left a 1 ms window: each call
    # removes 1,000 and adds 1,000 (its largest cost); once its entries leave, the next call
    # meets the key expired and frees it.
    out.append(Case(
        "RL.SLIDINGLOG, limit 10,000, cost 1,000, on 10,000 old entries", "RL.SLIDINGLOG",
        setup=[["EVAL", FILL_LOG, "1", "log", long_ago, limit]],
        call=["RL.SLIDINGLOG", "log", limit, "0.001", "1000"]))
    # The largest window: every entry counts; a denial reads the decisive entry mid-set.
    out.append(Case(
        "RL.SLIDINGLOG, limit 10,000, largest window, full: a denial", "RL.SLIDINGLOG",
        setup=[["EVAL", FILL_LOG, "1", "full", now, limit]],
        call=["RL.SLIDINGLOG", "full", limit, "10000000000", "1000"]))
    out.append(Case(
        "RL.ACQUIRE, limit 10,000, on 10,000 expired leases", "RL.ACQUIRE",
        setup=[["EVAL", FILL_LEASES, "1", "leases", expired, limit]],
        call=["RL.ACQUIRE", "leases", limit, "10000000", "job-{i}"]))
    out.append(Case(
        "RL.RELEASE, on 10,000 expired leases", "RL.RELEASE",
        setup=[["EVAL", FILL_LEASES, "1", "held", expired, limit]]
        + [["RL.ACQUIRE", "held", limit, "10000000", f"job-{i}"] for i in range(200)],
        call=["RL.RELEASE", "held", "job-{i}"]))
    # The most a call combines: 4 sorted-set limits (here sliding logs of 10,000 entries each),
    # with 12 token buckets; 1,000 entries between them.
    four, buckets = logs("a", 4), [f"{{a}}tb{j}" for j in range(12)]
    out.append(Case(
        "RL.ALL, 4 sliding logs of 10,000 old entries and 12 token buckets, cost 250",
        "RL.ALL",
        setup=[["EVAL", FILL_LOG, "4", *four, long_ago, limit]],
        call=["RL.ALL", "16", *four, *[f"{b}:{{i}}" for b in buckets],
              *(["SLIDINGLOG", limit, "0.001"] * 4), *(["TOKENBUCKET", big, big] * 12),
              "COST", "250"]))
    settled = logs("s", 4)
    out.append(Case(
        "RL.SETTLE, 4 sliding logs of 10,000 old entries, DELTA 250", "RL.SETTLE",
        setup=[["EVAL", FILL_LOG, "4", *settled, long_ago, limit]],
        call=["RL.SETTLE", "4", *settled, *(["SLIDINGLOG", limit, "0.001"] * 4),
              "DELTA", "250"]))
    refunded = logs("r", 4)
    out.append(Case(
        "RL.SETTLE, 4 full sliding logs of 10,000, DELTA -250", "RL.SETTLE",
        setup=[["EVAL", FILL_LOG, "4", *refunded, now, limit]],
        call=["RL.SETTLE", "4", *refunded, *(["SLIDINGLOG", limit, "10000000000"] * 4),
              "DELTA", "-250"]))
    out.append(Case(
        "RL.ALL, 16 token buckets of the largest capacity", "RL.ALL",
        call=["RL.ALL", "16", *[f"{{b}}tb{{i}}:{j}" for j in range(16)],
              *(["TOKENBUCKET", big, big] * 16), "COST", big]))
    twins = [through(c, "script") for c in out]
    # Calls made to hurt, at the server's largest argument sizes: a number of 256 MiB (the
    # largest bulk string is 512 MiB), and two million arguments.
    huge = b"0" * (256 << 20) + b"5"
    many = [b"x"] * 2_000_000
    hurt = [
        Case("RL.TOKENBUCKET, a capacity of 256 MiB of zeros and a 5", "RL.TOKENBUCKET",
             call=["RL.TOKENBUCKET", "huge:{i}"], calls=3, tail=[huge, b"5"]),
        Case("RL.GCRA, a period of 256 MiB of zeros and a 5", "RL.GCRA",
             call=["RL.GCRA", "huge:{i}", "9", "10"], calls=3, tail=[huge]),
        Case("RL.TOKENBUCKET, two million arguments ending in UPTO 5", "RL.TOKENBUCKET",
             call=["RL.TOKENBUCKET", "many:{i}"], calls=3, tail=[*many, b"UPTO", b"5"]),
        Case("RL.ALL, one key and two million words", "RL.ALL",
             call=["RL.ALL", "1", "many:{i}", "TOKENBUCKET", "10", "1"], calls=3,
             tail=[*many, b"COST", b"1"]),
        Case("RL.SETTLE, one key and two million words", "RL.SETTLE",
             call=["RL.SETTLE", "1", "many:{i}", "TOKENBUCKET", "10", "1"], calls=3,
             tail=[*many, b"DELTA", b"1"]),
    ]
    # What the server itself costs before any script runs: the same arguments to a script that
    # reads none of them (each becomes a Lua string of ARGV first).
    floor = [
        Case("EVAL of return 1, a 256 MiB argument (the server's own copy into ARGV)", "EVAL",
             call=["EVAL", "return 1", "0"], calls=3, tail=[huge]),
        Case("EVAL of return 1, two million arguments (the server's own ARGV)", "EVAL",
             call=["EVAL", "return 1", "0"], calls=3, tail=many),
    ]
    return out + twins + [c2 for c in hurt for c2 in (c, through(c, "script"),
                                                         through(c, "function"))] + floor


def measure(binary: str, module: Path, calls: int, only: str, skip: list[str],
            lua: Path) -> dict[str, int]:
    with tempfile.TemporaryDirectory(prefix="rl-worst-") as tmp:
        server = Server(binary, module, Path(tmp))
        try:
            shas = {name: server.cli("SCRIPT", "LOAD", (lua / name).read_text())
                    for name, _ in TWINS.values()}
            server.cli("FUNCTION", "LOAD", "REPLACE", (lua / "ratelimit.lua").read_text())
            results = {}
            for case in cases():
                if (only and only not in case.label) or any(s in case.label for s in skip):
                    continue
                server.cli("FLUSHALL")
                for command in case.setup:
                    server.cli(*command)
                server.cli("SLOWLOG", "RESET")
                call = [shas[a[5:-1]] if a.startswith("{sha:") else a for a in case.call]
                n = case.calls or calls
                server.pipe([[a.replace("{i}", str(i)) for a in call] + case.tail
                             for i in range(n)])
                results[case.label] = server.slowest(case.command)
            return results
        finally:
            server.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--module", type=Path, required=True)
    ap.add_argument("--server", action="append", default=[], metavar="NAME=BINARY")
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--only", default="")
    ap.add_argument("--skip", action="append", default=[], metavar="SUBSTRING")
    ap.add_argument("--lua", type=Path, default=LUA_DIR, help="the twins' scripts (lua-reference/)")
    opts = ap.parse_args()
    servers = [s.split("=", 1) for s in opts.server] or [["redis", "redis-server"]]
    started = time.monotonic()
    columns = {name: measure(binary, opts.module.resolve(), opts.calls, opts.only, opts.skip,
                             opts.lua)
               for name, binary in servers}
    labels = list(next(iter(columns.values())).keys())
    print(f"The slowest of {opts.calls} calls (3 of a 256 MiB number or two million arguments) "
          f"(SLOWLOG, µs); budget {BUDGET_US:,} µs; {time.monotonic() - started:.0f} s")
    print()
    print("| case | " + " | ".join(name for name, _ in servers) + " |")
    print("|---|" + "---:|" * len(servers))
    over = []
    for label in labels:
        row = [columns[name][label] for name, _ in servers]
        over += [(label, name, us) for (name, _), us in zip(servers, row) if us > BUDGET_US]
        print(f"| {label} | " + " | ".join(f"{us:,}" for us in row) + " |")
    for label, name, us in over:
        print(f"over the budget: {label} on {name}: {us:,} µs", file=sys.stderr)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
