"""The rate limit on HTTP calls: checked once per request when it is authenticated, and the
X-RateLimit-* headers put on whatever response the request then gets (success or error)."""

from __future__ import annotations

from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from crm.common.v1 import common_pb2
from gateway.ratelimit.window import Decision
from gateway.state import gateway_state

DECISION_KEY = "crm.ratelimit"


async def admit_request(
    connection: HTTPConnection, principal: common_pb2.Principal, calls: int = 1
) -> None:
    """Count the request as `calls` calls; ResourceExhausted (429, RATE_LIMIT_EXCEEDED) when
    over the limit."""
    decision = await gateway_state(connection).rate_limiter.check(principal, calls)
    if decision is None:
        return  # Redis unreachable: admitted, and no numbers to report
    connection.scope[DECISION_KEY] = decision
    if not decision.allowed:
        raise decision.error()


class RateLimitHeadersMiddleware:
    """Adds the request's rate-limit headers to its response, if it was counted."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                decision = scope.get(DECISION_KEY)
                if isinstance(decision, Decision):
                    message["headers"] = [*message.get("headers", ()), *decision.headers()]
            await send(message)

        await self.app(scope, receive, send_with_headers)
