"""Pure logic of the webhooks service: operations, the payload, signing (checked by the example
receiver's verify), sealed secrets, retry schedule, URL validation and event decoding."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime

import orjson
import pytest
from nats.aio.msg import Msg
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from crm.events.v1 import events_pb2
from crmkit.errors import InvalidArgument
from crmkit.messaging import EVENT_BATCH_HEADER, pack_events
from crmkit.retries import next_step, parse_retry_delays
from examples.webhook_receiver import VerificationError, verify
from webhooks.dispatcher import _stored_context
from webhooks.intake import _Batch, _events_in, _process_span, decode
from webhooks.operations import matching_patterns, validate_operations
from webhooks.payload import EventPayload, PayloadTooLarge, build_body, iso_timestamp
from webhooks.sealing import SecretBox, SecretUnavailable, new_secret
from webhooks.servicer import validate_target_url
from webhooks.signing import signature

KNOWN = ["person", "company", "invoice"]


def test_operations_are_validated_trimmed_and_deduplicated() -> None:
    assert validate_operations(["person.created", " *.* ", "person.created"], KNOWN) == [
        "person.created",
        "*.*",
    ]
    assert validate_operations(["invoice.*", "*.deleted"], KNOWN) == ["invoice.*", "*.deleted"]
    for bad, message in [
        ([], "at least one"),
        (["person"], "operations[0]"),
        (["person.created", "person.merged"], "operations[1]"),
        (["ghost.created"], "unknown object 'ghost'"),
        (["*"], "operations[0]"),
        (["person.created.x"], "operations[0]"),
        (["person.*"] * 51, "at most 50"),
    ]:
        with pytest.raises(InvalidArgument, match=re.escape(message)) as caught:
            validate_operations(bad, KNOWN)
        assert caught.value.field == "operations"


def test_an_event_matches_its_operation_and_the_wildcards() -> None:
    assert matching_patterns("person", "updated") == [
        "person.updated",
        "person.*",
        "*.updated",
        "*.*",
    ]


def payload(**changes: object) -> EventPayload:
    values: dict[str, object] = {
        "event_id": "e1",
        "workspace_id": "w1",
        "webhook_id": "h1",
        "operation": "person.updated",
        "occurred_at": datetime(2026, 11, 22, 10, 0, 1, 234567, tzinfo=UTC),
        "record": '{"id":"r1","city":"Paris"}',
        "previous_record": '{"id":"r1","city":"London"}',
    }
    values.update(changes)
    return EventPayload(**values)  # type: ignore[arg-type]


def test_body_has_the_spec_fields_in_order_with_records_embedded() -> None:
    body = build_body(payload())
    decoded = orjson.loads(body.content)
    assert list(decoded) == ["id", "workspaceId", "webhookId", "operation", "timestamp",
                             "record", "previousRecord"]  # fmt: skip
    assert decoded["timestamp"] == "2026-11-22T10:00:01.234Z"
    assert decoded["record"] == {"id": "r1", "city": "Paris"}
    assert decoded["previousRecord"] == {"id": "r1", "city": "London"}
    assert body.truncated == ()
    created = orjson.loads(build_body(payload(previous_record=None)).content)
    assert created["previousRecord"] is None


def test_oversized_bodies_drop_previous_record_then_fail() -> None:
    big = orjson.dumps({"id": "r1", "notes": "x" * 600_000}).decode()
    body = build_body(payload(record=big, previous_record=big))
    assert body.truncated == ("previousRecord",)
    assert orjson.loads(body.content)["previousRecord"] is None
    assert len(body.content) <= 1024 * 1024
    huge = orjson.dumps({"id": "r1", "notes": "x" * 1_100_000}).decode()
    with pytest.raises(PayloadTooLarge, match="over the 1048576 byte limit"):
        build_body(payload(record=huge, previous_record=None))


def test_fields_the_event_left_out_are_named_in_the_truncation_header() -> None:
    body = build_body(payload(previous_record=None), left_out=("previousRecord",))
    assert body.truncated == ("previousRecord",)
    assert orjson.loads(body.content)["previousRecord"] is None
    gone = build_body(payload(record=None, previous_record=None), left_out=("record",))
    assert gone.truncated == ("record",)
    assert orjson.loads(gone.content)["record"] is None


def test_iso_timestamp_is_utc_with_milliseconds() -> None:
    assert iso_timestamp(datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)) == "2026-01-02T03:04:05.000Z"


def test_the_signature_verifies_with_the_example_receiver() -> None:
    secret = new_secret()
    body = build_body(payload()).content
    now = int(time.time())
    header = signature(secret, now, body)
    assert header.startswith("sha256=")
    assert len(header) == len("sha256=") + 64
    assert verify(secret, body, header, str(now))["id"] == "e1"
    with pytest.raises(VerificationError, match="signature does not match"):
        verify(secret, body.replace(b"Paris", b"Paros"), header, str(now))
    with pytest.raises(VerificationError, match="signature does not match"):
        verify(new_secret(), body, header, str(now))
    with pytest.raises(VerificationError, match="signature does not match"):
        verify(secret, body, header, str(now + 1))  # the timestamp is signed too
    stale = now - 301
    with pytest.raises(VerificationError, match="300 s"):
        verify(secret, body, signature(secret, stale, body), str(stale))
    assert verify(secret, body, signature(secret, now - 299, body), str(now - 299))
    with pytest.raises(VerificationError, match="missing"):
        verify(secret, body, None, str(now))


def test_secrets_are_sealed_per_webhook_and_app_secret() -> None:
    box = SecretBox("an app secret of some length")
    secret = new_secret()
    assert secret.startswith("whsec_")
    sealed = box.seal("hook-1", secret)
    assert secret.encode() not in sealed
    assert box.open("hook-1", sealed) == secret
    assert box.seal("hook-1", secret) != sealed  # a fresh nonce each time
    with pytest.raises(SecretUnavailable):
        box.open("hook-2", sealed)
    with pytest.raises(SecretUnavailable, match="APP_SECRET"):
        SecretBox("another app secret value").open("hook-1", sealed)


def test_retry_schedule_follows_the_delays_then_fails() -> None:
    delays = (60.0, 300.0, 900.0, 3600.0, 21600.0)
    assert next_step(1, True, delays, success="delivered") == ("delivered", 0.0)
    assert next_step(1, True, delays) == ("succeeded", 0.0)
    assert [next_step(n, False, delays) for n in range(1, 7)] == [
        ("retry", 60.0),
        ("retry", 300.0),
        ("retry", 900.0),
        ("retry", 3600.0),
        ("retry", 21600.0),
        ("failed", 0.0),
    ]
    assert next_step(1, False, ()) == ("failed", 0.0)


def test_retry_delays_setting() -> None:
    assert parse_retry_delays("60,300,900,3600,21600") == (60, 300, 900, 3600, 21600)
    assert parse_retry_delays(" 0.5, 2 ") == (0.5, 2.0)
    assert parse_retry_delays("") == ()
    for bad in ("a,b", "0", "-1", "999999999"):
        with pytest.raises(ValueError, match=r"delay|number"):
            parse_retry_delays(bad)


def test_target_urls_are_validated() -> None:
    assert validate_target_url(" https://hooks.example.com/in?x=1 ") == (
        "https://hooks.example.com/in?x=1"
    )
    for bad, message in [
        ("", "required"),
        ("mailto:a@b.c", "http or https"),
        ("https://exa mple.com/", "spaces"),
        ("https://" + "a" * 2050, "2048"),
        ("http://u:p@example.com/", "user name"),
        ("http://example.com:70000/", "port"),
    ]:
        with pytest.raises(InvalidArgument, match=message) as caught:
            validate_target_url(bad)
        assert caught.value.field == "targetUrl"


def test_events_are_decoded_from_the_envelope() -> None:
    event = events_pb2.RecordEvent(
        id="e1",
        workspace_id="w1",
        object="person",
        action=events_pb2.RECORD_ACTION_DELETED,
        record_id="r1",
        record_json=b'{"id":"r1"}',
        sequence=9,
    )
    event.occurred_at.FromDatetime(datetime(2026, 1, 1, tzinfo=UTC))
    decoded = decode(event.SerializeToString())
    assert decoded is not None
    assert (decoded.action, decoded.record, decoded.previous_record) == ("deleted", '{"id":"r1"}',
                                                                         None)  # fmt: skip
    assert decoded.occurred_at == datetime(2026, 1, 1, tzinfo=UTC)
    assert decode(b"\xff\xff not protobuf") is None
    assert decode(events_pb2.RecordEvent(id="e2").SerializeToString()) is None
    assert not decoded.record_omitted
    assert not decoded.previous_record_omitted
    event.record_json, event.record_omitted, event.previous_record_omitted = b"", True, True
    trimmed = decode(event.SerializeToString())
    assert trimmed is not None
    assert (trimmed.record, trimmed.record_omitted, trimmed.previous_record_omitted) == (
        None,
        True,
        True,
    )


TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_intake_continues_the_trace_of_the_nats_headers_and_stores_its_own(
    spans: InMemorySpanExporter,
) -> None:
    message = Msg(
        _client=None,  # type: ignore[arg-type]  # never used: no reply, no ack here
        subject="crm.records.w1.person.created",
        headers={"Nats-Msg-Id": "e1", "traceparent": TRACEPARENT, "other": "x"},
    )
    span, stored = _process_span(message, "e1")
    span.end()
    (processed,) = spans.get_finished_spans()
    assert processed.kind == trace.SpanKind.CONSUMER
    assert processed.parent is not None
    assert format(processed.parent.span_id, "016x") == TRACEPARENT.split("-")[2]
    carried = orjson.loads(stored)
    assert set(carried) == {"traceparent"}
    _, trace_id, span_id, _ = carried["traceparent"].split("-")
    assert trace_id == TRACEPARENT.split("-")[1]
    assert span_id == format(processed.context.span_id, "016x")
    # A delivery attempt, later, continues from what was stored.
    context = _stored_context(stored)
    assert trace.get_current_span(context).get_span_context().span_id == processed.context.span_id


def test_an_event_without_trace_context_starts_no_trace(spans: InMemorySpanExporter) -> None:
    message = Msg(_client=None, subject="crm.records.w1.person.created")  # type: ignore[arg-type]
    span, stored = _process_span(message, "e1")
    span.end()
    assert spans.get_finished_spans() == ()
    assert stored == "{}"
    for junk in ("", "{}", "[1]", "not json", '{"traceparent": 5}'):
        assert not trace.get_current_span(_stored_context(junk)).get_span_context().is_valid


def test_decode_reads_the_instant_as_protobuf_does() -> None:
    for moment in (
        datetime(1970, 1, 1, tzinfo=UTC),
        datetime(2026, 11, 25, 13, 14, 15, 123456, tzinfo=UTC),
        datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    ):
        event = events_pb2.RecordEvent(
            id="e1", workspace_id="w1", object="person", action=events_pb2.RECORD_ACTION_CREATED
        )
        event.occurred_at.FromDatetime(moment)
        decoded = decode(event.SerializeToString())
        assert decoded is not None
        assert decoded.occurred_at == event.occurred_at.ToDatetime(tzinfo=UTC) == moment


def test_a_batch_message_is_read_as_its_events_each_in_the_trace(
    spans: InMemorySpanExporter,
) -> None:
    events = [
        events_pb2.RecordEvent(
            id=f"e{n}",
            workspace_id="w1",
            object="person",
            action=events_pb2.RECORD_ACTION_CREATED,
            record_id=f"r{n}",
            record_json=b'{"id":"r%d"}' % n,
        ).SerializeToString()
        for n in range(3)
    ]
    message = Msg(
        _client=None,  # type: ignore[arg-type]  # never used: no reply, no ack here
        subject="crm.records.w1.person.created",
        data=pack_events(events),
        headers={"Nats-Msg-Id": "e0+3", EVENT_BATCH_HEADER: "3", "traceparent": TRACEPARENT},
    )
    addressed = ("w1", "person", "created", message)
    batch = _Batch()
    decoded = batch.decoded([addressed])
    assert [(e.id, e.record) for e in decoded] == [(f"e{n}", f'{{"id":"r{n}"}}') for n in range(3)]
    assert batch.decoded([addressed]) == decoded  # decoded once
    assert _events_in([addressed]) == 3
    batch.end_spans()
    assert len(spans.get_finished_spans()) == 3
    assert all(orjson.loads(e.trace_context)["traceparent"] for e in decoded)
    broken = Msg(
        _client=None,  # type: ignore[arg-type]
        subject=message.subject,
        data=b"junk",
        headers=message.headers,
    )
    assert _Batch().decoded([("w1", "person", "created", broken)]) == []
