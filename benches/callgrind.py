#!/usr/bin/env python3
"""Instructions per call inside the command, counted by valgrind's callgrind.

Times on a shared 2-core machine move by tens of percent from run to run; instruction counts do
not. For each case this starts redis-server under `valgrind --tool=callgrind
--toggle-collect=call` (only what runs inside Redis's `call()`, the function that executes one
command, is counted), sends the case's calls with redis-benchmark (one connection, pipelined),
shuts the server down and divides the instructions collected by the number of calls.

With --proc only the command's own function is counted (`hsetCommand`, `evalShaCommand`, the
module command dispatcher), which is the span INFO commandstats times and `make bench` reports:
`call()` adds the same bookkeeping and propagation to every command, so counts inside it put
every command nearer to HSET than the server's CPU column does. With --sim callgrind also
simulates the caches and the branch predictor and the table adds first-level instruction-cache
misses and mispredicted branches per call, which cost time that instruction counts do not show.

Cases: for every limiter of numbers and CL.THROTTLE, an admitted call on a hot key, a denied call
on a hot key and a call on a new key, for the module and its Lua twin (EVALSHA); HSET as the
floor; RL.SLIDINGLOG denied on a hot key of one entry. With --floor-module PATH
(benches/floor_module.c, built by `make bench`) also FLOOR.ADMIT, FLOOR.DENY and FLOOR.LOGDENY
on a hot key: only the server calls of an admitted call, a denied one and a denied one on a
sorted set. Prints a Markdown table.

With --top it measures only what tracking the most-denied keys (RL.TOP) adds to a denial:
ratelimit.top-slots 128 against 0, on a hot key and on keys that all ran out first.

With --breakdown it shows where RL.GCRA's instructions go on each path (admitted and denied on a
hot key, a new key): inside the command's function, the instructions of every function it calls
(inclusive, per call, from callgrind_annotate), the module API's and the server's by name, and
the module's own code as what is left.

With --breakdown --native (and --server naming a redis-server built with the native GCRA command,
see benches/native_gcra.py) the same paths of the native `GCRA` are counted too, split into its
own work (its arguments parsed, its stored number read, the decision: `NATIVE_OWN`) and the
server calls it makes; with --floor-module also FLOOR.ADMIT / FLOOR.DENY on the same paths. The
sum of the floor and the native command's own work is what a module whose own code cost exactly
what the built-in command's does would take: the least this module could hope for.

Usage: python3 benches/callgrind.py [--module PATH] [--lua-dir DIR] [--server PATH]
                                    [--calls N] [--only SUBSTRING] [--top] [--proc] [--sim]
                                    [--floor-module PATH] [--breakdown [--native]]
"""

from __future__ import annotations

