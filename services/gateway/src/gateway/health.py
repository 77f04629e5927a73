"""GET /healthz: each upstream's gRPC health plus database, Redis and NATS reachability.

GET /livez only proves that this process answers HTTP: the liveness probe, which must not
restart a healthy gateway because a dependency is down (that is /healthz's, readiness's, job).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import orjson
from grpc_health.v1 import health_pb2, health_pb2_grpc
from starlette.requests import Request
from starlette.responses import Response

from crmkit.db import ping
from gateway.state import GatewayState, gateway_state

Check = Callable[[], Awaitable[None]]


async def _timed(name: str, check: Check, timeout: float) -> tuple[str, dict[str, Any]]:
    started = time.perf_counter()
    try:
        await asyncio.wait_for(check(), timeout)
    except grpc.aio.AioRpcError as exc:
        return name, {"status": "down", "error": f"{exc.code().name}: {exc.details()}"[:200]}
    except Exception as exc:  # any failure means "not healthy"; the reason is reported
        reason = "timed out" if isinstance(exc, TimeoutError) else (str(exc) or type(exc).__name__)
        return name, {"status": "down", "error": reason.splitlines()[0][:200]}
    return name, {"status": "up", "latencyMs": round((time.perf_counter() - started) * 1000, 2)}


def _checks(state: GatewayState) -> dict[str, Check]:
    checks: dict[str, Check] = {}
    for name, channel in state.upstreams.channels.items():
        stub = health_pb2_grpc.HealthStub(channel)

        async def grpc_check(stub: health_pb2_grpc.HealthStub = stub) -> None:
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=""))
            if reply.status != health_pb2.HealthCheckResponse.SERVING:
                raise RuntimeError(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))

        checks[name] = grpc_check

    database = state.database
    if database is not None:

        async def database_check() -> None:
            await ping(database)

        checks["database"] = database_check

    async def redis_check() -> None:
        await state.redis.ping()

    async def nats_check() -> None:
        if not state.nats.is_connected:
            raise RuntimeError("not connected")
        await state.nats.flush(timeout=max(1, round(state.settings.HEALTH_CHECK_TIMEOUT)))

    checks["redis"] = redis_check
    checks["nats"] = nats_check
    return checks


async def healthz(request: Request) -> Response:
    state = gateway_state(request)
    timeout = state.settings.HEALTH_CHECK_TIMEOUT
    results = dict(
        await asyncio.gather(*(_timed(n, c, timeout) for n, c in _checks(state).items()))
    )
    failing = sorted(name for name, result in results.items() if result["status"] != "up")
    body = {"status": "ok" if not failing else "unavailable", "failing": failing, "checks": results}
    return Response(
        orjson.dumps(body), status_code=503 if failing else 200, media_type="application/json"
    )


LIVE_BODY = orjson.dumps({"status": "ok"})


async def livez(request: Request) -> Response:
    return Response(LIVE_BODY, media_type="application/json")
