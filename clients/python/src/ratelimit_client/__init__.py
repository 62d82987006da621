"""Client of the redis-rate-limiter module for Python: a synchronous client (:class:`Client`, on
redis-py) and an asyncio one (:class:`AsyncClient`) of the same shape, with ASGI and WSGI
middleware (:mod:`ratelimit_client.asgi`, :mod:`ratelimit_client.wsgi`) and a decorator for a
single view or function (:func:`ratelimit_client.decorators.limit`).

When the module is loaded the clients call its ``RL.*`` commands; when it is not but the
Functions library ``ratelimit`` is, its functions (``FCALL``); otherwise the ``lua-reference/``
scripts shipped in the package (``EVALSHA``, loaded again on ``NOSCRIPT``). Every mode gives the
same decisions and stores the same bytes.
"""

from ._scripts import LIBRARY, LIBRARY_NAME
from ._types import (
    Batching,
    BatchStats,
    BreakerConfig,
    Decision,
    Degraded,
    Durability,
    DurabilityStats,
    FailClosed,
    FailOpen,
    FailurePolicy,
    Local,
    LocalAnswer,
    Mode,
    ModeChoice,
    MultiOutcome,
    Options,
    Outcome,
    RateLimitError,
    Rejected,
    Settlement,
    ShortAck,
    TopEntry,
    Unavailable,
    Unsupported,
)
from .aio import (
    AsyncClient,
    AsyncLease,
    AsyncLeaseOutcome,
    AsyncLimiter,
    AsyncMultiLeaseOutcome,
    AsyncMultiReservationOutcome,
    AsyncReservation,
    AsyncReservationOutcome,
)
from .algorithms import (
    Algorithm,
    Concurrency,
    FixedWindow,
    Gcra,
    LeakyBucket,
    SlidingLog,
    SlidingWindow,
    TokenBucket,
)
from .client import (
    Client,
    Lease,
    LeaseOutcome,
    Limiter,
    MultiLeaseOutcome,
    MultiReservationOutcome,
    Reservation,
    ReservationOutcome,
    load_library,
)

__version__ = "0.1.0"

__all__ = [
    "LIBRARY",
    "LIBRARY_NAME",
    "Algorithm",
    "AsyncClient",
    "AsyncLease",
    "AsyncLeaseOutcome",
    "AsyncLimiter",
    "AsyncMultiLeaseOutcome",
    "AsyncMultiReservationOutcome",
    "AsyncReservation",
    "AsyncReservationOutcome",
    "BatchStats",
    "Batching",
    "BreakerConfig",
    "Client",
    "Concurrency",
    "Decision",
    "Degraded",
    "Durability",
    "DurabilityStats",
    "FailClosed",
    "FailOpen",
    "FailurePolicy",
    "FixedWindow",
    "Gcra",
    "LeakyBucket",
    "Lease",
    "LeaseOutcome",
    "Limiter",
    "Local",
    "LocalAnswer",
    "Mode",
    "ModeChoice",
    "MultiLeaseOutcome",
    "MultiOutcome",
    "MultiReservationOutcome",
    "Options",
    "Outcome",
    "RateLimitError",
    "Rejected",
    "Reservation",
    "ReservationOutcome",
    "Settlement",
    "ShortAck",
    "SlidingLog",
    "SlidingWindow",
    "TokenBucket",
    "TopEntry",
    "Unavailable",
    "Unsupported",
    "load_library",
]
