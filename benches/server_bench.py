#!/usr/bin/env python3
"""Server-side benchmark: each rate-limiter command against its Lua twin and plain HSET.

Starts one redis-server with the module loaded (loopback, free port, no persistence, temporary
directory) and always stops it. Then, in interleaved rounds, runs redis-benchmark once per case
and reads two numbers from that run:

  * server CPU per call: `usec / calls` of the command in INFO commandstats (after CONFIG
    RESETSTAT); for a Lua twin that is EVALSHA, which includes the commands the script calls;
  * throughput: requests per second as reported by redis-benchmark (--csv).

Finally it measures memory per key (used_memory delta over 100,000 new keys, and MEMORY USAGE of
one of them) for each command and its twin, and prints Markdown tables: medians over rounds, the
ratios module / HSET and Lua / module, and the memory table. Python standard library only.

With --redis-cell PATH it also starts a second redis-server (same options and CPU) with the
redis-cell module loaded: both modules register CL.THROTTLE, so they cannot share a server. Its
CL.THROTTLE runs with the same arguments and keys as ours, in the same rounds, next to an HSET
floor on that server, and its CPU per call is divided by ours.

Usage: python3 benches/server_bench.py [--module PATH] [--redis-cell PATH] [--quick]
                                       [--rounds N] [--budget SECONDS] [--log-sizes-only]

It also times RL.SLIDINGLOG and its twin on a key holding 10 entries and one holding 99,000,
admitted and denied (pipelined calls on a seeded key, INFO commandstats per call).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import platform
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODULE = ROOT / "target" / "release" / "libredis_rate_limiter.so"
LUA_DIR = ROOT / "lua-reference"

PIPELINE = 16
CLIENTS = 50
KEYSPACE = 100_000


@dataclass(frozen=True)
class Limiter:
    """One algorithm: its module command, its Lua twin, and argument strings after the key.

    admit:  a hot key that keeps admitting (fast refill); also run over random keys.
    deny:   a hot key that is denied after its first call (tiny limit, slow refill). Its first
            call on a new key writes state that lives for a long time, so the memory
            measurement uses it too.
    steady: random keys that stay admitted and keep their state between visits (a large quota
            with a slow refill, so stored counts are fractional).
    """

    command: str
    script: str
    admit: str
    deny: str
    steady: str


# One line per algorithm. Commands the loaded module does not have, and scripts that do not
# exist, are skipped, so adding a line before the command lands is harmless.
LIMITERS = [
    Limiter("RL.TOKENBUCKET", "token_bucket.lua", "100 1000000", "1 0.001", "1000 0.1"),
    Limiter("RL.LEAKYBUCKET", "leaky_bucket.lua", "100 1000000", "1 0.001", "1000 0.1"),
    Limiter("RL.FIXEDWINDOW", "fixed_window.lua", "1000000000 1", "1 1000", "1000 1000"),
    Limiter("RL.SLIDINGWINDOW", "sliding_window.lua", "1000000000 1", "1 1000", "1000 1000"),
    Limiter("RL.SLIDINGLOG", "sliding_log.lua", "100000 0.001", "1 1000", "1000 1000"),
    Limiter("RL.GCRA", "gcra.lua", "1000 500000 1", "0 1 1000", "1000 1 1"),
    # CL.THROTTLE replies `limited` first: 0 means admitted (see check_decisions).
    Limiter("CL.THROTTLE", "throttle.lua", "1000 500000 1", "0 1 1000", "1000 1 1"),
]

# Commands whose first reply element is "limited" rather than "allowed".
INVERTED = {"CL.THROTTLE"}

FLOOR = "HSET"
FLOOR_ARGS = "f1 v1 f2 v2"

# The command redis-cell provides, compared with ours of the same name.
CELL_COMMAND = "CL.THROTTLE"
CELL_LABEL = f"{CELL_COMMAND} (redis-cell)"


@dataclass
class Case:
    label: str  # command as shown in the table
    args: str  # arguments shown in the table
    keys: str  # "hot" or "random"
    argv: list[str]  # redis-benchmark command line after the options
    stat: str  # commandstats entry to read, lower case
    limiter: str | None  # module command this case belongs to, or None for the floor
    lua: bool
    cell: bool = False  # runs on the redis-cell server
    n: int = 0
    usec: list[float] = field(default_factory=list)
    rps: list[float] = field(default_factory=list)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A redis-server process, talked to with redis-cli."""

    def __init__(self, module: Path, workdir: Path, pin: list[str]):
        self.port = free_port()
        self.workdir = workdir
        argv = pin + [
            "redis-server",
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(workdir),
            "--logfile", str(workdir / "redis.log"),
            "--loadmodule", str(module),
        ]  # fmt: skip
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + 10
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(f"redis-server exited at start; log:\n{self.log()}")
            try:
                if self.cli("PING", check=False) == "PONG":
                    return
            except subprocess.TimeoutExpired:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"redis-server did not start; log:\n{self.log()}")
            time.sleep(0.05)

    def log(self) -> str:
        try:
            return (self.workdir / "redis.log").read_text(errors="replace")
        except OSError:
            return ""

    def cli(self, *args: str, stdin: bytes | None = None, check: bool = True) -> str:
        argv = ["redis-cli", "-h", "127.0.0.1", "-p", str(self.port), *args]
        out = subprocess.run(argv, input=stdin, capture_output=True, timeout=120)
        text = out.stdout.decode(errors="replace").strip()
        if check and (out.returncode != 0 or re.match(r"^(ERR|WRONGTYPE|NOSCRIPT)", text)):
            raise SystemExit(f"redis-cli {' '.join(args[:3])}... failed: {text} {out.stderr!r}")
        return text

    def info(self, section: str) -> dict[str, str]:
        result = {}
        for line in self.cli("INFO", section).splitlines():
            if ":" in line and not line.startswith("#"):
                k, v = line.split(":", 1)
                result[k.strip().lower()] = v.strip()
        return result

    def has_command(self, name: str) -> bool:
        return name.lower() in self.cli("COMMAND", "INFO", name).lower().split()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def command_stats(server: Server, stat: str) -> tuple[int, float, int]:
    """(calls, usec, failed_calls) of one commandstats entry."""
    entry = server.info("commandstats").get(f"cmdstat_{stat}")
    if entry is None:
        return 0, 0.0, 0
    fields = dict(kv.split("=", 1) for kv in entry.split(","))
    return int(fields["calls"]), float(fields["usec"]), int(fields.get("failed_calls", "0"))


