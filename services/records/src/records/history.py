"""Record history: one `records.record_history` row per changed record, written by the same
statement as the change (a data-modifying CTE next to the outbox's), and read newest first.

An entry keeps who made the change (the outbox's actor columns), the action, and for updates and
merges only the changed fields as `{"<field key>": [old, new]}`, taken from the statement's
`before` and `after` record JSON: no second read of the table (docs/data-model.md).
"""

from __future__ import annotations

import base64
import datetime as dt
from dataclasses import dataclass
from typing import Any

import orjson

from crm.common.v1 import common_pb2
from crmkit.authz import Access
from crmkit.errors import InvalidArgument, NotFound
from records.context import RequestContext
from records.model import ObjectModel
from records.outbox import Provenance
from records.reads import joined, page_size, parse_id, where_clause
from records.sql import Params, literal

CREATED, UPDATED, DELETED, RESTORED, MERGED = "created", "updated", "deleted", "restored", "merged"
_INCLUDE_DELETED = 1  # records.v1.DELETED_SCOPE_INCLUDE: a deleted record keeps its history
_CURSOR_PREFIX = "h:"
_MAX_ID = 2**63


def changes(changed: str) -> str:
    """SQL: `{"<key>": [old, new]}` (jsonb) for the keys of the text[] expression `changed`,
    read from the source row's `before` and `after` JSON."""
    return (
        "coalesce((SELECT jsonb_object_agg(k, jsonb_build_array(s.before::json -> k, "
        f"s.after::json -> k)) FROM unnest({changed}) k), '{{}}'::jsonb)"
    )


def history_cte(
    name: str,
    source: str,
    obj: ObjectModel,
    provenance: Provenance,
    *,
    action: str,
    changed: str | None = None,
    related: str = "NULL::uuid",
) -> str:
    """`<name> AS (INSERT INTO records.record_history ...)`: one row per row of CTE `source`
    (which exposes `id`, `before` and `after`). With `changed` (a text[] expression of changed
    keys), an update that altered nothing writes no entry."""
    values = changes(changed) if changed is not None else "NULL::jsonb"
    skip = changed is not None and action == UPDATED
    where = f" WHERE cardinality({changed}) > 0" if skip else ""
    return (
        f"{name} AS (INSERT INTO records.record_history (workspace_id, object_metadata_id, "
        "record_id, action, related_record_id, changes, actor_kind, actor_user_id, "
        "actor_credential_id, actor_workflow_id, occurred_at) "
        f"SELECT {provenance.workspace}, {literal(obj.id)}::uuid, s.id, "
        f"{literal(action)}, {related}, {values}, {provenance.kind}, {provenance.user}, "
        f"{provenance.credential}, {provenance.workflow}, now() FROM {source} s{where})"
    )


# -- reading ---------------------------------------------------------------------------------------


@dataclass
class HistoryPage:
    entries_json: bytes
    cursors: list[str]
    page_info: common_pb2.PageInfo


def _encode_cursor(entry_id: int) -> str:
    return base64.urlsafe_b64encode(f"{_CURSOR_PREFIX}{entry_id}".encode()).decode().rstrip("=")


def _decode_cursor(cursor: str) -> int:
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        if not text.startswith(_CURSOR_PREFIX):
            raise ValueError(cursor)
        entry_id = int(text[len(_CURSOR_PREFIX) :])
        if not 0 < entry_id < _MAX_ID:
            raise ValueError(cursor)
        return entry_id
    except (ValueError, UnicodeDecodeError):
        raise InvalidArgument("after: invalid cursor", field="after") from None


def _timestamp(value: str, field: str) -> dt.datetime | None:
    if not value:
        return None
    try:
        parsed = dt.datetime.fromisoformat(value)
        if parsed.tzinfo is None:
            raise InvalidArgument(f"{field} must name its UTC offset (e.g. Z)", field=field)
        return parsed.astimezone(dt.UTC)
    except (ValueError, OverflowError):
        raise InvalidArgument(f"{field} must be an RFC 3339 timestamp", field=field) from None


def _visible_keys(obj: ObjectModel) -> list[str]:
    """Keys of the fields a record read shows (active stored fields)."""
    return [item.key for item in obj.stored_fields]


