"""DDL that brings a workspace's Postgres schema to a desired data model.

The plan is computed from the live catalog, not from what was last applied: every table and
column carries a comment tag naming its object or field id, so renames are detected, a column
left behind by a definition that never committed (a crash between DDL and commit) is moved aside
instead of reused, and re-running a plan is a no-op. Columns and tables are never dropped: a
deactivated field keeps its data.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from crm.metadata.v1 import metadata_pb2 as md
from records import schema_ddl
from records.model import (
    SORTABLE_TYPES,
    TEXT_KEY_CHARS,
    UNBOUNDED_TEXT_TYPES,
    Column,
    FieldModel,
    ObjectModel,
    WorkspaceModel,
)
from records.sql import quote

# format_type() spellings of the column types the model uses.
_CATALOG_TYPES = {
    "timestamptz": "timestamp with time zone",
    "double precision": "double precision",
}

_SYSTEM_NAMES = frozenset(schema_ddl.SYSTEM_COLUMNS)
_INDEXED_SYSTEM = ("ownerId", "createdAt", "updatedAt")


@dataclass
class CatalogColumn:
    name: str
    type: str
    tag: str = ""
    generated: bool = False  # GENERATED ALWAYS AS (...) STORED


@dataclass
class CatalogTable:
    name: str
    tag: str = ""
    columns: dict[str, CatalogColumn] = field(default_factory=dict)
    triggers: set[str] = field(default_factory=set)  # the table's own (not internal) triggers


@dataclass
class Catalog:
    """What exists in one workspace schema."""

    exists: bool = False
    tables: dict[str, CatalogTable] = field(default_factory=dict)
    indexes: set[str] = field(default_factory=set)
    constraints: set[str] = field(default_factory=set)


async def read_catalog(connection: Any, schema: str) -> Catalog:
    """The schema's tables, columns, indexes and constraints, read through indexed catalog paths.

    Relations are found from the namespace's dependents (`pg_depend` by referenced object), then
    read by oid (`pg_attribute` by `attrelid`, `pg_index` by `indrelid`, `pg_constraint` by
    `conrelid`): the cost follows this workspace's size, not the number of tenants.
    """
    namespace = await connection.fetchval("SELECT oid FROM pg_namespace WHERE nspname = $1", schema)
    catalog = Catalog(exists=namespace is not None)
    if namespace is None:
        return catalog
    relations = [
        row[0]
        for row in await connection.fetch(
            "SELECT objid FROM pg_depend WHERE refclassid = 'pg_namespace'::regclass "
            "AND refobjid = $1 AND classid = 'pg_class'::regclass AND objsubid = 0",
            namespace,
        )
    ]
    rows = await connection.fetch(
        """
        SELECT c.relname AS table_name, coalesce(obj_description(c.oid, 'pg_class'), '') AS tag,
               a.attname AS column_name, format_type(a.atttypid, a.atttypmod) AS column_type,
               coalesce(col_description(c.oid, a.attnum), '') AS column_tag,
               a.attgenerated <> '' AS generated
        FROM unnest($1::oid[]) AS r(oid)
        JOIN pg_class c ON c.oid = r.oid
        JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
        WHERE c.relkind = 'r' AND c.relnamespace = $2
        """,
        relations,
        namespace,
    )
    for row in rows:
        table = catalog.tables.setdefault(
            row["table_name"], CatalogTable(row["table_name"], row["tag"])
        )
        table.columns[row["column_name"]] = CatalogColumn(
            row["column_name"], row["column_type"], row["column_tag"], row["generated"]
        )
    for row in await connection.fetch(
        "SELECT c.relname, t.tgname FROM unnest($1::oid[]) AS r(oid) "
        "JOIN pg_trigger t ON t.tgrelid = r.oid AND NOT t.tgisinternal "
        "JOIN pg_class c ON c.oid = r.oid WHERE c.relkind = 'r'",
        relations,
    ):
        if row[0] in catalog.tables:
            catalog.tables[row[0]].triggers.add(row[1])
    catalog.indexes = {
        row[0]
        for row in await connection.fetch(
            "SELECT ic.relname FROM unnest($1::oid[]) AS r(oid) "
            "JOIN pg_index i ON i.indrelid = r.oid JOIN pg_class ic ON ic.oid = i.indexrelid",
            relations,
        )
    }
    catalog.constraints = {
        row[0]
        for row in await connection.fetch(
            "SELECT con.conname FROM unnest($1::oid[]) AS r(oid) "
            "JOIN pg_constraint con ON con.conrelid = r.oid WHERE con.connamespace = $2",
            relations,
            namespace,
        )
    }
    return catalog


def object_tag(object_id: str) -> str:
    return f"crm:object:{object_id}"


def index_name(prefix: str, *parts: str) -> str:
    """A stable index or constraint name from ids (survives table and column renames)."""
    digest = hashlib.sha256(":".join(parts).encode()).hexdigest()[:24]
    return f"{prefix}_{digest}"


def _orphan_name(name: str) -> str:
    suffix = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"_orphan_{name[:40]}_{suffix}"


def _catalog_type(sql_type: str) -> str:
    return _CATALOG_TYPES.get(sql_type, sql_type)


class _Planner:
    def __init__(self, schema: str, catalog: Catalog) -> None:
        self.schema = schema
        self.catalog = catalog
        self.statements: list[str] = []

    def plan(self, model: WorkspaceModel) -> list[str]:
        if not self.catalog.exists:
            self.statements.append(schema_ddl.create_schema(self.schema))
        for item in model.objects.values():
            self._table(item)
        for item in model.objects.values():
            self._indexes(item)
        for item in model.objects.values():
            self._foreign_keys(item, model)
        return self.statements

    # -- tables and columns ------------------------------------------------------------------
    def _evict_table(self, name: str) -> None:
        occupant = self.catalog.tables.pop(name, None)
        if occupant is None:
            return
        orphan = _orphan_name(name)
        self.statements.append(schema_ddl.rename_table(self.schema, name, orphan))
        occupant.name = orphan
        self.catalog.tables[orphan] = occupant

    def _table(self, item: ObjectModel) -> None:
        tag = object_tag(item.id)
        wanted = item.name_singular
        current = next((t for t in self.catalog.tables.values() if t.tag == tag), None)
        if current is None:
            self._evict_table(wanted)
            self._create_table(item, tag)
            return
        if current.name != wanted:
            self._evict_table(wanted)
            self.statements.append(schema_ddl.rename_table(self.schema, current.name, wanted))
            del self.catalog.tables[current.name]
            current.name = wanted
            self.catalog.tables[wanted] = current
        for entry in item.fields:
            if entry.is_system:
                continue
            for column in entry.columns:
                self._column(current, column)

    def _create_table(self, item: ObjectModel, tag: str) -> None:
        table = CatalogTable(item.name_singular, tag)
        columns = [
            column for entry in item.fields if not entry.is_system for column in entry.columns
        ]
        for column in columns:
            table.columns[column.name] = CatalogColumn(
                column.name, _catalog_type(column.sql_type), column.tag
            )
        self.statements.extend(
            schema_ddl.create_table(
                self.schema,
                item.name_singular,
                tag,
                ((column.name, column.sql_type, column.tag) for column in columns),
            )
        )
        self.catalog.tables[table.name] = table

    def _evict_column(self, table: CatalogTable, name: str) -> None:
        occupant = table.columns.pop(name, None)
        if occupant is None:
            return
        orphan = _orphan_name(name)
        self.statements.append(schema_ddl.rename_column(self.schema, table.name, name, orphan))
        occupant.name = orphan
        table.columns[orphan] = occupant

    def _column(self, table: CatalogTable, column: Column) -> None:
        current = next((c for c in table.columns.values() if c.tag == column.tag), None)
        if current is not None and current.type != _catalog_type(column.sql_type):
            # Same field id with another type cannot come from metadata (types are immutable);
            # keep the old data aside rather than guess a conversion.
            current.tag = ""
            current = None
        if current is None:
            if column.name in _SYSTEM_NAMES:
                raise ValueError(f"field column {column.name} collides with a system column")
            self._evict_column(table, column.name)
            self.statements.extend(
                schema_ddl.add_column(
                    self.schema, table.name, column.name, column.sql_type, column.tag
                )
            )
            table.columns[column.name] = CatalogColumn(
                column.name, _catalog_type(column.sql_type), column.tag
            )
            return
        if current.name != column.name:
            self._evict_column(table, column.name)
            self.statements.append(
                schema_ddl.rename_column(self.schema, table.name, current.name, column.name)
            )
            del table.columns[current.name]
            current.name = column.name
            table.columns[column.name] = current

    # -- indexes and constraints -------------------------------------------------------------
    def _create_index(
        self,
        name: str,
        table: str,
        columns: tuple[str, ...],
        *,
        md5: bool = False,
        key_chars: int = 0,
    ) -> None:
        if name in self.catalog.indexes:
            return
        unique = name.startswith("uq_")
        self.statements.append(
            schema_ddl.create_index(
                self.schema, table, name, columns, unique=unique, md5=md5,
                key_chars=key_chars, live_only=unique,
            )
        )  # fmt: skip
        self.catalog.indexes.add(name)

    def _drop_index(self, name: str) -> None:
        if name in self.catalog.indexes:
            self.statements.append(schema_ddl.drop_index(self.schema, name))
            self.catalog.indexes.discard(name)

    def _indexes(self, item: ObjectModel) -> None:
        """The index rule of docs/data-model.md ("Indexes"); shapes of earlier versions dropped."""
        table = item.name_singular
        for name in _INDEXED_SYSTEM:
            self._create_index(index_name("ix", item.id, name), table, (name, "id"))
        for entry in item.fields:
            if entry.is_system or not entry.columns:
                continue
            column = entry.columns[0].name
            plain, keyed = index_name("ix", item.id, entry.id), index_name("tx", item.id, entry.id)
            self._drop_index(index_name("hx", item.id, entry.id))
            # Per-field trigram GINs of earlier versions: fragment filters on searchable fields
            # are prefiltered by the object's search column GIN (records.predicates).
            self._drop_index(index_name("tg", item.id, entry.id))
            # A b-tree row holds at most ~2.7 kB, text up to 65,536 characters: the index of long
            # text holds the value's first characters, which sort, page and find equal values.
            long_text = entry.type in UNBOUNDED_TEXT_TYPES
            btree, other = (keyed, plain) if long_text else (plain, keyed)
            self._drop_index(other)
            if btree_indexed(item, entry):
                key_chars = TEXT_KEY_CHARS if long_text else 0
                self._create_index(btree, table, (column, "id"), key_chars=key_chars)
            else:
                self._drop_index(btree)
            unique_name = unique_index_name(item.id, entry)
            if unique_over_md5(entry):
                self._drop_index(index_name("uq", item.id, entry.id))
            if has_unique_index(entry):
                self._create_index(unique_name, table, (column,), md5=unique_over_md5(entry))
            else:
                self._drop_index(unique_name)

    def _foreign_keys(self, item: ObjectModel, model: WorkspaceModel) -> None:
        for entry in item.fields:
            if entry.type != md.FIELD_TYPE_RELATION or not entry.columns:
                continue
            target = model.objects.get(entry.target_object_id)
            name = foreign_key_name(entry)
            if target is None or name in self.catalog.constraints:
                continue
            self.statements.append(
                schema_ddl.add_foreign_key(
                    self.schema,
                    item.name_singular,
                    name,
                    entry.columns[0].name,
                    target.name_singular,
                )
            )
            self.catalog.constraints.add(name)


def foreign_key_name(entry: FieldModel) -> str:
    return index_name("fk", entry.id)


def unique_over_md5(entry: FieldModel) -> bool:
    """Unbounded text is indexed over md5 of the value (a b-tree row holds at most ~2.7 kB)."""
    return entry.type in UNBOUNDED_TEXT_TYPES


def unique_index_name(object_id: str, entry: FieldModel) -> str:
    """The unique index of an `isUnique` field (over md5 of the value for unbounded text)."""
    if unique_over_md5(entry):
        return index_name("uq", object_id, entry.id, "md5")
    return index_name("uq", object_id, entry.id)


def has_unique_index(entry: FieldModel) -> bool:
    return entry.is_unique and entry.type != md.FIELD_TYPE_CURRENCY and bool(entry.columns)


def unique_conflict_target(entry: FieldModel) -> str:
    """The `ON CONFLICT` target that infers the unique index of an `isUnique` field: the same
    expression and the same live-rows-only predicate as the index the planner creates."""
    column = quote(entry.columns[0].name)
    expression = f"(md5({column}))" if unique_over_md5(entry) else column
    return f'({expression}) WHERE "deletedAt" IS NULL'


def btree_indexed(item: ObjectModel, entry: FieldModel) -> bool:
    """Whether `entry` has its (column, id) btree (docs/data-model.md, "Indexes"): many-to-one
    relations and the object's label field always, other fields when marked `isIndexed`; only
    types a btree serves (not BOOLEAN, MULTI_SELECT, RAW_JSON)."""
    if entry.is_many_to_one:
        return True
    if not (entry.is_indexed or entry.name == item.label_identifier):
        return False
    if entry.type == md.FIELD_TYPE_CURRENCY:
        return True  # on the amount
    return entry.type in SORTABLE_TYPES and entry.type != md.FIELD_TYPE_BOOLEAN


def plan(schema: str, catalog: Catalog, model: WorkspaceModel) -> list[str]:
    """The statements that bring `catalog` to `model` (empty when it is already there)."""
    return _Planner(schema, catalog).plan(model)
