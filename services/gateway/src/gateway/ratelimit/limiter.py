"""The sliding-window check: one Lua script, one Redis round trip, exact across replicas.

Each counter is a sorted set of the calls admitted in the last window, scored by the time they
were admitted on Redis's own clock (TIME inside the script: every replica reads the same clock,
so skew between gateway hosts cannot stretch or shrink anyone's window). The script drops
entries older than the window, counts the rest, admits the call when under the limit, and
answers the remaining slots and when the oldest entry leaves. Refused calls are not recorded:
a client that keeps retrying while blocked gets a slot as soon as one frees.

One round trip per request, not two: an HTTP request's call is counted by the same script that
reads its credential's cache entry (ENTRY_AND_WINDOW), on the counter that credential was last
counted on (a credential's counter never changes). Its admission settles that count at no cost
when the principal's counter and number of calls match (always for REST; a GraphQL query, one
call), or replaces it in one check (a mutation of several fields); a credential then refused
(revoked, expired, wrong secret) has its count taken back before the 401 is answered. The first
call of a credential in a process, and any call whose entry is missing, are counted on their own
after the credential is resolved, as before.

Redis unreachable: the call is admitted (fail open; an outage of the cache must not become an
outage of the API), counted in `gateway_rate_limit_failures_total`, and logged at most once a
minute per process.
"""

from __future__ import annotations

import itertools
import logging
import secrets
import time
from dataclasses import dataclass
from typing import cast

from redis.exceptions import RedisError

from crm.common.v1 import common_pb2
from gateway.metrics import GatewayMetrics
from gateway.ratelimit.window import Decision, counter_key
from gateway.redis_connection import LuaScript, PipelinedRedis

log = logging.getLogger("gateway.ratelimit")

FAILURE_LOG_INTERVAL = 60.0  # seconds between two "limiter unavailable" warnings

# window(counter, limit, window in microseconds, member, calls, held): the check. Each call gets
# its own member `<member>:<i>`; the `held` members a request already holds (counted with its
# credential's entry, below) are removed first, so it then counts `calls` in all, or none.
# Scores are whole microseconds since the epoch: below 2^53, so exact in Lua's doubles.
_WINDOW = """
local function window(key, limit, window, member, calls, held)
  local clock = redis.call('TIME')
  local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
  for i = 1, held do
    redis.call('ZREM', key, member .. ':' .. i)
  end
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
  local count = redis.call('ZCARD', key)
  local allowed = 0
  if count + calls <= limit then
    for i = 1, calls do
      redis.call('ZADD', key, now, member .. ':' .. i)
    end
    redis.call('PEXPIRE', key, math.ceil(window / 1000))
    count = count + calls
    allowed = 1
  end
  local reset = now + window
  local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  if oldest[2] then
    reset = tonumber(oldest[2]) + window
  end
  local remaining = limit - count
  if remaining < 0 then
    remaining = 0
  end
  return {allowed, remaining, reset, now}
end
"""

# KEYS[1] the counter; ARGV: limit, window (microseconds), member, calls, held.
SLIDING_WINDOW = LuaScript(
    _WINDOW
    + "return window(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], "
    + "tonumber(ARGV[4]), tonumber(ARGV[5]))"
)

# KEYS[1] a credential's cache entry, KEYS[2] its counter; ARGV: limit, window, member. The
# entry and, when there is one, the check of one call: {entry, allowed, remaining, reset, now};
# {} (nothing counted) when there is none.
ENTRY_AND_WINDOW = LuaScript(
    _WINDOW
    + """
local entry = redis.call('GET', KEYS[1])
if not entry then
  return {}
end
local decision = window(KEYS[2], tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], 1, 0)
return {entry, decision[1], decision[2], decision[3], decision[4]}
"""
)

MAX_KNOWN_COUNTERS = 10_000  # credential id -> counter key, ~2 MB at most


