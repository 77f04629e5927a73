"""Metadata operations (objects and fields), one definition served on /metadata and /graphql:
queries `objects`, `object`, `fields(filter)`; mutations `createObject`, `updateObject`,
`createField`, `updateField`, `deleteField` (deactivates). Each resolver is one call to
MetadataService; a successful change marks this gateway's cached data model stale, so the very
next request sees it (other gateways hear of it on NATS)."""

from __future__ import annotations

import datetime as dt
import enum
import uuid
from typing import Any

import orjson
import strawberry
from google.protobuf import timestamp_pb2
from strawberry.scalars import JSON
from strawberry.types.unset import UNSET

from crm.common.v1 import common_pb2
from crm.metadata.v1 import metadata_pb2
from gateway.datamodel.model import FieldType, RelationKind
from gateway.graphql.context import GraphQLContext
from gateway.graphql.page_info import PageInfo
from gateway.graphql.parts import SchemaPart
from gateway.pagination import page_info_json, page_request

# The data model's own enums, exposed under their GraphQL names (one definition of each).
strawberry.enum(FieldType, name="FieldType", description="Type of a field (decides its column).")
strawberry.enum(RelationKind, name="RelationKind")


@strawberry.enum(name="OnDelete", description="What deleting the target does to the source.")
class OnDeleteEnum(enum.Enum):
    SET_NULL = "SET_NULL"
    CASCADE = "CASCADE"
    RESTRICT = "RESTRICT"


# Output types read dicts built from the protos, so attribute names are the JSON keys.
@strawberry.type(name="SelectOption")
class SelectOption:
    value: str
    label: str
    color: str | None
    position: int


@strawberry.type(name="RelationSettings")
class RelationSettings:
    kind: RelationKind | None
    targetObjectMetadataId: uuid.UUID | None  # noqa: N815
    targetObjectName: str | None  # noqa: N815
    inverseFieldName: str | None  # noqa: N815
    onDelete: OnDeleteEnum  # noqa: N815


@strawberry.type(name="Field", description="A field of an object.")
class FieldMetadataType:
    id: uuid.UUID
    name: str
    label: str
    type: FieldType
    description: str | None
    icon: str | None
    isNullable: bool  # noqa: N815
    defaultValue: JSON | None  # noqa: N815
    objectMetadataId: uuid.UUID  # noqa: N815
    isCustom: bool  # noqa: N815
    isActive: bool  # noqa: N815
    isSystem: bool  # noqa: N815
    isUnique: bool  # noqa: N815
    isSearchable: bool  # noqa: N815  (matched by `search`)
    isIndexed: bool  # noqa: N815  (has a btree: sorts and filters on it do not scan)
    options: list[SelectOption]
    relation: RelationSettings | None
    createdAt: dt.datetime | None  # noqa: N815
    updatedAt: dt.datetime | None  # noqa: N815


@strawberry.type(name="FieldEdge")
class FieldEdge:
    node: FieldMetadataType
    cursor: str


@strawberry.type(name="FieldConnection")
class FieldConnection:
    edges: list[FieldEdge]
    pageInfo: PageInfo  # noqa: N815
    totalCount: int  # noqa: N815


def _object_fields(root: Any, include_inactive: bool = False) -> FieldConnection:
    """Sources are dicts from object_json, carrying the object's fields under `_fields`."""
    fields = [f for f in root["_fields"] if include_inactive or f["isActive"]]
    result: FieldConnection = _connection(fields, common_pb2.PageInfo(), len(fields))
    return result


