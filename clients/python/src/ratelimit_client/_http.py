"""What the ASGI and WSGI middleware and the decorator share: the rules (keys, plans, route
classes, limits, estimates), the response fields and problem bodies, and the flow of a request
(decide, shadow policies, settle), written once as a generator of operations that a synchronous
or an asyncio driver carries out with its client."""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import re
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from ._core import Limits, has_concurrency
from ._types import Decision, Degraded, MultiOutcome, RateLimitError, Settlement
from .algorithms import Algorithm, Concurrency, FixedWindow
from .metrics import Metrics

if TYPE_CHECKING:
    from .aio import AsyncClient
    from .client import Client

_V = TypeVar("_V")


@dataclass(frozen=True, slots=True)
class Policy:
    """A named limit of a route."""

    name: str
    algorithm: Algorithm
    #: Evaluated and reported, never denying (see :meth:`as_shadow`).
    shadow: bool = False

    def as_shadow(self) -> Policy:
        """This policy in shadow mode, for rolling a new limit out: evaluated in a call of its own
        on the requests that the route's enforced limits admit, consuming as it would if it were
        enforced, shown in the ``RateLimit`` fields and counted (``outcome="shadow_denied"``),
        but never refusing a request; the enforced limits decide and consume exactly as if it
        were not there."""
        return dataclasses.replace(self, shadow=True)


# Rates written as text -----------------------------------------------------------------------

#: Seconds in each unit of a rate (a month is 30 days and a year 12 such months, as the
#: ``limits`` library counts them).
UNITS = {"second": 1, "minute": 60, "hour": 3600, "day": 86400, "month": 30 * 86400, "year": 12 * 30 * 86400}
_ONE_RATE = r"\s*([0-9]+)\s*(?:/|\s+per\s+)\s*([0-9]+)?\s*(second|minute|hour|day|month|year)s?\s*"
_RATE = re.compile(_ONE_RATE, re.IGNORECASE)
_SEPARATORS = re.compile(r"[,;|]")


def parse_rates(text: str) -> list[Policy]:
    """The limits of a rate string as Flask-Limiter, slowapi and ``limits`` read them: one rate or
    several separated by ``;``, ``,`` or ``|`` (``"5/minute;100/hour"``), each an amount, ``/`` or
    ``per``, an optional multiple and a unit (``second``, ``minute``, ``hour``, ``day``, ``month``
    of 30 days, ``year`` of 12 such months; singular or plural, any case): ``"10 per second"``,
    ``"1/2 seconds"``. Each is a :class:`~ratelimit_client.FixedWindow` of that amount per that
    many seconds (``"5/minute"`` is ``FixedWindow(5, 60)``), named by its text. Anything else,
    an amount of 0 and the same rate twice are refused (``ValueError``)."""
    if not isinstance(text, str):
        raise TypeError(f"a rate string such as '5/minute', not {text!r}")
    out: list[Policy] = []
    for part in _SEPARATORS.split(text):
        m = _RATE.fullmatch(part)
        if m is None:
            raise ValueError(
                f"not a rate: {part.strip()!r} in {text!r} (expected such as '5/minute', '100 per hour', "
                "'1/2 seconds' or '5/minute;100/hour')"
            )
        amount, every, unit = int(m.group(1)), int(m.group(2) or 1), m.group(3).lower()
        if amount == 0 or every == 0:
            raise ValueError(f"not a rate: {part.strip()!r} in {text!r} (an amount and a multiple of at least 1)")
        out.append(Policy(" ".join(part.split()), FixedWindow(amount, every * UNITS[unit])))
    _distinct(out, text)
    return out


#: A limit as the middleware and the decorator take it: a :class:`Policy`, an algorithm (named
#: after its command, ``tokenbucket``) or a rate string (``"5/minute"``, ``"5/minute;100/hour"``).
LimitSpec = Policy | Algorithm | str
#: A route's limits: a rate string, or a sequence of limits.
LimitsSpec = str | Sequence[LimitSpec]


