"""The algorithms of the module and their parameters, as its commands take them."""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal
from typing import ClassVar


def num(value: float) -> str:
    """A number in plain decimal notation, the shortest that reads back as the same double and
    without an exponent (``0.0000001``, ``2.5``, ``60``), as the module's grammar takes it and
    as the other clients send it."""
    if isinstance(value, bool):
        raise TypeError("a number, not a bool")
    if isinstance(value, int):
        return str(value)
    if not math.isfinite(value):
        return repr(value)
    text = format(Decimal(repr(value)), "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


class Algorithm:
    """One algorithm with its parameters (the base of :class:`TokenBucket`, :class:`LeakyBucket`,
    :class:`FixedWindow`, :class:`SlidingWindow`, :class:`SlidingLog`, :class:`Gcra` and
    :class:`Concurrency`)."""

    #: The command (``RL.TOKENBUCKET``).
    command: ClassVar[str]

    @property
    def keyword(self) -> str:
        """The keyword inside ``RL.ALL`` and ``RL.SETTLE`` (``TOKENBUCKET``, ``CONCURRENCY``)."""
        return self.command[3:]

    def params(self) -> list[str]:
        """The parameters after the key, without the cost (or the lease id)."""
        raise NotImplementedError

    @property
    def quota(self) -> int:
        """The limit the commands report (their fifth field)."""
        raise NotImplementedError

    @property
    def rate_per_sec(self) -> float:
        """The sustained rate in units per second."""
        raise NotImplementedError

    def _window(self) -> float:
        return self.quota / self.rate_per_sec

    @property
    def window_secs(self) -> int:
        """The policy's window in whole seconds (rounded up, at least 1): the window for the
        window algorithms, the lease for a concurrency limit, the time to go from empty to full
        for the others (the ``w`` of ``RateLimit-Policy``)."""
        return max(1, math.ceil(self._window()))


@dataclass(frozen=True, slots=True)
class TokenBucket(Algorithm):
    """``RL.TOKENBUCKET key capacity refill_per_sec``: bursts up to ``capacity``, refilled
    continuously."""

    capacity: int
    refill_per_sec: float
    command: ClassVar[str] = "RL.TOKENBUCKET"

    def params(self) -> list[str]:
        return [str(self.capacity), num(self.refill_per_sec)]

    @property
    def quota(self) -> int:
        return self.capacity

    @property
    def rate_per_sec(self) -> float:
        return float(self.refill_per_sec)


@dataclass(frozen=True, slots=True)
class LeakyBucket(Algorithm):
    """``RL.LEAKYBUCKET key capacity leak_per_sec``: a queue of ``capacity`` draining at a steady
    rate."""

    capacity: int
    leak_per_sec: float
    command: ClassVar[str] = "RL.LEAKYBUCKET"

    def params(self) -> list[str]:
        return [str(self.capacity), num(self.leak_per_sec)]

    @property
    def quota(self) -> int:
        return self.capacity

    @property
    def rate_per_sec(self) -> float:
        return float(self.leak_per_sec)


class _Windowed(Algorithm):
    limit: int
    window_sec: float

    def params(self) -> list[str]:
        return [str(self.limit), num(self.window_sec)]

    @property
    def quota(self) -> int:
        return self.limit

    @property
    def rate_per_sec(self) -> float:
        return self.limit / self.window_sec

    def _window(self) -> float:
        return float(self.window_sec)


@dataclass(frozen=True, slots=True)
class FixedWindow(_Windowed):
    """``RL.FIXEDWINDOW key limit window_sec``: ``limit`` per window, opened by the first call."""

    limit: int
    window_sec: float
    command: ClassVar[str] = "RL.FIXEDWINDOW"


@dataclass(frozen=True, slots=True)
class SlidingWindow(_Windowed):
    """``RL.SLIDINGWINDOW key limit window_sec``: ``limit`` per rolling window, weighted from the
    previous one."""

    limit: int
    window_sec: float
    command: ClassVar[str] = "RL.SLIDINGWINDOW"


@dataclass(frozen=True, slots=True)
class SlidingLog(_Windowed):
    """``RL.SLIDINGLOG key limit window_sec``: exactly ``limit`` in any window."""

    limit: int
    window_sec: float
    command: ClassVar[str] = "RL.SLIDINGLOG"


@dataclass(frozen=True, slots=True)
class Gcra(Algorithm):
    """``RL.GCRA key max_burst count_per_period period_sec``: ``max_burst + 1`` at once, then
    evenly spaced."""

    max_burst: int
    count_per_period: int
    period_sec: float
    command: ClassVar[str] = "RL.GCRA"

    def params(self) -> list[str]:
        return [str(self.max_burst), str(self.count_per_period), num(self.period_sec)]

    @property
    def quota(self) -> int:
        return self.max_burst + 1

    @property
    def rate_per_sec(self) -> float:
        return self.count_per_period / self.period_sec


@dataclass(frozen=True, slots=True)
class Concurrency(Algorithm):
    """At most ``limit`` leases held at once on a key, each for ``lease_sec`` seconds unless
    renewed or released first (``RL.ACQUIRE key limit lease_sec lease_id``; ``CONCURRENCY limit
    lease_sec`` inside ``RL.ALL``, where it takes one slot whatever the cost)."""

    limit: int
    lease_sec: float
    command: ClassVar[str] = "RL.ACQUIRE"

    @property
    def keyword(self) -> str:
        return "CONCURRENCY"

    def params(self) -> list[str]:
        return [str(self.limit), num(self.lease_sec)]

    @property
    def quota(self) -> int:
        return self.limit

    @property
    def rate_per_sec(self) -> float:
        return self.limit / self.lease_sec

    def _window(self) -> float:
        return float(self.lease_sec)


#: Every algorithm's class, in the module's order.
ALGORITHMS: tuple[type[Algorithm], ...] = (
    TokenBucket,
    LeakyBucket,
    FixedWindow,
    SlidingWindow,
    SlidingLog,
    Gcra,
    Concurrency,
)
