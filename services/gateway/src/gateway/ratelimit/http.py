"""The rate limit on HTTP calls: checked once per request when it is authenticated, and the
X-RateLimit-* headers put on whatever response the request then gets (success or error)."""

from __future__ import annotations

from starlette.requests import HTTPConnection
from starlette.types import Scope

from crm.common.v1 import common_pb2
from gateway.ratelimit.limiter import Counted
from gateway.ratelimit.window import Decision
from gateway.response_headers import Headers
from gateway.state import gateway_state

DECISION_KEY = "crm.ratelimit"
HELD_KEY = "crm.ratelimit.held"  # the call counted with the credential's entry, if it was


async def admit_request(
    connection: HTTPConnection, principal: common_pb2.Principal, calls: int = 1
) -> None:
    """Count the request as `calls` calls; ResourceExhausted (429, RATE_LIMIT_EXCEEDED) when
    over the limit."""
    limiter = gateway_state(connection).rate_limiter
    held = connection.scope.pop(HELD_KEY, None)
    if isinstance(held, Counted):
        decision = await limiter.settle(held, principal, calls)
    else:
        decision = await limiter.check(principal, calls)
    if decision is None:
        return  # Redis unreachable: admitted, and no numbers to report
    connection.scope[DECISION_KEY] = decision
    if not decision.allowed:
        raise decision.error()


def rate_limit_headers(scope: Scope, headers: Headers) -> Headers:
    """The request's rate-limit headers, if it was counted (added to its response by
    gateway.response_headers.ResponseMiddleware)."""
    decision = scope.get(DECISION_KEY)
    return decision.headers() if isinstance(decision, Decision) else []
