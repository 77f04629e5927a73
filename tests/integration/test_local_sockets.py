"""On one host the launcher's processes talk over Unix sockets (crmstack.local_sockets): the
services reach the embedded PostgreSQL through its socket and each other's gRPC servers through
one socket per process, while the TCP ports stay open for tools and health checks."""

from __future__ import annotations

import asyncpg
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from crmstack.stack import GRPC_SERVICES, Stack


async def test_the_services_reach_the_embedded_postgres_through_its_socket(
    local_stack: Stack,
) -> None:
    infra = local_stack.infra
    assert infra is not None
    services_url = local_stack.env["DATABASE_URL"]
    if "postgres" not in infra.servers:  # DATABASE_URL named a server: used as given
        assert services_url == infra.database_url
        return
    assert services_url != infra.database_url  # people and tools are shown the TCP one
    connection = await asyncpg.connect(services_url)
    try:
        over_socket = await connection.fetchval("SELECT inet_server_addr() IS NULL")
        # The services name their connections (crmkit.db.create_pool); the tests' do not.
        counts = await connection.fetchrow(
            "SELECT count(*) FILTER (WHERE client_addr IS NOT NULL), "
            "count(*) FILTER (WHERE client_addr IS NULL) FROM pg_stat_activity "
            "WHERE backend_type = 'client backend' AND application_name <> ''"
        )
    finally:
        await connection.close()
    assert over_socket is True
    assert counts is not None
    by_tcp, by_socket = counts
    assert (by_tcp, by_socket > 0) == (0, True)
    tcp = await asyncpg.connect(infra.database_url)  # the URL `make run` prints still works
    try:
        assert await tcp.fetchval("SELECT inet_server_addr() IS NOT NULL") is True
    finally:
        await tcp.close()


def test_each_grpc_service_answers_on_its_socket_and_on_its_port(local_stack: Stack) -> None:
    for service in GRPC_SERVICES:
        address = local_stack.env[f"{service.upper()}_ADDR"]
        socket = local_stack.config.data_dir / "sockets" / f"{service}.sock"
        assert address == f"unix:{socket}"
        for target in (address, local_stack.grpc_address(service)):
            with grpc.insecure_channel(target) as channel:
                reply = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service=""), timeout=10
                )
            assert reply.status == health_pb2.HealthCheckResponse.SERVING, (service, target)
