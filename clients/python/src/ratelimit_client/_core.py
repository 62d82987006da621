"""The part of the clients that does no I/O, shared by the synchronous and the asyncio client.

Every exchange with Redis is written once, as a generator that yields the commands to send and
receives their replies (or has the error raised into it): the synchronous client drives it with
``redis.Redis.execute_command``, the asyncio one with ``await redis.asyncio.Redis.execute_command``.
What to answer with the reply, or without one (the failure policy, the breaker, the in-process
buckets), is decided here too.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisClusterException, RedisError, ResponseError

from ._breaker import Breaker
from ._flight import Failure, Flight
from ._local import LocalLeases, LocalLimiter
from ._scripts import LIBRARY_NAME, SCRIPTS, Script, function_name
from ._types import (
    Batching,
    BatchStats,
    Decision,
    Degraded,
    Durability,
    DurabilityStats,
    FailClosed,
    FailOpen,
    Local,
    LocalAnswer,
    Mode,
    ModeChoice,
    MultiOutcome,
    Options,
    Outcome,
    Rejected,
    Settlement,
    ShortAck,
    TopEntry,
    Unsupported,
)
from .algorithms import Algorithm, Concurrency, FixedWindow, SlidingLog, SlidingWindow

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Detect:
    """A step of the client's start-up: the mode detected once for every caller (the driver
    runs :meth:`Core.detect` for the first, the others wait for its end). ``seen`` is the
    detection's generation when the caller found the mode unknown."""

    seen: int


@dataclass(frozen=True, slots=True)
class LoadScript:
    """``SCRIPT LOAD`` of ``script`` after ``NOSCRIPT``, once for every caller that got it for a
    send at generation ``seen`` of ``flight`` (the others wait for that load)."""

    script: Script
    flight: Flight
    seen: int


#: A command (the arguments of ``execute_command``), or a start-up step the driver runs once
#: for every caller.
Call = tuple[Any, ...] | Detect | LoadScript
#: An exchange with Redis: yields commands, receives replies, returns its answer.
Exchange = Generator[Call, Any, T]

#: Limits checked, settled or leased together: (key, algorithm) pairs.
Limits = Sequence[tuple[str, Algorithm]]

#: Error codes that are an answer about the call, returned to the caller as :class:`Rejected`:
#: errors about the call itself, and refusals that asking again cannot fix and that failing open
#: would hide (the user may not run the command, is not authenticated, the server is full, the
#: address is a replica). Any other failure (I/O, timeouts, LOADING, CLUSTERDOWN, MASTERDOWN,
#: TRYAGAIN, BUSY...) means Redis could not decide.
REJECTED_CODES = frozenset({"ERR", "WRONGTYPE", "CROSSSLOT", "NOPERM", "NOAUTH", "WRONGPASS", "OOM", "READONLY"})


#: Commands without a key: on a cluster they go to any one node.
ANY_NODE = frozenset({"COMMAND INFO", "FUNCTION LIST"})

ON_A_CLUSTER = "each master counts its own denials: ask each through a client of its own (RL.TOP)"


class UnexpectedReply(Exception):
    """A reply of another shape than the command's: counted as Redis not deciding."""


def error_code(e: BaseException) -> str | None:
    """The code of an error reply (``ERR``, ``WRONGTYPE``, ``NOPERM``...), or ``None`` for an
    error that is no reply (I/O, timeout)."""
    if isinstance(e, RedisError):
        code = getattr(e, "status_code", None)
        if isinstance(code, str) and code:
            return code
        if isinstance(e, ResponseError):
            first = str(e).split(" ", 1)[0]
            if first and first.isupper():
                return first
    return None


def error_message(e: BaseException) -> str:
    """Redis's error as the server sent it, its code first."""
    code = getattr(e, "status_code", None)
    text = str(e)
    if isinstance(code, str) and code and not text.startswith(code):
        return f"{code} {text}" if text else code
    return text


def classify(e: BaseException) -> Rejected | None:
    """The :class:`Rejected` error for an answer about the call, ``None`` when Redis could not
    decide."""
    if isinstance(e, RedisClusterException) and "same key slot" in str(e):
        # redis-py's cluster client refuses keys of several slots before sending: Redis would
        # have answered CROSSSLOT.
        return Rejected(f"CROSSSLOT {e}")
    code = error_code(e)
    if code is not None and code in REJECTED_CODES:
        return Rejected(error_message(e))
    return None


_PREFIX = secrets.token_hex(8)
_COUNTER = itertools.count()
_COUNTER_LOCK = threading.Lock()


def new_lease_id() -> str:
    """A lease id unique to this call: a random per-process prefix, the process id, a counter."""
    with _COUNTER_LOCK:
        n = next(_COUNTER)
    return f"{_PREFIX}-{os.getpid():x}-{n:x}"


def _int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise UnexpectedReply(repr(v))
    return v


def _text(v: Any) -> str:
    if isinstance(v, bytes):
        return v.decode("utf-8", errors="replace")
    if isinstance(v, str):
        return v
    raise UnexpectedReply(repr(v))


_new = object.__new__
_set_allowed = vars(Decision)["allowed"].__set__
_set_remaining = vars(Decision)["remaining"].__set__
_set_retry = vars(Decision)["retry_after_ms"].__set__
_set_reset = vars(Decision)["reset_after_ms"].__set__
_set_limit = vars(Decision)["limit"].__set__
_set_decision = vars(Outcome)["decision"].__set__
_set_degraded = vars(Outcome)["degraded"].__set__
_set_mode = vars(Outcome)["mode"].__set__
_set_granted = vars(Outcome)["granted"].__set__
_set_locally = vars(Outcome)["answered_locally"].__set__


