"""What keeps a client's start-up from being taken for a failure, shared by the synchronous and
the asyncio client: one run of a start-up step however many callers need it (:class:`Flight`),
and a bound on the calls on Redis at once whose waiters queue while Redis is answering
(:class:`Gate`). Both serve threads and asyncio tasks of any event loop."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractContextManager


class Failure(Exception):
    """Redis did not decide (the failure policy answers)."""


def _hand(fut: asyncio.Future[bool], value: bool, undo: Callable[[], None] | None) -> None:
    """Runs on the future's loop: gives ``value`` to its waiter, or, to a waiter that gave up
    meanwhile, ``undo`` (the place it was handed goes back)."""
    if fut.done():
        if undo is not None:
            undo()
        return
    fut.set_result(value)


def _notify(fut: asyncio.Future[bool], value: bool, undo: Callable[[], None] | None) -> None:
    loop = fut.get_loop()
    if loop.is_closed():
        if undo is not None:
            undo()
        return
    try:
        loop.call_soon_threadsafe(_hand, fut, value, undo)
    except RuntimeError:  # closed meanwhile
        if undo is not None:
            undo()


class Flight:
    """A step every caller needs done once (detecting the mode, loading a script after
    ``NOSCRIPT``): the first caller that needs it runs it; those that need it while it runs wait
    for its end and take its result, success or failure, without sending anything. A step that
    failed is run again by the next caller that needs it.

    ``generation`` counts the runs that succeeded: a caller passes the generation it saw before
    it found the step needed (a ``NOSCRIPT`` reply to a script sent at generation 3), so that a
    run that ended since is not run again for it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ended = threading.Condition(self._lock)
        self.generation = 0
        self._running = False
        self._runs = 0
        self._error: BaseException | None = None
        self._waiters: list[asyncio.Future[bool]] = []

    def _join(self, seen: int) -> int | None:
        """Under the lock: ``-1`` when a run ended after ``seen``, ``None`` when the caller runs
        the step, else the generation to wait past."""
        if self.generation > seen:
            return -1
        if not self._running:
            self._running = True
            return None
        return self.generation

    def _end(self, error: BaseException | None) -> None:
        ok = error is None
        with self._lock:
            self._error = error
            self._running = False
            self._runs += 1
            if ok:
                self.generation += 1
            waiters, self._waiters = self._waiters, []
            self._ended.notify_all()
        for fut in waiters:
            _notify(fut, ok, None)

    def run_sync(self, seen: int, step: Callable[[], None]) -> None:
        """Runs ``step`` or waits for the run in progress; :class:`Failure` (from that run's
        error) when that run failed; the error of a run of its own is raised as it is."""
        with self._lock:
            target = self._join(seen)
            if target is not None:
                if target < 0:
                    return
                runs = self._runs
                while self._runs == runs:
                    self._ended.wait()
                if self.generation == target:
                    raise Failure from self._error
                return
        try:
            step()
        except BaseException as e:
            self._end(e)
            raise
        self._end(None)

    async def run_async(
        self,
        seen: int,
        step: Callable[[], Awaitable[None]],
        outside: Callable[[], AbstractContextManager[None]] | None = None,
    ) -> None:
        """:meth:`run_sync` for a task; a wait for another's run happens inside ``outside()``
        (the call's deadline paused)."""
        with self._lock:
            target = self._join(seen)
            if target is not None:
                if target < 0:
                    return
                fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
                self._waiters.append(fut)
        if target is not None:
            with outside() if outside is not None else contextlib.nullcontext():
                ok = await asyncio.shield(fut)
            if not ok:
                raise Failure from self._error
            return
        try:
            await step()
        except BaseException as e:
            self._end(e)
            raise
        self._end(None)


