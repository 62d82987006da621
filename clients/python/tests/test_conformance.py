# mypy: disallow-untyped-calls=False
"""The conformance table (``clients/conformance/cases.json``), replayed through this package
against a real server under the test clock, in the module, Functions and script modes, as the
Rust crate and the Go package replay it: every call must give exactly the answer the table
records (decisions, errors, stored bytes, status codes, response fields byte for byte,
problem+json bodies, counters). The format is ``clients/conformance/README.md``.

Each client case is replayed through the synchronous client and the asyncio client; each HTTP
case through the ASGI middleware (Starlette under uvicorn) and the WSGI middleware (Flask under
werkzeug's server), over real TCP; ``RL_PY_FRAMEWORKS=all`` adds FastAPI (uvicorn) and Django
(waitress). ``CONFORMANCE_CASE=<text>`` replays only the cases whose name contains it.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import redis

from apps import (
    ASGI_FLAVORS,
    CURRENT,
    AsgiServer,
    Gates,
    WaitressServer,
    WerkzeugServer,
    asgi_app,
    send_request,
    wsgi_app,
)
from ratelimit_client import (
    LIBRARY,
    AsyncClient,
    Batching,
    BreakerConfig,
    Client,
    Concurrency,
    FailClosed,
    FailOpen,
    FailurePolicy,
    FixedWindow,
    Gcra,
    LeakyBucket,
    Local,
    ModeChoice,
    Options,
    Rejected,
    SlidingLog,
    SlidingWindow,
    TokenBucket,
    Unavailable,
    Unsupported,
)
from ratelimit_client.middleware import Metrics, Policy, client_ip, header
from servers import ROOT, Server, call, free_port

TABLE = json.loads(
    Path(os.environ.get("CONFORMANCE_TABLE") or ROOT / "clients" / "conformance" / "cases.json").read_text()
)
MODES = ("module", "function", "script")
HTTP_FLAVORS = ("starlette", "flask") + (("fastapi", "django") if os.environ.get("RL_PY_FRAMEWORKS") == "all" else ())


# The features a case may require ("requires" in the table) that this package implements; a case
# that requires another is skipped.
SUPPORTED: frozenset[str] = frozenset({"partial_grants", "deny_cache", "batches"})


def _params() -> list[Any]:
    only = os.environ.get("CONFORMANCE_CASE")
    out = []
    for case in TABLE["cases"]:
        if only and only not in case["name"]:
            continue
        missing = [r for r in case.get("requires", []) if r not in SUPPORTED]
        if missing:
            reason = f"requires {missing}, not implemented by this package"
            out.append(pytest.param(case, "-", id=f"skipped: {case['name']}", marks=pytest.mark.skip(reason=reason)))
            continue
        for flavor in HTTP_FLAVORS if "layer" in case else ("sync", "async"):
            out.append(pytest.param(case, flavor, id=f"{flavor}: {case['name']}"))
    return out


class Harness:
    """The server of the replay: started with the module under the test clock and the Functions
    library loaded; started again when a case stopped it."""

    def __init__(self) -> None:
        self.server: Server | None = None

    def get(self) -> Server:
        if self.server is None:
            s = Server(test_clock=True)
            # The library the package ships (tests/test_lua_copy.py holds it to lua-reference/).
            assert s.connect().execute_command("FUNCTION LOAD", "REPLACE", LIBRARY) == "ratelimit"
            self.server = s
        return self.server

    def reset(self, start_us: int) -> None:
        c = self.get().raw()
        for args in (
            ("FLUSHALL",),
            ("SCRIPT", "FLUSH"),
            ("CONFIG", "SET", "ratelimit.top-slots", "128"),
            ("RL.TOP", "RESET"),
            ("CONFIG", "RESETSTAT"),
            ("RL.TESTCLOCK", "SET", start_us),
        ):
            call(c, *args)
        c.disconnect()

    def kill(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    def stop(self) -> None:
        self.kill()


@pytest.fixture(scope="module")
def harness() -> Any:
    h = Harness()
    yield h
    h.stop()


@pytest.fixture(scope="module")
def web() -> Any:
    """The HTTP servers, started on first use."""
    servers: dict[str, Any] = {}

    def get(flavor: str) -> Any:
        kind = "asgi" if flavor in ASGI_FLAVORS else flavor
        if kind not in servers:
            servers[kind] = {"asgi": AsgiServer, "flask": WerkzeugServer, "django": WaitressServer}[kind]()
        return servers[kind]

    yield get
    CURRENT["gates"].release_all()
    for s in servers.values():
        s.stop()


def algorithm(v: dict[str, Any]) -> Any:
    a = v["algorithm"]
    if a == "token_bucket":
        return TokenBucket(v["capacity"], v["refill_per_sec"])
    if a == "leaky_bucket":
        return LeakyBucket(v["capacity"], v["leak_per_sec"])
    if a == "fixed_window":
        return FixedWindow(v["limit"], v["window_sec"])
    if a == "sliding_window":
        return SlidingWindow(v["limit"], v["window_sec"])
    if a == "sliding_log":
        return SlidingLog(v["limit"], v["window_sec"])
    if a == "gcra":
        return Gcra(v["max_burst"], v["count_per_period"], v["period_sec"])
    if a == "concurrency":
        return Concurrency(v["limit"], v["lease_sec"])
    raise AssertionError(f"unknown algorithm {a}")


def options(case: dict[str, Any], mode: str) -> Options:
    o = case.get("options", {})
    policies: dict[str, FailurePolicy] = {"fail_open": FailOpen(), "fail_closed": FailClosed()}
    policy = policies.get(o.get("policy", "fail_open"))
    if policy is None:
        assert o["policy"] == "local"
        policy = Local(o["instances"])
    d = Options()
    return Options(
        # No case waits for a deadline (an unreachable or killed server refuses at once), but a
        # loaded machine may take more than the default 100 ms for a round trip: 2 s where the
        # case names no timeout (the default is tested in test_failures.py).
        timeout=o["timeout_ms"] / 1000 if "timeout_ms" in o else 2.0,
        policy=policy,
        breaker=BreakerConfig(
            failures=o.get("breaker_failures", d.breaker.failures),
            cooldown=o["breaker_cooldown_ms"] / 1000 if "breaker_cooldown_ms" in o else d.breaker.cooldown,
        ),
        mode={"module": ModeChoice.MODULE, "function": ModeChoice.FUNCTION, "script": ModeChoice.SCRIPT}[mode],
        fail_closed_retry_ms=o.get("fail_closed_retry_ms", d.fail_closed_retry_ms),
    )


def with_features(case: dict[str, Any], client: Any) -> Any:
    """The client of a case with its batches (``options.batching``) and deny cache
    (``options.deny_cache``) when it has them."""
    o = case.get("options", {})
    if "batching" in o:
        b = o["batching"]
        d = Batching()
        client = client.with_batching(
            Batching(
                hot_keys=tuple(b.get("hot_keys", ())),
                detect_per_sec=b.get("detect_per_sec", d.detect_per_sec),
                lease=b["lease_ms"] / 1000 if "lease_ms" in b else d.lease,
                initial=b.get("initial", d.initial),
                max_batch=b.get("max_batch", d.max_batch),
                remaining_share=b.get("remaining_share", d.remaining_share),
            )
        )
    if "deny_cache" in o:
        client = client.with_deny_cache(o["deny_cache"]["entries"])
    return client


def middleware_options(case: dict[str, Any], metrics: Metrics) -> dict[str, Any]:
    layer = case["layer"]
    limits = case["limits"]
    opts: dict[str, Any] = {
        "metrics": metrics,
        "legacy_headers": layer.get("legacy_headers", False),
        "header_format": layer.get("header_format", "draft-11"),
        # Off unless the case turns it on: it counts down on the process's clock, which the test
        # clock does not move.
        "deny_cache": layer.get("deny_cache", False),
    }
    key = layer.get("key")
    if key and "header" in key:
        opts["key"] = header(key["header"])
    elif key and "client_ip" in key:
        opts["key"] = client_ip(key["client_ip"])
    plan = layer.get("plan")
    if plan and "header" in plan:
        name, default = plan["header"], plan.get("default", "default")

        def plan_of(info: Any) -> str:
            v = info.header(name)
            return default if v is None else str(v)

        opts["plan"] = plan_of
    rc = layer.get("route_class")
    if rc == "path":
        opts["route_class"] = lambda info: info.path.lstrip("/")
    elif isinstance(rc, dict):
        prefixes, default_class = rc["prefixes"], rc.get("default", "default")
        opts["route_class"] = lambda info: next((c for p, c in prefixes if info.path.startswith(p)), default_class)
    opts["limits"] = {
        (e["plan"], e["class"]): [
            Policy(p["name"], algorithm(limits[p["limit"]]), p.get("shadow", False)) for p in e["policies"]
        ]
        for e in layer["limits"]
    }
    if "estimates" in layer:
        opts["estimates"] = dict(layer["estimates"])
    return opts


def decision(d: Any) -> list[int]:
    return [1 if d.allowed else 0, d.remaining, d.retry_after_ms, d.reset_after_ms, d.limit]


def error(e: Exception) -> dict[str, Any]:
    if isinstance(e, Rejected):
        return {"error": "rejected", "message": e.message}
    if isinstance(e, Unsupported):
        return {"error": "unsupported"}
    if isinstance(e, Unavailable):
        return {"error": "unavailable"}
    raise e


def reply_json(v: Any) -> Any:
    if isinstance(v, bytes):
        return v.decode("utf-8", errors="replace")
    if isinstance(v, list):
        return [reply_json(x) for x in v]
    return v


async def maybe(v: Any) -> Any:
    """The same replay drives both clients: an asyncio call's value is awaited."""
    return await v if inspect.isawaitable(v) else v


