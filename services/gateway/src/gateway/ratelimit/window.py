"""Pure parts of the rate limit: whose counter a call lands in, and what the caller is told."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime

from crm.common.v1 import common_pb2
from crmkit.errors import ResourceExhausted

KEY_PREFIX = "crm:ratelimit:"
MICROS = 1_000_000


@dataclass(frozen=True)
class Decision:
    """One check's answer. Times are microseconds on Redis's clock (the one clock every
    gateway replica shares)."""

    allowed: bool
    limit: int
    remaining: int
    reset_at_us: int  # when the oldest call in the window leaves it: the next slot frees
    now_us: int

    @property
    def reset_epoch_seconds(self) -> int:
        return math.ceil(self.reset_at_us / MICROS)

    @property
    def retry_after_seconds(self) -> int:
        """Whole seconds to wait before a retry can succeed (at least 1)."""
        return max(1, math.ceil((self.reset_at_us - self.now_us) / MICROS))

    @property
    def reset_at_iso(self) -> str:
        moment = datetime.fromtimestamp(self.reset_at_us / MICROS, UTC)
        return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")

    def headers(self) -> list[tuple[bytes, bytes]]:
        """X-RateLimit-* for every response, plus Retry-After when the call was refused."""
        headers = [
            (b"x-ratelimit-limit", str(self.limit).encode()),
            (b"x-ratelimit-remaining", str(self.remaining).encode()),
            (b"x-ratelimit-reset", str(self.reset_epoch_seconds).encode()),
        ]
        if not self.allowed:
            headers.append((b"retry-after", str(self.retry_after_seconds).encode()))
        return headers

    def error(self) -> ResourceExhausted:
        """The refusal: 429 in REST, RATE_LIMIT_EXCEEDED with `resetAt` in GraphQL."""
        return ResourceExhausted(
            f"rate limit exceeded: at most {self.limit} calls per window; "
            f"retry after {self.reset_at_iso}",
            metadata={"resetAt": self.reset_at_iso},
        )


def counter_key(principal: common_pb2.Principal) -> str:
    """The counter a principal's calls share, within its workspace: per API key or personal
    access token, per user for session tokens (all of a user's sessions together), per OAuth
    client and user for OAuth access tokens."""
    kind = principal.kind
    if kind == common_pb2.PRINCIPAL_KIND_USER and principal.user_id:
        subject = f"user:{principal.user_id}"
    elif kind == common_pb2.PRINCIPAL_KIND_OAUTH:
        subject = f"oauth:{principal.oauth_client_id}:{principal.user_id}"
    elif kind == common_pb2.PRINCIPAL_KIND_API_KEY:
        subject = f"key:{principal.credential_id}"
    elif kind == common_pb2.PRINCIPAL_KIND_PERSONAL_ACCESS_TOKEN:
        subject = f"pat:{principal.credential_id}"
    else:
        subject = f"credential:{principal.credential_id}"
    return f"{KEY_PREFIX}{principal.workspace_id}:{subject}"
