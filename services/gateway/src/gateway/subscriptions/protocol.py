"""The two GraphQL-over-WebSocket wire formats: parsing client messages, encoding server ones.

`graphql-transport-ws` (the graphql-ws library's protocol, github.com/enisdenjo/graphql-ws,
PROTOCOL.md) is the default. The legacy `graphql-ws` subprotocol (Apollo's
subscriptions-transport-ws) is served too: `start`/`stop`/`data` instead of
`subscribe`/`complete`/`next`, server keep-alive (`ka`) instead of ping/pong, and errors before
execution delivered as a `data` message with `errors` followed by `complete`, as that library does.

Both are parsed into the same message classes, so the session handles one state machine.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import orjson

GRAPHQL_TRANSPORT_WS = "graphql-transport-ws"
GRAPHQL_WS = "graphql-ws"


class CloseCode(IntEnum):
    NORMAL = 1000
    GOING_AWAY = 1001
    # The subscriber did not keep up; retryable (graphql-ws clients reconnect after it).
    TRY_AGAIN_LATER = 1013
    BAD_REQUEST = 4400
    UNAUTHORIZED = 4401
    FORBIDDEN = 4403
    SUBPROTOCOL_NOT_ACCEPTABLE = 4406
    INIT_TIMEOUT = 4408
    SUBSCRIBER_EXISTS = 4409
    TOO_MANY_INIT = 4429
    INTERNAL_ERROR = 4500


class ProtocolViolation(Exception):
    """The client broke the protocol: the socket closes with `code` and `reason`."""

    def __init__(self, reason: str, code: CloseCode = CloseCode.BAD_REQUEST) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


# -- client messages -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ConnectionInit:
    payload: Mapping[str, Any]


@dataclass(frozen=True)
class Ping:
    payload: Mapping[str, Any] | None


@dataclass(frozen=True)
class Pong:
    pass


@dataclass(frozen=True)
class Subscribe:
    id: str
    query: str
    variables: dict[str, Any] | None
    operation_name: str | None


@dataclass(frozen=True)
class Complete:
    id: str


@dataclass(frozen=True)
class Terminate:
    pass


ClientMessage = ConnectionInit | Ping | Pong | Subscribe | Complete | Terminate


def _load(data: str | bytes) -> dict[str, Any]:
    try:
        message = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise ProtocolViolation("Invalid message received: not JSON") from None
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise ProtocolViolation("Invalid message received: expected an object with a type")
    return message


def _optional_object(message: Mapping[str, Any], key: str, where: str) -> dict[str, Any] | None:
    value = message.get(key)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ProtocolViolation(f'"{where}" message expects the "{key}" property to be an object')
    return value


def _id(message: Mapping[str, Any], where: str, *, lenient: bool = False) -> str:
    value = message.get("id")
    if lenient and isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not value:
        raise ProtocolViolation(f'"{where}" message requires a non-empty string "id" property')
    return value


def _operation(message: Mapping[str, Any], where: str, *, lenient: bool = False) -> Subscribe:
    identifier = _id(message, where, lenient=lenient)
    payload = message.get("payload")
    if not isinstance(payload, dict):
        raise ProtocolViolation(f'"{where}" message expects the "payload" property to be an object')
    query = payload.get("query")
    if not isinstance(query, str):
        raise ProtocolViolation(f'"{where}" message payload expects a string "query" property')
    variables = _optional_object(payload, "variables", where)
    operation_name = payload.get("operationName")
    if operation_name is not None and not isinstance(operation_name, str):
        raise ProtocolViolation(
            f'"{where}" message payload expects "operationName" to be a string or null'
        )
    _optional_object(payload, "extensions", where)
    return Subscribe(identifier, query, variables, operation_name)


# -- wire formats ------------------------------------------------------------------------------


def _encode(message: Mapping[str, Any]) -> str:
    return orjson.dumps(message).decode()


def _result_message(type_: str, identifier: str, payload: Mapping[str, Any]) -> str:
    return _encode({"id": identifier, "type": type_, "payload": payload})


class WireFormat:
    """How messages look on one subprotocol; see the subclasses."""

    name: str = ""
    next_type: str = "next"  # the type of a result message
    keepalive_interval: float | None = None  # seconds between server keep-alive messages
    duplicate_id_closes: bool = True  # else a repeated id replaces the running operation

    def parse(self, data: str | bytes) -> ClientMessage:
        raise NotImplementedError

    def connection_ack(self) -> str:
        return _encode({"type": "connection_ack"})

    def connection_error(self, message: str) -> str | None:
        """Sent before closing on a refused connection_init, where the format has one."""
        return None

    def pong(self, ping: Ping) -> str | None:
        return None

    def keepalive(self) -> str | None:
        return None

    def next(self, identifier: str, result: Mapping[str, Any]) -> str:
        return _result_message(self.next_type, identifier, result)

    def next_encoded(self, identifier: str, payload: str) -> str:
        """A result message around an already encoded payload (shared by subscribers)."""
        return (
            f'{{"id":{orjson.dumps(identifier).decode()},"type":"{self.next_type}",'
            f'"payload":{payload}}}'
        )

    def errors(self, identifier: str, errors: list[dict[str, Any]]) -> list[str]:
        """An operation failed before it produced a result: the messages that say so."""
        raise NotImplementedError

    def complete(self, identifier: str) -> str:
        return _encode({"id": identifier, "type": "complete"})


class TransportWs(WireFormat):
    """graphql-transport-ws."""

    name = GRAPHQL_TRANSPORT_WS

    def parse(self, data: str | bytes) -> ClientMessage:
        message = _load(data)
        kind = message["type"]
        if kind == "connection_init":
            return ConnectionInit(_optional_object(message, "payload", kind) or {})
        if kind == "ping":
            return Ping(_optional_object(message, "payload", kind))
        if kind == "pong":
            _optional_object(message, "payload", kind)
            return Pong()
        if kind == "subscribe":
            return _operation(message, kind)
        if kind == "complete":
            return Complete(_id(message, kind))
        raise ProtocolViolation(f'Unexpected message of type "{kind}" received')

    def pong(self, ping: Ping) -> str:
        if ping.payload is None:
            return _encode({"type": "pong"})
        return _encode({"type": "pong", "payload": ping.payload})

    def errors(self, identifier: str, errors: list[dict[str, Any]]) -> list[str]:
        return [_encode({"id": identifier, "type": "error", "payload": errors})]


class LegacyGraphqlWs(WireFormat):
    """graphql-ws (Apollo subscriptions-transport-ws)."""

    name = GRAPHQL_WS
    next_type = "data"
    keepalive_interval = 15.0
    duplicate_id_closes = False

    def parse(self, data: str | bytes) -> ClientMessage:
        message = _load(data)
        kind = message["type"]
        if kind == "connection_init":
            return ConnectionInit(_optional_object(message, "payload", kind) or {})
        if kind == "start":
            return _operation(message, kind, lenient=True)
        if kind == "stop":
            return Complete(_id(message, kind, lenient=True))
        if kind == "connection_terminate":
            return Terminate()
        raise ProtocolViolation(f'Unexpected message of type "{kind}" received')

    def connection_error(self, message: str) -> str:
        return _encode({"type": "connection_error", "payload": {"message": message}})

    def keepalive(self) -> str:
        return _encode({"type": "ka"})

    def errors(self, identifier: str, errors: list[dict[str, Any]]) -> list[str]:
        return [
            _result_message("data", identifier, {"data": None, "errors": errors}),
            self.complete(identifier),
        ]


WIRE_FORMATS: dict[str, WireFormat] = {
    GRAPHQL_TRANSPORT_WS: TransportWs(),
    GRAPHQL_WS: LegacyGraphqlWs(),
}


def negotiate(offered: list[str]) -> WireFormat | None:
    """The format to speak: graphql-transport-ws when offered, else legacy graphql-ws."""
    for name in (GRAPHQL_TRANSPORT_WS, GRAPHQL_WS):
        if name in offered:
            return WIRE_FORMATS[name]
    return None
