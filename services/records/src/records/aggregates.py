"""Aggregates, group-by and duplicate search, computed in SQL and returned as JSON text."""

from __future__ import annotations

from typing import Any

import orjson

from crm.common.v1 import common_pb2
from crm.metadata.v1 import metadata_pb2 as md
from crm.records.v1 import records_pb2
from crmkit.authz import Access
from crmkit.errors import InvalidArgument
from records import counts, ordering, values
from records.context import RequestContext
from records.model import (
    NUMERIC_TYPES,
    SORTABLE_TYPES,
    TEXT_TYPES,
    FieldModel,
    ObjectModel,
    build_json_object,
    value_expression,
)
from records.predicates import CASTS
from records.reads import (
    Page,
    check_fields,
    is_unfiltered,
    joined,
    json_array,
    page_size,
    where_clause,
)
from records.sql import Params, quote

MAX_GROUPS = 1000
DEFAULT_GROUPS = 200
_OPS = {
    records_pb2.AGGREGATE_OP_SUM: "sum",
    records_pb2.AGGREGATE_OP_AVG: "avg",
    records_pb2.AGGREGATE_OP_MIN: "min",
    records_pb2.AGGREGATE_OP_MAX: "max",
}


def _numeric_column(item: FieldModel) -> str:
    if item.type == md.FIELD_TYPE_CURRENCY:
        return next(c.name for c in item.columns if c.part == "amountMicros")
    return item.column


def numeric_fields(obj: ObjectModel) -> list[FieldModel]:
    return [item for item in obj.stored_fields if item.type in NUMERIC_TYPES]


def _aggregate_sql(op: str, item: FieldModel, alias: str) -> str:
    column = f"{alias}.{quote(_numeric_column(item))}"
    if op in ("min", "max") and item.type == md.FIELD_TYPE_DATE_TIME:
        return f"to_char({op}({column}) AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')"
    if op == "avg":
        # float8's avg also accumulates squares, which overflow past ~1e154: average exactly,
        # rounded to 300 places (a float8 cast of a mean below 1e-308 would underflow).
        return f"round(avg({column}::numeric), 300)::float8"
    return f"{op}({column})"


def _checked_field(obj: ObjectModel, name: str, op: str) -> FieldModel:
    item = obj.field(name)
    if item is None:
        raise InvalidArgument(f"unknown field {name!r} on {obj.name_singular}", field=name)
    numeric = item.type in NUMERIC_TYPES
    if op in ("sum", "avg") and not numeric:
        raise InvalidArgument(f"{op} needs a NUMBER or CURRENCY field; {name} is not", field=name)
    if op in ("min", "max") and not (numeric or item.type in SORTABLE_TYPES):
        raise InvalidArgument(f"{op} does not apply to {name}", field=name)
    return item


async def aggregate(
    connection: Any,
    ctx: RequestContext,
    obj: ObjectModel,
    access: Access,
    request: records_pb2.AggregateRecordsRequest,
    count_cap: int = 0,
) -> bytes:
    params = Params()
    node = request.filter if request.HasField("filter") else None
    where = where_clause(ctx, obj, "t", access, params, node=node)
    specs = list(request.aggregates)
    if len(specs) == 1 and specs[0].op == records_pb2.AGGREGATE_OP_COUNT and not specs[0].field:
        # A count alone: exact up to the cap, a marked estimate beyond it (records.counts).
        total, estimate = await counts.count_matches(
            connection,
            obj.table,
            joined(where),
            list(params.values),
            cap=count_cap,
            exact=request.exact_count,
            unfiltered=is_unfiltered(where, "t"),
        )
        return orjson.dumps({"count": total, "countIsEstimate": estimate})
    sections: dict[str, list[tuple[str, str]]] = {}
    pairs: list[tuple[str, str]] = []
    if not specs:
        pairs.append(("count", "count(*)"))
        for op in ("sum", "avg", "min", "max"):
            sections[op] = [(f.name, _aggregate_sql(op, f, "t")) for f in numeric_fields(obj)]
    for spec in specs:
        if spec.op == records_pb2.AGGREGATE_OP_COUNT:
            if not spec.field:
                pairs.append(("count", "count(*)"))
                continue
            item = _checked_field(obj, spec.field, "count")
            column = item.columns[0].name if item.columns else "id"
            sections.setdefault("countNotNull", []).append((item.name, f"count(t.{quote(column)})"))
            continue
        name = _OPS.get(spec.op)
        if name is None:
            raise InvalidArgument("unknown aggregate operation", field="aggregates")
        item = _checked_field(obj, spec.field, name)
        sections.setdefault(name, []).append((item.name, _aggregate_sql(name, item, "t")))
    for name, entries in sections.items():
        pairs.append((name, build_json_object(entries)))
    sql = f"SELECT ({build_json_object(pairs)})::text FROM {obj.table} t WHERE {joined(where)}"
    result: str = await connection.fetchval(sql, *params.values)
    return result.encode()


