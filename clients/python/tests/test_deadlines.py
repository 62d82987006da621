# mypy: disallow-untyped-calls=False
"""The asyncio client's deadlines on one timer per loop (the sweep), the fallback to a timer per
call on another loop, and the gate's one stall timer per loop, on a frozen server (SIGSTOP)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from ratelimit_client import AsyncClient, BreakerConfig, Degraded, ModeChoice, Options, TokenBucket
from servers import Server

BUCKET = TokenBucket(10, 1e-6)
#: How much later than its deadline a call may end on a loaded machine (a loop turn, a wakeup).
LATE = 0.15


async def connections(c: AsyncClient, n: int) -> None:
    """Opens ``n`` connections of the client's pool now, while Redis answers."""
    pool = c.redis.connection_pool  # type: ignore[union-attr]
    held = [await pool.get_connection() for _ in range(n)]
    for conn in held:
        await pool.release(conn)


async def timed(c: AsyncClient, key: str, after: float) -> tuple[float, Degraded | None]:
    await asyncio.sleep(after)
    t = time.monotonic()
    o = await c.check(key, BUCKET)
    return time.monotonic() - t, o.degraded


def test_swept_deadlines_fail_each_call_at_its_own_time() -> None:
    """Eight calls begun 20 ms apart on a frozen server: each is answered by the policy at its
    own timeout (not at the first one's, not later), and the one silence they met counts once
    for the breaker; the next call's silence is a second failure and opens it."""

    async def run(s: Server) -> None:
        opts = Options(timeout=0.2, mode=ModeChoice.MODULE, breaker=BreakerConfig(failures=2, cooldown=5.0))
        c = AsyncClient.from_url(s.url, opts)
        await connections(c, 8)
        assert (await c.check("warm", BUCKET)).degraded is None
        s.freeze()
        try:
            got = await asyncio.gather(*(timed(c, f"k{i}", 0.02 * i) for i in range(8)))
            assert [d for _, d in got] == [Degraded.FAIL_OPEN] * 8
            assert all(0.2 <= took < 0.2 + LATE for took, _ in got), got
            assert not c.breaker_open()
            # The connections of the calls that failed were closed: this one opens one, which
            # the frozen server does not answer either (within four timeouts).
            took, degraded = await timed(c, "last", 0)
            assert degraded is Degraded.FAIL_OPEN and 0.8 <= took < 0.8 + LATE, took
            assert c.breaker_open()
        finally:
            s.thaw()
        await c.aclose()

    with Server() as s:
        asyncio.run(run(s))


def test_checks_of_one_limit_and_of_several_share_the_sweep() -> None:
    """Calls of one limit (watched as their task) and of two limits (a Deadline each) begun
    in turn 20 ms apart on a frozen server: each fails at its own timeout, and once they have
    ended the sweep holds none of them, whether it fired for them or not."""
    two = (TokenBucket(10, 1e-6), TokenBucket(20, 1e-6))

    async def both(c: AsyncClient, i: int) -> tuple[float, Degraded | None]:
        await asyncio.sleep(0.02 * i)
        t = time.monotonic()
        if i % 2:
            degraded = (await c.check_all([(f"a{i}", two[0]), (f"b{i}", two[1])])).degraded
        else:
            degraded = (await c.check(f"k{i}", BUCKET)).degraded
        return time.monotonic() - t, degraded

    async def run(s: Server) -> None:
        opts = Options(timeout=0.2, mode=ModeChoice.MODULE, breaker=BreakerConfig(failures=100))
        c = AsyncClient.from_url(s.url, opts)
        await connections(c, 6)
        assert (await c.check("warm", BUCKET)).degraded is None
        assert (await c.check_all([("wa", two[0]), ("wb", two[1])])).degraded is None
        sweep = c._sweep
        assert not sweep._calls and not sweep._due
        s.freeze()
        try:
            got = await asyncio.gather(*(both(c, i) for i in range(6)))
        finally:
            s.thaw()
        assert [d for _, d in got] == [Degraded.FAIL_OPEN] * 6
        assert all(0.2 <= took < 0.2 + LATE for took, _ in got), got
        assert not sweep._calls and not sweep._due
        assert (await c.check("after", BUCKET)).degraded is None
        assert not sweep._calls and not sweep._due
        await c.aclose()

    with Server() as s:
        asyncio.run(run(s))