@strawberry.type(name="Object", description="An object (standard or custom) of the workspace.")
class ObjectMetadataType:
    id: uuid.UUID
    nameSingular: str  # noqa: N815
    namePlural: str  # noqa: N815
    labelSingular: str  # noqa: N815
    labelPlural: str  # noqa: N815
    description: str | None
    icon: str | None
    isCustom: bool  # noqa: N815
    isActive: bool  # noqa: N815
    isSystem: bool  # noqa: N815
    labelIdentifierField: str | None  # noqa: N815
    createdAt: dt.datetime | None  # noqa: N815
    updatedAt: dt.datetime | None  # noqa: N815

    fields: FieldConnection = strawberry.field(
        resolver=_object_fields, description="The object's fields (active ones unless asked)."
    )


@strawberry.type(name="ObjectEdge")
class ObjectEdge:
    node: ObjectMetadataType
    cursor: str


@strawberry.type(name="ObjectConnection")
class ObjectConnection:
    edges: list[ObjectEdge]
    pageInfo: PageInfo  # noqa: N815
    totalCount: int  # noqa: N815


@strawberry.input(name="IdEqFilter")
class IdEqFilter:
    eq: uuid.UUID | None = UNSET


@strawberry.input(name="FieldFilter", description="Which fields to list.")
class FieldFilter:
    object_metadata_id: IdEqFilter | None = UNSET
    is_active: bool | None = strawberry.field(
        default=UNSET, description="false: only deactivated fields (default: only active ones)"
    )


@strawberry.input(name="CreateObjectInput")
class CreateObjectInput:
    name_singular: str
    name_plural: str
    label_singular: str | None = UNSET
    label_plural: str | None = UNSET
    description: str | None = UNSET
    icon: str | None = UNSET


@strawberry.input(name="UpdateObjectInput", description="Fields left out stay as they are.")
class UpdateObjectInput:
    id: uuid.UUID
    name_singular: str | None = UNSET
    name_plural: str | None = UNSET
    label_singular: str | None = UNSET
    label_plural: str | None = UNSET
    description: str | None = UNSET
    icon: str | None = UNSET
    is_active: bool | None = UNSET
    label_identifier_field: str | None = UNSET


@strawberry.input(name="SelectOptionInput")
class SelectOptionInput:
    value: str
    label: str | None = UNSET
    color: str | None = UNSET
    position: int | None = UNSET


@strawberry.input(
    name="RelationSettingsInput",
    description="For a RELATION field: the many-to-one side; the reverse one-to-many field "
    "`inverseFieldName` is created on the target.",
)
class RelationSettingsInput:
    target_object_metadata_id: uuid.UUID | None = UNSET
    target_object_name: str | None = UNSET
    inverse_field_name: str | None = UNSET
    on_delete: OnDeleteEnum | None = UNSET


@strawberry.input(name="CreateFieldInput")
class CreateFieldInput:
    object_metadata_id: uuid.UUID
    name: str
    type: FieldType
    label: str | None = UNSET
    description: str | None = UNSET
    icon: str | None = UNSET
    is_nullable: bool | None = UNSET
    is_unique: bool | None = UNSET
    is_searchable: bool | None = strawberry.field(
        default=UNSET,
        description="matched by `search`; default true for TEXT, EMAIL, PHONE and LINK fields",
    )
    is_indexed: bool | None = strawberry.field(
        default=UNSET,
        description="has an index for sorting and filtering; default true for many-to-one "
        "relations and unique fields",
    )
    default_value: JSON | None = UNSET
    options: list[SelectOptionInput] | None = UNSET
    relation: RelationSettingsInput | None = UNSET


@strawberry.input(name="UpdateFieldInput", description="Fields left out stay as they are.")
class UpdateFieldInput:
    id: uuid.UUID
    name: str | None = UNSET
    label: str | None = UNSET
    description: str | None = UNSET
    icon: str | None = UNSET
    is_active: bool | None = UNSET
    is_nullable: bool | None = UNSET
    is_searchable: bool | None = UNSET
    is_indexed: bool | None = UNSET
    default_value: JSON | None = strawberry.field(
        default=UNSET, description="null removes the default"
    )
    options: list[SelectOptionInput] | None = strawberry.field(
        default=UNSET, description="replaces the options of a SELECT or MULTI_SELECT field"
    )


