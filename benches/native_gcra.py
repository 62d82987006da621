#!/usr/bin/env python3
"""RL.GCRA, CL.THROTTLE and every limiter's denial against Redis's own native GCRA command.

NATIVE_GCRA_SERVER names a redis-server built from the Redis source that still registers a
native `GCRA` command (see the anchors' build script); this script starts that one binary with
the module loaded, so the built-in command and the module's are timed on the same server, in the
same interleaved rounds (server CPU per call from INFO commandstats, medians), next to HSET.

Three paths, as a limiter meets them: admitted on a hot key, denied on a hot key (the key's
limit spent by its first call; the path a flood of refused requests takes), and a new key every
call. The native command's syntax is `GCRA key max_burst requests_per_period period_sec`, the
same parameters as RL.GCRA and CL.THROTTLE take. Then the denial of every other limiter, each
divided by the native denial.

With --floor-module PATH (benches/floor_module.c, built by `make bench`) the same server also
runs FLOOR.ADMIT and FLOOR.DENY: only the module-API calls an admitted and a denied call on a
hot key make (open, read in place, rewrite, expiry, events, one propagated SET, five integers
replied), so the table shows what no module command can go below, next to the native command;
and FLOOR.LOGDENY, the calls a denial on a sorted set (RL.SLIDINGLOG's) cannot skip, the floor
of that limiter's row in the denials table.

Usage: python3 benches/native_gcra.py --server PATH [--module PATH] [--floor-module PATH]
                                      [--rounds N] [--budget S]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import server_bench as sb  # noqa: E402

# (label, path, argv after the command name with `{k}` for the key).
ADMIT = "1000000 1000000 1"
DENY = "0 1 1000"
PATHS = [
    ("admitted, hot key", "hot", ADMIT),
    ("denied, hot key", "deny", DENY),
    ("a new key every call", "new", ADMIT),
]
# The module's GCRA-like commands compared path by path with the native one.
COMPARED = ["RL.GCRA", "CL.THROTTLE"]
# Every limiter's denial on a hot key, against the native denial.
DENIALS = [
    ("RL.TOKENBUCKET", "1 0.001"),
    ("RL.LEAKYBUCKET", "1 0.001"),
    ("RL.FIXEDWINDOW", "1 1000"),
    ("RL.SLIDINGWINDOW", "1 1000"),
    ("RL.SLIDINGLOG", "1 1000"),
    ("RL.GCRA", DENY),
    ("CL.THROTTLE", DENY),
]
# Token bucket, the most used limiter, on all three paths too.
BUCKET = {"hot": "1000000 1000000", "deny": "1 0.001", "new": "1000000 1000000"}


def case(command: str, path: str, args: str) -> sb.Case:
    key = {"hot": "hot", "deny": "deny", "new": f"new:{sb.RAND}"}[path]
    return sb.Case(
        label=command,
        args=args,
        keys="new" if path == "new" else "hot",
        argv=[command, key, *args.split()],
        stat=command.lower(),
        limiter=None,
        lua=False,
        note=path,
    )


# A denied token bucket's value on the floor module's key: the same length, a time far ahead.
FLOOR_DENY_SETUP = ["SET", "deny", "0 1796156770512147", "PX", "100000000"]
# A one-entry sliding log as RL.SLIDINGLOG writes it: one member `<t>:0` at score t, an expiry.
FLOOR_LOG_SETUP = [
    ["ZADD", "logdeny", "1796156770512147", "1796156770512147:0"],
    ["PEXPIRE", "logdeny", "100000000"],
]
# The floor of each limiter's denial: the sorted-set one for the sliding log, else the string one.
DENIAL_FLOOR = {"RL.SLIDINGLOG": "FLOOR.LOGDENY"}


def build(server: sb.Server, floor: bool) -> list[sb.Case]:
    if not server.has_command("GCRA"):
        raise SystemExit("this redis-server has no native GCRA command")
    cases = [case("HSET", "hot", sb.FLOOR_ARGS)]
    if floor:
        deny = case("FLOOR.DENY", "deny", "")
        deny.setup = [FLOOR_DENY_SETUP]
        log_deny = case("FLOOR.LOGDENY", "deny", "")
        log_deny.setup = FLOOR_LOG_SETUP
        log_deny.argv = ["FLOOR.LOGDENY", "logdeny"]
        cases += [case("FLOOR.ADMIT", "hot", ""), deny, log_deny, case("FLOOR.ADMIT", "new", "")]
    for _, path, args in PATHS:
        cases.append(case("GCRA", path, args))
        for command in COMPARED:
            cases.append(case(command, path, args))
        cases.append(case("RL.TOKENBUCKET", path, BUCKET[path]))
    for command, args in DENIALS:
        if command not in ("RL.GCRA", "CL.THROTTLE", "RL.TOKENBUCKET"):
            cases.append(case(command, "deny", args))
    return cases


def median(c: sb.Case) -> float:
    return statistics.median(c.usec)


def render(cases: list[sb.Case]) -> list[str]:
    by = {(c.label, c.note): c for c in cases}
    native = {path: median(by[("GCRA", path)]) for _, path, _ in PATHS}
    hset = median(by[("HSET", "hot")])
    floor = {
        "hot": by.get(("FLOOR.ADMIT", "hot")),
        "deny": by.get(("FLOOR.DENY", "deny")),
        "new": by.get(("FLOOR.ADMIT", "new")),
    }
    head = "| path | native `GCRA` | `RL.GCRA` | ratio | `CL.THROTTLE` | ratio | `RL.TOKENBUCKET` | ratio |"
    rule = "|---|---:|---:|---:|---:|---:|---:|---:|"
    if floor["hot"]:
        head += " module-API floor | ratio |"
        rule += "---:|---:|"
    lines = [head, rule]
    for label, path, _ in PATHS:
        row = [label, f"{native[path]:.3f}"]
        for command in ["RL.GCRA", "CL.THROTTLE", "RL.TOKENBUCKET"]:
            us = median(by[(command, path)])
            row += [f"{us:.3f}", f"{us / native[path]:.2f}x"]
        if floor["hot"]:
            f = floor.get(path)
            row += [f"{median(f):.3f}", f"{median(f) / native[path]:.2f}x"] if f else ["—", "—"]
        lines.append("| " + " | ".join(row) + " |")
    lines += [
        "",
        f"`HSET` on a hot key: {hset:.3f} µs; native `GCRA` denied / `HSET`: "
        f"{native['deny'] / hset:.2f}x",
        "",
        "| denied, hot key | µs per call | ÷ native `GCRA` denied |"
        + (" module-API floor | ÷ native |" if floor["deny"] else ""),
        "|---|---:|---:|" + ("---:|---:|" if floor["deny"] else ""),
    ]
    for command, _ in DENIALS:
        us = median(by[(command, "deny")])
        line = f"| `{command}` | {us:.3f} | {us / native['deny']:.2f}x |"
        f = by.get((DENIAL_FLOOR.get(command, "FLOOR.DENY"), "deny"))
        if f:
            line += f" {median(f):.3f} | {median(f) / native['deny']:.2f}x |"
        lines.append(line)
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--server", type=Path, required=True, help="redis-server with native GCRA")
    ap.add_argument("--module", type=Path, default=sb.DEFAULT_MODULE, help="module .so to load")
    ap.add_argument("--floor-module", type=Path, help="benches/floor_module.c built")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (at least 3)")
    ap.add_argument("--budget", type=float, default=60.0, help="seconds of runs in all rounds")
    opts = ap.parse_args()
    opts.rounds = max(opts.rounds, 3)
    server_bin = opts.server.resolve()
    module = opts.module.resolve()
    floor = opts.floor_module.resolve() if opts.floor_module else None
    for path, what in [(server_bin, "server"), (module, "module"), (floor, "floor module")]:
        if path is None:
            continue
        if not path.is_file():
            raise SystemExit(f"{what} not found: {path}")
    if shutil.which("redis-benchmark") is None:
        raise SystemExit("redis-benchmark not found (make deps installs it)")
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) >= 2 and shutil.which("taskset"):
        server_pin, bench_pin = ["taskset", "-c", str(cpus[0])], ["taskset", "-c", str(cpus[1])]
        pinned = f"redis-server on CPU {cpus[0]}, redis-benchmark on CPU {cpus[1]}"
    else:
        server_pin, bench_pin, pinned = [], [], "not pinned"
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="rl-native-") as tmp:
        server = sb.Server(module, Path(tmp), server_pin, also=floor, binary=str(server_bin))
        try:
            server.wait_ready()
            cases = build(server, floor is not None)
            per_run = opts.budget / (opts.rounds * len(cases))
            batch = sb.PIPELINE * sb.CLIENTS
            for c in cases:
                _, rps = sb.run_case(server, c, 20_000, bench_pin)
                c.n = int(min(max(rps * per_run, 20_000), 2_000_000)) // batch * batch
            for r in range(opts.rounds):
                print(f"round {r + 1}/{opts.rounds}", file=sys.stderr)
                for c in cases:
                    usec, rps = sb.run_case(server, c, c.n, bench_pin)
                    c.usec.append(usec)
                    c.rps.append(rps)
        finally:
            server.stop()
    version = subprocess.run([str(server_bin), "--version"], capture_output=True, text=True)
    print()
    print(f"Native GCRA: {server_bin} ({version.stdout.strip()}), module {module}; {pinned}")
    print(
        f"redis-benchmark -P {sb.PIPELINE} -c {sb.CLIENTS}; {opts.rounds} interleaved rounds, "
        f"medians of INFO commandstats µs per call; {time.monotonic() - started:.0f} s"
    )
    print()
    print("\n".join(render(cases)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
