"""Upsert on a unique field: rows whose value of the field matches a live record update it, the
others are created, in one `INSERT ... ON CONFLICT` statement with their outbox rows.

A check in the same transaction comes first: it locks the matched records, refuses a match the
caller's role may not update (403) and a value only a soft-deleted record holds (409: the unique
index covers live rows only, so creating would leave two records with the value once the deleted
one is restored; docs/api.md, "Upsert"). A matched record whose values the row would not change
is left alone: no `updatedAt` bump, no event.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from crm.common.v1 import common_pb2
from crmkit.authz import Access
from crmkit.errors import AlreadyExists, InvalidArgument, PermissionDenied, Unavailable
from records import history, links, outbox
from records.context import RequestContext
from records.ddl import has_unique_index, unique_conflict_target
from records.inputs import Prepared
from records.model import FieldModel, ObjectModel
from records.predicates import owner_predicate
from records.sql import Params, quote
from records.writes import _CHANGED, NOW, _recordset, _run, insert_lists


@dataclass
class Upserted:
    id: str
    record_json: str
    created: bool


def match_field(obj: ObjectModel, name: str) -> FieldModel:
    """The unique field named `name` that rows are matched on (400 naming it otherwise)."""
    item = obj.field(name)
    if item is None or item.is_one_to_many:
        raise InvalidArgument(
            f"upsert: unknown field {name!r} on {obj.name_singular}", field="upsert"
        )
    if item.name == "id" or not has_unique_index(item):
        raise InvalidArgument(
            f"upsert: {item.name} is not a unique field of {obj.name_singular}; upsert matches "
            "on a field with isUnique",
            field=item.name,
        )
    return item


def _path(index: int, name: str, batch: bool) -> str:
    return f"[{index}].{name}" if batch else name


def _keys(rows: list[Prepared], item: FieldModel, batch: bool) -> list[Any]:
    """Each row's value of the match field; missing values and repeats are refused."""
    seen: dict[bytes, int] = {}
    keys = []
    for index, row in enumerate(rows):
        value = row.columns.get(item.column) if item.name in row.fields else None
        path = _path(index, item.name, batch)
        if value is None:
            raise InvalidArgument(f"{path}: required to upsert on {item.name}", field=path)
        marker = orjson.dumps(value)
        if marker in seen:
            raise InvalidArgument(
                f"{path}: the same {item.name} as {_path(seen[marker], item.name, batch)} "
                "(each value once per batch)",
                field=path,
            )
        seen[marker] = index
        keys.append(value)
    return keys


async def _matches(
    connection: Any,
    obj: ObjectModel,
    access: Access,
    item: FieldModel,
    keys: list[Any],
    batch: bool,
) -> dict[int, str]:
    """Row index -> id of the live record it matches, locked; refuses what may not be updated."""
    params = Params()
    payload = params.add([{"k": key, "i": i} for i, key in enumerate(keys)], "json")
    owner = owner_predicate("t", access, params) or "TRUE"
    column = quote(item.column)
    found = await connection.fetch(
        f"SELECT x.i, t.id::text, t.\"deletedAt\" IS NOT NULL, {owner} "
        f"FROM json_to_recordset({payload}) AS x(k {item.columns[0].sql_type}, i int) "
        f"JOIN {obj.table} t ON t.{column} = x.k "
        'ORDER BY t.id FOR UPDATE OF t',
        *params.values,
    )  # fmt: skip
    live: dict[int, str] = {}
    deleted: dict[int, str] = {}
    for index, record_id, is_deleted, allowed in found:
        if is_deleted:
            deleted[index] = record_id
            continue
        if not allowed:
            path = _path(index, item.name, batch)
            raise PermissionDenied(
                f"{path}: matches a {obj.name_singular} your role may not update", field=path
            )
        live[index] = record_id
    for index, record_id in sorted(deleted.items()):
        if index not in live:
            path = _path(index, item.name, batch)
            raise AlreadyExists(
                f"{path}: matches the soft-deleted {obj.name_singular} {record_id}; restore it "
                "(or change its value) first",
                field=path,
                reason=common_pb2.ERROR_REASON_MATCHES_DELETED,
            )
    return live


def _new_value(column: str, given_by: list[str] | None, params: Params) -> str:
    """The SET expression of `column`: the row's value, or the record's own where the row did
    not give the field (`given_by`: ids of the rows that did; None when every row did)."""
    name = quote(column)
    if given_by is None:
        return f"excluded.{name}"
    return f"CASE WHEN excluded.id = ANY({params.add(given_by, 'uuid[]')}) THEN excluded.{name} ELSE t.{name} END"  # noqa: E501