def take_outcome(v: Any, cost: int, mode: Mode) -> Outcome:
    """``Outcome(*parse_take(v, cost, False), ...)`` with ``mode``, for the reply as Redis sends
    it (the path of every check of one limit): its slots set directly, what the frozen
    dataclass's ``__init__`` does in half the time."""
    d = _plain_decision(v)
    if d is not None:
        granted = cost if d.allowed else 0
    else:
        d, granted = parse_take(v, cost, False)
    o: Outcome = _new(Outcome)
    _set_decision(o, d)
    _set_degraded(o, None)
    _set_mode(o, mode)
    _set_granted(o, granted)
    _set_locally(o, None)
    return o


def _plain_decision(v: Any) -> Decision | None:
    """The decision of a reply as Redis sends it (five plain integers), checked without a call
    per field and made with its slots set directly; None for any other shape, which the
    general parsing then reads or refuses."""
    if type(v) is list and len(v) == 5:
        allowed, remaining, retry, reset, limit = v
        if (
            type(allowed) is int
            and type(remaining) is int
            and type(retry) is int
            and type(reset) is int
            and type(limit) is int
            and remaining >= 0
            and reset >= 0
            and limit >= 0
        ):
            d: Decision = _new(Decision)
            _set_allowed(d, allowed == 1)
            _set_remaining(d, remaining)
            _set_retry(d, retry)
            _set_reset(d, reset)
            _set_limit(d, limit)
            return d
    return None


def parse_decision(v: Any) -> Decision:
    d = _plain_decision(v)
    if d is not None:
        return d
    if not isinstance(v, (list, tuple)) or len(v) != 5:
        raise UnexpectedReply(repr(v))
    allowed, remaining, retry, reset, limit = (_int(x) for x in v)
    if remaining < 0 or reset < 0 or limit < 0:
        raise UnexpectedReply(repr(v))
    return Decision(allowed == 1, remaining, retry, reset, limit)


def parse_take(v: Any, cost: int, upto: bool) -> tuple[Decision, int]:
    """A limiter's reply and the units it took: for a cost, the cost when admitted, else 0; for
    a partial grant (``UPTO n``), the reply's sixth integer."""
    if not upto:
        d = parse_decision(v)
        return d, cost if d.allowed else 0
    if not isinstance(v, (list, tuple)) or len(v) != 6:
        raise UnexpectedReply(repr(v))
    granted = _int(v[5])
    if granted < 0:
        raise UnexpectedReply(repr(v))
    return parse_decision(v[:5]), granted


#: ``RL.ALL``'s reply: allowed, denied_by, one decision per limit, the units granted.
Multi = tuple[bool, int, tuple[Decision, ...], int]


def parse_multi(v: Any, n: int, cost: int = 0, upto: bool = False) -> Multi:
    if not isinstance(v, (list, tuple)) or len(v) != n + 2:
        raise UnexpectedReply(repr(v))
    denied_by = _int(v[1])
    if denied_by < 0:
        raise UnexpectedReply(repr(v))
    allowed = _int(v[0]) == 1
    replies = [parse_take(d, cost, upto) for d in v[2:]]
    if upto:
        # The same in every inner reply of a partial grant.
        granted = replies[0][1] if replies else 0
    else:
        granted = cost if allowed else 0
    return allowed, denied_by, tuple(d for d, _ in replies), granted


def parse_decisions(v: Any, n: int) -> tuple[Decision, ...]:
    if not isinstance(v, (list, tuple)) or len(v) != n:
        raise UnexpectedReply(repr(v))
    return tuple(parse_decision(d) for d in v)


def parse_top(v: Any) -> list[TopEntry]:
    if not isinstance(v, (list, tuple)):
        raise UnexpectedReply(repr(v))
    entries = []
    for e in v:
        if not isinstance(e, (list, tuple)) or len(e) != 6:
            raise UnexpectedReply(repr(e))
        entries.append(TopEntry(_text(e[0]), _int(e[1]), _int(e[2]), _text(e[3]), _int(e[4]), _int(e[5])))
    return entries


#: Each algorithm's parameters as the commands take them, by identity: formatted once for as long
#: as the algorithm is in use rather than on every call (the algorithm is held, so that its id is
#: not reused meanwhile). Emptied when it grows past ``_PARAMS_KEPT``.
_PARAMS: dict[int, tuple[Algorithm, tuple[str, ...]]] = {}
_PARAMS_KEPT = 4096


def params_of(algo: Algorithm) -> tuple[str, ...]:
    """``algo.params()``, formatted once."""
    got = _PARAMS.get(id(algo))
    if got is not None and got[0] is algo:
        return got[1]
    params = tuple(algo.params())
    if len(_PARAMS) >= _PARAMS_KEPT:
        _PARAMS.clear()
    _PARAMS[id(algo)] = (algo, params)
    return params


#: ``str(n)`` of the costs most calls use.
_COSTS = tuple(str(n) for n in range(17))


def cost_arg(cost: int) -> str:
    return _COSTS[cost] if 0 <= cost < 17 else str(cost)


def limit_args(limits: Limits) -> list[str]:
    """``ALGORITHM params...`` of every limit, as ``RL.ALL`` and ``RL.SETTLE`` take them."""
    args: list[str] = []
    for _, algo in limits:
        args.append(algo.keyword)
        args.extend(params_of(algo))
    return args


