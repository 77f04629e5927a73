"""A call in flight when its connection reaches GRPC_MAX_CONNECTION_AGE runs to its end.

The server answers a connection's age with GOAWAY (new calls go on a new connection, so clients
re-resolve), but a call already running is not cut, however long it takes: a data-model change
rewriting a large table, or an export read slowly, lasts far longer than any fixed grace."""

from __future__ import annotations

import asyncio

import grpc

from crmkit.grpc_client import open_channel
from crmkit.grpc_server import server_options
from crmkit.settings import GrpcServiceSettings

SLOW_SECONDS = 3.0


async def _slow(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
    await asyncio.sleep(SLOW_SECONDS)
    return b"done " + request


async def test_a_call_outlives_its_connections_age_and_the_shutdown_grace() -> None:
    settings = GrpcServiceSettings(
        APP_SECRET="s" * 48, GRPC_MAX_CONNECTION_AGE=1, SHUTDOWN_GRACE_SECONDS=0.5
    )
    server = grpc.aio.server(options=server_options(settings))
    handler = grpc.unary_unary_rpc_method_handler(_slow)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.T", {"M": handler}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    client = open_channel(f"127.0.0.1:{port}", default_timeout=30)
    try:
        call = client.inner.unary_unary("/t.T/M")
        first, second = await asyncio.gather(call(b"a", timeout=30), call(b"b", timeout=30))
        assert (first, second) == (b"done a", b"done b")
        assert await call(b"c", timeout=30) == b"done c"  # on the connection that replaced it
    finally:
        await client.close()
        await server.stop(0)
