"""Password reset: 202 always, an email over real SMTP (aiosmtpd, started here) with a
single-use token, confirmation that changes the password and ends existing sessions."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from email import message_from_bytes, policy
from email.message import EmailMessage
from typing import Any

import asyncpg
import httpx
import pytest
from aiosmtpd.controller import Controller

from crmstack.client import graphql, signup, unique_email
from crmstack.stack import Stack

NEW_PASSWORD = "a brand new password"
_TOKEN = re.compile(r"^Reset token: ([A-Za-z0-9_-]+)", re.MULTILINE)


@dataclass
class Mailbox:
    """What the SMTP server received, by recipient."""

    messages: list[EmailMessage] = field(default_factory=list)
    arrived: threading.Condition = field(default_factory=threading.Condition)

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802
        message = message_from_bytes(envelope.content, policy=policy.default)
        assert isinstance(message, EmailMessage)
        with self.arrived:
            self.messages.append(message)
            self.arrived.notify_all()
        return "250 OK"

    def wait_for(self, recipient: str, count: int = 1, timeout: float = 60) -> list[EmailMessage]:
        deadline = time.monotonic() + timeout
        with self.arrived:
            while True:
                found = [m for m in self.messages if m["To"] == recipient]
                if len(found) >= count:
                    return found
                remaining = deadline - time.monotonic()
                assert remaining > 0, f"no email to {recipient} within {timeout}s"
                self.arrived.wait(remaining)

    def to(self, recipient: str) -> list[EmailMessage]:
        with self.arrived:
            return [m for m in self.messages if m["To"] == recipient]


@pytest.fixture(scope="module")
def mailbox(smtp_port: int) -> Iterator[Mailbox]:
    box = Mailbox()
    controller = Controller(box, hostname="127.0.0.1", port=smtp_port)
    controller.start()
    try:
        yield box
    finally:
        controller.stop()


def _token(message: EmailMessage) -> str:
    body = message.get_body(preferencelist=("plain",))
    assert body is not None
    match = _TOKEN.search(str(body.get_content()))
    assert match, body.get_content()
    return match.group(1)


def _login(client: httpx.Client, email: str, password: str) -> httpx.Response:
    return client.post(
        "/auth/login",
        json={"email": email, "password": password},
        headers={"X-Forwarded-For": "203.0.113.50"},
    )


def test_reset_by_email_changes_the_password(client: httpx.Client, mailbox: Mailbox) -> None:
    user = signup(client, workspace_name="Reset Co", first_name="Rosa")
    response = client.post("/auth/password-reset", json={"email": user.email.upper()})
    assert response.status_code == 202
    [message] = mailbox.wait_for(user.email)
    assert "Reset Co" in message["Subject"]
    assert message["From"]
    text = str(message.get_body(preferencelist=("plain",)).get_content())  # type: ignore[union-attr]
    assert "Hello Rosa" in text
    token = _token(message)

    confirmed = client.post(
        "/auth/password-reset/confirm", json={"token": token, "password": NEW_PASSWORD}
    )
    assert confirmed.status_code == 204, confirmed.text
    assert _login(client, user.email, NEW_PASSWORD).status_code == 200
    assert _login(client, user.email, user.password).status_code == 401
    # Sessions opened with the old password are over.
    assert graphql(client, user.access_token, "{ currentUser { id } }").status_code == 401
    refresh = client.post("/auth/refresh", json={"refreshToken": user.refresh_token})
    assert refresh.status_code == 401
    # The token works once.
    again = client.post(
        "/auth/password-reset/confirm", json={"token": token, "password": "yet another one"}
    )
    assert again.status_code == 400
    assert again.json()["details"]["field"] == "token"


def test_unknown_email_gets_202_and_no_email(client: httpx.Client, mailbox: Mailbox) -> None:
    nobody = unique_email("nobody")
    known = signup(client)
    assert client.post("/auth/password-reset", json={"email": nobody}).status_code == 202
    assert client.post("/auth/password-reset", json={"email": known.email}).status_code == 202
    mailbox.wait_for(known.email)  # sent after the unknown one, by the same job
    assert mailbox.to(nobody) == []


def test_request_validates_the_email(client: httpx.Client) -> None:
    response = client.post("/auth/password-reset", json={"email": "not an email"})
    assert response.status_code == 400
    assert response.json()["details"]["field"] == "email"


def test_confirm_validates_input(client: httpx.Client) -> None:
    weak = client.post("/auth/password-reset/confirm", json={"token": "x", "password": "short"})
    assert weak.status_code == 400
    assert weak.json()["details"]["field"] == "password"
    unknown = client.post(
        "/auth/password-reset/confirm", json={"token": "not-a-token", "password": NEW_PASSWORD}
    )
    assert unknown.status_code == 400
    assert unknown.json()["details"]["field"] == "token"
    assert "invalid" in unknown.json()["message"]


def test_expired_token_is_refused_saying_so(
    client: httpx.Client, mailbox: Mailbox, local_stack: Stack
) -> None:
    assert local_stack.infra is not None
    user = signup(client)
    client.post("/auth/password-reset", json={"email": user.email})
    token = _token(mailbox.wait_for(user.email)[0])

    async def age_tokens() -> None:
        connection = await asyncpg.connect(local_stack.infra.database_url)  # type: ignore[union-attr]
        try:
            await connection.execute(
                "UPDATE identity.password_reset_tokens "
                "SET expires_at = now() - interval '1 second' WHERE user_id = $1::uuid",
                user.user_id,
            )
        finally:
            await connection.close()

    asyncio.run(age_tokens())
    response = client.post(
        "/auth/password-reset/confirm", json={"token": token, "password": NEW_PASSWORD}
    )
    assert response.status_code == 400
    assert "expired" in response.json()["message"]
    assert _login(client, user.email, user.password).status_code == 200


def test_reset_tokens_live_five_minutes_by_default(
    client: httpx.Client, mailbox: Mailbox, local_stack: Stack
) -> None:
    assert local_stack.infra is not None
    user = signup(client)
    client.post("/auth/password-reset", json={"email": user.email})
    mailbox.wait_for(user.email)

    async def lifetime() -> float:
        connection = await asyncpg.connect(local_stack.infra.database_url)  # type: ignore[union-attr]
        try:
            value = await connection.fetchval(
                "SELECT extract(epoch FROM expires_at - created_at) "
                "FROM identity.password_reset_tokens WHERE user_id = $1::uuid",
                user.user_id,
            )
            return float(value)
        finally:
            await connection.close()

    assert asyncio.run(lifetime()) == pytest.approx(300, abs=2)


def test_identity_without_smtp_serves_and_keeps_email_queued(local_stack: Stack) -> None:
    """Without SMTP_URL the service runs normally; emails wait in the outbox."""
    import sys

    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from crmstack.ports import free_port
    from crmstack.processes import ManagedProcess

    port = free_port()
    env = {key: value for key, value in local_stack.env.items() if key != "SMTP_URL"}
    env.update(GRPC_PORT=str(port), GRPC_HOST="127.0.0.1", METRICS_PORT="0")
    process = ManagedProcess(
        name="identity-no-smtp",
        command=[sys.executable, "-m", "identity"],
        env=env,
        log_path=local_stack.logs / "identity-no-smtp.log",
    )
    process.start()
    try:
        health = health_pb2_grpc.HealthStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
        serving = 0
        deadline = time.monotonic() + 60
        while serving < 5:  # serving, and still serving a while later
            assert process.is_running(), process.tail()
            assert time.monotonic() < deadline, process.tail()
            try:
                reply = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
                serving += reply.status == health_pb2.HealthCheckResponse.SERVING
            except grpc.RpcError:
                pass
            time.sleep(0.5)
        assert "SMTP_URL is not set" in process.log_path.read_text()
    finally:
        assert process.stop() == 0
