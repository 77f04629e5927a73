"""Authentication of every request: bearer credential → verified Principal.

`authenticate()` is what REST routes, the GraphQL endpoint and WebSocket connection_init call.
It accepts JWT session and OAuth access tokens, API keys and personal access tokens; anything
else (missing, malformed, bad signature, `alg: none`, expired, revoked, wrong workspace) is
Unauthenticated, whose reason tells expired (TOKEN_EXPIRED) from invalid. An HTTP request is
then counted against the API rate limit, here (or, for GraphQL, once its operation is known:
`admit=False`, then gateway.ratelimit.http.admit_request, which every such caller must call), so
REST and GraphQL share it; its first call is counted in the Redis round trip that reads the
credential's entry when it can be (gateway.ratelimit.limiter), and the admission settles it;
WebSocket operations are counted as they start (gateway.subscriptions.admission).
"""

from __future__ import annotations

from starlette.requests import HTTPConnection

from crm.common.v1 import common_pb2
from crmkit.workflow_origin import WORKFLOW_RUN_HEADER, WorkflowOrigin
from gateway.auth.verify import CredentialVerifier, bearer_token
from gateway.ratelimit.http import HELD_KEY, admit_request
from gateway.state import GatewayState, gateway_state

_SCOPE_KEY = "crm.principal"


def credential_verifier(state: GatewayState) -> CredentialVerifier:
    """The process's verifier (one per app: a Redis outage and identity's answers during it are
    remembered across requests, so it is logged once and identity is asked once a second)."""
    return state.credentials


async def authenticate(
    connection: HTTPConnection, authorization: str | None = None, *, admit: bool = True
) -> common_pb2.Principal:
    """The verified principal of the request's `Authorization: Bearer` credential.

    WebSocket handlers pass the `authorization` value of the connection_init payload; HTTP
    requests use their header. A request is verified (and counted) once, however many callers ask.
    """
    if authorization is None:
        known = connection.scope.get(_SCOPE_KEY)
        if isinstance(known, common_pb2.Principal):
            return known
        authorization = connection.headers.get("authorization")
    state = gateway_state(connection)
    http = connection.scope["type"] == "http"
    principal, counted = await credential_verifier(state).verify_counting(
        bearer_token(authorization), state.rate_limiter if http else None
    )
    if counted is not None:
        connection.scope[HELD_KEY] = counted  # settled by admit_request
    origin = connection.headers.get(WORKFLOW_RUN_HEADER)
    if origin:
        principal = _from_workflow(principal, origin, state.settings.APP_SECRET)
    if admit and http:
        await admit_request(connection, principal)
    connection.scope[_SCOPE_KEY] = principal
    return principal


def _from_workflow(
    principal: common_pb2.Principal, origin: str, app_secret: str
) -> common_pb2.Principal:
    """The principal stamped with the workflow whose run sent this request (see
    crmkit.workflow_origin), so the writes it makes do not trigger that workflow again."""
    workflow_id = WorkflowOrigin(app_secret).workflow_of(origin, principal.workspace_id)
    if workflow_id is None:
        return principal
    stamped = common_pb2.Principal()
    stamped.CopyFrom(principal)
    stamped.workflow_id = workflow_id
    return stamped


__all__ = ["authenticate"]
