"""Subscription operations: started once, then each event rendered once per group.

A subscription is validated and its source stream opened through graphql-core's executor (the
same schema, argument conversion and resolvers as Strawberry's own pipeline). Each event is then
executed against the operation's selection and encoded to the `payload` of a `next` message.
Subscriptions that would produce the same payload share one execution and one encoding per
event: same schema, query, operation name and variables, and a principal that sees the same
(workspace, credential kind, permissions, scopes, and the user id when a permission is limited
to own records; relation fields are read with that principal). With many clients on the same
query, an event costs one execution instead of one per subscriber.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
import strawberry
from graphql import (
    DocumentNode,
    GraphQLError,
    OperationType,
    get_operation_ast,
    parse,
    specified_rules,
)
from graphql.execution import (
    ExecutionResult,
    Executor,
    create_source_event_stream,
    execute_subscription_event,
)
from strawberry.schema.schema import validate_document

from crm.common.v1 import common_pb2
from gateway.graphql.context import GraphQLContext
from gateway.graphql.errors import format_graphql_error
from gateway.subscriptions.events import RecordChange

log = logging.getLogger("gateway.subscriptions")

_INTERNAL_ERROR = orjson.dumps(
    {
        "data": None,
        "errors": [
            {"message": "internal server error", "extensions": {"code": "INTERNAL_SERVER_ERROR"}}
        ],
    }
).decode()


def visibility(principal: common_pb2.Principal) -> bytes:
    """What decides what a principal may read: principals equal here see the same data."""
    own_records = any(permission.own_records_only for permission in principal.permissions)
    view = common_pb2.Principal(
        workspace_id=principal.workspace_id,
        kind=principal.kind,
        permissions=principal.permissions,
        scopes=principal.scopes,
        user_id=principal.user_id if own_records else "",
    )
    return view.SerializeToString(deterministic=True)


def render_key(
    schema: strawberry.Schema,
    query: str,
    operation_name: str | None,
    variables: Mapping[str, Any] | None,
    principal: common_pb2.Principal,
) -> Hashable:
    canonical = orjson.dumps(variables or {}, option=orjson.OPT_SORT_KEYS)
    return (id(schema), query, operation_name, canonical, visibility(principal))


@dataclass
class StartedSubscription:
    """A validated subscription whose event stream is open (registered by its resolver)."""

    schema: strawberry.Schema
    document: DocumentNode
    executor: Executor[Any]
    context: GraphQLContext
    key: Hashable

    async def payload(self, change: RecordChange) -> str:
        """The `next` payload (JSON) for `change`, rendered once per group of equal
        subscriptions."""
        return await render_once(change, self.key, lambda: self._render(change))

    async def _render(self, change: RecordChange) -> str:
        self.context.loaders.clear()  # relations are read afresh for every event
        try:
            result = execute_subscription_event(
                self.executor.build_per_event_executor(change.record)
            )
            if isinstance(result, Awaitable):
                result = await result
        except Exception:
            log.exception("rendering a subscription event failed")
            return _INTERNAL_ERROR
        assert isinstance(result, ExecutionResult)
        payload: dict[str, Any] = {"data": result.data}
        if result.errors:
            self.schema.process_errors(result.errors)
            payload["errors"] = [format_graphql_error(e, self.document) for e in result.errors]
        return orjson.dumps(payload).decode()


@dataclass(frozen=True)
class CheckedDocument:
    """A parsed document and what validating it against one schema found."""

    document: DocumentNode
    errors: list[GraphQLError]

    def is_subscription(self, operation_name: str | None) -> bool:
        operation = get_operation_ast(self.document, operation_name)
        return operation is not None and operation.operation == OperationType.SUBSCRIPTION


class DocumentCache:
    """Parsed and validated documents per (schema, query): clients open many subscriptions
    with the same query, and parsing plus validating costs more than opening the stream."""

    def __init__(self, size: int = 512) -> None:
        self._size = size
        self._entries: OrderedDict[tuple[int, str], tuple[strawberry.Schema, CheckedDocument]]
        self._entries = OrderedDict()

    def check(self, schema: strawberry.Schema, query: str) -> CheckedDocument | None:
        """The checked document, or None when the query does not parse."""
        key = (id(schema), query)
        found = self._entries.get(key)
        if found is not None and found[0] is schema:
            self._entries.move_to_end(key)
            return found[1]
        try:
            document = parse(query)
        except GraphQLError:
            return None
        checked = CheckedDocument(
            document, validate_document(schema._schema, document, tuple(specified_rules))
        )
        self._entries[key] = (schema, checked)  # the schema is kept, so its id stays unique
        while len(self._entries) > self._size:
            self._entries.popitem(last=False)
        return checked


async def start_subscription(
    schema: strawberry.Schema,
    checked: CheckedDocument,
    variables: dict[str, Any] | None,
    operation_name: str | None,
    context: GraphQLContext,
    key: Hashable,
) -> StartedSubscription | list[GraphQLError]:
    """Opens the event stream of a checked subscription; the errors otherwise (validation,
    variables, or what the field's resolver raised, e.g. FORBIDDEN)."""
    if checked.errors:
        return checked.errors
    document = checked.document
    executor = Executor.build(
        schema._schema,
        document,
        context_value=context,
        raw_variable_values=variables,
        operation_name=operation_name,
    )
    if isinstance(executor, list):
        return executor
    source = create_source_event_stream(executor)
    if isinstance(source, Awaitable):
        source = await source
    if isinstance(source, ExecutionResult):
        return list(source.errors or ())
    return StartedSubscription(schema, document, executor, context, key)


async def render_once(
    change: RecordChange, key: Hashable, render: Callable[[], Awaitable[str]]
) -> str:
    """`render()` for the first subscription of a group; the others reuse its result.

    The first renders in its own task, usually without suspending (records are dicts), so the
    subscriptions woken after it find the payload ready. If its render suspends (a relation read
    over gRPC), the others wait for it; if that subscriber goes away meanwhile, the next one
    renders instead.
    """
    while True:
        future = change.renders.get(key)
        if future is None:
            future = asyncio.get_running_loop().create_future()
            change.renders[key] = future
            try:
                payload = await render()
            except BaseException:
                del change.renders[key]
                future.cancel()
                raise
            future.set_result(payload)
            return payload
        if not future.done():
            await asyncio.wait((future,))
        if not future.cancelled():
            result: str = future.result()
            return result
