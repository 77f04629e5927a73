"""One GraphQL WebSocket connection, from connection_init to close.

The client has SUBSCRIPTION_INIT_TIMEOUT seconds to send `connection_init`, whose payload carries
`authorization: "Bearer <token>"` (also read: `Authorization`, or either inside `headers`). The
credential is verified by the same code as HTTP (`gateway.auth.authenticate`): a bad, expired or
revoked one closes the socket with 4401, a principal that may read no object at all with 4403.
Then every `subscribe` runs as its own task against the caller's workspace schema: queries and
mutations answer one `next` and `complete`, subscriptions stream `next` per event. Each
`subscribe` verifies the credential again first (one Redis read, as an HTTP request does), and
open subscriptions are re-checked every SUBSCRIPTION_REVALIDATE_INTERVAL seconds: once it
expires or is revoked the socket closes with 4401 (4403 when it may read nothing any more); when
what the caller may read changes, subscriptions to objects it may no longer read end with a
FORBIDDEN error and the others restart under the new principal (same id, nothing sent), so
relation fields and own-records rules follow the change.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine, Mapping
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, Protocol

import strawberry
from starlette.websockets import WebSocket, WebSocketDisconnect
from strawberry.types.execution import ExecutionResult, PreExecutionError

from crm.common.v1 import common_pb2
from crmkit.authz import READ, object_access
from crmkit.errors import Internal, PermissionDenied, ServiceError, Unauthenticated
from crmkit.jsondepth import MAX_DOCUMENT_DEPTH, check_depth
from gateway.auth import authenticate, credential_verifier
from gateway.auth.verify import bearer_token
from gateway.datamodel.model import DataModel
from gateway.errors import graphql_extensions
from gateway.graphql.errors import format_graphql_error, is_request_error, parse_quietly
from gateway.graphql.limits import QueryLimits, check_request
from gateway.settings import GatewaySettings
from gateway.state import GatewayState
from gateway.subscriptions.admission import admit_operation
from gateway.subscriptions.context import SocketContext
from gateway.subscriptions.hub import EventSubscription
from gateway.subscriptions.protocol import (
    CloseCode,
    Complete,
    ConnectionInit,
    Ping,
    Pong,
    ProtocolViolation,
    Subscribe,
    Terminate,
    WireFormat,
)
from gateway.subscriptions.rendering import (
    CheckedDocument,
    render_key,
    start_subscription,
    visibility,
)

log = logging.getLogger("gateway.subscriptions")

Record = Mapping[str, Any]
_MAX_REASON_BYTES = 123  # WebSocket close reasons are at most 123 bytes of UTF-8


@dataclass(frozen=True)
class PreparedSchema:
    """The schema an operation runs against, and the data model it was built from."""

    schema: strawberry.Schema
    model: DataModel | None


class SchemaSource(Protocol):
    def check(self, schema: strawberry.Schema, query: str) -> CheckedDocument | None:
        """The query parsed and validated against `schema` (None: it does not parse)."""
        ...

    async def prepare(
        self, state: GatewayState, principal: common_pb2.Principal
    ) -> PreparedSchema: ...

    async def refresh(
        self, state: GatewayState, principal: common_pb2.Principal, stale: PreparedSchema
    ) -> PreparedSchema | None:
        """A schema built from a newer data model, or None when the model did not change."""
        ...


def authorization_of(payload: Mapping[str, Any]) -> str | None:
    """The `Bearer <token>` value of a connection_init payload."""
    for holder in (payload, payload.get("headers")):
        if not isinstance(holder, Mapping):
            continue
        for key in ("authorization", "Authorization"):
            value = holder.get(key)
            if isinstance(value, str):
                return value
    return None


def may_read_something(principal: common_pb2.Principal) -> bool:
    """Whether the principal may read the records of at least one object."""
    names = {permission.object for permission in principal.permissions}
    names.update(scope.partition(":")[2] for scope in principal.scopes if ":" in scope)
    return any(object_access(principal, name, READ) is not None for name in names if name)


def _reason(text: str) -> str:
    encoded = text.encode()
    if len(encoded) <= _MAX_REASON_BYTES:
        return text
    return encoded[: _MAX_REASON_BYTES - 3].decode(errors="ignore") + "..."


def _error_dicts(error: ServiceError) -> list[dict[str, Any]]:
    return [{"message": error.message, "extensions": graphql_extensions(error)}]


def _rejected_by_schema(result: ExecutionResult) -> bool:
    """Parse, validation or variable errors: no resolver ran."""
    errors = result.errors or ()
    return bool(errors) and all(e.path is None and is_request_error(e) for e in errors)


def _result_payload(result: ExecutionResult, query: str) -> dict[str, Any]:
    payload: dict[str, Any] = {"data": result.data}
    if result.errors:
        document = parse_quietly(query)
        payload["errors"] = [format_graphql_error(error, document) for error in result.errors]
    if result.extensions:
        payload["extensions"] = result.extensions
    return payload


class SocketSession:
    def __init__(
        self,
        websocket: WebSocket,
        wire: WireFormat,
        state: GatewayState,
        schemas: SchemaSource,
    ) -> None:
        self.websocket = websocket
        self.wire = wire
        self.state = state
        self.schemas = schemas
        self.settings = state.settings
        self.principal: common_pb2.Principal | None = None
        self._authorization: str | None = None
        self._init_received = False
        self._closed = False
        self._operations: dict[str, asyncio.Task[None]] = {}
        self._messages: dict[str, Subscribe] = {}  # of running operations, to restart them
        self._streams: dict[str, EventSubscription] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    # -- lifecycle ---------------------------------------------------------------------------

    async def run(self) -> None:
        metrics = self.state.metrics
        metrics.websocket_connections.inc()
        self._spawn(self._init_deadline())
        try:
            while True:
                message = await self.websocket.receive()
                if message["type"] == "websocket.disconnect":
                    break
                data = message.get("text")
                if data is None:
                    data = message.get("bytes")
                if data is None or self._closed:
                    continue
                try:
                    await self._handle(self.wire.parse(data))
                except ProtocolViolation as exc:
                    await self.close(exc.code, exc.reason)
        except (WebSocketDisconnect, RuntimeError, OSError):
            pass  # the client went away
        finally:
            self._closed = True
            self._stop_operations()
            for task in list(self._tasks):
                task.cancel()
            metrics.websocket_connections.dec()

    async def close(self, code: int, reason: str) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop_operations()
        with contextlib.suppress(Exception):
            await self.websocket.close(code, _reason(reason))

    def _request_close(self, code: int, reason: str) -> None:
        """Close from a callback or an operation's own task (never cancels the caller)."""
        if not self._closed:
            self._spawn(self.close(code, reason))

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _stop_operations(self) -> None:
        for stream in self._streams.values():
            stream.close()
        self._streams.clear()
        for task in self._operations.values():
            task.cancel()
        self._operations.clear()
        self._messages.clear()

    async def _send(self, text: str) -> None:
        if self._closed:
            return
        with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
            await self.websocket.send_text(text)

    # -- messages ----------------------------------------------------------------------------

    async def _handle(self, message: object) -> None:
        if isinstance(message, Subscribe):
            self._subscribe(message)
        elif isinstance(message, Complete):
            self._complete(message.id)
        elif isinstance(message, Ping):
            pong = self.wire.pong(message)
            if pong is not None:
                await self._send(pong)
        elif isinstance(message, Pong):
            pass
        elif isinstance(message, ConnectionInit):
            await self._connection_init(message)
        elif isinstance(message, Terminate):
            await self.close(CloseCode.NORMAL, "Connection terminated by the client")

    async def _init_deadline(self) -> None:
        await asyncio.sleep(self.settings.SUBSCRIPTION_INIT_TIMEOUT)
        if not self._init_received:
            self._request_close(CloseCode.INIT_TIMEOUT, "Connection initialisation timeout")

    async def _connection_init(self, message: ConnectionInit) -> None:
        if self._init_received:
            raise ProtocolViolation("Too many initialisation requests", CloseCode.TOO_MANY_INIT)
        self._init_received = True
        authorization = authorization_of(message.payload)
        try:
            principal = await authenticate(self.websocket, authorization)
            if not may_read_something(principal):
                raise PermissionDenied("Forbidden: this credential may not read any records")
        except ServiceError as exc:
            await self._refuse(exc)
            return
        self.principal = principal
        self._authorization = authorization
        await self._send(self.wire.connection_ack())
        if self.wire.keepalive_interval is not None:
            self._spawn(self._keepalive(self.wire.keepalive_interval))
        self._spawn(self._revalidate(self.settings.SUBSCRIPTION_REVALIDATE_INTERVAL))

    async def _refuse(self, error: ServiceError) -> None:
        if isinstance(error, Unauthenticated):
            code = CloseCode.UNAUTHORIZED
        elif isinstance(error, PermissionDenied):
            code = CloseCode.FORBIDDEN
        else:
            log.warning("connection_init failed", extra={"error": error.message})
            code = CloseCode.TRY_AGAIN_LATER
        refusal = self.wire.connection_error(error.message)
        if refusal is not None:
            await self._send(refusal)
        await self.close(code, error.message)

    def _subscribe(self, message: Subscribe) -> None:
        if self.principal is None:
            raise ProtocolViolation("Unauthorized", CloseCode.UNAUTHORIZED)
        if message.id in self._operations:
            if self.wire.duplicate_id_closes:
                raise ProtocolViolation(
                    f"Subscriber for {message.id} already exists", CloseCode.SUBSCRIBER_EXISTS
                )
            self._end(message.id)
        if len(self._operations) >= self.settings.SUBSCRIPTION_MAX_OPERATIONS:
            self._spawn(self._send_errors(message.id, _too_many(self.settings)))
            return
        self._start(message, None)

    def _start(self, message: Subscribe, principal: common_pb2.Principal | None) -> None:
        """Run `message` as `principal`; None: verify the credential again first."""
        task = asyncio.create_task(self._execute(message, principal))
        self._operations[message.id] = task
        self._messages[message.id] = message
        task.add_done_callback(lambda done: self._forget(message.id, done))

    def _complete(self, identifier: str) -> None:
        if self._end(identifier) and not self.wire.duplicate_id_closes:
            # Legacy graphql-ws acknowledges `stop` with `complete`.
            self._spawn(self._send(self.wire.complete(identifier)))

    def _end(self, identifier: str) -> bool:
        stream = self._streams.pop(identifier, None)
        if stream is not None:
            stream.close()
        task = self._operations.pop(identifier, None)
        self._messages.pop(identifier, None)
        if task is None:
            return False
        task.cancel()
        return True

    def _forget(self, identifier: str, task: asyncio.Task[None]) -> None:
        if self._operations.get(identifier) is task:
            del self._operations[identifier]
            self._messages.pop(identifier, None)
            stream = self._streams.pop(identifier, None)
            if stream is not None:
                stream.close()

    async def _send_errors(self, identifier: str, errors: list[dict[str, Any]]) -> None:
        for text in self.wire.errors(identifier, errors):
            await self._send(text)

    # -- operations --------------------------------------------------------------------------

    async def _execute(self, message: Subscribe, principal: common_pb2.Principal | None) -> None:
        identifier = message.id
        try:
            new_operation = principal is None  # a restart is not one: not charged again
            if principal is None:
                principal = await self._verified()
                if principal is None:
                    return  # the socket is closing
            prepared = await self.schemas.prepare(self.state, principal)
            try:
                check_depth(
                    message.variables, MAX_DOCUMENT_DEPTH, field="variables", what="`variables`"
                )
                analysis = check_request(
                    prepared.schema._schema,
                    message.query,
                    message.variables,
                    message.operation_name,
                    QueryLimits.of(self.state.settings),
                )
            except ServiceError:
                if new_operation:
                    await admit_operation(self.state, principal)
                raise
            if new_operation:
                await admit_operation(self.state, principal, analysis.calls if analysis else 1)
            if not await self._stream(message, principal, prepared, may_be_stale=True):
                # Rejected by the schema: perhaps an object created a moment ago through another
                # gateway. Nothing ran, so running it again on a fresher schema is safe.
                fresh = await self.schemas.refresh(self.state, principal, prepared)
                await self._stream(message, principal, fresh or prepared, may_be_stale=False)
        except ServiceError as exc:
            await self._send_errors(identifier, _error_dicts(exc))
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("GraphQL operation over WebSocket failed")
            await self._send_errors(identifier, _error_dicts(Internal("internal server error")))

    async def _stream(
        self,
        message: Subscribe,
        principal: common_pb2.Principal,
        prepared: PreparedSchema,
        *,
        may_be_stale: bool,
    ) -> bool:
        """Runs the operation, sending its results; False (nothing sent) when the schema
        rejected it and `may_be_stale`."""
        identifier = message.id
        context = SocketContext(
            connection=self.websocket,
            state=self.state,
            principal=principal,
            model=prepared.model,
            session=self,
            operation_id=identifier,
        )
        checked = self.schemas.check(prepared.schema, message.query)
        if checked is not None and checked.is_subscription(message.operation_name):
            return await self._subscription(
                message, principal, prepared, checked, context, may_be_stale=may_be_stale
            )
        results = await prepared.schema.stream(
            message.query,
            variable_values=message.variables,
            context_value=context,
            operation_name=message.operation_name,
        )
        async with aclosing(results):
            async for result in results:
                if isinstance(result, PreExecutionError):
                    if may_be_stale and _rejected_by_schema(result):
                        return False
                    document = parse_quietly(message.query)
                    errors = [format_graphql_error(e, document) for e in result.errors or ()]
                    await self._send_errors(identifier, errors)
                    return True
                if isinstance(result, ExecutionResult):
                    payload = _result_payload(result, message.query)
                    await self._send(self.wire.next(identifier, payload))
        await self._send(self.wire.complete(identifier))
        return True

    async def _subscription(
        self,
        message: Subscribe,
        principal: common_pb2.Principal,
        prepared: PreparedSchema,
        checked: CheckedDocument,
        context: SocketContext,
        *,
        may_be_stale: bool,
    ) -> bool:
        """Like `_stream`, for a subscription operation: each event is rendered once for every
        subscription of the same query and visibility (gateway.subscriptions.rendering)."""
        identifier = message.id
        key = render_key(
            prepared.schema, message.query, message.operation_name, message.variables, principal
        )
        started = await start_subscription(
            prepared.schema, checked, message.variables, message.operation_name, context, key
        )
        if isinstance(started, list):
            if may_be_stale and all(e.path is None and is_request_error(e) for e in started):
                return False
            prepared.schema.process_errors(started)
            await self._send_errors(
                identifier, [format_graphql_error(e, checked.document) for e in started]
            )
            return True
        stream = self._streams.get(identifier)
        if stream is None:
            raise Internal("the subscription opened no event stream")
        while True:
            try:
                change = await stream.next_change()
            except StopAsyncIteration:
                break
            payload = await started.payload(change)
            await self._send(self.wire.next_encoded(identifier, payload))
        await self._send(self.wire.complete(identifier))
        return True

    async def open_stream(
        self,
        operation_id: str,
        object_name: str,
        action: str,
        *,
        predicate: Callable[[Record], bool] | None,
        owner_id: str | None,
    ) -> EventSubscription:
        """The record events a subscription field streams (called by its resolver), once the
        workspace's events are published (this gateway's lease on them, see
        gateway.subscriptions.interest)."""
        if self._closed or operation_id not in self._operations:
            raise Internal("the operation ended before its subscription started")
        assert self.principal is not None
        await self.state.event_interest.ensure(self.principal.workspace_id)
        if self._closed or operation_id not in self._operations:
            raise Internal("the operation ended before its subscription started")
        stream = self.state.subscriptions.subscribe(
            self.principal.workspace_id,
            object_name,
            action,
            predicate=predicate,
            owner_id=owner_id,
            on_overflow=self._overflowed,
        )
        previous = self._streams.pop(operation_id, None)
        if previous is not None:
            previous.close()
        self._streams[operation_id] = stream
        return stream

    def _overflowed(self, stream: EventSubscription) -> None:
        log.warning("subscriber too slow; closing its socket", extra={"object": stream.object})
        self._request_close(
            CloseCode.TRY_AGAIN_LATER,
            f"subscriber too slow: more than {self.settings.SUBSCRIPTION_QUEUE_SIZE} events "
            "waiting; reconnect and resubscribe",
        )

    # -- background --------------------------------------------------------------------------

    async def _keepalive(self, interval: float) -> None:
        message = self.wire.keepalive()
        if message is None:
            return
        while not self._closed:
            await self._send(message)
            await asyncio.sleep(interval)

    async def _revalidate(self, interval: float) -> None:
        while not self._closed:
            await asyncio.sleep(interval)
            try:
                await self._verified()
            except ServiceError as exc:
                log.info("credential recheck skipped", extra={"error": exc.message})

    async def _verified(self) -> common_pb2.Principal | None:
        """The credential verified again (one Redis read) and its change applied to the open
        subscriptions; None when the socket closes (revoked or expired: 4401, may read nothing:
        4403). Other errors (Redis or identity away) propagate."""
        try:
            principal = await credential_verifier(self.state).verify(
                bearer_token(self._authorization)
            )
        except Unauthenticated as exc:
            self._request_close(CloseCode.UNAUTHORIZED, exc.message)
            return None
        previous = self.principal
        if previous is None or self._closed:
            return None
        if principal == previous:
            return principal
        self.principal = principal
        if not may_read_something(principal):
            self._request_close(
                CloseCode.FORBIDDEN, "Forbidden: this credential may not read any records"
            )
            return None
        if visibility(principal) != visibility(previous):
            await self._reauthorize(principal)
        return principal

    async def _reauthorize(self, principal: common_pb2.Principal) -> None:
        """Subscriptions to objects no longer readable end with FORBIDDEN; the others restart as
        `principal`, so what they render (relations, own records) follows the change."""
        for identifier, stream in list(self._streams.items()):
            message = self._messages.get(identifier)
            self._end(identifier)
            if object_access(principal, stream.object, READ) is None:
                denied = PermissionDenied(f"permission denied: READ on {stream.object}")
                await self._send_errors(identifier, _error_dicts(denied))
            elif message is not None:
                self._start(message, principal)


def _too_many(settings: GatewaySettings) -> list[dict[str, Any]]:
    limit = settings.SUBSCRIPTION_MAX_OPERATIONS
    return [
        {
            "message": f"too many operations on this connection (at most {limit}); "
            "complete one or open another connection",
            "extensions": {"code": "BAD_USER_INPUT"},
        }
    ]
