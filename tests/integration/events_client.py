"""Helpers for tests that read record events from JetStream, the outbox and /metrics."""

from __future__ import annotations

import asyncio
import secrets
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import asyncpg
import grpc
import nats
from nats.js.api import DeliverPolicy

from crm.events.v1 import events_pb2
from crm.records.v1 import records_pb2, records_pb2_grpc
from crmkit.event_interest import gateway_holder
from crmkit.messaging import RECORD_EVENTS_STREAM, event_payloads
from crmkit.principal import PrincipalCodec, system_principal
from crmstack.stack import Stack


@dataclass(frozen=True)
class StreamEvent:
    subject: str
    headers: dict[str, str]
    event: events_pb2.RecordEvent
    stream_sequence: int


def read_stream(
    stack: Stack, workspace_id: str, count: int, timeout: float = 60.0
) -> list[StreamEvent]:
    """The first `count` events of a workspace in stream order, each event of a batch (a bulk
    write's message) on its own (AssertionError if fewer come)."""

    async def read() -> list[StreamEvent]:
        connection = await nats.connect(stack.env["NATS_URL"])
        try:
            js = connection.jetstream()
            subscription = await js.subscribe(
                f"crm.records.{workspace_id}.>",
                stream=RECORD_EVENTS_STREAM,
                ordered_consumer=True,
                deliver_policy=DeliverPolicy.ALL,
            )
            events: list[StreamEvent] = []
            deadline = time.monotonic() + timeout
            while len(events) < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    message = await subscription.next_msg(timeout=min(remaining, 5))
                except TimeoutError:
                    continue
                for payload in event_payloads(message.data, message.headers):
                    events.append(
                        StreamEvent(
                            message.subject,
                            dict(message.headers or {}),
                            events_pb2.RecordEvent.FromString(payload),
                            message.metadata.sequence.stream,
                        )
                    )
            await subscription.unsubscribe()
            return events
        finally:
            await connection.close()

    events = asyncio.run(read())
    assert len(events) >= count, f"{len(events)} of {count} events reached the stream"
    return events


def listen(stack: Stack, workspace_id: str, seconds: int = 3600) -> None:
    """Interest in the workspace's record events, as a gateway with a subscription open there
    holds it (a lease of `seconds`): the relay publishes them (docs/events.md, "Who listens").
    For tests that read the stream, or that need events published before a webhook exists."""
    codec = PrincipalCodec(stack.env["APP_SECRET"])
    with grpc.insecure_channel(stack.grpc_address("records")) as channel:
        records_pb2_grpc.EventInterestServiceStub(channel).DeclareEventInterest(
            records_pb2.DeclareEventInterestRequest(
                holder=gateway_holder(f"test-{secrets.token_hex(4)}"),
                workspace_ids=[workspace_id],
                lease_seconds=seconds,
            ),
            metadata=codec.metadata(system_principal(workspace_id)),
            timeout=30,
        )


def stream_count(stack: Stack, workspace_id: str) -> int:
    """How many events of the workspace the stream holds."""

    async def count() -> int:
        connection = await nats.connect(stack.env["NATS_URL"])
        try:
            info = await connection.jetstream().stream_info(
                RECORD_EVENTS_STREAM, subjects_filter=f"crm.records.{workspace_id}.>"
            )
        finally:
            await connection.close()
        return sum((info.state.subjects or {}).values())

    return asyncio.run(count())


def unpublished(stack: Stack, workspace_id: str) -> int:
    """The workspace's outbox rows the relay has not taken yet (published or skipped)."""
    rows = query(
        stack,
        "SELECT count(*) AS n FROM records.outbox WHERE workspace_id = $1 AND published_at IS NULL",
        workspace_id,
    )
    return int(rows[0]["n"])


def wait_drained(stack: Stack, workspace_id: str, timeout: float = 60) -> None:
    """Until the relay has taken every outbox row of the workspace."""
    wait_until(lambda: unpublished(stack, workspace_id) == 0, timeout, "the outbox did not drain")


def query(stack: Stack, sql: str, *args: Any) -> list[asyncpg.Record]:
    async def run() -> list[asyncpg.Record]:
        connection = await asyncpg.connect(stack.env["DATABASE_URL"])
        try:
            return list(await connection.fetch(sql, *args))
        finally:
            await connection.close()

    return asyncio.run(run())


def metric(port: int, name: str) -> float | None:
    """A sample's value from a process's /metrics (the first line naming it exactly)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    return None


def wait_until(check: Callable[[], bool], timeout: float, message: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(message)
        time.sleep(0.2)