class Durable:
    """The durable admissions of a client: ``WAIT replicas timeout`` (or ``WAITAOF 0 replicas
    timeout``) after an admission, on the connection that wrote it (``WAIT`` waits for the
    writes of the connection it is sent on), and what a short acknowledgement becomes."""

    def __init__(self, durability: Durability) -> None:
        self.durability = durability
        self._lock = threading.Lock()
        self._acknowledged = 0
        self._short = 0
        #: Set when the server answered that it has no ``WAITAOF``: ``WAIT`` from then on.
        self.no_waitaof = False

    def stats(self) -> DurabilityStats:
        with self._lock:
            return DurabilityStats(self._acknowledged, self._short)

    def acknowledged(self) -> Exchange[bool]:
        """``WAIT`` (``WAITAOF``) after the connection's write: whether the admission stands
        (enough replicas acknowledged it, or ``ShortAck.ADMIT``); ``False``: refuse it
        (``ShortAck.DENY``). ``ShortAck.FAILURE_POLICY`` raises: Redis did not decide."""
        d = self.durability
        ms = max(1, round(d.timeout * 1000))
        acks: int | None = None
        if d.aof and not self.no_waitaof:
            try:
                reply = yield ("WAITAOF", 0, d.replicas, ms)
                if not isinstance(reply, (list, tuple)) or len(reply) != 2:
                    raise UnexpectedReply(repr(reply))
                # [fsynced locally, replicas that fsynced]
                acks = _int(reply[1])
            except ResponseError as e:
                if "unknown command" not in str(e).lower():
                    raise
                # A server before WAITAOF: the write is still this connection's last, so WAIT
                # waits for it as well.
                self.no_waitaof = True
        if acks is None:
            acks = _int((yield ("WAIT", d.replicas, ms)))
        enough = acks >= d.replicas
        with self._lock:
            if enough:
                self._acknowledged += 1
            else:
                self._short += 1
        if enough or d.short is ShortAck.ADMIT:
            return True
        if d.short is ShortAck.FAILURE_POLICY:
            raise RedisConnectionError("fewer replicas acknowledged the write than asked")
        return False


def writes(cost: int, upto: bool, lease: str | None) -> bool:
    """Whether a call may write (a cost above 0, a partial grant, a lease): what a durable client
    waits for."""
    return cost > 0 or upto or lease is not None