# -- protos to JSON ---------------------------------------------------------------------------


def _timestamp(value: timestamp_pb2.Timestamp, present: bool) -> str | None:
    if not present:
        return None
    instant = value.ToDatetime(tzinfo=dt.UTC)
    return instant.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def field_json(f: metadata_pb2.FieldMetadata) -> Any:
    relation = None
    if f.HasField("relation") and f.type == metadata_pb2.FIELD_TYPE_RELATION:
        relation = {
            "kind": metadata_pb2.RelationKind.Name(f.relation.kind).removeprefix("RELATION_KIND_")
            if f.relation.kind
            else None,
            "targetObjectMetadataId": f.relation.target_object_metadata_id or None,
            "targetObjectName": f.relation.target_object_name or None,
            "inverseFieldName": f.relation.inverse_field_name or None,
            "onDelete": metadata_pb2.OnDelete.Name(
                f.relation.on_delete or metadata_pb2.ON_DELETE_SET_NULL
            ).removeprefix("ON_DELETE_"),
        }
    return {
        "id": f.id,
        "name": f.name,
        "label": f.label,
        "type": metadata_pb2.FieldType.Name(f.type).removeprefix("FIELD_TYPE_"),
        "description": f.description or None,
        "icon": f.icon or None,
        "isNullable": f.is_nullable,
        "defaultValue": orjson.loads(f.default_value_json) if f.default_value_json else None,
        "objectMetadataId": f.object_metadata_id,
        "isCustom": f.is_custom,
        "isActive": f.is_active,
        "isSystem": f.is_system,
        "isUnique": f.is_unique,
        "isSearchable": f.is_searchable,
        "isIndexed": f.is_indexed,
        "options": [
            {"value": o.value, "label": o.label, "color": o.color or None, "position": o.position}
            for o in f.options
        ],
        "relation": relation,
        "createdAt": _timestamp(f.created_at, f.HasField("created_at")),
        "updatedAt": _timestamp(f.updated_at, f.HasField("updated_at")),
    }


def object_json(o: metadata_pb2.ObjectMetadata) -> Any:
    return {
        "id": o.id,
        "nameSingular": o.name_singular,
        "namePlural": o.name_plural,
        "labelSingular": o.label_singular,
        "labelPlural": o.label_plural,
        "description": o.description or None,
        "icon": o.icon or None,
        "isCustom": o.is_custom,
        "isActive": o.is_active,
        "isSystem": o.is_system,
        "labelIdentifierField": o.label_identifier_field or None,
        "createdAt": _timestamp(o.created_at, o.HasField("created_at")),
        "updatedAt": _timestamp(o.updated_at, o.HasField("updated_at")),
        "_fields": [field_json(f) for f in o.fields],
    }


def _connection(nodes: list[dict[str, Any]], page: common_pb2.PageInfo, total: int) -> Any:
    return {
        "edges": [{"node": node, "cursor": node["id"]} for node in nodes],
        "pageInfo": page_info_json(page),
        "totalCount": total,
    }


def _field_connection(fields: list[dict[str, Any]], page: common_pb2.PageInfo, total: int) -> Any:
    return _connection(fields, page, total)


# -- resolvers --------------------------------------------------------------------------------


def _context(info: strawberry.Info) -> GraphQLContext:
    context: GraphQLContext = info.context
    return context


async def _metadata_call(info: strawberry.Info, method: str, request: Any) -> Any:
    context = _context(info)
    return await context.ask(getattr(context.state.upstreams.metadata, method), request)


async def _metadata_change(info: strawberry.Info, method: str, request: Any) -> Any:
    """A data-model change: it waits for its schema migration (METADATA_CHANGE_TIMEOUT)."""
    context = _context(info)
    timeout = context.state.settings.METADATA_CHANGE_TIMEOUT
    return await context.ask(getattr(context.state.upstreams.metadata, method), request, timeout)


