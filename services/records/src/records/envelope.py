"""Outbox rows as JetStream messages: subject, `crm.events.v1.RecordEvent` bytes and headers.

The relay publishes one message per row on `crm.records.<workspaceId>.<object>.<action>` with
`Nats-Msg-Id` = the event id (JetStream drops a republished row inside its duplicate window) and
the W3C trace context of the request that made the change; consecutive rows of one bulk write (an
import) share a message (`messages_of`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

import orjson
from google.protobuf.timestamp_pb2 import Timestamp

from crm.common.v1 import common_pb2
from crm.events.v1 import events_pb2
from crmkit.messaging import (
    EVENT_BATCH_HEADER,
    RECORD_ACTIONS,
    encode_varint,
    pack_events,
    record_subject,
)
from crmkit.telemetry import TRACE_HEADERS

MSG_ID_HEADER = "Nats-Msg-Id"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Room left for the subject, headers and protocol framing under the server's max_payload.
_FRAMING_ALLOWANCE = 8 * 1024

# The columns the relay reads, in the order `OutboxRow.of` expects.
OUTBOX_COLUMNS = (
    "sequence, event_id::text, workspace_id::text, object, object_metadata_id::text, "
    "record_id::text, action, cause, record::text, previous_record::text, changed_fields, "
    "actor_kind, actor_user_id, actor_credential_id, actor_workflow_id, trace_context::text, "
    "occurred_at, bulk"
)

_CAUSES = {
    "write": events_pb2.CHANGE_CAUSE_WRITE,
    "restore": events_pb2.CHANGE_CAUSE_RESTORE,
    "merge": events_pb2.CHANGE_CAUSE_MERGE,
}
_ACTOR_KINDS = {
    "user": common_pb2.PRINCIPAL_KIND_USER,
    "api_key": common_pb2.PRINCIPAL_KIND_API_KEY,
    "oauth": common_pb2.PRINCIPAL_KIND_OAUTH,
    "personal_access_token": common_pb2.PRINCIPAL_KIND_PERSONAL_ACCESS_TOKEN,
    "system": common_pb2.PRINCIPAL_KIND_SYSTEM,
}


@dataclass(slots=True)
class OutboxRow:
    sequence: int
    event_id: str
    workspace_id: str
    object_name: str
    object_metadata_id: str
    record_id: str
    action: str
    cause: str
    record: str
    previous_record: str | None
    changed_fields: Sequence[str]
    actor_kind: str
    actor_user_id: str
    actor_credential_id: str
    actor_workflow_id: str
    trace_context: str
    occurred_at: datetime
    bulk: bool = False  # written by a bulk write (an import): may share a message

    @classmethod
    def of(cls, row: Sequence[Any]) -> OutboxRow:
        return cls(*row)  # columns in OUTBOX_COLUMNS order


@dataclass(slots=True)
class Message:
    sequence: int
    record_id: str
    subject: str
    payload: bytes
    headers: Mapping[str, str]
    # The other rows of a batch (`messages_of`): their sequence and record id.
    rest: tuple[tuple[int, str], ...] = ()

    @property
    def sequences(self) -> list[int]:
        return [self.sequence, *(sequence for sequence, _ in self.rest)]

    @property
    def record_ids(self) -> list[str]:
        return [self.record_id, *(record_id for _, record_id in self.rest)]


def timestamp_of(moment: datetime) -> Timestamp:
    """`Timestamp.FromDatetime` without its `calendar.timegm`: a quarter of the time per event."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    delta = moment - _EPOCH
    return Timestamp(seconds=delta.days * 86_400 + delta.seconds, nanos=delta.microseconds * 1000)


