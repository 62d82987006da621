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

Every limiter admits on a hot key, on random keys from 100,000 (revisited within a run, so a
slowly refilling limiter finds its state again) and on new keys (drawn from 1,000,000,000, so
nearly every call writes a key that does not exist yet); HSET runs on the same three.

With --floor-module PATH (benches/floor_module.c, built by `make bench`) the same server also
loads a small C module whose FLOOR.ADMIT and FLOOR.DENY make only the server calls of an
admitted and of a denied RL.TOKENBUCKET call on a hot key (open, read in place, rewrite in
place, expiry, keyspace events, one propagated SET, five integers replied): the least any module
command doing that work costs on this server. FLOOR.ADMIT also runs on new keys, the way a limiter
writes a key it has not seen, for each limiter with keys named and living as that limiter's (up
to 1 ms, 1 to 2 ms, 1,000 ms): a twin's new-key time divided by that row is the most the twin ÷
module ratio of that limiter could be, whatever the module's own code cost.

Usage: python3 benches/server_bench.py [--module PATH] [--redis-cell PATH] [--quick]
                                       [--rounds N] [--budget SECONDS] [--log-sizes-only]
                                       [--top-only] [--new-keys-only] [--floor-module PATH]

It also times RL.SLIDINGLOG and its twin on a key holding 10 entries and one holding 9,000,
admitted and denied (pipelined calls on a seeded key, INFO commandstats per call).

RL.RELEASE has rows of its own: releasing nothing runs under redis-benchmark like every other
case, while releasing a live lease needs an RL.ACQUIRE right before each release, so those rows
send acquire / release pairs through `redis-cli --pipe` and read only the release's entry of
INFO commandstats (the acquires are counted under rl.acquire); their throughput is pairs/s.

RL.SETTLE settles reservations written before each run (on random keys, a fill of the whole
keyspace through redis-cli --pipe): refunds and charges of one token bucket, a refund of two
limits in one call, a sliding log's refund right after an admission (pairs, as for releases) and
its charge.

The most-denied keys (RL.TOP, kept while ratelimit.top-slots is above 0) cost every denial a
hash lookup and an ordered-set update. A section of its own runs hot-key denials of
RL.TOKENBUCKET and RL.GCRA, denials of random keys (a fill first empties every key, so each call
denies one of 100,000 keys and nearly every one replaces a slot) and admitted calls on a hot key,
each with ratelimit.top-slots 128 (the default) and 0 in every round, and divides the two. After
each run RL.TOP must hold exactly that run's denials (the hot key with one per call but the
first; for random keys 128 entries whose counts sum to the calls) with tracking on, and nothing
with it off or for admitted calls. --top-only runs that section alone.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import platform
import random
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
# Keys drawn from this many are new on nearly every call (at most about 2 million calls per run:
# under 0.2% of them meet a key drawn before).
NEW_KEYSPACE = 1_000_000_000