def policies_of(spec: LimitsSpec) -> list[Policy]:
    """The policies of a route's limits as given (see :data:`LimitsSpec`)."""
    if isinstance(spec, str):
        return parse_rates(spec)
    if isinstance(spec, (Policy, Algorithm)):
        spec = [spec]
    out: list[Policy] = []
    for p in spec:
        if isinstance(p, Policy):
            out.append(p)
        elif isinstance(p, str):
            out.extend(parse_rates(p))
        elif isinstance(p, Algorithm):
            out.append(Policy(p.keyword.lower(), p))
        else:
            raise TypeError(f"a Policy, an algorithm or a rate such as '5/minute', not {p!r}")
    _distinct(out, spec)
    return out


def _distinct(policies: Sequence[Policy], given: object) -> None:
    names = [p.name for p in policies]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"two limits of one route are named {twice[0]!r} (they would share a key): {given!r}")


@dataclass(frozen=True, slots=True)
class RequestInfo:
    """What the rules see of a request."""

    method: str
    #: The path, without the query string.
    path: str
    #: Header values by lower-case name, in the order received.
    headers: Mapping[str, Sequence[str]]
    #: The peer's address (the TCP client), when known.
    peer: str | None
    #: The ASGI scope or the WSGI environ.
    raw: Mapping[str, Any]

    def header(self, name: str) -> str | None:
        """The first value of a header, when it is made of visible ASCII characters."""
        values = self.headers.get(name.lower())
        if not values or not _visible(values[0]):
            return None
        return values[0]

    @classmethod
    def from_scope(cls, scope: Mapping[str, Any]) -> RequestInfo:
        headers: dict[str, list[str]] = {}
        for name, value in scope.get("headers", ()):
            headers.setdefault(name.decode("latin-1").lower(), []).append(value.decode("latin-1"))
        client = scope.get("client")
        peer = str(client[0]) if client else None
        return cls(str(scope.get("method", "GET")), str(scope.get("path", "/")), headers, peer, scope)

    @classmethod
    def from_environ(cls, environ: Mapping[str, Any]) -> RequestInfo:
        headers: dict[str, list[str]] = {}
        for name, value in environ.items():
            if name.startswith("HTTP_") and isinstance(value, str):
                headers[name[5:].replace("_", "-").lower()] = [value]
        for name in ("CONTENT_TYPE", "CONTENT_LENGTH"):
            if environ.get(name):
                headers[name.replace("_", "-").lower()] = [str(environ[name])]
        peer = environ.get("REMOTE_ADDR") or None
        return cls(
            str(environ.get("REQUEST_METHOD", "GET")), str(environ.get("PATH_INFO", "/")), headers, peer, environ
        )


#: The attribute that marks a view: ``"exempt"`` (:func:`exempt`) or ``"limited"`` (``@limit``).
MARK = "__ratelimit__"


def exempt(view: _V) -> _V:
    """Marks a view (a Flask view function, a Starlette or FastAPI endpoint) as never limited by
    the middleware: no call to Redis, no fields, whatever ``limits`` and ``default_limits`` say.
    The WSGI middleware finds the view of a request in the Flask application it was installed in
    by :meth:`~ratelimit_client.wsgi.RateLimitMiddleware.init_app`; the ASGI middleware in the
    Starlette or FastAPI application that runs it. (Elsewhere, ``exempt=[paths]``.)"""
    setattr(view, MARK, "exempt")
    return view


def mark_of(view: object) -> str | None:
    """``"exempt"``, ``"limited"`` (a view with limits of its own, ``@limit``) or ``None``."""
    seen = 0
    while view is not None and seen < 8:  # through functools.wraps layers
        mark = getattr(view, MARK, None)
        if isinstance(mark, str):
            return mark
        view = getattr(view, "__wrapped__", None)
        seen += 1
    return None


def flask_view(app: Any, environ: Mapping[str, Any]) -> object:
    """The view function a Flask application routes a request to, or ``None``."""
    try:
        endpoint, _ = app.url_map.bind_to_environ(environ).match()
    except Exception:  # no route, a redirect, a method not allowed: the application answers
        return None
    return app.view_functions.get(endpoint)