def record_event(row: OutboxRow) -> events_pb2.RecordEvent:
    occurred_at = timestamp_of(row.occurred_at)
    event = events_pb2.RecordEvent(
        id=row.event_id,
        workspace_id=row.workspace_id,
        object=row.object_name,
        object_metadata_id=row.object_metadata_id,
        action=RECORD_ACTIONS[row.action],
        cause=_CAUSES.get(row.cause, events_pb2.CHANGE_CAUSE_UNSPECIFIED),
        record_id=row.record_id,
        record_json=row.record.encode(),
        previous_values_json=(row.previous_record or "").encode(),
        actor=events_pb2.Actor(
            kind=_ACTOR_KINDS.get(row.actor_kind, common_pb2.PRINCIPAL_KIND_UNSPECIFIED),
            user_id=row.actor_user_id,
            credential_id=row.actor_credential_id,
            workflow_id=row.actor_workflow_id,
        ),
        occurred_at=occurred_at,
        sequence=row.sequence,
        changed_fields=list(row.changed_fields),
    )
    for key, value in _trace_context(row.trace_context).items():
        event.trace_context[key] = value
    return event


def message_of(row: OutboxRow, max_payload: int) -> Message:
    """The JetStream message of a row, trimmed to fit `max_payload` (the server's limit).

    The payload is written by `encode_event` (the wire format of `record_event(row)`, without
    building the message); only an event too large for the limit is built and trimmed."""
    trace_context = _trace_context(row.trace_context)
    payload = encode_event(row, trace_context)
    if len(payload) > max(max_payload - _FRAMING_ALLOWANCE, 1024):
        payload = _trimmed(record_event(row), max(max_payload - _FRAMING_ALLOWANCE, 1024))
    headers = {MSG_ID_HEADER: row.event_id}
    if trace_context:
        headers.update(trace_context)
    return Message(
        row.sequence,
        row.record_id,
        record_subject(row.workspace_id, row.object_name, row.action),
        payload,
        headers,
    )


def _trimmed(event: events_pb2.RecordEvent, limit: int) -> bytes:
    """The event without its before state, and then without its record, while over `limit`."""
    payload = event.SerializeToString()
    if len(payload) > limit and event.previous_values_json:
        event.previous_values_json = b""
        event.previous_record_omitted = True
        payload = event.SerializeToString()
    if len(payload) > limit:
        event.record_json = b""
        event.record_omitted = True
        payload = event.SerializeToString()
    return payload


# Protobuf wire format (https://protobuf.dev/programming-guides/encoding/): a field is its key
# (field number << 3 | wire type: 0 varint, 2 length-delimited) then its value; a proto3 field
# holding its default (0, "", false) is not written. Fields may come in any order.
def _text(key: bytes, value: str) -> bytes:
    return _bytes(key, value.encode()) if value else b""


def _bytes(key: bytes, value: bytes) -> bytes:
    return key + encode_varint(len(value)) + value if value else b""


def _number(key: bytes, value: int) -> bytes:
    return key + encode_varint(value) if value else b""


# Keys of RecordEvent's fields (proto/crm/events/v1/events.proto), and of Actor's, Timestamp's
# and a map entry's.
# A batch holds at most this many events, and at most this many bytes of them before they are
# deflated (and never more than fits a message): about 30 KB of an import's events, ~6 KB sent.
BATCH_EVENTS = 64
BATCH_BYTES = 256 * 1024


def messages_of(
    rows: Sequence[OutboxRow], max_payload: int, *, batches: bool = True
) -> list[Message]:
    """The JetStream messages of rows in outbox order: one per row, except that consecutive
    bulk rows of one write (same workspace, object, action and trace context; different
    records) share a message, up to BATCH_EVENTS events and BATCH_BYTES (docs/events.md,
    "Bulk writes"), unless `batches` is off."""
    limit = min(BATCH_BYTES, max(max_payload - _FRAMING_ALLOWANCE, 1024))
    messages: list[Message] = []
    group: list[tuple[OutboxRow, bytes]] = []
    size = 0

    def close() -> None:
        if len(group) == 1:
            messages.append(message_of(group[0][0], max_payload))
        elif group:
            messages.append(_batch_message(group))
        group.clear()

    for row in rows:
        if not (row.bulk and batches):
            close()
            messages.append(message_of(row, max_payload))
            continue
        payload = encode_event(row, _trace_context(row.trace_context))
        if len(payload) > limit:
            close()
            messages.append(message_of(row, max_payload))
            continue
        if group and (
            len(group) >= BATCH_EVENTS
            or size + len(payload) > limit
            or not _same_write(group[0][0], row)
            or any(row.record_id == other.record_id for other, _ in group)
        ):
            close()
        if not group:
            size = 0
        group.append((row, payload))
        size += len(payload)
    close()
    return messages


