"""A circuit breaker: after ``failures`` consecutive failures the breaker opens and calls skip
Redis for ``cooldown`` seconds; then one trial call goes through (half open): success closes it,
failure opens it again."""

from __future__ import annotations

import threading
import time

from ._types import BreakerConfig


class Breaker:
    def __init__(self, config: BreakerConfig) -> None:
        self._config = config
        self._lock = threading.Lock()
        # ("closed", failures) | ("open", until) | ("half-open", 0)
        self._state = "closed"
        self._failures = 0
        self._until = 0.0

    def permit(self) -> bool:
        """Whether this call may go to Redis."""
        if self._state == "closed":
            # Read without the lock: a call that sees it closed just as it opens is a call that
            # came a moment earlier.
            return True
        with self._lock:
            if self._state == "closed":
                return True
            if self._state == "open" and time.monotonic() >= self._until:
                self._state = "half-open"
                return True
            return False

    def success(self) -> None:
        if self._state == "closed" and self._failures == 0:
            return  # nothing to reset: no lock taken on the path of every call
        with self._lock:
            self._state = "closed"
            self._failures = 0

    def failure(self) -> None:
        with self._lock:
            if self._state == "closed" and self._failures + 1 < max(1, self._config.failures):
                self._failures += 1
                return
            self._state = "open"
            self._failures = 0
            self._until = time.monotonic() + self._config.cooldown

    def is_open(self) -> bool:
        """Whether the breaker is open or half open."""
        return self._state != "closed"
