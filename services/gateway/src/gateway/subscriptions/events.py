"""Record events as the hub dispatches them: decoded once per event, shared by every subscriber."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from google.protobuf.message import DecodeError

from crm.events.v1 import events_pb2
from crmkit.messaging import RECORD_ACTION_NAMES

CREATED, UPDATED, DELETED = "created", "updated", "deleted"
ACTIONS = (CREATED, UPDATED, DELETED)


class MalformedEvent(ValueError):
    """A message on a record subject that is not a usable RecordEvent."""


@dataclass(frozen=True)
class RecordChange:
    id: str
    workspace_id: str
    object: str  # singular object name
    action: str  # created, updated or deleted
    record: Mapping[str, Any]  # the record after the change; read-only, shared by subscribers
    occurred_at: float  # commit time, Unix seconds (0 when the envelope has none)
    trace_context: Mapping[str, str] = field(default_factory=dict)
    record_id: str = ""
    # The relay left the record out (too large for a NATS message): read it by id.
    record_omitted: bool = False
    # The `next` payloads rendered for this event, one per group of equal subscriptions
    # (see gateway.subscriptions.rendering); dropped with the event.
    renders: dict[Hashable, asyncio.Future[str]] = field(
        default_factory=dict, compare=False, repr=False
    )


def decode_change(data: bytes, headers: Mapping[str, str] | None = None) -> RecordChange:
    """The change a `crm.events.v1.RecordEvent` describes, or MalformedEvent."""
    try:
        event = events_pb2.RecordEvent.FromString(data)
    except DecodeError as exc:
        raise MalformedEvent(f"not a RecordEvent: {exc}") from None
    action = RECORD_ACTION_NAMES.get(event.action)
    if action is None:
        raise MalformedEvent(f"event {event.id}: unknown action {event.action}")
    if not event.workspace_id or not event.object:
        raise MalformedEvent(f"event {event.id}: no workspace or object")
    record: dict[str, object] = {}
    if not event.record_omitted:
        try:
            record = orjson.loads(event.record_json)
        except orjson.JSONDecodeError:
            raise MalformedEvent(f"event {event.id}: record_json is not JSON") from None
        if not isinstance(record, dict):
            raise MalformedEvent(f"event {event.id}: record_json is not an object")
    elif not event.record_id:
        raise MalformedEvent(f"event {event.id}: record omitted and no record id")
    occurred_at = event.occurred_at.ToNanoseconds() / 1e9 if event.HasField("occurred_at") else 0.0
    trace = {
        key: value for key, value in (headers or {}).items() if key in ("traceparent", "tracestate")
    } or dict(event.trace_context)
    return RecordChange(
        id=event.id,
        workspace_id=event.workspace_id,
        object=event.object,
        action=action,
        record=record,
        occurred_at=occurred_at,
        trace_context=trace,
        record_id=event.record_id,
        record_omitted=event.record_omitted,
    )
