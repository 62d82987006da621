# mypy: disallow-untyped-calls=False
"""Hot keys, against real servers on the real clock: what the table cannot show of the deny
cache (its entries last exactly their wait, then one probe asks Redis while the others are still
answered from it, never a denial of the failure policy, on in the middleware by default) and of
leased batches (sizes step by step, exact returns, leases ending, the bounded table, both
clients; processes racing on one hot key, one of them killed, against Redis's own count)."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import threading
import time
from typing import Any

import pytest

from ratelimit_client import (
    AsyncClient,
    Batching,
    BatchStats,
    Client,
    FailClosed,
    FixedWindow,
    LocalAnswer,
    Options,
    SlidingWindow,
    TokenBucket,
)
from ratelimit_client.asgi import RateLimitMiddleware as AsgiMiddleware
from ratelimit_client.middleware import Policy
from ratelimit_client.wsgi import RateLimitMiddleware as WsgiMiddleware
from servers import SLACK, Server


def calls(s: Server, command: str) -> int:
    info = s.connect().execute_command("INFO", "commandstats")
    return int(info.get(f"cmdstat_{command}", {}).get("calls", 0))


def test_a_denial_is_answered_in_process_exactly_until_its_wait_ends(server: Server) -> None:
    c = Client.from_url(server.url, SLACK).with_deny_cache(16)
    bucket = TokenBucket(1, 2)  # one token, back 500 ms after it is taken
    assert c.check("k", bucket).decision.allowed
    sent = time.monotonic()
    denied = c.check("k", bucket)
    assert (denied.decision.allowed, denied.answered_locally, c.deny_cache_len()) == (False, None, 1)
    wait = denied.decision.retry_after_ms
    assert 400 <= wait <= 500
    local = 0
    while True:
        before = time.monotonic()
        o = c.check("k", bucket)
        if o.answered_locally is None:
            break
        assert o.answered_locally is LocalAnswer.DENY_CACHE and not o.decision.allowed and o.granted == 0
        # Counted down on the process's clock from the moment the denied call was sent.
        gone = int((before - sent) * 1000)
        assert max(1, wait - gone - 1) <= o.decision.retry_after_ms <= max(1, wait - gone + 1)
        local += 1
        time.sleep(0.005)
    # The first check at or after the expiry asked Redis, and the token was back: admitted, and
    # the entry dropped (the admission left nothing, so the next check would probe again).
    assert time.monotonic() - sent >= wait / 1000
    assert o.decision.allowed and local > 10
    assert calls(server, "rl.tokenbucket") == 3


def test_one_probe_at_expiry_while_the_others_are_answered_from_the_entry(server: Server) -> None:
    c = Client.from_url(server.url, Options(timeout=0.4)).with_deny_cache(16)
    window = FixedWindow(1, 1)
    assert c.check("k", window).decision.allowed
    denied = c.check("k", window)
    assert not denied.decision.allowed and denied.answered_locally is None
    time.sleep(denied.decision.retry_after_ms / 1000 + 0.01)
    # Redis frozen: the probe (the first check after the expiry) waits out its timeout.
    server.freeze()
    try:
        probe: list[object] = []
        t = threading.Thread(target=lambda: probe.append(c.check("k", window)))
        t.start()
        time.sleep(0.1)
        others = [c.check("k", window) for _ in range(5)]
        assert [o.answered_locally for o in others] == [LocalAnswer.DENY_CACHE] * 5
        assert all(o.decision.retry_after_ms == 1 for o in others)  # the wait is over: at least 1
        t.join()
    finally:
        server.thaw()
    # The probe got no answer: the failure policy's (fail-open), never kept.
    assert len(probe) == 1
    # Its time is up: the entry is dropped and the next check asks Redis (which, thawed, ran the
    # probe's command late: the new window's unit may be gone, and a denial is kept again).
    time.sleep(0.35)
    after = c.check("k", window)
    assert after.answered_locally is None
    assert c.deny_cache_len() == (0 if after.decision.allowed else 1)


def test_the_failure_policy_is_never_kept_and_peeks_skip_the_cache(server: Server) -> None:
    closed = Client.from_url("redis://127.0.0.1:1", Options(policy=FailClosed())).with_deny_cache(4)
    assert [closed.check("k", FixedWindow(1, 60)).decision.allowed for _ in range(3)] == [False] * 3
    assert closed.deny_cache_len() == 0
    c = Client.from_url(server.url, SLACK).with_deny_cache(4)
    window = FixedWindow(1, 60)
    c.check("k", window)
    c.check("k", window)
    assert c.check("k", window).answered_locally is LocalAnswer.DENY_CACHE
    assert c.peek("k", window).answered_locally is None
    assert c.check_upto("k", window, 1).answered_locally is None
    assert calls(server, "rl.fixedwindow") == 4


def test_the_asyncio_client_has_the_same_cache(server: Server) -> None:
    async def run() -> list[LocalAnswer | None]:
        plain = AsyncClient.from_url(server.url, SLACK)
        c = plain.with_deny_cache(2)
        assert (plain.deny_cache_capacity(), c.deny_cache_capacity()) == (None, 2)
        window = FixedWindow(1, 60)
        got = [(await c.check("k", window)).answered_locally for _ in range(3)]
        multi = [("{u}a", window), ("{u}b", window)]
        got += [(await c.check_all(multi)).answered_locally for _ in range(3)]
        await c.aclose()
        return got

    local = LocalAnswer.DENY_CACHE
    assert asyncio.run(run()) == [None, None, local, None, None, local]
    assert (calls(server, "rl.fixedwindow"), calls(server, "rl.all")) == (2, 2)


def test_the_middleware_has_a_deny_cache_by_default() -> None:
    limits = {("*", "*"): [Policy("per-minute", FixedWindow(2, 60))]}
    client = Client.from_url("redis://127.0.0.1:1")
    on = WsgiMiddleware(client=client, limits=limits)
    off = WsgiMiddleware(client=client, limits=limits, deny_cache=False)
    sized = WsgiMiddleware(client=client, limits=limits, deny_cache_entries=5)
    assert (on.client.deny_cache_capacity(), off.client.deny_cache_capacity()) == (10_000, None)
    assert (sized.client.deny_cache_capacity(), client.deny_cache_capacity()) == (5, None)
    aclient = AsyncClient.from_url("redis://127.0.0.1:1")
    asgi = AsgiMiddleware(lambda *a: None, aclient, limits=limits)  # type: ignore[arg-type]
    assert (asgi.client.deny_cache_capacity(), aclient.deny_cache_capacity()) == (10_000, None)


@pytest.mark.parametrize("entries", [1, 3])
def test_entries_are_bounded_least_recently_used_first(server: Server, entries: int) -> None:
    c = Client.from_url(server.url, SLACK).with_deny_cache(entries)
    window = FixedWindow(1, 60)
    for i in range(entries + 2):
        c.check(f"k{i}", window)
        c.check(f"k{i}", window)
    assert c.deny_cache_len() == entries
    # The newest ones are kept (each check of one makes it the most recently used); the oldest
    # two were evicted, and a check of one asks Redis.
    newest = [c.check(f"k{i}", window).answered_locally for i in reversed(range(2, entries + 2))]
    assert newest == [LocalAnswer.DENY_CACHE] * entries
    assert c.check("k1", window).answered_locally is None
    assert calls(server, "rl.fixedwindow") == 2 * (entries + 2) + 1


# Leased batches ---------------------------------------------------------------------------------


def stored(s: Server, key: str) -> int:
    """The count a fixed window holds (``fw <count> <start>``)."""
    return int(str(s.connect().get(key)).split(" ")[1])


def test_batch_sizes_follow_the_rule_step_by_step(server: Server) -> None:
    """B doubles when a batch is used up, never above ``⌊R / remaining_share⌋``; a batch given
    back halves it; near the limit every request is one call."""
    c = Client.from_url(server.url, SLACK).with_batching(Batching(hot_keys=["hot"], initial=4, lease=600))
    window = FixedWindow(100, 3600)
    limits = [("hot", window)]
    sizes, local = [], []
    for _ in range(13):
        o = c.check("hot", window)
        assert o.decision.allowed
        sizes.append(c.batch_size(limits))
        local.append(o.answered_locally is LocalAnswer.BATCH)
    # UPTO 4 (R 100: 96 left), three from it; UPTO 8 (B doubled; 88 left), seven from it; then
    # B would double to 16 but ⌊88 / 8⌋ = 11: UPTO 11, and B becomes min(16, ⌊77 / 8⌋) = 9.
    assert sizes == [4, 4, 4, 4, 8, 8, 8, 8, 8, 8, 8, 8, 9]
    assert local == [False, True, True, True, False, True, True, True, True, True, True, True, False]
    assert stored(server, "hot") == 4 + 8 + 11
    assert c.batch_stats() == BatchStats(refills=3, granted=23, used=13, answered=10, returned=0, lapsed=0, held=10)
    assert c.flush() == 10
    assert (stored(server, "hot"), c.batch_size(limits)) == (13, 4)  # given back: B halved
    # Near the limit: 87 left; take all but 15. R is still 77 (the latest grant's) and B 4:
    # UPTO 4 (11 left, B becomes max(1, min(4, ⌊11 / 8⌋)) = 1), three from it, then ⌊11 / 8⌋ = 1
    # is not above the cost and each request is a call of its own.
    server.connect().execute_command("RL.FIXEDWINDOW", "hot", 100, 3600, 72)
    before = calls(server, "rl.fixedwindow")
    outcomes = [c.check("hot", window) for _ in range(17)]
    assert [o.decision.allowed for o in outcomes] == [True] * 15 + [False] * 2
    assert [o.answered_locally for o in outcomes] == [None] + [LocalAnswer.BATCH] * 3 + [None] * 13
    assert (calls(server, "rl.fixedwindow") - before, c.batch_size(limits)) == (14, 1)
    assert stored(server, "hot") == 100


def test_returns_are_exact_and_a_sliding_window_lapses(server: Server) -> None:
    c = Client.from_url(server.url, SLACK).with_batching(Batching(hot_keys=["b", "s"], initial=16, lease=600))
    bucket = TokenBucket(1000, 0.001)
    c.check("b", bucket, 3)
    c.check("s", SlidingWindow(1000, 3600), 3)
    # The bucket's batch of 16 holds 13: all but what it may refill before the return lands
    # (0.001/s over the timeout of 2 s, rounded up: 1), since the grant left it no room below its
    # capacity. The sliding window's 13 cannot go back exactly: they lapse.
    assert c.flush() == 12
    assert server.connect().execute_command("RL.TOKENBUCKET", "b", 1000, 0.001, 0)[1] == 996
    assert server.connect().execute_command("RL.SLIDINGWINDOW", "s", 1000, 3600, 0)[1] == 984
    assert (c.batch_stats().returned, c.batch_stats().lapsed) == (12, 1 + 13)


def test_a_batch_goes_back_when_its_lease_ends_and_the_table_is_bounded(server: Server) -> None:
    c = Client.from_url(server.url, SLACK).with_batching(
        Batching(hot_keys_where=lambda k: k.startswith("h"), initial=8, lease=0.2, max_keys=2)
    )
    window = FixedWindow(1000, 3600)
    c.check("h1", window)
    assert stored(server, "h1") == 8
    time.sleep(0.5)  # the lease ended: 7 back, without a call on the key
    assert stored(server, "h1") == 1
    c.check("h1", window)
    c.check("h2", window)
    c.check("h3", window)  # a third entry evicts the least recently used, h1, and its batch
    deadline = time.monotonic() + 5
    while stored(server, "h1") != 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [stored(server, k) for k in ("h1", "h2", "h3")] == [2, 8, 8]
    assert c.close() == 14
    assert [stored(server, k) for k in ("h1", "h2", "h3")] == [2, 1, 1]
    # Closed: one call per request from now on, for every copy sharing the batches.
    assert c.check("h2", window).answered_locally is None and stored(server, "h2") == 2


def test_the_asyncio_client_batches_alike(server: Server) -> None:
    async def run() -> tuple[list[bool], int, int]:
        c = AsyncClient.from_url(server.url, SLACK).with_batching(Batching(hot_keys=["hot"], initial=4, lease=600))
        window = FixedWindow(100, 3600)
        outcomes = await asyncio.gather(*(c.check("hot", window) for _ in range(20)))
        admitted = [o.decision.allowed for o in outcomes]
        held = stored(server, "hot")
        returned = await c.aclose()
        return admitted, held, returned

    admitted, held, returned = asyncio.run(run())
    assert admitted == [True] * 20
    assert stored(server, "hot") == 20 == held - returned


RACE_LIMIT = 5000


def racer(url: str, limit: int, threads: int, per_thread: int, admitted: Any, go: Any) -> None:
    """A process of ``threads`` threads checking the hot key ``per_thread`` times each, counting
    its admissions in ``admitted`` (shared memory, so that a process killed midway has told)."""
    c = Client.from_url(url, SLACK).with_batching(Batching(hot_keys=["hot"]))
    window = FixedWindow(limit, 3600)
    go.wait()

    def run() -> None:
        for _ in range(per_thread):
            if c.check("hot", window).decision.allowed:
                with admitted.get_lock():
                    admitted.value += 1

    pool = [threading.Thread(target=run) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    c.close()


def race(server: Server, processes: int, kill: bool, limit: int = RACE_LIMIT) -> tuple[list[int], int, int, int | None]:
    """``processes`` racers on the hot key, a fixed window of ``limit`` (3 threads, 800 checks
    each: more than 5,000 in all); with ``kill``, the first to have admitted 300 is killed with
    SIGKILL. Each process's admissions, Redis's count once the others have closed, the calls
    Redis served, and which one was killed."""
    ctx = multiprocessing.get_context("spawn")
    go = ctx.Event()
    counts = [ctx.Value("l", 0) for _ in range(processes)]
    procs = [ctx.Process(target=racer, args=(server.url, limit, 3, 800, counts[i], go)) for i in range(processes)]
    for p in procs:
        p.start()
    go.set()
    killed: int | None = None
    deadline = time.monotonic() + 60
    while kill and killed is None:
        killed = next((i for i, c in enumerate(counts) if c.value >= 300), None)
        assert time.monotonic() < deadline
        time.sleep(0.001)
    if killed is not None:
        os.kill(procs[killed].pid or 0, signal.SIGKILL)
    for i, p in enumerate(procs):
        p.join(120)
        assert p.exitcode == (-signal.SIGKILL if i == killed else 0)
    served = calls(server, "rl.fixedwindow") + calls(server, "rl.settle")
    return [c.value for c in counts], stored(server, "hot"), served, killed


@pytest.mark.heavy
def test_racing_processes_admit_exactly_what_redis_counts(server: Server) -> None:
    admitted, count, served, _ = race(server, 4, False)
    # 9,600 checks on a limit of 5,000: never more admitted than the limit, and once every
    # process has closed, Redis counts exactly what they admitted (every unit held went back).
    assert sum(admitted) == count <= RACE_LIMIT
    print(f"\nexhausted: {sum(admitted)} admitted of {RACE_LIMIT}, {count} counted, {served} calls")


@pytest.mark.heavy
def test_a_hot_key_costs_a_fraction_of_a_call_per_admission(server: Server) -> None:
    admitted, count, served, _ = race(server, 4, False, limit=1_000_000)
    # Far from its limit: all 9,600 admitted, a few grants and returns per process and lease.
    assert sum(admitted) == count == 9600
    print(f"\nhot key: {count} admitted, {served} calls ({served / count:.4f} per admission)")
    assert served < count / 20


@pytest.mark.heavy
def test_a_killed_process_loses_at_most_one_batch_and_never_over_admits(server: Server) -> None:
    admitted, count, _, killed = race(server, 4, True)
    assert killed is not None
    lost = count - sum(admitted)
    # What the killed process held in its one batch is lost (counted by Redis, admitted by no
    # one): at most one batch, never a unit admitted twice.
    assert sum(admitted) <= count <= RACE_LIMIT
    assert 0 <= lost <= Batching().max_batch
    print(f"\nkilled: {admitted[killed]} admitted by it, {sum(admitted)} in all, {count} counted by Redis, {lost} lost")


def test_an_asyncio_caller_gone_during_its_refill_gives_its_unit_back(server: Server) -> None:
    """A cancelled request does not cancel its refill: the grant completes, the batch is kept,
    and the unit the caller would have used goes back."""

    async def run() -> tuple[BatchStats, int]:
        c = AsyncClient.from_url(server.url, Options(timeout=1.0)).with_batching(
            Batching(hot_keys=["hot"], initial=8, lease=600)
        )
        window = FixedWindow(100, 3600)
        await c.check("cold", window)  # the mode detected
        server.freeze()
        try:
            task = asyncio.create_task(c.check("hot", window))
            await asyncio.sleep(0.2)  # its grant (UPTO 8) sent, unanswered
            task.cancel()
        finally:
            server.thaw()
        with pytest.raises(asyncio.CancelledError):
            await task
        deadline = time.monotonic() + 5
        while c.batch_stats().returned < 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        stats = c.batch_stats()
        return stats, await c.aclose()

    stats, returned = asyncio.run(run())
    assert stats == BatchStats(refills=1, granted=8, used=0, answered=0, returned=1, lapsed=0, held=7)
    assert returned == 7 and stored(server, "hot") == 0


def test_copies_of_an_asyncio_client_share_its_loops(server: Server) -> None:
    """A copy (with_deny_cache, with_batching) shares the pools of its client and which loop
    each serves: one used on a loop, then the other on another, both reach Redis."""
    plain = AsyncClient.from_url(server.url, SLACK)
    cached = plain.with_deny_cache(4)

    async def one(c: AsyncClient) -> object:
        return (await c.check("k", FixedWindow(10, 60))).degraded

    assert asyncio.run(one(cached)) is None
    assert asyncio.run(one(plain)) is None
    assert asyncio.run(one(cached)) is None
    assert calls(server, "rl.fixedwindow") == 3
