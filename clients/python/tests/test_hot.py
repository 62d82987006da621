# mypy: disallow-untyped-calls=False
"""Hot keys, against real servers on the real clock: what the table cannot show of the deny
cache (its entries last exactly their wait, then one probe asks Redis while the others are still
answered from it, never a denial of the failure policy, on in the middleware by default)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from ratelimit_client import (
    AsyncClient,
    Client,
    FailClosed,
    FixedWindow,
    LocalAnswer,
    Options,
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
