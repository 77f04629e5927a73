"""The search index of each object: one GIN trigram index over its searchable fields.

The indexed expression is `records.search_fold` (lower + unaccent) of the searchable columns
joined by spaces, the same text `records.search` matches, so a search's LIKE and similarity
conditions run on the index. The index name carries a digest of the object id and of the
searchable field ids: a field made searchable or not gives a new name, so the planner builds the
new index and drops the old one, in the migration that changes the metadata (no restart).
Separate from `records.ddl`, which plans the tables and per-field indexes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

from records.model import SEARCHABLE_TYPES, FieldModel, ObjectModel, WorkspaceModel
from records.sql import quote

PREFIX = "sx_"
FOLD = "records.search_fold"


async def trigram_schema(connection: Any) -> str:
    """The schema pg_trgm is installed in (migration 0006 installs it)."""
    found = await connection.fetchval(
        "SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace "
        "WHERE e.extname = 'pg_trgm'"
    )
    if found is None:
        raise RuntimeError("the pg_trgm extension is missing (records migration 0006)")
    return str(found)


def searchable_fields(obj: ObjectModel) -> list[FieldModel]:
    """The active fields of `obj` that search matches, in field order."""
    return [
        item
        for item in obj.active_fields
        if item.is_searchable and item.type in SEARCHABLE_TYPES and item.stored
    ]


def document(fields: Iterable[FieldModel], alias: str = "") -> str:
    """The folded text search matches: the fields joined by spaces (IMMUTABLE, indexable)."""
    prefix = f"{alias}." if alias else ""
    joined = " || ' ' || ".join(f"coalesce({prefix}{quote(item.column)}, '')" for item in fields)
    return f"{FOLD}({joined})"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def object_prefix(obj: ObjectModel) -> str:
    return f"{PREFIX}{_digest(obj.id)}_"


def index_name(obj: ObjectModel, fields: list[FieldModel]) -> str:
    return object_prefix(obj) + _digest(":".join(item.id for item in fields))


def plan(schema: str, indexes: set[str], model: WorkspaceModel, trigram: str) -> list[str]:
    """Statements that bring every object's search index to its searchable fields."""
    statements: list[str] = []
    for obj in model.objects.values():
        fields = searchable_fields(obj) if obj.is_active else []
        wanted = index_name(obj, fields) if fields else ""
        stale = sorted(
            name for name in indexes if name.startswith(object_prefix(obj)) and name != wanted
        )
        statements.extend(f"DROP INDEX IF EXISTS {quote(schema)}.{quote(name)}" for name in stale)
        if wanted and wanted not in indexes:
            statements.append(
                f"CREATE INDEX IF NOT EXISTS {quote(wanted)} ON {obj.table} "
                f"USING gin (({document(fields)}) {quote(trigram)}.gin_trgm_ops) "
                'WHERE "deletedAt" IS NULL'
            )
    return statements