def _same_write(first: OutboxRow, row: OutboxRow) -> bool:
    return (
        row.workspace_id == first.workspace_id
        and row.object_name == first.object_name
        and row.action == first.action
        and row.trace_context == first.trace_context
    )


def _batch_message(group: Sequence[tuple[OutboxRow, bytes]]) -> Message:
    first = group[0][0]
    headers = {
        MSG_ID_HEADER: f"{first.event_id}+{len(group)}",
        EVENT_BATCH_HEADER: str(len(group)),
    }
    headers.update(_trace_context(first.trace_context))
    return Message(
        first.sequence,
        first.record_id,
        record_subject(first.workspace_id, first.object_name, first.action),
        pack_events([payload for _, payload in group]),
        headers,
        tuple((row.sequence, row.record_id) for row, _ in group[1:]),
    )


_ID, _WORKSPACE, _OBJECT, _OBJECT_METADATA = b"\x0a", b"\x12", b"\x1a", b"\x22"
_ACTION, _CAUSE, _RECORD_ID, _RECORD_JSON = b"\x28", b"\x30", b"\x3a", b"\x42"
_ACTOR, _OCCURRED_AT, _TRACE_CONTEXT, _SEQUENCE = b"\x52", b"\x5a", b"\x62", b"\x68"
_CHANGED_FIELDS, _PREVIOUS_VALUES = b"\x72", b"\x8a\x01"
_FIELD_1_VARINT, _FIELD_2_VARINT = b"\x08", b"\x10"
_FIELD_1_BYTES, _FIELD_2_BYTES, _FIELD_3_BYTES, _FIELD_4_BYTES = b"\x0a", b"\x12", b"\x1a", b"\x22"
_CONSTANT_PARTS_KEPT = 1024
_constant_parts: dict[tuple[str, ...], bytes] = {}


def _constant_part(row: OutboxRow) -> bytes:
    """The fields shared by the events of one statement (workspace, object, action, cause,
    actor), encoded once per distinct combination (a bounded cache)."""
    key = (
        row.workspace_id,
        row.object_name,
        row.object_metadata_id,
        row.action,
        row.cause,
        row.actor_kind,
        row.actor_user_id,
        row.actor_credential_id,
        row.actor_workflow_id,
    )
    part = _constant_parts.get(key)
    if part is None:
        actor = (
            _number(
                _FIELD_1_VARINT,
                _ACTOR_KINDS.get(row.actor_kind, common_pb2.PRINCIPAL_KIND_UNSPECIFIED),
            )
            + _text(_FIELD_2_BYTES, row.actor_user_id)
            + _text(_FIELD_3_BYTES, row.actor_credential_id)
            + _text(_FIELD_4_BYTES, row.actor_workflow_id)
        )
        part = (
            _text(_WORKSPACE, row.workspace_id)
            + _text(_OBJECT, row.object_name)
            + _text(_OBJECT_METADATA, row.object_metadata_id)
            + _number(_ACTION, RECORD_ACTIONS[row.action])
            + _number(_CAUSE, _CAUSES.get(row.cause, events_pb2.CHANGE_CAUSE_UNSPECIFIED))
            + _ACTOR
            + encode_varint(len(actor))
            + actor
        )
        if len(_constant_parts) >= _CONSTANT_PARTS_KEPT:
            _constant_parts.clear()
        _constant_parts[key] = part
    return part


