"""Calling an upstream gRPC method with the request's principal, failures as ServiceErrors."""

from __future__ import annotations

from typing import Any

import grpc

from crmkit.errors import from_rpc_error

Metadata = list[tuple[str, str | bytes]]


async def call(method: Any, request: Any, metadata: Metadata, timeout: float | None = None) -> Any:
    """`await method(request)` with `metadata` (and `timeout`, else the channel's default); an
    RPC failure is raised as its ServiceError (the one mapper in gateway.errors turns it into
    the REST body or GraphQL extensions)."""
    try:
        if timeout is not None:
            return await method(request, metadata=metadata, timeout=timeout)
        return await method(request, metadata=metadata)
    except grpc.aio.AioRpcError as exc:
        raise from_rpc_error(exc) from None
