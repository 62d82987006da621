# mypy: disallow-untyped-calls=False
"""What the table cannot show about the clients, against real servers: mode detection, the
script mode's NOSCRIPT reload, what is sent (plain decimals, lease ids), leases as context
managers, the error classes, and both clients having the same shape."""

from __future__ import annotations

import asyncio
import inspect
import re
from typing import Any

import pytest
import redis
from redis._parsers.base import BaseParser

import ratelimit_client
from ratelimit_client import (
    AsyncClient,
    AsyncLimiter,
    Client,
    Concurrency,
    Decision,
    Degraded,
    FailClosed,
    FixedWindow,
    Gcra,
    Limiter,
    Local,
    Mode,
    ModeChoice,
    Options,
    Outcome,
    Rejected,
    SlidingLog,
    TokenBucket,
    Unsupported,
    load_library,
)
from ratelimit_client._core import (
    UnexpectedReply,
    classify,
    cost_arg,
    new_lease_id,
    params_of,
    parse_decision,
    take_outcome,
)
from ratelimit_client.algorithms import LeakyBucket, SlidingWindow, num
from servers import SLACK, Server


def commandstats(s: Server) -> dict[str, int]:
    info = s.connect().execute_command("INFO", "commandstats")
    return {k[len("cmdstat_") :]: v["calls"] for k, v in info.items()}


def test_numbers_are_plain_decimals() -> None:
    assert [num(x) for x in (0.0000001, 2.5, 60.0, 60, 1e20, 1 / 3, 0.1, 1e-300)] == [
        "0.0000001", "2.5", "60", "60", "100000000000000000000", "0.3333333333333333", "0.1",
        "0." + "0" * 299 + "1",
    ]  # fmt: skip
    assert TokenBucket(10, 0.0000001).params() == ["10", "0.0000001"]
    assert Gcra(4, 1, 2.5).params() == ["4", "1", "2.5"]
    assert (Gcra(4, 1, 2.5).quota, Gcra(4, 1, 2.5).window_secs) == (5, 13)
    assert (FixedWindow(3, 0.5).window_secs, FixedWindow(3, 0.5).rate_per_sec) == (1, 6.0)
    c = Concurrency(3, 2.5)
    assert (c.command, c.keyword, c.params(), c.quota, c.window_secs) == (
        "RL.ACQUIRE",
        "CONCURRENCY",
        ["3", "2.5"],
        3,
        3,
    )
    assert [a.keyword for a in (TokenBucket(1, 1), LeakyBucket(1, 1), SlidingWindow(1, 1), SlidingLog(1, 1))] == [
        "TOKENBUCKET", "LEAKYBUCKET", "SLIDINGWINDOW", "SLIDINGLOG",
    ]  # fmt: skip


def test_the_values_made_once_or_directly_are_the_same() -> None:
    """Parameters formatted once per algorithm, costs of the table, and the decisions and
    outcomes made with their slots set directly: the same as made the usual way."""
    tb = TokenBucket(10, 0.0000001)
    assert params_of(tb) == ("10", "0.0000001") and params_of(tb) is params_of(tb)
    assert params_of(TokenBucket(10, 0.0000001)) == params_of(tb)
    assert params_of(Gcra(4, 1, 2.5)) == ("4", "1", "2.5")
    assert [cost_arg(n) for n in (0, 1, 16, 17, 10**15)] == ["0", "1", "16", "17", "1000000000000000"]
    d = parse_decision([1, 9, 0, 100, 10])
    assert d == Decision(True, 9, 0, 100, 10) and hash(d) == hash(Decision(True, 9, 0, 100, 10))
    assert repr(d) == "Decision(allowed=True, remaining=9, retry_after_ms=0, reset_after_ms=100, limit=10)"
    assert parse_decision([0, 0, 250, 900, 10]) == Decision(False, 0, 250, 900, 10)
    o = take_outcome([1, 9, 0, 100, 10], 1, Mode.MODULE)
    assert o == Outcome(d, None, Mode.MODULE, 1) and o.answered_locally is None
    denied = take_outcome([0, 0, 250, 900, 10], 3, Mode.FUNCTION)
    assert denied == Outcome(Decision(False, 0, 250, 900, 10), None, Mode.FUNCTION, 0)
    # Any other shape goes through the general parsing: read, or refused.
    assert take_outcome((1, 9, 0, 100, 10), 2, Mode.MODULE) == Outcome(d, None, Mode.MODULE, 2)
    with pytest.raises(UnexpectedReply):
        take_outcome([1, -1, 0, 100, 10], 1, Mode.MODULE)
    with pytest.raises(AttributeError):
        o.granted = 2  # type: ignore[misc]


