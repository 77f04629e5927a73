"""Record history in GraphQL: the shared entry types, `<singular>History(id, ...)` and the
`history` connection field of every record type (docs/api.md, "Record history"). One
ListHistory call to the records service each; entries are the service's JSON dicts."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import orjson
import strawberry
from strawberry.scalars import JSON
from strawberry.types.unset import UNSET

from crm.records.v1 import records_pb2
from gateway.datamodel.model import ObjectModel
from gateway.graphql import loaders
from gateway.graphql.context import GraphQLContext
from gateway.graphql.page_info import PageInfo
from gateway.graphql.scalars import serialize_datetime
from gateway.pagination import page_info_json, page_size

# Names the generated record types must not take (gateway.graphql.builder reserves them).
TYPE_NAMES = frozenset(
    {
        "RecordHistoryActor",
        "RecordHistoryChange",
        "RecordHistoryEntry",
        "RecordHistoryEdge",
        "RecordHistoryConnection",
    }
)
FIELD_NAME = "history"


@strawberry.type(name="RecordHistoryActor", description="Who made a change.")
class HistoryActor:
    kind: str = strawberry.field(
        description="user, api_key, oauth, personal_access_token or system"
    )
    userId: str | None  # noqa: N815
    credentialId: str | None = strawberry.field(  # noqa: N815
        description="The API key, token or grant used."
    )
    workflowId: str | None = strawberry.field(  # noqa: N815
        description="Set when a workflow run made the change."
    )


@strawberry.type(name="RecordHistoryChange", description="One field an update changed.")
class HistoryChange:
    field: str
    old: JSON | None
    new: JSON | None


@strawberry.type(name="RecordHistoryEntry", description="One change of a record.")
class HistoryEntry:
    id: str
    object: str
    recordId: uuid.UUID  # noqa: N815
    action: str = strawberry.field(description="created, updated, deleted, restored or merged")
    occurredAt: dt.datetime  # noqa: N815
    actor: HistoryActor
    changes: list[HistoryChange]
    mergedFrom: uuid.UUID | None = strawberry.field(  # noqa: N815
        description="On a merge target's entry: the record merged into it."
    )
    mergedInto: uuid.UUID | None = strawberry.field(  # noqa: N815
        description="On a merge source's entry: the record it was merged into."
    )


@strawberry.type(name="RecordHistoryEdge")
class HistoryEdge:
    node: HistoryEntry
    cursor: str


@strawberry.type(name="RecordHistoryConnection", description="A page of history, newest first.")
class HistoryConnection:
    edges: list[HistoryEdge]
    pageInfo: PageInfo  # noqa: N815


def _given(value: Any) -> Any:
    return None if value is UNSET else value


async def history_page(
    info: strawberry.Info,
    obj: ObjectModel,
    record_id: str,
    *,
    first: int | None = None,
    after: str | None = None,
    fields: list[str] | None = None,
    since: dt.datetime | None = None,
    until: dt.datetime | None = None,
) -> dict[str, Any]:
    context: GraphQLContext = info.context
    request = records_pb2.ListHistoryRequest(
        ref=loaders.object_ref(context, obj.singular),
        id=record_id,
        first=page_size(first, field="first"),
        after=after or "",
        fields=fields or [],
        since=serialize_datetime(since) if since is not None else "",
        until=serialize_datetime(until) if until is not None else "",
    )
    response = await context.ask(context.state.upstreams.records.ListHistory, request)
    entries = orjson.loads(response.entries_json)
    return {
        "edges": [{"node": entry, "cursor": entry["id"]} for entry in entries],
        "pageInfo": page_info_json(response.page_info),
    }


def query_resolver(obj: ObjectModel) -> Any:
    async def resolve(
        info: strawberry.Info,
        id: Any,
        first: int | None = UNSET,
        after: str | None = UNSET,
        fields: list[str] | None = UNSET,
        since: dt.datetime | None = UNSET,
        until: dt.datetime | None = UNSET,
    ) -> dict[str, Any]:
        return await history_page(
            info,
            obj,
            str(id),
            first=_given(first),
            after=_given(after),
            fields=_given(fields),
            since=_given(since),
            until=_given(until),
        )

    return resolve


def field_resolver(obj: ObjectModel) -> Any:
    async def resolve(
        root: Any,
        info: strawberry.Info,
        first: int | None = UNSET,
        after: str | None = UNSET,
    ) -> dict[str, Any]:
        return await history_page(
            info, obj, str(root["id"]), first=_given(first), after=_given(after)
        )

    return resolve


QUERY_ARGUMENTS: tuple[tuple[str, Any, Any], ...] = (
    ("first", int | None, UNSET),
    ("after", str | None, UNSET),
    ("fields", list[str] | None, UNSET),
    ("since", dt.datetime | None, UNSET),
    ("until", dt.datetime | None, UNSET),
)
FIELD_ARGUMENTS: tuple[tuple[str, Any, Any], ...] = (
    ("first", int | None, UNSET),
    ("after", str | None, UNSET),
)