import argparse
import hashlib
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (command, twin script, arguments admitted on a hot key, arguments denied on a hot key after
# its first call, arguments that admit on new keys).
CASES = [
    ("RL.TOKENBUCKET", "token_bucket.lua", "100 1000000", "1 0.001", "100 1"),
    ("RL.LEAKYBUCKET", "leaky_bucket.lua", "100 1000000", "1 0.001", "100 1"),
    ("RL.FIXEDWINDOW", "fixed_window.lua", "1000000000 1", "1 1000", "100 1"),
    ("RL.SLIDINGWINDOW", "sliding_window.lua", "1000000000 1", "1 1000", "100 1"),
    ("RL.GCRA", "gcra.lua", "1000 500000 1", "0 1 1000", "100 1 1"),
    ("CL.THROTTLE", "throttle.lua", "1000 500000 1", "0 1 1000", "100 1 1"),
]


# A denied token bucket's key for FLOOR.DENY: the same length of value, an expiry far ahead.
FLOOR_DENY_SETUP = ["SET", "hot", "0 1796156770512147", "PX", "100000000"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(port: int, proc: subprocess.Popen) -> None:
    deadline = time.time() + 60
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"redis-server exited with {proc.returncode}")
        ok = subprocess.run(
            ["redis-cli", "-p", str(port), "ping"], capture_output=True, text=True
        )
        if ok.stdout.strip() == "PONG":
            return
        time.sleep(0.2)
    raise SystemExit("redis-server did not start under valgrind")


def cli(port: int, *args: str) -> str:
    return subprocess.run(
        ["redis-cli", "-p", str(port), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


def events_per_call(server: str, module: Path, setup: list[list[str]],
                    call: list[str], calls: int, random_keys: bool, collect: str = "call",
                    sim: bool = False, load_args: tuple[str, ...] = (),
                    keyspace: int = 100_000_000, prefill: int = 0,
                    floor_module: Path | None = None,
                    annotate: list[str] | None = None) -> dict[str, float]:
    """Runs `call` `calls` times (after `setup`, and after `prefill` untimed calls of the same
    command over the same keyspace) and returns callgrind's events per call (`Ir`, and with
    `sim` the cache and branch events) inside the function `collect`. With `annotate`, the
    lines of `callgrind_annotate --inclusive=yes` over the run are appended to it."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        port = free_port()
        proc = subprocess.Popen(
            [
                "valgrind", "--tool=callgrind", f"--toggle-collect={collect}",
                *(["--cache-sim=yes", "--branch-sim=yes"] if sim else []),
                f"--callgrind-out-file={out}",
                server, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", tmp, "--loadmodule", str(module), *load_args,
                *(["--loadmodule", str(floor_module)] if floor_module else []),
            ],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            wait_ready(port, proc)
            for args in setup:
                cli(port, *args)
            if prefill:
                subprocess.run(["redis-benchmark", "-p", str(port), "-c", "1", "-P", "64", "-n",
                                str(prefill), "-q", "-r", str(keyspace), *call],
                               capture_output=True, check=True)
            cli(port, "CONFIG", "RESETSTAT")
            # Start counting from zero: the pings and the setup are not part of the case.
            subprocess.run(["callgrind_control", "-z", str(proc.pid)], capture_output=True,
                           check=True)
            bench = ["redis-benchmark", "-p", str(port), "-c", "1", "-P", "16", "-n",
                     str(calls), "-q"]
            if random_keys:
                bench += ["-r", str(keyspace)]
            subprocess.run(bench + call, capture_output=True, check=True)
            stats = cli(port, "INFO", "commandstats")
            name = call[0].lower()
            m = re.search(rf"cmdstat_{re.escape(name)}:calls=(\d+)", stats)
            done = int(m.group(1)) if m else 0
            # redis-benchmark rounds the count up to whole pipelines.
            if done < calls:
                raise SystemExit(f"{call[0]}: {done} calls counted, {calls} sent")
            cli(port, "SHUTDOWN", "NOSAVE")
        finally:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        if annotate is not None:
            for inclusive in ("yes", "no"):
                annotate.append(f"inclusive: {inclusive}")
                annotate.extend(subprocess.run(
                    ["callgrind_annotate", f"--inclusive={inclusive}", "--threshold=100",
                     "--auto=no", str(out)],
                    capture_output=True, text=True, check=True).stdout.splitlines())
            annotate.append(f"calls: {done}")
        names: list[str] = []
        totals: list[int] = []
        for line in out.read_text().splitlines():
            if line.startswith("events:"):
                names = line.split()[1:]
            if line.startswith("totals:") or line.startswith("summary:"):
                totals = [int(v) for v in line.split()[1:]]
        return {name: total / done for name, total in zip(names, totals)}


def server_is_valkey(server: str) -> bool:
    out = subprocess.run([server, "--version"], capture_output=True, text=True).stdout
    return "valkey" in out.lower()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--module", type=Path,
                    default=ROOT / "target" / "release" / "libredis_rate_limiter.so")
    ap.add_argument("--lua-dir", type=Path, default=ROOT / "lua-reference")
    ap.add_argument("--server", default="redis-server")
    ap.add_argument("--calls", type=int, default=20_000)
    ap.add_argument("--only", default="", help="only cases whose label contains this")
    ap.add_argument("--top", action="store_true",
                    help="only the cost of tracking the most-denied keys (top-slots 128 against 0)")
    ap.add_argument("--proc", action="store_true",
                    help="count inside the command's own function (what INFO commandstats times)")
    ap.add_argument("--sim", action="store_true",
                    help="also simulate caches and branches: I1 misses, mispredicted branches")
    ap.add_argument("--floor-module", type=Path,
                    help="benches/floor_module.c built: adds FLOOR.ADMIT and FLOOR.DENY")
    ap.add_argument("--breakdown", action="store_true",
                    help="only RL.GCRA's paths, function by function inside the command")
    ap.add_argument("--native", action="store_true",
                    help="with --breakdown: --server has the native GCRA; count it, its own work "
                         "apart, and the floor module's calls on the same paths")
    a = ap.parse_args()
    module = a.module.resolve()
    floor_module = a.floor_module.resolve() if a.floor_module else None
    dispatcher = ("ValkeyModuleCommandDispatcher" if server_is_valkey(a.server)
                  else "RedisModuleCommandDispatcher")

    def collected(call: list[str]) -> str:
        if not a.proc:
            return "call"
        return {"HSET": "hsetCommand", "EVALSHA": "evalShaCommand"}.get(call[0], dispatcher)

    rows: list[tuple[str, str, dict[str, float]]] = []

    def measure(label: str, case: str, setup, call, random_keys=False, **load):
        if a.only and a.only not in f"{label} {case}":
            return
        ev = events_per_call(a.server, module, setup, call, a.calls, random_keys,
                             collected(call), a.sim, floor_module=floor_module, **load)
        rows.append((label, case, ev))
        print(f"{label:32} {case:10} {ev['Ir']:10,.0f}", file=sys.stderr, flush=True)

    if a.breakdown:
        breakdown(a.server, module, dispatcher, a.calls, floor_module, a.native)
        return

    if a.top:
        # Denials with tracking on and off: a hot key (tracked, and the latest denied), and keys
        # drawn from 10,000 that all ran out first (each denial nearly always replaces a slot).
        for slots in ("128", "0"):
            hot = ["RL.GCRA", "hot", "0", "1", "1000"]
            measure(f"RL.GCRA, top-slots {slots}", "denied, hot key", [hot], hot,
                    load_args=("top-slots", slots))
            measure(f"RL.TOKENBUCKET, top-slots {slots}", "denied, random keys", [],
                    ["RL.TOKENBUCKET", "k:__rand_int__", "1", "0.001"], random_keys=True,
                    load_args=("top-slots", slots), keyspace=10_000, prefill=400_000)
    else:
        measure("HSET key f1 v1 f2 v2", "hot", [], ["HSET", "k", "f1", "v1", "f2", "v2"])
        measure("HSET key f1 v1 f2 v2", "new key", [],
                ["HSET", "k:__rand_int__", "f1", "v1", "f2", "v2"], random_keys=True)
        if floor_module:
            measure("FLOOR.ADMIT (server calls only)", "admitted", [], ["FLOOR.ADMIT", "hot"])
            measure("FLOOR.DENY (server calls only)", "denied", [FLOOR_DENY_SETUP],
                    ["FLOOR.DENY", "hot"])
            # A one-entry sliding log, as RL.SLIDINGLOG writes it.
            measure("FLOOR.LOGDENY (server calls only)", "denied",
                    [["ZADD", "hot", "1796156770512147", "1796156770512147:0"],
                     ["PEXPIRE", "hot", "100000000"]],
                    ["FLOOR.LOGDENY", "hot"])
        for command, script, admit, deny, new in CASES:
            source = (a.lua_dir / script).read_text()
            for twin in (False, True):
                label = f"{command} (Lua twin)" if twin else command

                def argv(key: str, params: str) -> list[str]:
                    if twin:
                        return ["EVALSHA", sha, "1", key, *params.split()]
                    return [command, key, *params.split()]

                sha = ""
                setup_load = []
                if twin:
                    sha = hashlib.sha1(source.encode()).hexdigest()
                    setup_load = [["SCRIPT", "LOAD", source]]
                measure(label, "admitted", setup_load + [argv("hot", admit)], argv("hot", admit))
                measure(label, "denied", setup_load + [argv("hot", deny)], argv("hot", deny))
                measure(label, "new key", setup_load, argv("k:__rand_int__", new), random_keys=True)
        # The sliding log's denial on a hot key of one entry (its admitted calls grow a set,
        # which the table of `make bench` times instead).
        hot_log = ["RL.SLIDINGLOG", "hot", "1", "1000"]
        measure("RL.SLIDINGLOG", "denied", [hot_log], hot_log)

    where = "in the command's function" if a.proc else "inside call()"
    if a.sim:
        print(f"| call | case | instructions per call ({where}) | I1 misses | mispredicted branches |")
        print("|---|---|---:|---:|---:|")
    else:
        print(f"| call | case | instructions per call ({where}) |")
        print("|---|---|---:|")
    for label, case, ev in rows:
        line = f"| {label} | {case} | {ev['Ir']:,.0f} |"
        if a.sim:
            line += f" {ev['I1mr']:,.1f} | {ev['Bcm'] + ev['Bim']:,.1f} |"
        print(line)


# One line of `callgrind_annotate --inclusive=yes`: "1,234 (12.3%)  file:function [object]".
ANNOTATED = re.compile(r"^\s*([\d,]+) \(\s*[\d.]+%\)\s+(?:\S*?:)?(.+?)(?: \[(.*)\])?$")


# The native GCRA's own work, by the functions that do it (self cost): its arguments parsed
# (`getRangeLongFromObjectOrReply` and the conversions under it), its stored number read, the
# decision (`gcraCommand`'s own code, and what the compiler inlined into it from the files of
# those conversions). Everything else it runs is a server call a module makes too: the key looked
# up and written, the expiry, the events, the propagated command, the reply.
NATIVE_OWN = re.compile(
    r"^(string2ll|string2l|string2d|fast_float\w*|getLongLongFromObject|getLongFromObject\w*|"
    r"getRangeLongFromObject\w*|getPositiveLongFromObject\w*|getDoubleFromObject\w*|"
    r"getLongLongFromGCRAObject|__ceil\w*|ceil|__errno_location|__ctype_b_loc)"
    r"(\.part\.\d+|\.constprop\.\d+|\.isra\.\d+|\.lto_priv\.\d+)*$")
NATIVE_OWN_FILES = ("gcra.c", "object.c", "util.c", "fast_float_strtod.c")
# One line of `callgrind_annotate --inclusive=no`, with the file: "1,234 (12.3%)  file:function".
SELF_COST = re.compile(r"^\s*([\d,]+) \(\s*[\d.]+%\)\s+(\S*?):(.+?)(?: \[(.*)\])?$")


def native_split(server: str, module: Path, setup, call, calls: int,
                 random_keys: bool) -> tuple[float, float]:
    """The native GCRA's instructions per call in `gcraCommand`, and of them its own work."""
    lines: list[str] = []
    ev = events_per_call(server, module, setup, call, calls, random_keys, "gcraCommand",
                         annotate=lines)
    done = int(lines[-1].split()[1])
    own = 0.0
    inclusive = True
    for line in lines:
        if line.startswith("inclusive: "):
            inclusive = line.endswith("yes")
            continue
        m = SELF_COST.match(line)
        if inclusive or not m or "TOTALS" in line:
            continue
        path, name = m.group(2), m.group(3).strip()
        file = path.rsplit("/", 1)[-1]
        if NATIVE_OWN.match(name) or (name == "gcraCommand" and file in NATIVE_OWN_FILES):
            own += int(m.group(1).replace(",", "")) / done
    return ev["Ir"], own


def breakdown(server: str, module: Path, dispatcher: str, calls: int,
              floor_module: Path | None = None, native: bool = False) -> None:
    """RL.GCRA's instructions per call on each path, by the functions the command's dispatcher
    calls: each server function (the module API's `RM_*` and what they call) and each of the
    module's that counts at least 1% of the path, inclusive of what it calls. With `native`, the
    native GCRA's own work and the floor's server calls on the same paths, and their sum."""
    paths = [
        ("admitted, hot key", [["RL.GCRA", "hot", "1000", "500000", "1"]],
         ["RL.GCRA", "hot", "1000", "500000", "1"], False),
        ("denied, hot key", [["RL.GCRA", "hot", "0", "1", "1000"]],
         ["RL.GCRA", "hot", "0", "1", "1000"], False),
        ("new key", [], ["RL.GCRA", "k:__rand_int__", "100", "1", "1"], True),
    ]
    floors = {
        "admitted, hot key": ([], ["FLOOR.ADMIT", "hot"], False),
        "denied, hot key": ([FLOOR_DENY_SETUP], ["FLOOR.DENY", "hot"], False),
        "new key": ([], ["FLOOR.ADMIT", "k:__rand_int__"], True),
    }
    bounds = []
    for label, setup, call, random_keys in paths:
        lines: list[str] = []
        ev = events_per_call(server, module, setup, call, calls, random_keys, dispatcher,
                             annotate=lines)
        done = int(lines[-1].split()[1])
        rows = []
        own = 0.0
        inclusive = True
        for line in lines:
            if line.startswith("inclusive: "):
                inclusive = line.endswith("yes")
            m = ANNOTATED.match(line)
            if not m or m.group(2).strip() == "PROGRAM TOTALS":
                continue
            ir = int(m.group(1).replace(",", "")) / done
            name, obj = m.group(2).strip(), (m.group(3) or "")
            if not inclusive:
                if "libredis_rate_limiter" in obj:
                    own += ir
                continue
            # The callers above the dispatcher count all of it; addresses without a name help
            # nobody.
            above = ir >= ev["Ir"] * 0.9995 and name != dispatcher
            if ir >= ev["Ir"] * 0.01 and not above and not name.startswith("0x"):
                where = "module" if "libredis_rate_limiter" in obj else "server"
                # A server built with debug information names the file too, and code the
                # compiler inlined counts once under each file it came from: keep them apart.
                file = SELF_COST.match(line)
                if file and file.group(2) != "???":
                    name = f"{file.group(2).rsplit('/', 1)[-1]}:{name}"
                rows.append((ir, name, where))
        print(f"\n{label}: {ev['Ir']:,.0f} instructions per call in {dispatcher}: "
              f"{own:,.0f} in the module's own code, {ev['Ir'] - own:,.0f} in the server's "
              f"(the module API and what it calls)\n")
        print("| function (inclusive of what it calls) | in | instructions per call | share |")
        print("|---|---|---:|---:|")
        for ir, name, where in rows:
            print(f"| `{name[:90]}` | {where} | {ir:,.0f} | {100 * ir / ev['Ir']:.1f}% |")
        if native:
            native_setup = [["GCRA", *c[1:]] for c in setup]
            total, own_native = native_split(server, module, native_setup, ["GCRA", *call[1:]],
                                             calls, random_keys)
            floor = None
            if floor_module:
                f_setup, f_call, f_random = floors[label]
                floor = events_per_call(server, module, f_setup, f_call, calls, f_random,
                                        dispatcher, floor_module=floor_module)["Ir"]
            bounds.append((label, total, own_native, floor, ev["Ir"], own))
    if bounds:
        print("\nThe native GCRA on the same paths (instructions per call in `gcraCommand`), its "
              "own work (`NATIVE_OWN`), the floor module's server calls, and their sum: a module "
              "whose own code cost what the native command's does\n")
        print("| path | native | of it, its own work | floor module | floor + native's own work "
              "| ÷ native | RL.GCRA | of it, the module's own code | ÷ native |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for label, total, own_native, floor, ours, own in bounds:
            if floor is None:
                f_cell = least = ratio = "-"
            else:
                f_cell = f"{floor:,.0f}"
                least = f"{floor + own_native:,.0f}"
                ratio = f"{(floor + own_native) / total:.2f}x"
            print(f"| {label} | {total:,.0f} | {own_native:,.0f} | {f_cell} | {least} | {ratio} "
                  f"| {ours:,.0f} | {own:,.0f} | {ours / total:.2f}x |")


if __name__ == "__main__":
    main()
