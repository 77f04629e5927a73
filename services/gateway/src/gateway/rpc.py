"""Calling an upstream gRPC method with the request's principal, failures as ServiceErrors."""

from __future__ import annotations

from typing import Any

import grpc

from crmkit.errors import from_rpc_error

Metadata = list[tuple[str, str | bytes]]


async def call(method: Any, request: Any, metadata: Metadata) -> Any:
    """`await method(request)` with `metadata`; an RPC failure is raised as its ServiceError
    (the one mapper in gateway.errors turns it into the REST body or GraphQL extensions)."""
    try:
        return await method(request, metadata=metadata)
    except grpc.aio.AioRpcError as exc:
        raise from_rpc_error(exc) from None