@dataclass(frozen=True)
class Limiter:
    """One algorithm: its module command, its Lua twin, and argument strings after the key.

    admit:  a hot key that keeps admitting (fast refill); also run over random keys.
    deny:   a hot key that is denied after its first call (tiny limit, slow refill). Its first
            call on a new key writes state that lives for a long time, so the memory
            measurement uses it too.
    steady: random keys that stay admitted and keep their state between visits (a large quota
            with a slow refill, so stored counts are fractional).

    An argument may hold `__rand_int__`, which redis-benchmark replaces with a random 12-digit
    number on every call (the case then runs with -r even on a hot key); check_decisions and the
    memory measurement put a different number in each call.
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
    Limiter("RL.SLIDINGLOG", "sliding_log.lua", "10000 0.001", "1 1000", "1000 1000"),
    Limiter("RL.GCRA", "gcra.lua", "1000 500000 1", "0 1 1000", "1000 1 1"),
    # CL.THROTTLE replies `limited` first: 0 means admitted (see check_decisions).
    Limiter("CL.THROTTLE", "throttle.lua", "1000 500000 1", "0 1 1000", "1000 1 1"),
    # Leases: one id renewing its lease (1 ms, so a random key's has ended before the key comes
    # round again and every call there takes a lease on a new key); a key full with one lease,
    # asked by other ids; random keys whose hour-long lease the same id renews.
    Limiter("RL.ACQUIRE", "acquire.lua", "10 0.001 w", "1 3600 w:__rand_int__", "10 3600 w"),
]

# What redis-benchmark replaces with a random 12-digit number under -r.
RAND = "__rand_int__"


def substitute(args: list[str], n: int) -> list[str]:
    """`args` with every `__rand_int__` replaced by `n` as redis-benchmark writes it."""
    return [a.replace(RAND, f"{n:012d}") for a in args]

# Commands whose first reply element is "limited" rather than "allowed".
INVERTED = {"CL.THROTTLE"}

FLOOR = "HSET"
FLOOR_ARGS = "f1 v1 f2 v2"

# RL.RELEASE, timed releasing a live lease (after an RL.ACQUIRE of `RELEASE_ACQUIRE` for the
# same id) and releasing nothing. Its hot key also holds `RELEASE_OTHERS` leases of other ids
# (an hour long), written before each run; a random key holds only the released lease.
RELEASE_COMMAND = "RL.RELEASE"
RELEASE_SCRIPT = "release.lua"
RELEASE_ACQUIRE = "10 3600"
RELEASE_ID = "w"
RELEASE_OTHERS = 9

# The command redis-cell provides, compared with ours of the same name.
CELL_COMMAND = "CL.THROTTLE"
CELL_LABEL = f"{CELL_COMMAND} (redis-cell)"


@dataclass
class Case:
    label: str  # command as shown in the table
    args: str  # arguments shown in the table
    keys: str  # "hot", "random" (from KEYSPACE) or "new" (from NEW_KEYSPACE)
    argv: list[str]  # redis-benchmark command line after the options
    stat: str  # commandstats entry to read, lower case
    limiter: str | None  # module command this case belongs to, or None for the floor
    lua: bool
    cell: bool = False  # runs on the redis-cell server
    note: str = ""  # shown after the arguments
    setup: list[list[str]] = field(default_factory=list)  # commands run before each run
    # Commands holding `__rand_int__`, sent for every number of the keyspace (as redis-benchmark
    # writes it under -r) through redis-cli --pipe after the setup: state on every random key.
    fill: list[list[str]] = field(default_factory=list)
    fill_payload: bytes = field(default=b"", repr=False)
    # If set, each call is sent right after this command, in pairs through redis-cli --pipe;
    # `n` then counts pairs and `rps` is pairs per second.
    before: list[str] | None = None
    # For a floor-module row on new keys: the limiter whose keys it names and keeps as long.
    floor_of: str | None = None
    payload: bytes = field(default=b"", repr=False)  # the pairs of the last run
    payload_n: int = 0  # how many
    n: int = 0
    usec: list[float] = field(default_factory=list)
    rps: list[float] = field(default_factory=list)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A redis-server process, talked to with redis-cli."""

    def __init__(
        self,
        module: Path,
        workdir: Path,
        pin: list[str],
        also: Path | None = None,
        binary: str = "redis-server",
    ):
        self.port = free_port()
        self.workdir = workdir
        argv = pin + [
            binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(workdir),
            "--logfile", str(workdir / "redis.log"),
            "--loadmodule", str(module),
            *(["--loadmodule", str(also)] if also else []),
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
    """One run on an empty database (after the case's setup): (server usec per call, requests/s,
    or pairs/s for a case sent in pairs)."""
    server.cli("FLUSHALL")
    for command in case.setup:
        server.cli(*command)
    if case.fill:
        fill_keyspace(server, case)
    if case.before:
        rps = run_pairs(server, case, n, pin)
    else:
        rps = run_benchmark(server, case, n, pin)
    calls, usec, failed = command_stats(server, case.stat)
    # redis-benchmark sends whole pipelines, so a few more calls than -n may reach the server.
    if failed or not n <= calls <= n + PIPELINE * CLIENTS:
        raise SystemExit(
            f"{case.label} {case.args}: {calls} calls of {n} counted, {failed} failed; "
            f"check the arguments (redis-cli {' '.join(case.argv)})"
        )
    return usec / calls, rps


def fill_keyspace(server: Server, case: Case) -> None:
    """The case's fill commands for every number 0 ... KEYSPACE - 1, through redis-cli --pipe."""
    if not case.fill_payload:
        case.fill_payload = b"".join(
            resp(substitute(command, r)) for r in range(KEYSPACE) for command in case.fill
        )
    text = server.cli("--pipe", stdin=case.fill_payload, check=False)
    m = re.search(r"errors:\s*(\d+),\s*replies:\s*(\d+)", text)
    if not m or int(m.group(1)) != 0 or int(m.group(2)) != KEYSPACE * len(case.fill):
        raise SystemExit(f"filling the keyspace failed for {case.label} {case.note}: {text}")


def run_benchmark(server: Server, case: Case, n: int, pin: list[str]) -> float:
    """redis-benchmark sending the case's command `n` times, after CONFIG RESETSTAT:
    requests/s."""
    server.cli("CONFIG", "RESETSTAT")
    argv = pin + ["redis-benchmark", "-h", "127.0.0.1", "-p", str(server.port)]
    argv += ["-P", str(PIPELINE), "-c", str(CLIENTS), "-n", str(n), "--csv"]
    if any(RAND in a for a in case.argv):
        argv += ["-r", str(NEW_KEYSPACE if case.keys == "new" else KEYSPACE)]
    out = subprocess.run(argv + case.argv, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise SystemExit(f"redis-benchmark failed for {case.label}: {out.stderr}")
    rows = [r for r in csv.reader(io.StringIO(out.stdout)) if len(r) > 1 and r[0] != "test"]
    if not rows:
        raise SystemExit(f"no result from redis-benchmark for {case.label}:\n{out.stdout}")
    return float(rows[0][1])


def run_pairs(server: Server, case: Case, n: int, pin: list[str]) -> float:
    """`n` pairs of `case.before` and the case's command, with the same random number (from
    the keyspace of -r) in both, through redis-cli --pipe after CONFIG RESETSTAT: pairs/s, from
    the wall time of redis-cli. The pairs must leave the database as the setup left it."""
    if case.payload_n != n:
        rng = random.Random(n)
        case.payload = b"".join(
            resp(substitute(case.before, r)) + resp(substitute(case.argv, r))
            for r in (rng.randrange(KEYSPACE) for _ in range(n))
        )
        case.payload_n = n
    before = dataset(server)
    argv = pin + ["redis-cli", "-h", "127.0.0.1", "-p", str(server.port), "--pipe"]
    server.cli("CONFIG", "RESETSTAT")
    start = time.monotonic()
    out = subprocess.run(argv, input=case.payload, capture_output=True, timeout=600)
    elapsed = time.monotonic() - start
    text = out.stdout.decode(errors="replace")
    m = re.search(r"errors:\s*(\d+),\s*replies:\s*(\d+)", text)
    if out.returncode != 0 or not m or int(m.group(1)) != 0 or int(m.group(2)) != 2 * n:
        raise SystemExit(f"redis-cli --pipe failed for {case.label} {case.note}: {text}")
    after = dataset(server)
    if after != before:
        raise SystemExit(
            f"{case.label} {case.note}: the pairs left {after[:3]}..., not {before[:3]}..."
        )
    return n / elapsed


def dataset(server: Server) -> list[tuple[str, str, str]]:
    """Every key (sorted sets only) with its members, scores and expiry: a few keys at most
    where it is compared."""
    keys = sorted(server.cli("KEYS", "*").split())
    return [
        (k, server.cli("ZRANGE", k, "0", "-1", "WITHSCORES"), server.cli("PEXPIRETIME", k))
        for k in keys[:1000]
    ] + [("keys", str(len(keys)), "")]


def check_decisions(server: Server, limiter: Limiter, sha: str | None) -> None:
    """The admit and steady arguments keep admitting; the deny arguments deny from the second
    call on."""
    yes, no = (["0"], ["1"]) if limiter.command in INVERTED else (["1"], ["0"])
    for lua in ([False, True] if sha else [False]):
        prefix = ["EVALSHA", sha, "1"] if lua else [limiter.command]
        who = "Lua twin" if lua else limiter.command
        server.cli("FLUSHALL")
        for args in [limiter.admit, limiter.steady]:
            for i in range(3):
                argv = substitute(args.split(), i)
                reply = server.cli(*prefix, f"check:{args}", *argv).split()
                if reply[:1] != yes:
                    raise SystemExit(f"{who} {args}: expected admitted, got {reply}")
        # A `__rand_int__` takes another value in the second call (another lease id).
        replies = [
            server.cli(*prefix, "check:deny", *substitute(limiter.deny.split(), i)).split()
            for i in range(2)
        ]
        if replies[0][:1] != yes or replies[1][:1] != no:
            raise SystemExit(f"{who} {limiter.deny}: expected admitted then denied, got {replies}")


def limiter_cases(
    lim: Limiter, head: list[str], label: str, stat: str, prefix: str, lua: bool, cell: bool
) -> list[Case]:
    """One limiter's cases (admits on a hot key, on random keys and on new keys, a hot denial,
    steady random keys), each called as `head + [key] + arguments`, with keys named
    `prefix:command:kind:...`."""
    tag = lim.command.split(".")[-1].lower()
    variants = [
        ("admit", "hot", lim.admit),
        ("admit", "random", lim.admit),
        ("admit", "new", lim.admit),
        ("deny", "hot", lim.deny),
        ("steady", "random", lim.steady),
    ]
    cases = []
    for kind, keys, args in variants:
        key = f"{prefix}:{tag}:{kind}:" + ("hot" if keys == "hot" else "{__rand_int__}")
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


def release_cases(head: list[str], label: str, stat: str, prefix: str, lua: bool) -> list[Case]:
    """RL.RELEASE (or its twin, `head`) of a live lease, each call right after an RL.ACQUIRE of
    the same id, on a hot key that also holds other ids' leases and on random keys where it is
    the only lease; then releasing nothing on that hot key and on random keys (no key)."""
    cases = []
    for held in [True, False]:
        for keys in ["hot", "random"]:
            kind = "held" if held else "none"
            key = f"{prefix}:release:{kind}:" + ("{__rand_int__}" if keys == "random" else "hot")
            setup = []
            if keys == "hot":
                setup = [
                    ["RL.ACQUIRE", key, *RELEASE_ACQUIRE.split(), f"other:{i}"]
                    for i in range(RELEASE_OTHERS)
                ]
            before = ["RL.ACQUIRE", key, *RELEASE_ACQUIRE.split(), RELEASE_ID] if held else None
            cases.append(
                Case(
                    label=label,
                    args=RELEASE_ID,
                    keys=keys,
                    argv=head + [key, RELEASE_ID],
                    stat=stat,
                    limiter=RELEASE_COMMAND,
                    lua=lua,
                    note="live lease" if held else "no lease",
                    setup=setup,
                    before=before,
                )
            )
    return cases


def check_release(server: Server, head: list[str], who: str) -> None:
    """Releasing the lease RL.ACQUIRE just took replies 1, releasing it again 0, on a key holding
    other leases too and on a key of its own; releasing on a missing key replies 0."""
    server.cli("FLUSHALL")
    for i in range(RELEASE_OTHERS):
        server.cli("RL.ACQUIRE", "check:release", *RELEASE_ACQUIRE.split(), f"other:{i}")
    for key in ["check:release", "check:alone"]:
        got = server.cli("RL.ACQUIRE", key, *RELEASE_ACQUIRE.split(), RELEASE_ID).split()[:1]
        got += [server.cli(*head, key, RELEASE_ID) for _ in range(2)]
        if got != ["1", "1", "0"]:
            raise SystemExit(f"{who} on {key}: expected acquired, released, nothing; got {got}")
    if server.cli(*head, "check:missing", RELEASE_ID) != "0":
        raise SystemExit(f"{who} on a missing key: expected 0")
    left = server.cli("ZCARD", "check:release"), server.cli("EXISTS", "check:alone")
    if left != (str(RELEASE_OTHERS), "0"):
        raise SystemExit(f"{who}: left {left} (other leases, the lone key)")


# RL.SETTLE. A token budget of 10^9 refilling 1 per second, whose every key holds a reservation
# of 10^8 (RL.TOKENBUCKET with that cost, written before each run: a setup command on the hot
# key, a fill of the whole keyspace for random keys), refunded or charged 5 units a call: a run
# sends at most 2,000,000 calls, 10^7 units, so refunds never reach the capacity and charges
# never reach the debt floor (-capacity), and every call writes. Then two limits settled in one
# call (a token bucket and a sliding window of a day, each reserved the same way) on two random
# keys, which redis-benchmark draws independently (it replaces each `__rand_int__` of a command
# with its own number); a sliding log refunded right after an admission of 5 on a hot key
# seeded with 10 entries (pairs through redis-cli --pipe, which must leave the log as seeded);
# a sliding log of 1 ms charged on a hot key (each call drops what left the window, adds 5).
SETTLE_COMMAND = "RL.SETTLE"
SETTLE_SCRIPT = "settle.lua"
SETTLE_BUCKET = "TOKENBUCKET 1000000000 1"
SETTLE_WINDOW = "SLIDINGWINDOW 1000000000 86400"
SETTLE_RESERVED = "100000000"


@dataclass(frozen=True)
class Settlement:
    """One RL.SETTLE case: `limits` ("ALGORITHM params", one key each) settled by `delta`."""

    name: str  # part of the key names
    keys: str  # "hot" or "random"
    limits: tuple[str, ...]
    delta: int
    note: str
    reserve: bool = True  # each key first holds a reservation of SETTLE_RESERVED
    seed: str = ""  # if set, the hot key is first admitted with this cost (setup)
    admit: str = ""  # if set, each call comes right after an admission of this cost (pairs)


SETTLEMENTS = [
    Settlement("tb", "hot", (SETTLE_BUCKET,), -5, "refund"),
    Settlement("tb", "random", (SETTLE_BUCKET,), -5, "refund"),
    Settlement("tb", "hot", (SETTLE_BUCKET,), 5, "charge"),
    Settlement("tb", "random", (SETTLE_BUCKET,), 5, "charge"),
    Settlement("two", "random", (SETTLE_BUCKET, SETTLE_WINDOW), -5, "refund, two keys"),
    Settlement(
        "log", "hot", ("SLIDINGLOG 10000 3600",), -5, "refund after an admission of 5",
        reserve=False, seed="10", admit="5",
    ),
    Settlement("log", "hot", ("SLIDINGLOG 10000 0.001",), 5, "charge", reserve=False),
]  # fmt: skip


def limit_call(key: str, limit: str, cost: str) -> list[str]:
    """The limit's own command (`RL.<ALGORITHM> key params cost`)."""
    keyword, *params = limit.split()
    return [f"RL.{keyword}", key, *params, cost]


def settle_keys(s: Settlement, prefix: str) -> list[str]:
    kind = "refund" if s.delta < 0 else "charge"
    last = "{__rand_int__}" if s.keys == "random" else "hot"
    return [f"{prefix}:settle:{s.name}:{kind}:{i}:{last}" for i in range(len(s.limits))]


def settle_argv(head: list[str], s: Settlement, keys: list[str], delta: int) -> list[str]:
    limits = " ".join(s.limits).split()
    return head + [str(len(keys)), *keys, *limits, "DELTA", str(delta)]


def settle_state(s: Settlement, keys: list[str]) -> list[list[str]]:
    """What the keys hold before a run: reservations, or a seeded log."""
    calls = []
    if s.reserve:
        calls += [limit_call(k, lim, SETTLE_RESERVED) for k, lim in zip(keys, s.limits)]
    if s.seed:
        calls.append(limit_call(keys[0], s.limits[0], s.seed))
    return calls


def settle_cases(head: list[str], label: str, stat: str, prefix: str, lua: bool) -> list[Case]:
    """RL.SETTLE (or its twin, `head` without numkeys) for every settlement of SETTLEMENTS."""
    cases = []
    for s in SETTLEMENTS:
        keys = settle_keys(s, prefix)
        state = settle_state(s, keys)
        cases.append(
            Case(
                label=label,
                args=f"{' '.join(s.limits)} DELTA {s.delta}",
                keys=s.keys,
                argv=settle_argv(head, s, keys, s.delta),
                stat=stat,
                limiter=SETTLE_COMMAND,
                lua=lua,
                note=s.note,
                setup=state if s.keys == "hot" else [],
                fill=state if s.keys == "random" else [],
                before=limit_call(keys[0], s.limits[0], s.admit) if s.admit else None,
            )
        )
    return cases


def check_settle(server: Server, head: list[str], who: str) -> None:
    """Each settlement, on keys prepared as its runs prepare them (a random row with one
    number), replies one five-integer array per limit, admitted with no wait, and moves every
    limit's remaining by -delta against a DELTA 0 report just before it (one unit more for a
    token bucket's refill in between); a refund on a missing key changes nothing."""
    for s in SETTLEMENTS:
        server.cli("FLUSHALL")
        keys = substitute(settle_keys(s, "check"), 7)
        for call in settle_state(s, keys):
            server.cli(*call)
        if s.admit:
            server.cli(*limit_call(keys[0], s.limits[0], s.admit))
        replies = []
        for delta in [0, s.delta]:
            reply = [int(x) for x in server.cli(*settle_argv(head, s, keys, delta)).split()]
            if len(reply) != 5 * len(keys) or any(
                reply[i] != 1 or reply[i + 2] != 0 for i in range(0, len(reply), 5)
            ):
                raise SystemExit(f"{who} {s.limits} DELTA {delta}: unexpected reply {reply}")
            replies.append(reply[1::5])
        moved = [after - before for before, after in zip(*replies)]
        slack = [1 if lim.startswith("TOKENBUCKET") else 0 for lim in s.limits]
        if not all(-s.delta <= m <= -s.delta + e for m, e in zip(moved, slack)):
            raise SystemExit(
                f"{who} {s.limits} DELTA {s.delta}: remaining moved by {moved} ({replies})"
            )
    server.cli("FLUSHALL")
    reply = server.cli(*head, "1", "check:missing", *SETTLE_BUCKET.split(), "DELTA", "-5").split()
    if reply[1:2] != [SETTLE_BUCKET.split()[1]] or server.cli("DBSIZE") != "0":
        raise SystemExit(f"{who}: a refund on a missing key replied {reply} or wrote a key")


def check_rand_draws(server: Server) -> None:
    """redis-benchmark replaces each `__rand_int__` of a command with a number of its own, so the
    two keys of a two-limit settlement are independent random keys: 200 HSETs of a key and a
    value, both `__rand_int__`, must store values that differ from their keys' numbers."""
    server.cli("FLUSHALL")
    argv = ["redis-benchmark", "-h", "127.0.0.1", "-p", str(server.port), "-c", "1", "-n", "200"]
    argv += ["-r", str(KEYSPACE), "HSET", "draw:{__rand_int__}", "v", RAND]
    subprocess.run(argv, capture_output=True, timeout=60, check=True)
    keys = server.cli("KEYS", "draw:*").split()
    same = sum(server.cli("HGET", k, "v") == k[len("draw:{") : -1] for k in keys)
    if len(keys) < 150 or same > 2:
        raise SystemExit(f"redis-benchmark: {same} of {len(keys)} keys drew their value's number")
    server.cli("FLUSHALL")


def floor_cases(label: str, cell: bool = False) -> list[Case]:
    """HSET on a hot key, on random keys and on new keys."""
    cases = []
    for keys in ["hot", "random", "new"]:
        key = "floor:hot" if keys == "hot" else "floor:{__rand_int__}"
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
    if server.has_command(RELEASE_COMMAND):
        check_release(server, [RELEASE_COMMAND], RELEASE_COMMAND)
        cases += release_cases(
            [RELEASE_COMMAND], RELEASE_COMMAND, RELEASE_COMMAND.lower(), "rl", lua=False
        )
        script = LUA_DIR / RELEASE_SCRIPT
        if script.is_file():
            shas[RELEASE_COMMAND] = server.cli("-x", "SCRIPT", "LOAD", stdin=script.read_bytes())
            # Only the release is EVALSHA: the acquires before it stay RL.ACQUIRE, which stores
            # what the twin would, so evalsha's entry counts the release twin alone.
            head = ["EVALSHA", shas[RELEASE_COMMAND], "1"]
            label = f"{RELEASE_COMMAND} (Lua twin)"
            check_release(server, head, label)
            cases += release_cases(head, label, "evalsha", "lua", lua=True)
        else:
            notes.append(f"{RELEASE_COMMAND}: no lua-reference/{RELEASE_SCRIPT}, Lua twin skipped")
    else:
        notes.append(f"{RELEASE_COMMAND}: not in the loaded module, skipped")
    if server.has_command(SETTLE_COMMAND):
        check_rand_draws(server)
        check_settle(server, [SETTLE_COMMAND], SETTLE_COMMAND)
        cases += settle_cases(
            [SETTLE_COMMAND], SETTLE_COMMAND, SETTLE_COMMAND.lower(), "rl", lua=False
        )
        script = LUA_DIR / SETTLE_SCRIPT
        if script.is_file():
            shas[SETTLE_COMMAND] = server.cli("-x", "SCRIPT", "LOAD", stdin=script.read_bytes())
            # The admissions before a sliding log's refunds stay RL.SLIDINGLOG, as for releases.
            head = ["EVALSHA", shas[SETTLE_COMMAND]]
            label = f"{SETTLE_COMMAND} (Lua twin)"
            check_settle(server, head, label)
            cases += settle_cases(head, label, "evalsha", "lua", lua=True)
        else:
            notes.append(f"{SETTLE_COMMAND}: no lua-reference/{SETTLE_SCRIPT}, Lua twin skipped")
    else:
        notes.append(f"{SETTLE_COMMAND}: not in the loaded module, skipped")
    cases += floor_cases(f"{FLOOR} (floor)")
    return cases, shas, notes


# benches/floor_module.c: only the server calls of an admitted and of a denied RL.TOKENBUCKET
# call on a hot key (the denied key holds a value of the same length, with an expiry far ahead).
FLOOR_MODULE_CASES = [
    ("FLOOR.ADMIT", []),
    ("FLOOR.DENY", [["SET", "floor:api:hot", "0 1796156770512147", "PX", "100000000"]]),
]


def floor_module_cases() -> list[Case]:
    """The floor module's hot-key rows, then for every limiter an admitted call on new keys
    named as that limiter's new-key rows name theirs (a key's length moves the server's cost),
    living as long as that limiter's do (`NEW_KEY_LIFE_MS`)."""
    cases = [
        Case(
            label=f"{command} (server calls only)",
            args="",
            keys="hot",
            argv=[command, "floor:api:hot"],
            stat=command.lower(),
            limiter=command,
            lua=False,
            setup=setup,
        )
        for command, setup in FLOOR_MODULE_CASES
    ]
    for lim in LIMITERS:
        tag = lim.command.split(".")[-1].lower()
        ttl_ms = NEW_KEY_LIFE_MS.get(lim.command, "2")
        cases.append(
            Case(
                label="FLOOR.ADMIT (server calls only)",
                args=f"ttl {ttl_ms} ms",
                keys="new",
                argv=["FLOOR.ADMIT", f"rl:{tag}:admit:{{__rand_int__}}", ttl_ms],
                stat="floor.admit",
                limiter="FLOOR.ADMIT",
                lua=False,
                note=f"keys named as {lim.command}'s",
                floor_of=lim.command,
            )
        )
    return cases


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
    payload = b"".join(
        resp(head + [f"mem:{i:06d}"] + substitute(args, i)) for i in range(count)
    )
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
# (A log holds at most 10,000 entries: the larger is seeded with 9,000 so that the admitted
# calls' limit, its size plus the calls, stays within it.)
LOG_SIZES = [10, 9_000]
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
    # With an expiry, as every log the module writes has (a set without one is refused).
    commands.append(resp(["PEXPIRE", key, "3600000"]))
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
        raise SystemExit(
            f"{' '.join(head)} on a log of {size}: {n} calls, {failed} failed, {first}"
        )
    return usec / n


def log_size_table(server: Server, shas: dict[str, str], rounds: int) -> list[str]:
    """RL.SLIDINGLOG and its twin on a key of 10 entries and one of 9,000, admitted and
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


# The most-denied keys (RL.TOP): every denial does a hash lookup and an ordered-set update while
# `ratelimit.top-slots` is above 0. Each row runs with the default number of slots and with
# tracking off, both in every round (in alternating order), on a fresh database each run.
TOP_CONFIG = "ratelimit.top-slots"
TOP_SLOTS_ON = 128
TOP_COMMAND = "RL.TOP"


@dataclass
class TopRow:
    """One row of the tracking comparison: the same case run with tracking on and off."""

    on: Case
    off: Case
    expect: str  # "hot" (one key, every call but the first denied), "random" (every call a
    # denial of a different key), "none" (admitted calls, nothing tracked)
    seen: dict[bool, str] = field(default_factory=dict)  # RL.TOP after the latest run, on/off
    ratios: list[float] = field(default_factory=list)  # on ÷ off within each round


def top_rows() -> list[TopRow]:
    """RL.TOKENBUCKET and RL.GCRA denying a hot key; RL.TOKENBUCKET denying random keys that a
    fill of the whole keyspace has emptied (its first call on each takes the only token, and
    none comes back for 1000 s), so every timed call is a denial of one of 100,000 keys and
    nearly every one replaces a slot; RL.TOKENBUCKET admitting a hot key (not tracked), with a
    bucket no run drains."""
    spec = [
        ("RL.TOKENBUCKET", "1 0.001", "hot", "hot"),
        ("RL.GCRA", "0 1 1000", "hot", "hot"),
        ("RL.TOKENBUCKET", "1 0.001", "random", "random"),
        # A million tokens, refilled at a million a second: no run drains it, however fast the
        # calls come (a bucket of 100 could, and then its denials would be tracked).
        ("RL.TOKENBUCKET", "1000000 1000000", "hot", "none"),
    ]
    rows = []
    for command, args, keys, expect in spec:
        tag = command.split(".")[-1].lower()
        kind = "admit" if expect == "none" else "deny"
        key = f"top:{tag}:{kind}:" + ("{__rand_int__}" if keys == "random" else "hot")
        argv = [command, key] + args.split()
        fill = [argv] if keys == "random" else []
        note = "keys emptied first" if keys == "random" else ""
        on, off = (
            Case(label=command, args=args, keys=keys, argv=argv, stat=command.lower(),
                 limiter=command, lua=False, note=note, fill=fill)
            for _ in range(2)
        )  # fmt: skip
        rows.append(TopRow(on, off, expect))
    return rows


def top_entries(server: Server, count: int) -> list[tuple[str, int]]:
    """(key, denied) of each entry of RL.TOP `count`, most first."""
    lines = server.cli(TOP_COMMAND, str(count)).splitlines()
    if len(lines) % 6:
        raise SystemExit(f"{TOP_COMMAND} {count}: unexpected reply {lines[:12]}")
    return [(lines[i], int(lines[i + 1])) for i in range(0, len(lines), 6)]


def run_top(server: Server, row: TopRow, on: bool, n: int, pin: list[str]) -> tuple[float, float]:
    """One run of the row with tracking on or off, from an empty RL.TOP, then a check that it
    tracked exactly the run's denials, or nothing."""
    case = row.on if on else row.off
    slots = str(TOP_SLOTS_ON if on else 0)
    server.cli("CONFIG", "SET", TOP_CONFIG, slots)
    if server.cli("CONFIG", "GET", TOP_CONFIG).split()[-1:] != [slots]:
        raise SystemExit(f"CONFIG SET {TOP_CONFIG} {slots} did not take")
    server.cli(TOP_COMMAND, "RESET")
    usec, rps = run_case(server, case, n, pin)
    calls, _, _ = command_stats(server, case.stat)
    entries = top_entries(server, TOP_SLOTS_ON)
    hot_key = case.argv[1]
    if not on or row.expect == "none":
        ok, seen = not entries, "empty"
    elif row.expect == "hot":
        # The first call of the run took the token; each later one was denied.
        ok = entries == [(hot_key, calls - 1)]
        seen = f"`{hot_key}`: {calls - 1:,} denials (every call but the first)"
    else:
        total = sum(d for _, d in entries)
        prefix = hot_key.split("{")[0]
        ok = (
            len(entries) == TOP_SLOTS_ON
            and total == calls
            and all(k.startswith(prefix) for k, _ in entries)
        )
        seen = f"{len(entries)} keys, counts summing to {total:,} = the run's calls"
    if not ok:
        state = "on" if on else "off"
        raise SystemExit(
            f"{case.label} {case.args} ({case.keys}), tracking {state}: {calls} calls, "
            f"{TOP_COMMAND} holds {entries[:3]}... ({len(entries)} entries)"
        )
    row.seen[on] = seen
    return usec, rps


def top_table(server: Server, rounds: int, budget: float, pin: list[str]) -> tuple[list[str], str]:
    """The tracking comparison (Markdown lines) and a line on how it ran, or nothing when the
    module has no RL.TOP; `budget` is the seconds of all its timed runs together (--budget,
    at least 15 rounds). Tracking is left at its default afterwards."""
    rows = [r for r in top_rows() if server.has_command(r.on.label)]
    if not rows or not server.has_command(TOP_COMMAND):
        return [], ""
    started = time.monotonic()
    per_run = budget / (rounds * 2 * len(rows))
    batch = PIPELINE * CLIENTS
    for row in rows:
        _, rps = run_top(server, row, True, 20_000, pin)
        run_top(server, row, False, 20_000, pin)
        row.on.n = int(min(max(rps * per_run, 20_000), 2_000_000)) // batch * batch
    for r in range(rounds):
        print(f"tracking round {r + 1}/{rounds}", file=sys.stderr)
        for row in rows:
            # Alternating which goes first, so neither always runs right after another row.
            for on in ([True, False] if r % 2 == 0 else [False, True]):
                usec, rps = run_top(server, row, on, row.on.n, pin)
                case = row.on if on else row.off
                case.usec.append(usec)
                case.rps.append(rps)
            row.ratios.append(row.on.usec[-1] / row.off.usec[-1])
    server.cli("CONFIG", "SET", TOP_CONFIG, str(TOP_SLOTS_ON))
    lines = [
        f"| command | arguments | keys | µs/call, {TOP_SLOTS_ON} slots | µs/call, off "
        "| on − off | on ÷ off | on ÷ off per round (range) | requests/s on / off "
        "| RL.TOP after a run: on / off |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        on, off = statistics.median(row.on.usec), statistics.median(row.off.usec)
        note = f", {row.on.note}" if row.on.note else ""
        kind = "admitted" if row.expect == "none" else "denied"
        lines.append(
            f"| {row.on.label} | `{row.on.args}`{note} | {row.on.keys}, {kind} | "
            f"{on:.2f} ({min(row.on.usec):.2f}–{max(row.on.usec):.2f}) | "
            f"{off:.2f} ({min(row.off.usec):.2f}–{max(row.off.usec):.2f}) | "
            f"{on - off:+.2f} | {on / off:.3f} | "
            f"{statistics.median(row.ratios):.3f} "
            f"({min(row.ratios):.2f}–{max(row.ratios):.2f}) | "
            f"{statistics.median(row.on.rps):,.0f} / {statistics.median(row.off.rps):,.0f} | "
            f"{row.seen[True]} / {row.seen[False]} |"
        )
    runs = ", ".join(f"{r.on.n:,}" for r in rows)
    how = (
        f"{TOP_CONFIG} {TOP_SLOTS_ON} against 0, both in each of {rounds} rounds (alternating "
        f"which runs first), medians; -n per row: {runs}; {time.monotonic() - started:.0f} s"
    )
    return lines, how


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
        (c.limiter, c.args, c.keys, c.note): med[id(c)][0]
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
        twin_of = module.get((c.limiter, c.args, c.keys, c.note)) if c.lua or c.cell else None
        vs_module = usec / twin_of if twin_of else None
        note = f", {c.note}" if c.note else ""
        unit = " pairs/s" if c.before else ""
        lines.append(
            f"| {c.label} | {f'`{c.args}`' if c.args else '—'}{note} | {c.keys} | {usec:.2f} | "
            f"{min(c.usec):.2f}–{max(c.usec):.2f} | {rps:,.0f}{unit} | "
            f"{fmt_ratio(vs_floor)} | {fmt_ratio(vs_module)} |"
        )
    lines += new_key_bound(cases, med)
    if not memory:
        return lines
    lines += [
        "",
        "| memory | arguments | keys | used_memory per key (bytes) | MEMORY USAGE of one key |",
        "|---|---|---:|---:|---:|",
    ]
    for label, args, keys, per_key, sample in memory:
        lines.append(f"| {label} | `{args}` | {keys:,} | {per_key:.1f} | {sample} |")
    return lines


# How long a key written on a new key lives with the arguments of the new-key rows, as the floor
# module's `ttl_ms` (its key expires at the current millisecond + ttl_ms): a GCRA's time is
# reached within the millisecond; a refilled bucket, a 1 ms log window or lease expire at the
# next millisecond + 1; a fixed window lives its second; a sliding window 1 to 2 s (its floor
# here, of 1 s, is lower than its own). The floor module's row of that key life is the least any
# module can take there: the server's work on a keyspace of that many live keys.
NEW_KEY_LIFE_MS = {
    "RL.GCRA": "1",
    "CL.THROTTLE": "1",
    "RL.FIXEDWINDOW": "1000",
    "RL.SLIDINGWINDOW": "1000",
}


def new_key_bound(cases: list[Case], med: dict[int, tuple[float, float]]) -> list[str]:
    """Each twin's new-key row against its module's and against the floor module's row of the
    same key life: twin ÷ floor is the most twin ÷ module could be, whatever the module's own
    code cost."""
    floors = {c.floor_of: med[id(c)][0] for c in cases if c.floor_of}
    if not floors:
        return []
    module = {c.limiter: med[id(c)][0] for c in cases
              if c.keys == "new" and c.limiter and not c.lua and not c.cell}
    lines = [
        "",
        "| a new key every call | Lua twin µs | module µs | twin ÷ module | key life | floor "
        "module µs | twin ÷ floor |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for c in cases:
        if not (c.lua and c.keys == "new" and c.limiter in module):
            continue
        life = NEW_KEY_LIFE_MS.get(c.limiter, "2")
        floor = floors.get(c.limiter)
        if floor is None:
            continue
        twin, mod = med[id(c)][0], module[c.limiter]
        lines.append(
            f"| {c.limiter} | {twin:.2f} | {mod:.2f} | {twin / mod:.1f}× | {life} ms | "
            f"{floor:.2f} | {twin / floor:.1f}× |"
        )
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
    ap.add_argument(
        "--floor-module",
        type=Path,
        metavar="PATH",
        help="benches/floor_module.c built: rows of the server calls alone (FLOOR.ADMIT/DENY)",
    )
    ap.add_argument("--memory-keys", type=int, default=100_000, help="keys per memory measurement")
    ap.add_argument("--quick", action="store_true", help="3 short rounds and 20,000 memory keys")
    ap.add_argument("--criterion-dir", type=Path, help="also tabulate criterion results found here")
    ap.add_argument(
        "--log-sizes-only",
        action="store_true",
        help=f"only the {LOG_COMMAND} rows on a small and a large key",
    )
    ap.add_argument(
        "--new-keys-only",
        action="store_true",
        help="only the rows of a new key every call (the limiters, their twins, HSET and the "
        "floor module's), without the tracking, log-size and memory tables",
    )
    ap.add_argument(
        "--top-only",
        action="store_true",
        help=f"only the rows with {TOP_CONFIG} {TOP_SLOTS_ON} against 0",
    )
    opts = ap.parse_args()
    if opts.quick:
        opts.rounds, opts.budget, opts.memory_keys = 3, 20.0, 20_000
    opts.rounds = max(opts.rounds, 3)
    # Tracking's cost is a few percent of a call, below what one round's noise moves here: more
    # rounds, with the whole budget, keep its medians steady.
    top_rounds = max(opts.rounds, 15)

    for tool in ["redis-server", "redis-cli", "redis-benchmark"]:
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} not found (make deps installs it)")
    module = opts.module.resolve()
    if not module.is_file():
        raise SystemExit(f"module not found: {module} (build it with cargo build --release)")
    floor_module = opts.floor_module.resolve() if opts.floor_module else None
    if floor_module and not floor_module.is_file():
        raise SystemExit(f"floor module not found: {floor_module}")
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
        server = Server(module, Path(tmp), server_pin, also=floor_module)
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
                    source = script.read_bytes()
                    shas[LOG_COMMAND] = server.cli("-x", "SCRIPT", "LOAD", stdin=source)
                print("\n".join(log_size_table(server, shas, opts.rounds)))
                return 0
            if opts.top_only:
                top, how = top_table(server, top_rounds, opts.budget, bench_pin)
                if not top:
                    raise SystemExit(f"the loaded module has no {TOP_COMMAND}")
                print()
                print(machine_line(pinned))
                print()
                print(f"redis-benchmark -P {PIPELINE} -c {CLIENTS}; {how}")
                print()
                print("\n".join(top))
                return 0
            cases, shas, notes = build_cases(server)
            if floor_module:
                cases += floor_module_cases()
            for note in notes:
                print(f"note: {note}", file=sys.stderr)
            if cell:
                cell.wait_ready()
                cases = merge_cell_cases(cases, build_cell_cases(cell))
            if opts.new_keys_only:
                # Writing a key it has not seen is where a module and its twin pay the same
                # server work (a key added to a growing keyspace, its expiry, new allocations):
                # more rounds of these rows alone, next to the floor module's.
                cases = [c for c in cases if c.keys == "new"]

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

            if opts.new_keys_only:
                top, top_how, log_sizes, memory = [], "", [], []
            else:
                top, top_how = top_table(server, top_rounds, opts.budget, bench_pin)
                log_sizes = log_size_table(server, shas, max(opts.rounds, 5))
                memory = measure_memory(server, cases, shas, opts.memory_keys, cell)
        finally:
            server.stop()
            if cell:
                cell.stop()

    lines = render(cases, memory)
    if top:
        lines += ["", f"Most-denied keys: {top_how}", ""] + top
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
        f"redis-benchmark -P {PIPELINE} -c {CLIENTS}, random keys from {KEYSPACE:,} and new keys "
        f"from {NEW_KEYSPACE:,} (-r); "
        f"{opts.rounds} interleaved rounds, medians; -n per case (pairs through redis-cli "
        f"--pipe for a live lease's release and a sliding log's refund after an admission): "
        f"{runs}; "
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
