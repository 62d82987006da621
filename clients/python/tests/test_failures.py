# mypy: disallow-untyped-calls=False
"""Redis stopped and restarted under each failure policy, a hung server and the breaker, and the
deadline of a call, through both clients."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from ratelimit_client import (
    AsyncClient,
    BreakerConfig,
    Client,
    Concurrency,
    Decision,
    Degraded,
    FailClosed,
    FailOpen,
    FailurePolicy,
    Local,
    ModeChoice,
    Options,
    TokenBucket,
)
from servers import Server

BUCKET = TokenBucket(10, 1e-6)
SLOTS = Concurrency(4, 60)
POLICIES: dict[str, FailurePolicy] = {"fail_open": FailOpen(), "fail_closed": FailClosed(), "local": Local(2)}

# What each policy answers for the three checks of one unit while Redis is down (bucket of 10),
# and for a slot of SLOTS (4 slots).
WHILE_DOWN: dict[str, tuple[list[Decision], Decision, Degraded]] = {
    "fail_open": ([Decision(True, 10, 0, 0, 10)] * 3, Decision(True, 4, 0, 0, 4), Degraded.FAIL_OPEN),
    "fail_closed": ([Decision(False, 0, 1000, 1000, 10)] * 3, Decision(False, 0, 1000, 1000, 4), Degraded.FAIL_CLOSED),
    # Local for 2 instances: a fresh bucket of 5 (refilling 0.5e-6 per second) and 2 slots.
    "local": (
        [Decision(True, 4, 0, 2000000000, 5), Decision(True, 3, 0, 4000000000, 5), Decision(True, 2, 0, 6000000000, 5)],
        Decision(True, 1, 0, 60000, 2),
        Degraded.LOCAL,
    ),
}


def close_enough(got: Decision, want: Decision) -> bool:
    """Equal, but for the local bucket's and semaphore's times, measured on the real clock:
    within 5 ms below the exact value."""
    return (
        (got.allowed, got.remaining, got.limit) == (want.allowed, want.remaining, want.limit)
        and want.retry_after_ms - 5 <= got.retry_after_ms <= want.retry_after_ms
        and want.reset_after_ms - 5 <= got.reset_after_ms <= want.reset_after_ms
    )


def options(policy: str) -> Options:
    return Options(policy=POLICIES[policy], timeout=2.0, breaker=BreakerConfig(failures=1, cooldown=0.2))


def wait_recovered(call: Callable[[], Any]) -> Any:
    """Calls until Redis answers again (the breaker's cooldown, then its trial)."""
    deadline = time.monotonic() + 5
    while True:
        o = call()
        if o.degraded is None:
            return o
        assert time.monotonic() < deadline, "never recovered"
        time.sleep(0.05)


@pytest.mark.parametrize("policy", POLICIES)
def test_sync_client_through_a_restart(policy: str) -> None:
    with Server() as s:
        c = Client.from_url(s.url, options(policy))
        assert [c.check("k", BUCKET).decision.remaining for _ in range(3)] == [9, 8, 7]
        lease = c.acquire("slots", SLOTS)
        assert lease.lease is not None and lease.lease.holds_slot
        s.kill()
        checks, slot, degraded = WHILE_DOWN[policy]
        down = [c.check("k", BUCKET) for _ in range(3)]
        assert [o.degraded for o in down] == [degraded] * 3
        assert all(close_enough(o.decision, d) for o, d in zip(down, checks, strict=True)), down
        held = c.acquire("slots", SLOTS)
        assert held.outcome.degraded is degraded and close_enough(held.outcome.decision, slot), held
        # Admitted by fail-open: a lease that holds nothing; by local: an in-process slot.
        assert (held.lease is not None, held.lease is not None and held.lease.holds_slot) == {
            "fail_open": (True, False),
            "fail_closed": (False, False),
            "local": (True, True),
        }[policy]
        reservation = c.reserve("r", BUCKET, 3).reservation
        assert lease.lease.release() is False, "Redis cannot answer: the lease expires by itself"
        s.start()
        # Back: Redis decides again (it restarted empty: a full bucket).
        o = wait_recovered(lambda: c.check("k", BUCKET))
        assert o.decision == Decision(True, 9, 0, 1000000000, 10)
        assert not c.breaker_open()
        if policy == "local":
            # Taken locally, settled locally, even once Redis is back; the slot goes back there.
            assert reservation is not None and held.lease is not None
            settled = reservation.settle(1)
            assert settled.degraded is Degraded.LOCAL and settled.decisions[0].remaining == 4
            assert held.lease.release() is True
        elif policy == "fail_open":
            assert reservation is not None and held.lease is not None
            assert reservation.settle(9).degraded is Degraded.FAIL_OPEN
            assert held.lease.release() is False
        else:
            assert reservation is None and held.lease is None
        c.close()


@pytest.mark.parametrize("policy", POLICIES)
def test_asyncio_client_through_a_restart(policy: str) -> None:
    async def run(s: Server) -> None:
        async with AsyncClient.from_url(s.url, options(policy)) as c:
            assert [(await c.check("k", BUCKET)).decision.remaining for _ in range(3)] == [9, 8, 7]
            s.kill()
            checks, slot, degraded = WHILE_DOWN[policy]
            down = [await c.check("k", BUCKET) for _ in range(3)]
            assert [o.degraded for o in down] == [degraded] * 3
            assert all(close_enough(o.decision, d) for o, d in zip(down, checks, strict=True)), down
            held = await c.acquire("slots", SLOTS)
            assert held.outcome.degraded is degraded and close_enough(held.outcome.decision, slot)
            s.start()
            deadline = time.monotonic() + 5
            while (o := await c.check("k", BUCKET)).degraded is not None:
                assert time.monotonic() < deadline, "never recovered"
                await asyncio.sleep(0.05)
            assert o.decision == Decision(True, 9, 0, 1000000000, 10)
            if held.lease is not None:
                await held.lease.release()

    with Server() as s:
        asyncio.run(run(s))


def test_a_hung_server_opens_the_breaker() -> None:
    with Server() as s:
        opts = Options(timeout=0.1, mode=ModeChoice.MODULE, breaker=BreakerConfig(failures=3, cooldown=0.5))
        c = Client.from_url(s.url, opts)
        assert c.check("k", BUCKET).degraded is None
        s.freeze()
        try:
            took = []
            for _ in range(4):
                t = time.monotonic()
                o = c.check("k", BUCKET)
                took.append(time.monotonic() - t)
                assert o.degraded is Degraded.FAIL_OPEN
            # Three calls wait out the deadline; then the breaker answers at once.
            assert all(0.09 <= x < 1.0 for x in took[:3]), took
            assert took[3] < 0.05 and c.breaker_open(), took
        finally:
            s.thaw()
        time.sleep(0.5)
        # The trial call goes through and closes the breaker.
        o = c.check("other", BUCKET)
        assert (o.degraded, o.decision.remaining) == (None, 9)
        assert not c.breaker_open()


def test_the_asyncio_deadline_covers_the_whole_call() -> None:
    async def timed(call: Callable[[], Awaitable[Any]]) -> tuple[Any, float]:
        t = time.monotonic()
        o = await call()
        return o, time.monotonic() - t

    async def run(s: Server) -> None:
        # Auto mode: detection and the command share one deadline.
        c = AsyncClient.from_url(s.url, Options(timeout=0.1, policy=FailClosed()))
        s.freeze()
        try:
            o, took = await timed(lambda: c.check("k", BUCKET))
            assert o.degraded is Degraded.FAIL_CLOSED and 0.09 <= took < 1.0, took
            assert c.mode is None
        finally:
            s.thaw()
        o, _ = await timed(lambda: c.check("k", BUCKET))
        assert o.degraded is None and c.mode is not None
        await c.aclose()

    with Server() as s:
        asyncio.run(run(s))
