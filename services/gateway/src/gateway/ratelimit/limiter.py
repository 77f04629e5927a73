"""The sliding-window check: one Lua script, one Redis round trip, exact across replicas.

Each counter is a sorted set of the calls admitted in the last window, scored by the time they
were admitted on Redis's own clock (TIME inside the script: every replica reads the same clock,
so skew between gateway hosts cannot stretch or shrink anyone's window). The script drops
entries older than the window, counts the rest, admits the call when under the limit, and
answers the remaining slots and when the oldest entry leaves. Refused calls are not recorded:
a client that keeps retrying while blocked gets a slot as soon as one frees.

Redis unreachable: the call is admitted (fail open; an outage of the cache must not become an
outage of the API), counted in `gateway_rate_limit_failures_total`, and logged at most once a
minute per process.
"""

from __future__ import annotations

import itertools
import logging
import secrets
import time
from typing import cast

from redis.exceptions import RedisError

from crm.common.v1 import common_pb2
from gateway.metrics import GatewayMetrics
from gateway.ratelimit.window import Decision, counter_key
from gateway.redis_connection import LuaScript, PipelinedRedis

log = logging.getLogger("gateway.ratelimit")

FAILURE_LOG_INTERVAL = 60.0  # seconds between two "limiter unavailable" warnings

# KEYS[1] the counter; ARGV: limit, window (microseconds), a member unique to this call, and
# how many calls it counts as (each gets its own member: `<member>:<i>`).
# Scores are whole microseconds since the epoch: below 2^53, so exact in Lua's doubles.
SLIDING_WINDOW = LuaScript("""
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
local calls = tonumber(ARGV[4])
local count = redis.call('ZCARD', KEYS[1])
local allowed = 0
if count + calls <= limit then
  for i = 1, calls do
    redis.call('ZADD', KEYS[1], now, ARGV[3] .. ':' .. i)
  end
  redis.call('PEXPIRE', KEYS[1], math.ceil(window / 1000))
  count = count + calls
  allowed = 1
end
local reset = now + window
local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if oldest[2] then
  reset = tonumber(oldest[2]) + window
end
local remaining = limit - count
if remaining < 0 then
  remaining = 0
end
return {allowed, remaining, reset, now}
""")


class RateLimiter:
    """Built once per process in the app's lifespan, on the gateway's Redis connection."""

    def __init__(
        self,
        redis: PipelinedRedis,
        *,
        limit: int,
        window_ms: int,
        metrics: GatewayMetrics | None = None,
    ) -> None:
        self.limit = limit
        self.window_ms = window_ms
        self._redis = redis
        self._metrics = metrics
        # Members must be unique per call: this process's random prefix and a sequence number.
        self._prefix = secrets.token_hex(6)
        self._sequence = itertools.count()
        self._last_warning = -FAILURE_LOG_INTERVAL

    async def check(self, principal: common_pb2.Principal, calls: int = 1) -> Decision | None:
        """Admit or refuse a request of `principal` counting as `calls` calls (all or none);
        None when Redis could not say (admitted)."""
        member = f"{self._prefix}:{next(self._sequence)}"
        try:
            raw = await self._redis.run_script(
                SLIDING_WINDOW,
                keys=[counter_key(principal)],
                args=[self.limit, self.window_ms * 1000, member, calls],
            )
        except RedisError as exc:
            self._failed(exc)
            return None
        allowed, remaining, reset_at_us, now_us = cast(list[int], raw)
        decision = Decision(
            allowed=allowed == 1,
            limit=self.limit,
            remaining=remaining,
            reset_at_us=reset_at_us,
            now_us=now_us,
        )
        if not decision.allowed and self._metrics is not None:
            self._metrics.rate_limit_rejections.inc()
        return decision

    def _failed(self, exc: RedisError) -> None:
        if self._metrics is not None:
            self._metrics.rate_limit_failures.inc()
        now = time.monotonic()
        if now - self._last_warning >= FAILURE_LOG_INTERVAL:
            self._last_warning = now
            log.warning(
                "rate limit not enforced: redis unreachable; admitting calls (fail open)",
                extra={"error": str(exc)},
            )
