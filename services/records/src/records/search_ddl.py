"""The search text of each object: a column the writes fill and a GIN trigram index over it.

The column holds `records.search_fold` (lower + unaccent) of the searchable columns joined by
spaces, computed once per write, so a search reads it instead of folding every candidate row
again; `records.search` matches and ranks on it. Its name carries a digest of the searchable
field ids: a field made searchable or not gives a new name, so the planner adds the new column
and index and drops the old column, in the migration that changes the metadata (no restart).
Field names are camelCase, so `_search_...` never collides with a field's column.

Writes fill the column themselves, no longer a generated column: a stored generated column has
its expression built again at every execution of every INSERT and UPDATE statement (PostgreSQL
reads it from the catalog and plans it, search_fold inlined: a third of a single-row INSERT's
instructions). An INSERT computes it in its own SELECT list (`insert_value`), planned once with
the prepared statement; a BEFORE INSERT trigger that fires only when the column arrives NULL
computes it for any other insert, and a BEFORE UPDATE trigger on every update (one plpgsql call
a row, its plan kept for the session). docs/decisions.md, "The search column filled by the
writes". The column is added as a generated column (the table's rewrite fills it for the rows
there) and made a plain one at once. The function's body names the columns, so its name carries
a digest of its text: a field renamed gives a new function and triggers, and the old ones are
dropped. Separate from `records.ddl`, which plans the tables and per-field indexes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

from records.ddl import Catalog
from records.model import SEARCHABLE_TYPES, FieldModel, ObjectModel, WorkspaceModel
from records.sql import literal, quote

PREFIX = "sx_"
COLUMN_PREFIX = "_search_"
TRIGGER_PREFIX = "sxt_"
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


def column_name(fields: list[FieldModel]) -> str:
    """The search column of `fields` (see the module docstring)."""
    return COLUMN_PREFIX + _digest(":".join(item.id for item in fields))


def _trigger_body(fields: list[FieldModel]) -> str:
    return f"BEGIN NEW.{quote(column_name(fields))} := {document(fields, 'NEW')}; RETURN NEW; END"


def _trigger_prefix(obj: ObjectModel) -> str:
    return f"{TRIGGER_PREFIX}{_digest(obj.id)}_"


def function_name(obj: ObjectModel, fields: list[FieldModel]) -> str:
    """The function (in the object's schema) that computes the search column of `fields`; the
    name carries a digest of its text (see the module docstring)."""
    return _trigger_prefix(obj) + _digest(_trigger_body(fields))


_INSERT, _UPDATE = "_ins", "_upd"


def trigger_names(obj: ObjectModel, fields: list[FieldModel]) -> tuple[str, str]:
    """The INSERT and the UPDATE trigger that run `function_name(obj, fields)`."""
    function = function_name(obj, fields)
    return function + _INSERT, function + _UPDATE


def _function_of(trigger: str) -> str:
    return trigger.removesuffix(_INSERT).removesuffix(_UPDATE)


def trigger_statements(obj: ObjectModel, fields: list[FieldModel]) -> list[str]:
    """The function and the two triggers that compute the search column of `fields`: on an
    INSERT that did not set it (`insert_value` sets it), on every UPDATE. Not `UPDATE OF
    <columns>`: a trigger's columns could not change type afterwards, and the function costs an
    UPDATE of other columns little."""
    function = f"{quote(obj.schema)}.{quote(function_name(obj, fields))}"
    on_insert, on_update = trigger_names(obj, fields)
    column = quote(column_name(fields))
    return [
        f"CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql "
        f"AS {literal(_trigger_body(fields))}",
        f"CREATE TRIGGER {quote(on_insert)} BEFORE INSERT ON {obj.table} "
        f"FOR EACH ROW WHEN (NEW.{column} IS NULL) EXECUTE FUNCTION {function}()",
        f"CREATE TRIGGER {quote(on_update)} BEFORE UPDATE ON {obj.table} "
        f"FOR EACH ROW EXECUTE FUNCTION {function}()",
    ]


def drop_trigger_statements(obj: ObjectModel, triggers: Iterable[str]) -> list[str]:
    """Drop the search `triggers` of `obj`'s table, then their functions."""
    names = sorted(triggers)
    functions = sorted({_function_of(name) for name in names})
    return [
        *(f"DROP TRIGGER IF EXISTS {quote(name)} ON {obj.table}" for name in names),
        *(f"DROP FUNCTION IF EXISTS {quote(obj.schema)}.{quote(name)}()" for name in functions),
    ]


def add_column_statements(obj: ObjectModel, fields: list[FieldModel]) -> list[str]:
    """Add the search column of `fields` to `obj`'s table, filled for the rows there (a
    generated column, the table rewritten once), then made a plain one the writes fill."""
    column = quote(column_name(fields))
    return [
        f"ALTER TABLE {obj.table} ADD COLUMN {column} text "
        f"GENERATED ALWAYS AS ({document(fields)}) STORED",
        f"ALTER TABLE {obj.table} ALTER COLUMN {column} DROP EXPRESSION",
    ]


def insert_value(obj: ObjectModel, columns: Sequence[str], alias: str) -> tuple[str, str] | None:
    """The search column and its value for an `INSERT ... SELECT <columns> FROM ... AS <alias>`:
    `(quoted column, expression over alias)`, or None when `obj` has no search column or a
    searchable column is not among `columns` (the insert trigger computes it then)."""
    fields = searchable_fields(obj) if obj.is_active else []
    if not fields or not {item.column for item in fields} <= set(columns):
        return None
    return quote(column_name(fields)), document(fields, alias)


# What a write adds to a GIN index waits in the index's pending list until it is merged in (by
# autovacuum, or by the write that finds the list over this size, in kB), and every search reads
# the whole list. With PostgreSQL's default (4 MB) a search over 100,000 records took 9.5 to
# 24.5 ms at p50 depending on how full the lists were when it ran; 1 MB bounds that read (12-14
# ms) while writes still merge in batches (256 kB: 10-12 ms, but a batch of 1,000 records took
# 2-2.2x the time without the index, against 1.5-1.6x at 1 MB; docs/benchmarks.md).
PENDING_LIST_KB = 1024


def index_name(obj: ObjectModel, fields: list[FieldModel]) -> str:
    """The search index of `obj` over `fields`; the name carries the index's shape (its pending
    list size), so a new shape is a new index and the old one is dropped."""
    shape = ":".join(item.id for item in fields) + f":pending{PENDING_LIST_KB}"
    return f"{_object_prefix(obj)}{_digest(shape)}"


def _object_prefix(obj: ObjectModel) -> str:
    return f"{PREFIX}{_digest(obj.id)}_"


def plan(schema: str, catalog: Catalog, model: WorkspaceModel, trigram: str) -> list[str]:
    """Statements that bring every object's search column, trigger and index to its searchable
    fields; `catalog` as `records.ddl.plan` left it (tables renamed and created)."""
    statements: list[str] = []
    for obj in model.objects.values():
        table = catalog.tables.get(obj.name_singular)
        columns = {} if table is None else table.columns
        triggers = set() if table is None else table.triggers
        existing = [name for name in columns if name.startswith(COLUMN_PREFIX)]
        fields = searchable_fields(obj) if obj.is_active else []
        wanted = column_name(fields) if fields else ""
        wanted_triggers = set(trigger_names(obj, fields)) if fields else set()
        index = index_name(obj, fields) if fields else ""
        if wanted and wanted not in existing:
            statements.extend(add_column_statements(obj, fields))
        elif wanted and columns[wanted].generated:  # as versions before the trigger made it
            statements.append(
                f"ALTER TABLE {obj.table} ALTER COLUMN {quote(wanted)} DROP EXPRESSION"
            )
        ours = {name for name in triggers if name.startswith(_trigger_prefix(obj))}
        if ours - wanted_triggers:
            statements.extend(drop_trigger_statements(obj, ours - wanted_triggers))
        if wanted_triggers - ours:
            statements.extend(
                f"DROP TRIGGER IF EXISTS {quote(name)} ON {obj.table}"
                for name in sorted(wanted_triggers & ours)
            )
            statements.extend(trigger_statements(obj, fields))
        statements.extend(
            f"DROP INDEX IF EXISTS {quote(obj.schema)}.{quote(name)}"
            for name in sorted(catalog.indexes)
            if name.startswith(_object_prefix(obj)) and name != index
        )
        if index and index not in catalog.indexes:
            statements.append(
                f"CREATE INDEX IF NOT EXISTS {quote(index)} ON {obj.table} "
                f"USING gin ({quote(wanted)} {quote(trigram)}.gin_trgm_ops) "
                f'WITH (gin_pending_list_limit = {PENDING_LIST_KB}) WHERE "deletedAt" IS NULL'
            )
        statements.extend(
            f"ALTER TABLE {obj.table} DROP COLUMN IF EXISTS {quote(name)}"
            for name in sorted(existing)
            if name != wanted
        )
    return statements