@dataclass(frozen=True)
class Counted:
    """Calls of a request counted before its principal was known: in the round trip that read
    its credential's entry, on the counter that credential was last seen with. The request's
    admission settles them (RateLimiter.settle); a refused credential undoes them."""

    key: str
    member: str
    calls: int
    decision: Decision


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
        # The counter each credential's calls were last counted on (it never changes: workspace,
        # kind, user and client of a credential are fixed), so the next call of that credential
        # can be counted in the round trip that reads its cache entry (read_counting).
        self._counters: dict[str, str] = {}

    async def check(self, principal: common_pb2.Principal, calls: int = 1) -> Decision | None:
        """Admit or refuse a request of `principal` counting as `calls` calls (all or none);
        None when Redis could not say (admitted)."""
        return self._counted(await self._window(counter_key(principal), self._member(), calls))

    async def read_counting(
        self, entry_key: str, credential_id: str
    ) -> tuple[bytes | None, Counted | None]:
        """The credential's cache entry (None: a miss) and, when its counter is known and the
        entry exists, one call counted in the same round trip. RedisError is raised: the caller
        treats it as the entry's outage, and the admission then fails open as ever."""
        key = self._counters.get(credential_id)
        if key is None:
            return await self._redis.get(entry_key), None
        member = self._member()
        raw = await self._redis.run_script(
            ENTRY_AND_WINDOW,
            keys=[entry_key, key],
            args=[self.limit, self.window_ms * 1000, member],
        )
        if not isinstance(raw, list) or not raw:
            return None, None
        entry, *decision = raw
        counted = Counted(key, member, 1, self._decision(cast(list[int], decision)))
        return (entry if isinstance(entry, bytes) else None), counted

    def remember(self, credential_id: str, principal: common_pb2.Principal) -> None:
        """The counter of a credential just accepted, for its next call (read_counting)."""
        if credential_id in self._counters:
            return
        if len(self._counters) >= MAX_KNOWN_COUNTERS:
            self._counters.clear()
        self._counters[credential_id] = counter_key(principal)

    async def settle(
        self, held: Counted, principal: common_pb2.Principal, calls: int
    ) -> Decision | None:
        """The decision on a request that holds `held` and counts as `calls` calls: the held
        one as it is when it counted the same calls on the principal's counter; otherwise one
        check that replaces them (or, on another counter, an undo and a check)."""
        key = counter_key(principal)
        if key != held.key:
            await self.undo(held)
            return await self.check(principal, calls)
        if calls == held.calls:
            return self._counted(held.decision)
        replaced = held.calls if held.decision.allowed else 0
        return self._counted(await self._window(key, held.member, calls, replaced))

    async def undo(self, held: Counted) -> None:
        """Takes back calls counted for a request that is then refused before its admission
        (its credential revoked, expired or wrong)."""
        if not held.decision.allowed:
            return  # nothing was recorded
        members = [f"{held.member}:{i}" for i in range(1, held.calls + 1)]
        try:
            await self._redis.execute("ZREM", held.key, *members)
        except RedisError as exc:
            self._failed(exc)

    def _member(self) -> str:
        return f"{self._prefix}:{next(self._sequence)}"

    async def _window(self, key: str, member: str, calls: int, held: int = 0) -> Decision | None:
        try:
            raw = await self._redis.run_script(
                SLIDING_WINDOW,
                keys=[key],
                args=[self.limit, self.window_ms * 1000, member, calls, held],
            )
        except RedisError as exc:
            self._failed(exc)
            return None
        return self._decision(cast(list[int], raw))

    def _decision(self, raw: list[int]) -> Decision:
        allowed, remaining, reset_at_us, now_us = raw
        return Decision(
            allowed=allowed == 1,
            limit=self.limit,
            remaining=remaining,
            reset_at_us=reset_at_us,
            now_us=now_us,
        )

    def _counted(self, decision: Decision | None) -> Decision | None:
        """The decision a request is answered with, its refusal counted."""
        if decision is not None and not decision.allowed and self._metrics is not None:
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
