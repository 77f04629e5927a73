"""What request handlers need of the rate limiter, apart from the limiter itself (so that
gateway.state and gateway.auth.verify can both name it without importing each other)."""

from __future__ import annotations

from typing import Protocol

from crm.common.v1 import common_pb2
from gateway.ratelimit.limiter import Counted
from gateway.ratelimit.window import Decision


class RateLimit(Protocol):
    """What handlers need of the rate limiter (gateway.ratelimit.limiter.RateLimiter)."""

    async def check(self, principal: common_pb2.Principal, calls: int = 1) -> Decision | None: ...

    async def read_counting(
        self, entry_key: str, credential_id: str
    ) -> tuple[bytes | None, Counted | None]: ...

    def remember(self, credential_id: str, principal: common_pb2.Principal) -> None: ...

    async def settle(
        self, held: Counted, principal: common_pb2.Principal, calls: int
    ) -> Decision | None: ...

    async def undo(self, held: Counted) -> None: ...