def _changed(info: strawberry.Info) -> None:
    """This gateway re-checks the data model on its next request of the workspace."""
    context = _context(info)
    context.state.models.announce(context.principal.workspace_id)


def _set(value: Any) -> bool:
    return value is not UNSET and value is not None


def _text(value: str | None) -> str:
    return value if isinstance(value, str) else ""


def _options(values: list[SelectOptionInput]) -> list[metadata_pb2.SelectOption]:
    return [
        metadata_pb2.SelectOption(
            value=o.value,
            label=o.label if _set(o.label) else o.value,
            color=o.color if _set(o.color) else "",
            position=o.position if _set(o.position) else index,
        )
        for index, o in enumerate(values)
    ]


async def _objects(
    info: strawberry.Info,
    first: int | None = None,
    after: str | None = None,
    include_inactive: bool = False,
) -> ObjectConnection:
    request = metadata_pb2.ListObjectsRequest(
        page=page_request(first, after), include_inactive=include_inactive
    )
    response = await _metadata_call(info, "ListObjects", request)
    nodes = [object_json(o) for o in response.objects]
    result: ObjectConnection = _connection(nodes, response.page_info, response.total_count)
    return result


async def _object(info: strawberry.Info, id: uuid.UUID) -> ObjectMetadataType:
    response = await _metadata_call(info, "GetObject", metadata_pb2.GetObjectRequest(id=str(id)))
    result: ObjectMetadataType = object_json(response)
    return result


async def _fields(
    info: strawberry.Info,
    filter: FieldFilter | None = None,
    first: int | None = None,
    after: str | None = None,
) -> FieldConnection:
    object_id = ""
    only_inactive = filter is not None and filter.is_active is False
    id_filter = filter.object_metadata_id if filter is not None else None
    if isinstance(id_filter, IdEqFilter) and _set(id_filter.eq):
        object_id = str(id_filter.eq)
    request = metadata_pb2.ListFieldsRequest(
        object_metadata_id=object_id,
        page=page_request(first, after),
        include_inactive=only_inactive,
    )
    response = await _metadata_call(info, "ListFields", request)
    fields = [field_json(f) for f in response.fields]
    if only_inactive:
        fields = [f for f in fields if not f["isActive"]]
    result: FieldConnection = _connection(fields, response.page_info, response.total_count)
    return result


async def _create_object(info: strawberry.Info, input: CreateObjectInput) -> ObjectMetadataType:
    request = metadata_pb2.CreateObjectRequest(
        name_singular=input.name_singular,
        name_plural=input.name_plural,
        label_singular=_text(input.label_singular),
        label_plural=_text(input.label_plural),
        description=_text(input.description),
        icon=_text(input.icon),
    )
    response = await _metadata_change(info, "CreateObject", request)
    _changed(info)
    result: ObjectMetadataType = object_json(response)
    return result


async def _update_object(info: strawberry.Info, input: UpdateObjectInput) -> ObjectMetadataType:
    request = metadata_pb2.UpdateObjectRequest(id=str(input.id))
    for name in (
        "name_singular",
        "name_plural",
        "label_singular",
        "label_plural",
        "description",
        "icon",
        "is_active",
        "label_identifier_field",
    ):
        value = getattr(input, name)
        if _set(value):
            setattr(request, name, value)
    response = await _metadata_change(info, "UpdateObject", request)
    _changed(info)
    result: ObjectMetadataType = object_json(response)
    return result


def _relation(relation: RelationSettingsInput) -> metadata_pb2.RelationSettings:
    on_delete = relation.on_delete.value if isinstance(relation.on_delete, OnDeleteEnum) else ""
    return metadata_pb2.RelationSettings(
        kind=metadata_pb2.RELATION_KIND_MANY_TO_ONE,
        target_object_metadata_id=str(relation.target_object_metadata_id)
        if _set(relation.target_object_metadata_id)
        else "",
        target_object_name=_text(relation.target_object_name),
        inverse_field_name=_text(relation.inverse_field_name),
        on_delete=getattr(metadata_pb2, f"ON_DELETE_{on_delete or 'SET_NULL'}"),
    )


