"""The data model of one workspace: its active objects and fields, in the shape the API layers
need (REST parameter coercion, GraphQL types, OpenAPI schemas), built from a WorkspaceSchema."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import orjson

from crm.metadata.v1 import metadata_pb2


class FieldType(StrEnum):
    UUID = "UUID"
    TEXT = "TEXT"
    NUMBER = "NUMBER"
    BOOLEAN = "BOOLEAN"
    DATE = "DATE"
    DATE_TIME = "DATE_TIME"
    CURRENCY = "CURRENCY"
    SELECT = "SELECT"
    MULTI_SELECT = "MULTI_SELECT"
    EMAIL = "EMAIL"
    PHONE = "PHONE"
    LINK = "LINK"
    RAW_JSON = "RAW_JSON"
    RELATION = "RELATION"

    @classmethod
    def from_proto(cls, value: int) -> FieldType | None:
        name = metadata_pb2.FieldType.Name(value).removeprefix("FIELD_TYPE_")
        return cls.__members__.get(name)


TEXT_TYPES = frozenset({FieldType.TEXT, FieldType.EMAIL, FieldType.PHONE, FieldType.LINK})
NUMERIC_TYPES = frozenset({FieldType.NUMBER, FieldType.CURRENCY})
SORTABLE_TYPES = frozenset(
    {
        *TEXT_TYPES,
        FieldType.UUID,
        FieldType.NUMBER,
        FieldType.BOOLEAN,
        FieldType.DATE,
        FieldType.DATE_TIME,
        FieldType.SELECT,
        FieldType.CURRENCY,  # by amountMicros
    }
)
CURRENCY_PARTS: dict[str, FieldType] = {
    "amountMicros": FieldType.NUMBER,
    "currencyCode": FieldType.TEXT,
}


class RelationKind(StrEnum):
    MANY_TO_ONE = "MANY_TO_ONE"
    ONE_TO_MANY = "ONE_TO_MANY"


@dataclass(frozen=True)
class FieldModel:
    name: str
    type: FieldType
    label: str = ""
    description: str = ""
    nullable: bool = True
    has_default: bool = False
    is_system: bool = False
    is_unique: bool = False
    options: tuple[str, ...] = ()
    relation: RelationKind | None = None
    target: str = ""  # singular name of the related object
    inverse: str = ""  # the field on the target that is the other side

    @property
    def is_many_to_one(self) -> bool:
        return self.type is FieldType.RELATION and self.relation is RelationKind.MANY_TO_ONE

    @property
    def is_one_to_many(self) -> bool:
        return self.type is FieldType.RELATION and self.relation is RelationKind.ONE_TO_MANY

    @property
    def foreign_key(self) -> str:
        """The record key holding a many-to-one relation's id (`company` → `companyId`)."""
        return f"{self.name}Id"

    @property
    def required_on_create(self) -> bool:
        return not self.nullable and not self.has_default and not self.is_system

    @property
    def sortable(self) -> bool:
        """Fields `orderBy` takes; a many-to-one relation sorts by the related id."""
        return self.type in SORTABLE_TYPES or self.is_many_to_one

    def canonical(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.type.value,
            "label": self.label,
            "description": self.description,
            "nullable": self.nullable,
            "default": self.has_default,
            "system": self.is_system,
            "unique": self.is_unique,
            "options": list(self.options),
            "relation": self.relation.value if self.relation else None,
            "target": self.target,
            "inverse": self.inverse,
        }


# Every record carries these, whether or not the metadata lists them.
SYSTEM_FIELDS: tuple[FieldModel, ...] = (
    FieldModel("id", FieldType.UUID, "Id", nullable=False, has_default=True, is_system=True),
    FieldModel("createdAt", FieldType.DATE_TIME, "Creation date", nullable=False, is_system=True),
    FieldModel("updatedAt", FieldType.DATE_TIME, "Last update", nullable=False, is_system=True),
    FieldModel("deletedAt", FieldType.DATE_TIME, "Deleted at", is_system=True),
    FieldModel("ownerId", FieldType.UUID, "Owner", is_system=True),
)
SYSTEM_FIELD_NAMES = frozenset(f.name for f in SYSTEM_FIELDS)


@dataclass(frozen=True)
class ObjectModel:
    singular: str
    plural: str
    label_singular: str = ""
    label_plural: str = ""
    description: str = ""
    is_custom: bool = False
    fields: tuple[FieldModel, ...] = ()
    _by_name: dict[str, FieldModel] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        self._by_name.update({f.name: f for f in self.fields})

    def field(self, name: str) -> FieldModel | None:
        return self._by_name.get(name)

    @property
    def stored_fields(self) -> tuple[FieldModel, ...]:
        """Fields a record carries as its own keys (everything but one-to-many sides)."""
        return tuple(f for f in self.fields if not f.is_one_to_many)

    def record_key(self, name: str) -> FieldModel | None:
        """The field a record key belongs to, foreign keys (`companyId`) included."""
        found = self._by_name.get(name)
        if found is not None:
            return found
        if name.endswith("Id"):
            relation = self._by_name.get(name[:-2])
            if relation is not None and relation.is_many_to_one:
                return relation
        return None

    def canonical(self) -> dict[str, Any]:
        return {
            "singular": self.singular,
            "plural": self.plural,
            "labelSingular": self.label_singular,
            "labelPlural": self.label_plural,
            "description": self.description,
            "custom": self.is_custom,
            "fields": [f.canonical() for f in self.fields],
        }