def test_lease_ids_are_a_process_prefix_the_pid_and_a_counter() -> None:
    a, b = new_lease_id(), new_lease_id()
    pa, pb = a.split("-"), b.split("-")
    assert re.fullmatch(r"[0-9a-f]{16}-[0-9a-f]+-[0-9a-f]+", a), a
    assert pa[:2] == pb[:2] and int(pa[1], 16) > 0
    assert int(pb[2], 16) == int(pa[2], 16) + 1


def test_the_mode_is_detected_once(server: Server, bare_server: Server) -> None:
    tb = TokenBucket(10, 5)
    with Client.from_url(server.url, SLACK) as c:
        assert c.mode is None
        assert c.check("k", tb).mode is Mode.MODULE
        assert c.mode is Mode.MODULE
        c.check("k", tb)
    # Two detection commands, once, then only the module's command.
    stats = commandstats(server)
    assert (stats["command|info"], stats.get("function|list", 0), stats["rl.tokenbucket"]) == (1, 0, 2)
    with Client.from_url(bare_server.url, SLACK) as c:
        assert c.detect() is Mode.SCRIPT
        assert c.check("k", tb).mode is Mode.SCRIPT
    assert load_library(bare_server.connect()) == "ratelimit"
    with Client.from_url(bare_server.url, SLACK) as c:
        assert c.check("k", tb).mode is Mode.FUNCTION
        assert c.check("k", tb).decision.remaining == 7
    stats = commandstats(bare_server)
    # The script mode's one check: EVALSHA (NOSCRIPT), SCRIPT LOAD, EVALSHA.
    assert (
        stats["command|info"],
        stats["function|list"],
        stats["fcall"],
        stats["evalsha"],
        stats["script|load"],
        stats.get("eval", 0),
    ) == (2, 2, 2, 2, 1, 0)
    # An unreachable server leaves the mode unknown.
    assert Client.from_url("redis://127.0.0.1:1").detect() is None


def test_the_asyncio_client_detects_alike(server: Server, bare_server: Server) -> None:
    async def modes() -> list[Mode | None]:
        out = []
        for url in (server.url, bare_server.url, "redis://127.0.0.1:1"):
            async with await AsyncClient.open(url, SLACK) as c:
                out.append(c.mode)
        return out

    assert asyncio.run(modes()) == [Mode.MODULE, Mode.SCRIPT, None]


def test_a_user_that_may_not_list_functions_gets_the_scripts(bare_server: Server) -> None:
    admin = bare_server.connect()
    load_library(admin)
    admin.execute_command("ACL", "SETUSER", "app", "on", ">pw", "~*", "+@all", "-function")
    with Client.from_url(bare_server.url, SLACK, username="app", password="pw") as c:
        o = c.check("k", TokenBucket(10, 5))
    assert (o.mode, o.decision.remaining) == (Mode.SCRIPT, 9)


