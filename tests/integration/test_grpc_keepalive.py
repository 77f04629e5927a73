"""gRPC keepalive between our clients and servers (crmkit.grpc_client / grpc_server): a channel
left idle for several keepalive intervals keeps its connection. Clients ping every
GRPC_KEEPALIVE_TIME even without calls; a server left at gRPC's default minimum ping interval
(5 minutes) counts those pings as abuse and drops the connection with GOAWAY `too_many_pings`,
so every idle channel was torn down and re-dialled. Shortened to 0.5 s here."""

from __future__ import annotations

import asyncio
import contextlib

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from crmkit.grpc_client import open_channel
from crmkit.grpc_server import server_options
from crmkit.settings import GrpcServiceSettings
from crmstack.ports import free_port

KEEPALIVE = 0.5  # seconds


async def test_an_idle_channel_keeps_its_connection_past_many_keepalive_intervals() -> None:
    settings = GrpcServiceSettings(APP_SECRET="k" * 32, GRPC_KEEPALIVE_TIME=KEEPALIVE)
    server = grpc.aio.server(options=server_options(settings))
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = free_port()
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    channel = open_channel(f"127.0.0.1:{port}", 5.0, KEEPALIVE)
    try:
        stub = health_pb2_grpc.HealthStub(channel)
        answer = await stub.Check(health_pb2.HealthCheckRequest())
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
        assert channel.get_state() == grpc.ChannelConnectivity.READY
        # Idle for eight intervals: a GOAWAY would move the channel out of READY.
        changed = asyncio.ensure_future(
            channel.wait_for_state_change(grpc.ChannelConnectivity.READY)
        )
        done, _ = await asyncio.wait({changed}, timeout=8 * KEEPALIVE)
        assert not done, f"the idle channel left READY: {channel.get_state()}"
        changed.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await changed
        answer = await stub.Check(health_pb2.HealthCheckRequest())
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        await channel.close()
        await server.stop(0)