def test_at_most_max_in_flight_calls_are_on_redis_at_once() -> None:
    """Forty tasks checking at once through a client of three places: never more than three
    commands on their way, every check answered by Redis, exactly (capacity 30: 30 admitted),
    and every place free after."""

    async def run(s: Server) -> None:
        c = AsyncClient.from_url(s.url, Options(timeout=1.0, mode=ModeChoice.MODULE, max_in_flight=3))
        assert (await c.check("warm", BUCKET)).degraded is None
        send = c.redis.execute_command
        on_way, most = 0, 0

        async def counted(*args: Any) -> object:
            nonlocal on_way, most
            on_way += 1
            most = max(most, on_way)
            try:
                await asyncio.sleep(0.001)
                return await send(*args)
            finally:
                on_way -= 1

        c.redis.execute_command = counted  # type: ignore[method-assign]
        got = await asyncio.gather(*(c.check("k", TokenBucket(30, 1e-6)) for _ in range(40)))
        assert [o.degraded for o in got] == [None] * 40
        assert sum(o.decision.allowed for o in got) == 30
        assert most == 3, most
        gate = c._gate
        assert gate is not None and gate._in == 0 and not gate._futures
        await c.aclose()

    with Server() as s:
        asyncio.run(run(s))


def test_a_call_on_a_second_loop_has_a_timer_of_its_own() -> None:
    """The sweep serves the first loop while it is open; a call on another loop meanwhile keeps
    its deadline on a timer of its own, exact all the same."""
    with Server() as s:
        c = AsyncClient.from_url(s.url, Options(timeout=0.2, mode=ModeChoice.MODULE))
        first = asyncio.new_event_loop()
        try:
            assert first.run_until_complete(c.check("k", BUCKET)).degraded is None

            async def frozen() -> tuple[float, Degraded | None]:
                assert (await c.check("k", BUCKET)).degraded is None
                s.freeze()
                try:
                    return await timed(c, "k", 0)
                finally:
                    s.thaw()

            took, degraded = asyncio.run(frozen())
            assert degraded is Degraded.FAIL_OPEN and 0.2 <= took < 0.2 + LATE, took
            o = first.run_until_complete(c.check("k", BUCKET))
            # The frozen call was sent: Redis took its unit once thawed.
            assert (o.degraded, o.decision.remaining) == (None, 6)
            first.run_until_complete(c.aclose())
        finally:
            first.close()


def test_tasks_waiting_for_a_place_give_up_on_a_silent_server_together() -> None:
    """One place (max_in_flight=1), a breaker that never opens, twelve calls on a frozen server:
    the calls that get the place each fail at their deadline (the first at 0.1 s, the next
    ones also opening a connection, within four timeouts); those still waiting once no round
    trip has ended for a second (the stall: ten timeouts, at least 1 s) are answered by the
    policy then, all by the one timer of the loop, which is gone when no call waits."""

    async def run(s: Server) -> None:
        opts = Options(timeout=0.1, mode=ModeChoice.MODULE, max_in_flight=1, breaker=BreakerConfig(failures=1000))
        c = AsyncClient.from_url(s.url, opts)
        assert (await c.check("warm", BUCKET)).degraded is None
        s.freeze()
        try:
            got = await asyncio.gather(*(timed(c, f"k{i}", 0) for i in range(12)))
        finally:
            s.thaw()
        assert [d for _, d in got] == [Degraded.FAIL_OPEN] * 12
        took = sorted(t for t, _ in got)
        assert 0.1 <= took[0] < 0.1 + LATE, took
        refused = [t for t in took if t >= 1.0]
        assert len(refused) >= 6 and took[-1] < 1.0 + 0.4 + LATE, took
        gate = c._gate
        assert gate is not None and not gate._futures and not gate._watch
        o = await c.check("after", BUCKET)
        assert (o.degraded, o.decision.remaining) == (None, 9)
        await c.aclose()

    with Server() as s:
        asyncio.run(run(s))