def matches(expect: Any, got: Any) -> bool:
    """Equal, where ``[min, max]`` stands for a number in that range; booleans are not numbers."""
    if isinstance(expect, list) and len(expect) == 2 and all(_number(x) for x in expect) and _number(got):
        return bool(expect[0] <= got <= expect[1])
    if isinstance(expect, list) and isinstance(got, list):
        return len(expect) == len(got) and all(matches(x, y) for x, y in zip(expect, got, strict=True))
    if isinstance(expect, dict) and isinstance(got, dict):
        return expect.keys() == got.keys() and all(matches(expect[k], got[k]) for k in expect)
    if isinstance(expect, bool) or isinstance(got, bool):
        return type(expect) is type(got) and expect == got
    return bool(expect == got)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def expectation(step: dict[str, Any], mode: str) -> Any:
    e = step.get("expect")
    if isinstance(e, dict) and any(m in e for m in MODES):
        return e.get(mode)
    return e


OPS = (
    "check", "peek", "check_all", "check_upto", "check_all_upto", "acquire", "acquire_all", "renew", "release",
    "release_id", "reserve",
    "reserve_all", "settle", "settle_delta", "top", "reset_top", "redis", "request", "finish", "wait_leases",
    "metrics", "keys", "calls", "flush", "close", "stop_redis", "advance_only", "note",
)  # fmt: skip


