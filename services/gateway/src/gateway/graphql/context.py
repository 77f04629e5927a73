"""What every GraphQL resolver gets as `info.context`: built per request, never shared."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from starlette.requests import HTTPConnection

from crm.common.v1 import common_pb2
from crmkit.errors import Internal
from gateway.datamodel.model import DataModel
from gateway.rpc import call
from gateway.state import GatewayState

T = TypeVar("T")


@dataclass
class GraphQLContext:
    connection: HTTPConnection
    state: GatewayState
    principal: common_pb2.Principal
    # Per-request DataLoaders, created on first use by the resolvers that batch (never shared).
    loaders: dict[Any, Any] = field(default_factory=dict)
    # Headers the HTTP response must carry (e.g. rate-limit headers).
    response_headers: dict[str, str] = field(default_factory=dict)
    # The workspace's data model the request runs against (on /graphql; None on /metadata).
    model: DataModel | None = None
    # Records a direct mutation wrote whose answer the normal execution must complete, by the
    # root field's response key: the resolver answers them instead of writing again.
    written: dict[str, Any] = field(default_factory=dict)

    def grpc_metadata(self) -> list[tuple[str, str | bytes]]:
        """Metadata for upstream calls on behalf of this request's principal."""
        return self.state.principals.metadata(self.principal)

    async def ask(self, method: Any, request: Any, timeout: float | None = None) -> Any:
        """An upstream call on behalf of this request's principal (gateway.rpc.call)."""
        return await call(method, request, self.grpc_metadata(), timeout)

    def loader(self, key: Any, create: Callable[[], T]) -> T:
        """The request's loader for `key`, created by `create()` on first use."""
        found = self.loaders.get(key)
        if found is None:
            found = self.loaders[key] = create()
        loader: T = found
        return loader

    @property
    def data_model(self) -> DataModel:
        if self.model is None:
            raise Internal("record operations need the workspace's data model")
        return self.model
