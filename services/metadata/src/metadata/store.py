"""Objects and fields in the `metadata` schema, read and written as their protobuf messages."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import orjson
from google.protobuf.timestamp_pb2 import Timestamp

from crm.metadata.v1 import metadata_pb2 as md

_OBJECT_COLUMNS = (
    "id, workspace_id, position, name_singular, name_plural, label_singular, label_plural, "
    "description, icon, is_custom, is_active, is_system, label_identifier_field, created_at, "
    "updated_at"
)
_FIELD_COLUMNS = (
    "id, object_id, position, name, label, type, description, icon, is_nullable, default_value, "
    "is_custom, is_active, is_system, is_unique, options, relation, created_at, updated_at, "
    "is_searchable, is_indexed"
)


def _timestamp(value: datetime) -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(value)
    return stamp


def type_of(name: str) -> str:
    """The FieldType enum name of a stored type (protobuf accepts enum names)."""
    return "FIELD_TYPE_" + name


def type_text(value: int) -> str:
    return md.FieldType.Name(value).removeprefix("FIELD_TYPE_")


def _object(row: Any) -> md.ObjectMetadata:
    return md.ObjectMetadata(
        id=str(row["id"]),
        workspace_id=str(row["workspace_id"]),
        name_singular=row["name_singular"],
        name_plural=row["name_plural"],
        label_singular=row["label_singular"],
        label_plural=row["label_plural"],
        description=row["description"],
        icon=row["icon"],
        is_custom=row["is_custom"],
        is_active=row["is_active"],
        is_system=row["is_system"],
        label_identifier_field=row["label_identifier_field"],
        created_at=_timestamp(row["created_at"]),
        updated_at=_timestamp(row["updated_at"]),
    )


def _relation(value: dict[str, Any] | None, names: dict[str, str]) -> md.RelationSettings | None:
    if not value:
        return None
    target = value.get("targetObjectMetadataId", "")
    return md.RelationSettings(
        kind="RELATION_KIND_" + value.get("kind", "MANY_TO_ONE"),
        target_object_metadata_id=target,
        target_object_name=names.get(target, ""),
        inverse_field_name=value.get("inverseFieldName", ""),
        on_delete="ON_DELETE_" + value.get("onDelete", "SET_NULL"),
    )


def _field(row: Any, names: dict[str, str]) -> md.FieldMetadata:
    field = md.FieldMetadata(
        id=str(row["id"]),
        object_metadata_id=str(row["object_id"]),
        name=row["name"],
        label=row["label"],
        type=type_of(row["type"]),
        description=row["description"],
        icon=row["icon"],
        is_nullable=row["is_nullable"],
        default_value_json=b""
        if row["default_value"] is None
        else orjson.dumps(row["default_value"]),
        is_custom=row["is_custom"],
        is_active=row["is_active"],
        is_system=row["is_system"],
        is_unique=row["is_unique"],
        is_searchable=row["is_searchable"],
        is_indexed=row["is_indexed"],
        options=[md.SelectOption(**option) for option in row["options"] or []],
        created_at=_timestamp(row["created_at"]),
        updated_at=_timestamp(row["updated_at"]),
    )
    relation = _relation(row["relation"], names)
    if relation is not None:
        field.relation.CopyFrom(relation)
    return field


async def load_objects(connection: Any, workspace_id: str) -> list[md.ObjectMetadata]:
    """Every object of the workspace (active or not) with every field, in creation order."""
    object_rows = await connection.fetch(
        f"SELECT {_OBJECT_COLUMNS} FROM metadata.objects WHERE workspace_id = $1 ORDER BY position",
        workspace_id,
    )
    objects = [_object(row) for row in object_rows]
    names = {item.id: item.name_singular for item in objects}
    by_id = {item.id: item for item in objects}
    field_rows = await connection.fetch(
        f"SELECT {_FIELD_COLUMNS} FROM metadata.fields WHERE workspace_id = $1 ORDER BY position",
        workspace_id,
    )
    for row in field_rows:
        owner = by_id.get(str(row["object_id"]))
        if owner is not None:
            owner.fields.append(_field(row, names))
    return objects


async def workspace_version(
    connection: Any, workspace_id: str, *, lock: bool = False
) -> int | None:
    suffix = " FOR UPDATE" if lock else ""
    version = await connection.fetchval(
        f"SELECT version FROM metadata.workspaces WHERE workspace_id = $1{suffix}", workspace_id
    )
    return None if version is None else int(version)


async def schema(connection: Any, workspace_id: str) -> md.WorkspaceSchema:
    version = await workspace_version(connection, workspace_id)
    objects = await load_objects(connection, workspace_id)
    return md.WorkspaceSchema(workspace_id=workspace_id, version=version or 0, objects=objects)


def _options(field: md.FieldMetadata) -> list[dict[str, Any]]:
    return [
        {"value": o.value, "label": o.label, "color": o.color, "position": o.position}
        for o in field.options
    ]


def _relation_json(field: md.FieldMetadata) -> dict[str, Any] | None:
    if field.type != md.FIELD_TYPE_RELATION:
        return None
    relation = field.relation
    return {
        "kind": md.RelationKind.Name(relation.kind).removeprefix("RELATION_KIND_"),
        "targetObjectMetadataId": relation.target_object_metadata_id,
        "inverseFieldName": relation.inverse_field_name,
        "onDelete": md.OnDelete.Name(relation.on_delete or md.ON_DELETE_SET_NULL).removeprefix(
            "ON_DELETE_"
        ),
    }


def _default(field: md.FieldMetadata) -> Any:
    return orjson.loads(field.default_value_json) if field.default_value_json else None


async def insert_object(connection: Any, workspace_id: str, item: md.ObjectMetadata) -> None:
    await connection.execute(
        "INSERT INTO metadata.objects (id, workspace_id, name_singular, name_plural, "
        "label_singular, label_plural, description, icon, is_custom, is_active, is_system, "
        "label_identifier_field) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
        item.id,
        workspace_id,
        item.name_singular,
        item.name_plural,
        item.label_singular,
        item.label_plural,
        item.description,
        item.icon,
        item.is_custom,
        item.is_active,
        item.is_system,
        item.label_identifier_field,
    )


async def insert_fields(connection: Any, workspace_id: str, fields: list[md.FieldMetadata]) -> None:
    await connection.executemany(
        "INSERT INTO metadata.fields (id, workspace_id, object_id, name, label, type, description, "
        "icon, is_nullable, default_value, is_custom, is_active, is_system, is_unique, options, "
        "relation, is_searchable, is_indexed) "
        "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18)",
        [
            (
                field.id,
                workspace_id,
                field.object_metadata_id,
                field.name,
                field.label,
                type_text(field.type),
                field.description,
                field.icon,
                field.is_nullable,
                _default(field),
                field.is_custom,
                field.is_active,
                field.is_system,
                field.is_unique,
                _options(field),
                _relation_json(field),
                field.is_searchable,
                field.is_indexed,
            )
            for field in fields
        ],
    )


async def update_object(connection: Any, item: md.ObjectMetadata) -> None:
    await connection.execute(
        "UPDATE metadata.objects SET name_singular = $2, name_plural = $3, label_singular = $4, "
        "label_plural = $5, description = $6, icon = $7, is_active = $8, "
        "label_identifier_field = $9, updated_at = now() WHERE id = $1",
        item.id,
        item.name_singular,
        item.name_plural,
        item.label_singular,
        item.label_plural,
        item.description,
        item.icon,
        item.is_active,
        item.label_identifier_field,
    )


async def update_field(connection: Any, field: md.FieldMetadata) -> None:
    await connection.execute(
        "UPDATE metadata.fields SET name = $2, label = $3, description = $4, icon = $5, "
        "is_nullable = $6, default_value = $7, is_active = $8, is_unique = $9, options = $10, "
        "relation = $11, is_searchable = $12, is_indexed = $13, updated_at = now() WHERE id = $1",
        field.id,
        field.name,
        field.label,
        field.description,
        field.icon,
        field.is_nullable,
        _default(field),
        field.is_active,
        field.is_unique,
        _options(field),
        _relation_json(field),
        field.is_searchable,
        field.is_indexed,
    )
