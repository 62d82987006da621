"""The asyncio client (on ``redis.asyncio.Redis`` or ``redis.asyncio.cluster.RedisCluster``), of
the same shape as :mod:`ratelimit_client.client`: every call awaited, leases held with
``async with``, and each call, mode detection included, bounded as a whole by
``options.timeout``."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import threading
import time
import weakref
from collections.abc import Callable, Coroutine, Generator, Sequence
from types import TracebackType
from typing import Any, Generic, Protocol, TypeVar

import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.cluster as redis_cluster
import redis.asyncio.sentinel
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisClusterException, RedisError, ResponseError

from ._core import (
    ANSWER,
    ANY_NODE,
    ON_A_CLUSTER,
    PLAIN,
    Batch,
    Core,
    DenyCache,
    Detect,
    Durable,
    Exchange,
    Granted,
    Limits,
    LoadScript,
    Return,
    Table,
    UnexpectedReply,
    check_count,
    check_upto_args,
    classify,
    error_code,
    has_concurrency,
    multi_of,
    new_lease_id,
    one_alone,
    renewal_answer,
    return_plan,
    signature,
    single_of,
    take_outcome,
    writes,
)
from ._flight import Deadline, Failure, Gate, Sweep
from ._scripts import LIBRARY
from ._types import (
    Batching,
    BatchStats,
    Degraded,
    Durability,
    DurabilityStats,
    Local,
    Mode,
    MultiOutcome,
    Options,
    Outcome,
    RateLimitError,
    Settlement,
    TopEntry,
    Unavailable,
    Unsupported,
)
from .algorithms import Algorithm, Concurrency
from .client import address_of, demoted, gate_of, host_port, pool_of_one, stall_of

T = TypeVar("T")


Redis = redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster
Single = redis.asyncio.Redis


def _copy_of(conn: redis.asyncio.Redis) -> Callable[[], redis.asyncio.Redis]:
    """A client like ``conn``, on a pool of its own of the same kind and settings."""

    def copy() -> redis.asyncio.Redis:
        pool = conn.connection_pool
        kwargs: dict[str, Any] = dict(pool.connection_kwargs)
        kwargs.pop("himport_registry", None)
        if isinstance(pool, redis.asyncio.BlockingConnectionPool):
            kwargs["timeout"] = pool.timeout
        fresh = type(pool)(connection_class=pool.connection_class, max_connections=pool.max_connections, **kwargs)
        return redis.asyncio.Redis.from_pool(fresh)

    return copy


class AsyncClient:
    """The asyncio twin of :class:`ratelimit_client.Client`. It may be used from several event
    loops, one after the other or at once (an application's, then a test client's): redis-py's
    asyncio connections belong to the loop that opened them, so each loop gets a pool of its
    own, of the same settings (a cluster client stays on the loop of its first call)."""

    def __init__(
        self,
        redis: redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster,
        options: Options | None = None,
    ) -> None:
        self._redis = redis
        self._cluster = isinstance(redis, redis_cluster.RedisCluster)
        self._core = Core(options or Options())
        self._denies: DenyCache | None = None
        self._batches: AsyncBatches | None = None
        self._lane: AsyncLane | None = None
        self._gate = gate_of(redis, self._core.options, self._core.breaker.is_open, threads=False)
        # ``redis`` serves the first loop that makes a call; every other loop has a copy.
        self._copy = None if isinstance(redis, redis_cluster.RedisCluster) else _copy_of(redis)
        # The loop ``redis`` serves, in a list that the copies of this client share
        # (with_deny_cache, with_batching...), as they share the pools.
        self._home: list[weakref.ref[asyncio.AbstractEventLoop] | None] = [None]
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple[Single, Gate | None]] = (
            weakref.WeakKeyDictionary()
        )
        self._loops_lock = threading.Lock()
        #: The deadlines of the calls, on one timer per loop (shared by the copies of this client).
        self._sweep = Sweep(self._core.options.timeout)
        #: A cluster client's slot map being read again (shared by the copies of this client).
        self._slots = _Slots() if self._cluster else None

    def _conn(self, loop: asyncio.AbstractEventLoop | None = None) -> tuple[Redis, Gate | None]:
        """The redis-py client of the running loop (``loop``, when the caller has it), and the
        gate of its pool."""
        if loop is None:
            loop = asyncio.get_running_loop()
        home_ref = self._home[0]
        home = home_ref() if home_ref is not None else None
        if home is loop or self._copy is None:
            return self._redis, self._gate
        with self._loops_lock:
            if self._home[0] is None:
                self._home[0] = weakref.ref(loop)
                return self._redis, self._gate
            got = self._loops.get(loop)
            if got is None:
                conn = self._copy()
                got = (conn, gate_of(conn, self._core.options, self._core.breaker.is_open, threads=False))
                self._loops[loop] = got
            return got

    @classmethod
    def from_url(cls, url: str, options: Options | None = None, *, cluster: bool = False, **kwargs: Any) -> AsyncClient:
        """A client for ``url``, never retried by redis-py (a failure goes to the failure policy
        at once; the whole call is bounded by ``options.timeout``). Connects lazily. Calls
        beyond ``max_connections`` (default 100) in flight wait for a connection, outside their
        deadline, for as long as Redis answers the calls in flight. ``cluster=True``: a
        ``RedisCluster`` from this seed node."""
        options = options or Options()
        # The client's own deadlines bound every call and every step of the start-up; redis-py's
        # socket timeouts are only a backstop (they would count the time the loop spends on other
        # work as Redis being late).
        kwargs.setdefault("socket_timeout", stall_of(options))
        kwargs.setdefault("socket_connect_timeout", stall_of(options))
        kwargs.setdefault("retry", Retry(NoBackoff(), 0))
        conn: redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster
        if cluster:
            conn = redis.asyncio.cluster.RedisCluster.from_url(url, **kwargs)
        else:
            kwargs.setdefault("max_connections", 100)
            # Wait for a free connection (within the call's deadline) rather than fail at once.
            pool = redis.asyncio.BlockingConnectionPool.from_url(url, timeout=None, **kwargs)
            conn = redis.asyncio.Redis.from_pool(pool)
        return cls(conn, options)

    @classmethod
    def sentinel(
        cls, sentinels: Sequence[str], master: str, options: Options | None = None, **kwargs: Any
    ) -> AsyncClient:
        """A client of the master the Sentinels name, as :meth:`Client.sentinel`."""
        options = options or Options()
        kwargs.setdefault("socket_timeout", stall_of(options))
        kwargs.setdefault("socket_connect_timeout", stall_of(options))
        kwargs.setdefault("retry", Retry(NoBackoff(), 0))
        asked = {"socket_timeout": options.timeout, "socket_connect_timeout": options.timeout}
        make: Callable[..., Any] = redis.asyncio.sentinel.Sentinel  # no annotations
        manager = make([host_port(u) for u in sentinels], sentinel_kwargs=asked)
        return cls(manager.master_for(master, **kwargs), options)

    @classmethod
    async def open(cls, url: str, options: Options | None = None, **kwargs: Any) -> AsyncClient:
        """:meth:`from_url`, then detects the mode at once. A cluster client first learns the
        cluster's slots (outside any call's deadline; the synchronous cluster client does this
        when it is made)."""
        client = cls.from_url(url, options, **kwargs)
        if isinstance(client._redis, redis_cluster.RedisCluster):
            await client._redis.initialize()
        await client.detect()
        return client

    @property
    def redis(self) -> redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster:
        return self._redis

    @property
    def options(self) -> Options:
        return self._core.options

    def __repr__(self) -> str:
        return f"AsyncClient({address_of(self._redis)!r}, mode={self.mode!r}, options={self._core.options!r})"

    @property
    def mode(self) -> Mode | None:
        return self._core.mode

    def with_deny_cache(self, entries: int) -> AsyncClient:
        """This client (the same connection, mode, breaker and policy) with a deny cache of
        ``entries`` entries, the least recently used evicted first: a check of a cost above 0
        that Redis denied with ``retry_after_ms`` R is denied again in the process, without a
        call, until R has passed on the process's monotonic clock (:attr:`Outcome.answered_locally`
        ``DENY_CACHE``). It never admits. Peeks, partial grants, leases, reservations and
        settlements never use it. The client it was made from is unchanged."""
        c = copy.copy(self)
        c._denies = DenyCache(entries, self._core.options.timeout)
        return c

    def without_deny_cache(self) -> AsyncClient:
        """This client without a deny cache (the client it was made from is unchanged)."""
        c = copy.copy(self)
        c._denies = None
        return c

    def with_durability(self, durability: Durability) -> AsyncClient:
        """Durable admissions, as :meth:`Client.with_durability` (the lane's connections belong
        to the loop that opened them; on a cluster client, to the master of the call's key)."""
        if durability.replicas < 1:
            raise Unsupported("durable admissions need at least 1 replica")
        if durability.timeout >= self._core.options.timeout:
            raise Unsupported("the WAIT timeout must be below the client's timeout")
        c = copy.copy(self)
        c._lane = AsyncLane(self._redis, Durable(durability))
        return c

    def durability_stats(self) -> DurabilityStats:
        return DurabilityStats() if self._lane is None else self._lane.durable.stats()

    def with_batching(self, batching: Batching | None = None) -> AsyncClient:
        """This client taking leased batches for hot keys, as :meth:`Client.with_batching`
        (the batches' timers and returns run on the loop of the calls that took them)."""
        c = copy.copy(self)
        plain = copy.copy(self)
        plain._batches, plain._denies = None, None
        c._batches = AsyncBatches(plain, batching or Batching())
        return c

    def without_batching(self) -> AsyncClient:
        c = copy.copy(self)
        c._batches = None
        return c

    def batch_stats(self) -> BatchStats:
        return BatchStats() if self._batches is None else self._batches.table.stats()

    def batch_size(self, limits: Limits) -> int | None:
        return None if self._batches is None else self._batches.table.size(signature(list(limits)))

    async def flush(self) -> int:
        """Gives back at once what every batch holds, and waits for the answers: the units given
        back."""
        return 0 if self._batches is None else await self._batches.flush()

    def denied_until(self, limits: Limits, cost: int) -> float | None:
        return None if self._denies is None else self._denies.until(signature(list(limits)), cost)

    def deny_cache_capacity(self) -> int | None:
        """The deny cache's number of entries at most, ``None`` without one."""
        return None if self._denies is None else self._denies.capacity

    def deny_cache_len(self) -> int:
        """Entries in the deny cache now."""
        return 0 if self._denies is None else len(self._denies)

    def breaker_open(self) -> bool:
        return self._core.breaker.is_open()

    async def aclose(self) -> int:
        """Stops the batches of this client and of every copy sharing them, gives back what they
        hold (the units given back, 0 without batches), then closes the connections of the
        running loop (those of a loop that is gone went with it; a later call opens new ones)."""
        returned = 0 if self._batches is None else await self._batches.close()
        await self._close_connections()
        return returned

    async def _close_connections(self) -> None:
        loop = asyncio.get_running_loop()
        home_ref = self._home[0]
        home = home_ref() if home_ref is not None else None
        with self._loops_lock:
            got = self._loops.pop(loop, None)
            if home is None or home is loop or home.is_closed():
                mine = [self._redis]
            else:
                mine = []
        if got is not None:
            mine.append(got[0])
        for c in mine:
            with contextlib.suppress(RuntimeError):
                await c.aclose()
        for gate in (self._gate if mine and mine[0] is self._redis else None, None if got is None else got[1]):
            if gate is not None:
                gate.recount()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # Driving the exchanges ---------------------------------------------------------------------

    def _routing(self, call: tuple[Any, ...]) -> dict[str, Any]:
        """A cluster sends the keyless detection commands to any one node."""
        if self._cluster and call[0] in ANY_NODE:
            # A node, not the RANDOM flag, which redis-py 8.1 routes by key all the same.
            return {"target_nodes": self._redis.get_random_node()}  # type: ignore[union-attr]
        return {}

    async def _send(self, conn: Redis, gate: Gate | None, call: tuple[Any, ...]) -> Any:
        try:
            reply = await conn.execute_command(*call, **(self._routing(call) if conn is self._redis else {}))
        except ResponseError:
            self._answered(gate)  # an error reply is an answer too (NOSCRIPT, ERR ...)
            raise
        self._answered(gate)
        return reply

    def _answered(self, gate: Gate | None) -> None:
        self._core.note_answer()
        if gate is not None:
            gate.progress()

    async def _step(self, conn: Redis, gate: Gate | None, step: Detect | LoadScript, deadline: Deadline) -> None:
        """A start-up step, outside the call's deadline: run by this call, each of its round
        trips within the timeout (as the synchronous client's socket timeouts bound them), or
        waited for."""
        timeout = self._core.options.timeout
        if isinstance(step, Detect):

            async def detect() -> None:
                await self._drive(conn, gate, self._core.detect(), None)

            with deadline.paused():
                await self._core.detection.run_async(step.seen, detect)
        else:
            script = step.script

            async def load() -> None:
                async with Deadline(timeout):
                    await self._send(conn, gate, ("SCRIPT LOAD", script.text))

            with deadline.paused():
                await step.flight.run_async(step.seen, load)

    async def _drive(self, conn: Redis, gate: Gate | None, exchange: Exchange[T], deadline: Deadline | None) -> T:
        """Runs an exchange; without ``deadline`` (a start-up step) each round trip has the
        timeout of its own."""
        try:
            call = next(exchange)
            while True:
                try:
                    if deadline is None and isinstance(call, tuple):
                        async with Deadline(self._core.options.timeout):
                            reply = await self._send(conn, gate, call)
                    elif isinstance(call, tuple):
                        reply = await self._send(conn, gate, call)
                    else:
                        assert deadline is not None
                        await self._step(conn, gate, call, deadline)
                        reply = None
                except (RedisError, RedisClusterException, OSError) as e:
                    call = exchange.throw(e)
                except Failure as f:
                    # Another call's run of that step failed: a refusal is this call's too.
                    if f.__cause__ is None or classify(f.__cause__) is None:
                        raise
                    call = exchange.throw(f.__cause__)
                else:
                    call = exchange.send(reply)
        except StopIteration as stop:
            value: T = stop.value
            return value

    async def _guarded(self, exchange: Exchange[T], pinned: Single | None = None) -> T:
        """Runs an exchange under the breaker, the gate and the call's deadline: :class:`Rejected`
        for an answer about the call, :class:`Failure` when Redis did not decide."""
        core = self._core
        if not core.breaker.permit() or (self._slots is not None and self._slots.reading):
            exchange.close()
            raise Failure
        conn, gate = (pinned, None) if pinned is not None else self._conn()
        opens = False
        if gate is not None:
            try:
                opens = await gate.enter_async()
            except Failure:
                exchange.close()
                raise
        began = time.monotonic()
        try:
            if opens:
                await self._open_one(conn)
            deadline = self._sweep.start()
            try:
                value = await self._drive(conn, gate, exchange, deadline)
            except BaseException as e:
                if deadline.end(type(e)):
                    raise TimeoutError from e
                if gate is not None and isinstance(e, asyncio.CancelledError):
                    gate.recount()  # redis-py closes a connection whose reply it gave up on
                raise
            deadline.end(None)
        except (RedisError, RedisClusterException, OSError, UnexpectedReply) as e:
            error, cause = await self._unanswered(e, began, gate)
            raise error from cause
        finally:
            if gate is not None:
                gate.leave()
        core.breaker.success()
        return value

    async def _unanswered(
        self, e: BaseException, began: float, gate: Gate | None, key: str | None = None
    ) -> tuple[RateLimitError | Failure, BaseException | None]:
        """What a call begun at ``began`` that ended with ``e`` raises (and from what):
        :class:`Rejected` for an answer about the call; :class:`Failure` when Redis did not
        decide (TimeoutError, the budget ran out, is an OSError: no code), counted for the
        breaker and the gate; on a cluster client, the slot map is read again (``key``: the
        call's, whose master is asked last)."""
        core = self._core
        rejected = classify(e)
        if rejected is None:
            core.failed(began)
            if gate is not None:
                gate.failed()
            if demoted(e):
                await self._reconnect()
            if self._slots is not None:
                self._read_slots(key)
            return Failure(), e
        core.breaker.success()
        if error_code(e) == "READONLY":
            await self._reconnect()
        return rejected, None

    def _read_slots(self, key: str | None) -> None:
        """A cluster's node gave no answer: it may have stopped, or been replaced by its replica
        (a frozen master sends no ``MOVED``). The slot map is read again from the nodes, in a
        task of its own (the node of ``key`` asked last; each node within redis-py's socket
        timeout); the calls meanwhile are answered by the failure policy at once. Once at a
        time."""
        slots = self._slots
        if slots is None or slots.reading:
            return
        cluster = self._redis
        assert isinstance(cluster, redis_cluster.RedisCluster)
        failed = None
        if key is not None:
            with contextlib.suppress(RedisError, RedisClusterException):
                node = cluster.get_node_from_key(key)
                failed = None if node is None else node.name
        slots.reading = True

        async def read() -> None:
            try:
                await cluster.nodes_manager.initialize(last_failed_node_name=failed)
            except (RedisError, RedisClusterException, OSError):
                pass  # the next call without an answer reads them again
            finally:
                slots.reading = False

        slots.task = asyncio.get_running_loop().create_task(read())

    async def _check_one(self, key: str, algo: Algorithm, cost: int, command: tuple[Any, ...], mode: Mode) -> Outcome:
        """A check of one limit whose one command is known (:meth:`Core.command_one`): what
        :meth:`_guarded` does for its exchange, without one, in one frame (the path of most
        calls)."""
        core = self._core
        if not core.breaker.permit() or (self._slots is not None and self._slots.reading):
            return core.degraded_outcome(key, algo, cost, None)
        loop = asyncio.get_running_loop()  # asked once: each time is a getpid() in CPython 3.11
        conn, gate = self._conn(loop)
        opens: bool | None = False
        if gate is not None:
            got = gate.enter_or_queue()
            if type(got) is bool:
                opens = got
            else:
                try:
                    opens = await gate.queued(got)
                except Failure:
                    return core.degraded_outcome(key, algo, cost, None)
        began = time.monotonic()
        try:
            if opens:
                await self._open_one(conn)
            sweep = self._sweep
            call = sweep.begin(loop)
            try:
                try:
                    reply = await conn.execute_command(*command)
                except ResponseError:
                    self._answered(gate)  # an error reply is an answer too
                    raise
                core.answered = now = time.monotonic()
                if gate is not None:
                    gate.progress(now)
                outcome = take_outcome(reply, cost, mode)
            except BaseException as e:
                if sweep.end(call, type(e)):
                    raise TimeoutError from e
                if gate is not None and isinstance(e, asyncio.CancelledError):
                    gate.recount()  # redis-py closes a connection whose reply it gave up on
                raise
            sweep.end(call, None)
        except (RedisError, RedisClusterException, OSError, UnexpectedReply) as e:
            error, cause = await self._unanswered(e, began, gate, key)
            if isinstance(error, Failure):
                return core.degraded_outcome(key, algo, cost, None)
            raise error from cause
        finally:
            if gate is not None:
                gate.leave()
        core.breaker.success()
        return outcome

    async def _durably(self, exchange: Callable[[Durable | None], Exchange[T]], writes: bool, key: str) -> T:
        """Runs a call's exchange; one that may write, on a durable client, on a connection of
        the lane of its own (of the running loop; to the master of ``key`` on a cluster), its
        admission followed by ``WAIT``."""
        lane = self._lane if writes else None
        if lane is None:
            return await self._guarded(exchange(None))
        try:
            node, conn = await lane.take(key)
        except (RedisError, RedisClusterException, OSError) as e:
            raise Failure from e  # the cluster's slots unknown, or no master for the key's
        try:
            value = await self._guarded(exchange(lane.durable), conn)
        except BaseException:
            await lane.drop(conn)
            raise
        await lane.put(node, conn)
        return value

    async def _open_one(self, conn: Redis) -> None:
        """Opens a connection of the pool ahead of the call that needs it, outside the call's
        deadline: start-up (the TCP handshake, ``HELLO`` and ``CLIENT SETINFO``, and the few
        milliseconds of CPU redis-py takes to set a connection up) within four timeouts."""
        pool = getattr(conn, "connection_pool", None)
        if pool is None:
            return
        async with Deadline(4 * self._core.options.timeout):
            c = await pool.get_connection()
        await pool.release(c)

    async def _reconnect(self) -> None:
        conn, gate = self._conn()
        pool = getattr(conn, "connection_pool", None)
        if pool is not None:
            await pool.disconnect()
        if gate is not None:
            gate.recount()

    async def detect(self) -> Mode | None:
        try:
            return await self._guarded(self._core.resolve_mode())
        except (Failure, RateLimitError):
            return None

    # Limits ------------------------------------------------------------------------------------

    async def _decide_one(self, key: str, algo: Algorithm, cost: int, lease: str | None, upto: bool = False) -> Outcome:
        core = self._core
        if lease is None and not upto and (cost <= 0 or self._lane is None) and not isinstance(algo, Concurrency):
            mode = core.mode
            command = core.command_one(key, algo, cost)
            if command is not None and mode is not None:
                return await self._check_one(key, algo, cost, command, mode)
        try:
            decision, granted, mode = await self._durably(
                lambda durable: core.call_one(key, algo, cost, lease, upto, durable), writes(cost, upto, lease), key
            )
        except Failure:
            return self._core.degraded_outcome(key, algo, cost, lease, upto)
        return Outcome(decision, None, mode, granted)

    async def _decide_all(self, limits: Limits, cost: int, lease: str | None, upto: bool = False) -> MultiOutcome:
        if one_alone(limits, cost):
            key, algo = limits[0]
            return multi_of(await self._decide_one(key, algo, cost, lease, upto))
        check_count(limits)
        try:
            core = self._core
            (allowed, denied_by, decisions, granted), mode = await self._durably(
                lambda durable: core.call_all(limits, cost, lease, upto, durable),
                writes(cost, upto, lease),
                limits[0][0],
            )
        except Failure:
            return self._core.degraded_all(limits, cost, lease, upto)
        return MultiOutcome(allowed, denied_by, decisions, None, mode, granted)

    async def check(self, key: str, algo: Algorithm, cost: int = 1) -> Outcome:
        if not isinstance(algo, Concurrency):
            if cost > 0 and (self._batches is not None or self._denies is not None):
                return single_of(await self._decide_hot([(key, algo)], cost))
            core = self._core
            mode = core.mode
            if (cost <= 0 or self._lane is None) and mode is not None:
                command = core.command_one(key, algo, cost)
                if command is not None:
                    return await self._check_one(key, algo, cost, command, mode)
            return await self._decide_one(key, algo, cost, None)
        return single_of(await self.check_all([(key, algo)], cost))

    async def peek(self, key: str, algo: Algorithm) -> Outcome:
        return await self.check(key, algo, 0)

    async def check_all(self, limits: Limits, cost: int = 1) -> MultiOutcome:
        limits = list(limits)
        if not has_concurrency(limits):
            if cost > 0 and 1 <= len(limits) <= 16 and self._hot():
                return await self._decide_hot(limits, cost)
            return await self._decide_all(limits, cost, None)
        if cost > 0:
            raise Unsupported("concurrency limits take a lease: AsyncClient.acquire_all")
        return await self._decide_all(limits, 0, new_lease_id())

    def _hot(self) -> bool:
        return self._batches is not None or self._denies is not None

    async def _decide_hot(self, limits: Limits, cost: int) -> MultiOutcome:
        """A check of a cost above 0 through the batches and the deny cache, as
        :meth:`Client._decide_hot`."""
        sig = signature(limits)
        batches, denies = self._batches, self._denies
        refill = False
        if batches is not None:
            step, local = batches.try_local(sig, limits, cost)
            if local is not None:
                return local
            refill = step != PLAIN
        if denies is not None:
            cached = denies.lookup(sig, cost)
            if cached is not None:
                return cached
        if refill and batches is not None:
            o = await batches.refill(sig, limits, cost, denies)
            if o is not None:
                return o
            cached = None if denies is None else denies.lookup(sig, cost)
            if cached is not None:
                return cached
        sent = time.monotonic()
        o = await self._decide_all(limits, cost, None)
        if denies is not None:
            denies.record(sig, cost, o, sent)
        if batches is not None:
            batches.table.observe(sig, o)
        return o

    async def _try_grant(self, limits: Limits, n: int) -> MultiOutcome | None:
        """A partial grant of at most ``n`` units for a batch: ``None`` when Redis cannot answer
        (no failure policy applied)."""
        core = self._core
        try:
            if len(limits) == 1:
                key, algo = limits[0]
                d, granted, mode = await self._durably(
                    lambda durable: core.call_one(key, algo, n, None, True, durable), True, key
                )
                return MultiOutcome(d.allowed, 0 if d.allowed else 1, (d,), None, mode, granted)
            (allowed, denied_by, ds, granted), mode = await self._durably(
                lambda durable: core.call_all(limits, n, None, True, durable), True, limits[0][0]
            )
            return MultiOutcome(allowed, denied_by, ds, None, mode, granted)
        except Failure:
            return None

    def _degraded_for(self, limits: Limits, cost: int) -> MultiOutcome:
        if len(limits) == 1:
            key, algo = limits[0]
            return multi_of(self._core.degraded_outcome(key, algo, cost, None))
        return self._core.degraded_all(limits, cost, None)

    async def check_upto(self, key: str, algo: Algorithm, n: int) -> Outcome:
        """A partial grant (``UPTO n``): as many units of ``algo`` on ``key`` as are left now,
        at least 1 and at most ``n``, taken in one call; :attr:`Outcome.granted` says how many
        (0 when denied: nothing was left, and the decision is the denial of one unit). Give
        back what goes unused with :meth:`settle` (a negative delta). ``n`` from 1 to 10^15
        (1,000 for a sliding log); not for a concurrency limit (:class:`Unsupported`). Batches
        and the deny cache are not used. When Redis cannot answer: ``FailOpen`` grants ``n``
        (nothing taken), ``FailClosed`` denies, ``Local`` grants what its in-process bucket
        has, at most ``n``."""
        check_upto_args([(key, algo)], n)
        return await self._decide_one(key, algo, n, None, upto=True)

    async def check_all_upto(self, limits: Limits, n: int) -> MultiOutcome:
        """A partial grant of several limits at once (``RL.ALL ... UPTO n``): every limit is
        granted the same units, the fewest any of them has left, at most ``n``
        (:attr:`MultiOutcome.granted`; 0 when denied, as a cost of 1 would be). One limit alone
        uses its own command. Concurrency limits are refused (:class:`Unsupported`)."""
        limits = list(limits)
        check_upto_args(limits, n)
        return await self._decide_all(limits, n, None, upto=True)

    # Leases ------------------------------------------------------------------------------------

    def acquire(self, key: str, limit: Concurrency, lease_id: str | None = None) -> Pending[AsyncLeaseOutcome]:
        """:meth:`Client.acquire`: ``await`` it, or hold the slot for a block with
        ``async with client.acquire(key, limit) as held:``."""
        return Pending(self._acquire(key, limit, lease_id))

    async def _acquire(self, key: str, limit: Concurrency, lease_id: str | None) -> AsyncLeaseOutcome:
        lease_id = new_lease_id() if lease_id is None else lease_id
        outcome = await self._decide_one(key, limit, 1, lease_id)
        lease = AsyncLease(self, lease_id, [(key, limit)], outcome.degraded) if outcome.decision.allowed else None
        return AsyncLeaseOutcome(outcome, lease)

    def acquire_all(self, limits: Limits, cost: int = 1) -> Pending[AsyncMultiLeaseOutcome]:
        """:meth:`Client.acquire_all`: ``await`` it, or ``async with`` it."""
        return Pending(self._acquire_all(list(limits), cost))

    async def _acquire_all(self, limits: Limits, cost: int) -> AsyncMultiLeaseOutcome:
        held = [(k, a) for k, a in limits if isinstance(a, Concurrency)]
        if not held:
            return AsyncMultiLeaseOutcome(await self._decide_all(limits, cost, None), None)
        lease_id = new_lease_id()
        outcome = await self._decide_all(limits, cost, lease_id)
        lease = AsyncLease(self, lease_id, held, outcome.degraded) if outcome.allowed and cost > 0 else None
        return AsyncMultiLeaseOutcome(outcome, lease)

    async def release(self, key: str, lease_id: str) -> bool:
        try:
            return await self._guarded(self._core.call_release(key, lease_id)) == 1
        except Failure:
            return False

    # Reservations ------------------------------------------------------------------------------

    async def reserve(self, key: str, algo: Algorithm, estimate: int) -> AsyncReservationOutcome:
        if isinstance(algo, Concurrency):
            raise Unsupported("concurrency limits are not settled: AsyncClient.acquire")
        outcome = await self._decide_one(key, algo, estimate, None)
        reservation = (
            AsyncReservation(self, [(key, algo)], estimate, outcome.degraded) if outcome.decision.allowed else None
        )
        return AsyncReservationOutcome(outcome, reservation)

    async def reserve_all(self, limits: Limits, estimate: int) -> AsyncMultiReservationOutcome:
        limits = list(limits)
        if has_concurrency(limits):
            raise Unsupported("concurrency limits are not settled: AsyncClient.acquire_all")
        outcome = await self._decide_all(limits, estimate, None)
        reservation = AsyncReservation(self, limits, estimate, outcome.degraded) if outcome.allowed else None
        return AsyncMultiReservationOutcome(outcome, reservation)

    async def settle(self, limits: Limits, delta: int) -> Settlement:
        limits = list(limits)
        if has_concurrency(limits):
            raise Unsupported("concurrency limits are not settled")
        check_count(limits)
        try:
            decisions, mode = await self._guarded(self._core.call_settle(limits, delta))
        except Failure:
            return self._core.degraded_settlement(limits)
        return Settlement(decisions, None, mode)

    async def _settle_charged(self, limits: Limits, delta: int, charged: Degraded | None) -> Settlement:
        policy = self._core.options.policy
        if charged is None:
            return await self.settle(limits, delta)
        if charged is Degraded.LOCAL and isinstance(policy, Local):
            return self._core.local_settlement(limits, delta, policy.instances)
        return self._core.policy_settlement(limits, charged)

    # RL.TOP ------------------------------------------------------------------------------------

    async def top(self, count: int = 10) -> list[TopEntry]:
        return await self._top(count)

    async def reset_top(self) -> None:
        await self._top(None)

    async def _top(self, count: int | None) -> list[TopEntry]:
        if self._cluster:
            raise Unsupported(ON_A_CLUSTER)
        try:
            entries = await self._guarded(self._core.call_top(count))
        except Failure:
            raise Unavailable from None
        if entries is None:
            raise Unsupported("the most-denied keys are counted by the module only (RL.TOP)")
        return entries

    async def load_library(self) -> str:
        name = await self._conn()[0].execute_command("FUNCTION LOAD", "REPLACE", LIBRARY)
        return name.decode() if isinstance(name, bytes) else str(name)


class _Slots:
    """Whether a cluster client's slot map is being read again, and the task reading it."""

    __slots__ = ("reading", "task")

    def __init__(self) -> None:
        self.reading = False
        self.task: asyncio.Task[None] | None = None


class AsyncLane:
    """The asyncio client's durable lane: clients of one connection each (kept per event loop,
    whose connections they are, and per server: each master of a cluster), as
    :class:`ratelimit_client.client.Lane`."""

    IDLE_KEPT = 64

    def __init__(self, conn: Redis, durable: Durable) -> None:
        self.durable = durable
        self._cluster = conn if isinstance(conn, redis_cluster.RedisCluster) else None
        self._pool = None if isinstance(conn, redis_cluster.RedisCluster) else conn.connection_pool
        self._idle: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, list[Single]]] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()

    async def take(self, key: str) -> tuple[str, Single]:
        """A connection to the server of ``key`` (the master of its slot on a cluster, whose
        slots are learnt first if not known yet), and that server's name."""
        loop = asyncio.get_running_loop()
        node = None
        name = ""
        if self._cluster is not None:
            await self._cluster.initialize()
            node = self._cluster.get_node_from_key(key)
            if node is None:
                raise RedisClusterException(f"no master serves {key!r}")
            name = node.name
        with self._lock:
            idle = self._idle.get(loop, {}).get(name)
            if idle:
                return name, idle.pop()
        if node is None:
            return name, redis.asyncio.Redis.from_pool(pool_of_one(self._pool))
        kwargs = dict(node.connection_kwargs)
        one = redis.asyncio.ConnectionPool(connection_class=node.connection_class, max_connections=1, **kwargs)
        return name, redis.asyncio.Redis.from_pool(one)

    async def put(self, name: str, conn: Single) -> None:
        loop = asyncio.get_running_loop()
        with self._lock:
            idle = self._idle.setdefault(loop, {}).setdefault(name, [])
            if len(idle) < self.IDLE_KEPT:
                idle.append(conn)
                return
        await conn.aclose()

    async def drop(self, conn: Single) -> None:
        with contextlib.suppress(Exception):
            await conn.aclose()


