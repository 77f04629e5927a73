"""The limiter with Redis unreachable (nothing listens on its port): calls are admitted, every
failure is counted, and the warning is logged once a minute, not once a call."""

from __future__ import annotations

import logging

import pytest

from crm.common.v1 import common_pb2
from crmstack.ports import free_port
from gateway.metrics import GatewayMetrics
from gateway.ratelimit.limiter import RateLimiter
from gateway.redis_connection import PipelinedRedis


async def test_unreachable_redis_admits_counts_and_logs_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = GatewayMetrics.create()
    redis = PipelinedRedis(f"redis://127.0.0.1:{free_port()}/0", timeout=1)
    limiter = RateLimiter(redis, limit=1, window_ms=60_000, metrics=metrics)
    principal = common_pb2.Principal(
        workspace_id="w", kind=common_pb2.PRINCIPAL_KIND_API_KEY, credential_id="k"
    )
    with caplog.at_level(logging.WARNING, logger="gateway.ratelimit"):
        decisions = [await limiter.check(principal) for _ in range(3)]
    await redis.close()
    assert decisions == [None, None, None]  # admitted although the limit is 1
    sample = metrics.registry.get_sample_value
    assert sample("gateway_rate_limit_failures_total") == 3
    assert sample("gateway_rate_limit_rejections_total") == 0
    warnings = [r for r in caplog.records if r.name == "gateway.ratelimit"]
    assert len(warnings) == 1
    assert "fail open" in warnings[0].getMessage()
