"""The records service's compiled view of a workspace's data model.

Built once per applied metadata version from `crm.metadata.v1.WorkspaceSchema`: for every object
its physical table, typed columns, the JSON key of each field, and the SQL expressions that render
a row as the record JSON of the contract (so Postgres, not Python, builds the JSON).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import orjson

from crm.metadata.v1 import metadata_pb2 as md
from records.sql import literal, quote, workspace_schema_name

SYSTEM_FIELDS = ("id", "ownerId", "createdAt", "updatedAt", "deletedAt")
TIMESTAMP_FIELDS = frozenset({"createdAt", "updatedAt", "deletedAt"})
# Postgres caps function arguments at 100: concat() takes at most 49 (key, value) pairs.
_MAX_PAIRS = 49

SQL_TYPES: dict[int, str] = {
    md.FIELD_TYPE_UUID: "uuid",
    md.FIELD_TYPE_TEXT: "text",
    md.FIELD_TYPE_NUMBER: "double precision",
    md.FIELD_TYPE_BOOLEAN: "boolean",
    md.FIELD_TYPE_DATE: "date",
    md.FIELD_TYPE_DATE_TIME: "timestamptz",
    md.FIELD_TYPE_SELECT: "text",
    md.FIELD_TYPE_MULTI_SELECT: "text[]",
    md.FIELD_TYPE_EMAIL: "text",
    md.FIELD_TYPE_PHONE: "text",
    md.FIELD_TYPE_LINK: "text",
    md.FIELD_TYPE_RAW_JSON: "jsonb",
    md.FIELD_TYPE_RELATION: "uuid",
}
CURRENCY_PARTS = (
    ("amountMicros", "AmountMicros", "bigint"),
    ("currencyCode", "CurrencyCode", "text"),
)

# Types that can be ordered and compared with gt/gte/lt/lte, and get a btree index.
SORTABLE_TYPES = frozenset(
    {
        md.FIELD_TYPE_UUID,
        md.FIELD_TYPE_TEXT,
        md.FIELD_TYPE_NUMBER,
        md.FIELD_TYPE_BOOLEAN,
        md.FIELD_TYPE_DATE,
        md.FIELD_TYPE_DATE_TIME,
        md.FIELD_TYPE_SELECT,
        md.FIELD_TYPE_EMAIL,
        md.FIELD_TYPE_PHONE,
        md.FIELD_TYPE_LINK,
    }
)
NUMERIC_TYPES = frozenset({md.FIELD_TYPE_NUMBER, md.FIELD_TYPE_CURRENCY})
TEXT_TYPES = frozenset(
    {
        md.FIELD_TYPE_TEXT,
        md.FIELD_TYPE_EMAIL,
        md.FIELD_TYPE_PHONE,
        md.FIELD_TYPE_LINK,
        md.FIELD_TYPE_SELECT,
    }
)

# Types whose fields cross-object search can match (FieldMetadata.is_searchable).
SEARCHABLE_TYPES = frozenset(
    {md.FIELD_TYPE_TEXT, md.FIELD_TYPE_EMAIL, md.FIELD_TYPE_PHONE, md.FIELD_TYPE_LINK}
)

# Text of up to 65,536 characters: too long for a b-tree row, so sorted, paged and indexed on its
# first TEXT_KEY_CHARS characters (at most 4 bytes each in UTF-8: 1 kB, well under the ~2.7 kB a
# b-tree row holds), with `id` breaking ties (records.ddl, records.ordering).
UNBOUNDED_TEXT_TYPES = frozenset(
    {md.FIELD_TYPE_TEXT, md.FIELD_TYPE_EMAIL, md.FIELD_TYPE_PHONE, md.FIELD_TYPE_LINK}
)
TEXT_KEY_CHARS = 256


def text_key(column: str) -> str:
    """The indexed key of a long-text column expression: its first TEXT_KEY_CHARS characters."""
    return f"left({column}, {TEXT_KEY_CHARS})"


_TIMESTAMP_FORMAT = '\'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"\''

MISSING: Any = object()


def type_name(field_type: int) -> str:
    return md.FieldType.Name(field_type).removeprefix("FIELD_TYPE_")


@dataclass(frozen=True)
class Column:
    """A physical column and the comment tag that ties it to its field across renames."""

    name: str
    sql_type: str
    tag: str
    part: str = ""  # sub-field of a composite (CURRENCY): amountMicros / currencyCode


@dataclass(frozen=True)
class FieldModel:
    id: str
    name: str
    type: int
    is_system: bool = False
    is_active: bool = True
    is_nullable: bool = True
    is_unique: bool = False
    is_searchable: bool = False
    is_indexed: bool = False
    options: frozenset[str] = frozenset()
    default: Any = MISSING
    relation_kind: int = md.RELATION_KIND_UNSPECIFIED
    target_object_id: str = ""
    inverse_name: str = ""
    columns: tuple[Column, ...] = ()
    label: str = ""

    @property
    def is_many_to_one(self) -> bool:
        return self.type == md.FIELD_TYPE_RELATION and (
            self.relation_kind == md.RELATION_KIND_MANY_TO_ONE
        )

    @property
    def is_one_to_many(self) -> bool:
        return self.type == md.FIELD_TYPE_RELATION and (
            self.relation_kind == md.RELATION_KIND_ONE_TO_MANY
        )

    @property
    def key(self) -> str:
        """The field's key in record JSON at depth 0."""
        return self.name + "Id" if self.is_many_to_one else self.name

    @property
    def column(self) -> str:
        """The single column of a non-composite field."""
        return self.columns[0].name

    @property
    def sortable(self) -> bool:
        return (self.type in SORTABLE_TYPES) or self.is_many_to_one

    @property
    def stored(self) -> bool:
        return bool(self.columns)


