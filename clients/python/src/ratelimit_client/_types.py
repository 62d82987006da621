"""What every part of the package shares: decisions and outcomes, the modes, the options and
failure policies, and the errors."""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Decision:
    """One limit's answer: the five fields every ``RL.*`` command replies."""

    allowed: bool
    #: Whole units left after this call.
    remaining: int
    #: 0 when allowed; when denied, milliseconds until this same cost would be admitted; -1 when
    #: it never can be (a cost above the limit).
    retry_after_ms: int
    #: Milliseconds until the limiter is back to its idle state.
    reset_after_ms: int
    #: The configured limit.
    limit: int


class Mode(enum.Enum):
    """How decisions are made on the server."""

    #: The module's ``RL.*`` commands.
    MODULE = "module"
    #: ``EVALSHA`` of the ``lua-reference/`` scripts shipped in the package (on ``NOSCRIPT``,
    #: one ``SCRIPT LOAD`` for every caller that got it, then ``EVALSHA`` again).
    SCRIPT = "script"
    #: ``FCALL`` of the ``ratelimit`` Functions library, loaded on the server beforehand
    #: (:func:`ratelimit_client.load_library`).
    FUNCTION = "function"


class ModeChoice(enum.Enum):
    """Which :class:`Mode` to use."""

    #: The module if ``COMMAND INFO rl.all`` knows it, else the Functions library if
    #: ``FUNCTION LIST`` has it, else the scripts; detected on the first call that reaches Redis.
    AUTO = "auto"
    MODULE = "module"
    SCRIPT = "script"
    FUNCTION = "function"


@dataclass(frozen=True, slots=True)
class FailOpen:
    """When Redis cannot answer: admit everything."""


@dataclass(frozen=True, slots=True)
class FailClosed:
    """When Redis cannot answer: deny everything (``retry_after_ms`` is
    :attr:`Options.fail_closed_retry_ms`)."""


@dataclass(frozen=True, slots=True)
class Local:
    """When Redis cannot answer: decide in process. A token bucket per key with the limit and
    the rate divided by ``instances`` (the processes expected to share the limit); for a
    concurrency limit, a counting semaphore per key with the limit divided alike and the same
    lease expiry."""

    instances: int = 1


#: What to answer when Redis cannot (timeout, connection error, breaker open, ``LOADING``,
#: ``CLUSTERDOWN``...).
FailurePolicy = FailOpen | FailClosed | Local


class LocalAnswer(enum.Enum):
    """Set on an outcome the client made without calling Redis. The value is the metrics'
    outcome label."""

    #: Admitted from units a partial grant took earlier for this key (a leased batch).
    BATCH = "batch"
    #: Denied again, within the ``retry_after_ms`` of an earlier denial of this key.
    DENY_CACHE = "deny_cache"


class Degraded(enum.Enum):
    """Set on an outcome that did not come from Redis: which failure policy made it. The value
    is the ``RateLimit-Degraded`` response field."""

    FAIL_OPEN = "fail-open"
    FAIL_CLOSED = "fail-closed"
    LOCAL = "local"


@dataclass(frozen=True, slots=True)
class BreakerConfig:
    """A circuit breaker: after ``failures`` consecutive failures calls skip Redis for
    ``cooldown`` seconds (the failure policy answers at once), then one trial call goes through."""

    failures: int = 3
    cooldown: float = 1.0


@dataclass(frozen=True, slots=True)
class Options:
    #: Budget of one call to Redis in seconds (the asyncio client bounds the whole call; the
    #: synchronous one each round trip; the start-up's steps, a connection opened, the mode
    #: detected, a script loaded, each round trip; see docs/python.md).
    timeout: float = 0.1
    policy: FailurePolicy = field(default_factory=FailOpen)
    breaker: BreakerConfig = field(default_factory=BreakerConfig)
    mode: ModeChoice = ModeChoice.AUTO
    #: ``retry_after_ms`` reported by :class:`FailClosed`.
    fail_closed_retry_ms: int = 1000
    #: At most this many calls on Redis at once (and no more than the pool's
    #: ``max_connections``); the others wait for their turn outside their deadline while Redis
    #: answers, rather than queue on the server inside it.
    max_in_flight: int = 64


@dataclass(frozen=True, slots=True)
class Batching:
    """When and how a client takes batches (:meth:`Client.with_batching`).

    A key (or a plan of several limits checked together) is batched when one of its keys is
    declared hot (``hot_keys``, ``hot_keys_where``), or when this process checks it at least
    ``detect_per_sec`` times in a second."""

    #: Keys batched from their first call (a plan of several limits when any of its keys is).
    hot_keys: Sequence[str] = ()
    #: Keys for which this is true are batched from their first call.
    hot_keys_where: Callable[[str], bool] | None = None
    #: Calls within one second (counted in whole seconds from a key's first call, the previous
    #: second's count included) that make a key hot; 0: only declared keys.
    detect_per_sec: int = 100
    #: How long a batch lives, in seconds: what it has not used by then goes back. A fixed
    #: window's batch ends with the window it was granted in, if that comes first.
    lease: float = 0.2
    #: The first batch size.
    initial: int = 8
    #: The largest batch.
    max_batch: int = 1024
    #: A batch asks for at most ``1/remaining_share`` of what Redis last said remains, so a
    #: nearly exhausted key is decided one call per request.
    remaining_share: int = 8
    #: Keys (or plans) tracked at once, the least recently used forgotten first, its batch
    #: given back.
    max_keys: int = 1024

    def declared(self, keys: Sequence[str]) -> bool:
        """Whether any of ``keys`` is declared hot."""
        hot = set(self.hot_keys)
        return any(k in hot or (self.hot_keys_where is not None and self.hot_keys_where(k)) for k in keys)


