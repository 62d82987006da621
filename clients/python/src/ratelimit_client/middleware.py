"""What the ASGI middleware (:mod:`ratelimit_client.asgi`), the WSGI middleware
(:mod:`ratelimit_client.wsgi`) and the decorator (:mod:`ratelimit_client.decorators`) share:
policies, keys, the request the rules see, the cost a handler reports, and the response fields.

Every limited response carries ``RateLimit-Policy`` and ``RateLimit``
(draft-ietf-httpapi-ratelimit-headers-11 by default; ``header_format="draft-12"`` for the next
revision's fields and ``RateLimit-Partition``), optionally ``RateLimit-Limit`` / ``-Remaining`` /
``-Reset``, and ``RateLimit-Degraded`` when Redis did not decide; a refusal is ``429`` with
``Retry-After`` and an ``application/problem+json`` body; a limit that Redis refuses is a
``500``. Redis keys are ``rl:{<key>}:<route class>:<policy>`` (one hash tag per client, so a
request's limits share a cluster slot).
"""

from ._http import (
    FIELDS,
    UNITS,
    HeaderFormat,
    KeyFunc,
    LimitSpec,
    LimitsSpec,
    Policy,
    RateLimitState,
    RequestInfo,
    RequestKey,
    Rules,
    client_ip,
    exempt,
    header,
    parse_rates,
    policies_of,
    rate_limit_headers,
    report_cost,
    state_of,
)
from .metrics import Counts, Metrics

__all__ = [
    "FIELDS",
    "UNITS",
    "Counts",
    "HeaderFormat",
    "KeyFunc",
    "LimitSpec",
    "LimitsSpec",
    "Metrics",
    "Policy",
    "RateLimitState",
    "RequestInfo",
    "RequestKey",
    "Rules",
    "client_ip",
    "exempt",
    "header",
    "parse_rates",
    "policies_of",
    "rate_limit_headers",
    "report_cost",
    "state_of",
]
