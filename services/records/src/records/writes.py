"""Write statements. Each is one SQL statement (data-modifying CTEs) that changes the rows and
writes their outbox rows, returning the records as JSON built by Postgres."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from crm.common.v1 import common_pb2
from crmkit.authz import Access
from crmkit.errors import AlreadyExists, InvalidArgument, NotFound
from records import history, links, outbox, search_ddl
from records.context import RequestContext
from records.ddl import foreign_key_name, has_unique_index, unique_index_name, unique_over_md5
from records.inputs import Prepared
from records.model import FieldModel, ObjectModel
from records.reads import joined, parse_id, where_clause
from records.sql import Params, quote

NOW = "date_trunc('milliseconds', now())"
_CHANGED = (
    "ARRAY(SELECT a.key FROM jsonb_each(s.after::jsonb) a WHERE a.key <> 'updatedAt' "
    "AND a.value IS DISTINCT FROM (s.before::jsonb -> a.key))"
)


@dataclass
class Written:
    id: str
    record_json: str
    changed_fields: list[str]


def _recordset(obj: ObjectModel, columns: Sequence[str]) -> str:
    types = obj.column_types
    return ", ".join(f"{quote(name)} {types[name]}" for name in columns)


def create_statement(
    principal: common_pb2.Principal,
    obj: ObjectModel,
    rows: list[Prepared],
    names: tuple[str, ...],
    *,
    events: bool = True,
    traces: dict[str, dict[str, str]] | None = None,
) -> tuple[str, Params]:
    """The statement `create` runs: the INSERT of `rows` with its outbox and history CTEs
    (bench/index_cost.py measures this very statement). Its text depends only on the object,
    `names`, `events` and whether `traces` gives each record's trace context (the values are
    parameters in a fixed order), so it is built once per object model (ObjectModel.statements)."""
    params = Params()
    payload = params.add([row.columns for row in rows], "json")
    provenance = outbox.Provenance.bound(params, principal, events=events, traces=traces)
    key = ("create", names, events, traces is not None)
    sql = obj.statements.get(key)
    if sql is None:
        shown = obj.json_expression("t", names) if names else "NULL::json"
        sql = (
            _insert_ctes(obj, payload, provenance, obj.json_expression("t"), shown)
            + " SELECT s.id::text, coalesce(s.shown, s.after)::text FROM ins s"
        )
        obj.statements[key] = sql
    return sql, params


async def create(
    connection: Any,
    ctx: RequestContext,
    obj: ObjectModel,
    rows: list[Prepared],
    names: tuple[str, ...],
    *,
    events: bool = True,
    traces: dict[str, dict[str, str]] | None = None,
) -> list[Written]:
    """Insert `rows` (all or nothing) and their outbox rows (none when not `events`); records in
    input order. Their events carry the current trace context, or with `traces` (record id ->
    trace context) each record's own."""
    if not rows:
        return []
    await links.require_readable_targets(connection, ctx, obj, rows)
    sql, params = create_statement(ctx.principal, obj, rows, names, events=events, traces=traces)
    found = await _run(connection, sql, params, obj, rows)
    by_id = {row[0]: row[1] for row in found}
    return [Written(row.columns["id"], by_id[row.columns["id"]], []) for row in rows]


async def insert(
    connection: Any, ctx: RequestContext, obj: ObjectModel, rows: list[Prepared], *, events: bool
) -> int:
    """`create` for a caller that shows no record (an import): the same rows, outbox (marked
    bulk) and history, answering only how many were inserted. The record JSON is built by the
    outbox's SELECT from the inserted row, so only while somebody listens
    (`records.events_wanted`)."""
    if not rows:
        return 0
    await links.require_readable_targets(connection, ctx, obj, rows)
    params = Params()
    payload = params.add([row.columns for row in rows], "json")
    provenance = outbox.Provenance.bound(params, ctx.principal, events=events)
    sql = _insert_ctes(
        obj,
        payload,
        provenance,
        "NULL::json",
        "NULL::json",
        record=obj.json_expression("(s.written)"),
        bulk=True,
    )
    found = await _run(connection, sql + " SELECT count(*) FROM ins", params, obj, rows)
    count: int = found[0][0]
    return count


