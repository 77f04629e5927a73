"""One delivery attempt: sign the body as sent, POST it through the outbound guard, judge it.

Success is a 2xx status within WEBHOOK_TIMEOUT (see `crmkit.http_send`); anything else is a
failed attempt whose error says why. Each workspace's deliveries have their own connections
(`crmkit.outbound.WorkspaceSessions`).
"""

from __future__ import annotations

import time

from crmkit.http_send import HttpAttempt, send_request
from crmkit.outbound import WorkspaceSessions
from webhooks.payload import TRUNCATED_HEADER, Body
from webhooks.signing import SIGNATURE_HEADER, TIMESTAMP_HEADER, signature

USER_AGENT = "crm-webhooks/1"


class Sender:
    def __init__(self, sessions: WorkspaceSessions, timeout: float) -> None:
        self._sessions = sessions
        self._timeout = timeout

    async def send(self, workspace_id: str, url: str, secret: str, body: Body) -> HttpAttempt:
        timestamp = int(time.time())
        headers = {
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            SIGNATURE_HEADER: signature(secret, timestamp, body.content),
            TIMESTAMP_HEADER: str(timestamp),
        }
        if body.truncated:
            headers[TRUNCATED_HEADER] = ", ".join(body.truncated)
        async with self._sessions.session(workspace_id) as session:
            return await send_request(
                session, "POST", url, headers=headers, body=body.content, timeout=self._timeout
            )
