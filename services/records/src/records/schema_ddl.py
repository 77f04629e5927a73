"""Workspace DDL statements built with SQLAlchemy Core schema constructs, compiled for Postgres.

Only the DDL planner (records.ddl) uses this; the hot-path DML stays on records.sql and asyncpg
(docs/decisions.md). Every identifier is checked by `records.sql.quote` and always quoted, so
the mixed-case field names keep their spelling. SQLAlchemy has no rename construct: renames are
the one ALTER spelled here by hand, with the dialect's own identifier quoting.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg
from sqlalchemy.sql import ddl
from sqlalchemy.sql.elements import quoted_name
from sqlalchemy.types import TypeEngine

from records.sql import quote

_DIALECT = pg.dialect()  # type: ignore[no-untyped-call]

# The model's column types (records.model.SQL_TYPES, CURRENCY_PARTS) as SQLAlchemy types.
_TYPES: dict[str, TypeEngine[Any]] = {
    "uuid": pg.UUID(as_uuid=False),
    "text": sa.TEXT(),
    "double precision": pg.DOUBLE_PRECISION(),
    "boolean": sa.BOOLEAN(),
    "date": sa.DATE(),
    "timestamptz": pg.TIMESTAMP(timezone=True),
    "text[]": pg.ARRAY(sa.TEXT()),
    "jsonb": pg.JSONB(),
    "bigint": sa.BIGINT(),
}
_TIMESTAMPTZ = "timestamptz"


def name(identifier: str) -> quoted_name:
    """A validated identifier that SQLAlchemy always quotes (keeps `firstName` as written)."""
    quote(identifier)
    return quoted_name(identifier, quote=True)


def _sql(element: sa.sql.ClauseElement) -> str:
    return str(element.compile(dialect=_DIALECT)).strip()


def _column(column_name: str, sql_type: str, comment: str | None = None) -> sa.Column[Any]:
    return sa.Column(name(column_name), _TYPES[sql_type], comment=comment)


def _system_columns() -> list[sa.Column[Any]]:
    return [
        sa.Column(name("id"), _TYPES["uuid"], primary_key=True),
        sa.Column(name("ownerId"), _TYPES["uuid"]),
        sa.Column(
            name("createdAt"), _TYPES[_TIMESTAMPTZ], nullable=False, server_default=sa.func.now()
        ),
        sa.Column(
            name("updatedAt"), _TYPES[_TIMESTAMPTZ], nullable=False, server_default=sa.func.now()
        ),
        sa.Column(name("deletedAt"), _TYPES[_TIMESTAMPTZ]),
    ]


SYSTEM_COLUMNS = tuple(column.name for column in _system_columns())


def table(schema: str, table_name: str, *columns: str) -> sa.Table:
    """A table handle naming just the columns a statement refers to (types do not matter)."""
    names = dict.fromkeys(("id", *columns))
    return sa.Table(
        name(table_name),
        sa.MetaData(),
        *(sa.Column(name(column)) for column in names),
        schema=name(schema),
    )


def create_schema(schema: str) -> str:
    return _sql(ddl.CreateSchema(name(schema), if_not_exists=True))


def create_table(
    schema: str, table_name: str, tag: str, columns: Iterable[tuple[str, str, str]]
) -> list[str]:
    """CREATE TABLE with the system columns and `(name, sql_type, tag)` columns, then comments."""
    fields = [_column(column, sql_type, column_tag) for column, sql_type, column_tag in columns]
    created = sa.Table(
        name(table_name),
        sa.MetaData(),
        *_system_columns(),
        *fields,
        schema=name(schema),
        comment=tag,
    )
    return [
        _sql(ddl.CreateTable(created)),
        _sql(ddl.SetTableComment(created)),
        *(_sql(ddl.SetColumnComment(column)) for column in fields),
    ]


def add_column(schema: str, table_name: str, column: str, sql_type: str, tag: str) -> list[str]:
    """ADD COLUMN (the column clause compiled by SQLAlchemy) and its comment."""
    handle = table(schema, table_name)
    added = _column(column, sql_type, tag)
    handle.append_column(added)
    return [
        f"ALTER TABLE {_table_name(handle)} ADD COLUMN {_sql(ddl.CreateColumn(added))}",
        _sql(ddl.SetColumnComment(added)),
    ]


def rename_table(schema: str, old: str, new: str) -> str:
    return f"ALTER TABLE {_table_name(table(schema, old))} RENAME TO {_quoted(new)}"


def rename_column(schema: str, table_name: str, old: str, new: str) -> str:
    return (
        f"ALTER TABLE {_table_name(table(schema, table_name))} "
        f"RENAME COLUMN {_quoted(old)} TO {_quoted(new)}"
    )


def create_index(
    schema: str,
    table_name: str,
    index: str,
    columns: tuple[str, ...],
    *,
    unique: bool = False,
    md5: bool = False,
    key_chars: int = 0,
    live_only: bool = False,
) -> str:
    """CREATE [UNIQUE] INDEX IF NOT EXISTS over columns, optionally partial.

    `md5`: over md5 of each column; `key_chars`: the first column's leading characters only
    (`left(column, n)`).
    """
    handle = table(schema, table_name, *columns)
    expressions: list[sa.ColumnElement[Any]] = [handle.c[column] for column in columns]
    if md5:
        expressions = [sa.func.md5(expression) for expression in expressions]
    if key_chars:
        expressions[0] = sa.func.left(expressions[0], sa.literal_column(str(int(key_chars))))
    options: dict[str, Any] = {}
    if live_only:
        handle.append_column(sa.Column(name("deletedAt")))
        options["postgresql_where"] = handle.c.deletedAt.is_(None)
    built = sa.Index(name(index), *expressions, unique=unique, **options)
    return _sql(ddl.CreateIndex(built, if_not_exists=True))


def drop_index(schema: str, index: str) -> str:
    handle = table(schema, "_")
    return _sql(ddl.DropIndex(sa.Index(name(index), handle.c.id), if_exists=True))


def add_foreign_key(
    schema: str, table_name: str, constraint: str, column: str, target_table: str
) -> str:
    """A foreign key to the target's id that nulls the reference when the target row goes."""
    source = table(schema, table_name, column)
    target = table(schema, target_table)
    key = sa.ForeignKeyConstraint(
        [source.c[column]], [target.c.id], name=name(constraint), ondelete="SET NULL"
    )
    source.append_constraint(key)
    return _sql(ddl.AddConstraint(key))


def _table_name(handle: sa.Table) -> str:
    return _DIALECT.identifier_preparer.format_table(handle)


def _quoted(identifier: str) -> str:
    return _DIALECT.identifier_preparer.quote(name(identifier))