def test_scripts_are_sent_again_on_noscript(bare_server: Server) -> None:
    tb = TokenBucket(10, 5)
    c = Client.from_url(bare_server.url, Options(mode=ModeChoice.SCRIPT, timeout=2.0))
    assert c.check("k", tb).decision.remaining == 9  # EVALSHA, NOSCRIPT, SCRIPT LOAD, EVALSHA
    assert c.check("k", tb).decision.remaining == 8  # EVALSHA
    bare_server.connect().execute_command("SCRIPT", "FLUSH")
    assert c.check("k", tb).decision.remaining == 7  # EVALSHA, NOSCRIPT, SCRIPT LOAD, EVALSHA
    stats = commandstats(bare_server)
    assert (stats["evalsha"], stats["script|load"], stats.get("eval", 0)) == (5, 2, 0)
    assert "command|info" not in stats  # forced: no detection


def test_concurrency_limits_need_a_lease(server: Server) -> None:
    c = Client.from_url(server.url, SLACK)
    slots = Concurrency(2, 30)
    with pytest.raises(Unsupported):
        c.check("k", slots, 1)
    with pytest.raises(Unsupported):
        c.reserve("k", slots, 1)
    with pytest.raises(Unsupported):
        c.settle([("k", slots)], 1)
    with pytest.raises(Unsupported):
        c.check_all([])
    with pytest.raises(Unsupported):
        Limiter(c, TokenBucket(1, 1)).acquire("k")
    assert c.peek("k", slots).decision.remaining == 2


def test_a_lease_is_given_back_at_the_end_of_a_with_block(clock_server: Server) -> None:
    server = clock_server
    c = Client.from_url(server.url, SLACK)
    r = server.connect()
    slots = Concurrency(1, 30)
    with c.acquire("jobs", slots) as held:
        assert held.allowed and held.lease is not None and held.lease.holds_slot
        assert r.zrange("jobs", 0, -1) == [held.lease.id]
        with c.acquire("jobs", slots) as other:
            assert (other.allowed, other.lease, other.outcome.decision.retry_after_ms) == (False, None, 30000)
    assert r.exists("jobs") == 0
    assert not held.lease.holds_slot
    assert held.lease.release() is False  # twice is harmless
    # Raising inside the block gives the slot back too.
    with pytest.raises(KeyError), Limiter(c, slots).acquire("jobs", lease_id="job-7") as held:
        assert r.zrange("jobs", 0, -1) == ["job-7"]
        raise KeyError("the work failed")
    assert r.exists("jobs") == 0
    # acquire_all: one lease over the concurrency limits of one RL.ALL.
    with c.acquire_all([("{t}:inflight", slots), ("{t}:minute", FixedWindow(5, 60))], 2) as both:
        assert both.allowed and both.lease is not None
        assert r.zcard("{t}:inflight") == 1
        assert c.peek("{t}:minute", FixedWindow(5, 60)).decision.remaining == 3
    assert r.zcard("{t}:inflight") == 0


def test_an_asyncio_lease_is_held_by_async_with(server: Server) -> None:
    r = server.connect()

    async def run() -> None:
        async with AsyncClient.from_url(server.url, SLACK) as c:
            slots = Concurrency(1, 30)
            async with c.acquire("jobs", slots) as held:
                assert held.allowed and held.lease is not None
                assert r.zcard("jobs") == 1
                denied = await c.acquire("jobs", slots)
                assert (denied.allowed, denied.lease) == (False, None)
            assert r.exists("jobs") == 0
            async with AsyncLimiter(c, slots).acquire("jobs") as held:
                assert held.lease is not None
                held.lease.keep_alive(0.05)
                await asyncio.sleep(0.2)
                assert held.lease.last_renewal is not None and held.lease.last_renewal.decision.allowed
            assert r.exists("jobs") == 0

    asyncio.run(run())


def test_keep_alive_holds_a_lease_past_its_expiry(server: Server) -> None:
    c = Client.from_url(server.url, SLACK)
    slots = Concurrency(1, 0.6)
    held = c.acquire("k", slots)
    assert held.lease is not None
    held.lease.keep_alive(0.1)
    import time

    time.sleep(1.5)
    assert not c.acquire("k", slots).allowed, "renewed: still held"
    assert held.lease.last_renewal is not None and held.lease.last_renewal.decision.allowed
    assert held.lease.release() is True
    assert c.acquire("k", slots).allowed