class AsyncBatches:
    """The asyncio client's batches: the table (``_batch.py``), each entry's turn an
    ``asyncio.Lock``, the lease timers and returns tasks of the running loop. A grant runs in a
    task of its own holding the turn: a caller that goes away meanwhile (a cancelled request)
    neither loses the units nor lets a second refill start; the units it would have used go
    back."""

    def __init__(self, client: AsyncClient, cfg: Batching) -> None:
        self.client = client
        self.table = Table(cfg, asyncio.Lock)
        self._tasks: set[asyncio.Task[Any]] = set()

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _send(self, returns: list[Return]) -> None:
        if returns:
            self._spawn(self._give_back_all(returns))

    async def _give_back_all(self, returns: list[Return]) -> None:
        for r in returns:
            await self.give_back(r)

    def try_local(self, sig: str, limits: Limits, cost: int) -> tuple[str, MultiOutcome | None]:
        step, o, returns = self.table.try_local(sig, limits, cost)
        self._send(returns)
        return step, o if step == ANSWER else None

    async def refill(self, sig: str, limits: Limits, cost: int, denies: DenyCache | None) -> MultiOutcome | None:
        table = self.table
        w = table.wait(sig, cost)
        if w is None:
            return None
        gate, seen = w
        try:
            await gate.acquire()
        finally:
            table.waited(sig, cost)
        handed = False
        try:
            step, v, returns = table.turn(sig, limits, cost, seen)
            self._send(returns)
            if step == ANSWER:
                assert isinstance(v, MultiOutcome)
                return v
            if step == PLAIN or not isinstance(v, int):
                return None
            cached = None if denies is None else denies.lookup(sig, cost)
            if cached is not None:
                return cached
            task = asyncio.get_running_loop().create_task(self._grant(sig, limits, cost, v, denies, gate))
            handed = True
        finally:
            if not handed:
                gate.release()
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        try:
            got = await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(lambda t: self._unused(t, limits, cost))
            raise
        return got.answer

    def _unused(self, t: asyncio.Task[Granted], limits: Limits, cost: int) -> None:
        """The caller of a grant went away: the units it was admitted with go back."""
        if t.cancelled() or t.exception() is not None:
            return
        own: Batch | None = t.result().own
        if own is not None:
            self.table.gone(cost)
            self._send([Return(list(limits), own)])

    async def _grant(
        self, sig: str, limits: Limits, cost: int, ask: int, denies: DenyCache | None, gate: asyncio.Lock
    ) -> Granted:
        table = self.table
        try:
            sent = time.monotonic()
            try:
                reply = await self.client._try_grant(limits, ask)
            except RateLimitError:
                table.unanswered(sig)
                raise
            if reply is None:
                table.unanswered(sig)
                return Granted(self.client._degraded_for(limits, cost), None, [])
            got = table.granted(sig, limits, cost, ask, sent, reply)
        finally:
            gate.release()
        self._send(got.returns)
        if got.timer is not None:
            at, generation = got.timer
            loop = asyncio.get_running_loop()
            loop.call_later(max(0.0, at - time.monotonic()), lambda: self._send(table.expired(sig, generation)))
        if got.deny is not None and denies is not None:
            denies.record(sig, cost, got.deny, sent)
        return got

    async def give_back(self, r: Return) -> int:
        client = self.client
        back = dict.fromkeys(range(len(r.limits)), 0)
        for subset, n in return_plan(r, time.monotonic(), client._core.options.timeout):
            try:
                s = await client.settle(subset, -n)
            except RateLimitError:
                continue
            if s.degraded is None:
                for i, lim in enumerate(r.limits):
                    if lim in subset:
                        back[i] = n
        returned = min(back.values(), default=0)
        self.table.account(r, returned)
        return returned

    async def flush(self) -> int:
        n = 0
        for r in self.table.drain():
            n += await self.give_back(r)
        return n

    async def close(self) -> int:
        self.table.closed = True
        return await self.flush()


