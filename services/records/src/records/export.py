"""Exports: every record matching a list filter, read from one REPEATABLE READ snapshot through a
server-side cursor and encoded as CSV or NDJSON as it goes (constant memory however many rows).

NDJSON lines are the record JSON of the REST list (depth 0, `fields` as in a list). CSV has one
column per field key in the same order; a composite field (CURRENCY) has one column per part,
`<field>.<part>`; multi-select and raw JSON cells hold their JSON text; null is an empty cell.
`relation_field` adds the named field of each many-to-one relation's target: a `<relation>.<field>`
column, or `"<relation>": {"id": ..., "<field>": ...}` in NDJSON, hidden like any nested relation
when the caller may not read the target (docs/api.md, "Export").
"""

from __future__ import annotations

import csv
import io
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from crm.metadata.v1 import metadata_pb2 as md
from crm.records.v1 import records_pb2
from crmkit.authz import Access
from crmkit.errors import InvalidArgument
from records import ordering, reads
from records.context import RequestContext
from records.model import (
    FieldModel,
    ObjectModel,
    build_json_object,
    build_json_text,
    value_expression,
)
from records.predicates import owner_predicate
from records.sql import Params, quote

# A FETCH from the cursor asks for about FETCH_BYTES of rows (sized from the previous one's
# encoded size, the first one FIRST_FETCH_ROWS), encoded SLICE_ROWS at a time; a chunk is sent
# once it holds CHUNK_BYTES.
FIRST_FETCH_ROWS = 200
MAX_FETCH_ROWS = 5000
FETCH_BYTES = 1024 * 1024
SLICE_ROWS = 100
CHUNK_BYTES = 256 * 1024

_JSON_CELL_TYPES = frozenset(
    {
        md.FIELD_TYPE_NUMBER,
        md.FIELD_TYPE_BOOLEAN,
        md.FIELD_TYPE_MULTI_SELECT,
        md.FIELD_TYPE_RAW_JSON,
    }
)


@dataclass(frozen=True)
class Related:
    """A many-to-one relation exported with one field of its target."""

    relation: FieldModel
    target: ObjectModel
    field: FieldModel
    access: Access


@dataclass(frozen=True)
class ExportQuery:
    sql: str
    params: list[Any]
    header: list[str]  # CSV columns (empty for NDJSON)


def check_format(value: int) -> int:
    if value not in (records_pb2.EXPORT_FORMAT_CSV, records_pb2.EXPORT_FORMAT_NDJSON):
        raise InvalidArgument("format must be csv or ndjson", field="format")
    return value


def build_query(
    ctx: RequestContext,
    obj: ObjectModel,
    access: Access,
    request: records_pb2.ExportRecordsRequest,
) -> ExportQuery:
    """The one SELECT of an export (InvalidArgument for a bad field, order or filter)."""
    fmt = check_format(request.format)
    names = reads.check_fields(obj, list(request.fields))
    order = ordering.build_order(obj, list(request.order_by))
    wanted = set(names)
    chosen = [
        item
        for item in obj.stored_fields
        if not wanted or item.name in wanted or item.key in wanted or item.name == "id"
    ]
    related = _related(ctx, obj, chosen, request.relation_field)
    params = Params()
    node = request.filter if request.HasField("filter") else None
    where = reads.where_clause(ctx, obj, "t", access, params, node=node)
    if fmt == records_pb2.EXPORT_FORMAT_NDJSON:
        pairs = [(item.key, value_expression(item, "t")) for item in chosen]
        for index, link in enumerate(related):
            inner = f"r{index}"
            pairs.append((link.relation.name, _related_select(link, inner, params, json=True)))
        columns = [build_json_text(pairs)]
        header: list[str] = []
    else:
        columns, header = [], []
        for item in chosen:
            for column, title in _csv_columns(item, "t"):
                columns.append(column)
                header.append(title)
        for index, link in enumerate(related):
            columns.append(_related_select(link, f"r{index}", params, json=False))
            header.append(f"{link.relation.name}.{link.field.name}")
    sql = (
        f"SELECT {', '.join(columns)} FROM {obj.table} t WHERE {reads.joined(where)} "
        f"ORDER BY {order.sql('t')}"
    )
    return ExportQuery(sql, params.values, header)