_SMALL = [bytes((n,)) for n in range(0x80)]
_last_occurred: list[Any] = [None, b""]  # the last timestamp encoded: a statement's rows share it


def _length(value: bytes) -> bytes:
    size = len(value)
    return _SMALL[size] if size < 0x80 else encode_varint(size)


def _occurred_at(moment: datetime) -> bytes:
    if moment == _last_occurred[0]:
        return cast(bytes, _last_occurred[1])
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    delta = moment - _EPOCH
    seconds = delta.days * 86_400 + delta.seconds
    timestamp = _number(_FIELD_1_VARINT, seconds) + _number(
        _FIELD_2_VARINT, delta.microseconds * 1000
    )
    encoded = _OCCURRED_AT + _length(timestamp) + timestamp
    _last_occurred[:] = [moment, encoded]
    return encoded


def encode_event(row: OutboxRow, trace_context: Mapping[str, str]) -> bytes:
    """`record_event(row).SerializeToString()`, parsed alike (the fields may be in another
    order), written directly rather than built as a message and serialised."""
    event_id = row.event_id.encode()
    record_id = row.record_id.encode()
    record = row.record.encode()
    previous = row.previous_record.encode() if row.previous_record else b""
    parts = [
        _ID,
        _length(event_id),
        event_id,
        _constant_part(row),
        _RECORD_ID,
        _length(record_id),
        record_id,
        _occurred_at(row.occurred_at),
        _SEQUENCE,
        encode_varint(row.sequence),
    ]
    if record:
        parts += (_RECORD_JSON, _length(record), record)
    if previous:
        parts += (_PREVIOUS_VALUES, _length(previous), previous)
    for name in row.changed_fields:
        field = name.encode()
        parts += (_CHANGED_FIELDS, _length(field), field)
    for key, value in trace_context.items():
        entry = _text(_FIELD_1_BYTES, key) + _text(_FIELD_2_BYTES, value)
        parts += (_TRACE_CONTEXT, _length(entry), entry)
    return b"".join(parts)


def _trace_context(raw: str) -> dict[str, str]:
    if not raw or raw == "{}":  # rows written outside any trace
        return {}
    try:
        decoded = orjson.loads(raw or "{}")
    except orjson.JSONDecodeError:
        return {}
    if not isinstance(decoded, dict):
        return {}
    return {
        key: value
        for key, value in decoded.items()
        if key in TRACE_HEADERS and isinstance(value, str)
    }


_HEADER_KEY = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_NEWLINES = str.maketrans({"\r": " ", "\n": " "})
_SUBJECT_INVALID = re.compile(r"[\s]")
_HEADER_NAMES: set[str] = set()  # names seen valid


def pub_frame(subject: str, reply: str, headers: Mapping[str, str], payload: bytes) -> bytes:
    """The NATS protocol frame publishing `payload` with `headers` (`HPUB`), byte for byte what
    nats-py's `Client.publish` writes; the relay writes many of them at once. Raises ValueError
    for a subject, reply or header the protocol cannot carry."""
    if not subject or _SUBJECT_INVALID.search(subject) or _SUBJECT_INVALID.search(reply):
        raise ValueError(f"invalid subject {subject!r} (reply {reply!r})")
    lines = ["NATS/1.0\r\n"]
    for key, value in headers.items():
        name = key
        if name not in _HEADER_NAMES:  # checked once per name
            name = key.strip()
            if not name:
                continue
            if not _HEADER_KEY.fullmatch(name):
                raise ValueError(f"invalid header name {name!r}")
            if name == key and len(_HEADER_NAMES) < 64:
                _HEADER_NAMES.add(name)
        text = value.strip()
        if "\r" in text or "\n" in text:
            text = text.translate(_NEWLINES)
        lines.append(f"{name}: {text}\r\n")
    lines.append("\r\n")
    block = "".join(lines).encode()
    return b"".join(
        (
            f"HPUB {subject} {reply} {len(block)} {len(block) + len(payload)}\r\n".encode(),
            block,
            payload,
            b"\r\n",
        )
    )
