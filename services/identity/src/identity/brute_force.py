"""Attempt limits (brute force, sign-up, password-reset mail), counted in Redis.

An attempt reserves a slot in every counter it belongs to (one atomic script: refuse if any
counter is full, else increment all). Password checks give the slot back when they succeed, so
only failures count; other callers keep it, so every attempt counts. Concurrent attempts cannot
overshoot a limit. While a counter is full its attempts are refused with 429 until its window
ends. Each counter's scope has its rule (limit and window).

If Redis is unreachable the same counters are kept in this process (`LocalCounters`), so the
limits still hold, per identity replica; the outage is logged once (crmkit.outages).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from redis.asyncio import Redis
from redis.exceptions import RedisError

from crmkit.errors import ResourceExhausted
from crmkit.outages import OutageLog

if TYPE_CHECKING:
    from identity.settings import IdentitySettings

log = logging.getLogger("identity.brute_force")

_ACQUIRE = """
for index, key in ipairs(KEYS) do
  local limit = tonumber(ARGV[index * 2 - 1])
  local window = tonumber(ARGV[index * 2])
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
for index, key in ipairs(KEYS) do
  if redis.call('INCR', key) == 1 then
    redis.call('EXPIRE', key, tonumber(ARGV[index * 2]))
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
class Rule:
    limit: int
    window: int  # seconds


@dataclass(frozen=True)
class Attempt:
    keys: tuple[str, ...]
    local: bool = False  # counted in this process (Redis was unreachable)


def attempt_rules(settings: IdentitySettings) -> tuple[Rule, dict[str, Rule]]:
    """The default rule and the rules of the scopes that differ (see the settings)."""
    window = settings.AUTH_ATTEMPT_WINDOW
    signup = settings.SIGNUP_WINDOW
    return Rule(settings.AUTH_MAX_FAILED_ATTEMPTS, window), {
        "ip": Rule(settings.AUTH_MAX_FAILED_ATTEMPTS_PER_IP, window),
        "signup-ip": Rule(settings.SIGNUP_MAX_PER_IP, signup),
        "signup": Rule(settings.SIGNUP_MAX_TOTAL, signup),
    }


class LocalCounters:
    """The counters of the Redis script, in this process: used while Redis is unreachable.
    Single-threaded asyncio makes check-and-increment atomic (no await in between)."""

    MAX_KEYS = 100_000  # bounds memory under a flood of distinct IPs or emails

    def __init__(self) -> None:
        self._counts: dict[str, tuple[int, float]] = {}  # key -> (count, window end)

    def acquire(self, keys: Sequence[str], rules: Sequence[Rule], now: float) -> int:
        """0 when a slot was reserved in every counter, else seconds until one frees up."""
        for key, rule in zip(keys, rules, strict=True):
            count, ends = self._counts.get(key, (0, 0.0))
            if ends > now and count >= rule.limit:
                return max(1, round(ends - now))
        if len(self._counts) >= self.MAX_KEYS:
            self._counts = {k: v for k, v in self._counts.items() if v[1] > now}
        for key, rule in zip(keys, rules, strict=True):
            count, ends = self._counts.get(key, (0, 0.0))
            if ends <= now:
                count, ends = 0, now + rule.window
            self._counts[key] = (count + 1, ends)
        return 0

    def release(self, keys: Sequence[str]) -> None:
        for key in keys:
            count, ends = self._counts.get(key, (0, 0.0))
            if count > 0:
                self._counts[key] = (count - 1, ends)


class AttemptLimiter:
    def __init__(
        self, redis: Redis, default: Rule, rules: Mapping[str, Rule] | None = None
    ) -> None:
        self._redis = redis
        self._default = default
        self._rules = dict(rules or {})
        self._acquire = redis.register_script(_ACQUIRE)
        self._release = redis.register_script(_RELEASE)
        self._local = LocalCounters()
        self._outage = OutageLog("redis (attempt limits counted in this process)", log)

    @staticmethod
    def key(scope: str, value: str) -> str:
        return f"crm:auth:attempts:{scope}:{value}"

    async def begin(self, counters: Sequence[tuple[str, str]]) -> Attempt:
        """Reserve an attempt in each (scope, value) counter, or ResourceExhausted."""
        chosen = [(scope, value) for scope, value in counters if value]
        if not chosen:
            return Attempt(())
        keys = tuple(self.key(scope, value) for scope, value in chosen)
        rules = [self._rules.get(scope, self._default) for scope, _ in chosen]
        local = False
        try:
            args = [number for rule in rules for number in (rule.limit, rule.window)]
            wait = int(await self._acquire(keys=list(keys), args=args))
            self._outage.recovered()
        except RedisError as exc:
            self._outage.failed(exc)
            wait = self._local.acquire(keys, rules, time.monotonic())
            local = True
        if wait > 0:
            raise ResourceExhausted(
                f"too many attempts; try again in {wait} seconds",
                metadata={"retryAfter": str(wait)},
            )
        return Attempt(keys, local)

    async def succeeded(self, attempt: Attempt) -> None:
        """The attempt was right: it does not count as a failure."""
        if not attempt.keys:
            return
        if attempt.local:
            self._local.release(attempt.keys)
            return
        try:
            await self._release(keys=list(attempt.keys), args=[])
        except RedisError as exc:
            self._outage.failed(exc)
