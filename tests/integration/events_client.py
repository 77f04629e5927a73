"""Helpers for tests that read record events from JetStream, the outbox and /metrics."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import asyncpg
import nats
from nats.js.api import DeliverPolicy

from crm.events.v1 import events_pb2
from crmkit.messaging import RECORD_EVENTS_STREAM
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
    """The first `count` events of a workspace in stream order (AssertionError if fewer come)."""

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
                event = events_pb2.RecordEvent()
                event.ParseFromString(message.data)
                events.append(
                    StreamEvent(
                        message.subject,
                        dict(message.headers or {}),
                        event,
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