async def group(
    connection: Any,
    ctx: RequestContext,
    obj: ObjectModel,
    access: Access,
    request: records_pb2.GroupRecordsRequest,
) -> bytes:
    if not request.field:
        raise InvalidArgument("field: name the field to group by", field="field")
    item = obj.field(request.field)
    if item is None:
        raise InvalidArgument(
            f"unknown field {request.field!r} on {obj.name_singular}", field=request.field
        )
    if not item.columns or item.type == md.FIELD_TYPE_RAW_JSON:
        raise InvalidArgument(f"cannot group by {request.field}", field=request.field)
    limit = request.limit or DEFAULT_GROUPS
    if not 1 <= limit <= MAX_GROUPS:
        raise InvalidArgument(f"limit must be between 1 and {MAX_GROUPS}", field="limit")
    sums = (
        [_checked_field(obj, name, "sum") for name in request.sum_fields]
        if request.sum_fields
        else numeric_fields(obj)
    )
    params = Params()
    node = request.filter if request.HasField("filter") else None
    where = where_clause(ctx, obj, "t", access, params, node=node)
    key = value_expression(item, "t")
    group_by = ", ".join(f"t.{quote(c.name)}" for c in item.columns)
    pairs = [
        (request.field, key),
        ("count", "count(*)"),
        ("sum", build_json_object([(f.name, _aggregate_sql("sum", f, "t")) for f in sums])),
    ]
    sql = (
        f"SELECT ({build_json_object(pairs)})::text FROM {obj.table} t WHERE {joined(where)} "
        f"GROUP BY {group_by} ORDER BY count(*) DESC, {group_by} "
        f"LIMIT {int(limit)}"
    )
    rows = await connection.fetch(sql, *params.values)
    return json_array(row[0] for row in rows)


async def duplicates(
    connection: Any,
    ctx: RequestContext,
    obj: ObjectModel,
    access: Access,
    request: records_pb2.FindDuplicatesRequest,
    data: Any,
) -> Page:
    """Active records whose given fields all match `data` (text compared case-insensitively)."""
    if not isinstance(data, dict) or not data:
        raise InvalidArgument('give the field values to match, e.g. {"email": ...}', field="data")
    names = check_fields(obj, list(request.fields))
    size = page_size(request.first, "first")
    params = Params()
    where = where_clause(ctx, obj, "t", access, params)
    matched = 0
    for key, raw in data.items():
        if key == "id":
            if raw is not None:
                excluded = values.canonical_uuid(raw, "id")
                where.append(f"t.id <> {params.add(excluded, 'uuid')}")
            continue
        item = obj.field(key)
        if item is None:
            raise InvalidArgument(f"unknown field {key!r} on {obj.name_singular}", field=key)
        if raw is None:
            continue
        matched += 1
        where.append(_match(item, key, raw, params))
    if not matched:
        raise InvalidArgument("give at least one non-null field value to match", field="data")
    order = ordering.build_order(obj, [])
    if request.after:
        cursor = ordering.decode_cursor(order, request.after, "after")
        where.append(ordering.keyset_predicate(order, "t", cursor, params))
    sql = (
        f"SELECT {obj.json_text('t', names)}, t.id FROM "
        f"(SELECT t.* FROM {obj.table} t WHERE {joined(where)} ORDER BY t.id "
        f"LIMIT {int(size) + 1}) t ORDER BY t.id"
    )
    rows = list(await connection.fetch(sql, *params.values))
    more = len(rows) > size
    rows = rows[:size]
    cursors = [ordering.encode_cursor(order, [row[1]]) for row in rows]
    info = common_pb2.PageInfo(
        has_next_page=more,
        has_previous_page=bool(request.after),
        start_cursor=cursors[0] if cursors else "",
        end_cursor=cursors[-1] if cursors else "",
    )
    return Page(json_array(row[0] for row in rows), cursors, info, 0)


def _match(item: FieldModel, key: str, raw: Any, params: Params) -> str:
    if item.type == md.FIELD_TYPE_CURRENCY:
        amount, code = values.parse_currency(raw, key)
        parts = []
        for part, value, cast in zip(item.columns, (amount, code), ("int8", "text"), strict=True):
            if value is not None:
                parts.append(f"t.{quote(part.name)} = {params.add(value, cast)}")
        return "(" + (" AND ".join(parts) or "TRUE") + ")"
    if not item.columns:  # a one-to-many relation: the other side holds the column
        raise values.fail(key, "a one-to-many relation cannot be matched")
    column = f"t.{quote(item.column)}"
    if item.type in TEXT_TYPES:
        text = values.parse_string(raw, key, lenient=True)
        return f"lower({column}) = lower({params.add(text, 'text')})"
    kind = md.FIELD_TYPE_UUID if item.is_many_to_one else item.type
    if kind == md.FIELD_TYPE_MULTI_SELECT:
        chosen = values.write_value(item, raw, key)
        return f"{column} = {params.add(chosen, 'text[]')}"
    value = values.operand(kind, item, raw, key)
    return f"{column} = {params.add(value, CASTS[kind])}"