def starlette_view(scope: Mapping[str, Any]) -> object:
    """The endpoint a Starlette (or FastAPI) application routes a request to, or ``None``."""
    app = scope.get("app")
    routes = getattr(app, "routes", None)
    if not isinstance(routes, list):
        return None
    full = None
    for route in routes:
        matches = getattr(route, "matches", None)
        if matches is None:
            continue
        try:
            match, _ = matches(dict(scope))
        except Exception:
            continue
        if getattr(match, "name", "") == "FULL":
            full = route
            break
    return getattr(full, "endpoint", None)


def _visible(v: str) -> bool:
    return all(c == "\t" or " " <= c <= "~" for c in v)


#: Who a request is counted against: a key computed from the request (``None``: ``anonymous``).
KeyFunc = Callable[[RequestInfo], "str | None"]


class RequestKey:
    """A key taken from the request (what :func:`header` and :func:`client_ip` make): the
    middleware calls it with the :class:`RequestInfo`, and so does ``@limit`` with a view's."""

    __slots__ = ("_fn", "_text")

    def __init__(self, fn: Callable[[RequestInfo], str | None], text: str) -> None:
        self._fn = fn
        self._text = text

    def __call__(self, info: RequestInfo) -> str | None:
        return self._fn(info)

    def __repr__(self) -> str:
        return self._text


def header(name: str) -> RequestKey:
    """The value of a header (an API key, a user id set by an authentication layer)."""

    def key(info: RequestInfo) -> str | None:
        v = info.header(name)
        return v if v else None

    return RequestKey(key, f"header({name!r})")


