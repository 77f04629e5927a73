"""Where operations started over a GraphQL WebSocket are counted.

Every `subscribe` message (graphql-transport-ws; `start` on legacy graphql-ws) passes through
`admit_operation` exactly once, whether it opens a subscription or runs a query or mutation over
the socket; the events a subscription then streams never do, and neither do pings, pongs,
keep-alives or `complete`. This is the one place the API rate limit counts WebSocket calls:
raising a ServiceError here (e.g. ResourceExhausted with `resetAt`) refuses the operation with
an `error` message carrying that code, and the socket stays open.
"""

from __future__ import annotations

from crm.common.v1 import common_pb2
from gateway.state import GatewayState


async def admit_operation(
    state: GatewayState, principal: common_pb2.Principal, calls: int = 1
) -> None:
    """Count the operation as `calls` calls (a mutation: one per top-level field)."""
    state.metrics.websocket_operations.inc()
    decision = await state.rate_limiter.check(principal, calls)
    if decision is not None and not decision.allowed:
        raise decision.error()