def _related(
    ctx: RequestContext, obj: ObjectModel, chosen: list[FieldModel], name: str
) -> list[Related]:
    if not name:
        return []
    candidates: list[tuple[FieldModel, ObjectModel, FieldModel]] = []
    for relation in chosen:
        target = ctx.model.by_id(relation.target_object_id) if relation.is_many_to_one else None
        item = None if target is None else target.field(name)
        plain = item is not None and len(item.columns) == 1 and not item.is_many_to_one
        if target is not None and item is not None and plain:
            candidates.append((relation, target, item))
    if not candidates:
        raise InvalidArgument(
            f"relationField: no exported relation of {obj.name_singular} leads to an object "
            f"with a plain field {name!r}",
            field="relationField",
        )
    found: list[Related] = []
    for relation, target, item in candidates:
        access = ctx.read_access(target)
        if access is not None:  # hidden like any nested relation the caller may not read
            found.append(Related(relation, target, item, access))
    return found


def _related_select(link: Related, inner: str, params: Params, *, json: bool) -> str:
    target, item = link.target, link.field
    scope = f' AND {inner}."deletedAt" IS NULL'
    owner = owner_predicate(inner, link.access, params)
    if owner:
        scope += f" AND {owner}"
    if json:
        value = build_json_object(
            [("id", f"{inner}.id"), (item.name, value_expression(item, inner))]
        )
    else:
        value = _cell(item, inner)
    return (
        f"(SELECT {value} FROM {target.table} {inner} "
        f"WHERE {inner}.id = t.{quote(link.relation.column)}{scope})"
    )


def _csv_columns(item: FieldModel, alias: str) -> list[tuple[str, str]]:
    if item.type == md.FIELD_TYPE_CURRENCY:
        return [
            (f"{alias}.{quote(column.name)}::text", f"{item.name}.{column.part}")
            for column in item.columns
        ]
    return [(_cell(item, alias), item.key)]


def _cell(item: FieldModel, alias: str) -> str:
    """SQL text of one single-column field as a CSV cell (NULL for an empty cell)."""
    expression = value_expression(item, alias)
    if item.type in _JSON_CELL_TYPES:
        return f"to_json({expression})::text"
    return f"({expression})::text"


class Encoder:
    """Rows of the query as the bytes of the file."""

    def __init__(self, fmt: int) -> None:
        self._csv = fmt == records_pb2.EXPORT_FORMAT_CSV
        self._buffer = io.StringIO()
        self._writer = csv.writer(self._buffer, lineterminator="\r\n")

    def header(self, names: list[str]) -> bytes:
        return self.rows([names]) if self._csv else b""

    def rows(self, rows: list[Any]) -> bytes:
        if not self._csv:
            return "".join(row[0] + "\n" for row in rows).encode()
        self._writer.writerows(rows)
        text = self._buffer.getvalue()
        self._buffer.seek(0)
        self._buffer.truncate()
        return text.encode()


async def stream(pool: Any, query: ExportQuery, fmt: int) -> AsyncIterator[records_pb2.ExportChunk]:
    """The chunks of the export: first the header (after the query has started, so a failing
    query fails before any data), then the rows, CHUNK_BYTES or so at a time. A FETCH takes
    about FETCH_BYTES of rows (fewer rows when they are large), so memory stays flat whatever
    the size of a row."""
    encoder = Encoder(fmt)
    async with (
        pool.acquire() as connection,
        connection.transaction(isolation="repeatable_read", readonly=True),
    ):
        # The first FETCH may sort every matching row (orderBy on an unindexed field), longer
        # than a request's statement timeout; an export ends when its client goes away.
        await connection.execute("SET LOCAL statement_timeout = 0")
        cursor = await connection.cursor(query.sql, *query.params)
        batch = FIRST_FETCH_ROWS
        rows = await cursor.fetch(batch)
        yield records_pb2.ExportChunk(data=encoder.header(query.header))
        pending: list[bytes] = []
        size = count = 0
        while rows:
            fetched = 0
            for start in range(0, len(rows), SLICE_ROWS):
                part = rows[start : start + SLICE_ROWS]
                data = encoder.rows(part)
                pending.append(data)
                fetched += len(data)
                size += len(data)
                count += len(part)
                if size >= CHUNK_BYTES:
                    yield records_pb2.ExportChunk(data=b"".join(pending), rows=count)
                    pending, size, count = [], 0, 0
            if len(rows) < batch:
                break
            batch = max(1, min(MAX_FETCH_ROWS, FETCH_BYTES * len(rows) // max(1, fetched)))
            rows = await cursor.fetch(batch)
        if pending:
            yield records_pb2.ExportChunk(data=b"".join(pending), rows=count)
