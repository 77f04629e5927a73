"""One delivery attempt: sign the body as sent, POST it through the outbound guard, judge it.

Success is a 2xx status within WEBHOOK_TIMEOUT (see `crmkit.http_send`); anything else is a
failed attempt whose error says why.
"""

from __future__ import annotations

import time

import aiohttp

from crmkit.http_send import HttpAttempt, send_request
from webhooks.payload import TRUNCATED_HEADER, Body
from webhooks.signing import SIGNATURE_HEADER, TIMESTAMP_HEADER, signature

USER_AGENT = "crm-webhooks/1"


class Sender:
    def __init__(self, session: aiohttp.ClientSession, timeout: float) -> None:
        self._session = session
        self._timeout = timeout

    async def send(self, url: str, secret: str, body: Body) -> HttpAttempt:
        timestamp = int(time.time())
        headers = {
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            SIGNATURE_HEADER: signature(secret, timestamp, body.content),
            TIMESTAMP_HEADER: str(timestamp),
        }
        if body.truncated:
            headers[TRUNCATED_HEADER] = ", ".join(body.truncated)
        return await send_request(
            self._session, "POST", url, headers=headers, body=body.content, timeout=self._timeout
        )