def _field_keys(obj: ObjectModel, names: list[str]) -> list[str]:
    keys = []
    for name in names:
        item = obj.by_name.get(name)
        if item is None or not item.stored:
            raise InvalidArgument(f"unknown field {name!r}", field="field")
        keys.append(item.key)
    return keys


async def _require_readable(
    connection: Any, ctx: RequestContext, obj: ObjectModel, access: Access, record_id: str
) -> str:
    params = Params()
    where = [f"t.id = {params.add(parse_id(record_id), 'uuid')}"]
    where += where_clause(ctx, obj, "t", access, params, scope=_INCLUDE_DELETED)
    found = await connection.fetchval(
        f"SELECT t.id::text FROM {obj.table} t WHERE {joined(where)}", *params.values
    )
    if found is None:
        raise NotFound(f"{obj.name_singular} {record_id} not found", field="id")
    text: str = found
    return text


def _entry(row: Any, obj: ObjectModel, visible: list[str]) -> dict[str, Any]:
    related = row["related_record_id"]
    changed = orjson.loads(row["changes"]) if row["changes"] else {}
    entry: dict[str, Any] = {
        "id": _encode_cursor(row["id"]),
        "object": obj.name_singular,
        "recordId": str(row["record_id"]),
        "action": row["action"],
        "occurredAt": row["occurred_at"].isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "actor": {
            "kind": row["actor_kind"],
            "userId": row["actor_user_id"] or None,
            "credentialId": row["actor_credential_id"] or None,
            "workflowId": row["actor_workflow_id"] or None,
        },
        "changes": [  # in the record's field order
            {"field": key, "old": changed[key][0], "new": changed[key][1]}
            for key in visible
            if key in changed
        ],
        "mergedFrom": None,
        "mergedInto": None,
    }
    if related is not None:
        # The target's entry names the source it absorbed; the source's, the target.
        entry["mergedInto" if row["changes"] is None else "mergedFrom"] = str(related)
    return entry


async def list_history(
    connection: Any,
    ctx: RequestContext,
    obj: ObjectModel,
    access: Access,
    record_id: str,
    *,
    first: int,
    after: str,
    fields: list[str],
    since: str,
    until: str,
) -> HistoryPage:
    size = page_size(first, "first")
    keys = _field_keys(obj, fields)
    start, end = _timestamp(since, "since"), _timestamp(until, "until")
    record = await _require_readable(connection, ctx, obj, access, record_id)
    visible = _visible_keys(obj)
    params = Params()
    where = [
        f"h.record_id = {params.add(record, 'uuid')}",
        f"h.workspace_id = {params.add(ctx.principal.workspace_id, 'uuid')}",
        f"h.object_metadata_id = {params.add(obj.id, 'uuid')}",
        # An update whose every changed field is hidden shows as nothing.
        f"(h.action <> 'updated' OR h.changes ?| {params.add(visible, 'text[]')})",
    ]
    if after:
        where.append(f"h.id < {params.add(_decode_cursor(after), 'bigint')}")
    if start is not None:
        where.append(f"h.occurred_at >= {params.add(start, 'timestamptz')}")
    if end is not None:
        where.append(f"h.occurred_at < {params.add(end, 'timestamptz')}")
    if keys:
        where.append(f"h.changes ?| {params.add(keys, 'text[]')}")
    rows = await connection.fetch(
        "SELECT h.id, h.record_id, h.action, h.related_record_id, h.changes::text AS changes, "
        "h.actor_kind, h.actor_user_id, h.actor_credential_id, h.actor_workflow_id, "
        f"h.occurred_at FROM records.record_history h WHERE {joined(where)} "
        f"ORDER BY h.id DESC LIMIT {params.add(size + 1, 'int')}",
        *params.values,
    )
    entries = [_entry(row, obj, visible) for row in rows[:size]]
    cursors = [entry["id"] for entry in entries]
    info = common_pb2.PageInfo(
        has_next_page=len(rows) > size,
        has_previous_page=bool(after),
        start_cursor=cursors[0] if cursors else "",
        end_cursor=cursors[-1] if cursors else "",
    )
    return HistoryPage(orjson.dumps(entries), cursors, info)
