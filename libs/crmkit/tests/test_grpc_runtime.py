"""The server-side call wrapper over a real loopback gRPC server: errors keep field and reason."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import asyncpg
import grpc
import pytest
from prometheus_client import CollectorRegistry

from crm.common.v1 import common_pb2
from crm.records.v1 import records_pb2, records_pb2_grpc
from crmkit.errors import InvalidArgument, NotFound, PermissionDenied, from_rpc_error
from crmkit.grpc_client import open_channel
from crmkit.metrics import GrpcServerMetrics
from crmkit.server_calls import ServerCalls
from crmstack.ports import free_port


class FailingRecords(records_pb2_grpc.RecordsServiceServicer):
    async def GetRecord(  # noqa: N802
        self, request: records_pb2.GetRecordRequest, context: grpc.aio.ServicerContext
    ) -> records_pb2.RecordResponse:
        if request.id == "bad":
            raise InvalidArgument("id must be a UUID", field="id")
        if request.id == "missing":
            raise NotFound("person not found")
        if request.id == "forbidden":
            raise PermissionDenied("cannot READ person")
        if request.id == "nul":
            raise asyncpg.exceptions.CharacterNotInRepertoireError(
                'invalid byte sequence for encoding "UTF8": 0x00'
            )
        if request.id == "overflow":
            raise asyncpg.exceptions.NumericValueOutOfRangeError("value out of range: overflow")
        if request.id == "crash":
            raise RuntimeError("secret internal detail")
        return records_pb2.RecordResponse(record_json=b'{"id": "ok"}')


@pytest.fixture
async def channel() -> AsyncIterator[tuple[grpc.aio.Channel, CollectorRegistry]]:
    registry = CollectorRegistry()
    server = grpc.aio.server()
    calls = ServerCalls(GrpcServerMetrics.create(registry))
    servicer = FailingRecords()  # type: ignore[abstract]
    records_pb2_grpc.add_RecordsServiceServicer_to_server(servicer, calls.registering(server))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    client = open_channel(f"127.0.0.1:{port}", default_timeout=5)
    yield client, registry
    await client.close()
    await server.stop(0)


async def _call(channel: grpc.aio.Channel, record_id: str) -> records_pb2.RecordResponse:
    stub = records_pb2_grpc.RecordsServiceStub(channel)
    response: records_pb2.RecordResponse = await stub.GetRecord(
        records_pb2.GetRecordRequest(id=record_id)
    )
    return response


async def test_success_passes_through(channel: tuple[grpc.aio.Channel, CollectorRegistry]) -> None:
    response = await _call(channel[0], "fine")
    assert response.record_json == b'{"id": "ok"}'


async def test_invalid_argument_keeps_field_and_reason(
    channel: tuple[grpc.aio.Channel, CollectorRegistry],
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await _call(channel[0], "bad")
    error = from_rpc_error(caught.value)
    assert isinstance(error, InvalidArgument)
    assert error.field == "id"
    assert error.message == "id must be a UUID"
    assert error.reason == common_pb2.ERROR_REASON_INVALID_INPUT


@pytest.mark.parametrize(
    ("record_id", "kind"), [("missing", NotFound), ("forbidden", PermissionDenied)]
)
async def test_status_codes_survive(
    channel: tuple[grpc.aio.Channel, CollectorRegistry], record_id: str, kind: type
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await _call(channel[0], record_id)
    assert isinstance(from_rpc_error(caught.value), kind)


@pytest.mark.parametrize(
    ("record_id", "message"),
    [("nul", "must not contain the NUL character"), ("overflow", "a number is out of range")],
)
async def test_database_value_errors_are_the_clients_invalid_argument(
    channel: tuple[grpc.aio.Channel, CollectorRegistry], record_id: str, message: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await _call(channel[0], record_id)
    error = from_rpc_error(caught.value)
    assert isinstance(error, InvalidArgument)
    assert message in error.message
    assert "overflow" not in error.message  # never the driver's text
    assert "0x00" not in error.message


async def test_unexpected_errors_become_internal_without_leaking(
    channel: tuple[grpc.aio.Channel, CollectorRegistry],
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await _call(channel[0], "crash")
    assert caught.value.code() == grpc.StatusCode.INTERNAL
    assert "secret" not in (caught.value.details() or "")
    assert from_rpc_error(caught.value).message == "internal server error"


async def test_unimplemented_methods_answer_unimplemented(
    channel: tuple[grpc.aio.Channel, CollectorRegistry],
) -> None:
    stub = records_pb2_grpc.RecordsServiceStub(channel[0])
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.ListRecords(records_pb2.ListRecordsRequest())
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_a_method_no_service_has_answers_unimplemented(
    channel: tuple[grpc.aio.Channel, CollectorRegistry],
) -> None:
    """Methods reach the servicers through generic handlers (none is registered with the
    server): a path none of them serves is still refused as gRPC refuses it."""
    unknown = channel[0].unary_unary(
        "/crm.records.v1.RecordsService/NoSuchMethod",
        request_serializer=records_pb2.GetRecordRequest.SerializeToString,
        response_deserializer=records_pb2.RecordResponse.FromString,
    )
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await unknown(records_pb2.GetRecordRequest(id="fine"))
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_calls_are_counted_by_method_and_code(
    channel: tuple[grpc.aio.Channel, CollectorRegistry],
) -> None:
    client, registry = channel
    await _call(client, "fine")
    with pytest.raises(grpc.aio.AioRpcError):
        await _call(client, "missing")
    labels = {"grpc_service": "crm.records.v1.RecordsService", "grpc_method": "GetRecord"}

    def handled(code: str) -> float | None:
        return registry.get_sample_value("grpc_server_handled_total", {**labels, "grpc_code": code})

    # The server counts a call after its answer is sent: under load the client can be faster.
    for _ in range(100):
        if handled("OK") is not None and handled("NOT_FOUND") is not None:
            break
        await asyncio.sleep(0.02)
    assert handled("OK") == 1
    assert handled("NOT_FOUND") == 1


async def test_client_deadline_applies_by_default() -> None:
    server = grpc.aio.server()

    class Slow(records_pb2_grpc.RecordsServiceServicer):
        async def GetRecord(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
            await asyncio.sleep(5)
            return records_pb2.RecordResponse()

    records_pb2_grpc.add_RecordsServiceServicer_to_server(Slow(), server)  # type: ignore[abstract]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    client = open_channel(f"127.0.0.1:{port}", default_timeout=0.2)
    try:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await _call(client, "x")
        assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    finally:
        await client.close()
        await server.stop(0)


async def test_a_restarted_peer_is_reached_again_within_seconds() -> None:
    """After the peer was down long enough for several failed reconnects, a call made soon after
    it is back succeeds (the channel's reconnect backoff stays short)."""
    port = free_port()
    client = open_channel(f"127.0.0.1:{port}", default_timeout=1)
    try:
        down_until = time.monotonic() + 12  # long enough for gRPC's default backoff to reach ~7 s
        while time.monotonic() < down_until:  # peer down: calls fail, the channel backs off
            with pytest.raises(grpc.aio.AioRpcError):
                await _call(client, "fine")
            await asyncio.sleep(0.5)
        server = grpc.aio.server()
        records_pb2_grpc.add_RecordsServiceServicer_to_server(FailingRecords(), server)  # type: ignore[abstract]
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        try:
            started = time.monotonic()
            while True:
                try:
                    await _call(client, "fine")
                    break
                except grpc.aio.AioRpcError:
                    assert time.monotonic() - started < 2.5, "peer still unreachable after 2.5 s"
                    await asyncio.sleep(0.1)
        finally:
            await server.stop(0)
    finally:
        await client.close()