class Gate:
    """At most ``size`` calls on Redis at once: each has a connection of the pool (which then
    never makes a call wait for one nor refuses one). Of those, at most ``opening`` more than
    the pool has connections (``connected()``) go at once: a burst on a cold client opens its
    connections a few at a time (each costs the client a few milliseconds of CPU), not all
    within the first calls' deadlines.

    A call beyond waits for a place outside its deadline, for as long as Redis answers: it is
    refused (:class:`Failure`, the failure policy answers) when calls in flight have failed
    until ``refused()`` says so (the breaker opened: Redis did not answer in time, or could not
    be reached), or when no round trip has ended for ``stall`` seconds."""

    def __init__(
        self,
        size: int,
        stall: float,
        connected: Callable[[], int] | None,
        refused: Callable[[], bool],
        opening: int = 2,
    ) -> None:
        self._refused = refused
        self._lock = threading.Lock()
        self._freed = threading.Condition(self._lock)
        self._size = max(1, size)
        self._connected = connected
        self._opening = max(1, opening)
        self._in = 0
        self._stall = stall
        self._last = time.monotonic()
        self._failures = 0
        self._waiting = 0
        self._futures: deque[asyncio.Future[bool]] = deque()

    def progress(self) -> None:
        """A round trip ended with Redis's reply."""
        self._last = time.monotonic()

    def failed(self) -> None:
        """A call in flight failed: once that has opened the breaker, the calls waiting are
        answered by the policy."""
        if not self._refused():
            return
        with self._lock:
            self._failures += 1
            futures, self._futures = self._futures, deque()
            self._freed.notify_all()
        for fut in futures:
            _notify(fut, False, None)

    def _open(self) -> bool:
        """Under the lock: whether a call may go now."""
        if self._in >= self._size:
            return False
        return self._connected is None or self._in < self._connected() + self._opening

    def _stalled(self, since: float) -> float:
        """Seconds left before a waiter that began at ``since`` gives up on a silent Redis."""
        return max(since, self._last) + self._stall - time.monotonic()

    def _opener(self) -> bool:
        """Under the lock, for a caller that just took a place: whether no open connection is
        left for it (it opens one)."""
        return self._connected is not None and self._in > self._connected()

    def enter(self) -> None:
        """A place for this thread, waiting as long as Redis answers."""
        with self._lock:
            if self._open() and not self._futures and not self._waiting:
                self._in += 1
                return
            start = time.monotonic()
            failures = self._failures
            self._waiting += 1
            try:
                while not self._open():
                    left = self._stalled(start)
                    if self._failures != failures or left <= 0:
                        raise Failure
                    self._freed.wait(left)
                if self._failures != failures:
                    raise Failure
                self._in += 1
            finally:
                self._waiting -= 1

    async def enter_async(self) -> bool:
        """:meth:`enter` for a task: whether it opens a connection (no open one is left)."""
        with self._lock:
            if self._open() and not self._futures and not self._waiting:
                self._in += 1
                return self._opener()
            fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
            self._futures.append(fut)
        start = time.monotonic()
        try:
            while not fut.done():
                left = self._stalled(start)
                if left <= 0:
                    raise Failure
                await asyncio.wait({fut}, timeout=left)
            if not fut.result():
                raise Failure
            with self._lock:
                return self._opener()
        except BaseException:
            with self._lock:
                held = fut.done() and not fut.cancelled() and fut.result()
                if not fut.done():
                    fut.cancel()
                    if fut in self._futures:
                        self._futures.remove(fut)
            if held:
                self.leave()
            raise

    def leave(self) -> None:
        """The place is free again: to the first waiters, else to the next callers."""
        handed: list[asyncio.Future[bool]] = []
        with self._lock:
            self._in -= 1
            while self._futures and self._open():
                fut = self._futures.popleft()
                if not fut.done():
                    self._in += 1
                    handed.append(fut)
            if self._waiting:
                self._freed.notify_all()
        for fut in handed:
            _notify(fut, True, self.leave)


def connected_in(pool: object) -> Callable[[], int] | None:
    """How many connections of a redis-py pool are open (idle or in use); ``None`` for a pool
    that does not show them."""
    if not hasattr(pool, "_available_connections") or not hasattr(pool, "_in_use_connections"):
        return None

    def count() -> int:
        idle = getattr(pool, "_available_connections", ())
        busy = getattr(pool, "_in_use_connections", ())
        return sum(1 for c in (*idle, *busy) if getattr(c, "is_connected", False) is True)

    return count


#: How late (seconds) the loop may look at a deadline before that lateness is given back.
LATE = 0.005


class Deadline:
    """``asyncio.timeout`` for a call to Redis, with three differences. At the due time it
    cancels the task one loop turn later, so that a reply already read from the socket (its task
    woken in the same turn) is taken rather than thrown away. A loop that looks at it late (the
    process starved of CPU, the loop busy with other work such as an HTTP server's requests)
    gives the call the time it lost, up to four timeouts in all: that time was not Redis's. And it
    can be paused (:meth:`paused`) while the call waits for another's start-up step."""

    def __init__(self, seconds: float) -> None:
        self._seconds = seconds
        self._loop = asyncio.get_running_loop()
        self._task: asyncio.Task[object] | None = None
        self._handle: asyncio.Handle | None = None
        self._when = 0.0
        self._fired = False
        self._cancelling = 0
        self._grace = 0.0

    async def __aenter__(self) -> Deadline:
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        self._cancelling = task.cancelling()
        self._when = self._loop.time() + self._seconds
        self._handle = self._loop.call_at(self._when, self._due)
        return self

    def _due(self) -> None:
        late = self._loop.time() - self._when
        if late > LATE and self._grace + late <= 4 * self._seconds:
            # The loop itself ran late (a starved process, other work on it): that time was not
            # Redis's to answer in. The call gets it again, up to four timeouts in all.
            self._grace += late
            self._when = self._loop.time() + late
            self._handle = self._loop.call_at(self._when, self._due)
            return
        self._handle = self._loop.call_soon(self._expire)

    def _expire(self) -> None:
        self._handle = None
        if self._task is not None and not self._task.done():
            self._fired = True
            self._task.cancel()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._fired and self._task is not None:
            if self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
                raise TimeoutError from exc

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """The time inside is not counted."""
        if self._handle is None:
            yield
            return
        self._handle.cancel()
        left = self._when - self._loop.time()
        try:
            yield
        finally:
            self._when = self._loop.time() + left
            self._handle = self._loop.call_at(self._when, self._due)