def _parse_ip(s: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(s)
    except ValueError:
        return None


def client_ip(trusted_proxies: Iterable[str] = ()) -> RequestKey:
    """The client's IP: the peer address, or, when the peer is one of ``trusted_proxies``, the
    rightmost address in ``X-Forwarded-For`` that is not a trusted proxy. ``X-Forwarded-For``
    from anyone else is ignored, and so is a chain with anything but addresses in it."""
    trusted = {ipaddress.ip_address(p) for p in trusted_proxies}

    def key(info: RequestInfo) -> str | None:
        peer = _parse_ip(info.peer) if info.peer else None
        if peer is None:
            return None
        if peer not in trusted:
            return str(peer)
        parts = [p.strip() for v in info.headers.get("x-forwarded-for", ()) if _visible(v) for p in v.split(",")]
        ips = [_parse_ip(p) for p in parts]
        chain = [ip for ip in ips if ip is not None] if None not in ips else []
        for ip in reversed(chain):
            if ip not in trusted:
                return str(ip)
        return str(peer)

    return RequestKey(key, f"client_ip({sorted(str(t) for t in trusted)!r})")


@dataclass(slots=True)
class Rules:
    """The middleware's settings (the keyword arguments of the middleware and the decorator)."""

    #: Who requests are counted against (default: the client IP, no proxy trusted).
    key: KeyFunc = field(default_factory=client_ip)
    #: The route class of a request (default ``"default"``).
    route_class: Callable[[RequestInfo], str] = lambda _: "default"
    #: The plan of the request's client (default ``"default"``).
    plan: Callable[[RequestInfo], str] = lambda _: "default"
    #: The policies of (plan, route class), ``"*"`` matching any: looked up as (plan, class),
    #: ("*", class), (plan, "*"), ("*", "*"). All of a request's policies apply at once.
    limits: Mapping[tuple[str, str], Sequence[Policy]] = field(default_factory=dict)
    #: Limits computed per request from (plan, class), instead of the table.
    limits_fn: Callable[[str, str], LimitsSpec] | None = None
    #: Units a request of a route class (``"*"``: any other) reserves from each of its limits
    #: before the handler runs (default 1); settled with the cost the handler reports.
    estimates: Mapping[str, int] = field(default_factory=dict)
    #: Also send ``RateLimit-Limit``, ``RateLimit-Remaining`` and ``RateLimit-Reset``.
    legacy_headers: bool = False
    #: Prefix of the Redis keys: ``rl:{client}:class:limit``.
    prefix: str = "rl"
    #: Renew the concurrency leases of requests still in flight every this many seconds.
    lease_keep_alive: float | None = None
    #: The limits of every request whose route has none of its own (not in ``limits``, or
    #: ``limits_fn`` answering none).
    default_limits: Sequence[Policy] = ()
    #: Paths never limited: an exact path (``/health``), or a prefix ending with ``*``
    #: (``/metrics*``, ``/static/*``).
    exempt: Sequence[str] = ()
    #: The format of the RateLimit fields: ``"draft-11"`` or ``"draft-12"`` (see docs/python.md).
    header_format: HeaderFormat = "draft-11"

    def policies(self, plan: str, route_class: str, defaults: bool = True) -> list[Policy]:
        if self.limits_fn is not None:
            own = policies_of(self.limits_fn(plan, route_class))
        else:
            own = next(
                (
                    list(self.limits[key])
                    for key in ((plan, route_class), ("*", route_class), (plan, "*"), ("*", "*"))
                    if key in self.limits
                ),
                [],
            )
        return own if own or not defaults else list(self.default_limits)

    def is_exempt(self, path: str) -> bool:
        return any(path.startswith(e[:-1]) if e.endswith("*") else path == e for e in self.exempt)

    def estimate(self, route_class: str) -> int:
        if route_class in self.estimates:
            return self.estimates[route_class]
        return self.estimates.get("*", 1)


#: The format of the RateLimit response fields.
HeaderFormat = Literal["draft-11", "draft-12"]
HEADER_FORMATS: tuple[HeaderFormat, ...] = ("draft-11", "draft-12")


def make_rules(
    *,
    key: KeyFunc | None,
    plan: Callable[[RequestInfo], str] | None,
    route_class: Callable[[RequestInfo], str] | None,
    limits: Mapping[tuple[str, str], LimitsSpec] | None,
    limits_fn: Callable[[str, str], LimitsSpec] | None,
    estimates: Mapping[str, int] | None,
    legacy_headers: bool,
    prefix: str,
    lease_keep_alive: float | None,
    default_limits: LimitsSpec | None = None,
    exempt: Iterable[str] = (),
    header_format: HeaderFormat = "draft-11",
) -> Rules:
    """:class:`Rules` from the middleware's keyword arguments, ``None`` for the defaults; a rate
    string, a limit or a table that cannot be read is refused here (``ValueError``,
    ``TypeError``), before the first request."""
    if header_format not in HEADER_FORMATS:
        raise ValueError(f"header_format is 'draft-11' or 'draft-12', not {header_format!r}")
    if isinstance(exempt, str):
        raise TypeError(f"exempt is a list of paths, not the string {exempt!r}")
    paths = list(exempt)
    for p in paths:
        if not isinstance(p, str) or not p.startswith("/"):
            raise ValueError(f"an exempt path starts with '/': {p!r}")
    if limits is not None:
        for k in limits:
            if not (isinstance(k, tuple) and len(k) == 2 and all(isinstance(x, str) for x in k)):
                raise TypeError(f"the limits table is keyed by (plan, route class), not {k!r}")
    if estimates is not None:
        for c, units in estimates.items():
            if not isinstance(units, int) or isinstance(units, bool) or units < 0:
                raise ValueError(f"the estimate of {c!r} is a whole number of units, 0 or more, not {units!r}")
    r = Rules(
        legacy_headers=legacy_headers,
        prefix=prefix,
        lease_keep_alive=lease_keep_alive,
        exempt=paths,
        header_format=header_format,
    )
    if limits_fn is not None:
        fn = limits_fn
        r.limits_fn = lambda plan, route_class: policies_of(fn(plan, route_class))
    if default_limits is not None:
        r.default_limits = policies_of(default_limits)
    if key is not None:
        r.key = key
    if plan is not None:
        r.plan = plan
    if route_class is not None:
        r.route_class = route_class
    if limits is not None:
        r.limits = {k: policies_of(v) for k, v in limits.items()}
    if estimates is not None:
        r.estimates = dict(estimates)
    return r


class RateLimitState:
    """Put into the request (ASGI ``scope["ratelimit"]``, WSGI ``environ["ratelimit"]``) by the
    middleware: the handler reports the actual cost here (:func:`report_cost`), and the shadow
    policies that would have refused the request are listed here for an outer layer to log."""

    __slots__ = ("actual_cost", "outcome", "shadow_denials")

    def __init__(self) -> None:
        #: What the request really cost, in the units of its route's limits.
        self.actual_cost: int | None = None
        #: The shadow policies that would have refused the request, in the route's order.
        self.shadow_denials: list[str] = []
        #: The enforced limits' outcome.
        self.outcome: MultiOutcome | None = None


STATE_KEY = "ratelimit"


def state_of(request: Any) -> RateLimitState | None:
    """The middleware's state of a request: an ASGI scope or WSGI environ, or a request object
    of Starlette (``.scope``), Flask or Django (``.environ``)."""
    for holder in (
        request,
        getattr(request, "scope", None),
        getattr(request, "environ", None),
        getattr(request, "META", None),
    ):
        if isinstance(holder, Mapping):
            state = holder.get(STATE_KEY)
            if isinstance(state, RateLimitState):
                return state
    return None


def report_cost(request: Any, units: int) -> bool:
    """Reports what ``request`` really cost, in the units of its route's limits; the middleware
    settles its estimate with it (refunded or charged) before the response leaves. Call it
    before the response starts. ``request`` is the ASGI scope, the WSGI environ, or the
    framework's request object. Whether a middleware was there to take it."""
    if units < 0:
        raise ValueError("a cost is 0 or more")
    state = state_of(request)
    if state is None:
        return False
    state.actual_cost = units
    return True


# Response fields ----------------------------------------------------------------------------

#: The response fields the middleware sets (any the handler set are replaced).
FIELDS = frozenset(
    {
        "ratelimit-policy",
        "ratelimit",
        "ratelimit-partition",
        "ratelimit-limit",
        "ratelimit-remaining",
        "ratelimit-reset",
        "ratelimit-degraded",
    }
)

Headers = list[tuple[str, str]]

#: Entries of the middleware's deny cache unless ``deny_cache_entries`` says otherwise.
DENY_CACHE_ENTRIES = 10_000


def _ceil_secs(ms: int) -> int:
    return -(-ms // 1000)


def _sf_string(name: str) -> str:
    """Policy names go into structured-field strings: kept to safe characters."""
    return "".join(c if ("!" <= c <= "~" and c not in '"\\') else "_" for c in name)


def rate_limit_headers(
    policies: Sequence[Policy],
    outcome: MultiOutcome,
    legacy: bool,
    header_format: HeaderFormat = "draft-11",
    cost: int = 1,
) -> Headers:
    """``RateLimit-Policy`` and ``RateLimit`` for these policies and decisions, the legacy fields
    when asked, ``RateLimit-Degraded`` when Redis did not decide. A concurrency limit's policy
    has the quota unit ``concurrent-requests`` and no window.

    ``draft-11`` (draft-ietf-httpapi-ratelimit-headers-11): ``RateLimit`` items
    ``"<name>";r=<remaining>;t=<seconds>``. ``draft-12`` (the working group editors' text of
    the next revision): ``"<name>";a=<available>;w=<seconds>;c=<units>``, ``c`` what this
    request took from the policy (``cost``, 1 for a concurrency policy) when the request was
    admitted and the policy allowed it, else 0; and ``RateLimit-Partition``, one
    ``"<name>";client_id`` per policy."""
    policy = []
    state = []
    partition = []
    for p, d in zip(policies, outcome.decisions, strict=True):
        name = _sf_string(p.name)
        concurrency = isinstance(p.algorithm, Concurrency)
        if concurrency:
            policy.append(f'"{name}";q={d.limit};qu="concurrent-requests"')
        else:
            policy.append(f'"{name}";q={d.limit};w={p.algorithm.window_secs}')
        if header_format == "draft-12":
            took = (1 if concurrency else cost) if outcome.allowed and d.allowed else 0
            state.append(f'"{name}";a={d.remaining};w={_ceil_secs(d.reset_after_ms)};c={took}')
            partition.append(f'"{name}";client_id')
        else:
            state.append(f'"{name}";r={d.remaining};t={_ceil_secs(d.reset_after_ms)}')
    out: Headers = [("ratelimit-policy", ", ".join(policy)), ("ratelimit", ", ".join(state))]
    if partition:
        out.append(("ratelimit-partition", ", ".join(partition)))
    if legacy:
        d0 = _tightest(policies, outcome)
        if d0 is not None:
            out += [
                ("ratelimit-limit", str(d0.limit)),
                ("ratelimit-remaining", str(d0.remaining)),
                ("ratelimit-reset", str(_ceil_secs(d0.reset_after_ms))),
            ]
    if outcome.degraded is not None:
        out.append(("ratelimit-degraded", outcome.degraded.value))
    return out


def _tightest(policies: Sequence[Policy], outcome: MultiOutcome) -> Decision | None:
    """The limit that decided: the one that denied, else the enforced one with the fewest units
    left (shadow policies never decide)."""
    if outcome.denied_by > 0:
        return outcome.decisions[outcome.denied_by - 1]
    enforced = [d for p, d in zip(policies, outcome.decisions, strict=True) if not p.shadow]
    return min(enforced, key=lambda d: d.remaining) if enforced else None


def problem_body(body: Mapping[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode("utf-8")


def internal_error(e: RateLimitError) -> tuple[int, Headers, bytes]:
    body = problem_body(
        {"type": "about:blank", "title": "Internal Server Error", "status": 500, "detail": f"rate limiter: {e}"}
    )
    return 500, [("content-type", "application/problem+json")], body


def too_many(policies: Sequence[Policy], outcome: MultiOutcome) -> tuple[int, Headers, bytes]:
    """429 with ``Retry-After`` in whole seconds (rounded up, at least 1) and a problem+json
    body naming the limit that denied."""
    i = max(outcome.denied_by, 1) - 1
    d = outcome.decisions[i]
    name = policies[i].name
    wait_ms = d.retry_after_ms if d.retry_after_ms >= 0 else d.reset_after_ms
    secs = max(1, _ceil_secs(wait_ms))
    body = problem_body(
        {
            "type": "about:blank",
            "title": "Too Many Requests",
            "status": 429,
            "detail": f"rate limit '{name}' exceeded; retry in {secs} s",
            "limit": name,
            "retry_after": secs,
        }
    )
    return 429, [("content-type", "application/problem+json"), ("retry-after", str(secs))], body


# The flow of a request ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Decide:
    """Check ``limits`` with ``cost`` (``RL.ALL ... LEASE`` when a concurrency limit is among
    them): answered with (MultiOutcome, lease or None)."""

    limits: Limits
    cost: int


@dataclass(frozen=True, slots=True)
class PeekAll:
    """Peek at ``limits``: answered with a MultiOutcome."""

    limits: Limits


@dataclass(frozen=True, slots=True)
class Settle:
    """Settle a reservation of ``estimate`` on ``limits`` with ``actual``, where it was charged:
    answered with a Settlement."""

    limits: Limits
    estimate: int
    actual: int
    charged: Degraded | None


Op = Decide | PeekAll | Settle
Flow = Generator[Op, Any, Any]


@dataclass(slots=True)
class Shadowed:
    index: int
    outcome: MultiOutcome
    consumed: bool


@dataclass(slots=True)
class Admission:
    """A request's answer before its handler runs, and what its response needs afterwards."""

    policies: list[Policy]
    limits: list[tuple[str, Algorithm]]
    estimate: int
    enforced: list[int]
    outcome: MultiOutcome
    leases: list[Any] = field(default_factory=list)
    shadowed: list[Shadowed] = field(default_factory=list)
    denials: list[str] = field(default_factory=list)
    error: RateLimitError | None = None
    header_format: HeaderFormat = "draft-11"

    @property
    def allowed(self) -> bool:
        return self.error is None and self.outcome.allowed

    @property
    def enforced_policies(self) -> list[Policy]:
        return [self.policies[i] for i in self.enforced]

    @property
    def enforced_limits(self) -> list[tuple[str, Algorithm]]:
        return [self.limits[i] for i in self.enforced]

    def refusal(self, legacy: bool) -> tuple[int, Headers, bytes]:
        """The response of a request that does not reach its handler: 500 when Redis refused a
        limit, else 429 with the fields."""
        if self.error is not None:
            return internal_error(self.error)
        status, headers, body = too_many(self.enforced_policies, self.outcome)
        return status, headers + self.fields(legacy), body

    def fields(self, legacy: bool) -> Headers:
        """The fields of every policy answered for, in the route's order."""
        answers = list(zip(self.enforced, self.outcome.decisions, strict=True))
        degraded = self.outcome.degraded
        for s in self.shadowed:
            answers.append((s.index, s.outcome.decisions[0]))
            degraded = degraded or s.outcome.degraded
        answers.sort(key=lambda a: a[0])
        denier = self.enforced[self.outcome.denied_by - 1] if self.outcome.denied_by > 0 else None
        position = next((p for p, (i, _) in enumerate(answers) if i == denier), None)
        shown = MultiOutcome(
            self.outcome.allowed,
            0 if position is None else position + 1,
            tuple(d for _, d in answers),
            degraded,
            self.outcome.mode,
        )
        return rate_limit_headers(
            [self.policies[i] for i, _ in answers], shown, legacy, self.header_format, self.estimate
        )


def admit(config: Rules, metrics: Metrics, info: RequestInfo, mark: str | None = None) -> Flow:
    """Decides a request before its handler: ``None`` when its path or its view is exempt or its
    route has no limits, else its :class:`Admission`. ``mark`` is its view's (:func:`mark_of`):
    a view limited by ``@limit`` has limits of its own, and the default limits do not apply."""
    if mark == "exempt" or config.is_exempt(info.path):
        return None
    who = config.key(info) or "anonymous"
    route_class = config.route_class(info)
    policies = config.policies(config.plan(info), route_class, defaults=mark != "limited")
    if not policies:
        return None
    limits = [(f"{config.prefix}:{{{who}}}:{route_class}:{p.name}", p.algorithm) for p in policies]
    estimate = config.estimate(route_class)
    enforced = [i for i, p in enumerate(policies) if not p.shadow]
    shadows = [i for i, p in enumerate(policies) if p.shadow]
    adm = Admission(
        policies, limits, estimate, enforced, MultiOutcome(True, 0, (), None, None), header_format=config.header_format
    )
    if enforced:
        try:
            adm.outcome, lease = yield Decide(adm.enforced_limits, estimate)
        except RateLimitError as e:
            adm.error = e
            return adm
        if lease is not None:
            adm.leases.append(lease)
    outcome = adm.outcome
    for n, i in enumerate(enforced):
        denied_here = not outcome.allowed and outcome.denied_by == n + 1
        if outcome.allowed or denied_here:
            local = None if outcome.answered_locally is None else outcome.answered_locally.value
            metrics.record(policies[i].name, outcome.allowed, outcome.degraded is not None, local)
    if outcome.allowed:
        for i in shadows:
            try:
                o, lease = yield Decide([limits[i]], estimate)
            except RateLimitError:
                continue  # a shadow policy that Redis refuses is left out; it never fails a request
            metrics.record_shadow(policies[i].name, o.allowed, o.degraded is not None)
            if o.answered_locally is not None:
                metrics.record_local(policies[i].name, o.answered_locally.value)
            if not o.allowed:
                adm.denials.append(policies[i].name)
            if lease is not None:
                adm.leases.append(lease)
            adm.shadowed.append(Shadowed(i, o, o.allowed))
    elif shadows:
        try:
            o = yield PeekAll([limits[i] for i in shadows])
        except RateLimitError:
            return adm
        for i, d in zip(shadows, o.decisions, strict=True):
            one = MultiOutcome(d.allowed, 0 if d.allowed else 1, (d,), o.degraded, o.mode)
            adm.shadowed.append(Shadowed(i, one, False))
    return adm


def finish(adm: Admission, metrics: Metrics, actual: int | None, legacy: bool) -> Flow:
    """Once the handler has answered: settles the estimate with the reported actual cost (a
    different one), then the response fields."""
    if actual is not None and actual != adm.estimate:
        adm.outcome = yield from _settle(adm, metrics, adm.enforced, adm.outcome, actual)
        for s in adm.shadowed:
            if s.consumed:
                s.outcome = yield from _settle(adm, metrics, [s.index], s.outcome, actual)
    return adm.fields(legacy)


def _settle(adm: Admission, metrics: Metrics, indices: list[int], outcome: MultiOutcome, actual: int) -> Flow:
    """Settles the limits at ``indices`` (concurrency limits aside) with ``actual`` and returns
    ``outcome`` with their state afterwards. A settlement that could not be made where the
    estimate was taken, or that Redis refused, leaves ``outcome`` as it was."""
    positions = [n for n, i in enumerate(indices) if not isinstance(adm.limits[i][1], Concurrency)]
    # Admitted by FailOpen: nothing was taken, nothing to settle.
    if not positions or outcome.degraded not in (None, Degraded.LOCAL):
        return outcome
    limits = [adm.limits[indices[n]] for n in positions]
    try:
        s: Settlement = yield Settle(limits, adm.estimate, actual, outcome.degraded)
    except RateLimitError:
        return outcome
    if s.degraded != outcome.degraded:
        return outcome
    decisions = list(outcome.decisions)
    delta = actual - adm.estimate
    for n, d in zip(positions, s.decisions, strict=True):
        decisions[n] = d
        metrics.record_settled(adm.policies[indices[n]].name, delta)
    return dataclasses.replace(outcome, decisions=tuple(decisions))


# Drivers -------------------------------------------------------------------------------------


def run_sync(client: Client, flow: Flow) -> Any:
    """Carries out a flow's operations with a synchronous client."""
    from .client import Reservation

    try:
        op = next(flow)
        while True:
            try:
                if isinstance(op, Decide):
                    if has_concurrency(op.limits):
                        got = client.acquire_all(op.limits, op.cost)
                        result: Any = (got.outcome, got.lease)
                    else:
                        result = (client.check_all(op.limits, op.cost), None)
                elif isinstance(op, PeekAll):
                    result = client.check_all(op.limits, 0)
                else:
                    result = Reservation(client, op.limits, op.estimate, op.charged).settle(op.actual)
            except RateLimitError as e:
                op = flow.throw(e)
            else:
                op = flow.send(result)
    except StopIteration as stop:
        return stop.value


async def run_async(client: AsyncClient, flow: Flow) -> Any:
    """Carries out a flow's operations with an asyncio client."""
    from .aio import AsyncReservation

    try:
        op = next(flow)
        while True:
            try:
                if isinstance(op, Decide):
                    if has_concurrency(op.limits):
                        got = await client.acquire_all(op.limits, op.cost)
                        result: Any = (got.outcome, got.lease)
                    else:
                        result = (await client.check_all(op.limits, op.cost), None)
                elif isinstance(op, PeekAll):
                    result = await client.check_all(op.limits, 0)
                else:
                    result = await AsyncReservation(client, op.limits, op.estimate, op.charged).settle(op.actual)
            except RateLimitError as e:
                op = flow.throw(e)
            else:
                op = flow.send(result)
    except StopIteration as stop:
        return stop.value


def keep_alive(adm: Admission, every: float | None) -> None:
    if every is not None:
        for lease in adm.leases:
            lease.keep_alive(every)


def release_sync(adm: Admission) -> None:
    leases, adm.leases = adm.leases, []
    for lease in leases:
        try:
            lease.release()
        except RateLimitError:
            pass  # the lease expires by itself


async def release_async(adm: Admission) -> None:
    leases, adm.leases = adm.leases, []
    for lease in leases:
        try:
            await lease.release()
        except RateLimitError:
            pass  # the lease expires by itself
