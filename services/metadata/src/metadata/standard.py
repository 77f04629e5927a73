"""The standard data model every workspace starts with, and the system fields of every object.

Ids of standard objects and fields are derived from the workspace id (uuid5), so provisioning
is deterministic and idempotent.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import orjson

from crm.metadata.v1 import metadata_pb2 as md
from metadata.names import SYSTEM_FIELD_NAMES, humanize

_NAMESPACE = uuid.UUID("6f1f3c1e-8d2a-4c59-9a3e-3b7d0c1a2e55")

T = md


@dataclass(frozen=True)
class FieldSpec:
    name: str
    type: md.FieldType
    required: bool = False
    options: tuple[str, ...] = ()
    default: Any = None
    description: str = ""
    label: str = ""


@dataclass(frozen=True)
class RelationSpec:
    holder: str  # the object with the many-to-one field
    name: str  # the many-to-one field
    target: str
    inverse: str  # the one-to-many field on the target


@dataclass(frozen=True)
class ObjectSpec:
    singular: str
    plural: str
    label_singular: str
    label_plural: str
    description: str
    icon: str
    identifier: str
    fields: tuple[FieldSpec, ...]


# Field types cross-object search can match, and the standard fields it matches by default.
SEARCHABLE_TYPES = frozenset(
    {T.FIELD_TYPE_TEXT, T.FIELD_TYPE_EMAIL, T.FIELD_TYPE_PHONE, T.FIELD_TYPE_LINK}
)
STANDARD_SEARCHABLE = frozenset(
    {
        ("person", "firstName"), ("person", "lastName"), ("person", "email"), ("person", "phone"),
        ("person", "jobTitle"), ("company", "name"), ("company", "website"),
        ("opportunity", "name"), ("activity", "title"), ("task", "title"),
    }
)  # fmt: skip

# Field types a btree can serve (sort, ranges, equality), and the standard fields that have one
# besides what is always indexed (system keys, many-to-one relations, the label field): what lists
# of that object are usually sorted and filtered by (docs/data-model.md, "Indexes").
INDEXABLE_TYPES = frozenset(
    {
        T.FIELD_TYPE_UUID, T.FIELD_TYPE_TEXT, T.FIELD_TYPE_NUMBER, T.FIELD_TYPE_DATE,
        T.FIELD_TYPE_DATE_TIME, T.FIELD_TYPE_SELECT, T.FIELD_TYPE_EMAIL, T.FIELD_TYPE_PHONE,
        T.FIELD_TYPE_LINK, T.FIELD_TYPE_CURRENCY, T.FIELD_TYPE_RELATION,
    }
)  # fmt: skip
STANDARD_INDEXED = frozenset(
    {
        ("person", "lastName"), ("person", "email"), ("company", "website"),
        ("opportunity", "amount"), ("opportunity", "stage"), ("opportunity", "closeDate"),
        ("activity", "type"), ("activity", "dueAt"), ("task", "dueAt"), ("task", "status"),
    }
)  # fmt: skip
INDEXED_SYSTEM_FIELDS = frozenset({"id", "ownerId", "createdAt", "updatedAt"})

OPPORTUNITY_STAGES = ("PROSPECTING", "QUALIFIED", "PROPOSAL", "NEGOTIATION", "WON", "LOST")

STANDARD_OBJECTS = (
    ObjectSpec(
        "person", "people", "Person", "People", "A contact: someone you do business with.",
        "IconUser", "firstName",
        (
            FieldSpec("firstName", T.FIELD_TYPE_TEXT),
            FieldSpec("lastName", T.FIELD_TYPE_TEXT),
            FieldSpec("email", T.FIELD_TYPE_EMAIL),
            FieldSpec("phone", T.FIELD_TYPE_PHONE),
            FieldSpec("jobTitle", T.FIELD_TYPE_TEXT),
            FieldSpec("city", T.FIELD_TYPE_TEXT),
            FieldSpec("linkedinLink", T.FIELD_TYPE_LINK, label="LinkedIn"),
        ),
    ),
    ObjectSpec(
        "company", "companies", "Company", "Companies", "An organization you work with.",
        "IconBuildingSkyscraper", "name",
        (
            FieldSpec("name", T.FIELD_TYPE_TEXT, required=True),
            FieldSpec("website", T.FIELD_TYPE_LINK),
            FieldSpec("employees", T.FIELD_TYPE_NUMBER),
            FieldSpec("address", T.FIELD_TYPE_TEXT),
            FieldSpec("city", T.FIELD_TYPE_TEXT),
            FieldSpec("industry", T.FIELD_TYPE_TEXT),
            FieldSpec("annualRecurringRevenue", T.FIELD_TYPE_CURRENCY, label="ARR"),
            FieldSpec("idealCustomerProfile", T.FIELD_TYPE_BOOLEAN, default=False),
            FieldSpec("linkedinLink", T.FIELD_TYPE_LINK, label="LinkedIn"),
        ),
    ),
    ObjectSpec(
        "opportunity", "opportunities", "Opportunity", "Opportunities",
        "A potential deal, moving through stages.", "IconTargetArrow", "name",
        (
            FieldSpec("name", T.FIELD_TYPE_TEXT, required=True),
            FieldSpec("amount", T.FIELD_TYPE_NUMBER),
            FieldSpec("stage", T.FIELD_TYPE_SELECT, options=OPPORTUNITY_STAGES,
                      default="PROSPECTING"),
            FieldSpec("closeDate", T.FIELD_TYPE_DATE),
            FieldSpec("probability", T.FIELD_TYPE_NUMBER),
        ),
    ),
    ObjectSpec(
        "activity", "activities", "Activity", "Activities",
        "Something that happened or will happen: a note, call, email or meeting.",
        "IconCheckbox", "title",
        (
            FieldSpec("title", T.FIELD_TYPE_TEXT, required=True),
            FieldSpec("type", T.FIELD_TYPE_SELECT, options=("NOTE", "CALL", "EMAIL", "MEETING"),
                      default="NOTE"),
            FieldSpec("body", T.FIELD_TYPE_TEXT),
            FieldSpec("dueAt", T.FIELD_TYPE_DATE_TIME),
            FieldSpec("completedAt", T.FIELD_TYPE_DATE_TIME),
        ),
    ),
    ObjectSpec(
        "task", "tasks", "Task", "Tasks", "Something to do, with a status and a due date.",
        "IconChecklist", "title",
        (
            FieldSpec("title", T.FIELD_TYPE_TEXT, required=True),
            FieldSpec("body", T.FIELD_TYPE_TEXT),
            FieldSpec("dueAt", T.FIELD_TYPE_DATE_TIME),
            FieldSpec("status", T.FIELD_TYPE_SELECT, options=("TODO", "IN_PROGRESS", "DONE"),
                      default="TODO"),
        ),
    ),
)  # fmt: skip

STANDARD_RELATIONS = (
    RelationSpec("person", "company", "company", "people"),
    RelationSpec("opportunity", "company", "company", "opportunities"),
    RelationSpec("opportunity", "pointOfContact", "person", "opportunities"),
    RelationSpec("activity", "person", "person", "activities"),
    RelationSpec("activity", "company", "company", "activities"),
    RelationSpec("activity", "opportunity", "opportunity", "activities"),
    RelationSpec("task", "person", "person", "tasks"),
    RelationSpec("task", "company", "company", "tasks"),
)


def standard_id(workspace_id: str, kind: str, name: str) -> str:
    return str(uuid.uuid5(_NAMESPACE, f"{workspace_id}:{kind}:{name}"))


def system_fields(workspace_id: str, object_id: str) -> list[md.FieldMetadata]:
    labels = {
        "id": "Id",
        "ownerId": "Owner",
        "createdAt": "Creation date",
        "updatedAt": "Last update",
        "deletedAt": "Deleted at",
    }
    types = {"id": T.FIELD_TYPE_UUID, "ownerId": T.FIELD_TYPE_UUID}
    return [
        md.FieldMetadata(
            id=standard_id(workspace_id, "field", f"{object_id}.{name}"),
            object_metadata_id=object_id,
            name=name,
            label=labels[name],
            type=types.get(name, T.FIELD_TYPE_DATE_TIME),
            is_nullable=name in ("ownerId", "deletedAt"),
            is_custom=False,
            is_active=True,
            is_system=True,
            is_indexed=name in INDEXED_SYSTEM_FIELDS,
        )
        for name in SYSTEM_FIELD_NAMES
    ]


def relation_pair(
    workspace_id: str,
    holder: md.ObjectMetadata,
    name: str,
    target: md.ObjectMetadata,
    inverse: str,
    *,
    custom: bool,
    label: str = "",
    inverse_label: str = "",
    on_delete: md.OnDelete = T.ON_DELETE_SET_NULL,
    ids: tuple[str, str] | None = None,
) -> tuple[md.FieldMetadata, md.FieldMetadata]:
    """The many-to-one field on `holder` and its one-to-many inverse on `target`."""
    many_id, one_id = ids or (
        standard_id(workspace_id, "field", f"{holder.name_singular}.{name}"),
        standard_id(workspace_id, "field", f"{target.name_singular}.{inverse}"),
    )
    many = md.FieldMetadata(
        id=many_id,
        object_metadata_id=holder.id,
        name=name,
        label=label or humanize(name),
        type=T.FIELD_TYPE_RELATION,
        is_nullable=True,
        is_custom=custom,
        is_active=True,
        is_indexed=True,  # its foreign key: related lists, nested filters, ON DELETE
        relation=md.RelationSettings(
            kind=T.RELATION_KIND_MANY_TO_ONE,
            target_object_metadata_id=target.id,
            target_object_name=target.name_singular,
            inverse_field_name=inverse,
            on_delete=on_delete,
        ),
    )
    one = md.FieldMetadata(
        id=one_id,
        object_metadata_id=target.id,
        name=inverse,
        label=inverse_label or humanize(inverse),
        type=T.FIELD_TYPE_RELATION,
        is_nullable=True,
        is_custom=custom,
        is_active=True,
        relation=md.RelationSettings(
            kind=T.RELATION_KIND_ONE_TO_MANY,
            target_object_metadata_id=holder.id,
            target_object_name=holder.name_singular,
            inverse_field_name=name,
            on_delete=on_delete,
        ),
    )
    return many, one


def standard_objects(workspace_id: str) -> list[md.ObjectMetadata]:
    """The standard objects of a new workspace, with their fields and relations."""
    objects: dict[str, md.ObjectMetadata] = {}
    for spec in STANDARD_OBJECTS:
        object_id = standard_id(workspace_id, "object", spec.singular)
        item = md.ObjectMetadata(
            id=object_id,
            workspace_id=workspace_id,
            name_singular=spec.singular,
            name_plural=spec.plural,
            label_singular=spec.label_singular,
            label_plural=spec.label_plural,
            description=spec.description,
            icon=spec.icon,
            is_custom=False,
            is_active=True,
            label_identifier_field=spec.identifier,
        )
        item.fields.extend(system_fields(workspace_id, object_id))
        for field in spec.fields:
            item.fields.append(
                md.FieldMetadata(
                    id=standard_id(workspace_id, "field", f"{spec.singular}.{field.name}"),
                    object_metadata_id=object_id,
                    name=field.name,
                    label=field.label or humanize(field.name),
                    type=field.type,
                    description=field.description,
                    is_nullable=not field.required,
                    default_value_json=b""
                    if field.default is None
                    else orjson.dumps(field.default),
                    is_custom=False,
                    is_active=True,
                    is_searchable=(spec.singular, field.name) in STANDARD_SEARCHABLE,
                    is_indexed=field.name == spec.identifier
                    or (spec.singular, field.name) in STANDARD_INDEXED,
                    options=[
                        md.SelectOption(value=value, label=humanize(value.lower()), position=i)
                        for i, value in enumerate(field.options)
                    ],
                )
            )
        objects[spec.singular] = item
    for relation in STANDARD_RELATIONS:
        holder, target = objects[relation.holder], objects[relation.target]
        many, one = relation_pair(
            workspace_id, holder, relation.name, target, relation.inverse, custom=False
        )
        holder.fields.append(many)
        target.fields.append(one)
    return list(objects.values())
