"""One delivery attempt: sign the body as sent, POST it through the outbound guard, judge it.

Success is a 2xx status within WEBHOOK_TIMEOUT (the whole exchange, connect to answer);
anything else (timeout, connection error, refused target, other status) is a failed attempt
whose error says why.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from datetime import UTC, datetime

import aiohttp

from crmkit.outbound import refused_error
from webhooks.payload import TRUNCATED_HEADER, Body
from webhooks.signing import SIGNATURE_HEADER, TIMESTAMP_HEADER, signature

USER_AGENT = "crm-webhooks/1"
_RESPONSE_SNIPPET_BYTES = 200
_RESPONSE_READ_LIMIT = 64 * 1024  # read this much of an answer so the connection can be reused


@dataclass(frozen=True)
class AttemptResult:
    delivered: bool
    status_code: int | None
    latency_ms: int
    error: str
    attempted_at: datetime


class Sender:
    def __init__(self, session: aiohttp.ClientSession, timeout: float) -> None:
        self._session = session
        self._timeout = timeout

    async def send(self, url: str, secret: str, body: Body) -> AttemptResult:
        attempted_at = datetime.now(UTC)
        timestamp = int(time.time())
        headers = {
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            SIGNATURE_HEADER: signature(secret, timestamp, body.content),
            TIMESTAMP_HEADER: str(timestamp),
        }
        if body.previous_record_omitted:
            headers[TRUNCATED_HEADER] = "previousRecord"
        started = time.perf_counter()
        status: int | None = None
        error = ""
        try:
            async with asyncio.timeout(self._timeout):
                status, snippet = await self._post(url, headers, body.content)
            if not 200 <= status <= 299:
                error = f"HTTP {status}" + (f": {snippet}" if snippet else "")
        except TimeoutError:
            error = f"no answer within {self._timeout:g} s"
        except Exception as exc:  # every transport failure is a failed attempt, named
            error = describe(exc)
        latency_ms = round((time.perf_counter() - started) * 1000)
        return AttemptResult(
            delivered=not error,
            status_code=status,
            latency_ms=latency_ms,
            error=error,
            attempted_at=attempted_at,
        )

    async def _post(self, url: str, headers: dict[str, str], content: bytes) -> tuple[int, str]:
        async with self._session.post(
            url, data=content, headers=headers, allow_redirects=False
        ) as response:
            received = await response.content.read(_RESPONSE_READ_LIMIT)
        snippet = received[:_RESPONSE_SNIPPET_BYTES].decode(errors="replace").strip()
        return response.status, snippet


def describe(exc: BaseException) -> str:
    refused = refused_error(exc)
    if refused is not None:
        return f"refused: {refused}"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"connection failed: {exc.os_error or exc}"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "the server closed the connection without answering"
    if isinstance(exc, aiohttp.ClientError):
        return f"{type(exc).__name__}: {exc}"
    return f"{type(exc).__name__}: {exc}"
