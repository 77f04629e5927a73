"""Generated subscription fields, executed by Strawberry against a real hub."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Mapping
from typing import Any, cast

import orjson
import strawberry
from strawberry.schema.config import StrawberryConfig
from strawberry.types.execution import ExecutionResult, PreExecutionError
from strawberry.types.unset import UNSET

from crm.common.v1 import common_pb2
from gateway.metrics import GatewayMetrics
from gateway.subscriptions.context import SocketContext
from gateway.subscriptions.events import RecordChange
from gateway.subscriptions.fields import SubscribableObject, subscription_type
from gateway.subscriptions.hub import EventSubscription, SubscriptionHub
from gateway.subscriptions.rendering import (
    CheckedDocument,
    DocumentCache,
    StartedSubscription,
    render_key,
    start_subscription,
)

WS = str(uuid.uuid4())
USER = str(uuid.uuid4())


@strawberry.type(name="Person")
class Person:
    id: str
    firstName: str | None  # noqa: N815  # records are dicts keyed by the GraphQL name


@strawberry.input(name="PersonFilter")
class PersonFilter:
    city: str | None = UNSET


@strawberry.type
class Query:
    ok: bool = True


def city_predicate(value: Any) -> Callable[[Mapping[str, Any]], bool] | None:
    if value is None or value.city is UNSET:
        return None
    return lambda record: record.get("city") == value.city


def read_item(source: Any, name: str) -> object:
    return source.get(name) if isinstance(source, dict) else getattr(source, name)


PERSON = SubscribableObject("person", "Person", Person, PersonFilter, city_predicate)
SUBSCRIPTION = subscription_type([PERSON])
SCHEMA = strawberry.Schema(
    query=Query,
    subscription=SUBSCRIPTION,
    config=StrawberryConfig(default_resolver=read_item),
)


class Session:
    def __init__(self, hub: SubscriptionHub) -> None:
        self.hub = hub

    async def open_stream(
        self,
        operation_id: str,
        object_name: str,
        action: str,
        *,
        predicate: Callable[[Mapping[str, Any]], bool] | None,
        owner_id: str | None,
    ) -> EventSubscription:
        return self.hub.subscribe(
            WS, object_name, action, predicate=predicate, owner_id=owner_id, on_overflow=print
        )


def principal(*, own: bool = False, objects: str = "*") -> common_pb2.Principal:
    return common_pb2.Principal(
        workspace_id=WS,
        user_id=USER,
        kind=common_pb2.PRINCIPAL_KIND_USER,
        permissions=[
            common_pb2.ObjectPermission(
                object=objects, actions=[common_pb2.ACTION_READ], own_records_only=own
            )
        ],
    )


def context(hub: SubscriptionHub, who: common_pb2.Principal) -> SocketContext:
    return SocketContext(
        connection=cast(Any, None),
        state=cast(Any, None),
        principal=who,
        session=Session(hub),
        operation_id="1",
    )


async def first_result(
    hub: SubscriptionHub, who: common_pb2.Principal, query: str, *events: Mapping[str, Any]
) -> ExecutionResult:
    results = await SCHEMA.subscribe(query, context_value=context(hub, who))
    pending = asyncio.ensure_future(anext(results))
    for _ in range(100):
        if pending.done() or hub.open_subscriptions:
            break
        await asyncio.sleep(0.01)
    for record in events:
        hub.publish(RecordChange("e", WS, "person", "created", record, 0.0))
    try:
        return await asyncio.wait_for(pending, 5)
    finally:
        await results.aclose()


def test_every_action_has_a_field_with_a_filter_argument() -> None:
    sdl = SCHEMA.as_str()
    for name in ("personCreated", "personUpdated", "personDeleted"):
        assert f"{name}(filter: PersonFilter): Person!" in sdl


def test_taken_names_are_skipped() -> None:
    generated = subscription_type([PERSON], taken=frozenset({"personUpdated"}))
    assert generated is not None
    schema = strawberry.Schema(
        query=Query, subscription=generated, config=StrawberryConfig(default_resolver=read_item)
    )
    assert "personUpdated" not in schema.as_str()
    assert "personCreated" in schema.as_str()
    assert subscription_type([]) is None


async def test_a_subscription_streams_the_selected_fields_of_matching_records() -> None:
    hub = SubscriptionHub(GatewayMetrics.create(), 8)
    result = await first_result(
        hub,
        principal(),
        'subscription { personCreated(filter: {city: "Paris"}) { id firstName } }',
        {"id": "1", "firstName": "Rome", "city": "Rome"},
        {"id": "2", "firstName": "Ada", "city": "Paris"},
    )
    assert result.errors is None
    assert result.data == {"personCreated": {"id": "2", "firstName": "Ada"}}
    assert hub.open_subscriptions == 0  # closing the stream unregistered it


async def test_own_records_only_roles_get_their_records_only() -> None:
    hub = SubscriptionHub(GatewayMetrics.create(), 8)
    result = await first_result(
        hub,
        principal(own=True),
        "subscription { personCreated { id } }",
        {"id": "theirs", "ownerId": str(uuid.uuid4())},
        {"id": "mine", "ownerId": USER},
    )
    assert result.data == {"personCreated": {"id": "mine"}}


async def test_no_read_permission_is_forbidden_before_anything_streams() -> None:
    hub = SubscriptionHub(GatewayMetrics.create(), 8)
    result = await first_result(
        hub, principal(objects="company"), "subscription { personCreated { id } }"
    )
    assert isinstance(result, PreExecutionError)
    assert result.errors
    assert type(result.errors[0].original_error).__name__ == "PermissionDenied"
    assert hub.open_subscriptions == 0


async def test_equal_subscriptions_share_one_rendering_per_event() -> None:
    hub = SubscriptionHub(GatewayMetrics.create(), 8)
    query = "subscription { personCreated { id firstName } }"
    started = []
    for who in (principal(), principal(), principal(own=True)):
        key = render_key(SCHEMA, query, None, None, who)
        run = await start_subscription(SCHEMA, checked(query), None, None, context(hub, who), key)
        assert isinstance(run, StartedSubscription)
        started.append(run)
    change = RecordChange("e", WS, "person", "created", {"id": "1", "firstName": "Ada"}, 0.0)
    payloads = [await run.payload(change) for run in started]
    expected = {"data": {"personCreated": {"id": "1", "firstName": "Ada"}}}
    assert [orjson.loads(payload) for payload in payloads] == [expected] * 3
    # The two unrestricted admins share one execution; the own-records principal has its own.
    assert len(change.renders) == 2
    assert payloads[0] is payloads[1]


async def test_a_subscription_refused_by_its_resolver_reports_the_error() -> None:
    hub = SubscriptionHub(GatewayMetrics.create(), 8)
    query = "subscription { personCreated { id } }"
    who = principal(objects="company")
    key = render_key(SCHEMA, query, None, None, who)
    errors = await start_subscription(SCHEMA, checked(query), None, None, context(hub, who), key)
    assert isinstance(errors, list)
    assert type(errors[0].original_error).__name__ == "PermissionDenied"
    assert errors[0].path == ["personCreated"]


def checked(query: str) -> CheckedDocument:
    document = DocumentCache().check(SCHEMA, query)
    assert document is not None
    return document


def test_documents_are_parsed_and_validated_once_per_schema_and_query() -> None:
    cache = DocumentCache(size=2)
    first = cache.check(SCHEMA, "subscription { personCreated { id } }")
    assert first is not None
    assert first.errors == []
    assert first.is_subscription(None)
    assert cache.check(SCHEMA, "subscription { personCreated { id } }") is first
    invalid = cache.check(SCHEMA, "subscription { personCreated { nope } }")
    assert invalid is not None
    assert invalid.errors
    assert cache.check(SCHEMA, "{ ok") is None  # does not parse
    assert cache.check(SCHEMA, "{ ok }") is not None
    query = cache.check(SCHEMA, "{ ok }")
    assert query is not None
    assert not query.is_subscription(None)
    # Bounded: the oldest entry was dropped and is checked again.
    assert cache.check(SCHEMA, "subscription { personCreated { id } }") is not first