class _AsyncReleasable(Protocol):
    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...


R = TypeVar("R", bound=_AsyncReleasable)


class Pending(Generic[R]):
    """A call that can be awaited (its outcome) or entered with ``async with`` (its outcome,
    whose slot is given back when the block ends)."""

    def __init__(self, call: Coroutine[Any, Any, R]) -> None:
        self._call = call
        self._value: R | None = None

    def __await__(self) -> Generator[Any, None, R]:
        return self._call.__await__()

    async def __aenter__(self) -> R:
        self._value = await self._call
        return self._value

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._value is not None:
            await self._value.__aexit__(exc_type, exc, tb)


class _KeepAlive:
    """A lease's renewal timer: stopped by a release, which waits for a renewal on its way."""

    __slots__ = ("renewing", "stopped", "task")

    def __init__(self) -> None:
        self.task: asyncio.Task[None] | None = None
        self.stopped = False
        self.renewing = False


class AsyncLease:
    """The asyncio twin of :class:`ratelimit_client.Lease`."""

    def __init__(
        self, client: AsyncClient, lease_id: str, limits: Sequence[tuple[str, Concurrency]], degraded: Degraded | None
    ) -> None:
        self._client = client
        self._id = lease_id
        self._limits = list(limits)
        self._on_redis = degraded is None
        self._local = degraded is Degraded.LOCAL
        self._released = False
        self._last_renewal: Outcome | None = None
        self._keep_alive: _KeepAlive | None = None

    @property
    def id(self) -> str:
        return self._id

    @property
    def key(self) -> str:
        return self._limits[0][0]

    @property
    def limits(self) -> list[tuple[str, Concurrency]]:
        return list(self._limits)

    @property
    def holds_slot(self) -> bool:
        return (self._on_redis or self._local) and not self._released

    @property
    def last_renewal(self) -> Outcome | None:
        return self._last_renewal

    async def renew(self) -> Outcome:
        answer: Outcome | None = None
        for key, limit in self._limits:
            o = await self._client._decide_one(key, limit, 1, self._id)
            if o.decision.allowed:
                if o.degraded is None:
                    self._on_redis = True
                elif o.degraded is Degraded.LOCAL:
                    self._local = True
            answer = renewal_answer(answer, o)
        assert answer is not None
        self._last_renewal = answer
        return answer

    def keep_alive(self, every: float) -> None:
        """Renews every ``every`` seconds from a task on the running loop until the lease is
        released. Calling it again replaces the timer. A release waits for a renewal already
        on its way, so that none lands after it."""
        self._stop_keep_alive()
        timer = _KeepAlive()

        async def renew_until_stopped() -> None:
            while True:
                await asyncio.sleep(every)
                if timer.stopped:
                    return
                timer.renewing = True
                try:
                    await self.renew()
                except RateLimitError:
                    pass
                finally:
                    timer.renewing = False
                if timer.stopped:
                    return

        timer.task = asyncio.get_running_loop().create_task(renew_until_stopped())
        self._keep_alive = timer

    def _stop_keep_alive(self) -> _KeepAlive | None:
        """Stops the timer: the one whose renewal is on its way, to be waited for."""
        timer, self._keep_alive = self._keep_alive, None
        if timer is None or timer.task is None:
            return None
        timer.stopped = True
        if timer.renewing:
            return timer
        timer.task.cancel()
        return None

    async def release(self) -> bool:
        renewing = self._stop_keep_alive()
        if renewing is not None and renewing.task is not None:
            task = renewing.task
            if task.get_loop() is asyncio.get_running_loop():
                await asyncio.shield(task)
            else:
                task.get_loop().call_soon_threadsafe(task.cancel)
        on_redis = self._on_redis and not self._released
        local = self._local and not self._released
        self._released = True
        freed = False
        if local:
            for key, _ in self._limits:
                freed |= self._client._core.leases.release(key, self._id)
        if on_redis:
            error: RateLimitError | None = None
            for key, _ in self._limits:
                try:
                    freed |= await self._client.release(key, self._id)
                except RateLimitError as e:
                    error = error or e
            if error is not None:
                raise error
        return freed

    async def __aenter__(self) -> AsyncLease:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            await self.release()
        except RateLimitError:
            pass  # the lease expires by itself

    def __repr__(self) -> str:
        return f"AsyncLease(id={self._id!r}, limits={self._limits!r}, holds_slot={self.holds_slot})"