def step_op(step: dict[str, Any]) -> str:
    for op in OPS:
        if op in step:
            return op
    raise AssertionError(f"a step without an operation: {step}")


class Run:
    """What one mode's run of a case holds between steps."""

    def __init__(self, case: dict[str, Any], mode: str, flavor: str, harness: Harness, web: Any) -> None:
        self.case = case
        self.mode = mode
        self.flavor = flavor
        self.harness = harness
        self.problems: list[str] = []
        self.leases: dict[str, Any] = {}
        self.reservations: dict[str, Any] = {}
        self.admin = harness.get().raw()
        server_url = harness.get().url
        self.url = f"redis://127.0.0.1:{free_port()}" if case.get("redis") == "unreachable" else server_url
        self.opts = options(case, mode)
        self.client: Any = None
        self.web: Any = None
        self.metrics = Metrics()
        self.pool = ThreadPoolExecutor(max_workers=8)
        self.held: dict[str, Future[dict[str, Any]]] = {}
        CURRENT["gates"] = self.gates = Gates()
        if flavor in ("sync", "async"):
            cls = AsyncClient if flavor == "async" else Client
            self.client = with_features(case, cls.from_url(self.url, self.opts))
        else:
            self.web = web(flavor)
            mw = middleware_options(case, self.metrics)
            if flavor in ASGI_FLAVORS:
                self.client = with_features(case, AsyncClient.from_url(self.url, self.opts))
                self.web.dispatch.current = asgi_app(flavor, self.client, mw)
            else:
                self.client = with_features(case, Client.from_url(self.url, self.opts))
                self.web.dispatch.current = wsgi_app(flavor, self.client, mw)

    def close(self) -> None:
        self.gates.release_all()
        for f in self.held.values():
            f.result(10)
        self.pool.shutdown(wait=True)
        if isinstance(self.client, Client):
            self.client.close()
        elif self.web is not None:
            self.web.run(self.client.aclose())
        self.admin.disconnect()

    def algorithm(self, name: str) -> Any:
        return algorithm(self.case["limits"][name])

    def limits(self, v: list[Any]) -> list[tuple[str, Any]]:
        return [(k, self.algorithm(n)) for k, n in v]

    def provenance(self, obs: dict[str, Any], degraded: Any, mode: Any) -> dict[str, Any]:
        if degraded is not None:
            obs["degraded"] = degraded.value
        elif mode is None or mode.value != self.mode:
            self.problems.append(f"answered by {mode} in {self.mode} mode")
        return obs

    def outcome(self, o: Any, granted: bool = False) -> dict[str, Any]:
        obs: dict[str, Any] = {"decision": decision(o.decision)}
        if granted:
            obs["granted"] = o.granted
        return self.local(self.provenance(obs, o.degraded, o.mode), o)

    def multi(self, o: Any, granted: bool = False) -> dict[str, Any]:
        obs = {"allowed": o.allowed, "denied_by": o.denied_by, "decisions": [decision(d) for d in o.decisions]}
        if granted:
            obs["granted"] = o.granted
        return self.local(self.provenance(obs, o.degraded, o.mode), o)

    @staticmethod
    def local(obs: dict[str, Any], o: Any) -> dict[str, Any]:
        """``answered_locally`` when the client answered without calling Redis."""
        if o.answered_locally is not None:
            obs["answered_locally"] = o.answered_locally.value
        return obs

    def hold_lease(self, arg: dict[str, Any], admitted: bool, lease: Any, obs: dict[str, Any]) -> None:
        if (lease is not None) != admitted:
            self.problems.append(f"a lease {'missing with' if admitted else 'without'} an admission")
        if lease is None:
            return
        if not lease.holds_slot:
            obs["holds_slot"] = False
        name = arg.get("lease") or arg.get("id")
        assert name is not None, "a name for the lease"
        if "id" in arg and (lease.id != arg["id"] or lease.key != arg.get("key", lease.key)):
            self.problems.append(f"lease {lease.id} on {lease.key}")
        self.leases[name] = lease

    def hold_reservation(self, arg: dict[str, Any], admitted: bool, r: Any) -> None:
        if (r is not None) != admitted:
            self.problems.append("a reservation without an admission, or none with one")
        if r is not None:
            self.reservations[arg["reservation"]] = r

    async def step(self, op: str, arg: Any) -> Any:
        c = self.client
        try:
            if op in ("check", "peek"):
                a = self.algorithm(arg["limit"])
                got = await maybe(c.peek(arg["key"], a) if op == "peek" else c.check(arg["key"], a, arg.get("cost", 1)))
                return self.outcome(got)
            if op == "check_all":
                return self.multi(await maybe(c.check_all(self.limits(arg["limits"]), arg.get("cost", 1))))
            if op == "check_upto":
                a = self.algorithm(arg["limit"])
                return self.outcome(await maybe(c.check_upto(arg["key"], a, arg["upto"])), granted=True)
            if op == "check_all_upto":
                return self.multi(await maybe(c.check_all_upto(self.limits(arg["limits"]), arg["upto"])), granted=True)
            if op == "acquire":
                conc = self.algorithm(arg["limit"])
                lo = await maybe(c.acquire(arg["key"], conc, arg.get("id")))
                obs = self.outcome(lo.outcome)
                self.hold_lease(arg, lo.outcome.decision.allowed, lo.lease, obs)
                return obs
            if op == "acquire_all":
                cost = arg.get("cost", 1)
                mo = await maybe(c.acquire_all(self.limits(arg["limits"]), cost))
                obs = self.multi(mo.outcome)
                self.hold_lease(arg, mo.outcome.allowed and cost > 0, mo.lease, obs)
                return obs
            if op == "renew":
                lease = self.leases.get(arg)
                if lease is None:
                    return {"no_lease": True}
                o = await maybe(lease.renew())
                if lease.last_renewal != o:
                    self.problems.append("last_renewal is not the renewal")
                return self.outcome(o)
            if op == "release":
                lease = self.leases.pop(arg, None)
                if lease is None:
                    return {"no_lease": True}
                return {"released": await maybe(lease.release())}
            if op == "release_id":
                return {"released": await maybe(c.release(arg["key"], arg["id"]))}
            if op == "reserve":
                a = self.algorithm(arg["limit"])
                ro = await maybe(c.reserve(arg["key"], a, arg["estimate"]))
                obs = self.outcome(ro.outcome)
                self.hold_reservation(arg, ro.outcome.decision.allowed, ro.reservation)
                return obs
            if op == "reserve_all":
                mr = await maybe(c.reserve_all(self.limits(arg["limits"]), arg["estimate"]))
                obs = self.multi(mr.outcome)
                self.hold_reservation(arg, mr.outcome.allowed, mr.reservation)
                return obs
            if op == "settle":
                r = self.reservations.pop(arg["reservation"], None)
                if r is None:
                    return {"no_reservation": True}
                s = await maybe(r.settle(arg["actual"]))
                return self.provenance({"decisions": [decision(d) for d in s.decisions]}, s.degraded, s.mode)
            if op == "settle_delta":
                s = await maybe(c.settle(self.limits(arg["limits"]), arg["delta"]))
                return self.provenance({"decisions": [decision(d) for d in s.decisions]}, s.degraded, s.mode)
            if op == "top":
                entries = await maybe(c.top(arg))
                return {
                    "entries": [
                        [e.key, e.denied, e.error, e.command, e.first_denied_ms, e.last_denied_ms] for e in entries
                    ]
                }
            if op == "reset_top":
                await maybe(c.reset_top())
                return {}
            if op == "flush":
                return {"returned": await maybe(c.flush())}
            if op == "close":
                return {"returned": await (c.aclose() if isinstance(c, AsyncClient) else asyncio.to_thread(c.close))}
        except (Rejected, Unsupported, Unavailable) as e:
            return error(e)
        if op == "redis":
            try:
                return {"reply": reply_json(call(self.admin, *arg))}
            except redis.ResponseError as e:
                return {"error": str(e)}
        if op == "request":
            if "hold" in arg:
                entered, _ = self.gates.get(arg["hold"])
                task = self.pool.submit(send_request, self.web.port, arg)
                deadline = time.monotonic() + 5
                # In the handler, or answered without reaching it.
                while not entered.is_set() and not task.done():
                    assert time.monotonic() < deadline, f"{arg['hold']} never reached its handler"
                    time.sleep(0.002)
                self.held[arg["hold"]] = task
                return None
            return await asyncio.to_thread(send_request, self.web.port, arg)
        if op == "finish":
            self.gates.get(arg)[1].set()
            return self.held.pop(arg).result(10)
        if op == "wait_leases":
            deadline = time.monotonic() + 5
            while True:
                n = call(self.admin, "ZCARD", arg["key"])
                if n == arg["count"]:
                    return None
                if time.monotonic() > deadline:
                    return {"leases": n}
                time.sleep(0.002)
        if op == "metrics":
            return self.metrics.render_prometheus()
        if op == "keys":
            return sorted(reply_json(call(self.admin, "KEYS", "*")))
        if op == "calls":
            info = reply_json(call(self.admin, "INFO", "commandstats"))
            counts = {}
            for command in arg.get(self.mode, []):
                prefix = f"cmdstat_{command}:calls="
                line = next((x for x in info.splitlines() if x.startswith(prefix)), None)
                counts[command] = int(line[len(prefix) :].split(",")[0]) if line else 0
            return counts
        raise AssertionError(f"unknown step {op}")


