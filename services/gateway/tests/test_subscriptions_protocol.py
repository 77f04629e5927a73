"""Parsing and encoding of graphql-transport-ws and legacy graphql-ws messages."""

from __future__ import annotations

import orjson
import pytest

from gateway.subscriptions.protocol import (
    GRAPHQL_TRANSPORT_WS,
    GRAPHQL_WS,
    CloseCode,
    Complete,
    ConnectionInit,
    LegacyGraphqlWs,
    Ping,
    Pong,
    ProtocolViolation,
    Subscribe,
    Terminate,
    TransportWs,
    negotiate,
)

transport = TransportWs()
legacy = LegacyGraphqlWs()


def test_negotiation_prefers_graphql_transport_ws() -> None:
    assert negotiate([GRAPHQL_WS, GRAPHQL_TRANSPORT_WS]) is not None
    assert negotiate([GRAPHQL_WS, GRAPHQL_TRANSPORT_WS]).name == GRAPHQL_TRANSPORT_WS  # type: ignore[union-attr]
    assert negotiate([GRAPHQL_WS]).name == GRAPHQL_WS  # type: ignore[union-attr]
    assert negotiate(["mqtt"]) is None
    assert negotiate([]) is None


def test_transport_messages_parse() -> None:
    init = transport.parse('{"type":"connection_init","payload":{"authorization":"Bearer x"}}')
    assert init == ConnectionInit({"authorization": "Bearer x"})
    assert transport.parse('{"type":"connection_init"}') == ConnectionInit({})
    assert transport.parse('{"type":"ping"}') == Ping(None)
    assert transport.parse(b'{"type":"pong","payload":{"a":1}}') == Pong()
    subscribe = transport.parse(
        '{"id":"1","type":"subscribe","payload":{"query":"subscription { a }",'
        '"variables":{"x":1},"operationName":null,"extensions":{}}}'
    )
    assert subscribe == Subscribe("1", "subscription { a }", {"x": 1}, None)
    assert transport.parse('{"id":"1","type":"complete"}') == Complete("1")


@pytest.mark.parametrize(
    "raw",
    [
        "not json",
        "[]",
        '{"type": 1}',
        '{"type":"start","id":"1","payload":{"query":"{a}"}}',  # legacy name on the new protocol
        '{"type":"next","id":"1","payload":{}}',  # a server message
        '{"type":"subscribe","payload":{"query":"{a}"}}',  # no id
        '{"type":"subscribe","id":"","payload":{"query":"{a}"}}',
        '{"type":"subscribe","id":"1","payload":{"variables":{}}}',  # no query
        '{"type":"subscribe","id":"1","payload":{"query":"{a}","variables":[]}}',
        '{"type":"subscribe","id":"1","payload":{"query":"{a}","operationName":3}}',
        '{"type":"connection_init","payload":"token"}',
        '{"type":"complete"}',
    ],
)
def test_invalid_transport_messages_close_with_4400(raw: str) -> None:
    with pytest.raises(ProtocolViolation) as caught:
        transport.parse(raw)
    assert caught.value.code == CloseCode.BAD_REQUEST


def test_transport_encoding() -> None:
    assert orjson.loads(transport.pong(Ping({"t": 1}))) == {"type": "pong", "payload": {"t": 1}}
    assert orjson.loads(transport.next("7", {"data": {"a": 1}})) == {
        "id": "7",
        "type": "next",
        "payload": {"data": {"a": 1}},
    }
    errors = [{"message": "no", "extensions": {"code": "FORBIDDEN"}}]
    assert [orjson.loads(m) for m in transport.errors("7", errors)] == [
        {"id": "7", "type": "error", "payload": errors}
    ]
    assert orjson.loads(transport.complete("7")) == {"id": "7", "type": "complete"}
    assert orjson.loads(transport.next_encoded('a"b', '{"data":{"x":1}}')) == {
        "id": 'a"b',
        "type": "next",
        "payload": {"data": {"x": 1}},
    }
    assert transport.keepalive() is None
    assert transport.duplicate_id_closes


def test_legacy_messages() -> None:
    assert legacy.parse('{"type":"connection_init","payload":{"a":1}}') == ConnectionInit({"a": 1})
    assert legacy.parse('{"type":"start","id":2,"payload":{"query":"{a}"}}') == Subscribe(
        "2", "{a}", None, None
    )
    assert legacy.parse('{"type":"stop","id":"2"}') == Complete("2")
    assert legacy.parse('{"type":"connection_terminate"}') == Terminate()
    with pytest.raises(ProtocolViolation):
        legacy.parse('{"type":"subscribe","id":"1","payload":{"query":"{a}"}}')
    assert orjson.loads(legacy.next("2", {"data": None})) == {
        "id": "2",
        "type": "data",
        "payload": {"data": None},
    }
    assert orjson.loads(legacy.next_encoded("2", '{"data":null}')) == orjson.loads(
        legacy.next("2", {"data": None})
    )
    errors = [{"message": "bad"}]
    assert [orjson.loads(m) for m in legacy.errors("2", errors)] == [
        {"id": "2", "type": "data", "payload": {"data": None, "errors": errors}},
        {"id": "2", "type": "complete"},
    ]
    assert orjson.loads(legacy.keepalive()) == {"type": "ka"}
    assert orjson.loads(legacy.connection_error("nope")) == {
        "type": "connection_error",
        "payload": {"message": "nope"},
    }
    assert not legacy.duplicate_id_closes
