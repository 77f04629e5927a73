"""The GraphQL context of an operation run over a WebSocket: the per-request context plus the
session, which opens the record-event streams of subscription fields."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from gateway.graphql.context import GraphQLContext
from gateway.subscriptions.hub import EventSubscription


class StreamOpener(Protocol):
    async def open_stream(
        self,
        operation_id: str,
        object_name: str,
        action: str,
        *,
        predicate: Callable[[Mapping[str, Any]], bool] | None,
        owner_id: str | None,
    ) -> EventSubscription: ...


@dataclass(kw_only=True)
class SocketContext(GraphQLContext):
    """`info.context` of an operation received over a WebSocket (one per operation)."""

    session: StreamOpener
    operation_id: str
