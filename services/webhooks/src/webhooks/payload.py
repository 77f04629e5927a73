"""The delivery body: `{id, workspaceId, webhookId, operation, timestamp, record,
previousRecord}`, with the stored record JSON embedded as is (never decoded and re-encoded)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import orjson

MAX_PAYLOAD_BYTES = 1024 * 1024
TRUNCATED_HEADER = "X-Service-Payload-Truncated"


class PayloadTooLarge(Exception):
    """Even without previousRecord the body exceeds MAX_PAYLOAD_BYTES."""


@dataclass(frozen=True)
class EventPayload:
    event_id: str
    workspace_id: str
    webhook_id: str
    operation: str
    occurred_at: datetime
    record: str | None  # JSON text
    previous_record: str | None  # JSON text; None for created


@dataclass(frozen=True)
class Body:
    content: bytes
    truncated: tuple[str, ...]  # fields sent as null for size: the X-Service-Payload-Truncated


def iso_timestamp(value: datetime) -> str:
    """ISO 8601 in UTC with milliseconds, like the records' own timestamps."""
    text = value.astimezone(UTC).isoformat(timespec="milliseconds")
    return text.replace("+00:00", "Z")


def _encode(payload: EventPayload, previous: str | None) -> bytes:
    return orjson.dumps(
        {
            "id": payload.event_id,
            "workspaceId": payload.workspace_id,
            "webhookId": payload.webhook_id,
            "operation": payload.operation,
            "timestamp": iso_timestamp(payload.occurred_at),
            "record": orjson.Fragment(payload.record) if payload.record is not None else None,
            "previousRecord": orjson.Fragment(previous) if previous is not None else None,
        }
    )


def build_body(
    payload: EventPayload, left_out: tuple[str, ...] = (), limit: int = MAX_PAYLOAD_BYTES
) -> Body:
    """The body as sent. `left_out`: fields already missing from the event for size (sent as
    null, named in the header). Over `limit` bytes, previousRecord is sent as null too (and
    named); if that is still too large, PayloadTooLarge."""
    content = _encode(payload, payload.previous_record)
    if len(content) <= limit:
        return Body(content, left_out)
    if payload.previous_record is not None:
        content = _encode(payload, None)
        if len(content) <= limit:
            return Body(content, (*left_out, "previousRecord"))
    raise PayloadTooLarge(f"the payload is {len(content)} bytes, over the {limit} byte limit")
