"""Outbox rows as JetStream messages: envelope fields, the record carried once, size trimming,
the envelope written without protobuf, the publish frames."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from nats.aio.client import Client as NatsClient
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from crm.common.v1 import common_pb2
from crm.events.v1 import events_pb2
from crmkit import telemetry
from crmkit.messaging import (
    EVENT_BATCH_HEADER,
    event_count,
    event_payloads,
    previous_record_json,
)
from records.envelope import (
    BATCH_EVENTS,
    Message,
    OutboxRow,
    encode_event,
    message_of,
    messages_of,
    pub_frame,
    record_event,
    timestamp_of,
)
from records.relay import _publish_span

WS = "11111111-2222-4333-8444-555555555555"
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def row(sequence: int = 7, record_id: str = "r1", **changes: object) -> OutboxRow:
    values: dict[str, object] = {
        "sequence": sequence,
        "event_id": f"e{sequence}",
        "workspace_id": WS,
        "object_name": "person",
        "object_metadata_id": "m1",
        "record_id": record_id,
        "action": "updated",
        "cause": "restore",
        "record": '{"id": "r1", "city": "B"}',
        "previous_record": '{"id": "r1", "city": "A"}',
        "changed_fields": ["city"],
        "actor_kind": "api_key",
        "actor_user_id": "",
        "actor_credential_id": "k1",
        "actor_workflow_id": "",
        "trace_context": orjson.dumps({"traceparent": TRACEPARENT, "other": "x"}).decode(),
        "occurred_at": datetime(2026, 11, 22, 10, 0, tzinfo=UTC),
    }
    values.update(changes)
    return OutboxRow(**values)  # type: ignore[arg-type]


def decode(message: Message) -> events_pb2.RecordEvent:
    event = events_pb2.RecordEvent()
    event.ParseFromString(message.payload)
    return event


def test_message_carries_subject_id_trace_and_envelope() -> None:
    message = message_of(row(), max_payload=1024 * 1024)
    assert message.subject == f"crm.records.{WS}.person.updated"
    assert message.headers == {"Nats-Msg-Id": "e7", "traceparent": TRACEPARENT}
    event = decode(message)
    assert event.id == "e7"
    assert event.action == events_pb2.RECORD_ACTION_UPDATED
    assert event.cause == events_pb2.CHANGE_CAUSE_RESTORE
    assert event.actor.kind == common_pb2.PRINCIPAL_KIND_API_KEY
    assert event.actor.credential_id == "k1"
    assert orjson.loads(event.record_json) == {"id": "r1", "city": "B"}
    assert orjson.loads(previous_record_json(event)) == {"id": "r1", "city": "A"}
    assert event.occurred_at.ToDatetime(tzinfo=UTC) == datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
    assert event.sequence == 7
    assert list(event.changed_fields) == ["city"]
    assert not event.previous_record_omitted
    assert not event.record_omitted


def test_the_record_travels_once_and_the_previous_record_is_rebuilt_from_it() -> None:
    stored = row(
        record='{"id": "r1", "city": "B", "name": "Ada", "updatedAt": "2"}',
        previous_record='{"city": "A", "updatedAt": "1"}',
    )
    event = decode(message_of(stored, 10**6))
    assert event.previous_record_json == b""  # only the replaced values travel
    assert orjson.loads(event.previous_values_json) == {"city": "A", "updatedAt": "1"}
    previous = orjson.loads(previous_record_json(event))
    assert previous == {"id": "r1", "city": "A", "name": "Ada", "updatedAt": "1"}
    assert list(previous) == ["id", "city", "name", "updatedAt"]  # the record's key order
    unchanged = decode(message_of(row(previous_record="{}"), 10**6))
    assert orjson.loads(previous_record_json(unchanged)) == {"id": "r1", "city": "B"}
    # An event from a relay that sent the whole before state reads as it did.
    whole = events_pb2.RecordEvent(record_json=b'{"id": "r1"}', previous_record_json=b'{"a": 1}')
    assert previous_record_json(whole) == b'{"a": 1}'


def test_created_has_no_previous_record_and_bad_trace_context_is_ignored() -> None:
    created = row(action="created", previous_record=None, trace_context="[]")
    event = decode(message_of(created, 10**6))
    assert previous_record_json(event) == b""
    assert dict(event.trace_context) == {}


def test_oversized_envelopes_drop_previous_then_record() -> None:
    big = orjson.dumps({"id": "r1", "notes": "x" * 60_000}).decode()
    limit = 8 * 1024 + 70_000  # room for one copy of the record, not two
    event = decode(message_of(row(record=big, previous_record=big), limit))
    assert event.previous_record_omitted
    assert previous_record_json(event) == b""
    assert not event.record_omitted
    assert orjson.loads(event.record_json)["id"] == "r1"
    event = decode(message_of(row(record=big, previous_record=big), 8 * 1024 + 20_000))
    assert event.previous_record_omitted
    assert event.record_omitted
    assert event.record_id == "r1"


def test_publish_continues_the_stored_trace_and_sends_its_own_span(
    spans: InMemorySpanExporter,
) -> None:
    message = message_of(row(), max_payload=1024 * 1024)
    span, headers = _publish_span(message)
    span.end()
    (published,) = spans.get_finished_spans()
    assert published.name == "publish CRM_RECORDS"
    assert published.kind == trace.SpanKind.PRODUCER
    assert format(published.context.trace_id, "032x") == TRACEPARENT.split("-")[1]
    assert published.parent is not None
    assert format(published.parent.span_id, "016x") == TRACEPARENT.split("-")[2]
    assert published.attributes is not None
    assert published.attributes["messaging.message.id"] == "e7"
    assert headers["Nats-Msg-Id"] == "e7"
    _, trace_id, span_id, _ = headers["traceparent"].split("-")
    assert trace_id == TRACEPARENT.split("-")[1]
    assert span_id == format(published.context.span_id, "016x")
    assert message.headers["traceparent"] == TRACEPARENT  # the message itself is unchanged


def test_a_row_written_outside_any_trace_is_published_without_a_span(
    spans: InMemorySpanExporter,
) -> None:
    message = message_of(row(trace_context="{}"), max_payload=1024 * 1024)
    span, headers = _publish_span(message)
    span.end()
    assert spans.get_finished_spans() == ()
    assert headers == {"Nats-Msg-Id": "e7"}


def test_timestamp_of_equals_protobufs_conversion() -> None:
    for moment in (
        datetime(1970, 1, 1, tzinfo=UTC),
        datetime(2026, 11, 25, 13, 14, 15, 123456, tzinfo=UTC),
        datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        datetime(2026, 1, 2, 3, 4, 5, 6),  # naive: UTC, as protobuf reads it
    ):
        expected = Timestamp()
        expected.FromDatetime(moment)
        assert timestamp_of(moment) == expected


def test_a_row_of_an_unsampled_trace_keeps_its_context_when_nothing_records(
    spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(telemetry, "_only_sampled_parents", True)
    unsampled = TRACEPARENT[:-2] + "00"
    message = message_of(
        row(trace_context=orjson.dumps({"traceparent": unsampled}).decode()), 1024 * 1024
    )
    span, headers = _publish_span(message)
    span.end()
    assert spans.get_finished_spans() == ()
    assert headers == {"Nats-Msg-Id": "e7", "traceparent": unsampled}


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"action": "created", "previous_record": None, "changed_fields": [], "cause": "write"},
        {"action": "deleted", "cause": "merge", "previous_record": "{}"},
        {"record": orjson.dumps({"id": "r1", "notes": "é" * 100}).decode()},  # two-byte lengths
        {"record": orjson.dumps({"notes": "x" * 20_000}).decode()},  # three-byte lengths
        {"changed_fields": ["city", "name", "ünïcode"], "sequence": 2**40},
        {"actor_kind": "system", "actor_user_id": "u1", "actor_workflow_id": "w1"},
        {"actor_kind": "something new", "actor_credential_id": "", "cause": "unknown"},
        {"trace_context": orjson.dumps({"traceparent": TRACEPARENT, "tracestate": "a=1"}).decode()},
        {"trace_context": "{}", "object_metadata_id": "", "workspace_id": WS.upper()},
        {"occurred_at": datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)},
        {"occurred_at": datetime(2026, 1, 2, 3, 4, 5, 6)},  # naive: UTC
        {"occurred_at": datetime(1970, 1, 1, tzinfo=UTC), "sequence": 1},
    ],
)
def test_the_written_envelope_is_the_protobuf_one(changes: dict[str, Any]) -> None:
    stored = row(**changes)
    expected = record_event(stored)
    for _ in range(2):  # the second time from the cached parts
        written = events_pb2.RecordEvent.FromString(
            encode_event(stored, dict(expected.trace_context))
        )
        assert written == expected
        assert written.SerializeToString(deterministic=True) == expected.SerializeToString(
            deterministic=True
        )
    assert decode(message_of(stored, 10**6)) == expected


async def test_publish_frames_are_nats_pys_own(monkeypatch: pytest.MonkeyPatch) -> None:
    client = NatsClient()
    sent: list[bytes] = []

    async def capture(command: bytes, priority: bool = False) -> None:
        sent.append(command)

    monkeypatch.setattr(client, "_send_command", capture)
    headers = {"Nats-Msg-Id": "e7", "traceparent": TRACEPARENT, "tracestate": " a=1\r\nPUB x "}
    subject = f"crm.records.{WS}.person.updated"
    for payload in (b"\x00\x01 binary \r\n", b""):
        await client._send_publish(subject, "_INBOX.abc.3x17", payload, len(payload), headers)
        assert pub_frame(subject, "_INBOX.abc.3x17", headers, payload) == sent[-1]
    for bad in ("crm.records.a b", "", "crm.records.x\r\nPUB"):
        with pytest.raises(ValueError, match="invalid subject"):
            pub_frame(bad, "_INBOX.abc.1", {}, b"")
    with pytest.raises(ValueError, match="invalid header"):
        pub_frame(subject, "_INBOX.abc.1", {"bad name": "x"}, b"")


# -- bulk rows (an import's) share messages ----------------------------------------------------

MAX_PAYLOAD = 1024 * 1024


def bulk(sequence: int, **changes: object) -> OutboxRow:
    values: dict[str, object] = {
        "record_id": f"r{sequence}",
        "action": "created",
        "cause": "write",
        "previous_record": None,
        "changed_fields": [],
        "bulk": True,
    }
    values.update(changes)
    return row(sequence, **values)  # type: ignore[arg-type]


def events_of(message: Message) -> list[events_pb2.RecordEvent]:
    return [
        events_pb2.RecordEvent.FromString(payload)
        for payload in event_payloads(message.payload, message.headers)
    ]


def test_consecutive_bulk_rows_of_one_write_travel_together() -> None:
    rows = [bulk(sequence) for sequence in range(1, 6)]
    [message] = messages_of(rows, MAX_PAYLOAD)
    assert message.subject == f"crm.records.{WS}.person.created"
    assert message.headers == {
        "Nats-Msg-Id": "e1+5",
        EVENT_BATCH_HEADER: "5",
        "traceparent": TRACEPARENT,
    }
    assert message.sequences == [1, 2, 3, 4, 5]
    assert message.record_ids == ["r1", "r2", "r3", "r4", "r5"]
    alone = [events_pb2.RecordEvent.FromString(message_of(r, MAX_PAYLOAD).payload) for r in rows]
    assert events_of(message) == alone  # each event exactly as it would travel alone
    assert event_count(message.headers) == 5
    assert len(message.payload) < sum(len(m.SerializeToString()) for m in alone) / 2


def test_rows_that_are_not_bulk_or_alone_keep_one_message_each() -> None:
    lone = messages_of([bulk(1)], MAX_PAYLOAD)
    assert [m.headers for m in lone] == [{"Nats-Msg-Id": "e1", "traceparent": TRACEPARENT}]
    plain = messages_of([row(1, "a"), row(2, "b")], MAX_PAYLOAD)
    assert [m.sequences for m in plain] == [[1], [2]]
    assert all(EVENT_BATCH_HEADER not in m.headers for m in plain)
    assert event_count(plain[0].headers) == 1
    unbatched = messages_of([bulk(1), bulk(2)], MAX_PAYLOAD, batches=False)
    assert [m.headers["Nats-Msg-Id"] for m in unbatched] == ["e1", "e2"]


@pytest.mark.parametrize(
    "other",
    [
        {"bulk": False},  # a write in between
        {"action": "updated"},  # an upsert's updates follow its creates
        {"trace_context": "{}"},  # another request
        {"workspace_id": "99999999-2222-4333-8444-555555555555"},
        {"object_name": "company"},
        {"record_id": "r1"},  # a record twice: its events stay in order, one in flight at once
    ],
)
def test_a_batch_ends_where_the_write_changes(other: dict[str, object]) -> None:
    rows = [bulk(1), bulk(2), bulk(3, **other), bulk(4, **other)]
    messages = messages_of(rows, MAX_PAYLOAD)
    assert messages[0].sequences == [1, 2]
    assert [s for m in messages for s in m.sequences] == [1, 2, 3, 4]  # outbox order kept


def test_a_batch_holds_at_most_its_events_and_bytes() -> None:
    many = messages_of([bulk(s) for s in range(1, BATCH_EVENTS + 3)], MAX_PAYLOAD)
    assert [len(m.sequences) for m in many] == [BATCH_EVENTS, 2]
    padded = '{"id": "r", "note": "' + "y" * 600 + '"}'
    size = len(encode_event(bulk(1, record=padded), {"traceparent": TRACEPARENT}))
    small_server = 8 * 1024 + 3 * size + size // 2  # 3.5 events beyond the framing allowance
    capped = messages_of([bulk(s, record=padded) for s in range(1, 8)], small_server)
    assert all(len(m.sequences) <= 3 for m in capped)
    assert [s for m in capped for s in m.sequences] == list(range(1, 8))
    huge = bulk(9, record='{"id": "r9", "note": "' + "x" * 300_000 + '"}')
    [alone] = messages_of([huge], MAX_PAYLOAD)
    assert EVENT_BATCH_HEADER not in alone.headers
