"""One outbound HTTP request to a user-configured URL, judged the same way everywhere.

Used by webhook deliveries and workflow actions, always with a `crmkit.outbound.guarded_session`.
Success is a 2xx status within `timeout` (the whole exchange, connect to answer); anything else
(timeout, connection error, refused target, other status) is a failed attempt whose error says
why. Redirects are not followed: a redirect must not lead to a target that was never checked.
The HTTP client alone frames the request: a framing or hop-by-hop header (`is_framing_header`)
given by the caller is refused, never sent.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

import aiohttp
from yarl import URL

from crmkit.outbound import refused_error

EXCERPT_BYTES = 200
_RESPONSE_READ_LIMIT = 64 * 1024  # read this much of an answer so the connection can be reused
# Headers that frame the message or steer the connection (RFC 9110 7.6.1, RFC 9112): set by the
# HTTP client only, or one request could be cut short, extended or sent elsewhere.
_FRAMING_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "te",
        "trailer",
        "upgrade",
        "expect",
    }
)


def is_framing_header(name: str) -> bool:
    lowered = name.strip().lower()
    return lowered in _FRAMING_HEADERS or lowered.startswith("proxy-")


@dataclass(frozen=True)
class HttpAttempt:
    ok: bool  # a 2xx answer in time
    status_code: int | None  # None when no answer came
    excerpt: str  # the start of the answer's body (text), "" when none
    latency_ms: int
    error: str  # why it failed; "" on success
    attempted_at: datetime


async def send_request(
    session: aiohttp.ClientSession,
    method: str,
    url: str | URL,
    *,
    headers: Mapping[str, str],
    body: bytes | None,
    timeout: float,
    excerpt_bytes: int = EXCERPT_BYTES,
) -> HttpAttempt:
    attempted_at = datetime.now(UTC)
    started = time.perf_counter()
    status: int | None = None
    excerpt = ""
    framing = [name for name in headers if is_framing_header(name)]
    if framing:
        error = f"refused: the {framing[0]} header is set by the HTTP client, not configured"
        return HttpAttempt(False, None, "", 0, error, attempted_at)
    error = ""
    try:
        async with asyncio.timeout(timeout):
            async with session.request(
                method, url, data=body, headers=dict(headers), allow_redirects=False
            ) as response:
                status = response.status
                received = await response.content.read(_RESPONSE_READ_LIMIT)
        excerpt = received[:excerpt_bytes].decode(errors="replace").strip()
        if not 200 <= status <= 299:
            error = f"HTTP {status}" + (f": {excerpt}" if excerpt else "")
    except TimeoutError:
        error = f"no answer within {timeout:g} s"
    except Exception as exc:  # every transport failure is a failed attempt, named
        error = describe(exc)
    return HttpAttempt(
        ok=not error,
        status_code=status,
        excerpt=excerpt,
        latency_ms=round((time.perf_counter() - started) * 1000),
        error=error,
        attempted_at=attempted_at,
    )


def describe(exc: BaseException) -> str:
    """A failure to send, said for the person reading the delivery or run log."""
    refused = refused_error(exc)
    if refused is not None:
        return f"refused: {refused}"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"connection failed: {exc.os_error or exc}"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "the server closed the connection without answering"
    return f"{type(exc).__name__}: {exc}"
