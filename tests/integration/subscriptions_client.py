"""Helpers for the subscription tests: raw GraphQL WebSockets, the gateway's subscription gauge,
and record events published into JetStream the way the outbox relay publishes them."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

import httpx
import nats
import orjson
import pytest
import websockets
from websockets.asyncio.client import ClientConnection
from websockets.typing import Subprotocol

TRANSPORT_WS = "graphql-transport-ws"
LEGACY_WS = "graphql-ws"


def ws_url(base_url: str) -> str:
    return "ws" + base_url.removeprefix("http") + "/graphql"


class Socket:
    """A raw GraphQL WebSocket, for checks at the protocol level."""

    def __init__(self, connection: ClientConnection) -> None:
        self.connection = connection

    @classmethod
    async def open(
        cls,
        base_url: str,
        subprotocols: Sequence[str] | None = (TRANSPORT_WS,),
        *,
        receive_buffer: int | None = None,
        **kwargs: Any,
    ) -> Socket:
        """`receive_buffer` fixes the kernel's receive buffer (no autotuning), for a client
        that stops reading to back up quickly."""
        offered = [Subprotocol(name) for name in subprotocols] if subprotocols else None
        if receive_buffer is not None:
            url = httpx.URL(base_url)
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
            sock.setblocking(False)
            await asyncio.get_running_loop().sock_connect(sock, (url.host, url.port))
            kwargs["sock"] = sock
        connection = await websockets.connect(ws_url(base_url), subprotocols=offered, **kwargs)
        return cls(connection)

    async def __aenter__(self) -> Socket:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        await self.connection.close()

    async def send(self, message: Mapping[str, Any]) -> None:
        await self.connection.send(orjson.dumps(message).decode())

    async def receive(self, timeout: float = 30) -> dict[str, Any]:
        raw = await asyncio.wait_for(self.connection.recv(), timeout)
        message: dict[str, Any] = orjson.loads(raw)
        return message

    async def init(self, token: str, *, key: str = "authorization") -> None:
        await self.send({"type": "connection_init", "payload": {key: f"Bearer {token}"}})
        assert await self.receive() == {"type": "connection_ack"}

    async def subscribe(
        self, identifier: str, query: str, variables: Mapping[str, Any] | None = None
    ) -> None:
        payload: dict[str, Any] = {"query": query}
        if variables is not None:
            payload["variables"] = dict(variables)
        await self.send({"id": identifier, "type": "subscribe", "payload": payload})

    async def next_data(self, identifier: str, timeout: float = 30) -> dict[str, Any]:
        """The data of the next `next` message (which must be for `identifier`)."""
        message = await self.receive(timeout)
        assert (message["type"], message["id"]) == ("next", identifier), message
        assert "errors" not in message["payload"], message
        data: dict[str, Any] = message["payload"]["data"]
        return data

    async def closed(self, timeout: float = 30) -> tuple[int, str]:
        """Reads until the server closes the socket; its close code and reason."""
        frame = None
        try:
            while True:
                await asyncio.wait_for(self.connection.recv(), timeout)
        except websockets.ConnectionClosed as closed:
            frame = closed.rcvd
        assert frame is not None, "the connection ended without a close frame"
        return frame.code, frame.reason

    async def quiet(self, seconds: float = 1.0) -> None:
        """Asserts nothing arrives for `seconds` (used after the positive case was seen)."""
        try:
            message = await asyncio.wait_for(self.connection.recv(), seconds)
        except TimeoutError:
            return
        raise AssertionError(f"unexpected message: {message!r}")


# The gateway serves /metrics on its metrics port only: the metrics URL of each gateway the
# tests started, by its base URL (registered by tests/integration/conftest.py).
GATEWAY_METRICS: dict[str, str] = {}


def gateway_metrics(base_url: str) -> str:
    """The text of the gateway's /metrics, read from its metrics port (against a remote
    deployment, `CRM_GATEWAY_METRICS_URL` names it; without it the test skips)."""
    url = GATEWAY_METRICS.get(base_url.rstrip("/")) or os.environ.get("CRM_GATEWAY_METRICS_URL")
    if not url:
        pytest.skip("the gateway's metrics port is not known: set CRM_GATEWAY_METRICS_URL")
    return httpx.get(url.rstrip("/") + "/metrics", timeout=10).text


def metric(base_url: str, name: str, labels: Mapping[str, str] | None = None) -> float:
    """A sample of the gateway's /metrics (0 when absent)."""
    text = gateway_metrics(base_url)
    wanted = name
    if labels:
        wanted += "{" + ",".join(f'{key}="{value}"' for key, value in labels.items()) + "}"
    for line in text.splitlines():
        key, _, value = line.rpartition(" ")
        if key == wanted:
            return float(value)
    return 0.0


async def wait_for_subscriptions(base_url: str, at_least: float, timeout: float = 60) -> None:
    """Waits until the gateway holds at least `at_least` open subscriptions (they are
    registered asynchronously after `subscribe`; events before that are not theirs)."""
    deadline = time.monotonic() + timeout
    while True:
        current = await asyncio.to_thread(metric, base_url, "gateway_subscriptions_open")
        if current >= at_least:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{current} subscriptions open, expected {at_least}")
        await asyncio.sleep(0.1)


async def publish_raw(nats_url: str, subject: str, data: bytes) -> None:
    """Publishes bytes into the record stream (for messages the relay would never send)."""
    client = await nats.connect(nats_url)
    try:
        await client.jetstream().publish(subject, data)
    finally:
        await client.drain()