class AsyncLeaseOutcome:
    def __init__(self, outcome: Outcome, lease: AsyncLease | None) -> None:
        self.outcome = outcome
        self.lease = lease

    @property
    def allowed(self) -> bool:
        return self.outcome.decision.allowed

    async def __aenter__(self) -> AsyncLeaseOutcome:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.lease is not None:
            await self.lease.__aexit__(exc_type, exc, tb)

    def __repr__(self) -> str:
        return f"AsyncLeaseOutcome(outcome={self.outcome!r}, lease={self.lease!r})"


class AsyncMultiLeaseOutcome:
    def __init__(self, outcome: MultiOutcome, lease: AsyncLease | None) -> None:
        self.outcome = outcome
        self.lease = lease

    @property
    def allowed(self) -> bool:
        return self.outcome.allowed

    async def __aenter__(self) -> AsyncMultiLeaseOutcome:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.lease is not None:
            await self.lease.__aexit__(exc_type, exc, tb)

    def __repr__(self) -> str:
        return f"AsyncMultiLeaseOutcome(outcome={self.outcome!r}, lease={self.lease!r})"


class AsyncReservation:
    def __init__(self, client: AsyncClient, limits: Limits, estimate: int, charged: Degraded | None) -> None:
        self._client = client
        self._limits = list(limits)
        self._estimate = estimate
        self._charged = charged
        self._settled = False

    @property
    def estimate(self) -> int:
        return self._estimate

    @property
    def limits(self) -> list[tuple[str, Algorithm]]:
        return list(self._limits)

    @property
    def degraded(self) -> Degraded | None:
        return self._charged

    async def settle(self, actual: int) -> Settlement:
        if self._settled:
            raise Unsupported("a reservation is settled once")
        self._settled = True
        return await self._client._settle_charged(self._limits, actual - self._estimate, self._charged)

    def __repr__(self) -> str:
        return f"AsyncReservation(limits={self._limits!r}, estimate={self._estimate}, degraded={self._charged})"


