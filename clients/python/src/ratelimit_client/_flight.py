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
from typing import Any


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
    if loop is asyncio._get_running_loop():
        # On the future's own loop (its thread): at once, without waking the loop's selector.
        _hand(fut, value, undo)
        return
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
    be reached), or when no round trip has ended for ``stall`` seconds.

    What it costs a call: the count of open connections is kept from one call to the next and
    counted again only when it would hold a call back, or after a call failed or connections
    were closed (:meth:`recount`); a place freed goes to the first task waiting on the same loop
    at once (to a thread or another loop's task through that loop); and the tasks waiting on a
    loop share one timer for the stall, not one each."""

    def __init__(
        self,
        size: int,
        stall: float,
        connected: Callable[[], int] | None,
        refused: Callable[[], bool],
        opening: int = 2,
        threads: bool = True,
    ) -> None:
        #: Whether threads share the gate (a synchronous client's); else one event loop has it
        #: (an asyncio client has a gate per loop), and a place free now is taken without the lock.
        self._threads = threads
        self._refused = refused
        self._lock = threading.Lock()
        self._freed = threading.Condition(self._lock)
        self._size = max(1, size)
        self._connected = connected
        self._opening = max(1, opening)
        #: The open connections when last counted (0: count again before trusting it).
        self._seen = 0
        self._in = 0
        self._stall = stall
        self._last = time.monotonic()
        self._failures = 0
        self._waiting = 0
        #: The tasks waiting, first come first: (future, when it began to wait).
        self._futures: deque[tuple[asyncio.Future[bool], float]] = deque()
        #: Per loop with tasks waiting, the timer that refuses those that waited out the stall.
        self._watch: dict[asyncio.AbstractEventLoop, asyncio.TimerHandle] = {}

    def progress(self, now: float | None = None) -> None:
        """A round trip ended with Redis's reply (``now``: ``time.monotonic()`` then)."""
        self._last = time.monotonic() if now is None else now

    def recount(self) -> None:
        """Connections may have closed (a call failed or was cancelled, the pool disconnected):
        count them again before a call relies on them."""
        self._seen = 0

    def failed(self) -> None:
        """A call in flight failed: once that has opened the breaker, the calls waiting are
        answered by the policy."""
        self._seen = 0
        if not self._refused():
            return
        with self._lock:
            self._failures += 1
            futures, self._futures = self._futures, deque()
            self._freed.notify_all()
        for fut, _ in futures:
            _notify(fut, False, None)

    def _count(self) -> int:
        assert self._connected is not None
        self._seen = self._connected()
        return self._seen

    def _open(self) -> bool:
        """Under the lock: whether a call may go now."""
        if self._in >= self._size:
            return False
        if self._connected is None or self._in < self._seen + self._opening:
            return True
        return self._in < self._count() + self._opening

    def _stalled(self, since: float) -> float:
        """Seconds left before a waiter that began at ``since`` gives up on a silent Redis."""
        return max(since, self._last) + self._stall - time.monotonic()

    def _opener(self) -> bool:
        """Under the lock, for a caller that just took a place: whether no open connection is
        left for it (it opens one)."""
        if self._connected is None or self._in <= self._seen:
            return False
        return self._in > self._count()

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
        got = self.enter_or_queue()
        if type(got) is bool:
            return got
        return await self.queued(got)

    def enter_or_queue(self) -> bool | asyncio.Future[bool]:
        """A place at once if there is one: whether the caller opens a connection (no open one
        is left); else, under the same lock, the running task in the queue: the future that
        :meth:`queued` waits for (no future is made when a place is free)."""
        if not self._threads and self._in < self._seen and self._in < self._size and not self._futures:
            # A place and an open connection for it (what _open() and _opener() would say).
            self._in += 1
            return False
        with self._lock:
            if self._open() and not self._futures and not self._waiting:
                self._in += 1
                return self._opener()
            loop = asyncio.get_running_loop()
            fut: asyncio.Future[bool] = loop.create_future()
            self._futures.append((fut, time.monotonic()))
            if loop not in self._watch:
                self._watch[loop] = loop.call_at(loop.time() + self._stall, self._sweep, loop)
        return fut

    async def queued(self, fut: asyncio.Future[bool]) -> bool:
        """The rest of :meth:`enter_async` for a task queued by :meth:`enter_or_queue`."""
        try:
            if not await fut:
                raise Failure
            if self._connected is None or self._in <= self._seen:
                return False  # what _opener() says, without the lock when it needs no count
            with self._lock:
                return self._opener()
        except BaseException:
            with self._lock:
                held = fut.done() and not fut.cancelled() and fut.result()
                if not fut.done():
                    fut.cancel()
                    self._drop(fut)
            if held:
                self.leave()
            raise

    def _drop(self, fut: asyncio.Future[bool]) -> None:
        """Under the lock: ``fut`` waits no more."""
        for i, (f, _) in enumerate(self._futures):
            if f is fut:
                del self._futures[i]
                return

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        """On ``loop``: refuses its tasks that have waited out the stall (no round trip ended
        for ``stall`` seconds since they began to wait), and looks again when the next would."""
        refused: list[asyncio.Future[bool]] = []
        with self._lock:
            del self._watch[loop]
            next_at: float | None = None
            kept: deque[tuple[asyncio.Future[bool], float]] = deque()
            for fut, since in self._futures:
                if fut.get_loop() is loop:
                    if fut.done():
                        continue
                    left = self._stalled(since)
                    if left <= 0:
                        refused.append(fut)
                        continue
                    next_at = left if next_at is None else min(next_at, left)
                kept.append((fut, since))
            self._futures = kept
            if next_at is not None:
                self._watch[loop] = loop.call_at(loop.time() + next_at, self._sweep, loop)
        for fut in refused:
            fut.set_result(False)

    def leave(self) -> None:
        """The place is free again: to the first waiters, else to the next callers."""
        if not self._threads and not self._futures:
            self._in -= 1
            return
        handed: list[asyncio.Future[bool]] = []
        with self._lock:
            self._in -= 1
            while self._futures and self._open():
                fut, _ = self._futures.popleft()
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
    can be paused (:meth:`paused`) while the call waits for another's start-up step.

    Started by :meth:`Sweep.start` it has no timer of its own: the calls of a client on one loop
    share one (see :class:`Sweep`); paused, or given back time the loop lost, it takes one."""

    __slots__ = ("_cancelling", "_fired", "_grace", "_handle", "_loop", "_seconds", "_sweep", "_task", "_when")

    def __init__(self, seconds: float, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._seconds = seconds
        self._loop = loop if loop is not None else asyncio.get_running_loop()
        self._task: asyncio.Task[object] | None = None
        self._handle: asyncio.Handle | None = None
        #: The sweep that watches this deadline, while it is one of its calls.
        self._sweep: Sweep | None = None
        self._when = 0.0
        self._fired = False
        self._cancelling = 0
        self._grace = 0.0

    def begin(self, sweep: Sweep | None = None) -> None:
        """Starts the deadline of the running task: on a timer of its own, or watched by
        ``sweep`` (a sweep of this loop and of the same timeout)."""
        task = asyncio.current_task(self._loop)
        assert task is not None
        self._task = task
        self._cancelling = task.cancelling()
        self._when = self._loop.time() + self._seconds
        if sweep is None:
            self._handle = self._loop.call_at(self._when, self._due)
        else:
            sweep.add(self)

    def end(self, exc_type: type[BaseException] | None) -> bool:
        """Stops the deadline; whether the call's ``CancelledError`` (``exc_type``) was this
        deadline's: the caller raises ``TimeoutError`` instead."""
        sweep = self._sweep
        if sweep is not None:
            sweep.remove(self)
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._fired and self._task is not None:
            return self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError
        return False

    async def __aenter__(self) -> Deadline:
        self.begin()
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
        if self.end(exc_type):
            raise TimeoutError from exc

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """The time inside is not counted."""
        sweep = self._sweep
        if sweep is not None:
            sweep.remove(self)
        elif self._handle is not None:
            self._handle.cancel()
        else:
            yield
            return
        left = self._when - self._loop.time()
        try:
            yield
        finally:
            self._when = self._loop.time() + left
            self._handle = self._loop.call_at(self._when, self._due)


class Sweep:
    """The deadlines of a client's calls on one event loop, watched by one timer rather than a
    timer each: every call has the same timeout, so they fall due in the order they began. The
    timer is set for the first call still running; when it fires, each call due is handled as
    its own timer would have handled it (expired one loop turn later, or given back the time
    the loop lost, on a timer of its own from then on), and the timer is set for the next. A
    call that ends leaves the sweep; the timer is not moved for it.

    A task has one call at a time, so the calls are kept by task, in the order they began (a
    dict keeps it): a call of one limit (:meth:`begin`, :meth:`end`) is its task and when it
    falls due, with no object of its own until it does; a call that may pause its deadline
    (:meth:`start`) is a :class:`Deadline`.

    A sweep serves the first loop that uses it for as long as that loop is open (a deadline
    started on another loop takes a timer of its own: :meth:`start` and :meth:`begin` say
    which)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._loop: asyncio.AbstractEventLoop | None = None
        #: The calls watched, first begun first: per task, when it falls due (and the task's
        #: cancellations then, when there were any) or its Deadline.
        self._calls: dict[asyncio.Task[Any], float | tuple[float, int] | Deadline] = {}
        #: The calls of :meth:`begin` that fell due, on their Deadline from then on.
        self._due: dict[asyncio.Task[Any], Deadline] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._lock = threading.Lock()

    def begin(self, loop: asyncio.AbstractEventLoop) -> asyncio.Task[Any] | Deadline:
        """The deadline of the running task on ``loop`` (the running loop), begun: what
        :meth:`end` takes (the task, or on a loop the sweep does not serve, a Deadline on a
        timer of its own)."""
        if loop is not self._loop and not self._adopt(loop):
            d = Deadline(self.seconds, loop)
            d.begin()
            return d
        task = asyncio.current_task(loop)
        assert task is not None
        when = loop.time() + self.seconds
        cancelling = task.cancelling()
        self._calls[task] = (when, cancelling) if cancelling else when
        if self._timer is None:
            self._timer = loop.call_at(when, self._run)
        return task

    def end(self, call: asyncio.Task[Any] | Deadline, exc_type: type[BaseException] | None) -> bool:
        """Stops the deadline :meth:`begin` gave; whether the call's ``CancelledError``
        (``exc_type``) was this deadline's: the caller raises ``TimeoutError`` instead."""
        if self._calls.pop(call, None) is not None:  # type: ignore[arg-type]
            return False  # not due yet
        if type(call) is Deadline:
            return call.end(exc_type)
        d = self._due.pop(call, None)  # type: ignore[arg-type]
        return d is not None and d.end(exc_type)

    def start(self) -> Deadline:
        """The running task's deadline, begun, as a :class:`Deadline` (one that can pause)."""
        loop = asyncio.get_running_loop()
        d = Deadline(self.seconds, loop)
        if loop is not self._loop and not self._adopt(loop):
            d.begin()
        else:
            d.begin(self)
        return d

    def _adopt(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Whether the sweep now serves ``loop``: it served none, or a loop that is closed."""
        with self._lock:
            if self._loop is loop:
                return True
            if self._loop is not None and not self._loop.is_closed():
                return False
            self._loop = loop
            self._calls.clear()
            self._due.clear()
            self._timer = None
            return True

    def add(self, d: Deadline) -> None:
        task = d._task
        assert task is not None
        d._sweep = self
        self._calls[task] = d
        if self._timer is None:
            self._timer = d._loop.call_at(d._when, self._run)

    def remove(self, d: Deadline) -> None:
        d._sweep = None
        task = d._task
        if task is not None and self._calls.get(task) is d:
            del self._calls[task]

    def _run(self) -> None:
        self._timer = None
        loop = self._loop
        assert loop is not None
        now = loop.time()
        calls = self._calls
        while calls:
            task, call = next(iter(calls.items()))
            if not isinstance(call, Deadline):
                when, cancelling = call if isinstance(call, tuple) else (call, 0)
                if when > now:
                    self._timer = loop.call_at(when, self._run)
                    return
                del calls[task]
                d = Deadline(self.seconds, loop)
                d._task, d._when, d._cancelling = task, when, cancelling
                self._due[task] = d
            else:
                d = call
                if d._when > now:
                    self._timer = loop.call_at(d._when, self._run)
                    return
                del calls[task]
                d._sweep = None
            d._due()
