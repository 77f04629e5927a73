"""The client side of a unary call through crmkit's channel, over a real loopback gRPC server,
answered as grpc.aio's own channel answers it: the response, the server's status with its
trailing metadata, the metadata sent, and what cancelling the caller or closing the channel
does to a call in flight."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest

from crm.records.v1 import records_pb2, records_pb2_grpc
from crmkit.grpc_client import open_channel


@dataclass
class Seen:
    metadata: list[tuple[str, Any]] = field(default_factory=list)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    started: asyncio.Event = field(default_factory=asyncio.Event)


class Peer(records_pb2_grpc.RecordsServiceServicer):
    def __init__(self, seen: Seen) -> None:
        self.seen = seen

    async def GetRecord(  # noqa: N802
        self, request: records_pb2.GetRecordRequest, context: grpc.aio.ServicerContext
    ) -> records_pb2.RecordResponse:
        self.seen.metadata = [(item.key, item.value) for item in context.invocation_metadata()]
        if request.id == "slow":
            self.seen.started.set()
            try:
                await asyncio.sleep(5)
            except asyncio.CancelledError:
                self.seen.cancelled.set()
                raise
        if request.id == "refused":
            context.set_trailing_metadata((("why-bin", b"\x00\x01"), ("hint", "later")))
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "not now")
        return records_pb2.RecordResponse(record_json=b'{"id": "%s"}' % request.id.encode())


@pytest.fixture
async def peer() -> AsyncIterator[tuple[str, Seen]]:
    seen = Seen()
    server = grpc.aio.server()
    records_pb2_grpc.add_RecordsServiceServicer_to_server(Peer(seen), server)  # type: ignore[abstract]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield f"127.0.0.1:{port}", seen
    await server.stop(0)


def _get(channel: Any, record_id: str, **options: Any) -> Any:
    stub = records_pb2_grpc.RecordsServiceStub(channel)
    return stub.GetRecord(records_pb2.GetRecordRequest(id=record_id), **options)


async def test_response_and_metadata_as_grpc_aio(peer: tuple[str, Seen]) -> None:
    address, seen = peer
    sent = [("x-one", "1"), ("x-two-bin", b"\xff\x00")]
    answers = []
    for channel in (open_channel(address, default_timeout=5), grpc.aio.insecure_channel(address)):
        try:
            response = await _get(channel, "fine", metadata=sent)
            answers.append((response, [item for item in seen.metadata if item[0].startswith("x-")]))
        finally:
            await channel.close()
    ours, theirs = answers
    assert ours == theirs
    assert ours[0].record_json == b'{"id": "fine"}'
    assert ours[1] == sent


async def test_a_refused_call_raises_the_same_error_as_grpc_aio(peer: tuple[str, Seen]) -> None:
    address, _ = peer
    errors = []
    for channel in (open_channel(address, default_timeout=5), grpc.aio.insecure_channel(address)):
        try:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await _get(channel, "refused")
            errors.append(caught.value)
        finally:
            await channel.close()
    ours, theirs = errors
    assert type(ours) is type(theirs)
    assert ours.code() == theirs.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert ours.details() == theirs.details() == "not now"
    assert ours.trailing_metadata() == theirs.trailing_metadata()
    assert ("why-bin", b"\x00\x01") in tuple(ours.trailing_metadata())


async def test_cancelling_the_caller_cancels_the_call_on_the_peer(peer: tuple[str, Seen]) -> None:
    address, seen = peer
    channel = open_channel(address, default_timeout=5)
    try:
        waiting = asyncio.ensure_future(_get(channel, "slow"))
        await asyncio.wait_for(seen.started.wait(), 5)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await asyncio.wait_for(seen.cancelled.wait(), 2)
        assert (await _get(channel, "after")).record_json == b'{"id": "after"}'
    finally:
        await channel.close()


async def test_closing_the_channel_ends_a_call_in_flight(peer: tuple[str, Seen]) -> None:
    """As with grpc.aio: the caller sees CancelledError at once, the peer sees the cancel."""
    address, seen = peer
    channel = open_channel(address, default_timeout=30)
    waiting = asyncio.ensure_future(_get(channel, "slow"))
    await asyncio.wait_for(seen.started.wait(), 5)
    await asyncio.wait_for(channel.close(), 2)
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(waiting, 2)
    await asyncio.wait_for(seen.cancelled.wait(), 2)


async def test_closing_with_grace_lets_a_call_in_flight_finish(peer: tuple[str, Seen]) -> None:
    address, seen = peer
    channel = open_channel(address, default_timeout=30)
    waiting = asyncio.ensure_future(_get(channel, "fine-later"))
    await asyncio.sleep(0)  # the call is sent
    await channel.close(grace=5)
    assert (await waiting).record_json == b'{"id": "fine-later"}'
    assert not seen.cancelled.is_set()


async def test_unary_methods_of_a_plain_channel_take_the_lean_call(peer: tuple[str, Seen]) -> None:
    address, _ = peer
    channel = open_channel(address, default_timeout=5)
    try:
        stub = records_pb2_grpc.RecordsServiceStub(channel)
        assert stub.GetRecord._lean is not None
        intercepted = open_channel(address, default_timeout=5)
        intercepted.inner._unary_unary_interceptors.append(object())
        try:
            other = records_pb2_grpc.RecordsServiceStub(intercepted)
            assert other.GetRecord._lean is None
        finally:
            await intercepted.close()
    finally:
        await channel.close()