async def replay(case: dict[str, Any], mode: str, run: Run) -> list[str]:
    failures = []
    for si, step in enumerate(case["steps"]):
        if step.get("advance_us"):
            call(run.admin, "RL.TESTCLOCK", "ADVANCE", step["advance_us"])
        op = step_op(step)
        if op == "stop_redis":
            run.harness.kill()
            obs: Any = None
        elif op in ("advance_only", "note"):
            obs = None
        else:
            obs = await run.step(op, step[op])
        for p in run.problems:
            failures.append(f"[{mode}] step {si} ({op}): {p}")
        run.problems.clear()
        expect = expectation(step, mode)
        fine = obs is None if expect is None else matches(expect, obs)
        if not fine:
            failures.append(f"[{mode}] step {si} ({op}): expected {json.dumps(expect)}, got {json.dumps(obs)}")
    if run.flavor == "async":
        await run.client.aclose()
    return failures


@pytest.mark.parametrize(("case", "flavor"), _params())
def test_case(case: dict[str, Any], flavor: str, harness: Harness, web: Any) -> None:
    modes = [m for m in MODES if m in case.get("modes", MODES)]
    failures: list[str] = []
    for mode in modes:
        harness.reset(TABLE["clock_start_us"])
        run = Run(case, mode, flavor, harness, web)
        try:
            failures += asyncio.run(replay(case, mode, run))
        finally:
            run.close()
    assert not failures, f"{len(failures)} mismatch(es):\n" + "\n".join(failures)