class Core:
    """What a client keeps between calls and decides without Redis: the options, the mode once
    known, the breaker, the in-process buckets and semaphores of the ``Local`` policy."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.mode: Mode | None = {
            ModeChoice.AUTO: None,
            ModeChoice.MODULE: Mode.MODULE,
            ModeChoice.SCRIPT: Mode.SCRIPT,
            ModeChoice.FUNCTION: Mode.FUNCTION,
        }[options.mode]
        self.breaker = Breaker(options.breaker)
        self.local = LocalLimiter()
        self.leases = LocalLeases()
        #: When Redis last answered a round trip, and when a failure was last counted
        #: (``time.monotonic()``).
        self.answered = 0.0
        self._counted = 0.0
        self._failing = threading.Lock()
        #: The mode's detection, and each script's load after NOSCRIPT: once however many wait.
        self.detection = Flight()
        self.loads = {command: Flight() for command in SCRIPTS}

    def failed(self, since: float) -> None:
        """A call begun at ``since`` that Redis did not answer: a failure for the breaker unless
        Redis answered another call meanwhile (a server that answers is there; this call was
        late, the policy answered it), and once for all the calls in flight that the same
        silence failed (a failure counted since this call began)."""
        with self._failing:
            if self.answered >= since or self._counted >= since:
                return
            self._counted = time.monotonic()
        self.breaker.failure()

    def note_answer(self) -> None:
        self.answered = time.monotonic()

    # Exchanges with Redis ---------------------------------------------------------------------

    def resolve_mode(self) -> Exchange[Mode]:
        """The mode, detected first if unknown (once for all callers: :class:`Detect`)."""
        if self.mode is None:
            yield Detect(self.detection.generation)
        if self.mode is None:
            raise Failure
        return self.mode

    def detect(self) -> Exchange[Mode]:
        """``COMMAND INFO rl.all``, then ``FUNCTION LIST``: the mode, remembered."""
        info = yield ("COMMAND INFO", "rl.all")
        if not isinstance(info, (list, tuple)):
            raise UnexpectedReply(repr(info))
        if info and info[0] is not None:
            mode = Mode.MODULE
        elif (yield from self._has_library()):
            mode = Mode.FUNCTION
        else:
            mode = Mode.SCRIPT
        self.mode = mode
        return mode

    def _has_library(self) -> Exchange[bool]:
        """Whether the ``ratelimit`` Functions library is loaded. A server that refuses to say
        (an error reply, such as ``NOPERM`` for ``FUNCTION``) is taken to have none: the scripts
        decide alike."""
        try:
            listed = yield ("FUNCTION LIST", "LIBRARYNAME", LIBRARY_NAME)
        except RedisError as e:
            if error_code(e) is not None:
                return False
            raise
        if not isinstance(listed, (list, tuple)):
            raise UnexpectedReply(repr(listed))
        return len(listed) > 0

    def invoke(
        self, command: str, keys: Sequence[str], args: Sequence[Any], numkeys: bool
    ) -> Exchange[tuple[Any, Mode]]:
        """``command`` in the mode in use: the module's command (``numkeys`` first for the
        commands that take it), ``FCALL`` of the library, or ``EVALSHA`` of the script (on
        ``NOSCRIPT``, ``SCRIPT LOAD`` once for every caller that got it, then ``EVALSHA``
        again)."""
        mode = yield from self.resolve_mode()
        if mode is Mode.MODULE:
            head: list[Any] = [command, len(keys)] if numkeys else [command]
            reply = yield (*head, *keys, *args)
        elif mode is Mode.FUNCTION:
            reply = yield ("FCALL", function_name(command), len(keys), *keys, *args)
        else:
            script = SCRIPTS[command]
            flight = self.loads[command]
            seen = flight.generation
            try:
                reply = yield ("EVALSHA", script.sha, len(keys), *keys, *args)
            except NoScriptError:
                yield LoadScript(script, flight, seen)
                reply = yield ("EVALSHA", script.sha, len(keys), *keys, *args)
        return reply, mode

    def command_one(self, key: str, algo: Algorithm, cost: int) -> tuple[Any, ...] | None:
        """The one command of a check of one limit that is not a concurrency limit, when the
        mode is known and sends no script (the module, or the library): what
        :meth:`call_one` would send, without its exchange. ``None`` otherwise."""
        mode = self.mode
        if mode is Mode.MODULE:
            return (algo.command, key, *params_of(algo), cost_arg(cost))
        if mode is Mode.FUNCTION:
            return ("FCALL", function_name(algo.command), 1, key, *params_of(algo), cost_arg(cost))
        return None

    def call_one(
        self,
        key: str,
        algo: Algorithm,
        cost: int,
        lease: str | None,
        upto: bool = False,
        durable: Durable | None = None,
    ) -> Exchange[tuple[Decision, int, Mode]]:
        """One limit's command: the parameters, then the cost (``UPTO cost`` for a partial
        grant), or for a concurrency limit the lease id (``RL.ACQUIRE`` takes no cost). The
        decision, the units taken, the mode."""
        args = list(params_of(algo))
        if isinstance(algo, Concurrency) and lease is not None:
            args.append(lease)
        elif upto:
            args += ["UPTO", str(cost)]
        else:
            args.append(cost_arg(cost))
        reply, mode = yield from self.invoke(algo.command, [key], args, numkeys=False)
        if isinstance(algo, Concurrency) and lease is not None:
            d = parse_decision(reply)
            granted = int(d.allowed)
        else:
            d, granted = parse_take(reply, cost, upto)
        if durable is not None and d.allowed and not (yield from durable.acknowledged()):
            d, granted = self.refuse(d), 0
        return d, granted, mode

    def refuse(self, d: Decision) -> Decision:
        """An admission the replicas did not acknowledge, refused (``ShortAck.DENY``)."""
        return dataclasses.replace(d, allowed=False, retry_after_ms=self.options.fail_closed_retry_ms)

    def call_release(self, key: str, lease_id: str) -> Exchange[int]:
        reply, _ = yield from self.invoke("RL.RELEASE", [key], [lease_id], numkeys=False)
        return _int(reply)

    def call_all(
        self, limits: Limits, cost: int, lease: str | None, upto: bool = False, durable: Durable | None = None
    ) -> Exchange[tuple[Multi, Mode]]:
        args = limit_args(limits)
        if lease is not None:
            args += ["LEASE", lease]
        args += ["UPTO" if upto else "COST", str(cost)]
        keys = [k for k, _ in limits]
        reply, mode = yield from self.invoke("RL.ALL", keys, args, numkeys=True)
        m = parse_multi(reply, len(limits), cost, upto)
        if durable is not None and m[0] and not (yield from durable.acknowledged()):
            # Denied as by the first limit, every limit answering the same refusal.
            m = (False, 1, tuple(self.refuse(d) for d in m[2]), 0)
        return m, mode

    def call_settle(self, limits: Limits, delta: int) -> Exchange[tuple[tuple[Decision, ...], Mode]]:
        args = [*limit_args(limits), "DELTA", str(delta)]
        keys = [k for k, _ in limits]
        reply, mode = yield from self.invoke("RL.SETTLE", keys, args, numkeys=True)
        return parse_decisions(reply, len(limits)), mode

    def call_top(self, count: int | None) -> Exchange[list[TopEntry] | None]:
        """``RL.TOP count``, or ``RL.TOP RESET`` without a count; ``None`` when the mode in use
        is not the module."""
        mode = yield from self.resolve_mode()
        if mode is not Mode.MODULE:
            return None
        if count is None:
            yield ("RL.TOP", "RESET")
            return []
        return parse_top((yield ("RL.TOP", count)))

    # Answers without Redis --------------------------------------------------------------------

    def degraded_take(
        self, key: str, algo: Algorithm, cost: int, lease: str | None, upto: bool = False
    ) -> tuple[Decision, int, Degraded]:
        """The failure policy's answer and the units it took (for a partial grant of at most
        ``cost``: ``FailOpen`` grants them all, ``FailClosed`` none, ``Local`` what the
        in-process bucket has)."""
        o = self.options
        policy = o.policy
        if isinstance(policy, FailClosed):
            retry = o.fail_closed_retry_ms
            return Decision(False, 0, retry, retry, algo.quota), 0, Degraded.FAIL_CLOSED
        if isinstance(policy, Local):
            if isinstance(algo, Concurrency):
                d = self.leases.acquire(key, lease or "", algo, policy.instances, cost > 0)
                return d, int(d.allowed), Degraded.LOCAL
            if upto:
                d, granted = self.local.grant(key, algo, policy.instances, cost)
                return d, granted, Degraded.LOCAL
            d = self.local.check(key, algo, policy.instances, cost)
            return d, cost if d.allowed else 0, Degraded.LOCAL
        assert isinstance(policy, FailOpen)
        return Decision(True, algo.quota, 0, 0, algo.quota), cost, Degraded.FAIL_OPEN

    def degraded_one(self, key: str, algo: Algorithm, cost: int, lease: str | None) -> tuple[Decision, Degraded]:
        d, _, degraded = self.degraded_take(key, algo, cost, lease)
        return d, degraded

    def degraded_outcome(self, key: str, algo: Algorithm, cost: int, lease: str | None, upto: bool = False) -> Outcome:
        decision, granted, degraded = self.degraded_take(key, algo, cost, lease, upto)
        return Outcome(decision, degraded, None, granted)

    def degraded_all(self, limits: Limits, cost: int, lease: str | None, upto: bool = False) -> MultiOutcome:
        degraded = Degraded.FAIL_OPEN
        # Peek first so that a denial consumes from none of the limits.
        peeks: list[Decision] = []
        for k, a in limits:
            d, degraded = self.degraded_one(k, a, 0, lease)
            peeks.append(d)
        if upto and degraded is Degraded.LOCAL:
            # A partial grant takes what the fewest left allow, at most n (as RL.ALL ... UPTO n).
            cost = max(1, min(min((d.remaining for d in peeks), default=0), cost))
        denier: int | None = None
        for i, (d, (_, a)) in enumerate(zip(peeks, limits, strict=True)):
            if degraded is Degraded.FAIL_CLOSED:
                refuses = True
            elif isinstance(a, Concurrency):
                # One slot whatever the cost; none taken by a peek.
                refuses = cost > 0 and not d.allowed
            else:
                refuses = d.remaining < cost
            if refuses:
                denier = i
                break
        if denier is not None:
            decisions = list(peeks)
            k, a = limits[denier]
            decisions[denier] = self.degraded_one(k, a, cost, lease)[0]
        else:
            decisions = [self.degraded_one(k, a, cost, lease)[0] for k, a in limits]
        return MultiOutcome(
            allowed=denier is None,
            denied_by=0 if denier is None else denier + 1,
            decisions=tuple(decisions),
            degraded=degraded,
            mode=None,
            granted=cost if denier is None else 0,
        )

    def degraded_settlement(self, limits: Limits) -> Settlement:
        degraded = Degraded.FAIL_OPEN
        decisions = []
        for k, a in limits:
            d, degraded = self.degraded_one(k, a, 0, None)
            decisions.append(d)
        return Settlement(tuple(decisions), degraded, None)

    def local_settlement(self, limits: Limits, delta: int, instances: int) -> Settlement:
        return Settlement(
            tuple(self.local.adjust(k, a, instances, delta) for k, a in limits),
            Degraded.LOCAL,
            None,
        )

    def policy_settlement(self, limits: Limits, degraded: Degraded) -> Settlement:
        return Settlement(tuple(self.degraded_one(k, a, 0, None)[0] for k, a in limits), degraded, None)


def one_alone(limits: Limits, cost: int) -> bool:
    """Whether ``limits`` go through their own command rather than ``RL.ALL``: one limit alone,
    except a concurrency limit peeked at with cost 0, which only ``RL.ALL`` can do."""
    return len(limits) == 1 and (cost > 0 or not isinstance(limits[0][1], Concurrency))


def check_count(limits: Limits) -> None:
    if not 1 <= len(limits) <= 16:
        raise Unsupported("between 1 and 16 limits per call")


def multi_of(o: Outcome) -> MultiOutcome:
    return MultiOutcome(
        o.decision.allowed,
        0 if o.decision.allowed else 1,
        (o.decision,),
        o.degraded,
        o.mode,
        o.granted,
        o.answered_locally,
    )


def single_of(o: MultiOutcome) -> Outcome:
    """The answer for one limit, from an answer for exactly one."""
    return Outcome(o.decisions[0], o.degraded, o.mode, o.granted, o.answered_locally)


def signature(limits: Limits) -> str:
    """The identity of a call's limits: every key, algorithm and its parameters, in order (the
    deny cache's entries and the batches' table are keyed by it)."""
    return "".join(f"{len(k)}:{k} {a.keyword} {' '.join(params_of(a))}\n" for k, a in limits)


def check_upto_args(limits: Limits, n: int) -> None:
    """What a partial grant refuses before sending: a concurrency limit, ``n`` below 1."""
    if has_concurrency(limits):
        raise Unsupported("a concurrency limit is not granted in part (a lease is one slot)")
    if n < 1:
        raise Unsupported("UPTO n takes n of at least 1")


def has_concurrency(limits: Limits) -> bool:
    return any(isinstance(a, Concurrency) for _, a in limits)


def settle_delta(actual: int, estimate: int) -> int:
    return actual - estimate


def renewal_answer(answer: Outcome | None, o: Outcome) -> Outcome:
    """A renewal over several keys: the first denial, else the key with the fewest free slots."""
    if answer is None:
        return o
    if not answer.decision.allowed:
        return answer
    if o.decision.allowed and answer.decision.remaining <= o.decision.remaining:
        return answer
    return o


# The deny cache ----------------------------------------------------------------------------
# The deny cache: after Redis denied a call with ``retry_after_ms`` R, the same call (the same
# limits, keys, parameters and cost) is denied in the process until R has passed by the monotonic
# clock, without a call to Redis.
#
# It can only deny more than Redis would, never admit: what changes the key meanwhile (another
# process refunding, a limit raised, a window ending sooner by the server's clock than by this
# one) is seen at most R later. Entries are counted from the moment the denied call was sent, so
# an entry never outlives the server's own R. When it expires, one check asks Redis (a probe)
# while the others are still answered from it, for at most the client's timeout: a key denied
# again costs one call per R, not one per caller waiting at that moment.

V = TypeVar("V")


class Lru(Generic[V]):
    """At most ``capacity`` entries (at least 1), the least recently used evicted first. Not
    locked: its owner holds a lock around it."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(1, capacity)
        self._entries: OrderedDict[str, V] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> V | None:
        """The entry of ``key``, now the most recently used."""
        v = self._entries.get(key)
        if v is not None:
            self._entries.move_to_end(key)
        return v

    def insert(self, key: str, value: V) -> tuple[str, V] | None:
        """Inserts (or replaces) ``key``'s entry as the most recently used; the entry evicted to
        make room, if any."""
        if key in self._entries:
            self._entries[key] = value
            self._entries.move_to_end(key)
            return None
        evicted = self._entries.popitem(last=False) if len(self._entries) >= self.capacity else None
        self._entries[key] = value
        return evicted

    def remove(self, key: str) -> V | None:
        return self._entries.pop(key, None)

    def items(self) -> list[tuple[str, V]]:
        return list(self._entries.items())

    def clear(self) -> list[tuple[str, V]]:
        out = list(self._entries.items())
        self._entries.clear()
        return out