@dataclass(frozen=True)
class ObjectRelation:
    """A many-to-one field of some object that points at this object (for merge repointing)."""

    object_id: str
    field: FieldModel


@dataclass
class ObjectModel:
    id: str
    name_singular: str
    name_plural: str
    schema: str
    is_active: bool
    label_identifier: str
    fields: list[FieldModel]
    by_name: dict[str, FieldModel] = field(default_factory=dict)  # active fields, by name and key
    _json: dict[tuple[str, tuple[str, ...], bool], str] = field(default_factory=dict)
    # Statement texts built once per model and kept by their builders (records.writes): their
    # values are parameters, so one text serves every caller.
    statements: dict[tuple[object, ...], str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for item in self.fields:
            if item.is_active:
                self.by_name[item.name] = item
                if item.key != item.name:
                    self.by_name[item.key] = item

    @cached_property
    def table(self) -> str:
        return f"{quote(self.schema)}.{quote(self.name_singular)}"

    @cached_property
    def active_fields(self) -> list[FieldModel]:
        """Active fields in record-JSON order: id, own fields, then owner and timestamps."""
        active = [item for item in self.fields if item.is_active]
        system = {item.name: item for item in active if item.is_system}
        own = [item for item in active if not item.is_system]
        return (
            [system[name] for name in ("id",) if name in system]
            + own
            + [system[name] for name in SYSTEM_FIELDS[1:] if name in system]
        )

    @cached_property
    def stored_fields(self) -> list[FieldModel]:
        return [item for item in self.active_fields if item.stored]

    @cached_property
    def writable_fields(self) -> list[FieldModel]:
        """Fields a create sets (every active stored field except the timestamps)."""
        return [
            item
            for item in self.stored_fields
            if item.name not in TIMESTAMP_FIELDS and item.name != "deletedAt"
        ]

    @cached_property
    def column_types(self) -> dict[str, str]:
        """The SQL type of each stored column, by column name."""
        return {c.name: c.sql_type for item in self.stored_fields for c in item.columns}

    @cached_property
    def insert_columns(self) -> list[str]:
        """The columns a create sets: those of the writable fields, in order."""
        return [column.name for item in self.writable_fields for column in item.columns]

    @cached_property
    def many_to_one(self) -> list[FieldModel]:
        return [item for item in self.active_fields if item.is_many_to_one]

    @cached_property
    def one_to_many(self) -> list[FieldModel]:
        return [item for item in self.active_fields if item.is_one_to_many]

    def field(self, name: str) -> FieldModel | None:
        return self.by_name.get(name)

    def json_expression(self, alias: str, names: tuple[str, ...] = ()) -> str:
        """SQL building the record JSON (depth 0, type json) of the row `alias`, optionally only
        `names`: for a value nested in other JSON or stored."""
        return self._json_sql(alias, names, as_text=False)

    def json_text(self, alias: str, names: tuple[str, ...] = ()) -> str:
        """The same record JSON as text: for a value that leaves the database as it is (a
        PostgreSQL json cast would parse it again only to check it)."""
        return self._json_sql(alias, names, as_text=True)

    def _json_sql(self, alias: str, names: tuple[str, ...], *, as_text: bool) -> str:
        cache_key = (alias, names, as_text)
        cached = self._json.get(cache_key)
        if cached is not None:
            return cached
        chosen = self.stored_fields
        if names:
            wanted = set(names) | {"id"}
            chosen = [item for item in chosen if item.name in wanted or item.key in wanted]
        pairs = [(item.key, value_expression(item, alias)) for item in chosen]
        expression = build_json_text(pairs) if as_text else build_json_object(pairs)
        self._json[cache_key] = expression
        return expression


def build_json_object(pairs: Iterable[tuple[str, str]]) -> str:
    """SQL building a JSON object (type json) from (key, SQL expression) pairs, in their order
    (`build_json_text`, cast to json)."""
    return build_json_text(pairs) + "::json"


def build_json_text(pairs: Iterable[tuple[str, str]]) -> str:
    """SQL building the text of a JSON object from (key, SQL expression) pairs, in their order.

    Rendered as `{"key": value, ...}`: json_build_object's `"key" : value` spacing is odd in logs
    and diffs, and this text concatenation of to_json values costs no more (docs/decisions.md).
    Keys are the service's own field names (literal() quotes them for SQL; they need no JSON
    escaping); every value is to_json's, so the text is valid JSON without PostgreSQL checking
    it again (a json cast parses it whole: about 1 us of a 6 us row when 300,000 rows are
    rendered)."""
    items = list(pairs)
    chunks = [items[i : i + _MAX_PAIRS] for i in range(0, len(items), _MAX_PAIRS)]
    parts: list[str] = []
    for index, chunk in enumerate(chunks):
        arguments: list[str] = []
        for position, (key, expr) in enumerate(chunk):
            separator = "" if index == 0 and position == 0 else ", "
            arguments.append(literal(f'{separator}"{key}": '))
            arguments.append(f"coalesce(to_json({expr})::text, 'null')")
        parts.append("concat(" + ", ".join(arguments) + ")")
    return "('{' || " + " || ".join([*parts, "'}'"]) + ")"


def value_expression(item: FieldModel, alias: str) -> str:
    """SQL rendering one field of row `alias` as its JSON value."""
    if item.type == md.FIELD_TYPE_CURRENCY:
        amount, code = (f"{alias}.{quote(column.name)}" for column in item.columns)
        return (
            f"CASE WHEN {amount} IS NULL AND {code} IS NULL THEN NULL ELSE "
            f"{build_json_object([('amountMicros', amount), ('currencyCode', code)])} END"
        )
    column = f"{alias}.{quote(item.column)}"
    if item.type == md.FIELD_TYPE_DATE_TIME:
        return f"to_char({column} AT TIME ZONE 'UTC', {_TIMESTAMP_FORMAT})"
    return column


def columns_for(
    field_id: str, name: str, field_type: int, relation_kind: int
) -> tuple[Column, ...]:
    """The physical columns of a field (none for the one-to-many side of a relation)."""
    tag = f"crm:field:{field_id}"
    if field_type == md.FIELD_TYPE_CURRENCY:
        return tuple(
            Column(name + suffix, sql_type, f"{tag}:{part}", part)
            for part, suffix, sql_type in CURRENCY_PARTS
        )
    if field_type == md.FIELD_TYPE_RELATION:
        if relation_kind != md.RELATION_KIND_MANY_TO_ONE:
            return ()
        return (Column(name + "Id", "uuid", tag),)
    return (Column(name, SQL_TYPES[field_type], tag),)


_SYSTEM_TYPES = {
    "id": md.FIELD_TYPE_UUID,
    "createdAt": md.FIELD_TYPE_DATE_TIME,
    "updatedAt": md.FIELD_TYPE_DATE_TIME,
    "deletedAt": md.FIELD_TYPE_DATE_TIME,
    "ownerId": md.FIELD_TYPE_UUID,
}


def system_field(name: str, field_id: str = "") -> FieldModel:
    field_type = _SYSTEM_TYPES[name]
    column = Column(name, SQL_TYPES[field_type], f"crm:system:{name}")
    return FieldModel(
        id=field_id,
        name=name,
        type=field_type,
        is_system=True,
        is_nullable=name in ("deletedAt", "ownerId"),
        columns=(column,),
    )


def _field_from_proto(proto: md.FieldMetadata, target_active: bool) -> FieldModel:
    if proto.name in _SYSTEM_TYPES and proto.is_system:
        return system_field(proto.name, proto.id)
    default: Any = MISSING
    if proto.default_value_json:
        default = orjson.loads(proto.default_value_json)
    relation_kind = proto.relation.kind if proto.type == md.FIELD_TYPE_RELATION else 0
    return FieldModel(
        id=proto.id,
        name=proto.name,
        type=proto.type,
        is_system=proto.is_system,
        is_active=proto.is_active and target_active,
        is_nullable=proto.is_nullable,
        is_unique=proto.is_unique,
        is_searchable=proto.is_searchable,
        is_indexed=proto.is_indexed,
        options=frozenset(option.value for option in proto.options),
        default=default,
        relation_kind=relation_kind,
        target_object_id=proto.relation.target_object_metadata_id,
        inverse_name=proto.relation.inverse_field_name,
        columns=columns_for(proto.id, proto.name, proto.type, relation_kind),
        label=proto.label,
    )


@dataclass
class WorkspaceModel:
    workspace_id: str
    version: int
    schema: str
    objects: dict[str, ObjectModel]  # by id, active and inactive
    _by_name: dict[str, ObjectModel] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for item in self.objects.values():
            if item.is_active:
                self._by_name[item.name_singular] = item
                self._by_name[item.name_plural] = item

    def object(self, name: str) -> ObjectModel | None:
        """The active object named `name` (singular or plural)."""
        return self._by_name.get(name)

    def by_id(self, object_id: str) -> ObjectModel | None:
        found = self.objects.get(object_id)
        return found if found is not None and found.is_active else None

    def references_to(self, target: ObjectModel) -> list[ObjectRelation]:
        """Active many-to-one fields, on any object, that point at `target`."""
        return [
            ObjectRelation(item.id, relation)
            for item in self.objects.values()
            if item.is_active
            for relation in item.many_to_one
            if relation.target_object_id == target.id
        ]

    @classmethod
    def from_proto(cls, schema: md.WorkspaceSchema) -> WorkspaceModel:
        schema_name = workspace_schema_name(schema.workspace_id)
        active = {item.id: item.is_active for item in schema.objects}
        objects: dict[str, ObjectModel] = {}
        for item in schema.objects:
            fields = [
                _field_from_proto(
                    proto,
                    target_active=proto.type != md.FIELD_TYPE_RELATION
                    or active.get(proto.relation.target_object_metadata_id, False),
                )
                for proto in item.fields
            ]
            present = {entry.name for entry in fields if entry.is_system}
            fields += [system_field(name) for name in SYSTEM_FIELDS if name not in present]
            objects[item.id] = ObjectModel(
                id=item.id,
                name_singular=item.name_singular,
                name_plural=item.name_plural,
                schema=schema_name,
                is_active=item.is_active,
                label_identifier=item.label_identifier_field,
                fields=fields,
            )
        return cls(schema.workspace_id, schema.version, schema_name, objects)