async def _create_field(info: strawberry.Info, input: CreateFieldInput) -> FieldMetadataType:
    request = metadata_pb2.CreateFieldRequest(
        object_metadata_id=str(input.object_metadata_id),
        name=input.name,
        label=_text(input.label),
        type=getattr(metadata_pb2, f"FIELD_TYPE_{input.type.value}"),
        description=_text(input.description),
        icon=_text(input.icon),
        is_unique=input.is_unique is True,
    )
    if _set(input.is_nullable):
        request.is_nullable = bool(input.is_nullable)
    if _set(input.is_searchable):
        request.is_searchable = bool(input.is_searchable)
    if _set(input.is_indexed):
        request.is_indexed = bool(input.is_indexed)
    if _set(input.default_value):
        request.default_value_json = orjson.dumps(input.default_value)
    if isinstance(input.options, list):
        request.options.extend(_options(input.options))
    if isinstance(input.relation, RelationSettingsInput):
        request.relation.CopyFrom(_relation(input.relation))
    response = await _metadata_change(info, "CreateField", request)
    _changed(info)
    result: FieldMetadataType = field_json(response)
    return result


async def _update_field(info: strawberry.Info, input: UpdateFieldInput) -> FieldMetadataType:
    request = metadata_pb2.UpdateFieldRequest(id=str(input.id))
    for name in (
        "name",
        "label",
        "description",
        "icon",
        "is_active",
        "is_nullable",
        "is_searchable",
        "is_indexed",
    ):
        value = getattr(input, name)
        if _set(value):
            setattr(request, name, value)
    if input.default_value is not UNSET:
        request.default_value_json = (
            b"" if input.default_value is None else orjson.dumps(input.default_value)
        )
    if isinstance(input.options, list):
        request.options.extend(_options(input.options))
        request.replace_options = True
    response = await _metadata_change(info, "UpdateField", request)
    _changed(info)
    result: FieldMetadataType = field_json(response)
    return result


async def _delete_field(info: strawberry.Info, id: uuid.UUID) -> FieldMetadataType:
    response = await _metadata_change(
        info, "DeleteField", metadata_pb2.DeleteFieldRequest(id=str(id))
    )
    _changed(info)
    result: FieldMetadataType = field_json(response)
    return result


@strawberry.type
class MetadataQuery:
    objects: ObjectConnection = strawberry.field(
        resolver=_objects, description="Objects of the workspace (connection)."
    )
    object: ObjectMetadataType = strawberry.field(resolver=_object, description="One object by id.")
    fields: FieldConnection = strawberry.field(
        resolver=_fields,
        description="Fields, e.g. fields(filter: {objectMetadataId: {eq: $id}}).",
    )


@strawberry.type
class MetadataMutation:
    create_object: ObjectMetadataType = strawberry.mutation(
        resolver=_create_object, description="Creates a custom object (and its table)."
    )
    update_object: ObjectMetadataType = strawberry.mutation(
        resolver=_update_object, description="Renames, relabels or (de)activates an object."
    )
    create_field: FieldMetadataType = strawberry.mutation(
        resolver=_create_field, description="Adds a field (and its column) to an object."
    )
    update_field: FieldMetadataType = strawberry.mutation(
        resolver=_update_field,
        description="Renames, relabels, (de)activates or re-options a field.",
    )
    delete_field: FieldMetadataType = strawberry.mutation(
        resolver=_delete_field, description="Deactivates a field; its column and data are kept."
    )


METADATA_PART = SchemaPart(
    name="metadata", query=MetadataQuery, mutation=MetadataMutation, metadata=True
)
