"""Relation writes and read access: a write may point only at records its caller may read, and
a merge re-points only records its caller may update.

`connect` to an object the role cannot READ is refused (403) whatever the id, so the answer
reveals nothing. A role limited to its own records may connect only to records it owns; an id it
does not own answers exactly like an id that does not exist (400 naming the field), as a read of
it answers 404.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from crmkit import authz
from crmkit.authz import Access
from crmkit.errors import InvalidArgument, PermissionDenied
from records.context import RequestContext
from records.inputs import Prepared
from records.model import FieldModel, ObjectModel
from records.predicates import owner_predicate
from records.sql import Params, quote


def _path(item: FieldModel, index: int, batch: bool) -> str:
    return f"[{index}].{item.name}" if batch else item.name


async def require_readable_targets(
    connection: Any, ctx: RequestContext, obj: ObjectModel, rows: Sequence[Prepared]
) -> None:
    """Every relation that `rows` set points at a record the caller may read."""
    batch = len(rows) > 1
    for item in obj.many_to_one:
        wanted: dict[str, str] = {}  # target id -> the first path that names it
        for index, row in enumerate(rows):
            value = row.columns.get(item.column) if item.name in row.fields else None
            if value is not None:
                wanted.setdefault(value, _path(item, index, batch))
        if not wanted:
            continue
        target = ctx.model.by_id(item.target_object_id)
        if target is None:
            continue  # an inactive target: the foreign key answers as before
        access = ctx.read_access(target)
        if access is None:
            path = next(iter(wanted.values()))
            raise PermissionDenied(
                f"{path}: permission denied: READ on {target.name_singular}",
                field=path,
                metadata={"action": "READ", "object": target.name_singular},
            )
        if not access.own_records_only:
            continue  # every existing record is readable; the foreign key checks existence
        params = Params()
        ids = params.add(list(wanted), "uuid[]")
        owner = owner_predicate("t", access, params)
        found = await connection.fetch(
            f"SELECT t.id::text FROM {target.table} t WHERE t.id = ANY({ids}) AND {owner}",
            *params.values,
        )
        readable = {row[0] for row in found}
        for value, path in wanted.items():
            if value not in readable:
                raise InvalidArgument(f"{path}: the related record does not exist", field=path)


async def require_repointable(
    connection: Any, ctx: RequestContext, obj: ObjectModel, source: str, target: str
) -> None:
    """Refuse a merge (403 naming the objects) that would re-point records of other objects, or
    of other owners, that the caller may not update."""
    refused: list[str] = []
    for reference in ctx.model.references_to(obj):
        holder = ctx.model.by_id(reference.object_id)
        if holder is None:
            continue
        access: Access | None = authz.object_access(
            ctx.principal, holder.name_singular, authz.WRITE
        )
        if access is not None and not access.own_records_only:
            continue
        params = Params()
        where = [f"t.{quote(reference.field.column)} = {params.add(source, 'uuid')}"]
        if reference.field.target_object_id == holder.id:
            where.append(f"t.id <> {params.add(target, 'uuid')}")
        if access is not None:
            where.append(f"NOT coalesce({owner_predicate('t', access, params)}, FALSE)")
        count = await connection.fetchval(
            f"SELECT count(*) FROM {holder.table} t WHERE {' AND '.join(where)}", *params.values
        )
        if count:
            refused.append(f"{count} {holder.name_singular} ({reference.field.name})")
    if refused:
        raise PermissionDenied(
            "permission denied: the merge would re-point records you may not update: "
            + ", ".join(refused),
            field="sourceId",
        )
