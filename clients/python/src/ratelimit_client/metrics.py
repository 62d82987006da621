"""Counters of the middleware's decisions per limit, in Prometheus's text format, and through
``prometheus_client`` when it is installed (:meth:`Metrics.register`)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

DECISIONS_HELP = (
    "Rate-limit decisions per limit: allowed, denied, degraded (made without Redis), and "
    "shadow_denied (a shadow limit would have refused; let through)."
)
SETTLED_HELP = "Units given back (refunded) or taken (charged) when reservations were settled with their actual cost."
BREAKER_HELP = (
    "Whether the client's circuit breaker is open: Redis failed repeatedly and the failure policy answers "
    "without asking it."
)


def breaker_text(is_open: bool) -> str:
    """The ``ratelimit_breaker_open`` gauge in Prometheus's text format: 1 while the client's
    circuit breaker is open, else 0."""
    return (
        f"# HELP ratelimit_breaker_open {BREAKER_HELP}\n"
        "# TYPE ratelimit_breaker_open gauge\n"
        f"ratelimit_breaker_open {1 if is_open else 0}\n"
    )


@dataclass(slots=True)
class Counts:
    allowed: int = 0
    denied: int = 0
    degraded: int = 0
    #: Requests a shadow limit would have refused (and let through).
    shadow_denied: int = 0
    #: Whether the limit has been evaluated as a shadow limit.
    shadow: bool = False
    #: Units given back by settlements (an actual cost below the estimate).
    refunded: int = 0
    #: Units taken by settlements (an actual cost above the estimate).
    charged: int = 0
    #: Admissions answered from a leased batch, without a call to Redis (among ``allowed``).
    batch: int = 0
    #: Denials answered by the deny cache, without a call to Redis (among ``denied``, or
    #: ``shadow_denied`` for a shadow limit).
    deny_cache: int = 0


def _escape(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class Metrics:
    """Thread-safe counters; share one between middlewares to count them together."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_limit: dict[str, Counts] = {}

    def _counts(self, limit: str) -> Counts:
        c = self._by_limit.get(limit)
        if c is None:
            c = self._by_limit[limit] = Counts()
        return c

    def record(self, limit: str, allowed: bool, degraded: bool, local: str | None = None) -> None:
        """An enforced limit's answer; ``local`` (``"batch"``, ``"deny_cache"``: the value of a
        ``LocalAnswer``) when it was made in the process, counted besides ``allowed`` or
        ``denied``."""
        with self._lock:
            c = self._counts(limit)
            if allowed:
                c.allowed += 1
            else:
                c.denied += 1
            if degraded:
                c.degraded += 1
            self._local(c, local)

    @staticmethod
    def _local(c: Counts, local: str | None) -> None:
        if local == "batch":
            c.batch += 1
        elif local == "deny_cache":
            c.deny_cache += 1

    def record_local(self, limit: str, answer: str) -> None:
        """An answer made in the process for ``limit`` (counted besides ``allowed`` or
        ``denied``)."""
        with self._lock:
            self._local(self._counts(limit), answer)

    def record_shadow(self, limit: str, allowed: bool, degraded: bool) -> None:
        """A shadow limit's answer: ``allowed`` counts as allowed, a denial as
        ``shadow_denied`` (the request went through), never as ``denied``."""
        with self._lock:
            c = self._counts(limit)
            c.shadow = True
            if allowed:
                c.allowed += 1
            else:
                c.shadow_denied += 1
            if degraded:
                c.degraded += 1

    def record_settled(self, limit: str, delta: int) -> None:
        """A settlement of ``delta`` units on ``limit``: below 0 refunded, above 0 charged."""
        with self._lock:
            c = self._counts(limit)
            if delta < 0:
                c.refunded += -delta
            else:
                c.charged += delta

    def counts(self, limit: str) -> Counts:
        with self._lock:
            c = self._by_limit.get(limit)
            return Counts() if c is None else Counts(**{f: getattr(c, f) for f in Counts.__slots__})

    def snapshot(self) -> dict[str, Counts]:
        """Every limit's counts, by name."""
        with self._lock:
            return {name: Counts(**{f: getattr(c, f) for f in Counts.__slots__}) for name, c in self._by_limit.items()}

    def render_prometheus(self) -> str:
        """``ratelimit_decisions_total{limit="...",outcome="allowed|denied|degraded"}`` (and
        ``outcome="shadow_denied"`` for a limit evaluated as a shadow limit, ``outcome="batch"``
        once a limit has had an admission answered from a batch, ``outcome="deny_cache"`` once it
        has had a denial answered by the deny cache), then, once a
        settlement changed something, ``ratelimit_settled_units_total{limit="...",
        direction="refunded|charged"}`` for the limits that settled; limits in byte order."""
        counts = sorted(self.snapshot().items())
        out = [
            f"# HELP ratelimit_decisions_total {DECISIONS_HELP}\n",
            "# TYPE ratelimit_decisions_total counter\n",
        ]
        for name, c in counts:
            n = _escape(name)
            for outcome, v in (("allowed", c.allowed), ("denied", c.denied), ("degraded", c.degraded)):
                out.append(f'ratelimit_decisions_total{{limit="{n}",outcome="{outcome}"}} {v}\n')
            if c.shadow:
                out.append(f'ratelimit_decisions_total{{limit="{n}",outcome="shadow_denied"}} {c.shadow_denied}\n')
            # Admissions and denials among those above that were answered in the process.
            for outcome, v in (("batch", c.batch), ("deny_cache", c.deny_cache)):
                if v > 0:
                    out.append(f'ratelimit_decisions_total{{limit="{n}",outcome="{outcome}"}} {v}\n')
        settled = [(name, c) for name, c in counts if c.refunded > 0 or c.charged > 0]
        if settled:
            out.append(f"# HELP ratelimit_settled_units_total {SETTLED_HELP}\n")
            out.append("# TYPE ratelimit_settled_units_total counter\n")
        for name, c in settled:
            n = _escape(name)
            for direction, v in (("refunded", c.refunded), ("charged", c.charged)):
                out.append(f'ratelimit_settled_units_total{{limit="{n}",direction="{direction}"}} {v}\n')
        return "".join(out)

    def register(self, registry: Any = None, breaker_open: Callable[[], bool] | None = None) -> Any:
        """Exposes these counters through ``prometheus_client`` (which must be installed): a
        collector registered in ``registry`` (default ``prometheus_client.REGISTRY``), read at
        every scrape; with ``breaker_open`` (a client's ``breaker_open``), the
        ``ratelimit_breaker_open`` gauge too. Returns the collector
        (``registry.unregister(collector)`` removes it)."""
        from prometheus_client import REGISTRY

        collector = _Collector(self, breaker_open)
        (REGISTRY if registry is None else registry).register(collector)
        return collector