def test_both_clients_have_the_same_shape() -> None:
    def public(cls: type) -> dict[str, list[str]]:
        return {
            n: list(inspect.signature(getattr(cls, n)).parameters)
            for n in dir(cls)
            if not n.startswith("_") and callable(getattr(cls, n))
        }

    sync, aio = public(Client), public(AsyncClient)
    sync.pop("close")
    aio.pop("aclose")
    assert sync == aio
    for name in vars(AsyncClient):
        # What answers without Redis: the builders, and what the batches and the deny cache hold.
        local = {
            "acquire", "acquire_all", "from_url", "sentinel", "breaker_open", "with_batching", "without_batching",
            "with_deny_cache", "without_deny_cache", "batch_stats", "batch_size", "deny_cache_capacity",
            "deny_cache_len", "denied_until", "with_durability", "durability_stats",
        }  # fmt: skip
        if name in sync and name not in local:
            assert inspect.iscoroutinefunction(getattr(AsyncClient, name)), name
    assert public(Limiter) == public(AsyncLimiter)


def parse_error(reply: str) -> redis.RedisError:
    """The exception redis-py makes of an error reply."""
    e = BaseParser.parse_error(reply)
    assert isinstance(e, redis.RedisError)
    return e


@pytest.mark.parametrize(
    ("reply", "rejected"),
    [
        ("ERR capacity must be between 1 and 1000000000000000", True),
        ("WRONGTYPE Operation against a key holding the wrong kind of value", True),
        ("CROSSSLOT Keys in request don't hash to the same slot", True),
        ("NOPERM User app has no permissions to run the 'rl.all' command", True),
        ("NOAUTH Authentication required.", True),
        ("WRONGPASS invalid username-password pair or user is disabled.", True),
        ("OOM command not allowed when used memory > 'maxmemory'.", True),
        ("READONLY You can't write against a read only replica.", True),
        ("LOADING Redis is loading the dataset in memory", False),
        ("CLUSTERDOWN The cluster is down", False),
        ("MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.", False),
        ("TRYAGAIN Multiple keys request during rehashing of slot", False),
        ("BUSY Redis is busy running a script.", False),
        ("MOVED 3999 127.0.0.1:6381", False),
    ],
)
def test_error_replies_are_rejected_or_unavailable(reply: str, rejected: bool) -> None:
    got = classify(parse_error(reply))
    if rejected:
        assert isinstance(got, Rejected) and got.message == reply and str(got) == f"rejected by redis: {reply}"
    else:
        assert got is None
    assert classify(redis.ConnectionError("Connection refused")) is None
    assert classify(redis.TimeoutError("Timeout reading from socket")) is None


def test_refusals_are_rejected_never_failed_open(server: Server) -> None:
    admin = server.connect()
    admin.execute_command("ACL", "SETUSER", "app", "on", ">pw", "~*", "+@all", "-rl.tokenbucket")
    tb = TokenBucket(10, 5)
    opts = Options(timeout=2.0, breaker=ratelimit_client.BreakerConfig(failures=1))
    # NOPERM: the user may not run the command.
    c = Client.from_url(server.url, opts, username="app", password="pw")
    for _ in range(3):
        with pytest.raises(Rejected) as e:
            c.check("k", tb)
        assert e.value.message.startswith("NOPERM ") and "'rl.tokenbucket'" in e.value.message
    assert not c.breaker_open()
    assert c.check("other", FixedWindow(2, 60)).decision.remaining == 1
    # WRONGPASS and NOAUTH: the password is wrong, or missing.
    with pytest.raises(Rejected) as e:
        Client.from_url(server.url, opts, username="app", password="nope").check("k", tb)
    assert e.value.message == "WRONGPASS invalid username-password pair or user is disabled."
    admin.execute_command("CONFIG", "SET", "requirepass", "secret")
    nopass = Client.from_url(server.url, opts)
    with pytest.raises(Rejected) as e:
        nopass.check("k", tb)
    # redis-py speaks RESP3 by default: the refusal is HELLO's.
    assert e.value.message.startswith("NOAUTH HELLO must be called with the client already authenticated")
    assert not nopass.breaker_open()
    with pytest.raises(Rejected) as e:
        Client.from_url(server.url, opts, protocol=2).check("k", tb)
    assert e.value.message == "NOAUTH Authentication required."
    admin = server.connect(password="secret")
    admin.execute_command("CONFIG", "SET", "requirepass", "")
    # OOM: the server is full; a denial and a peek still answer.
    c = Client.from_url(server.url, opts)
    assert c.check("full", FixedWindow(1, 60)).decision.allowed
    admin.execute_command("CONFIG", "SET", "maxmemory", "1")
    try:
        with pytest.raises(Rejected) as e:
            c.check("k", tb)
        assert e.value.message == "OOM command not allowed when used memory > 'maxmemory'."
        assert c.check("full", FixedWindow(1, 60)).decision.allowed is False
        assert c.peek("k", tb).decision.remaining == 10
    finally:
        admin.execute_command("CONFIG", "SET", "maxmemory", "0")
    assert not c.breaker_open()


