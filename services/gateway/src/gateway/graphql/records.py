"""Resolvers of the record operations generated for each object: each one gRPC call to the
records service (relations through the request's DataLoaders), records kept as JSON dicts."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from itertools import zip_longest
from typing import Any

import orjson
import strawberry
from strawberry.types.nodes import Selection
from strawberry.types.unset import UNSET

from crm.common.v1 import common_pb2
from crm.records.v1 import records_pb2
from crmkit.errors import InvalidArgument
from gateway import idempotency
from gateway.datamodel.model import FieldModel, ObjectModel
from gateway.graphql import loaders
from gateway.graphql.context import GraphQLContext
from gateway.graphql.inputs import order_by, parse_graphql_filter, record_json
from gateway.graphql.selection import selected_names
from gateway.owners import check_owners
from gateway.pagination import page_info_json, page_size
from gateway.rpc import call

Record = dict[str, Any]
# Gives a write's Idempotency-Key call metadata (none on the direct path).
Guard = Callable[[], idempotency.Metadata]
# Children fetched per parent for a one-to-many field when `first` is not given.
RELATED_PAGE_SIZE = 60


def _context(info: strawberry.Info) -> GraphQLContext:
    context: GraphQLContext = info.context
    return context


async def _check_owners(
    info: strawberry.Info, items: Sequence[Any], *, batch: bool = False
) -> None:
    context = _context(info)
    await check_owners(
        context.state, context.principal, context.grpc_metadata(), items, batch=batch
    )


def _given(value: Any) -> Any:
    return None if value is UNSET else value


def connection(records: list[Record], cursors: Sequence[str], page_info: dict[str, Any]) -> Record:
    """The connection of a page; `cursors` is empty when the query selects no edge cursor."""
    return {
        "edges": [
            {"node": record, "cursor": cursor} for record, cursor in zip_longest(records, cursors)
        ],
        "pageInfo": page_info,
    }


@dataclass(frozen=True)
class Selected:
    """What a query selects below a record field (its `info.selected_fields`, fragments
    flattened): names of the field's own, of a connection's edges and of their nodes."""

    fields: frozenset[str]
    edges: frozenset[str]
    nodes: frozenset[str]

    @classmethod
    def of(cls, selected_fields: list[Selection]) -> Selected:
        return cls(
            frozenset(selected_names(selected_fields)),
            frozenset(selected_names(selected_fields, "edges")),
            frozenset(selected_names(selected_fields, "edges", "node")),
        )


class RecordOperations:
    """The generated query and mutation resolvers of one object."""

    def __init__(self, obj: ObjectModel) -> None:
        self.obj = obj
        self.many_to_one = frozenset(f.name for f in obj.fields if f.is_many_to_one)

    def _ref(self, context: GraphQLContext) -> records_pb2.ObjectRef:
        return loaders.object_ref(context, self.obj.singular)

    def _depth(self, selected: frozenset[str]) -> int:
        """1 when a many-to-one relation is selected: records nests it in the same call."""
        return 1 if selected & self.many_to_one else 0

    async def _call(self, info: strawberry.Info, method: str, request: Any) -> Any:
        context = _context(info)
        stub = context.state.upstreams.records
        return await context.ask(getattr(stub, method), request)

    def _guard(self, info: strawberry.Info) -> idempotency.Metadata:
        """The request's Idempotency-Key as call metadata; empty without the header."""
        # (unit tests run resolvers without an HTTP connection)
        headers = getattr(_context(info).connection, "headers", None)
        return idempotency.graphql_metadata(info, headers)

    async def _write(self, info: strawberry.Info, method: str, request: Any) -> Any:
        """A write call, guarded by the request's Idempotency-Key when it has one."""
        context = _context(info)
        guard = self._guard(info)
        stub = context.state.upstreams.records
        return await call(getattr(stub, method), request, context.grpc_metadata() + guard)

    # -- queries ------------------------------------------------------------------------------

    async def list_page(
        self,
        info: strawberry.Info,
        filter: Any = UNSET,
        orderBy: Any = UNSET,  # noqa: N803
        limit: int | None = UNSET,
        first: int | None = UNSET,
        after: str | None = UNSET,
        last: int | None = UNSET,
        before: str | None = UNSET,
        exactCount: bool | None = UNSET,  # noqa: N803
    ) -> Record:
        return await self.page(
            _context(info),
            Selected.of(info.selected_fields),
            filter=filter,
            orderBy=orderBy,
            limit=limit,
            first=first,
            after=after,
            last=last,
            before=before,
            exactCount=exactCount,
        )

    async def page(
        self,
        context: GraphQLContext,
        selected: Selected,
        **arguments: Any,
    ) -> Record:
        """`list_page` with what the query selects below the field already known."""
        request = self.list_request(selected, **arguments)
        request.ref.CopyFrom(self._ref(context))
        return await self._answer_page(context, request)

    def list_request(
        self,
        selected: Selected,
        filter: Any = UNSET,
        orderBy: Any = UNSET,  # noqa: N803
        limit: int | None = UNSET,
        first: int | None = UNSET,
        after: str | None = UNSET,
        last: int | None = UNSET,
        before: str | None = UNSET,
        exactCount: bool | None = UNSET,  # noqa: N803
    ) -> records_pb2.ListRecordsRequest:
        """The ListRecords request of a page, without the caller's object ref (InvalidArgument
        for a page size out of range or a filter refused)."""
        first_value, limit_value, last_value = _given(first), _given(limit), _given(last)
        if last_value is not None:
            size_last, size_first = page_size(last_value, field="last"), 0
        else:
            size_first = (
                page_size(first_value, field="first")
                if first_value is not None
                else page_size(limit_value, field="limit")
            )
            size_last = 0
        return records_pb2.ListRecordsRequest(
            filter=parse_graphql_filter(filter, self.obj),
            order_by=order_by(orderBy),
            first=size_first,
            after=_given(after) or "",
            last=size_last,
            before=_given(before) or "",
            depth=self._depth(selected.nodes),
            with_total_count=bool({"totalCount", "totalCountIsEstimate"} & selected.fields),
            exact_total_count=bool(_given(exactCount)),
            page_cursors_only="cursor" not in selected.edges,
        )

    async def prepared_page(
        self, context: GraphQLContext, prepared: records_pb2.ListRecordsRequest
    ) -> Record:
        """The page a `list_request` made once (for a query whose arguments are literals)
        asks for, for this caller."""
        request = records_pb2.ListRecordsRequest(ref=self._ref(context))
        request.MergeFrom(prepared)
        return await self._answer_page(context, request)

    async def _answer_page(
        self, context: GraphQLContext, request: records_pb2.ListRecordsRequest
    ) -> Record:
        stub = context.state.upstreams.records
        response = await context.ask(stub.ListRecords, request)
        result = connection(
            orjson.loads(response.records_json),
            response.cursors,
            page_info_json(response.page_info),
        )
        counted = request.with_total_count
        result["totalCount"] = response.total_count if counted else None
        result["totalCountIsEstimate"] = response.total_count_is_estimate if counted else None
        return result

    async def get(self, info: strawberry.Info, id: Any) -> Record:
        return await self.get_one(_context(info), Selected.of(info.selected_fields), id)

    async def get_one(self, context: GraphQLContext, selected: Selected, id: Any) -> Record:
        """`get` with what the query selects below the field already known."""
        request = records_pb2.GetRecordRequest(
            ref=self._ref(context), id=str(id), depth=self._depth(selected.fields)
        )
        stub = context.state.upstreams.records
        response = await context.ask(stub.GetRecord, request)
        record: Record = orjson.loads(response.record_json)
        return record

    async def aggregate(
        self,
        info: strawberry.Info,
        filter: Any = UNSET,
        exactCount: bool | None = UNSET,  # noqa: N803
    ) -> Record:
        context = _context(info)
        request = records_pb2.AggregateRecordsRequest(
            ref=self._ref(context), filter=parse_graphql_filter(filter, self.obj)
        )
        if selected_names(info.selected_fields) <= {"count", "countIsEstimate", "__typename"}:
            # Only the count: capped like a list's totalCount, no sums over every row.
            request.aggregates.append(records_pb2.AggregateSpec(op=records_pb2.AGGREGATE_OP_COUNT))
            request.exact_count = bool(_given(exactCount))
        response = await self._call(info, "AggregateRecords", request)
        return aggregate_result(orjson.loads(response.result_json))

    # -- mutations ----------------------------------------------------------------------------

    # The mutations of one record are each a resolver (normal execution) and a method taking the
    # request's context (the direct path, gateway.graphql.direct, and the resolver). `guard`
    # gives the Idempotency-Key metadata: none on the direct path, which a request with the
    # header does not take. A record the direct path wrote but could not complete is left in
    # `context.written` under the field's response key: the resolver answers it, not writing
    # again.

    async def create_one(self, info: strawberry.Info, data: Any) -> Record:
        return await self._one_write(info, lambda context, guard: self.create(context, data, guard))

    async def create(
        self,
        context: GraphQLContext,
        data: Any,
        guard: Guard = list,
    ) -> Record:
        item = record_json(data)
        await check_owners(context.state, context.principal, context.grpc_metadata(), [item])
        request = records_pb2.CreateRecordRequest(
            ref=self._ref(context), data_json=orjson.dumps(item)
        )
        return await self._record_call(context, "CreateRecord", request, guard)

    async def _one_write(
        self,
        info: strawberry.Info,
        write: Callable[[GraphQLContext, Guard], Awaitable[Record]],
    ) -> Record:
        """A one-record write's resolver: the record the direct path wrote for this field if it
        did, else `write` under the request's Idempotency-Key."""
        context = _context(info)
        written: Record | None = context.written.pop(str(info.path.key), None)
        if written is not None:
            return written
        return await write(context, lambda: self._guard(info))

    async def _record_call(
        self,
        context: GraphQLContext,
        method: str,
        request: Any,
        guard: Guard,
    ) -> Record:
        """A write of one record, answering the record."""
        stub = context.state.upstreams.records
        metadata = context.grpc_metadata() + guard()
        response = await call(getattr(stub, method), request, metadata)
        record: Record = orjson.loads(response.record_json)
        return record

    async def create_many(self, info: strawberry.Info, data: Any) -> list[Record]:
        items = [record_json(item, field=f"[{index}]") for index, item in enumerate(data or [])]
        if not items:
            raise InvalidArgument("`data` must hold at least one record", field="data")
        await _check_owners(info, items, batch=True)
        request = records_pb2.CreateRecordsRequest(
            ref=self._ref(_context(info)), data_json=orjson.dumps(items)
        )
        response = await self._write(info, "CreateRecords", request)
        records: list[Record] = orjson.loads(response.records_json)
        return records

    async def _upsert(self, info: strawberry.Info, payload: Any, match_on: str) -> Any:
        request = records_pb2.UpsertRecordsRequest(
            ref=self._ref(_context(info)), data_json=orjson.dumps(payload), match_on=match_on
        )
        return await self._write(info, "UpsertRecords", request)

    async def upsert_one(self, info: strawberry.Info, data: Any, matchOn: str) -> Record:  # noqa: N803
        item = record_json(data)
        await _check_owners(info, [item])
        response = await self._upsert(info, item, matchOn)
        records: list[Record] = orjson.loads(response.records_json)
        return records[0]

    async def upsert_many(
        self,
        info: strawberry.Info,
        data: Any,
        matchOn: str,  # noqa: N803
    ) -> list[Record]:
        items = [record_json(item, field=f"[{index}]") for index, item in enumerate(data or [])]
        if not items:
            raise InvalidArgument("`data` must hold at least one record", field="data")
        await _check_owners(info, items, batch=True)
        response = await self._upsert(info, items, matchOn)
        records: list[Record] = orjson.loads(response.records_json)
        return records

    async def update_one(self, info: strawberry.Info, id: Any, data: Any) -> Record:
        return await self._one_write(
            info, lambda context, guard: self.update(context, id, data, guard)
        )

    async def update(
        self,
        context: GraphQLContext,
        id: Any,
        data: Any,
        guard: Guard = list,
    ) -> Record:
        item = record_json(data)
        await check_owners(context.state, context.principal, context.grpc_metadata(), [item])
        request = records_pb2.UpdateRecordRequest(
            ref=self._ref(context), id=str(id), data_json=orjson.dumps(item)
        )
        return await self._record_call(context, "UpdateRecord", request, guard)

    async def update_many(
        self,
        info: strawberry.Info,
        filter: Any,
        data: Any,
    ) -> list[Record]:
        item = record_json(data)
        await _check_owners(info, [item])
        request = records_pb2.UpdateRecordsRequest(
            ref=self._ref(_context(info)),
            filter=self._required_filter(filter),
            data_json=orjson.dumps(item),
        )
        response = await self._write(info, "UpdateRecords", request)
        records: list[Record] = orjson.loads(response.records_json)
        return records

    async def delete_one(self, info: strawberry.Info, id: Any) -> Record:
        return await self._one_write(info, lambda context, guard: self.delete(context, id, guard))

    async def delete(self, context: GraphQLContext, id: Any, guard: Guard = list) -> Record:
        request = records_pb2.DeleteRecordRequest(ref=self._ref(context), id=str(id))
        return await self._record_call(context, "DeleteRecord", request, guard)

    async def delete_many(self, info: strawberry.Info, filter: Any) -> list[Record]:
        request = records_pb2.DeleteRecordsRequest(
            ref=self._ref(_context(info)), filter=self._required_filter(filter)
        )
        response = await self._write(info, "DeleteRecords", request)
        records: list[Record] = orjson.loads(response.records_json)
        return records

    async def restore_one(self, info: strawberry.Info, id: Any) -> Record:
        return await self._one_write(info, lambda context, guard: self.restore(context, id, guard))

    async def restore(self, context: GraphQLContext, id: Any, guard: Guard = list) -> Record:
        request = records_pb2.RestoreRecordRequest(ref=self._ref(context), id=str(id))
        return await self._record_call(context, "RestoreRecord", request, guard)

    def _required_filter(self, value: Any) -> common_pb2.Filter:
        parsed = parse_graphql_filter(value, self.obj)
        if parsed is None:
            raise InvalidArgument(
                "`filter` must hold at least one condition (an empty filter would touch every"
                " record)",
                field="filter",
            )
        return parsed


