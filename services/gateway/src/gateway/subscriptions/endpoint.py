"""The WebSocket route at /graphql: subprotocol negotiation, then one session per socket.

Operations run against the caller's workspace schema, the same one POST /graphql serves
(generated from the data model, shared per fingerprint).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import strawberry
from starlette.websockets import WebSocket

from crm.common.v1 import common_pb2
from crmkit.errors import ServiceError
from gateway.graphql.endpoint import WorkspaceSchemas
from gateway.state import GatewayState, gateway_state
from gateway.subscriptions.protocol import CloseCode, negotiate
from gateway.subscriptions.rendering import CheckedDocument, DocumentCache
from gateway.subscriptions.session import PreparedSchema, SchemaSource, SocketSession

WebSocketEndpoint = Callable[[WebSocket], Awaitable[None]]


class WorkspaceSchemaSource:
    """The caller's workspace schema, from the data model cache."""

    def __init__(self, schemas: WorkspaceSchemas) -> None:
        self._schemas = schemas
        self._documents = DocumentCache()

    def check(self, schema: strawberry.Schema, query: str) -> CheckedDocument | None:
        return self._documents.check(schema, query)

    async def prepare(self, state: GatewayState, principal: common_pb2.Principal) -> PreparedSchema:
        model = await state.models.get(principal)
        return PreparedSchema(self._schemas.for_model(state, model).schema, model)

    async def refresh(
        self, state: GatewayState, principal: common_pb2.Principal, stale: PreparedSchema
    ) -> PreparedSchema | None:
        try:
            model = await state.models.refresh(principal)
        except ServiceError:
            return None
        if stale.model is not None and model.fingerprint == stale.model.fingerprint:
            return None
        return PreparedSchema(self._schemas.for_model(state, model).schema, model)


def graphql_websocket_endpoint(schemas: SchemaSource) -> WebSocketEndpoint:
    async def endpoint(websocket: WebSocket) -> None:
        wire = negotiate(list(websocket.scope.get("subprotocols") or ()))
        if wire is None:
            await websocket.accept()
            await websocket.close(
                CloseCode.SUBPROTOCOL_NOT_ACCEPTABLE,
                "Subprotocol not acceptable: use graphql-transport-ws (or graphql-ws)",
            )
            return
        await websocket.accept(subprotocol=wire.name)
        await SocketSession(websocket, wire, gateway_state(websocket), schemas).run()

    return endpoint