@dataclass(slots=True)
class _Denied:
    #: A check is asking Redis since the entry expired, until ``until`` (moved on by the timeout).
    probing: bool
    #: When the denied call was sent (``time.monotonic()``).
    sent: float
    until: float
    outcome: MultiOutcome


def _entry_key(sig: str, cost: int) -> str:
    """One entry per call: the limits' signature and the cost."""
    return f"{sig}cost {cost}"


class DenyCache:
    """A fixed number of denials, the least recently used evicted first."""

    def __init__(self, capacity: int, probe: float) -> None:
        self._entries: Lru[_Denied] = Lru(capacity)
        self._lock = threading.Lock()
        #: How long one probe may take (the client's timeout), in seconds.
        self._probe = probe

    @property
    def capacity(self) -> int:
        return self._entries.capacity

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def lookup(self, sig: str, cost: int) -> MultiOutcome | None:
        """The denial standing for ``sig`` at ``cost``, its waits counted down to now (at least 1
        ms). The first check after the entry expired gets ``None`` and asks Redis: the entry
        answers the others until that answer is recorded or the probe's time is up (then it is
        dropped)."""
        now = time.monotonic()
        key = _entry_key(sig, cost)
        with self._lock:
            d = self._entries.get(key)
            if d is None:
                return None
            if now >= d.until:
                if d.probing:
                    self._entries.remove(key)
                else:
                    d.probing = True
                    d.until = now + self._probe
                return None
            sent, outcome = d.sent, d.outcome
        # Whole milliseconds gone since the denial (rounded down): the waits are rounded up.
        gone = int((now - sent) * 1000)
        decisions = tuple(
            dataclasses.replace(
                x,
                retry_after_ms=max(1, x.retry_after_ms - gone) if x.retry_after_ms > 0 else x.retry_after_ms,
                reset_after_ms=max(0, x.reset_after_ms - gone),
            )
            for x in outcome.decisions
        )
        return dataclasses.replace(outcome, decisions=decisions, granted=0, answered_locally=LocalAnswer.DENY_CACHE)

    def record(self, sig: str, cost: int, o: MultiOutcome, sent: float) -> None:
        """Remembers a denial that Redis answered (not one of the failure policy, nor one answered
        locally) whose wait is known and above 0; ``sent`` is when its call was sent. An
        admission by Redis (a probe's answer) drops the entry if it leaves the cost; if it leaves
        less (the next check would be denied, its wait unknown), the next check probes again,
        the others still answered from the entry meanwhile."""
        if o.degraded is not None or o.answered_locally is not None:
            return
        key = _entry_key(sig, cost)
        if o.allowed:
            left = min((d.remaining for d in o.decisions), default=0)
            with self._lock:
                if left >= cost:
                    self._entries.remove(key)
                else:
                    entry = self._entries.get(key)
                    if entry is not None:
                        entry.probing = False
                        entry.until = time.monotonic()
            return
        i = max(o.denied_by, 1) - 1
        if i >= len(o.decisions):
            return
        wait = o.decisions[i].retry_after_ms
        if wait <= 0:
            return  # -1: never admitted at this cost; not cached
        with self._lock:
            self._entries.insert(key, _Denied(False, sent, sent + wait / 1000, o))

    def until(self, sig: str, cost: int) -> float | None:
        """When the entry of ``sig`` at ``cost`` expires (or its probe's time is up), if there
        is one (``time.monotonic()``)."""
        with self._lock:
            d = self._entries.get(_entry_key(sig, cost))
            return None if d is None else d.until