def _insert_ctes(
    obj: ObjectModel,
    payload: str,
    provenance: outbox.Provenance,
    after: str,
    shown: str,
    *,
    record: str | None = None,
    bulk: bool = False,
) -> str:
    """`WITH ins AS (INSERT ...), <outbox>, <history>` of the rows in the json parameter
    `payload`; `ins` exposes id, after, before (NULL) and shown. With `record` (SQL over
    `(s.written)`, the inserted row), the outbox's record is built from it instead of from
    `after`."""
    columns = obj.insert_columns
    written = ", t AS written" if record is not None else ""
    targets, values = insert_lists(obj, columns, "x")
    return (
        f'WITH ins AS (INSERT INTO {obj.table} AS t ({targets}, "createdAt", "updatedAt") '
        f"SELECT {values}, {NOW}, {NOW} "
        f"FROM json_to_recordset({payload}) AS x({_recordset(obj, columns)}) "
        f"RETURNING t.id, {after} AS after, NULL::json AS before, {shown} AS shown{written}), "
        + outbox.outbox_cte(
            "ob", "ins", obj, provenance, action=outbox.CREATED, cause=outbox.WRITE,
            record=record or "s.after", bulk=bulk,
        )
        + ", "
        + history.history_cte("hi", "ins", obj, provenance, action=history.CREATED)
    )  # fmt: skip


def insert_lists(obj: ObjectModel, columns: Sequence[str], alias: str) -> tuple[str, str]:
    """The column list of an `INSERT ... SELECT ... FROM <recordset> AS <alias>` of `columns`
    and its SELECT list: the columns, and the search column computed from them
    (`records.search_ddl.insert_value`)."""
    targets = [quote(c) for c in columns]
    values = list(targets)
    search = search_ddl.insert_value(obj, columns, alias)
    if search is not None:
        targets.append(search[0])
        values.append(search[1])
    return ", ".join(targets), ", ".join(values)


async def _run(
    connection: Any, sql: str, params: Params, obj: ObjectModel, rows: list[Prepared] | None
) -> list[Any]:
    try:
        return list(await connection.fetch(sql, *params.values))
    except asyncpg.ForeignKeyViolationError as exc:
        raise _foreign_key_error(exc, obj, rows) from None
    except asyncpg.UniqueViolationError as exc:
        raise _unique_error(exc, obj, rows) from None


def _field_for_constraint(obj: ObjectModel, name: str) -> FieldModel | None:
    for item in obj.stored_fields:
        if name in (foreign_key_name(item), unique_index_name(obj.id, item)):
            return item
    return None


def _row_index(rows: list[Prepared] | None, item: FieldModel | None, detail: str) -> int | None:
    if not rows or item is None:
        return None
    for i, row in enumerate(rows):
        value = row.columns.get(item.columns[0].name)
        if value is None:
            continue
        if (
            f"=({value})" in detail
            or f"=({hashlib.md5(str(value).encode(), usedforsecurity=False).hexdigest()})" in detail
        ):
            return i
    return None


def _field_path(
    rows: list[Prepared] | None, item: FieldModel | None, name: str, detail: str
) -> str:
    index = _row_index(rows, item, detail) if rows and len(rows) > 1 else None
    return f"[{index}].{name}" if index is not None else name


def _foreign_key_error(
    exc: asyncpg.ForeignKeyViolationError, obj: ObjectModel, rows: list[Prepared] | None
) -> InvalidArgument:
    item = _field_for_constraint(obj, exc.constraint_name or "")
    name = item.name if item is not None else "relation"
    path = _field_path(rows, item, name, exc.detail or "")
    return InvalidArgument(f"{path}: the related record does not exist", field=path)


