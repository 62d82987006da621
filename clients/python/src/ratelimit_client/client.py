"""The synchronous client (on ``redis.Redis`` or ``redis.cluster.RedisCluster``): limits, several
limits in one call, concurrency leases, reservations settled with their actual cost, the
most-denied keys; module detection, the Lua fallback, the failure policy and the breaker."""

from __future__ import annotations

import copy
import heapq
import threading
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, TypeVar
from urllib.parse import urlparse

import redis
import redis.asyncio.cluster
import redis.cluster
import redis.cluster as redis_cluster
import redis.sentinel
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException, RedisError, ResponseError
from redis.retry import Retry

from ._core import (
    ANSWER,
    ANY_NODE,
    ON_A_CLUSTER,
    PLAIN,
    Core,
    DenyCache,
    Detect,
    Durable,
    Exchange,
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
from ._flight import Failure, Gate, connected_in
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

T = TypeVar("T")

#: A client of one server (a name the class's ``redis`` property does not hide).
Single = redis.Redis


class Client:
    """A connection to Redis (or Redis Cluster) that decides with the module, the Functions
    library or the scripts. Thread-safe: share one per process.

    ``redis`` is any ``redis.Redis`` or ``redis.cluster.RedisCluster``; its ``socket_timeout``
    bounds each round trip (:meth:`from_url` sets it to ``options.timeout``, with no retries).
    At most ``options.max_in_flight`` calls (and no more than its pool's ``max_connections``)
    are on Redis at once; the others wait for their turn for as long as Redis answers (see
    docs/python.md)."""

    def __init__(self, redis: redis.Redis | redis.cluster.RedisCluster, options: Options | None = None) -> None:
        self._redis = redis
        # RedisCluster.execute_command carries no annotations.
        self._execute: Callable[..., Any] = redis.execute_command
        self._cluster = isinstance(redis, redis_cluster.RedisCluster)
        self._core = Core(options or Options())
        self._denies: DenyCache | None = None
        self._batches: Batches | None = None
        self._lane: Lane | None = None
        self._gate = gate_of(redis, self._core.options, self._core.breaker.is_open)

    @classmethod
    def from_url(cls, url: str, options: Options | None = None, *, cluster: bool = False, **kwargs: Any) -> Client:
        """A client for ``url`` (``redis://host:port``, ``unix:///path``), each round trip
        bounded by ``options.timeout`` and never retried (a failure goes to the failure policy
        at once). Connects lazily, so a server that is down at start is handled by the policy,
        and reconnects by itself. ``cluster=True``: a ``RedisCluster`` from this seed node.
        Other keyword arguments go to redis-py."""
        options = options or Options()
        kwargs.setdefault("socket_timeout", options.timeout)
        kwargs.setdefault("socket_connect_timeout", options.timeout)
        kwargs.setdefault("retry", Retry(NoBackoff(), 0))
        conn: redis.Redis | redis.cluster.RedisCluster
        if cluster:
            conn = redis.cluster.RedisCluster.from_url(url, **kwargs)
        else:
            conn = redis.Redis.from_url(url, **kwargs)
        return cls(conn, options)

    @classmethod
    def sentinel(cls, sentinels: Sequence[str], master: str, options: Options | None = None, **kwargs: Any) -> Client:
        """A client of the master that the Sentinels at ``sentinels`` (``redis://host:port``)
        name ``master``, on redis-py's Sentinel support: every new connection asks the
        Sentinels (``SENTINEL GET-MASTER-ADDR-BY-NAME``, each in turn) where the master is now.
        A connection that fails (the master died, or a Sentinel closed it when it reconfigured
        the old master) or meets ``READONLY`` (the master became a replica) is dropped, with the
        pool's other connections after ``READONLY``, and the next call connects to the master the
        Sentinels name then. The call that met the failure is answered by the failure policy;
        none is sent twice. Round trips bounded and never retried as :meth:`from_url`'s."""
        options = options or Options()
        kwargs.setdefault("socket_timeout", options.timeout)
        kwargs.setdefault("socket_connect_timeout", options.timeout)
        kwargs.setdefault("retry", Retry(NoBackoff(), 0))
        asked = {"socket_timeout": options.timeout, "socket_connect_timeout": options.timeout}
        # redis-py's Sentinel carries no annotations.
        make: Callable[..., Any] = redis.sentinel.Sentinel
        manager = make([host_port(u) for u in sentinels], sentinel_kwargs=asked)
        master_for: Callable[..., redis.Redis] = manager.master_for
        return cls(master_for(master, **kwargs), options)

    @classmethod
    def open(cls, url: str, options: Options | None = None, **kwargs: Any) -> Client:
        """:meth:`from_url`, then detects the mode at once (if Redis is unreachable now, on the
        first call that reaches it)."""
        client = cls.from_url(url, options, **kwargs)
        client.detect()
        return client

    @property
    def redis(self) -> redis.Redis | redis.cluster.RedisCluster:
        """The redis-py client underneath."""
        return self._redis

    @property
    def options(self) -> Options:
        return self._core.options

    def __repr__(self) -> str:
        return f"Client({address_of(self._redis)!r}, mode={self.mode!r}, options={self._core.options!r})"

    @property
    def mode(self) -> Mode | None:
        """The mode in use, once known."""
        return self._core.mode

    def with_deny_cache(self, entries: int) -> Client:
        """This client (the same connection, mode, breaker and policy) with a deny cache of
        ``entries`` entries, the least recently used evicted first: a check of a cost above 0
        that Redis denied with ``retry_after_ms`` R is denied again in the process, without a
        call, until R has passed on the process's monotonic clock (:attr:`Outcome.answered_locally`
        ``DENY_CACHE``). It never admits. Peeks, partial grants, leases, reservations and
        settlements never use it. The client it was made from is unchanged."""
        c = copy.copy(self)
        c._denies = DenyCache(entries, self._core.options.timeout)
        return c

    def without_deny_cache(self) -> Client:
        """This client without a deny cache (the client it was made from is unchanged)."""
        c = copy.copy(self)
        c._denies = None
        return c

    def with_durability(self, durability: Durability) -> Client:
        """This client (and the copies made from it afterwards) admitting only what
        ``durability``'s replicas acknowledged: every call that may write (a cost above 0, a
        partial grant, a lease) runs on a connection of its own followed by ``WAIT replicas
        timeout`` (``WAITAOF 0 replicas timeout`` with ``aof``, ``WAIT`` on a server without
        it), and an admission fewer replicas acknowledged in time becomes what
        :class:`ShortAck` says. Denials are answered at once. ``durability.timeout`` must be
        below the client's timeout. On a cluster client the call and its ``WAIT`` go to the
        master of the call's key (of its slot as the client knows it) on a connection of their
        own."""
        if durability.replicas < 1:
            raise Unsupported("durable admissions need at least 1 replica")
        if durability.timeout >= self._core.options.timeout:
            raise Unsupported("the WAIT timeout must be below the client's timeout")
        c = copy.copy(self)
        c._lane = Lane(self._redis, Durable(durability))
        return c

    def durability_stats(self) -> DurabilityStats:
        """What the durable admissions met so far (all zero without durability)."""
        return DurabilityStats() if self._lane is None else self._lane.durable.stats()

    def with_batching(self, batching: Batching | None = None) -> Client:
        """This client (and the copies made from it afterwards) taking leased batches for hot
        keys, as ``batching`` says (default :class:`Batching`): a hot key's checks take several
        units with one partial grant (``UPTO n``) and admit from them without calling Redis
        (:attr:`Outcome.answered_locally` ``BATCH``), giving back what they did not use when the
        batch's lease ends (see docs/clients.md). The client it was made from is unchanged."""
        c = copy.copy(self)
        plain = copy.copy(self)
        plain._batches, plain._denies = None, None
        c._batches = Batches(plain, batching or Batching())
        return c

    def without_batching(self) -> Client:
        """This client without batches (those of other copies carry on)."""
        c = copy.copy(self)
        c._batches = None
        return c

    def batch_stats(self) -> BatchStats:
        """What the batches did so far (all zero without batches)."""
        return BatchStats() if self._batches is None else self._batches.table.stats()

    def batch_size(self, limits: Limits) -> int | None:
        """The size the next batch of these limits starts from (B), while they are tracked."""
        return None if self._batches is None else self._batches.table.size(signature(list(limits)))

    def flush(self) -> int:
        """Gives back at once what every batch holds (``RL.SETTLE ... DELTA -n``), and waits for
        the answers: the units given back. The keys are batched again on their next calls."""
        return 0 if self._batches is None else self._batches.flush()

    def denied_until(self, limits: Limits, cost: int) -> float | None:
        """When the deny cache's entry for these limits at this cost expires
        (``time.monotonic()``), if it has one."""
        return None if self._denies is None else self._denies.until(signature(list(limits)), cost)

    def deny_cache_capacity(self) -> int | None:
        """The deny cache's number of entries at most, ``None`` without one."""
        return None if self._denies is None else self._denies.capacity

    def deny_cache_len(self) -> int:
        """Entries in the deny cache now."""
        return 0 if self._denies is None else len(self._denies)

    def breaker_open(self) -> bool:
        """Whether the circuit breaker is open (or half open)."""
        return self._core.breaker.is_open()

    def close(self) -> int:
        """Stops the batches of this client and of every copy sharing them (their checks go to
        Redis one by one from then on), gives back what they hold (the units given back, 0
        without batches), then closes the connections (a later call opens new ones)."""
        returned = 0 if self._batches is None else self._batches.close()
        self._redis.close()
        return returned

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # Driving the exchanges ---------------------------------------------------------------------

    def _routing(self, call: tuple[Any, ...]) -> dict[str, Any]:
        """A cluster sends the keyless detection commands to any one node."""
        if self._cluster and call[0] in ANY_NODE:
            # A node, not the RANDOM flag, which redis-py 8.1 routes by key all the same.
            return {"target_nodes": self._redis.get_random_node()}  # type: ignore[union-attr]
        return {}

    def _send(self, call: tuple[Any, ...], execute: Callable[..., Any] | None = None) -> Any:
        try:
            reply = self._execute(*call, **self._routing(call)) if execute is None else execute(*call)
        except ResponseError:
            self._answered(self._gate)  # an error reply is an answer too (NOSCRIPT, ERR ...)
            raise
        self._answered(self._gate)
        return reply

    def _answered(self, gate: Gate | None) -> None:
        self._core.note_answer()
        if gate is not None:
            gate.progress()

    def _step(self, step: Detect | LoadScript) -> None:
        """A start-up step, run by this caller or waited for (:class:`ratelimit_client._flight.Flight`)."""
        if isinstance(step, Detect):

            def detect() -> None:
                self._drive(self._core.detect())

            self._core.detection.run_sync(step.seen, detect)
        else:
            script = step.script

            def load() -> None:
                self._send(("SCRIPT LOAD", script.text))

            step.flight.run_sync(step.seen, load)

    def _drive(self, exchange: Exchange[T], execute: Callable[..., Any] | None = None) -> T:
        try:
            call = next(exchange)
            while True:
                try:
                    if isinstance(call, tuple):
                        reply = self._send(call, execute)
                    else:
                        self._step(call)
                        reply = None
                except (RedisError, RedisClusterException, OSError) as e:
                    call = exchange.throw(e)
                except Failure as f:
                    # Another caller's run of that step failed: a refusal is this call's too.
                    if f.__cause__ is None or classify(f.__cause__) is None:
                        raise
                    call = exchange.throw(f.__cause__)
                else:
                    call = exchange.send(reply)
        except StopIteration as stop:
            value: T = stop.value
            return value

    def _guarded(self, exchange: Exchange[T], pinned: Single | None = None) -> T:
        """Runs an exchange under the breaker; :class:`Rejected` for an answer about the call,
        :class:`Failure` when Redis did not decide. ``pinned``: a connection of the durable
        lane, which sends every command of the exchange (outside the gate)."""
        core = self._core
        gate = None if pinned is not None else self._gate
        if not core.breaker.permit():
            exchange.close()
            raise Failure
        if gate is not None:
            try:
                gate.enter()
            except Failure:
                exchange.close()
                raise
        began = time.monotonic()
        try:
            value = self._drive(exchange, None if pinned is None else pinned.execute_command)
        except (RedisError, RedisClusterException, OSError, UnexpectedReply) as e:
            rejected = classify(e)
            if rejected is None:
                core.failed(began)
                if gate is not None:
                    gate.failed()
                if demoted(e):
                    self._reconnect()
                raise Failure from e
            core.breaker.success()
            if error_code(e) == "READONLY":
                self._reconnect()
            raise rejected from None
        finally:
            if gate is not None:
                gate.leave()
        core.breaker.success()
        return value

    def _check_one(self, key: str, algo: Algorithm, cost: int, command: tuple[Any, ...], mode: Mode) -> Outcome:
        """A check of one limit whose one command is known (:meth:`Core.command_one`): what
        :meth:`_guarded` does for its exchange, without one (the path of most calls)."""
        core = self._core
        if not core.breaker.permit():
            return core.degraded_outcome(key, algo, cost, None)
        gate = self._gate
        if gate is not None:
            try:
                gate.enter()
            except Failure:
                return core.degraded_outcome(key, algo, cost, None)
        began = time.monotonic()
        try:
            try:
                reply = self._execute(*command)
            except ResponseError:
                self._answered(gate)  # an error reply is an answer too
                raise
            core.answered = now = time.monotonic()
            if gate is not None:
                gate.progress(now)
            outcome = take_outcome(reply, cost, mode)
        except (RedisError, RedisClusterException, OSError, UnexpectedReply) as e:
            rejected = classify(e)
            if rejected is None:
                core.failed(began)
                if gate is not None:
                    gate.failed()
                if demoted(e):
                    self._reconnect()
                return core.degraded_outcome(key, algo, cost, None)
            core.breaker.success()
            if error_code(e) == "READONLY":
                self._reconnect()
            raise rejected from None
        finally:
            if gate is not None:
                gate.leave()
        core.breaker.success()
        return outcome

    def _durably(self, exchange: Callable[[Durable | None], Exchange[T]], writes: bool, key: str) -> T:
        """Runs a call's exchange; one that may write, on a durable client, on a connection of
        the lane of its own (to the master of ``key`` on a cluster), its admission followed by
        ``WAIT``."""
        lane = self._lane if writes else None
        if lane is None:
            return self._guarded(exchange(None))
        try:
            node, conn = lane.take(key)
        except (RedisError, RedisClusterException) as e:
            raise Failure from e  # no master known for the key's slot
        try:
            value = self._guarded(exchange(lane.durable), conn)
        except BaseException:
            lane.drop(conn)
            raise
        lane.put(node, conn)
        return value

    def _reconnect(self) -> None:
        """The address answered as a replica (``READONLY``: a failover moved the master). Drops
        the pool's connections, so that the next call connects anew to whatever the address
        names then. A cluster client follows the failover itself."""
        pool = getattr(self._redis, "connection_pool", None)
        if pool is not None:
            pool.disconnect()
        if self._gate is not None:
            self._gate.recount()

    def detect(self) -> Mode | None:
        """Detects the mode now if not known yet; ``None`` if Redis is unreachable."""
        try:
            return self._guarded(self._core.resolve_mode())
        except (Failure, RateLimitError):
            return None

    # Limits ------------------------------------------------------------------------------------

    def _decide_one(self, key: str, algo: Algorithm, cost: int, lease: str | None, upto: bool = False) -> Outcome:
        core = self._core
        try:
            decision, granted, mode = self._durably(
                lambda durable: core.call_one(key, algo, cost, lease, upto, durable), writes(cost, upto, lease), key
            )
        except Failure:
            return self._core.degraded_outcome(key, algo, cost, lease, upto)
        return Outcome(decision, None, mode, granted)

    def _decide_all(self, limits: Limits, cost: int, lease: str | None, upto: bool = False) -> MultiOutcome:
        if one_alone(limits, cost):
            key, algo = limits[0]
            return multi_of(self._decide_one(key, algo, cost, lease, upto))
        check_count(limits)
        try:
            core = self._core
            (allowed, denied_by, decisions, granted), mode = self._durably(
                lambda durable: core.call_all(limits, cost, lease, upto, durable),
                writes(cost, upto, lease),
                limits[0][0],
            )
        except Failure:
            return self._core.degraded_all(limits, cost, lease, upto)
        return MultiOutcome(allowed, denied_by, decisions, None, mode, granted)

    def check(self, key: str, algo: Algorithm, cost: int = 1) -> Outcome:
        """Checks (and on admission consumes) ``cost`` units of ``algo`` on ``key``. A
        concurrency limit is only peeked at here (cost 0, through ``RL.ALL``); its slots are
        taken with :meth:`acquire` (:class:`Unsupported` for a cost above 0)."""
        if not isinstance(algo, Concurrency):
            if cost > 0 and (self._batches is not None or self._denies is not None):
                return single_of(self._decide_hot([(key, algo)], cost))
            core = self._core
            mode = core.mode
            if (cost <= 0 or self._lane is None) and mode is not None:
                command = core.command_one(key, algo, cost)
                if command is not None:
                    return self._check_one(key, algo, cost, command, mode)
            return self._decide_one(key, algo, cost, None)
        return single_of(self.check_all([(key, algo)], cost))

    def peek(self, key: str, algo: Algorithm) -> Outcome:
        """The current state, consuming nothing (cost 0)."""
        return self.check(key, algo, 0)

    def check_all(self, limits: Limits, cost: int = 1) -> MultiOutcome:
        """Several limits at once: admitted only if every limit admits, and then ``cost`` is
        consumed from all of them (``RL.ALL``; one limit alone uses its own command).
        Concurrency limits are only peeked at here (cost 0)."""
        limits = list(limits)
        if not has_concurrency(limits):
            if cost > 0 and 1 <= len(limits) <= 16 and self._hot():
                return self._decide_hot(limits, cost)
            return self._decide_all(limits, cost, None)
        if cost > 0:
            raise Unsupported("concurrency limits take a lease: Client.acquire_all")
        return self._decide_all(limits, 0, new_lease_id())

    def _hot(self) -> bool:
        return self._batches is not None or self._denies is not None

    def _decide_hot(self, limits: Limits, cost: int) -> MultiOutcome:
        """A check of a cost above 0 through the batches and the deny cache: a batch holding the
        units admits first (they are granted), then a standing denial denies, then Redis
        decides (a refill for a hot key), and a denial is remembered."""
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
            o = batches.refill(sig, limits, cost, denies)
            if o is not None:
                return o
            # The refill that came first may have been denied meanwhile.
            cached = None if denies is None else denies.lookup(sig, cost)
            if cached is not None:
                return cached
        sent = time.monotonic()
        o = self._decide_all(limits, cost, None)
        if denies is not None:
            denies.record(sig, cost, o, sent)
        if batches is not None:
            batches.table.observe(sig, o)
        return o

    def _try_grant(self, limits: Limits, n: int) -> MultiOutcome | None:
        """A partial grant of at most ``n`` units for a batch: ``None`` when Redis cannot answer
        (no failure policy applied)."""
        core = self._core
        try:
            if len(limits) == 1:
                key, algo = limits[0]
                d, granted, mode = self._durably(
                    lambda durable: core.call_one(key, algo, n, None, True, durable), True, key
                )
                return MultiOutcome(d.allowed, 0 if d.allowed else 1, (d,), None, mode, granted)
            (allowed, denied_by, ds, granted), mode = self._durably(
                lambda durable: core.call_all(limits, n, None, True, durable), True, limits[0][0]
            )
            return MultiOutcome(allowed, denied_by, ds, None, mode, granted)
        except Failure:
            return None

    def _degraded_for(self, limits: Limits, cost: int) -> MultiOutcome:
        """The failure policy's answer for a cost, as a call to Redis that failed would get it."""
        if len(limits) == 1:
            key, algo = limits[0]
            return multi_of(self._core.degraded_outcome(key, algo, cost, None))
        return self._core.degraded_all(limits, cost, None)

    def check_upto(self, key: str, algo: Algorithm, n: int) -> Outcome:
        """A partial grant (``UPTO n``): as many units of ``algo`` on ``key`` as are left now,
        at least 1 and at most ``n``, taken in one call; :attr:`Outcome.granted` says how many
        (0 when denied: nothing was left, and the decision is the denial of one unit). Give
        back what goes unused with :meth:`settle` (a negative delta). ``n`` from 1 to 10^15
        (1,000 for a sliding log); not for a concurrency limit (:class:`Unsupported`). Batches
        and the deny cache are not used. When Redis cannot answer: ``FailOpen`` grants ``n``
        (nothing taken), ``FailClosed`` denies, ``Local`` grants what its in-process bucket
        has, at most ``n``."""
        check_upto_args([(key, algo)], n)
        return self._decide_one(key, algo, n, None, upto=True)

    def check_all_upto(self, limits: Limits, n: int) -> MultiOutcome:
        """A partial grant of several limits at once (``RL.ALL ... UPTO n``): every limit is
        granted the same units, the fewest any of them has left, at most ``n``
        (:attr:`MultiOutcome.granted`; 0 when denied, as a cost of 1 would be). One limit alone
        uses its own command. Concurrency limits are refused (:class:`Unsupported`)."""
        limits = list(limits)
        check_upto_args(limits, n)
        return self._decide_all(limits, n, None, upto=True)

    # Leases ------------------------------------------------------------------------------------

    def acquire(self, key: str, limit: Concurrency, lease_id: str | None = None) -> LeaseOutcome:
        """Takes one of ``limit.limit`` slots of ``key`` (``RL.ACQUIRE``) under ``lease_id`` (1 to
        128 bytes; a fresh id when ``None``): a live lease of that id is renewed instead of
        taking a second slot. Admitted: the outcome and the :class:`Lease`; denied: the outcome
        alone, ``retry_after_ms`` until a lease expires. Use it as a context manager to give the
        slot back at the end of the block: ``with client.acquire(key, limit) as held:``."""
        lease_id = new_lease_id() if lease_id is None else lease_id
        outcome = self._decide_one(key, limit, 1, lease_id)
        lease = Lease(self, lease_id, [(key, limit)], outcome.degraded) if outcome.decision.allowed else None
        return LeaseOutcome(outcome, lease)

    def acquire_all(self, limits: Limits, cost: int = 1) -> MultiLeaseOutcome:
        """Several limits at once, concurrency limits among them (``RL.ALL ... LEASE id COST
        cost``): admitted only if every limit admits; then ``cost`` is consumed from the others
        and one slot of each concurrency limit is held by the returned lease (``None`` without a
        concurrency limit). Cost 0 peeks and takes no slot."""
        limits = list(limits)
        held = [(k, a) for k, a in limits if isinstance(a, Concurrency)]
        if not held:
            return MultiLeaseOutcome(self._decide_all(limits, cost, None), None)
        lease_id = new_lease_id()
        outcome = self._decide_all(limits, cost, lease_id)
        lease = Lease(self, lease_id, held, outcome.degraded) if outcome.allowed and cost > 0 else None
        return MultiLeaseOutcome(outcome, lease)

    def release(self, key: str, lease_id: str) -> bool:
        """Gives back ``lease_id``'s slot of ``key`` (``RL.RELEASE``): whether a live lease was
        released; ``False`` too when Redis cannot answer (the lease expires by itself)."""
        try:
            return self._guarded(self._core.call_release(key, lease_id)) == 1
        except Failure:
            return False

    # Reservations ------------------------------------------------------------------------------

    def reserve(self, key: str, algo: Algorithm, estimate: int) -> ReservationOutcome:
        """Checks and on admission consumes ``estimate`` units, as :meth:`check` does, for work
        whose true cost is known only afterwards: the :class:`Reservation` settles the
        difference (:meth:`Reservation.settle`). Dropped unsettled, the estimate stays."""
        if isinstance(algo, Concurrency):
            raise Unsupported("concurrency limits are not settled: Client.acquire")
        outcome = self._decide_one(key, algo, estimate, None)
        reservation = Reservation(self, [(key, algo)], estimate, outcome.degraded) if outcome.decision.allowed else None
        return ReservationOutcome(outcome, reservation)

    def reserve_all(self, limits: Limits, estimate: int) -> MultiReservationOutcome:
        """:meth:`reserve` over several limits at once, as :meth:`check_all`."""
        limits = list(limits)
        if has_concurrency(limits):
            raise Unsupported("concurrency limits are not settled: Client.acquire_all")
        outcome = self._decide_all(limits, estimate, None)
        reservation = Reservation(self, limits, estimate, outcome.degraded) if outcome.allowed else None
        return MultiReservationOutcome(outcome, reservation)

    def settle(self, limits: Limits, delta: int) -> Settlement:
        """Adjusts what was consumed from every limit by ``delta`` units in one ``RL.SETTLE``:
        below 0 gives units back (never above the limit), above 0 takes more without an
        admission check (into debt if need be), 0 only reports. When Redis cannot answer
        nothing is adjusted and the decisions are the failure policy's for a cost of 0."""
        limits = list(limits)
        if has_concurrency(limits):
            raise Unsupported("concurrency limits are not settled")
        check_count(limits)
        try:
            decisions, mode = self._guarded(self._core.call_settle(limits, delta))
        except Failure:
            return self._core.degraded_settlement(limits)
        return Settlement(decisions, None, mode)

    def _settle_charged(self, limits: Limits, delta: int, charged: Degraded | None) -> Settlement:
        """Settles where a reservation was charged: Redis, the in-process buckets of the
        ``Local`` policy, or nowhere (admitted by ``FailOpen``)."""
        policy = self._core.options.policy
        if charged is None:
            return self.settle(limits, delta)
        if charged is Degraded.LOCAL and isinstance(policy, Local):
            return self._core.local_settlement(limits, delta, policy.instances)
        return self._core.policy_settlement(limits, charged)

    # RL.TOP ------------------------------------------------------------------------------------

    def top(self, count: int = 10) -> list[TopEntry]:
        """The ``count`` keys with the most denials on the server, most first (``RL.TOP``,
        module only: :class:`Unsupported` in the other modes; :class:`Unavailable` when Redis
        does not answer, no failure policy). An operator's command, outside ``@ratelimit``."""
        return self._top(count)

    def reset_top(self) -> None:
        """Clears the list of :meth:`top` (``RL.TOP RESET``)."""
        self._top(None)

    def _top(self, count: int | None) -> list[TopEntry]:
        if self._cluster:
            raise Unsupported(ON_A_CLUSTER)
        try:
            entries = self._guarded(self._core.call_top(count))
        except Failure:
            raise Unavailable from None
        if entries is None:
            raise Unsupported("the most-denied keys are counted by the module only (RL.TOP)")
        return entries

    def load_library(self) -> str:
        """Loads (or replaces) the Functions library on the server: ``FUNCTION LOAD REPLACE``.
        On a cluster, do it on every master."""
        name = self._execute("FUNCTION LOAD", "REPLACE", LIBRARY)
        return name.decode() if isinstance(name, bytes) else str(name)


class Lease:
    """Slots held under one lease id (one key, or each concurrency limit of
    :meth:`Client.acquire_all`) until the lease expires or is given back: :meth:`release`, or the
    end of a ``with`` block."""

    def __init__(
        self, client: Client, lease_id: str, limits: Sequence[tuple[str, Concurrency]], degraded: Degraded | None
    ) -> None:
        self._client = client
        self._id = lease_id
        self._limits = list(limits)
        self._lock = threading.Lock()
        self._on_redis = degraded is None
        self._local = degraded is Degraded.LOCAL
        self._released = False
        self._last_renewal: Outcome | None = None
        self._stop: threading.Event | None = None
        # Held by a keep-alive renewal on its way: a release waits for it to land.
        self._renewing = threading.Lock()

    @property
    def id(self) -> str:
        """The lease id (the sorted set's member)."""
        return self._id

    @property
    def key(self) -> str:
        """The key the slot is held on (the first, for a lease over several keys)."""
        return self._limits[0][0]

    @property
    def limits(self) -> list[tuple[str, Concurrency]]:
        return list(self._limits)

    @property
    def holds_slot(self) -> bool:
        """Whether any slot is held anywhere (``False`` for a lease admitted by ``FailOpen`` and
        not renewed on Redis since, or released)."""
        with self._lock:
            return (self._on_redis or self._local) and not self._released

    @property
    def last_renewal(self) -> Outcome | None:
        """The outcome of the latest renewal (:meth:`renew` or :meth:`keep_alive`)."""
        with self._lock:
            return self._last_renewal

    def renew(self) -> Outcome:
        """Extends the lease to now + ``lease_sec`` (``RL.ACQUIRE`` again with the same id).
        Denied means the slot is lost. Over several keys: the first denial, else the key with
        the fewest free slots."""
        answer: Outcome | None = None
        for key, limit in self._limits:
            o = self._client._decide_one(key, limit, 1, self._id)
            if o.decision.allowed:
                with self._lock:
                    if o.degraded is None:
                        self._on_redis = True
                    elif o.degraded is Degraded.LOCAL:
                        self._local = True
            answer = renewal_answer(answer, o)
        assert answer is not None
        with self._lock:
            self._last_renewal = answer
        return answer

    def keep_alive(self, every: float) -> None:
        """Renews every ``every`` seconds from a daemon thread until the lease is released
        (choose ``every`` well below ``lease_sec``). Calling it again replaces the timer. A
        release waits for a renewal already on its way, so that none lands after it."""
        self._stop_keep_alive()
        stop = threading.Event()
        self._stop = stop

        def renew_until_stopped() -> None:
            while not stop.wait(every):
                with self._renewing:
                    if stop.is_set():
                        return
                    try:
                        self.renew()
                    except RateLimitError:
                        pass

        threading.Thread(target=renew_until_stopped, name=f"lease-{self._id}", daemon=True).start()

    def _stop_keep_alive(self) -> None:
        if self._stop is not None:
            self._stop.set()
            self._stop = None

    def _take(self) -> tuple[bool, bool]:
        with self._renewing, self._lock:
            places = (self._on_redis and not self._released, self._local and not self._released)
            self._released = True
            return places

    def release(self) -> bool:
        """Gives the slots back now: whether a live lease was released (``False`` if it had
        expired, was admitted by ``FailOpen``, or Redis could not answer: it then expires by
        itself). A keep-alive renewal on its way lands first; none is sent after. Releasing
        twice is harmless."""
        self._stop_keep_alive()
        on_redis, local = self._take()
        freed = False
        if local:
            for key, _ in self._limits:
                freed |= self._client._core.leases.release(key, self._id)
        if on_redis:
            error: RateLimitError | None = None
            for key, _ in self._limits:
                try:
                    freed |= self._client.release(key, self._id)
                except RateLimitError as e:
                    error = error or e
            if error is not None:
                raise error
        return freed

    def __enter__(self) -> Lease:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self.release()
        except RateLimitError:
            pass  # the lease expires by itself

    def __repr__(self) -> str:
        return f"Lease(id={self._id!r}, limits={self._limits!r}, holds_slot={self.holds_slot})"


class LeaseOutcome:
    """The answer to :meth:`Client.acquire`: the outcome, and the lease when admitted. As a
    context manager it gives the slot back at the end of the block."""

    def __init__(self, outcome: Outcome, lease: Lease | None) -> None:
        self.outcome = outcome
        #: Set exactly when admitted.
        self.lease = lease

    @property
    def allowed(self) -> bool:
        return self.outcome.decision.allowed

    def __enter__(self) -> LeaseOutcome:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.lease is not None:
            self.lease.__exit__(exc_type, exc, tb)

    def __repr__(self) -> str:
        return f"LeaseOutcome(outcome={self.outcome!r}, lease={self.lease!r})"


class MultiLeaseOutcome:
    """The answer to :meth:`Client.acquire_all`: every limit's outcome, and the lease holding
    the concurrency limits' slots when admitted (a context manager as :class:`LeaseOutcome`)."""

    def __init__(self, outcome: MultiOutcome, lease: Lease | None) -> None:
        self.outcome = outcome
        self.lease = lease

    @property
    def allowed(self) -> bool:
        return self.outcome.allowed

    def __enter__(self) -> MultiLeaseOutcome:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.lease is not None:
            self.lease.__exit__(exc_type, exc, tb)

    def __repr__(self) -> str:
        return f"MultiLeaseOutcome(outcome={self.outcome!r}, lease={self.lease!r})"


class Reservation:
    """An estimate consumed from one or several limits, to be settled with the true cost.
    Dropped unsettled, the estimate stays charged (nothing is sent)."""

    def __init__(self, client: Client, limits: Limits, estimate: int, charged: Degraded | None) -> None:
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
        """``None`` when the estimate was consumed on Redis; ``LOCAL`` in the in-process
        buckets; ``FAIL_OPEN`` when nothing was consumed anywhere."""
        return self._charged

    def settle(self, actual: int) -> Settlement:
        """Settles with the true cost: ``actual - estimate`` refunded (below 0) or charged (above
        0, into debt if need be) on every limit, in one ``RL.SETTLE``; the state afterwards.
        A reservation of the ``Local`` policy is settled in its buckets (even once Redis is
        back); one admitted by ``FailOpen`` sends nothing. A reservation is settled once
        (:class:`Unsupported` the second time)."""
        if self._settled:
            raise Unsupported("a reservation is settled once")
        self._settled = True
        return self._client._settle_charged(self._limits, actual - self._estimate, self._charged)

    def __repr__(self) -> str:
        return f"Reservation(limits={self._limits!r}, estimate={self._estimate}, degraded={self._charged})"


class ReservationOutcome:
    """The answer to :meth:`Client.reserve`: the outcome, and the reservation when admitted."""

    def __init__(self, outcome: Outcome, reservation: Reservation | None) -> None:
        self.outcome = outcome
        self.reservation = reservation

    @property
    def allowed(self) -> bool:
        return self.outcome.decision.allowed

    def __repr__(self) -> str:
        return f"ReservationOutcome(outcome={self.outcome!r}, reservation={self.reservation!r})"


class MultiReservationOutcome:
    """The answer to :meth:`Client.reserve_all`."""

    def __init__(self, outcome: MultiOutcome, reservation: Reservation | None) -> None:
        self.outcome = outcome
        self.reservation = reservation

    @property
    def allowed(self) -> bool:
        return self.outcome.allowed

    def __repr__(self) -> str:
        return f"MultiReservationOutcome(outcome={self.outcome!r}, reservation={self.reservation!r})"


class Limiter:
    """A :class:`Client` bound to one algorithm and its parameters."""

    def __init__(self, client: Client, algorithm: Algorithm) -> None:
        self.client = client
        self.algorithm = algorithm

    def check(self, key: str, cost: int = 1) -> Outcome:
        return self.client.check(key, self.algorithm, cost)

    def peek(self, key: str) -> Outcome:
        return self.client.check(key, self.algorithm, 0)

    def acquire(self, key: str, lease_id: str | None = None) -> LeaseOutcome:
        if not isinstance(self.algorithm, Concurrency):
            raise Unsupported("acquire takes a concurrency limit")
        return self.client.acquire(key, self.algorithm, lease_id)

    def reserve(self, key: str, estimate: int) -> ReservationOutcome:
        return self.client.reserve(key, self.algorithm, estimate)

    def __repr__(self) -> str:
        return f"Limiter(client={self.client!r}, algorithm={self.algorithm!r})"


class Lane:
    """The durable lane: clients of one connection each, to the client's server (to each master
    of a cluster), for calls that wait for replicas (``WAIT`` holds the connection it is sent on
    until they answer, so the client's shared pool never waits). Idle ones are kept for the next
    calls, up to 64 per server."""

    IDLE_KEPT = 64

    def __init__(self, conn: redis.Redis | redis_cluster.RedisCluster, durable: Durable) -> None:
        self.durable = durable
        self._cluster = conn if isinstance(conn, redis_cluster.RedisCluster) else None
        self._pool = None if isinstance(conn, redis_cluster.RedisCluster) else conn.connection_pool
        self._idle: dict[str, list[redis.Redis]] = {}
        self._lock = threading.Lock()

    def take(self, key: str) -> tuple[str, redis.Redis]:
        """A connection to the server of ``key`` (the master of its slot on a cluster), and
        that server's name."""
        if self._cluster is None:
            name, pool = "", self._pool
        else:
            of_key: Callable[..., Any] = self._cluster.get_node_from_key  # no annotations
            node = of_key(key)
            name, pool = node.name, node.redis_connection.connection_pool
        with self._lock:
            idle = self._idle.get(name)
            if idle:
                return name, idle.pop()
        return name, redis.Redis(connection_pool=pool_of_one(pool))

    def put(self, name: str, conn: redis.Redis) -> None:
        with self._lock:
            idle = self._idle.setdefault(name, [])
            if len(idle) < self.IDLE_KEPT:
                idle.append(conn)
                return
        conn.close()

    def drop(self, conn: redis.Redis) -> None:
        """A connection whose call did not end well is closed."""
        conn.connection_pool.disconnect()


class Batches:
    """The synchronous client's batches: the table (``_batch.py``), each entry's turn a lock,
    and a thread of their own that gives batches back when their lease ends (and the units of
    batches evicted or replaced) without holding up a request."""

    def __init__(self, client: Client, cfg: Batching) -> None:
        #: The client without batches nor deny cache, for the grants and returns.
        self.client = client
        self.table = Table(cfg, threading.Lock)
        self._cond = threading.Condition()
        self._timers: list[tuple[float, int, str, int]] = []
        self._pending: list[Return] = []
        self._seq = 0
        self._thread: threading.Thread | None = None

    def try_local(self, sig: str, limits: Limits, cost: int) -> tuple[str, MultiOutcome | None]:
        step, o, returns = self.table.try_local(sig, limits, cost)
        self._send(returns)
        return step, o if step == ANSWER else None

    def refill(self, sig: str, limits: Limits, cost: int, denies: DenyCache | None) -> MultiOutcome | None:
        """Takes a new batch for ``sig``, one refill at a time: callers that come while one is
        in flight wait for it and are served from it when it covers them. ``None``: decide this
        request with a call of its own."""
        table = self.table
        w = table.wait(sig, cost)
        if w is None:
            return None
        gate, seen = w
        try:
            gate.acquire()
        finally:
            table.waited(sig, cost)
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
            sent = time.monotonic()
            try:
                reply = self.client._try_grant(limits, v)
            except RateLimitError:
                table.unanswered(sig)
                raise
            if reply is None:
                table.unanswered(sig)
                # Redis could not answer: the failure policy answers this request.
                return self.client._degraded_for(limits, cost)
            got = table.granted(sig, limits, cost, v, sent, reply)
        finally:
            gate.release()
        self._send(got.returns)
        if got.timer is not None:
            self._schedule(sig, *got.timer)
        if got.deny is not None and denies is not None:
            denies.record(sig, cost, got.deny, sent)
        return got.answer

    def give_back(self, r: Return) -> int:
        """Sends what ``r`` can give back: the units given back to every limit (the fewest, for
        a plan)."""
        client = self.client
        plan = return_plan(r, time.monotonic(), client._core.options.timeout)
        back = dict.fromkeys(range(len(r.limits)), 0)
        for subset, n in plan:
            try:
                s = client.settle(subset, -n)
            except RateLimitError:
                continue
            if s.degraded is None:
                for i, lim in enumerate(r.limits):
                    if lim in subset:
                        back[i] = n
        returned = min(back.values(), default=0)
        self.table.account(r, returned)
        return returned

    def flush(self) -> int:
        return sum(self.give_back(r) for r in self.table.drain())

    def close(self) -> int:
        self.table.closed = True
        return self.flush()

    # The thread of the returns ----------------------------------------------------------------

    def _send(self, returns: list[Return]) -> None:
        if returns:
            with self._cond:
                self._pending += returns
                self._start()
                self._cond.notify()

    def _schedule(self, sig: str, at: float, generation: int) -> None:
        with self._cond:
            self._seq += 1
            heapq.heappush(self._timers, (at, self._seq, sig, generation))
            self._start()
            self._cond.notify()

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="ratelimit-batches", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    now = time.monotonic()
                    due: list[Return] = []
                    while self._timers and self._timers[0][0] <= now:
                        _, _, sig, generation = heapq.heappop(self._timers)
                        due += self.table.expired(sig, generation)
                    due += self._pending
                    self._pending = []
                    if due:
                        break
                    self._cond.wait(None if not self._timers else max(0.0, self._timers[0][0] - now))
            for r in due:
                try:
                    self.give_back(r)
                except Exception:
                    self.table.account(r, 0)


def pool_of_one(pool: Any) -> Any:
    """A pool of one connection with the settings of ``pool`` (of the same kind, to the master
    the Sentinels name for a Sentinel pool)."""
    kwargs = dict(pool.connection_kwargs)
    if hasattr(pool, "sentinel_manager"):
        kwargs.pop("connection_pool", None)
        return type(pool)(pool.service_name, pool.sentinel_manager, max_connections=1, **kwargs)
    return type(pool)(connection_class=pool.connection_class, max_connections=1, **kwargs)


def host_port(url: str) -> tuple[str, int]:
    """``redis://host:port`` (or ``host:port``) as redis-py's Sentinel takes an address."""
    parsed = urlparse(url if "://" in url else f"redis://{url}")
    return parsed.hostname or "localhost", parsed.port or 26379


def demoted(e: BaseException) -> bool:
    """redis-py's Sentinel connection met ``READONLY``: the master it knew is a replica now."""
    return isinstance(e, RedisConnectionError) and "previous master is now a slave" in str(e)


def gate_of(conn: Any, options: Options, refused: Callable[[], bool], threads: bool = True) -> Gate | None:
    """The gate of a client on one server: ``options.max_in_flight`` places, no more than its
    pool has connections (``threads``: shared by threads, not by one event loop's tasks). A
    cluster client has a pool per node, and no gate."""
    pool = getattr(conn, "connection_pool", None)
    size = getattr(pool, "max_connections", None)
    if not isinstance(size, int) or isinstance(conn, redis_cluster.RedisCluster):
        return None
    return Gate(
        min(size, max(1, options.max_in_flight)), stall_of(options), connected_in(pool), refused, threads=threads
    )


def address_of(conn: Any) -> str:
    """Where a redis-py client connects, for a repr: ``redis://host:port/db``, ``unix://path``,
    ``cluster``."""
    if isinstance(conn, (redis_cluster.RedisCluster, redis.asyncio.cluster.RedisCluster)):
        return "cluster"
    kw = getattr(getattr(conn, "connection_pool", None), "connection_kwargs", {})
    if "path" in kw:
        return f"unix://{kw['path']}"
    return f"redis://{kw.get('host', 'localhost')}:{kw.get('port', 6379)}/{kw.get('db', 0)}"


def stall_of(options: Options) -> float:
    """How long calls waiting for a connection wait for a round trip to end: ten timeouts, and
    at least a second."""
    return max(1.0, 10 * options.timeout)


def load_library(conn: redis.Redis | redis.cluster.RedisCluster) -> str:
    """``FUNCTION LOAD REPLACE`` of the library ``ratelimit`` on ``conn``'s server."""
    execute: Callable[..., Any] = conn.execute_command
    name = execute("FUNCTION LOAD", "REPLACE", LIBRARY)
    return name.decode() if isinstance(name, bytes) else str(name)