class _Collector:
    """A ``prometheus_client`` collector of :class:`Metrics`."""

    def __init__(self, metrics: Metrics, breaker_open: Callable[[], bool] | None) -> None:
        self._metrics = metrics
        self._breaker_open = breaker_open

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily

        decisions = CounterMetricFamily("ratelimit_decisions", DECISIONS_HELP, labels=["limit", "outcome"])
        settled = CounterMetricFamily("ratelimit_settled_units", SETTLED_HELP, labels=["limit", "direction"])
        counts = sorted(self._metrics.snapshot().items())
        for name, c in counts:
            decisions.add_metric([name, "allowed"], c.allowed)
            decisions.add_metric([name, "denied"], c.denied)
            decisions.add_metric([name, "degraded"], c.degraded)
            if c.shadow:
                decisions.add_metric([name, "shadow_denied"], c.shadow_denied)
            for outcome, v in (("batch", c.batch), ("deny_cache", c.deny_cache)):
                if v > 0:
                    decisions.add_metric([name, outcome], v)
            if c.refunded > 0 or c.charged > 0:
                settled.add_metric([name, "refunded"], c.refunded)
                settled.add_metric([name, "charged"], c.charged)
        yield decisions
        yield settled
        if self._breaker_open is not None:
            from prometheus_client.core import GaugeMetricFamily

            yield GaugeMetricFamily("ratelimit_breaker_open", BREAKER_HELP, value=1 if self._breaker_open() else 0)