# Leased batches ----------------------------------------------------------------------------
# Leased batches for hot keys: one partial grant (``UPTO n``) takes several units of a key (or
# of every limit of an ``RL.ALL`` plan) at once, the process admits its requests from them without
# calling Redis, and what it did not use goes back with ``RL.SETTLE ... DELTA -n`` when the
# batch's lease ends, when the client is flushed or closed, or when the batch leaves the bounded
# table.
#
# Every request admitted from a batch spent a unit that Redis granted: a process never admits
# more than it was granted. What a batch holds is not available to other processes until it is
# used or given back; that is the most they can be refused beyond the exact answer
# (docs/clients.md states the bound).
#
# This part does no I/O: the synchronous and the asyncio client drive it (``client.py``,
# ``aio.py``), each with its own turns (a lock per entry), timers and returns.


@dataclass(slots=True)
class Batch:
    """The units of one grant still held."""

    #: When the grant was sent (``time.monotonic()``): its decisions were made then or after.
    sent: float
    ends: float
    granted: int
    held: int
    #: The grant's reply, one per limit.
    decisions: tuple[Decision, ...]
    mode: Mode | None


@dataclass(slots=True)
class Return:
    """What goes back to Redis from one batch."""

    limits: list[tuple[str, Algorithm]]
    batch: Batch


def upto_max(limits: Limits) -> int:
    """At most what one partial grant can take of these limits: 10^15, and 1,000 sliding-log
    entries in all."""
    logs = sum(1 for _, a in limits if isinstance(a, SlidingLog))
    return 1000 // logs if logs else 10**15


