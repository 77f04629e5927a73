"""The one way every gRPC service starts: `await run_service(...)` from its `serve()`.

Builds the aio server, adds the servicers (each method handler wrapped by
crmkit.server_calls.ServerCalls), the standard health service and reflection (names from the
proto descriptors), all as generic handlers (crmkit.server_calls.Registration), and the
multiplexed stream over all of them (crmkit.multiplex_server), serves /metrics on its own port,
marks SERVING after start, and on SIGTERM/SIGINT goes NOT_SERVING, drains and stops.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2_grpc
from prometheus_client import CollectorRegistry

from crmkit.grpc_client import channel_options
from crmkit.heap import tune_after_startup
from crmkit.metrics import GrpcServerMetrics, start_metrics_server
from crmkit.multiplex_server import Multiplexer, resolver
from crmkit.server_calls import Registration, ServerCalls
from crmkit.settings import GrpcServiceSettings

log = logging.getLogger("crmkit.server")


@dataclass(frozen=True)
class ServicerBinding:
    """A servicer, the generated function that adds it, and its full service name."""

    servicer: Any
    add_to_server: Callable[[Any, Any], None]  # a generated add_*Servicer_to_server
    service_name: str


def server_options(settings: GrpcServiceSettings) -> list[tuple[str, int | str]]:
    """Channel options of the server. Connections get GOAWAY after GRPC_MAX_CONNECTION_AGE:
    clients then resolve the service's name again, so replicas added since (a scale-up behind a
    headless Service) receive calls too. Calls in flight run to their end, without a grace
    limit (gRPC's default): a bounded grace cut calls longer than it with UNAVAILABLE, such as
    a data-model change rewriting a large table; each call's own deadline bounds it. Clients'
    keepalive pings (every GRPC_KEEPALIVE_TIME, idle or not) are accepted down to half that
    interval: gRPC's default minimum (5 min) would answer them with GOAWAY `too_many_pings`."""
    age_ms = settings.GRPC_MAX_CONNECTION_AGE * 1000
    keepalive_ms = round(settings.GRPC_KEEPALIVE_TIME * 1000)
    return [
        *channel_options(settings.GRPC_KEEPALIVE_TIME),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", keepalive_ms // 2),
        ("grpc.http2.min_ping_interval_without_data_ms", keepalive_ms // 2),
        ("grpc.max_connection_age_ms", age_ms),
    ]


@dataclass
class ServiceRuntime:
    """What a service gives the runtime: its servicers and its background work."""

    bindings: Sequence[ServicerBinding]
    background: Sequence[Callable[[], Coroutine[Any, Any, None]]] = field(default_factory=list)
    on_shutdown: Sequence[Callable[[], Coroutine[Any, Any, None]]] = field(default_factory=list)


async def run_service(
    settings: GrpcServiceSettings,
    registry: CollectorRegistry,
    runtime: ServiceRuntime,
    *,
    ready: asyncio.Event | None = None,
) -> None:
    """Serve until SIGTERM or SIGINT, then shut down gracefully."""
    server = grpc.aio.server(
        options=server_options(settings),
        maximum_concurrent_rpcs=settings.GRPC_MAX_WORKERS_CONCURRENCY,
    )
    served: list[grpc.GenericRpcHandler] = []
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(
        health_servicer, Registration(server, served=served)
    )
    calls = ServerCalls(GrpcServerMetrics.create(registry))
    for binding in runtime.bindings:
        binding.add_to_server(binding.servicer, calls.registering(server, served))
    multiplexer = Multiplexer(
        resolver(served),
        settings.GRPC_MAX_CONNECTION_AGE,
        concurrency=settings.GRPC_MAX_WORKERS_CONCURRENCY,
    )
    server.add_generic_rpc_handlers((multiplexer.handler(),))
    names = [binding.service_name for binding in runtime.bindings]
    reflected = [
        *names,
        health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
        reflection.SERVICE_NAME,
    ]
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(
        reflection.aio.ReflectionServicer(reflected), Registration(server)
    )
    addresses = [f"{settings.GRPC_HOST}:{settings.GRPC_PORT}"]
    if settings.GRPC_UNIX_SOCKET:
        addresses.append(f"unix:{settings.GRPC_UNIX_SOCKET}")
    for address in addresses:
        if server.add_insecure_port(address) == 0:
            raise SystemExit(f"cannot listen on {address}: in use or unavailable")
    metrics_port = start_metrics_server(registry, settings.METRICS_HOST, settings.METRICS_PORT)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    tune_after_startup()
    await server.start()
    tasks = [
        asyncio.create_task(job(), name=getattr(job, "__name__", "background"))
        for job in runtime.background
    ]
    for name in ("", *names):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    log.info("serving", extra={"grpc_address": address, "metrics_port": metrics_port})
    if ready is not None:
        ready.set()

    stopped_by = asyncio.create_task(stop.wait())
    watched = [stopped_by, *tasks]
    done, _ = await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
    failed = [task for task in done if task is not stopped_by and task.exception() is not None]
    for task in failed:
        log.error("background task failed", exc_info=task.exception())

    log.info("shutting down", extra={"grace_seconds": settings.SHUTDOWN_GRACE_SECONDS})
    await health_servicer.enter_graceful_shutdown()
    multiplexer.drain()
    await server.stop(settings.SHUTDOWN_GRACE_SECONDS)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for hook in runtime.on_shutdown:
        await hook()
    stopped_by.cancel()
    log.info("stopped")
    if failed:
        raise SystemExit(1)


def service_name(module_descriptor: Any, service: str) -> str:
    """Full name of `service` in a generated *_pb2 module, e.g. crm.records.v1.RecordsService."""
    return str(module_descriptor.DESCRIPTOR.services_by_name[service].full_name)
