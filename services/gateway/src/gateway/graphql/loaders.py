"""Per-request DataLoaders for relations: one GetRecordsByIds per related object and one
ListRelated per (child object, relation, arguments), whatever the number of parents."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
from strawberry.dataloader import DataLoader

from crm.common.v1 import common_pb2
from crm.records.v1 import records_pb2
from gateway.graphql.context import GraphQLContext

Record = dict[str, Any]


def object_ref(context: GraphQLContext, object_name: str) -> records_pb2.ObjectRef:
    return records_pb2.ObjectRef(object=object_name, metadata_version=context.data_model.version)


def records_by_id(context: GraphQLContext, object_name: str) -> DataLoader[str, Record | None]:
    """Loads records of `object_name` by id; a missing (or deleted) id loads None."""

    async def load(ids: list[str]) -> Sequence[Record | None]:
        request = records_pb2.GetRecordsByIdsRequest(
            ref=object_ref(context, object_name), ids=list(dict.fromkeys(ids))
        )
        response = await context.ask(context.state.upstreams.records.GetRecordsByIds, request)
        found = {record["id"]: record for record in orjson.loads(response.records_json)}
        return [found.get(record_id) for record_id in ids]

    return context.loader(
        ("byId", object_name), lambda: DataLoader(load_fn=load, max_batch_size=500)
    )


def related(
    context: GraphQLContext,
    child_object: str,
    foreign_key_field: str,
    *,
    first: int,
    order_by: Sequence[common_pb2.OrderBy],
    flt: common_pb2.Filter | None,
) -> DataLoader[str, records_pb2.RelatedGroup | None]:
    """Loads, per parent id, the first `first` children pointing at it through
    `foreign_key_field` (the one-to-many side of a relation)."""
    key = (
        "related",
        child_object,
        foreign_key_field,
        first,
        tuple((o.field, o.direction) for o in order_by),
        flt.SerializeToString(deterministic=True) if flt is not None else b"",
    )

    async def load(parent_ids: list[str]) -> Sequence[records_pb2.RelatedGroup | None]:
        request = records_pb2.ListRelatedRequest(
            ref=object_ref(context, child_object),
            foreign_key_field=foreign_key_field,
            parent_ids=list(dict.fromkeys(parent_ids)),
            first_per_parent=first,
            order_by=list(order_by),
            filter=flt,
        )
        response = await context.ask(context.state.upstreams.records.ListRelated, request)
        groups = {group.parent_id: group for group in response.groups}
        return [groups.get(parent_id) for parent_id in parent_ids]

    return context.loader(key, lambda: DataLoader(load_fn=load, max_batch_size=500))
