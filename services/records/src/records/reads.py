"""Read statements: record JSON with relations nested in SQL, scopes, filters, keyset pages."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from crm.common.v1 import common_pb2
from crm.records.v1 import records_pb2
from crmkit.authz import Access
from crmkit.errors import InvalidArgument, NotFound
from records import counts, ordering, values
from records.context import RequestContext
from records.model import ObjectModel, build_json_text, value_expression
from records.predicates import PredicateCompiler, owner_predicate, references_field
from records.sql import Params, quote

DEFAULT_PAGE = 50
MAX_PAGE = 200
RELATED_PAGE = 60
MAX_IDS = 1000


def check_fields(obj: ObjectModel, names: list[str]) -> tuple[str, ...]:
    for name in names:
        if obj.field(name) is None:
            raise InvalidArgument(
                f"fields: unknown field {name!r} on {obj.name_singular}", field=name
            )
    return tuple(names)


def check_depth(depth: int) -> int:
    if not 0 <= depth <= 2:
        raise InvalidArgument("depth must be 0, 1 or 2", field="depth")
    return depth


def page_size(requested: int, field: str) -> int:
    if requested == 0:
        return DEFAULT_PAGE
    if not 1 <= requested <= MAX_PAGE:
        raise InvalidArgument(f"{field} must be between 1 and {MAX_PAGE}", field=field)
    return requested


def record_expression(
    ctx: RequestContext,
    obj: ObjectModel,
    alias: str,
    names: tuple[str, ...],
    depth: int,
    params: Params,
) -> str:
    """SQL for the record JSON text of row `alias`, with relations nested down to `depth` (the
    nested records as json values)."""
    if depth == 0:
        return obj.json_text(alias, names)
    wanted = set(names)
    chosen = [
        item
        for item in obj.stored_fields
        if not wanted or item.name in wanted or item.key in wanted or item.name == "id"
    ]
    pairs = [(item.key, value_expression(item, alias)) for item in chosen]
    for relation in obj.many_to_one:
        if wanted and relation.name not in wanted and relation.key not in wanted:
            continue
        target = ctx.model.by_id(relation.target_object_id)
        access = None if target is None else ctx.read_access(target)
        if target is None or access is None:
            continue
        inner = f"{alias}_{len(pairs)}"
        scope = _scope_sql(inner, access, params)
        pairs.append(
            (
                relation.name,
                f"(SELECT {target.json_expression(inner)} FROM {target.table} {inner} "
                f"WHERE {inner}.id = {alias}.{quote(relation.column)}{scope})",
            )
        )
    if depth >= 2:
        for relation in obj.one_to_many:
            if wanted and relation.name not in wanted:
                continue
            child = ctx.model.by_id(relation.target_object_id)
            back = None if child is None else child.field(relation.inverse_name)
            access = None if child is None else ctx.read_access(child)
            if child is None or back is None or not back.is_many_to_one or access is None:
                continue
            inner = f"{alias}_{len(pairs)}"
            scope = _scope_sql(inner, access, params)
            pairs.append(
                (
                    relation.name,
                    f"(SELECT coalesce(json_agg(x.j ORDER BY x.id), '[]'::json) FROM "
                    f"(SELECT {inner}.id, {child.json_expression(inner)} AS j "
                    f"FROM {child.table} {inner} WHERE {inner}.{quote(back.column)} = {alias}.id"
                    f"{scope} ORDER BY {inner}.id LIMIT {RELATED_PAGE}) x)",
                )
            )
    return build_json_text(pairs)


def _scope_sql(alias: str, access: Access, params: Params) -> str:
    owner = owner_predicate(alias, access, params)
    return f' AND {alias}."deletedAt" IS NULL' + (f" AND {owner}" if owner else "")


def deleted_scope(alias: str, scope: int, node: common_pb2.Filter | None) -> str:
    if scope == records_pb2.DELETED_SCOPE_INCLUDE:
        return ""
    if scope == records_pb2.DELETED_SCOPE_ONLY:
        return f'{alias}."deletedAt" IS NOT NULL'
    if node is not None and references_field(node, "deletedAt"):
        return ""  # a filter on deletedAt decides by itself
    return f'{alias}."deletedAt" IS NULL'


def where_clause(
    ctx: RequestContext,
    obj: ObjectModel,
    alias: str,
    access: Access,
    params: Params,
    *,
    node: common_pb2.Filter | None = None,
    scope: int = 0,
) -> list[str]:
    parts = []
    deleted = deleted_scope(alias, scope, node)
    if deleted:
        parts.append(deleted)
    owner = owner_predicate(alias, access, params)
    if owner:
        parts.append(owner)
    if node is not None and node.WhichOneof("node") is not None:
        compiler = PredicateCompiler(ctx.model, params, ctx.read_access, prefix=f"{alias}f")
        parts.append(compiler.compile(node, obj, alias))
    return parts


def is_unfiltered(parts: list[str], alias: str) -> bool:
    """`parts` (from where_clause) pass every live row, or every row: no filter, no owner scope."""
    return parts in ([], [deleted_scope(alias, 0, None)])


def joined(parts: list[str]) -> str:
    return " AND ".join(parts) if parts else "TRUE"


def parse_id(value: str, field: str = "id") -> str:
    return values.canonical_uuid(value, field)


async def get_record(
    connection: Any,
    ctx: RequestContext,
    obj: ObjectModel,
    access: Access,
    record_id: str,
    names: tuple[str, ...],
    depth: int,
    scope: int,
) -> str:
    params = Params()
    expression = record_expression(ctx, obj, "t", names, depth, params)
    where = [f"t.id = {params.add(parse_id(record_id), 'uuid')}"]
    where += where_clause(ctx, obj, "t", access, params, scope=scope)
    sql = f"SELECT {expression} FROM {obj.table} t WHERE {joined(where)}"
    found: str | None = await connection.fetchval(sql, *params.values)
    if found is None:
        raise NotFound(f"{obj.name_singular} {record_id} not found", field="id")
    return found


async def get_by_ids(
    connection: Any,
    ctx: RequestContext,
    obj: ObjectModel,
    access: Access,
    ids: list[str],
    names: tuple[str, ...],
    scope: int,
) -> bytes:
    if len(ids) > MAX_IDS:
        raise InvalidArgument(f"at most {MAX_IDS} ids per call", field="ids")
    wanted = [parse_id(value, f"ids[{i}]") for i, value in enumerate(ids)]
    params = Params()
    expression = obj.json_text("t", names)
    where = [f"t.id = ANY({params.add(wanted, 'uuid[]')})"]
    where += where_clause(ctx, obj, "t", access, params, scope=scope)
    sql = f"SELECT {expression} FROM {obj.table} t WHERE {joined(where)}"
    rows = await connection.fetch(sql, *params.values)
    return json_array(row[0] for row in rows)


def json_array(items: Any) -> bytes:
    return ("[" + ",".join(items) + "]").encode()


@dataclass
class Page:
    records_json: bytes
    cursors: list[str]
    page_info: common_pb2.PageInfo
    total_count: int
    total_count_is_estimate: bool = False


async def list_records(
    connection: Any,
    ctx: RequestContext,
    obj: ObjectModel,
    access: Access,
    request: records_pb2.ListRecordsRequest,
    count_cap: int = 0,
) -> Page:
    if request.after and request.before:
        raise InvalidArgument("use either after or before, not both", field="before")
    if request.first and request.last:
        raise InvalidArgument("use either first or last, not both", field="last")
    backward = bool(request.before) or (request.last > 0 and not request.after)
    size = page_size(request.last if backward else request.first, "last" if backward else "first")
    names = check_fields(obj, list(request.fields))
    depth = check_depth(request.depth)
    order = ordering.build_order(obj, list(request.order_by))
    query_order = order.reversed() if backward else order
    node = request.filter if request.HasField("filter") else None
    params = Params()
    where = where_clause(ctx, obj, "t", access, params, node=node, scope=request.deleted)
    filter_params = list(params.values)
    filter_sql = joined(where)
    cursor_text = request.before if backward else request.after
    branches = [""]
    if cursor_text:
        cursor_field = "before" if backward else "after"
        cursor_values = ordering.decode_cursor(order, cursor_text, cursor_field)
        branches = ordering.keyset_branches(query_order, "t", cursor_values, params) or ["FALSE"]
    expression = record_expression(ctx, obj, "t", names, depth, params)
    key_columns = ", ".join(order.key_sql("t"))
    # Limit first, then render JSON for the page only (a sort must not build JSON for every row).
    # The page size is a literal: a generic plan with an unknown LIMIT may choose to sort it all.
    # One ordered, limited scan per keyset branch, merged (an OR would not start an index scan).
    limit = f"ORDER BY {query_order.sql('t')} LIMIT {int(size) + 1}"
    scans = [
        f"SELECT t.* FROM {obj.table} t WHERE {joined([*where, *([b] if b else [])])} {limit}"
        for b in branches
    ]
    page = scans[0]
    if len(scans) > 1:
        page = "SELECT t.* FROM (" + " UNION ALL ".join(f"({s})" for s in scans) + f") t {limit}"
    sql = f"SELECT {expression}, {key_columns} FROM ({page}) t ORDER BY {query_order.sql('t')}"
    rows = list(await connection.fetch(sql, *params.values))
    more = len(rows) > size
    rows = rows[:size]
    if backward:
        rows.reverse()
    cursor_rows = [rows[0], rows[-1]] if request.page_cursors_only and rows else rows
    encoded = [ordering.encode_cursor(order, list(row[1:])) for row in cursor_rows]
    info = common_pb2.PageInfo(
        has_next_page=bool(request.before) if backward else more,
        has_previous_page=more if backward else bool(request.after),
        start_cursor=encoded[0] if encoded else "",
        end_cursor=encoded[-1] if encoded else "",
    )
    cursors = [] if request.page_cursors_only else encoded
    total, estimate = 0, False
    if request.with_total_count:
        total, estimate = await counts.count_matches(
            connection,
            obj.table,
            filter_sql,
            filter_params,
            cap=count_cap,
            exact=request.exact_total_count,
            unfiltered=is_unfiltered(where, "t"),
        )
    return Page(json_array(row[0] for row in rows), cursors, info, total, estimate)


async def list_related(
    connection: Any,
    ctx: RequestContext,
    obj: ObjectModel,
    access: Access,
    request: records_pb2.ListRelatedRequest,
) -> list[records_pb2.RelatedGroup]:
    """Children of many parents in one statement (a LATERAL page per parent)."""
    relation = obj.field(request.foreign_key_field)
    if relation is None or not relation.is_many_to_one:
        raise InvalidArgument(
            f"{request.foreign_key_field!r} is not a many-to-one field of {obj.name_singular}",
            field="foreignKeyField",
        )
    if len(request.parent_ids) > MAX_IDS:
        raise InvalidArgument(f"at most {MAX_IDS} parent ids per call", field="parentIds")
    parents = [parse_id(value, f"parentIds[{i}]") for i, value in enumerate(request.parent_ids)]
    size = page_size(request.first_per_parent or RELATED_PAGE, "firstPerParent")
    names = check_fields(obj, list(request.fields))
    order = ordering.build_order(obj, list(request.order_by))
    params = Params()
    parent_list = params.add(parents, "uuid[]")
    node = request.filter if request.HasField("filter") else None
    where = where_clause(ctx, obj, "t", access, params, node=node)
    where.append(f"t.{quote(relation.column)} = p.id")
    key_columns = ", ".join(f"{key} AS k{i}" for i, key in enumerate(order.key_sql("t")))
    sql = (
        f"SELECT p.id::text, x.* FROM unnest({parent_list}) AS p(id) CROSS JOIN LATERAL "
        f"(SELECT {obj.json_text('t', names)} AS j, {key_columns} "
        f"FROM {obj.table} t WHERE {joined(where)} ORDER BY {order.sql('t')} "
        f"LIMIT {int(size) + 1}) x"
    )
    rows = await connection.fetch(sql, *params.values)
    grouped: dict[str, list[Any]] = {parent: [] for parent in parents}
    for row in rows:
        grouped[row[0]].append(row)
    groups = []
    for parent, items in grouped.items():
        more = len(items) > size
        items = items[:size]
        groups.append(
            records_pb2.RelatedGroup(
                parent_id=parent,
                records_json=json_array(item[1] for item in items),
                cursors=[ordering.encode_cursor(order, list(item[2:])) for item in items],
                has_next_page=more,
            )
        )
    return groups
