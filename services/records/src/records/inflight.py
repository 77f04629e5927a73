"""The relay's messages in flight: published to JetStream, their acknowledgement not yet read.

Each message is published with reply subject `<inbox>.<run>x<index>`; JetStream answers there
with its PubAck (or an error). One subscription and a dict instead of a future and a timer per
message (nats-py's publish_async) lets one relay keep many publishes in flight cheaply.

At most one message per record is in flight (`blocks`): a record's next event is published only
once the one before it is acknowledged, so a record's events enter the stream in outbox order
even when a publish fails and is retried. A record whose message failed stays blocked until the
run ends (the relay then reads the unpublished rows again, in order).
"""

from __future__ import annotations

import asyncio
import time

import orjson
from nats.aio.msg import Msg
from opentelemetry import trace

from records.envelope import Message


class InFlight:
    def __init__(self, run: int) -> None:
        self.prefix = f"{run}x"
        self._count = 0
        # token -> (message, span, monotonic publish time); insertion order is publish order
        self.waiting: dict[str, tuple[Message, trace.Span, float]] = {}
        self._records: set[str] = set()
        self.acknowledged: list[int] = []
        self.error = ""
        self.stream_missing = False
        self.changed = asyncio.Event()  # set by every answer

    def blocks(self, message: Message) -> bool:
        """Whether an earlier message of one of its records is in flight (or failed)."""
        if not message.rest:
            return message.record_id in self._records
        return not self._records.isdisjoint(message.record_ids)

    def add(self, message: Message, span: trace.Span) -> str:
        """Registers a message about to be published; returns its reply token."""
        token = f"{self.prefix}{self._count}"
        self._count += 1
        self.waiting[token] = (message, span, time.monotonic())
        if message.rest:
            self._records.update(message.record_ids)
        else:
            self._records.add(message.record_id)
        return token

    def unsent(self, token: str, error: str) -> None:
        """The client refused the publish of `token`: it failed, and nothing more goes out."""
        entry = self.waiting.pop(token, None)
        if entry is not None:
            end_span(entry[1], error)
        self.error = self.error or error

    def answer(self, token: str, msg: Msg) -> None:
        entry = self.waiting.pop(token, None)
        if entry is None:
            return  # a second answer, or one for a message already abandoned
        message, span, _ = entry
        problem = ack_problem(msg)
        if problem:
            self.error = self.error or problem
            self.stream_missing = self.stream_missing or problem.startswith("no stream")
        else:
            if message.rest:
                self.acknowledged.extend(message.sequences)
                self._records.difference_update(message.record_ids)
            else:
                self.acknowledged.append(message.sequence)
                self._records.discard(message.record_id)
        end_span(span, problem)
        self.changed.set()

    def oldest(self) -> float | None:
        """Monotonic publish time of the oldest message still waiting."""
        for _, _, published in self.waiting.values():
            return published
        return None

    def abandon(self, reason: str) -> None:
        """The messages still waiting count as failed (a late answer is then ignored)."""
        for _, span, _ in self.waiting.values():
            end_span(span, reason)
        if self.waiting:
            self.error = self.error or reason
        self.waiting.clear()

    def take_acknowledged(self) -> list[int]:
        taken, self.acknowledged = self.acknowledged, []
        return taken


def ack_problem(msg: Msg) -> str:
    """Why JetStream did not store the message ("" when it did, duplicates included)."""
    if msg.headers and msg.headers.get("Status") == "503":
        return "no stream answered (no responders)"
    try:
        answer = orjson.loads(msg.data)
    except orjson.JSONDecodeError:
        return "ack: unreadable answer"
    if not isinstance(answer, dict):
        return "ack: unreadable answer"
    if "error" in answer:
        error = answer["error"]
        detail = error.get("description", error) if isinstance(error, dict) else error
        return f"ack: {detail}"
    return ""


def end_span(span: trace.Span, error: str) -> None:
    if error:
        span.set_status(trace.Status(trace.StatusCode.ERROR, error))
    span.end()