def run_case(server: Server, case: Case, n: int, pin: list[str]) -> tuple[float, float]:
    """One redis-benchmark run on an empty database: (server usec per call, requests/s)."""
    server.cli("FLUSHALL")
    server.cli("CONFIG", "RESETSTAT")
    argv = pin + ["redis-benchmark", "-h", "127.0.0.1", "-p", str(server.port)]
    argv += ["-P", str(PIPELINE), "-c", str(CLIENTS), "-n", str(n), "--csv"]
    if case.keys == "random":
        argv += ["-r", str(KEYSPACE)]
    out = subprocess.run(argv + case.argv, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise SystemExit(f"redis-benchmark failed for {case.label}: {out.stderr}")
    rows = [r for r in csv.reader(io.StringIO(out.stdout)) if len(r) > 1 and r[0] != "test"]
    if not rows:
        raise SystemExit(f"no result from redis-benchmark for {case.label}:\n{out.stdout}")
    rps = float(rows[0][1])
    calls, usec, failed = command_stats(server, case.stat)
    # redis-benchmark sends whole pipelines, so a few more calls than -n may reach the server.
    if failed or not n <= calls <= n + PIPELINE * CLIENTS:
        raise SystemExit(
            f"{case.label} {case.args}: {calls} calls of {n} counted, {failed} failed; "
            f"check the arguments (redis-cli {' '.join(case.argv)})"
        )
    return usec / calls, rps


def check_decisions(server: Server, limiter: Limiter, sha: str | None) -> None:
    """The admit and steady arguments keep admitting; the deny arguments deny from the second
    call on."""
    yes, no = (["0"], ["1"]) if limiter.command in INVERTED else (["1"], ["0"])
    for lua in ([False, True] if sha else [False]):
        prefix = ["EVALSHA", sha, "1"] if lua else [limiter.command]
        who = "Lua twin" if lua else limiter.command
        server.cli("FLUSHALL")
        for args in [limiter.admit, limiter.steady]:
            for _ in range(3):
                reply = server.cli(*prefix, f"check:{args}", *args.split()).split()
                if reply[:1] != yes:
                    raise SystemExit(f"{who} {args}: expected admitted, got {reply}")
        replies = [
            server.cli(*prefix, "check:deny", *limiter.deny.split()).split() for _ in range(2)
        ]
        if replies[0][:1] != yes or replies[1][:1] != no:
            raise SystemExit(f"{who} {limiter.deny}: expected admitted then denied, got {replies}")


def limiter_cases(
    lim: Limiter, head: list[str], label: str, stat: str, prefix: str, lua: bool, cell: bool
) -> list[Case]:
    """One limiter's cases (hot and random admits, a hot denial, steady random keys), each called
    as `head + [key] + arguments`, with keys named `prefix:command:kind:...`."""
    tag = lim.command.split(".")[-1].lower()
    variants = [
        ("admit", "hot", lim.admit),
        ("admit", "random", lim.admit),
        ("deny", "hot", lim.deny),
        ("steady", "random", lim.steady),
    ]
    cases = []
    for kind, keys, args in variants:
        key = f"{prefix}:{tag}:{kind}:" + ("{__rand_int__}" if keys == "random" else "hot")
        cases.append(
            Case(
                label=label,
                args=args,
                keys=keys,
                argv=head + [key] + args.split(),
                stat=stat,
                limiter=lim.command,
                lua=lua,
                cell=cell,
            )
        )
    return cases


def floor_cases(label: str, cell: bool = False) -> list[Case]:
    """HSET on a hot key and on random keys."""
    cases = []
    for keys in ["hot", "random"]:
        key = "floor:{__rand_int__}" if keys == "random" else "floor:hot"
        cases.append(
            Case(
                label=label,
                args=FLOOR_ARGS,
                keys=keys,
                argv=[FLOOR, key] + FLOOR_ARGS.split(),
                stat=FLOOR.lower(),
                limiter=None,
                lua=False,
                cell=cell,
            )
        )
    return cases


def build_cases(server: Server) -> tuple[list[Case], dict[str, str], list[str]]:
    """Cases for every limiter the module has (and its twin, if the script exists)."""
    cases: list[Case] = []
    shas: dict[str, str] = {}
    notes: list[str] = []
    for lim in LIMITERS:
        if not server.has_command(lim.command):
            notes.append(f"{lim.command}: not in the loaded module, skipped")
            continue
        script = LUA_DIR / lim.script
        if script.is_file():
            shas[lim.command] = server.cli("-x", "SCRIPT", "LOAD", stdin=script.read_bytes())
        else:
            notes.append(f"{lim.command}: no lua-reference/{lim.script}, Lua twin skipped")
        check_decisions(server, lim, shas.get(lim.command))
        cases += limiter_cases(
            lim, [lim.command], lim.command, lim.command.lower(), "rl", lua=False, cell=False
        )
        if lim.command in shas:
            head = ["EVALSHA", shas[lim.command], "1"]
            label = f"{lim.command} (Lua twin)"
            cases += limiter_cases(lim, head, label, "evalsha", "lua", lua=True, cell=False)
    cases += floor_cases(f"{FLOOR} (floor)")
    return cases, shas, notes


def build_cell_cases(cell: Server) -> list[Case]:
    """redis-cell's CL.THROTTLE with the arguments and keys of our CL.THROTTLE cases, and an HSET
    floor on its server."""
    lim = next(lim for lim in LIMITERS if lim.command == CELL_COMMAND)
    if not cell.has_command(CELL_COMMAND):
        raise SystemExit(f"--redis-cell: the loaded module has no {CELL_COMMAND}")
    check_decisions(cell, lim, None)
    # The same key names as our cases, so only the module differs.
    cases = limiter_cases(
        lim, [lim.command], CELL_LABEL, lim.command.lower(), "rl", lua=False, cell=True
    )
    return cases + floor_cases(f"{FLOOR} (floor, redis-cell server)", cell=True)


def merge_cell_cases(cases: list[Case], cell_cases: list[Case]) -> list[Case]:
    """redis-cell's CL.THROTTLE rows right after ours, its floor rows after our floor."""
    ours = [i for i, c in enumerate(cases) if c.limiter == CELL_COMMAND]
    at = ours[-1] + 1 if ours else next(i for i, c in enumerate(cases) if c.limiter is None)
    limited = [c for c in cell_cases if c.limiter]
    floors = [c for c in cell_cases if not c.limiter]
    return cases[:at] + limited + cases[at:] + floors


def resp(args: list[str]) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        b = a.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


def memory_per_key(
    server: Server, head: list[str], args: list[str], count: int
) -> tuple[int, float, int]:
    """New keys `mem:000000`... each written once: (keys present, used_memory delta per key,
    MEMORY USAGE of the first key)."""
    payload = b"".join(resp(head + [f"mem:{i:06d}"] + args) for i in range(count))
    # Filled twice: the first fill brings in whatever the command allocates once and keeps
    # (outside the keyspace), the second is measured.
    for _ in range(2):
        server.cli("FLUSHALL")
        text = server.cli("--pipe", stdin=payload, check=False)
        m = re.search(r"errors:\s*(\d+),\s*replies:\s*(\d+)", text)
        if not m or int(m.group(1)) != 0 or int(m.group(2)) != count:
            raise SystemExit(f"redis-cli --pipe failed for {' '.join(head)}: {text}")
    with_keys = settled_used_memory(server)
    keys = int(server.cli("DBSIZE"))
    sample = int(server.cli("MEMORY", "USAGE", "mem:000000", "SAMPLES", "0") or 0)
    # The baseline is taken once the keys are gone.
    server.cli("FLUSHALL")
    without = settled_used_memory(server)
    return keys, (with_keys - without) / keys if keys else float("nan"), sample


def measure_memory(
    server: Server,
    cases: list[Case],
    shas: dict[str, str],
    count: int,
    cell: Server | None = None,
) -> list[tuple[str, str, int, float, int]]:
    """Memory rows: each benchmarked command and its twin (and redis-cell's CL.THROTTLE, on its
    server), with its deny arguments (the first call writes state that lives for 1000 s), then
    the HSET floor."""
    rows = []
    benchmarked = {c.limiter for c in cases if not c.cell}
    for lim in LIMITERS:
        args = lim.deny.split()
        if lim.command in benchmarked:
            head = [lim.command]
            rows.append((lim.command, lim.deny, *memory_per_key(server, head, args, count)))
        if lim.command in benchmarked and lim.command in shas:
            head = ["EVALSHA", shas[lim.command], "1"]
            label = f"{lim.command} (Lua twin)"
            rows.append((label, lim.deny, *memory_per_key(server, head, args, count)))
        if cell and lim.command == CELL_COMMAND:
            head = [lim.command]
            rows.append((CELL_LABEL, lim.deny, *memory_per_key(cell, head, args, count)))
    floor = memory_per_key(server, [FLOOR], FLOOR_ARGS.split(), count)
    rows.append((f"{FLOOR} (floor, no TTL)", FLOOR_ARGS, *floor))
    return rows


# Sorted-set sizes of the sliding-log rows: a call must cost about the same on both.
LOG_SIZES = [10, 99_000]
LOG_COMMAND = "RL.SLIDINGLOG"
LOG_WINDOW = "3600"


def seed_log(server: Server, key: str, size: int) -> None:
    """`size` well-formed entries in the last 2 seconds, one per microsecond step, all in the
    window."""
    base = int(time.time() * 1_000_000) - 1_000_000
    step = max(1, 2_000_000 // size)
    commands = []
    for start in range(0, size, 1000):
        args = ["ZADD", key]
        for i in range(start, min(size, start + 1000)):
            score = base - i * step
            args += [str(score), f"{score}:0"]
        commands.append(resp(args))
    text = server.cli("--pipe", stdin=b"".join(commands), check=False)
    if f"replies: {len(commands)}" not in text or "errors: 0" not in text:
        raise SystemExit(f"seeding a log of {size} failed: {text}")


def log_call_usec(server: Server, head: list[str], stat: str, size: int, admit: bool, calls: int
                  ) -> float:
    """Server µs per call on a key seeded with `size` entries: admitted calls (limit above the
    size, so every call adds an entry) or denials (limit equal to the size)."""
    server.cli("FLUSHALL")
    seed_log(server, "log", size)
    limit = str(size + calls + 10) if admit else str(size)
    payload = b"".join(resp(head + ["log", limit, LOG_WINDOW]) for _ in range(calls))
    server.cli("CONFIG", "RESETSTAT")
    text = server.cli("--pipe", stdin=payload, check=False)
    if f"replies: {calls}" not in text:
        raise SystemExit(f"{' '.join(head)} on a log of {size}: {text}")
    n, usec, failed = command_stats(server, stat)
    first = server.cli(*head, "log", limit, LOG_WINDOW).split()[:1]
    expected = ["1"] if admit else ["0"]
    if failed or n != calls or first != expected:
        raise SystemExit(f"{' '.join(head)} on a log of {size}: {n} calls, {failed} failed, {first}")
    return usec / n


def log_size_table(server: Server, shas: dict[str, str], rounds: int) -> list[str]:
    """RL.SLIDINGLOG and its twin on a key of 10 entries and one of 99,000, admitted and
    denied: medians over rounds, and the ratio of the large key to the small one."""
    if not server.has_command(LOG_COMMAND):
        return []
    paths = [("module", [LOG_COMMAND], LOG_COMMAND.lower())]
    if LOG_COMMAND in shas:
        paths.append(("Lua twin", ["EVALSHA", shas[LOG_COMMAND], "1"], "evalsha"))
    lines = [
        f"| {LOG_COMMAND} | calls | " + " | ".join(f"{n:,} entries µs/call" for n in LOG_SIZES)
        + f" | {LOG_SIZES[-1]:,} ÷ {LOG_SIZES[0]:,} |",
        "|---|---|" + "---:|" * (len(LOG_SIZES) + 1),
    ]
    for name, head, stat in paths:
        for admit, calls in [(True, 200), (False, 2000)]:
            usec = {
                size: statistics.median(
                    log_call_usec(server, head, stat, size, admit, calls) for _ in range(rounds)
                )
                for size in LOG_SIZES
            }
            kind = f"admitted (+{calls} entries)" if admit else "denied"
            cells = " | ".join(f"{usec[n]:.2f}" for n in LOG_SIZES)
            ratio = usec[LOG_SIZES[-1]] / usec[LOG_SIZES[0]]
            lines.append(f"| {name} | {kind} | {cells} | {ratio:.1f}× |")
    return lines


def settled_used_memory(server: Server) -> int:
    """used_memory once it stops moving: right after many inserts the keyspace tables may be
    halfway through an incremental rehash, holding both the old and the new bucket arrays."""
    last = int(server.info("memory")["used_memory"])
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        time.sleep(0.25)
        now = int(server.info("memory")["used_memory"])
        if now == last:
            break
        last = now
    return last


def machine_line(pinned: str) -> str:
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    version = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout
    v = re.search(r"v=(\S+)", version)
    malloc = re.search(r"malloc=(\S+)", version)
    return (
        f"Machine: {model}, {os.cpu_count()} cores, Linux {platform.release()}; "
        f"redis-server {v.group(1) if v else '?'} ({malloc.group(1) if malloc else '?'}); "
        f"{pinned}; {time.strftime('%Y-%m-%d', time.gmtime())}"
    )


def criterion_table(directory: Path) -> list[str]:
    """Median ns per call of each criterion benchmark found under `directory`, in run order."""
    found = []
    for est in directory.glob("*/*/new/estimates.json"):
        try:
            meta = json.loads((est.parent / "benchmark.json").read_text())
            median = json.loads(est.read_text())["median"]["point_estimate"]
        except (OSError, KeyError, ValueError):
            continue
        found.append((est.stat().st_mtime, meta.get("full_id", str(est.parent.parent)), median))
    if not found:
        return []
    lines = ["| pure core (criterion) | ns per call (median) |", "|---|---:|"]
    for _, name, ns in sorted(found):
        lines.append(f"| `{name}` | {ns:.1f} |")
    return lines


def render(cases: list[Case], memory: list[tuple[str, str, int, float, int]]) -> list[str]:
    """The Markdown tables: medians over rounds with their ratios, then memory."""
    med = {id(c): (statistics.median(c.usec), statistics.median(c.rps)) for c in cases}
    # Each server's rows are divided by the HSET floor of that server.
    floor = {(c.cell, c.keys): med[id(c)][0] for c in cases if c.limiter is None}
    module = {
        (c.limiter, c.args, c.keys): med[id(c)][0]
        for c in cases
        if c.limiter and not c.lua and not c.cell
    }
    twins = "Lua or redis-cell" if any(c.cell for c in cases) else "Lua"
    lines = [
        "| command | arguments | keys | server µs/call | range over rounds | requests/s "
        f"| CPU ÷ HSET | {twins} ÷ module CPU |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for c in cases:
        usec, rps = med[id(c)]
        vs_floor = usec / floor[(c.cell, c.keys)] if c.limiter else None
        twin_of = module.get((c.limiter, c.args, c.keys)) if c.lua or c.cell else None
        vs_module = usec / twin_of if twin_of else None
        lines.append(
            f"| {c.label} | `{c.args}` | {c.keys} | {usec:.2f} | "
            f"{min(c.usec):.2f}–{max(c.usec):.2f} | {rps:,.0f} | "
            f"{fmt_ratio(vs_floor)} | {fmt_ratio(vs_module)} |"
        )
    lines += [
        "",
        "| memory | arguments | keys | used_memory per key (bytes) | MEMORY USAGE of one key |",
        "|---|---|---:|---:|---:|",
    ]
    for label, args, keys, per_key, sample in memory:
        lines.append(f"| {label} | `{args}` | {keys:,} | {per_key:.1f} | {sample} |")
    return lines


def fmt_ratio(x: float | None) -> str:
    return "—" if x is None else f"{x:.1f}×"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--module", type=Path, default=DEFAULT_MODULE, help="module .so to load")
    ap.add_argument(
        "--redis-cell",
        type=Path,
        metavar="PATH",
        help="redis-cell's libredis_cell.so: compare its CL.THROTTLE with ours",
    )
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (at least 3)")
    ap.add_argument(
        "--budget",
        type=float,
        default=120.0,
        help="seconds of redis-benchmark runs in all rounds together; sets -n per case",
    )
    ap.add_argument("--memory-keys", type=int, default=100_000, help="keys per memory measurement")
    ap.add_argument("--quick", action="store_true", help="3 short rounds and 20,000 memory keys")
    ap.add_argument("--criterion-dir", type=Path, help="also tabulate criterion results found here")
    ap.add_argument(
        "--log-sizes-only",
        action="store_true",
        help=f"only the {LOG_COMMAND} rows on a small and a large key",
    )
    opts = ap.parse_args()
    if opts.quick:
        opts.rounds, opts.budget, opts.memory_keys = 3, 20.0, 20_000
    opts.rounds = max(opts.rounds, 3)

    for tool in ["redis-server", "redis-cli", "redis-benchmark"]:
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} not found (make deps installs it)")
    module = opts.module.resolve()
    if not module.is_file():
        raise SystemExit(f"module not found: {module} (build it with cargo build --release)")
    cell_module = opts.redis_cell.resolve() if opts.redis_cell else None
    if cell_module and not cell_module.is_file():
        raise SystemExit(f"redis-cell module not found: {cell_module}")

    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) >= 2 and shutil.which("taskset"):
        server_pin = ["taskset", "-c", str(cpus[0])]
        bench_pin = ["taskset", "-c", str(cpus[1])]
        pinned = f"redis-server on CPU {cpus[0]}, redis-benchmark on CPU {cpus[1]}"
    else:
        server_pin, bench_pin, pinned = [], [], "not pinned"

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="rl-bench-") as tmp:
        server = Server(module, Path(tmp), server_pin)
        cell: Server | None = None
        try:
            if cell_module:
                # Its own directory, so the two servers' logs stay apart.
                (Path(tmp) / "redis-cell").mkdir()
                cell = Server(cell_module, Path(tmp) / "redis-cell", server_pin)
            server.wait_ready()
            if opts.log_sizes_only:
                shas = {}
                script = LUA_DIR / "sliding_log.lua"
                if script.is_file():
                    shas[LOG_COMMAND] = server.cli("-x", "SCRIPT", "LOAD", stdin=script.read_bytes())
                print("\n".join(log_size_table(server, shas, opts.rounds)))
                return 0
            cases, shas, notes = build_cases(server)
            for note in notes:
                print(f"note: {note}", file=sys.stderr)
            if cell:
                cell.wait_ready()
                cases = merge_cell_cases(cases, build_cell_cases(cell))

            def host(case: Case) -> Server:
                return cell if case.cell and cell else server

            # Warm-up run per case, which also sizes -n so that the rounds fit the budget.
            per_run = opts.budget / (opts.rounds * len(cases))
            for case in cases:
                _, rps = run_case(host(case), case, 20_000, bench_pin)
                batch = PIPELINE * CLIENTS
                case.n = int(min(max(rps * per_run, 20_000), 2_000_000)) // batch * batch
            for r in range(opts.rounds):
                print(f"round {r + 1}/{opts.rounds}", file=sys.stderr)
                for case in cases:
                    usec, rps = run_case(host(case), case, case.n, bench_pin)
                    case.usec.append(usec)
                    case.rps.append(rps)

            log_sizes = log_size_table(server, shas, max(opts.rounds, 5))
            memory = measure_memory(server, cases, shas, opts.memory_keys, cell)
        finally:
            server.stop()
            if cell:
                cell.stop()

    lines = render(cases, memory)
    if log_sizes:
        lines += [""] + log_sizes
    if opts.criterion_dir:
        core = criterion_table(opts.criterion_dir)
        if core:
            lines += [""] + core

    runs = ", ".join(f"{c.n:,}" for c in cases)
    print()
    print(machine_line(pinned))
    print()
    print(
        f"redis-benchmark -P {PIPELINE} -c {CLIENTS}, random keys from {KEYSPACE:,} (-r); "
        f"{opts.rounds} interleaved rounds, medians; -n per case: {runs}; "
        f"memory over {opts.memory_keys:,} new keys; {time.monotonic() - started:.0f} s"
    )
    if cell_module:
        print()
        print(
            f"redis-cell: {cell_module}, on a second redis-server with the same options and CPU; "
            "its CPU ÷ HSET is against HSET on that server"
        )
    print()
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
