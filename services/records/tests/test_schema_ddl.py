"""The SQLAlchemy-built DDL is equivalent to the hand-written statements it replaced.

`ddl_previous_statements.txt` holds what the string planner (before records.schema_ddl) planned
for the scenarios below: every field type, unique and not, fresh and migrated. The compiled
statements must match them once spelling is normalised (quoting, case, whitespace, type
aliases, where the primary key and NOT NULL are written), so names, types, indexes and
constraints are unchanged (less the per-field trigram GIN indexes, which the planner no longer
makes: #27 item 4).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from crm.metadata.v1 import metadata_pb2 as md
from records import ddl, schema_ddl
from records.model import WorkspaceModel

WS = "11111111-2222-4333-8444-555555555555"
COMPANY = "aaaaaaaa-0000-4000-8000-000000000001"
PERSON = "aaaaaaaa-0000-4000-8000-000000000002"
PREVIOUS = Path(__file__).with_name("ddl_previous_statements.txt")
FIELD_TYPES: list[Any] = [
    value
    for value in md.FieldType.values()
    if value not in (md.FIELD_TYPE_UNSPECIFIED, md.FIELD_TYPE_RELATION)
]


def _fields(unique_parity: int, prefix: str = "f") -> list[md.FieldMetadata]:
    return [
        md.FieldMetadata(
            id=f"cccccccc-0000-4000-8000-{index:012d}",
            name=prefix + md.FieldType.Name(value).title().replace("_", ""),
            type=value,
            is_active=True,
            is_nullable=True,
            is_unique=index % 2 == unique_parity,
            is_indexed=True,
        )
        for index, value in enumerate(FIELD_TYPES)
    ]


def model(*, unique_parity: int = 0, prefix: str = "f", company: str = "company",
          count: int = len(FIELD_TYPES)) -> WorkspaceModel:  # fmt: skip
    relation = md.FieldMetadata(
        id="bbbbbbbb-0000-4000-8000-000000000001", name="company", type=md.FIELD_TYPE_RELATION,
        is_active=True, is_nullable=True,
        relation=md.RelationSettings(kind=md.RELATION_KIND_MANY_TO_ONE,
                                     target_object_metadata_id=COMPANY,
                                     inverse_field_name="people"),
    )  # fmt: skip
    person = md.ObjectMetadata(
        id=PERSON, name_singular="person", name_plural="people", is_active=True,
        fields=[relation, *_fields(unique_parity, prefix)[:count]],
    )  # fmt: skip
    other = md.ObjectMetadata(
        id=COMPANY, name_singular=company, name_plural=company + "s", is_active=True,
        fields=[md.FieldMetadata(id="bbbbbbbb-0000-4000-8000-000000000004", name="name",
                                 type=md.FIELD_TYPE_TEXT, is_active=True, is_nullable=False,
                                 is_indexed=True)],
    )  # fmt: skip
    return WorkspaceModel.from_proto(
        md.WorkspaceSchema(workspace_id=WS, version=1, objects=[person, other])
    )


def _steps(planner: object, catalog: object, *models: WorkspaceModel) -> list[str]:
    """Plan each model in turn against the catalog the previous plans left (as if applied)."""
    statements: list[str] = []
    for item in models:
        statements += planner.plan(item.schema, catalog, item)  # type: ignore[attr-defined]
        catalog.exists = True  # type: ignore[attr-defined]
    return statements


SCENARIOS: dict[str, Callable[[object, object], list[str]]] = {
    "fresh, even fields unique": lambda p, c: _steps(p, c, model(unique_parity=0)),
    "fresh, odd fields unique": lambda p, c: _steps(p, c, model(unique_parity=1)),
    # Fields added to an existing table (ADD COLUMN), then uniqueness flipped (drop/create).
    "add columns, flip unique": lambda p, c: _steps(
        p, c, model(count=1), model(unique_parity=0), model(unique_parity=1)
    ),
    # Table and column renames (same ids, new names).
    "renames": lambda p, c: _steps(p, c, model(), model(prefix="g", company="organization")),
}


def normalise(statement: str) -> str:
    text = re.sub(r"\s+", " ", statement.replace('"', "")).strip().lower()
    text = text.replace("timestamptz", "timestamp with time zone")
    text = text.replace("foreign key(", "foreign key (").replace("( ", "(").replace(" )", ")")
    text = text.replace("not null default now()", "default now() not null")
    if text.startswith("create table") and ", primary key (id))" not in text:
        text = text.replace("id uuid primary key", "id uuid not null")[:-1] + ", primary key (id))"
    return text


def _previous() -> dict[str, list[str]]:
    sections: dict[str, list[str]] = {}
    current: list[str] = []
    for line in PREVIOUS.read_text().splitlines():
        if line.startswith("## "):
            current = sections.setdefault(line[3:], [])
        elif line:
            current.append(line)
    return sections


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_compiled_ddl_matches_the_previous_statements(scenario: str) -> None:
    compiled = SCENARIOS[scenario](ddl, ddl.Catalog())
    assert [normalise(s) for s in compiled] == [normalise(s) for s in _previous()[scenario]]


def test_every_field_type_and_index_shape_is_covered() -> None:
    text = "\n".join(SCENARIOS["add columns, flip unique"](ddl, ddl.Catalog()))
    for sql_type in ("UUID", "TEXT", "DOUBLE PRECISION", "BOOLEAN", "DATE", "BIGINT", "JSONB"):
        assert f" {sql_type}" in text
    for shape in ("TIMESTAMP WITH TIME ZONE", "TEXT[]", "ADD COLUMN", "DROP INDEX IF EXISTS"):
        assert shape in text
    for shape in ("(left(", "(md5(", "FOREIGN KEY"):
        assert shape in text


def test_identifiers_are_validated_and_always_quoted() -> None:
    assert schema_ddl.create_schema("ws_1") == 'CREATE SCHEMA IF NOT EXISTS "ws_1"'
    assert schema_ddl.rename_column("ws_1", "person", "a", "bB") == (
        'ALTER TABLE "ws_1"."person" RENAME COLUMN "a" TO "bB"'
    )
    with pytest.raises(ValueError, match="unsafe"):
        schema_ddl.create_index("ws_1", "person", "ix", ('x"; DROP TABLE y; --',))
