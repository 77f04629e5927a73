"""The gateway's probes: what each says, and so which outage takes a gateway out of service.

- GET /livez: the process answers HTTP (liveness, startup). Nothing else: restarting a gateway
  never fixes a dependency.
- GET /readyz: what a request needs to be served, every upstream gRPC service and PostgreSQL;
  503 naming the failing parts otherwise (readiness: the Service's endpoints).
- GET /healthz: every part, including Redis and NATS, which requests survive without (rate
  limits and the credential cache fail open, events wait in the outbox): 200 `ok`, 200
  `degraded` naming them when only those fail, 503 `unavailable` when a readiness part fails.

Each check also sets `gateway_dependency_up`.
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
# What requests are served without (fail open); the rest is what readiness needs.
OPTIONAL = frozenset({"redis", "nats"})


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


def _checks(state: GatewayState, *, optional: bool) -> dict[str, Check]:
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

    if not optional:
        return checks

    async def redis_check() -> None:
        await state.redis.ping()

    async def nats_check() -> None:
        if not state.nats.is_connected:
            raise RuntimeError("not connected")
        await state.nats.flush(timeout=max(1, round(state.settings.HEALTH_CHECK_TIMEOUT)))

    checks["redis"] = redis_check
    checks["nats"] = nats_check
    return checks


async def _run(state: GatewayState, *, optional: bool) -> tuple[dict[str, Any], list[str]]:
    timeout = state.settings.HEALTH_CHECK_TIMEOUT
    checks = _checks(state, optional=optional)
    results = dict(await asyncio.gather(*(_timed(n, c, timeout) for n, c in checks.items())))
    up = state.metrics.dependency_up
    for name, result in results.items():
        up.labels(name).set(1 if result["status"] == "up" else 0)
    failing = sorted(name for name, result in results.items() if result["status"] != "up")
    return results, failing


def _json(body: dict[str, Any], status: int) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


async def healthz(request: Request) -> Response:
    results, failing = await _run(gateway_state(request), optional=True)
    if any(name not in OPTIONAL for name in failing):
        status, code = "unavailable", 503
    else:
        status, code = ("degraded" if failing else "ok"), 200
    return _json({"status": status, "failing": failing, "checks": results}, code)


async def readyz(request: Request) -> Response:
    results, failing = await _run(gateway_state(request), optional=False)
    body = {"status": "unavailable" if failing else "ok", "failing": failing, "checks": results}
    return _json(body, 503 if failing else 200)


LIVE_BODY = orjson.dumps({"status": "ok"})


async def livez(request: Request) -> Response:
    return Response(LIVE_BODY, media_type="application/json")