@dataclass(frozen=True, slots=True)
class BatchStats:
    """What the batches of a client did since it was made (units, and requests answered)."""

    #: Partial grants sent to take a batch.
    refills: int = 0
    #: Units those grants took.
    granted: int = 0
    #: Units spent by admitted requests: the requests that took a batch and those answered from
    #: one.
    used: int = 0
    #: Requests admitted from a batch without a call to Redis.
    answered: int = 0
    #: Units given back to Redis (``RL.SETTLE ... DELTA -n``).
    returned: int = 0
    #: Units neither used nor given back: a sliding window's or log's, a window's that ended, a
    #: bucket's that refilled meanwhile, or a return Redis did not answer.
    lapsed: int = 0
    #: Units held in batches now.
    held: int = 0


class ShortAck(enum.Enum):
    """What a durable client does with an admission fewer replicas acknowledged than it asked."""

    #: Deny it (the units stay spent on the master: under-admission, never over).
    DENY = "deny"
    #: Admit it, and count it in :attr:`DurabilityStats.short`.
    ADMIT = "admit"
    #: Answer it with the failure policy, as if Redis had not answered.
    FAILURE_POLICY = "failure-policy"


@dataclass(frozen=True, slots=True)
class Durability:
    """Admissions that replicas must acknowledge (:meth:`Client.with_durability`)."""

    #: Replicas that must acknowledge the write.
    replicas: int
    #: How long ``WAIT`` waits for them, in seconds (below the client's own timeout, which
    #: bounds the call and the ``WAIT`` together).
    timeout: float
    #: What an admission that fewer replicas acknowledged becomes.
    short: ShortAck = ShortAck.DENY
    #: Whether the replicas must have the write in their append-only file too (``WAITAOF 0
    #: replicas timeout``: fsynced, so a replica that restarts keeps it), not only in memory.
    #: Replicas without ``appendonly yes`` never acknowledge it. A server without ``WAITAOF``
    #: (before Redis 7.2) gets ``WAIT``.
    aof: bool = False


@dataclass(frozen=True, slots=True)
class DurabilityStats:
    """What a durable client's admissions met so far."""

    #: Admissions acknowledged by enough replicas.
    acknowledged: int = 0
    #: Admissions fewer replicas acknowledged in time (then answered as :class:`ShortAck` says).
    short: int = 0


@dataclass(frozen=True, slots=True)
class Outcome:
    """The answer for one limit."""

    decision: Decision
    #: Set when Redis was not asked or did not answer in time.
    degraded: Degraded | None
    #: The mode that answered (``None`` when degraded; for a local answer, the mode of the call
    #: it comes from).
    mode: Mode | None
    #: The units taken: the cost when admitted and 0 when denied; for a partial grant
    #: (:meth:`Client.check_upto`) the units granted, 1 to ``n``. An answer of ``FailOpen``
    #: grants what was asked (nothing is taken anywhere).
    granted: int = 0
    #: Set when the client answered from a batch or its deny cache, without calling Redis.
    answered_locally: LocalAnswer | None = None

    @property
    def allowed(self) -> bool:
        return self.decision.allowed


@dataclass(frozen=True, slots=True)
class MultiOutcome:
    """The answer for several limits checked at once (``RL.ALL``)."""

    allowed: bool
    #: 1-based position of the first limit that denied, 0 when allowed.
    denied_by: int
    decisions: tuple[Decision, ...]
    degraded: Degraded | None
    mode: Mode | None
    #: The units taken from every limit (see :attr:`Outcome.granted`).
    granted: int = 0
    #: Set when the client answered from a batch or its deny cache, without calling Redis.
    answered_locally: LocalAnswer | None = None


@dataclass(frozen=True, slots=True)
class Settlement:
    """Every limit's state after a settlement (``RL.SETTLE``), in the order of the limits."""

    #: One per limit: ``allowed`` true, ``retry_after_ms`` 0, ``remaining`` 0 while in debt.
    decisions: tuple[Decision, ...]
    #: Set when Redis was not asked or did not answer: the decisions are the failure policy's.
    degraded: Degraded | None
    mode: Mode | None


@dataclass(frozen=True, slots=True)
class TopEntry:
    """One of the keys with the most denials on a server (``RL.TOP``)."""

    #: The key (bytes that are not UTF-8 replaced by U+FFFD).
    key: str
    #: Denials counted for the key: at least ``denied - error``, at most ``denied``.
    denied: int
    #: The most by which ``denied`` may overcount.
    error: int
    #: The command of the latest denial (``RL.TOKENBUCKET``, ``RL.ALL``).
    command: str
    #: When the key's slot was taken, and its latest denial (Unix milliseconds, module clock).
    first_denied_ms: int
    last_denied_ms: int


class RateLimitError(Exception):
    """Base of the errors the clients raise."""


class Rejected(RateLimitError):
    """Redis answered with an error about the call itself (bad parameters, ``WRONGTYPE``,
    ``CROSSSLOT``), or a refusal that asking again cannot fix and that failing open would hide
    (``NOPERM``, ``NOAUTH``/``WRONGPASS``, ``OOM``, ``READONLY``). Never answered by the failure
    policy. ``message`` is Redis's error, its code first."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return f"rejected by redis: {self.message}"


class Unsupported(RateLimitError):
    """The call cannot be made: the combination cannot be checked in one call, or the mode
    cannot answer it (``RL.TOP`` without the module)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return f"unsupported: {self.message}"


class Unavailable(RateLimitError):
    """Redis did not answer, for a call that has no failure policy (:meth:`Client.top`)."""

    def __str__(self) -> str:
        return "redis did not answer"
