"""Subscription fields generated for a workspace's data model.

Every object, standard or custom, gets `<singular>Created`, `<singular>Updated` and
`<singular>Deleted`, each with an optional `filter` (the object's filter input, the same as its
list query takes) and each returning the object's record type: the record after the change
(`Deleted`: the soft-deleted record, `deletedAt` set). A subscriber must be allowed to READ the
object; a role limited to its own records gets only events of records whose `ownerId` is the
caller. The filter is evaluated in memory against the record after the change, so it may use
the record's own fields and the ids of its relations (`company: {id: {eq: ...}}`), not the fields
of related records.

`SUBSCRIPTIONS_PART` hands these fields to the workspace schema builder (`for_model`).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import strawberry
from strawberry.types.unset import UNSET

from crm.common.v1 import common_pb2
from crmkit.authz import READ, require_object_access
from crmkit.errors import InvalidArgument
from crmkit.filters import matches, referenced_fields
from gateway.datamodel.model import ObjectModel
from gateway.graphql.inputs import parse_graphql_filter
from gateway.graphql.parts import GeneratedTypes, SchemaPart
from gateway.subscriptions.context import SocketContext
from gateway.subscriptions.events import CREATED, DELETED, UPDATED
from gateway.subscriptions.hub import EventSubscription

log = logging.getLogger("gateway.subscriptions")

Predicate = Callable[[Mapping[str, Any]], bool]
ACTION_FIELDS = (("Created", CREATED), ("Updated", UPDATED), ("Deleted", DELETED))
_DESCRIPTIONS = {
    CREATED: "A {label} was created: the new record.",
    UPDATED: "A {label} was changed (restores and merges included): the record after the change.",
    DELETED: "A {label} was soft-deleted: the record with deletedAt set.",
}


@dataclass(frozen=True)
class SubscribableObject:
    """What the subscription fields of one object need from the generated schema."""

    singular: str
    label: str
    record_type: Any  # the object's GraphQL record type
    filter_type: Any | None  # its filter input, or None for no `filter` argument
    # The `filter` argument's value → a predicate on record dicts (None: every record).
    # Raises InvalidArgument naming the field for a filter it cannot evaluate.
    predicate: Callable[[Any], Predicate | None]


def subscription_type(
    objects: Sequence[SubscribableObject],
    *,
    taken: frozenset[str] = frozenset(),
    name: str = "RecordEventSubscription",
) -> type | None:
    """A Strawberry type holding the three subscription fields of every object (None if none).

    Field names in `taken` (already used by a static part) are skipped and logged.
    """
    fields: dict[str, Any] = {}
    names: set[str] = set()
    for obj in objects:
        for suffix, action in ACTION_FIELDS:
            field_name = f"{obj.singular}{suffix}"
            if field_name in taken or field_name in names:
                log.warning(
                    "generated subscription skipped: the name is taken",
                    extra={"subscription": field_name},
                )
                continue
            names.add(field_name)
            fields[f"subscription_{len(fields)}"] = strawberry.subscription(
                name=field_name,
                description=_DESCRIPTIONS[action].format(label=obj.label or obj.singular),
                resolver=_resolver(obj, action, field_name),
            )
    if not fields:
        return None
    cls = type(name, (), {"__module__": __name__, **fields})
    return strawberry.type(cls, name=name)


def _resolver(obj: SubscribableObject, action: str, field_name: str) -> Callable[..., Any]:
    async def subscribe(info: strawberry.Info, filter: Any = UNSET) -> EventSubscription:
        context = info.context
        if not isinstance(context, SocketContext):
            raise InvalidArgument(
                "subscriptions are served over a WebSocket at /graphql (graphql-transport-ws)"
            )
        access = require_object_access(context.principal, obj.singular, READ)
        predicate = obj.predicate(None if filter is UNSET else filter)
        return await context.session.open_stream(
            context.operation_id,
            obj.singular,
            action,
            predicate=predicate,
            owner_id=access.owner_id if access.own_records_only else None,
        )

    positional = inspect.Parameter.POSITIONAL_OR_KEYWORD
    parameters = [inspect.Parameter("info", positional, annotation=strawberry.Info)]
    if obj.filter_type is not None:
        parameters.append(
            inspect.Parameter(
                "filter",
                inspect.Parameter.KEYWORD_ONLY,
                annotation=obj.filter_type | None,
                default=UNSET,
            )
        )
    subscribe.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        parameters,
        return_annotation=AsyncIterator[obj.record_type],  # type: ignore[name-defined]
    )
    subscribe.__name__ = subscribe.__qualname__ = field_name
    return subscribe


def record_subscriptions(generated: GeneratedTypes) -> SchemaPart | None:
    """The subscription fields of every object of a workspace's data model."""
    objects = [
        SubscribableObject(
            singular=obj.singular,
            label=obj.label_singular,
            record_type=generated.records[obj.singular],
            filter_type=generated.filters.get(obj.singular),
            predicate=_filter_predicate(obj),
        )
        for obj in generated.model.objects
        if obj.singular in generated.records
    ]
    subscription = subscription_type(objects)
    if subscription is None:
        return None
    return SchemaPart(name="record-events", subscription=subscription)


SUBSCRIPTIONS_PART = SchemaPart(name="record-event-subscriptions", for_model=record_subscriptions)


def _filter_predicate(obj: ObjectModel) -> Callable[[Any], Predicate | None]:
    def predicate(value: Any) -> Predicate | None:
        parsed = parse_graphql_filter(value, obj)
        if parsed is None:
            return None
        _check_paths(parsed, obj)

        def accepts(record: Mapping[str, Any]) -> bool:
            return matches(parsed, record)

        return accepts

    return predicate


def _check_paths(parsed: common_pb2.Filter, obj: ObjectModel) -> None:
    """Events carry the record's own fields: a path into a related record cannot match."""
    for path in referenced_fields(parsed):
        head, _, rest = path.partition(".")
        field = obj.record_key(head)
        if field is not None and field.is_many_to_one and rest and rest != "id":
            raise InvalidArgument(
                f"subscription filters compare the record's own fields; use {head}.id instead "
                f"of {path}",
                field=f"filter.{head}",
            )