def _unique_error(
    exc: asyncpg.UniqueViolationError, obj: ObjectModel, rows: list[Prepared] | None
) -> AlreadyExists:
    constraint = exc.constraint_name or ""
    item = _field_for_constraint(obj, constraint)
    if item is None:
        item = obj.field("id")
    name = item.name if item is not None else "id"
    path = _field_path(rows, item, name, exc.detail or "")
    return already_exists(obj, name, path)


def already_exists(obj: ObjectModel, name: str, path: str) -> AlreadyExists:
    """The refusal of a value of unique field `name` that a live record holds."""
    return AlreadyExists(
        f"{path}: a {obj.name_singular} with this {name} already exists", field=path
    )


async def held_unique_values(
    connection: Any, obj: ObjectModel, rows: list[Prepared]
) -> dict[int, FieldModel]:
    """Rows (by index) of which a unique field's value is held by a live record, with that
    field (the first such in field order): one query per unique field, where inserting would
    meet the rows one failed statement at a time."""
    held: dict[int, FieldModel] = {}
    for item in obj.stored_fields:
        if item.name == "id" or not has_unique_index(item):
            continue
        column = item.column
        wanted = [
            {"v": row.columns[column], "i": i}
            for i, row in enumerate(rows)
            if i not in held and row.columns.get(column) is not None
        ]
        if not wanted:
            continue
        params = Params()
        payload = params.add(wanted, "json")
        name = quote(column)
        mine, theirs = ("md5(t.{0})", "md5(x.v)") if unique_over_md5(item) else ("t.{0}", "x.v")
        found = await connection.fetch(
            f"SELECT DISTINCT x.i FROM json_to_recordset({payload}) AS "
            f"x(v {item.columns[0].sql_type}, i int) JOIN {obj.table} t "
            f'ON {mine.format(name)} = {theirs} WHERE t."deletedAt" IS NULL',
            *params.values,
        )
        held.update((row[0], item) for row in found)
    return held


def _target_cte(obj: ObjectModel, where: list[str], lock: bool = True) -> str:
    return (
        f"target AS (SELECT t.id, {obj.json_expression('t')} AS before FROM {obj.table} t "
        f"WHERE {joined(where)}{' FOR UPDATE' if lock else ''})"
    )


def _set_list(prepared: Prepared) -> str:
    return ", ".join(f"{quote(c)} = x.{quote(c)}" for c in prepared.columns)


async def update(
    connection: Any,
    ctx: RequestContext,
    obj: ObjectModel,
    access: Access,
    prepared: Prepared,
    names: tuple[str, ...],
    *,
    record_id: str | None = None,
    node: common_pb2.Filter | None = None,
) -> list[Written]:
    """Apply `prepared` to one record (by id) or to every record matching `node`."""
    await links.require_readable_targets(connection, ctx, obj, [prepared])
    params = Params()
    where: list[str] = []
    if record_id is not None:
        where.append(f"t.id = {params.add(parse_id(record_id), 'uuid')}")
    where += where_clause(ctx, obj, "t", access, params, node=node)
    shown = obj.json_expression("t", names) if names else "NULL::json"
    sets = [f'"updatedAt" = {NOW}']
    source = ""
    if prepared.columns:
        payload = params.add(prepared.columns, "json")
        sets.insert(0, _set_list(prepared))
        columns = list(prepared.columns)
        source = f", json_to_record({payload}) AS x({_recordset(obj, columns)})"
    provenance = outbox.Provenance.bound(params, ctx.principal)
    sql = (
        f"WITH {_target_cte(obj, where)}, "
        f"upd AS (UPDATE {obj.table} AS t SET {', '.join(sets)} FROM target o{source} "
        f"WHERE t.id = o.id RETURNING t.id, {obj.json_expression('t')} AS after, o.before, "
        f"{shown} AS shown), "
        f"chg AS (SELECT s.*, {_CHANGED} AS changed FROM upd s), "
        + outbox.outbox_cte("ob", "chg", obj, provenance,
                            action=outbox.UPDATED, cause=outbox.WRITE, changed="s.changed")
        + ", " + history.history_cte("hi", "chg", obj, provenance,
                                     action=history.UPDATED, changed="s.changed")
        + " SELECT s.id::text, coalesce(s.shown, s.after)::text, s.changed FROM chg s"
    )  # fmt: skip
    rows = await _run(connection, sql, params, obj, None)
    if record_id is not None and not rows:
        raise NotFound(f"{obj.name_singular} {record_id} not found", field="id")
    return [Written(row[0], row[1], list(row[2])) for row in rows]


