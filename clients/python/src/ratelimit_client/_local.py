"""The in-process fallback of the ``Local`` policy, used while Redis cannot answer: a token bucket
per key with the limit and rate divided by the expected number of instances (settled
reservations give tokens back or take more, into debt if need be), and for concurrency limits a
counting semaphore per key (the limit divided alike) whose leases expire as on Redis."""

from __future__ import annotations

import math
import threading
import time

from ._types import Decision
from .algorithms import Algorithm, Concurrency

MAX_KEYS = 100_000


def _ms_until(t_ns: int, now_ns: int) -> int:
    """Whole milliseconds from ``now_ns`` to ``t_ns`` (rounded up, 0 if past), from whole
    microseconds."""
    us = max(0, t_ns - now_ns) // 1000
    return -(-us // 1000)


class LocalLimiter:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        # key -> (tokens, monotonic ns of the last write)
        self._buckets: dict[str, tuple[float, int]] = {}

    @staticmethod
    def share(algo: Algorithm, instances: int) -> tuple[int, float]:
        """Capacity and rate of the local share of ``algo`` for ``instances`` instances."""
        n = max(1, instances)
        return max(1, algo.quota // n), algo.rate_per_sec / n

    def check(self, key: str, algo: Algorithm, instances: int, cost: int) -> Decision:
        capacity, rate = self.share(algo, instances)
        cap = float(capacity)
        now = time.monotonic_ns()
        with self._lock:
            if len(self._buckets) >= MAX_KEYS and key not in self._buckets:
                self._buckets = {
                    k: (t, ts) for k, (t, ts) in self._buckets.items() if t + (now - ts) / 1e9 * rate < cap
                }
            entry = self._buckets.setdefault(key, (cap, now))
            tokens = min(cap, entry[0] + (now - entry[1]) / 1e9 * rate)
            c = float(cost)
            allowed = c <= tokens
            if allowed and cost > 0:
                left = tokens - c
                self._buckets[key] = (left, now)
            else:
                left = tokens
        if allowed:
            retry = 0
        elif cost > capacity:
            retry = -1
        else:
            retry = math.ceil((c - tokens) * 1000.0 / rate)
        return Decision(
            allowed=allowed,
            remaining=max(0, math.floor(left)),
            retry_after_ms=retry,
            reset_after_ms=math.ceil((cap - left) * 1000.0 / rate),
            limit=capacity,
        )

    def grant(self, key: str, algo: Algorithm, instances: int, n: int) -> tuple[Decision, int]:
        """A partial grant from the in-process bucket: what it has left (whole units), at most
        ``n``; nothing left is the denial of one unit."""
        left = self.check(key, algo, instances, 0).remaining
        g = max(1, min(left, n))
        d = self.check(key, algo, instances, g)
        return d, g if d.allowed else 0

    def adjust(self, key: str, algo: Algorithm, instances: int, delta: int) -> Decision:
        """Gives back ``-delta`` tokens (never above the capacity) or takes ``delta`` more, below
        zero if need be, down to minus the capacity (as the module's token bucket)."""
        capacity, rate = self.share(algo, instances)
        cap = float(capacity)
        now = time.monotonic_ns()
        with self._lock:
            entry = self._buckets.setdefault(key, (cap, now))
            tokens = min(cap, entry[0] + (now - entry[1]) / 1e9 * rate)
            left = min(cap, max(-cap, tokens - float(delta)))
            if delta != 0:
                self._buckets[key] = (left, now)
        return Decision(
            allowed=True,
            remaining=math.floor(max(0.0, left)),
            retry_after_ms=0,
            reset_after_ms=math.ceil((cap - left) * 1000.0 / rate),
            limit=capacity,
        )


class LocalLeases:
    """Live leases per key: lease id -> expiry (monotonic ns)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._keys: dict[str, dict[str, int]] = {}

    @staticmethod
    def share(limit: Concurrency, instances: int) -> int:
        return max(1, limit.limit // max(1, instances))

    def acquire(self, key: str, lease_id: str, limit: Concurrency, instances: int, take: bool) -> Decision:
        """Takes (or renews) a slot of ``key`` for ``lease_id``; with ``take`` false only says
        whether it would."""
        share = self.share(limit, instances)
        lease_ns = max(0, round(limit.lease_sec * 1e9))
        now = time.monotonic_ns()
        with self._lock:
            if len(self._keys) >= MAX_KEYS and key not in self._keys:
                self._keys = {k: v for k, v in self._keys.items() if any(t > now for t in v.values())}
            leases = {i: t for i, t in self._keys.get(key, {}).items() if t > now}
            held = lease_id in leases
            allowed = held or len(leases) < share
            if allowed and take:
                leases[lease_id] = now + lease_ns
            expiries = sorted(leases.values())
            if leases:
                self._keys[key] = leases
            else:
                self._keys.pop(key, None)
        live = len(expiries)
        if allowed:
            retry = 0
        else:
            # The slot frees when live - share + 1 leases have expired.
            i = live - share
            retry = _ms_until(expiries[i], now) if i < len(expiries) else 0
        return Decision(
            allowed=allowed,
            remaining=max(0, share - live),
            retry_after_ms=retry,
            reset_after_ms=_ms_until(expiries[-1], now) if expiries else 0,
            limit=share,
        )

    def release(self, key: str, lease_id: str) -> bool:
        """Frees ``lease_id``'s slot of ``key``; whether it held a live one."""
        now = time.monotonic_ns()
        with self._lock:
            leases = self._keys.get(key)
            if leases is None:
                return False
            expiry = leases.pop(lease_id, None)
            live = expiry is not None and expiry > now
            leases = {i: t for i, t in leases.items() if t > now}
            if leases:
                self._keys[key] = leases
            else:
                self._keys.pop(key, None)
            return live