@dataclass(frozen=True)
class DataModel:
    workspace_id: str
    version: int
    objects: tuple[ObjectModel, ...]
    fingerprint: str
    _by_name: Mapping[str, ObjectModel] = field(default_factory=dict, compare=False, repr=False)
    # REST query strings already checked against this model, with what they gave
    # (gateway.rest.routes.Target.params): a client repeats the same few queries.
    checked_queries: dict[tuple[Any, ...], Any] = field(
        default_factory=dict, compare=False, repr=False
    )

    def object(self, name: str) -> ObjectModel | None:
        """An object by its singular or plural name."""
        return self._by_name.get(name)

    @classmethod
    def build(cls, workspace_id: str, version: int, objects: tuple[ObjectModel, ...]) -> DataModel:
        by_name: dict[str, ObjectModel] = {}
        for obj in objects:
            by_name.setdefault(obj.plural, obj)
            by_name.setdefault(obj.singular, obj)
        return cls(workspace_id, version, objects, fingerprint_of(objects), by_name)

    @classmethod
    def from_proto(
        cls, schema: metadata_pb2.WorkspaceSchema, *, workspace_id: str = ""
    ) -> DataModel:
        names = {o.id: o.name_singular for o in schema.objects}
        objects = tuple(
            _object_from_proto(o, names)
            for o in sorted(schema.objects, key=lambda o: o.name_singular)
            if o.is_active
        )
        return cls.build(workspace_id or schema.workspace_id, schema.version, objects)


def fingerprint_of(objects: tuple[ObjectModel, ...]) -> str:
    """Hash of everything the derived API depends on (not ids, timestamps or the workspace)."""
    canonical = orjson.dumps([o.canonical() for o in objects], option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(canonical).hexdigest()


def _object_from_proto(obj: metadata_pb2.ObjectMetadata, names: Mapping[str, str]) -> ObjectModel:
    fields: dict[str, FieldModel] = {}
    for proto_field in obj.fields:
        if not proto_field.is_active:
            continue
        model = _field_from_proto(proto_field, names)
        if model is not None:
            fields[model.name] = model
    for system in SYSTEM_FIELDS:
        fields.setdefault(system.name, system)
    ordered = [fields[f.name] for f in SYSTEM_FIELDS[:1]] + [
        f for name, f in fields.items() if name != "id"
    ]
    return ObjectModel(
        singular=obj.name_singular,
        plural=obj.name_plural,
        label_singular=obj.label_singular,
        label_plural=obj.label_plural,
        description=obj.description,
        is_custom=obj.is_custom,
        fields=tuple(ordered),
    )


def _field_from_proto(
    proto_field: metadata_pb2.FieldMetadata, names: Mapping[str, str]
) -> FieldModel | None:
    field_type = FieldType.from_proto(proto_field.type)
    if field_type is None:
        return None
    relation: RelationKind | None = None
    target = inverse = ""
    if field_type is FieldType.RELATION:
        settings = proto_field.relation
        kind = metadata_pb2.RelationKind.Name(settings.kind).removeprefix("RELATION_KIND_")
        relation = RelationKind.__members__.get(kind)
        target = settings.target_object_name or names.get(settings.target_object_metadata_id, "")
        inverse = settings.inverse_field_name
        if relation is None or not target:
            return None
    options = tuple(
        option.value for option in sorted(proto_field.options, key=lambda o: o.position)
    )
    return FieldModel(
        name=proto_field.name,
        type=field_type,
        label=proto_field.label,
        description=proto_field.description,
        nullable=proto_field.is_nullable,
        has_default=bool(proto_field.default_value_json),
        is_system=proto_field.is_system,
        is_unique=proto_field.is_unique,
        options=options,
        relation=relation,
        target=target,
        inverse=inverse,
    )


_ORDERED = ("eq", "neq", "in", "gt", "gte", "lt", "lte", "is", "isNot")
_TEXT = (
    "eq",
    "neq",
    "in",
    "contains",
    "startsWith",
    "endsWith",
    "gt",
    "gte",
    "lt",
    "lte",
    "is",
    "isNot",
)

# The filter operators each field type takes (docs/data-model.md, "Field types"): REST
# parameters and GraphQL filter inputs offer exactly these.
OPERATORS_BY_TYPE: dict[FieldType, tuple[str, ...]] = {
    FieldType.UUID: _ORDERED,
    FieldType.TEXT: _TEXT,
    FieldType.EMAIL: _TEXT,
    FieldType.PHONE: _TEXT,
    FieldType.LINK: _TEXT,
    FieldType.NUMBER: _ORDERED,
    FieldType.BOOLEAN: ("eq", "neq", "in", "is", "isNot"),
    FieldType.DATE: _ORDERED,
    FieldType.DATE_TIME: _ORDERED,
    FieldType.SELECT: ("eq", "neq", "in", "contains", "startsWith", "endsWith", "is", "isNot"),
    # eq: the whole array; in: any overlap; contains: holds every given value
    FieldType.MULTI_SELECT: ("eq", "neq", "in", "contains", "is", "isNot"),
    # contains: JSON containment
    FieldType.RAW_JSON: ("eq", "neq", "in", "contains", "is", "isNot"),
    # a bare currency compares amountMicros
    FieldType.CURRENCY: _ORDERED,
    FieldType.RELATION: _ORDERED,  # many-to-one: on the related id
}