def test_readonly_is_rejected_and_the_client_reconnects(server: Server) -> None:
    with Server(extra=["--replicaof", "127.0.0.1", str(server.port)]) as replica:
        c = Client.from_url(replica.url, Options(policy=FailClosed(), timeout=2.0), client_name="rl-readonly")
        with pytest.raises(Rejected) as e:
            c.check("k", TokenBucket(10, 5))
        assert e.value.message == "READONLY You can't write against a read only replica."
        admin = replica.connect()
        names = [x["name"] for x in admin.client_list()]
        assert "rl-readonly" not in names, "the connection was dropped"
        # The failover: the address is a master now, and the next call reaches it.
        admin.execute_command("REPLICAOF", "NO", "ONE")
        o = c.check("k", TokenBucket(10, 5))
        assert (o.degraded, o.decision.remaining) == (None, 9)


def test_async_refusals_alike(server: Server) -> None:
    server.connect().execute_command("ACL", "SETUSER", "app", "on", ">pw", "~*", "+@all", "-rl.all")

    async def run() -> tuple[str, Any]:
        async with AsyncClient.from_url(server.url, SLACK, username="app", password="pw") as c:
            try:
                await c.check_all([("{a}x", TokenBucket(1, 1)), ("{a}y", TokenBucket(1, 1))])
            except Rejected as e:
                return e.message, await c.check("k", TokenBucket(1, 1))
        raise AssertionError("not rejected")

    message, o = asyncio.run(run())
    assert message.startswith("NOPERM ") and "'rl.all'" in message
    assert o.decision.allowed and o.degraded is None


def test_top_needs_the_module_and_a_connection(server: Server, bare_server: Server) -> None:
    c = Client.from_url(server.url, SLACK)
    assert c.check("a", FixedWindow(1, 60)).decision.allowed
    assert not c.check("a", FixedWindow(1, 60)).decision.allowed
    [e] = c.top(10)
    assert (e.key, e.denied, e.error, e.command) == ("a", 1, 0, "RL.FIXEDWINDOW")
    assert e.first_denied_ms == e.last_denied_ms > 0
    c.reset_top()
    assert c.top() == []
    with pytest.raises(Unsupported):
        Client.from_url(bare_server.url, SLACK).top()
    with pytest.raises(ratelimit_client.Unavailable):
        Client.from_url("redis://127.0.0.1:1").top()


