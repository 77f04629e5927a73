"""Decoding record events and reading credentials and permissions for subscriptions."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from nats.aio.msg import Msg

from crm.common.v1 import common_pb2
from crm.events.v1 import events_pb2
from crmkit.messaging import EVENT_BATCH_HEADER, pack_events
from gateway.metrics import GatewayMetrics
from gateway.subscriptions.events import MalformedEvent, RecordChange, decode_change
from gateway.subscriptions.feed import RecordEventFeed
from gateway.subscriptions.session import authorization_of, may_read_something


def event(**fields: object) -> events_pb2.RecordEvent:
    defaults: dict[str, object] = {
        "id": "e1",
        "workspace_id": "w1",
        "object": "person",
        "action": events_pb2.RECORD_ACTION_UPDATED,
        "record_json": orjson.dumps({"id": "r1", "firstName": "Ada"}),
    }
    defaults.update(fields)
    return events_pb2.RecordEvent(**defaults)  # type: ignore[arg-type]


def test_a_record_event_decodes_with_its_commit_time_and_trace_context() -> None:
    stamp = Timestamp(seconds=1_800_000_000, nanos=500_000_000)
    message = event(occurred_at=stamp, trace_context={"traceparent": "from-envelope"})
    change = decode_change(message.SerializeToString())
    assert (change.id, change.workspace_id, change.object, change.action) == (
        "e1",
        "w1",
        "person",
        "updated",
    )
    assert change.record == {"id": "r1", "firstName": "Ada"}
    assert change.occurred_at == 1_800_000_000.5
    assert change.trace_context == {"traceparent": "from-envelope"}
    headers = {"traceparent": "from-headers", "Nats-Msg-Id": "e1"}
    assert decode_change(message.SerializeToString(), headers).trace_context == {
        "traceparent": "from-headers"
    }


def test_an_event_without_its_record_asks_for_it_by_id() -> None:
    message = event(record_json=b"", record_omitted=True, record_id="r9")
    change = decode_change(message.SerializeToString())
    assert change.record_omitted
    assert change.record_id == "r9"
    assert change.record == {}


@pytest.mark.parametrize(
    "data",
    [
        b"\xff\xff not a protobuf",
        event(action=events_pb2.RECORD_ACTION_UNSPECIFIED).SerializeToString(),
        event(workspace_id="").SerializeToString(),
        event(record_json=b"{not json").SerializeToString(),
        event(record_json=b"[1, 2]").SerializeToString(),
        event(record_json=b"", record_omitted=True).SerializeToString(),  # and no record id
    ],
)
def test_malformed_events_are_refused(data: bytes) -> None:
    with pytest.raises(MalformedEvent):
        decode_change(data)


def test_the_credential_is_read_from_the_init_payload() -> None:
    assert authorization_of({"authorization": "Bearer a"}) == "Bearer a"
    assert authorization_of({"Authorization": "Bearer b"}) == "Bearer b"
    assert authorization_of({"headers": {"Authorization": "Bearer c"}}) == "Bearer c"
    assert authorization_of({"authorization": 42}) is None
    assert authorization_of({}) is None


def _principal(*permissions: common_pb2.ObjectPermission, **fields: object) -> common_pb2.Principal:
    return common_pb2.Principal(workspace_id="w1", permissions=list(permissions), **fields)  # type: ignore[arg-type]


def test_a_principal_that_may_read_nothing_is_told_apart() -> None:
    read = common_pb2.ACTION_READ
    write = common_pb2.ACTION_WRITE
    assert may_read_something(_principal(common_pb2.ObjectPermission(object="*", actions=[read])))
    assert may_read_something(
        _principal(common_pb2.ObjectPermission(object="person", actions=[read]))
    )
    assert not may_read_something(
        _principal(common_pb2.ObjectPermission(object="*", actions=[write]))
    )
    assert not may_read_something(_principal())
    oauth = common_pb2.PRINCIPAL_KIND_OAUTH
    everything = common_pb2.ObjectPermission(object="*", actions=[read, write])
    assert may_read_something(_principal(everything, kind=oauth, scopes=["read:person"]))
    assert not may_read_something(_principal(everything, kind=oauth, scopes=["write:person"]))


class _NoJetStream:
    """The feed's client, never reached by `_dispatch` (it only builds the JetStream context)."""

    def jetstream(self) -> None:
        return None


def test_the_feed_hands_on_each_event_of_a_batch_once() -> None:
    delivered: list[RecordChange] = []

    def deliver(change: RecordChange) -> int:
        delivered.append(change)
        return 1

    nats: Any = _NoJetStream()
    feed = RecordEventFeed(nats, lambda *_: True, deliver, GatewayMetrics.create())
    payloads = [event(id=f"e{n}", record_json=b'{"id":"r%d"}' % n) for n in range(3)]

    def batch(*ids: int) -> Msg:
        return Msg(
            _client=None,  # type: ignore[arg-type]  # never used: no reply
            subject="crm.records.w1.person.updated",
            data=pack_events([payloads[n].SerializeToString() for n in ids]),
            headers={"Nats-Msg-Id": f"e{ids[0]}+{len(ids)}", EVENT_BATCH_HEADER: str(len(ids))},
        )

    assert asyncio.run(feed._dispatch(batch(0, 1)))
    assert [change.id for change in delivered] == ["e0", "e1"]
    assert delivered[1].record == {"id": "r1"}
    # Published again in another grouping (after a relay takeover): only the new event goes on.
    assert asyncio.run(feed._dispatch(batch(1, 2)))
    assert [change.id for change in delivered] == ["e0", "e1", "e2"]
    junk = Msg(_client=None, subject=batch(0).subject, data=b"x", headers=batch(0).headers)  # type: ignore[arg-type]
    assert not asyncio.run(feed._dispatch(junk))