async def set_deleted(
    connection: Any,
    ctx: RequestContext,
    obj: ObjectModel,
    access: Access,
    *,
    deleted: bool,
    record_id: str | None = None,
    node: common_pb2.Filter | None = None,
    cause: str = outbox.WRITE,
    merged_into: str | None = None,
) -> list[Written]:
    """Soft delete (deleted=True) or restore rows: by id, or every row matching `node`.
    `merged_into`: the merge target that absorbs the deleted row (for its history)."""
    params = Params()
    where: list[str] = []
    if record_id is not None:
        where.append(f"t.id = {params.add(parse_id(record_id), 'uuid')}")
    where += where_clause(ctx, obj, "t", access, params, node=node, scope=2 if not deleted else 0)
    if node is not None and deleted:
        where.append('t."deletedAt" IS NULL')
    # updatedAt moves too, so that receivers can order an update, a delete and a restore of one
    # record by it (docs/webhooks.md); a delete's deletedAt equals its updatedAt.
    value = NOW if deleted else "NULL"
    action = outbox.DELETED if deleted else outbox.UPDATED
    if not deleted:
        cause = outbox.RESTORE if cause == outbox.WRITE else cause
    entry = history.DELETED if deleted else history.RESTORED
    related = "NULL::uuid"
    if merged_into is not None:
        entry, related = history.MERGED, params.add(merged_into, "uuid")
    provenance = outbox.Provenance.bound(params, ctx.principal)
    sql = (
        f"WITH {_target_cte(obj, where)}, "
        f"upd AS (UPDATE {obj.table} AS t SET \"deletedAt\" = {value}, \"updatedAt\" = {NOW} "
        f"FROM target o "
        f"WHERE t.id = o.id RETURNING t.id, {obj.json_expression('t')} AS after, o.before), "
        + outbox.outbox_cte("ob", "upd", obj, provenance, action=action, cause=cause,
                            changed="ARRAY['deletedAt']")
        + ", " + history.history_cte("hi", "upd", obj, provenance, action=entry,
                                     related=related)
        + " SELECT s.id::text, s.after::text FROM upd s"
    )  # fmt: skip
    rows = await _run(connection, sql, params, obj, None)
    return [Written(row[0], row[1], ["deletedAt"]) for row in rows]


@dataclass
class Merged:
    target: str
    source: str
    repointed: int


def _fill_from_source(obj: ObjectModel) -> str:
    """SET list: the target keeps its values; where a field is empty, the source's fills it."""
    sets = []
    for item in obj.writable_fields:
        if item.name == "id":
            continue
        if len(item.columns) > 1:
            empty = " AND ".join(f"t.{quote(c.name)} IS NULL" for c in item.columns)
            for column in item.columns:
                name = quote(column.name)
                sets.append(f"{name} = CASE WHEN {empty} THEN src.{name} ELSE t.{name} END")
            continue
        name = quote(item.column)
        sets.append(f"{name} = COALESCE(t.{name}, src.{name})")
    return ", ".join([*sets, f'"updatedAt" = {NOW}'])


