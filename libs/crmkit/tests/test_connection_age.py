"""Servers end connections after GRPC_MAX_CONNECTION_AGE, so clients reconnect and re-resolve;
a call in flight when its connection reaches that age runs to its end.

The server answers a connection's age with GOAWAY (new calls go on a new connection), but a call
already running is not cut, however long it takes: a data-model change rewriting a large table,
or an export read slowly, lasts far longer than any fixed grace."""

from __future__ import annotations

import asyncio
import time

import grpc
import orjson

from crm.records.v1 import records_pb2, records_pb2_grpc
from crmkit.grpc_client import open_channel
from crmkit.grpc_server import server_options
from crmkit.settings import GrpcServiceSettings


class PeerEcho(records_pb2_grpc.RecordsServiceServicer):
    """Answers with the caller's address, which changes when the client opens a new connection."""

    async def GetRecord(  # noqa: N802
        self, request: records_pb2.GetRecordRequest, context: grpc.aio.ServicerContext
    ) -> records_pb2.RecordResponse:
        return records_pb2.RecordResponse(record_json=orjson.dumps(context.peer()))


async def _peer(stub: records_pb2_grpc.RecordsServiceStub) -> str:
    response = await stub.GetRecord(records_pb2.GetRecordRequest(id="any"))
    peer: str = orjson.loads(response.record_json)
    return peer


async def test_a_client_moves_to_a_new_connection_after_the_maximum_age() -> None:
    settings = GrpcServiceSettings(
        APP_SECRET="s" * 16, GRPC_MAX_CONNECTION_AGE=1, SHUTDOWN_GRACE_SECONDS=1
    )
    server = grpc.aio.server(options=server_options(settings))
    records_pb2_grpc.add_RecordsServiceServicer_to_server(PeerEcho(), server)  # type: ignore[abstract]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = open_channel(f"127.0.0.1:{port}", default_timeout=5)
    try:
        stub = records_pb2_grpc.RecordsServiceStub(channel)
        first = await _peer(stub)
        deadline = time.monotonic() + 30
        latest = first
        while latest == first and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            latest = await _peer(stub)
        assert latest != first, "the connection outlived GRPC_MAX_CONNECTION_AGE"
    finally:
        await channel.close()
        await server.stop(0)


def test_the_age_comes_from_settings_and_calls_in_flight_have_no_grace_limit() -> None:
    settings = GrpcServiceSettings(APP_SECRET="s" * 16, GRPC_MAX_CONNECTION_AGE="5m")
    options = dict(server_options(settings))
    assert options["grpc.max_connection_age_ms"] == 300_000
    assert "grpc.max_connection_age_grace_ms" not in options  # gRPC's default: unbounded


SLOW_SECONDS = 3.0


async def _slow(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
    await asyncio.sleep(SLOW_SECONDS)
    return b"done " + request


async def test_a_call_outlives_its_connections_age_and_the_shutdown_grace() -> None:
    settings = GrpcServiceSettings(
        APP_SECRET="s" * 16, GRPC_MAX_CONNECTION_AGE=1, SHUTDOWN_GRACE_SECONDS=0.5
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