class AsyncReservationOutcome:
    def __init__(self, outcome: Outcome, reservation: AsyncReservation | None) -> None:
        self.outcome = outcome
        self.reservation = reservation

    @property
    def allowed(self) -> bool:
        return self.outcome.decision.allowed

    def __repr__(self) -> str:
        return f"AsyncReservationOutcome(outcome={self.outcome!r}, reservation={self.reservation!r})"


class AsyncMultiReservationOutcome:
    def __init__(self, outcome: MultiOutcome, reservation: AsyncReservation | None) -> None:
        self.outcome = outcome
        self.reservation = reservation

    @property
    def allowed(self) -> bool:
        return self.outcome.allowed

    def __repr__(self) -> str:
        return f"AsyncMultiReservationOutcome(outcome={self.outcome!r}, reservation={self.reservation!r})"


class AsyncLimiter:
    """An :class:`AsyncClient` bound to one algorithm and its parameters."""

    def __init__(self, client: AsyncClient, algorithm: Algorithm) -> None:
        self.client = client
        self.algorithm = algorithm

    async def check(self, key: str, cost: int = 1) -> Outcome:
        return await self.client.check(key, self.algorithm, cost)

    async def peek(self, key: str) -> Outcome:
        return await self.client.check(key, self.algorithm, 0)

    def acquire(self, key: str, lease_id: str | None = None) -> Pending[AsyncLeaseOutcome]:
        if not isinstance(self.algorithm, Concurrency):
            raise Unsupported("acquire takes a concurrency limit")
        return self.client.acquire(key, self.algorithm, lease_id)

    async def reserve(self, key: str, estimate: int) -> AsyncReservationOutcome:
        return await self.client.reserve(key, self.algorithm, estimate)


async def load_library(conn: redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster) -> str:
    """``FUNCTION LOAD REPLACE`` of the library ``ratelimit`` on ``conn``'s server."""
    name = await conn.execute_command("FUNCTION LOAD", "REPLACE", LIBRARY)
    return name.decode() if isinstance(name, bytes) else str(name)

    def __repr__(self) -> str:
        return f"AsyncLimiter(client={self.client!r}, algorithm={self.algorithm!r})"