async def merge(
    connection: Any,
    ctx: RequestContext,
    obj: ObjectModel,
    access: Access,
    source_id: str,
    target_id: str,
) -> Merged:
    """In one transaction: soft-delete the source, fill the target's empty fields from it, and
    repoint every many-to-one relation that pointed at the source to the target."""
    source = parse_id(source_id, "sourceId")
    target = parse_id(target_id, "targetId")
    if source == target:
        raise InvalidArgument("sourceId and targetId must differ", field="sourceId")
    params = Params()
    where = [f"t.id = ANY({params.add([source, target], 'uuid[]')})"]
    where += where_clause(ctx, obj, "t", access, params)
    locked = await connection.fetch(
        f"SELECT t.id::text FROM {obj.table} t WHERE {joined(where)} ORDER BY t.id FOR UPDATE",
        *params.values,
    )
    present = {row[0] for row in locked}
    for value, field in ((source, "sourceId"), (target, "targetId")):
        if value not in present:
            raise NotFound(f"{obj.name_singular} {value} not found", field=field)
    await links.require_repointable(connection, ctx, obj, source, target)
    deleted = await set_deleted(
        connection,
        ctx,
        obj,
        access,
        deleted=True,
        record_id=source,
        cause=outbox.MERGE,
        merged_into=target,
    )
    params = Params()
    src = params.add(source, "uuid")
    where = [f"t.id = {params.add(target, 'uuid')}"]
    provenance = outbox.Provenance.bound(params, ctx.principal)
    sql = (
        f"WITH {_target_cte(obj, where)}, "
        f"upd AS (UPDATE {obj.table} AS t SET {_fill_from_source(obj)} "
        f"FROM target o, {obj.table} src WHERE t.id = o.id AND src.id = {src} "
        f"RETURNING t.id, {obj.json_expression('t')} AS after, o.before), "
        f"chg AS (SELECT s.*, {_CHANGED} AS changed FROM upd s), "
        + outbox.outbox_cte("ob", "chg", obj, provenance, action=outbox.UPDATED,
                            cause=outbox.MERGE, changed="s.changed")
        + ", " + history.history_cte("hi", "chg", obj, provenance,
                                     action=history.MERGED, changed="s.changed", related=src)
        + " SELECT s.after::text FROM chg s"
    )  # fmt: skip
    merged = await _run(connection, sql, params, obj, None)
    repointed = 0
    for reference in ctx.model.references_to(obj):
        holder = ctx.model.by_id(reference.object_id)
        if holder is None:
            continue
        repointed += await _repoint(connection, ctx, holder, reference.field, source, target)
    return Merged(merged[0][0], deleted[0].record_json, repointed)


async def _repoint(
    connection: Any,
    ctx: RequestContext,
    holder: ObjectModel,
    relation: FieldModel,
    source: str,
    target: str,
) -> int:
    params = Params()
    column = quote(relation.column)
    where = [f"t.{column} = {params.add(source, 'uuid')}"]
    if relation.target_object_id == holder.id:
        where.append(f"t.id <> {params.add(target, 'uuid')}")
    new = params.add(target, "uuid")
    changed = f"ARRAY[{_text(relation.key)}]"
    provenance = outbox.Provenance.bound(params, ctx.principal)
    sql = (
        f"WITH {_target_cte(holder, where)}, "
        f"upd AS (UPDATE {holder.table} AS t SET {column} = {new}, \"updatedAt\" = {NOW} "
        f"FROM target o WHERE t.id = o.id "
        f"RETURNING t.id, {holder.json_expression('t')} AS after, o.before), "
        + outbox.outbox_cte("ob", "upd", holder, provenance, action=outbox.UPDATED,
                            cause=outbox.MERGE, changed=changed)
        + ", " + history.history_cte("hi", "upd", holder, provenance,
                                     action=history.UPDATED, changed=changed)
        + " SELECT count(*) FROM upd"
    )  # fmt: skip
    count: int = await connection.fetchval(sql, *params.values)
    return count


def _text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"
