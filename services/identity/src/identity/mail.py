"""Outgoing email: queued in Postgres with the change that causes it, sent by a background job.

The job (one per identity replica; rows are claimed with SKIP LOCKED) sends over SMTP
(`SMTP_URL`: `smtp://[user:password@]host:port`, or `smtps://` for implicit TLS), retries with
backoff, and deletes a row once sent so secrets in it do not outlive the delivery.
"""

from __future__ import annotations

import asyncio
import logging
import smtplib
import ssl
import uuid
from dataclasses import dataclass
from email.message import EmailMessage
from email.utils import formatdate, make_msgid
from urllib.parse import unquote, urlsplit

import asyncpg

from identity.db_types import Connection
from identity.metrics import IdentityMetrics

log = logging.getLogger("identity.mail")

POLL_SECONDS = 0.5
BATCH = 20
MAX_BACKOFF_SECONDS = 600
LEASE_SECONDS = 120.0  # longer than one SMTP exchange can take


async def enqueue(connection: Connection, *, recipient: str, subject: str, body: str) -> None:
    await connection.execute(
        "INSERT INTO identity.email_outbox (id, recipient, subject, body) VALUES ($1, $2, $3, $4)",
        uuid.uuid4(),
        recipient,
        subject,
        body,
    )


@dataclass(frozen=True)
class SmtpTarget:
    host: str
    port: int
    implicit_tls: bool
    username: str | None
    password: str | None

    @classmethod
    def parse(cls, url: str) -> SmtpTarget:
        parts = urlsplit(url)
        implicit_tls = parts.scheme == "smtps"
        return cls(
            host=parts.hostname or "localhost",
            port=parts.port or (465 if implicit_tls else 25),
            implicit_tls=implicit_tls,
            username=unquote(parts.username) if parts.username else None,
            password=unquote(parts.password) if parts.password else None,
        )


class SmtpSender:
    def __init__(self, target: SmtpTarget, sender: str, timeout: float) -> None:
        self._target = target
        self._sender = sender
        self._timeout = timeout

    async def send(self, recipient: str, subject: str, body: str) -> None:
        message = EmailMessage()
        message["From"] = self._sender
        message["To"] = recipient
        message["Subject"] = subject
        message["Date"] = formatdate(localtime=False)
        message["Message-ID"] = make_msgid(domain="crm.localhost")
        message.set_content(body)
        await asyncio.to_thread(self._send_blocking, message)

    def _send_blocking(self, message: EmailMessage) -> None:
        target = self._target
        client: smtplib.SMTP
        if target.implicit_tls:
            client = smtplib.SMTP_SSL(
                target.host,
                target.port,
                timeout=self._timeout,
                context=ssl.create_default_context(),
            )
        else:
            client = smtplib.SMTP(target.host, target.port, timeout=self._timeout)
        with client:
            if not target.implicit_tls and client.has_extn("starttls"):
                client.starttls(context=ssl.create_default_context())
            if target.username:
                client.login(target.username, target.password or "")
            client.send_message(message)


class EmailJob:
    """Sends due emails until cancelled."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        sender: SmtpSender,
        metrics: IdentityMetrics,
        max_attempts: int,
    ) -> None:
        self._pool = pool
        self._sender = sender
        self._metrics = metrics
        self._max_attempts = max_attempts

    async def run(self) -> None:
        while True:
            try:
                sent = await self.send_due()
            except (OSError, asyncpg.PostgresError) as exc:
                log.warning("email job pass failed", extra={"error": str(exc)})
                sent = 0
            if sent < BATCH:
                await asyncio.sleep(POLL_SECONDS)

    async def send_due(self) -> int:
        """Claim due emails (a lease, so a crash mid-send retries them), send, settle each."""
        rows = await self._pool.fetch(
            "UPDATE identity.email_outbox SET attempts = attempts + 1, "
            "next_attempt_at = now() + make_interval(secs => $2) "
            "WHERE id IN (SELECT id FROM identity.email_outbox "
            "  WHERE failed_at IS NULL AND next_attempt_at <= now() "
            "  ORDER BY next_attempt_at LIMIT $1 FOR UPDATE SKIP LOCKED) "
            "RETURNING id, recipient, subject, body, attempts",
            BATCH,
            LEASE_SECONDS,
        )
        for row in rows:
            try:
                await self._sender.send(row["recipient"], row["subject"], row["body"])
            except (OSError, smtplib.SMTPException) as exc:
                await self._failed(row["id"], row["attempts"], exc)
                continue
            await self._pool.execute("DELETE FROM identity.email_outbox WHERE id = $1", row["id"])
            self._metrics.emails.labels("sent").inc()
            log.info("email sent", extra={"email_id": str(row["id"])})
        return len(rows)

    async def _failed(self, email_id: uuid.UUID, attempts: int, exc: Exception) -> None:
        give_up = attempts >= self._max_attempts
        backoff = min(2**attempts, MAX_BACKOFF_SECONDS)
        await self._pool.execute(
            "UPDATE identity.email_outbox SET attempts = $2, last_error = $3, "
            "next_attempt_at = now() + make_interval(secs => $4), "
            "failed_at = CASE WHEN $5 THEN now() END WHERE id = $1",
            email_id,
            attempts,
            str(exc)[:500],
            float(backoff),
            give_up,
        )
        self._metrics.emails.labels("failed" if give_up else "retried").inc()
        log.warning(
            "email not sent",
            extra={"email_id": str(email_id), "attempts": attempts, "error": str(exc)[:200]},
        )