def aggregate_result(raw: Any) -> Record:
    """{count, sum, avg, min, max} with composite values (currency) reduced to their number."""
    result: Record = {"count": 0, "countIsEstimate": False}
    if not isinstance(raw, dict):
        return result
    result["count"] = raw.get("count", 0)
    result["countIsEstimate"] = bool(raw.get("countIsEstimate", False))
    for op in ("sum", "avg", "min", "max"):
        values = raw.get(op)
        if isinstance(values, dict):
            result[op] = {
                name: value.get("amountMicros") if isinstance(value, dict) else value
                for name, value in values.items()
            }
        else:
            result[op] = {}
    return result


def resolve_many_to_one(root: Record, info: strawberry.Info, field: FieldModel) -> Any:
    """The related record: nested by the records service when it was asked for depth 1,
    otherwise loaded with every other parent's in one GetRecordsByIds.

    Not a coroutine: graphql-core awaits the loader's future when one is returned, and nested
    records (the usual case) then complete a page without a coroutine per node."""
    nested = root.get(field.name)
    if isinstance(nested, dict):
        return nested
    related_id = root.get(field.foreign_key)
    if not related_id:
        return None
    return loaders.records_by_id(_context(info), field.target).load(str(related_id))


async def resolve_one_to_many(
    root: Record,
    info: strawberry.Info,
    field: FieldModel,
    target: ObjectModel,
    filter: Any = UNSET,
    orderBy: Any = UNSET,  # noqa: N803
    first: int | None = UNSET,
) -> Record:
    """The children pointing at `root` through `field.inverse`, first page, loaded for every
    parent of the request in one ListRelated call."""
    parent_id = root.get("id")
    first_value = _given(first)
    size = page_size(first_value, field="first") if first_value is not None else RELATED_PAGE_SIZE
    if not parent_id:
        return connection([], [], page_info_json(common_pb2.PageInfo()))
    loader = loaders.related(
        _context(info),
        target.singular,
        field.inverse,
        first=size,
        order_by=order_by(orderBy),
        flt=parse_graphql_filter(filter, target),
    )
    group = await loader.load(str(parent_id))
    if group is None:
        return connection([], [], page_info_json(common_pb2.PageInfo()))
    records = orjson.loads(group.records_json) if group.records_json else []
    cursors = list(group.cursors)
    info_json = {
        "hasNextPage": group.has_next_page,
        "hasPreviousPage": False,
        "startCursor": cursors[0] if cursors else None,
        "endCursor": cursors[-1] if cursors else None,
    }
    return connection(records, cursors, info_json)


__all__ = [
    "RecordOperations",
    "Selected",
    "aggregate_result",
    "resolve_many_to_one",
    "resolve_one_to_many",
]