@dataclass(slots=True)
class Entry:
    limits: list[tuple[str, Algorithm]]
    declared: bool
    #: Calls counted per whole second since ``second``, and in the second before.
    second: float
    size: int
    #: The fewest units Redis said remain, with the latest answer (before any: the limit).
    remaining: int
    #: Where its generations start (apart from every other entry's).
    generation: int
    #: The entry's turn to refill (a lock of the driver's kind).
    gate: Any
    calls: int = 0
    previous: int = 0
    batch: Batch | None = None
    #: The latest batch was used up before its lease ended.
    used_up: bool = False
    #: The latest grant took less than it asked (or nothing, or Redis did not answer).
    short: bool = False
    #: Units of the callers waiting for a refill.
    waiting: int = 0

    def count_call(self, now: float) -> None:
        gone = now - self.second
        if gone >= 2:
            self.previous, self.calls, self.second = 0, 0, now
        elif gone >= 1:
            self.previous, self.calls = self.calls, 0
            self.second += 1
        self.calls += 1

    def hot(self, cfg: Batching) -> bool:
        return self.declared or (cfg.detect_per_sec > 0 and max(self.calls, self.previous) >= cfg.detect_per_sec)

    def worth_a_batch(self, cost: int, cfg: Batching) -> bool:
        """Whether a batch for ``cost`` would hold more than the cost: ``1/remaining_share`` of
        what Redis last said remains is above it."""
        return self.remaining // cfg.remaining_share > cost

    def expire(self, now: float, returns: list[Return]) -> None:
        if self.batch is not None and now >= self.batch.ends:
            self.give_back(returns)

    def give_back(self, returns: list[Return]) -> None:
        """Gives back what the batch holds now (B halves when it holds units)."""
        b, self.batch = self.batch, None
        if b is None:
            return
        self.generation += 1
        if b.held > 0:
            self.size = max(1, self.size // 2)
            self.used_up = False
            returns.append(Return(list(self.limits), b))

    def take(self, cost: int, now: float) -> MultiOutcome | None:
        """Admits ``cost`` from the batch if it holds that much and its lease is not over."""
        b = self.batch
        if b is None or now >= b.ends or b.held < cost:
            return None
        b.held -= cost
        if b.held == 0:
            self.used_up = True
        return answer(b, cost, now, LocalAnswer.BATCH)

    def ask(self, cost: int, cfg: Batching, most: int) -> int:
        """The size of the next grant: B (doubled if the last batch was used up), or what the
        callers waiting need if more, at most ``max_batch`` and ``1/remaining_share`` of what
        Redis last said remains, at least the cost."""
        if self.used_up:
            self.size = min(self.size * 2, cfg.max_batch)
            self.used_up = False
        want = max(self.size, cost + self.waiting)
        share = self.remaining // cfg.remaining_share
        return max(cost, min(want, cfg.max_batch, share, most))


def answer(b: Batch, cost: int, now: float, local: LocalAnswer | None) -> MultiOutcome:
    """The answer to a request admitted with ``cost`` units of batch ``b``, which now holds
    ``b.held``: each limit's remaining is what Redis said with the grant plus what the batch
    still holds; the resets count down from the grant."""
    gone = max(0, int((now - b.sent) * 1000))
    return MultiOutcome(
        allowed=True,
        denied_by=0,
        decisions=tuple(
            Decision(True, d.remaining + b.held, 0, max(0, d.reset_after_ms - gone), d.limit) for d in b.decisions
        ),
        degraded=None,
        mode=b.mode,
        granted=cost,
        answered_locally=local,
    )


def returnable(algo: Algorithm, d: Decision, b: Batch, now: float, margin: float) -> int:
    """The units of a batch that can go back to one limit at ``now`` without leaving it with more
    than it would have had if they had never been taken: none for a sliding window or log (a
    refund lowers the current window's count or removes the newest entries, which may not be
    the batch's); all for a fixed window while the window of the grant is surely still the
    current one; for a bucket or GCRA all, less what it may have refilled past its capacity
    meanwhile (which a refund would count twice)."""
    if isinstance(algo, (SlidingWindow, SlidingLog)):
        return 0
    if isinstance(algo, FixedWindow):
        return b.held if now + margin < b.sent + d.reset_after_ms / 1000 else 0
    age = max(0.0, now + margin - b.sent)
    refilled = algo.rate_per_sec * age
    # What the limit held before the grant is below remaining + 1 + granted.
    room = d.limit - d.remaining - b.granted - 1
    excess = math.ceil(max(0.0, refilled - max(0.0, float(room))))
    return 0 if excess >= b.held else b.held - excess


def return_plan(r: Return, now: float, margin: float) -> list[tuple[list[tuple[str, Algorithm]], int]]:
    """The ``RL.SETTLE`` calls that give back what ``r`` can: limits given back the same units
    go in one call, and one with 0 is left out."""
    deltas = [returnable(a, d, r.batch, now, margin) for (_, a), d in zip(r.limits, r.batch.decisions, strict=True)]
    return [([r.limits[i] for i, x in enumerate(deltas) if x == n], n) for n in sorted({x for x in deltas if x > 0})]


@dataclass(slots=True)
class Counters:
    refills: int = 0
    granted: int = 0
    used: int = 0
    answered: int = 0
    returned: int = 0
    lapsed: int = 0


ANSWER, REFILL, PLAIN = "answer", "refill", "plain"


@dataclass(slots=True)
class Granted:
    """What a grant decided: the answer for the request that asked (``None``: decide it with a
    call of its own), the units it was admitted with as a batch to give back should its caller
    be gone, the returns to send, and whether its denial goes to the deny cache."""

    answer: MultiOutcome | None
    own: Batch | None
    returns: list[Return]
    deny: MultiOutcome | None = None
    #: When the new batch's lease ends and its generation (``None``: no batch kept).
    timer: tuple[float, int] | None = None


@dataclass
class Table:
    """The batches of a client and its copies: a bounded table of keys (or plans), each with its
    detection counts and at most one batch."""

    cfg: Batching
    #: Makes an entry's turn (a ``threading.Lock``, an ``asyncio.Lock``).
    new_gate: Callable[[], Any]
    lock: threading.Lock = field(default_factory=threading.Lock)
    counters: Counters = field(default_factory=Counters)
    closed: bool = False
    _generations: int = 0
    entries: Lru[Entry] = field(init=False)

    def __post_init__(self) -> None:
        self.entries = Lru(self.cfg.max_keys)

    def stats(self) -> BatchStats:
        with self.lock:
            held = sum(e.batch.held for _, e in self.entries.items() if e.batch is not None)
            return BatchStats(**dataclasses.asdict(self.counters), held=held)

    def size(self, sig: str) -> int | None:
        with self.lock:
            e = self.entries.get(sig)
            return None if e is None else e.size

    def try_local(self, sig: str, limits: Limits, cost: int) -> tuple[str, MultiOutcome | None, list[Return]]:
        """Counts the call, and answers it from the batch when it can."""
        if self.closed or cost > upto_max(limits):
            return PLAIN, None, []
        now = time.monotonic()
        returns: list[Return] = []
        with self.lock:
            e = self.entries.get(sig)
            if e is None:
                self._generations += 1 << 32
                cfg = self.cfg
                e = Entry(
                    limits=list(limits),
                    declared=cfg.declared([k for k, _ in limits]),
                    second=now,
                    size=min(max(1, cfg.initial), max(1, cfg.max_batch)),
                    remaining=min((a.quota for _, a in limits), default=0),
                    generation=self._generations,
                    gate=self.new_gate(),
                )
                evicted = self.entries.insert(sig, e)
                if evicted is not None:
                    evicted[1].give_back(returns)
            e.count_call(now)
            e.expire(now, returns)
            o = e.take(cost, now)
            if o is not None:
                self.counters.used += cost
                self.counters.answered += 1
                return ANSWER, o, returns
            if e.hot(self.cfg) and e.worth_a_batch(cost, self.cfg):
                return REFILL, None, returns
            return PLAIN, None, returns

    def wait(self, sig: str, cost: int) -> tuple[Any, int] | None:
        """A caller that needs a refill: counted among those waiting; the entry's turn and its
        generation now."""
        with self.lock:
            e = self.entries.get(sig)
            if e is None:
                return None
            e.waiting += cost
            return e.gate, e.generation

    def waited(self, sig: str, cost: int) -> None:
        with self.lock:
            e = self.entries.get(sig)
            if e is not None:
                e.waiting = max(0, e.waiting - cost)

    def turn(
        self, sig: str, limits: Limits, cost: int, seen: int
    ) -> tuple[str, MultiOutcome | int | None, list[Return]]:
        """With the entry's turn: the answer from a batch that came meanwhile, a plain call
        (the refill that came first took less than it asked, the key runs low, batches are
        closed), or the size of the grant to ask (the old batch given back first)."""
        now = time.monotonic()
        returns: list[Return] = []
        with self.lock:
            e = self.entries.get(sig)
            if e is None:
                return PLAIN, None, returns
            e.expire(now, returns)
            o = e.take(cost, now)
            if o is not None:
                self.counters.used += cost
                self.counters.answered += 1
                return ANSWER, o, returns
            if (e.generation != seen and e.short) or not e.worth_a_batch(cost, self.cfg) or self.closed:
                return PLAIN, None, returns
            # Too little left for this cost: it goes back before the new grant.
            e.give_back(returns)
            return REFILL, e.ask(cost, self.cfg, upto_max(limits)), returns

    def granted(self, sig: str, limits: Limits, cost: int, ask: int, sent: float, reply: MultiOutcome) -> Granted:
        """Redis's grant of ``reply.granted`` units for the refill of ``sig`` sent at ``sent``."""
        g = reply.granted
        admitted = g >= cost
        ends = sent + self.cfg.lease
        for (_, a), d in zip(limits, reply.decisions, strict=True):
            if isinstance(a, FixedWindow):
                ends = min(ends, sent + d.reset_after_ms / 1000)
        batch = Batch(sent, ends, g, g - cost if admitted else g, reply.decisions, reply.mode)
        # Redis's own answer for this request: the grant's, less the units left in the batch.
        got = Granted(
            answer(batch, cost, sent, None) if admitted else None,
            dataclasses.replace(batch, held=cost) if admitted else None,
            [],
        )
        with self.lock:
            self.counters.refills += 1
            self.counters.granted += g
            e = self.entries.get(sig)
            if e is not None and not self.closed:
                e.generation += 1
                e.short = g < ask
                e.used_up = False
                e.remaining = min((d.remaining for d in reply.decisions), default=0)
                e.size = max(1, min(e.size, e.remaining // self.cfg.remaining_share))
                # Whatever another grant left (none while turns are kept) goes back.
                e.give_back(got.returns)
                if batch.held > 0:
                    e.batch = batch
                    got.timer = (batch.ends, e.generation)
                elif admitted:
                    e.used_up = True
            elif batch.held > 0:
                got.returns.append(Return(list(limits), batch))
            if admitted:
                self.counters.used += cost
        if not admitted:
            got.own = None
            if g == 0 and cost == 1:
                # Nothing left: the denial of one unit, exactly what a call with cost 1 answers.
                got.answer = reply
                got.deny = reply
        return got

    def unanswered(self, sig: str) -> None:
        """The refill's grant got no answer: the next callers decide with calls of their own."""
        with self.lock:
            self.counters.refills += 1
            e = self.entries.get(sig)
            if e is not None:
                e.generation += 1
                e.short = True

    def gone(self, cost: int) -> None:
        """The caller of a refill went away: the units it would have used go back."""
        with self.lock:
            self.counters.used -= cost

    def observe(self, sig: str, o: MultiOutcome) -> None:
        """What Redis answered a call of ``sig`` made without a batch: what remains, for the next
        batch's size."""
        if o.degraded is not None or o.answered_locally is not None or not o.decisions:
            return
        with self.lock:
            e = self.entries.get(sig)
            if e is not None:
                e.remaining = min(d.remaining for d in o.decisions)

    def expired(self, sig: str, generation: int) -> list[Return]:
        """The batch of ``sig`` at the end of its lease, unless another grant replaced it."""
        returns: list[Return] = []
        with self.lock:
            e = self.entries.get(sig)
            if e is not None and e.generation == generation:
                e.give_back(returns)
        return returns

    def drain(self) -> list[Return]:
        """Every batch, taken out of the table."""
        returns: list[Return] = []
        with self.lock:
            for _, e in self.entries.items():
                e.give_back(returns)
        return returns

    def account(self, r: Return, returned: int) -> None:
        with self.lock:
            self.counters.returned += returned
            self.counters.lapsed += r.batch.held - returned
