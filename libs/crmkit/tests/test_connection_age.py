"""Servers end connections after GRPC_MAX_CONNECTION_AGE, so clients reconnect and re-resolve."""

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


def test_default_age_and_grace_come_from_settings() -> None:
    settings = GrpcServiceSettings(APP_SECRET="s" * 16, GRPC_MAX_CONNECTION_AGE="5m")
    options = dict(server_options(settings))
    assert options["grpc.max_connection_age_ms"] == 300_000
    assert options["grpc.max_connection_age_grace_ms"] == 10_000