def test_local_policy_answers_for_every_call_when_unreachable() -> None:
    c = Client.from_url("redis://127.0.0.1:1", Options(policy=Local(2)))
    o = c.check("k", TokenBucket(10, 0.001), 4)
    assert (o.degraded, o.decision.allowed, o.decision.remaining, o.decision.limit) == (Degraded.LOCAL, True, 1, 5)
    assert c.mode is None
    r = c.reserve("r", TokenBucket(10, 0.001), 5)
    assert r.reservation is not None and r.reservation.degraded is Degraded.LOCAL
    s = r.reservation.settle(2)
    assert (s.degraded, s.decisions[0].remaining) == (Degraded.LOCAL, 3)
    with pytest.raises(Unsupported):
        r.reservation.settle(2)


@pytest.mark.parametrize("protocol", [2, 3])
def test_resp2_and_resp3_answer_alike(protocol: int, clock_server: Server) -> None:
    load_library(clock_server.connect())
    answers = []
    for mode in (ModeChoice.MODULE, ModeChoice.FUNCTION, ModeChoice.SCRIPT):
        clock_server.connect().flushall()
        c = Client.from_url(clock_server.url, Options(mode=mode, timeout=2.0), protocol=protocol)
        a = FixedWindow(2, 60)
        outcomes = [c.check("k", a).decision for _ in range(3)]
        multi = c.check_all([("{u}a", a), ("{u}b", TokenBucket(3, 1))], 1)
        lease = c.acquire("slots", Concurrency(1, 10))
        settled = c.settle([("k", a)], -1)
        answers.append((outcomes, multi.decisions, lease.outcome.decision, settled.decisions))
        if mode is ModeChoice.MODULE:
            assert [(e.key, e.denied) for e in c.top()] == [("k", 1)]
    assert answers[0] == answers[1] == answers[2]
    assert answers[0][0][2].allowed is False and answers[0][3][0].remaining == 1


def test_granted_is_the_units_taken_on_every_path(clock_server: Server) -> None:
    """``granted``: the cost when a check admits, 0 when it denies; a partial grant's units (its
    reply's sixth integer) in both clients; what each failure policy grants for ``UPTO n``."""
    a = FixedWindow(5, 60)
    c = Client.from_url(clock_server.url, SLACK)
    outcomes = (c.check("k", a, 2), c.check("k", a, 4))
    assert [(o.decision.allowed, o.granted) for o in outcomes] == [(True, 2), (False, 0)]
    assert (c.check_upto("k", a, 10).granted, c.check_upto("k", a, 10).granted) == (3, 0)
    assert c.check_all([("{u}a", a), ("{u}b", a)], 2).granted == 2
    assert c.check_all_upto([("{u}a", a), ("{u}t", TokenBucket(4, 0.001))], 9).granted == 3
    with pytest.raises(Unsupported):
        c.check_upto("k", a, 0)
    with pytest.raises(Unsupported):
        c.check_all_upto([("{u}a", a), ("{u}c", Concurrency(2, 10))], 1)
    stats = commandstats(clock_server)
    assert (stats["rl.fixedwindow"], stats["rl.all"]) == (4, 2)
    assert str(clock_server.connect().get("k")).split(" ")[:2] == ["fw", "5"]

    async def async_grants() -> list[int]:
        ac = AsyncClient.from_url(clock_server.url, SLACK)
        try:
            got = [(await ac.check_upto("j", a, 3)).granted, (await ac.check_upto("j", a, 3)).granted]
            got.append((await ac.check_upto("j", a, 3)).granted)
            got.append((await ac.check_all_upto([("{v}a", a), ("{v}b", a)], 7)).granted)
            return got
        finally:
            await ac.aclose()

    assert asyncio.run(async_grants()) == [3, 2, 0, 5]

    closed = "redis://127.0.0.1:1"
    fail_open = Client.from_url(closed).check_upto("k", a, 7)
    assert (fail_open.degraded, fail_open.granted, fail_open.decision.allowed) == (Degraded.FAIL_OPEN, 7, True)
    fail_closed = Client.from_url(closed, Options(policy=FailClosed())).check_all_upto([("{u}a", a), ("{u}b", a)], 7)
    assert (fail_closed.degraded, fail_closed.granted, fail_closed.allowed) == (Degraded.FAIL_CLOSED, 0, False)
