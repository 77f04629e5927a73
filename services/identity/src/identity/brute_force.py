"""Brute-force limits: failed attempts per client IP and per account, counted in Redis.

An attempt reserves a slot in every counter it belongs to (one atomic script: refuse if any
counter is full, else increment all), and gives it back when it succeeds, so only failures
count and concurrent guesses cannot overshoot the limit. While a counter is full every attempt
is refused with 429, even a right password, until its window ends. If Redis is unreachable the
limits are skipped (logged): logging in stays possible.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from redis.asyncio import Redis
from redis.exceptions import RedisError

from crmkit.errors import ResourceExhausted

log = logging.getLogger("identity.brute_force")

_ACQUIRE = """
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
for _, key in ipairs(KEYS) do
  local count = tonumber(redis.call('GET', key) or '0')
  if count >= limit then
    local ttl = redis.call('TTL', key)
    if ttl < 0 then
      redis.call('EXPIRE', key, window)
      ttl = window
    end
    return ttl
  end
end
for _, key in ipairs(KEYS) do
  if redis.call('INCR', key) == 1 then
    redis.call('EXPIRE', key, window)
  end
end
return 0
"""

_RELEASE = """
for _, key in ipairs(KEYS) do
  local count = tonumber(redis.call('GET', key) or '0')
  if count > 0 then
    redis.call('DECR', key)
  end
end
return 0
"""


@dataclass(frozen=True)
class Attempt:
    keys: tuple[str, ...]


class AttemptLimiter:
    def __init__(self, redis: Redis, max_failures: int, window_seconds: int) -> None:
        self._redis = redis
        self._max = max_failures
        self._window = window_seconds
        self._acquire = redis.register_script(_ACQUIRE)
        self._release = redis.register_script(_RELEASE)

    @staticmethod
    def key(scope: str, value: str) -> str:
        return f"crm:auth:attempts:{scope}:{value}"

    async def begin(self, counters: Sequence[tuple[str, str]]) -> Attempt:
        """Reserve an attempt in each (scope, value) counter, or ResourceExhausted."""
        keys = tuple(self.key(scope, value) for scope, value in counters if value)
        if not keys:
            return Attempt(())
        try:
            wait = int(await self._acquire(keys=list(keys), args=[self._max, self._window]))
        except RedisError as exc:
            log.warning("brute-force limits skipped: redis unavailable", extra={"error": str(exc)})
            return Attempt(())
        if wait > 0:
            raise ResourceExhausted(
                f"too many failed attempts; try again in {wait} seconds",
                metadata={"retryAfter": str(wait)},
            )
        return Attempt(keys)

    async def succeeded(self, attempt: Attempt) -> None:
        """The attempt was right: it does not count as a failure."""
        if not attempt.keys:
            return
        try:
            await self._release(keys=list(attempt.keys), args=[])
        except RedisError as exc:
            log.warning("brute-force release failed", extra={"error": str(exc)})