def _assignments(
    obj: ObjectModel, rows: list[Prepared], item: FieldModel, params: Params
) -> list[tuple[str, str]]:
    pairs = []
    for field in obj.writable_fields:
        if field.name in ("id", item.name):
            continue
        given = [row.columns["id"] for row in rows if field.name in row.fields]
        if not given:
            continue
        given_by = None if len(given) == len(rows) else given
        pairs += [(c.name, _new_value(c.name, given_by, params)) for c in field.columns]
    return pairs


async def upsert(
    connection: Any,
    ctx: RequestContext,
    obj: ObjectModel,
    access: Access,
    rows: list[Prepared],
    item: FieldModel,
    names: tuple[str, ...],
    *,
    batch: bool = True,
    events: bool = True,
    bulk: bool = False,
) -> list[Upserted]:
    """Create or update `rows` matched on `item` (all or nothing); records in input order.
    Runs in a transaction of its own (nested in the caller's when there is one). `bulk` marks
    the events of a bulk write (an import)."""
    if not rows:
        return []
    keys = _keys(rows, item, batch)
    await links.require_readable_targets(connection, ctx, obj, rows)
    async with connection.transaction():
        live = await _matches(connection, obj, access, item, keys, batch)
        found = await _upsert(
            connection, ctx, obj, rows, item, names, list(live.values()), events, bulk
        )
    by_id = {row[0]: (row[1], row[2]) for row in found}
    results = []
    for index, row in enumerate(rows):
        record_id = live.get(index, row.columns["id"])
        if record_id not in by_id:
            # A record with this value was created by a concurrent write after the check.
            raise Unavailable(f"a concurrent write created a matching {obj.name_singular}; retry")
        record_json, created = by_id[record_id]
        results.append(Upserted(record_id, record_json, created))
    return results


async def _upsert(
    connection: Any,
    ctx: RequestContext,
    obj: ObjectModel,
    rows: list[Prepared],
    item: FieldModel,
    names: tuple[str, ...],
    matched: list[str],
    events: bool,
    bulk: bool,
) -> list[Any]:
    columns = obj.insert_columns
    params = Params()
    payload = params.add([row.columns for row in rows], "json")
    old_ids = params.add(matched, "uuid[]")
    targets, values = insert_lists(obj, columns, "x")
    pairs = _assignments(obj, rows, item, params)
    sets = ", ".join([*(f"{quote(c)} = {e}" for c, e in pairs), f'"updatedAt" = {NOW}'])
    if pairs:
        current = ", ".join(f"t.{quote(c)}" for c, _ in pairs)
        wanted = ", ".join(e for _, e in pairs)
        changes = f"ROW({current}) IS DISTINCT FROM ROW({wanted})"
    else:
        changes = "FALSE"
    shown = obj.json_expression("t", names) if names else "NULL::json"
    provenance = outbox.Provenance.bound(params, ctx.principal, events=events)
    sql = (
        f"WITH old AS (SELECT t.id, {obj.json_expression('t')} AS before, {shown} AS shown "
        f"FROM {obj.table} t WHERE t.id = ANY({old_ids})), "
        f'ups AS (INSERT INTO {obj.table} AS t ({targets}, "createdAt", "updatedAt") '
        f"SELECT {values}, {NOW}, {NOW} "
        f"FROM json_to_recordset({payload}) AS x({_recordset(obj, columns)}) "
        f"ON CONFLICT {unique_conflict_target(item)} DO UPDATE SET {sets} WHERE {changes} "
        f"RETURNING t.id, t.xmax = 0 AS created, {obj.json_expression('t')} AS after, "
        f"{shown} AS shown), "
        "cre AS (SELECT s.id, s.after, NULL::json AS before FROM ups s WHERE s.created), "
        "upd AS (SELECT s.id, s.after, o.before FROM ups s JOIN old o ON o.id = s.id "
        "WHERE NOT s.created), "
        f"chg AS (SELECT s.*, {_CHANGED} AS changed FROM upd s), "
        + outbox.outbox_cte("obc", "cre", obj, provenance,
                            action=outbox.CREATED, cause=outbox.WRITE, bulk=bulk)
        + ", "
        + outbox.outbox_cte("obu", "chg", obj, provenance,
                            action=outbox.UPDATED, cause=outbox.WRITE, changed="s.changed",
                            bulk=bulk)
        + ", "
        + history.history_cte("hic", "cre", obj, provenance, action=history.CREATED)
        + ", "
        + history.history_cte("hiu", "chg", obj, provenance,
                              action=history.UPDATED, changed="s.changed")
        + " SELECT s.id::text, coalesce(s.shown, s.after)::text, s.created FROM ups s "
        "UNION ALL SELECT o.id::text, coalesce(o.shown, o.before)::text, false FROM old o "
        "WHERE o.id NOT IN (SELECT id FROM ups)"
    )  # fmt: skip
    return await _run(connection, sql, params, obj, rows)
