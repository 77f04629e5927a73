"""Checks and builds object and field definitions against a workspace's current data model.

Pure functions over protobuf messages: every problem is an InvalidArgument naming the input
field (`nameSingular`, `options[1].value`, `relation.inverseFieldName`, ...), raised before
anything is written.
"""

from __future__ import annotations

import math
import re
import uuid
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any

import orjson

from crm.metadata.v1 import metadata_pb2 as md
from crmkit.errors import InvalidArgument, NotFound
from metadata import names
from metadata.standard import INDEXABLE_TYPES, SEARCHABLE_TYPES, relation_pair, system_fields

T = md
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
_CURRENCY_CODE = re.compile(r"^[A-Z]{3}$")
MAX_OPTIONS = 500
MAX_FIELDS_PER_OBJECT = 400
MAX_OBJECTS = 500


@dataclass
class Definitions:
    """The workspace's objects (with fields), as loaded inside the change's transaction."""

    workspace_id: str
    objects: list[md.ObjectMetadata]
    by_id: dict[str, md.ObjectMetadata] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.by_id = {item.id: item for item in self.objects}

    def object(self, object_id: str, field: str = "objectMetadataId") -> md.ObjectMetadata:
        found = self.by_id.get(object_id)
        if found is None:
            raise NotFound(f"object {object_id!r} not found", field=field)
        return found

    def object_named(self, name: str) -> md.ObjectMetadata | None:
        for item in self.objects:
            if name in (item.name_singular, item.name_plural):
                return item
        return None

    def field(self, field_id: str) -> tuple[md.ObjectMetadata, md.FieldMetadata]:
        for item in self.objects:
            for entry in item.fields:
                if entry.id == field_id:
                    return item, entry
        raise NotFound(f"field {field_id!r} not found", field="id")


# -- objects --------------------------------------------------------------------------------------
def _check_object_names(
    defs: Definitions, singular: str, plural: str, *, exclude: str = ""
) -> None:
    names.check_name(
        singular, "nameSingular", reserved=names.RESERVED_OBJECT_NAMES, what="an object"
    )
    names.check_name(plural, "namePlural", reserved=names.RESERVED_OBJECT_NAMES, what="an object")
    if singular == plural:
        raise InvalidArgument("namePlural must differ from nameSingular", field="namePlural")
    for item in defs.objects:
        if item.id == exclude:
            continue
        taken = {item.name_singular, item.name_plural}
        if singular in taken:
            raise InvalidArgument(
                f"nameSingular: an object named {singular!r} already exists", field="nameSingular"
            )
        if plural in taken:
            raise InvalidArgument(
                f"namePlural: an object named {plural!r} already exists", field="namePlural"
            )


def new_object(defs: Definitions, request: md.CreateObjectRequest) -> md.ObjectMetadata:
    if len(defs.objects) >= MAX_OBJECTS:
        raise InvalidArgument(
            f"a workspace has at most {MAX_OBJECTS} objects", field="nameSingular"
        )
    _check_object_names(defs, request.name_singular, request.name_plural)
    object_id = str(uuid.uuid4())
    item = md.ObjectMetadata(
        id=object_id,
        workspace_id=defs.workspace_id,
        name_singular=request.name_singular,
        name_plural=request.name_plural,
        label_singular=names.check_label(
            request.label_singular, "labelSingular", request.name_singular
        ),
        label_plural=names.check_label(request.label_plural, "labelPlural", request.name_plural),
        description=request.description,
        icon=request.icon,
        is_custom=True,
        is_active=True,
        label_identifier_field="name",
    )
    for entry in system_fields(defs.workspace_id, object_id):
        entry.id = str(uuid.uuid4())
        item.fields.append(entry)
    item.fields.append(
        md.FieldMetadata(
            id=str(uuid.uuid4()),
            object_metadata_id=object_id,
            name="name",
            label="Name",
            type=T.FIELD_TYPE_TEXT,
            is_nullable=True,
            is_custom=False,
            is_active=True,
            is_searchable=True,
            is_indexed=True,  # the label field
        )
    )
    return item


def apply_object_update(defs: Definitions, request: md.UpdateObjectRequest) -> md.ObjectMetadata:
    item = defs.object(request.id, "id")
    changed = md.ObjectMetadata()
    changed.CopyFrom(item)
    renaming = request.HasField("name_singular") or request.HasField("name_plural")
    if renaming:
        if not item.is_custom:
            raise InvalidArgument(
                "standard objects cannot be renamed; change their labels instead",
                field="nameSingular" if request.HasField("name_singular") else "namePlural",
            )
        singular = (
            request.name_singular if request.HasField("name_singular") else item.name_singular
        )
        plural = request.name_plural if request.HasField("name_plural") else item.name_plural
        _check_object_names(defs, singular, plural, exclude=item.id)
        changed.name_singular, changed.name_plural = singular, plural
    if request.HasField("label_singular"):
        changed.label_singular = names.check_label(
            request.label_singular, "labelSingular", changed.name_singular
        )
    if request.HasField("label_plural"):
        changed.label_plural = names.check_label(
            request.label_plural, "labelPlural", changed.name_plural
        )
    if request.HasField("description"):
        changed.description = request.description
    if request.HasField("icon"):
        changed.icon = request.icon
    if request.HasField("is_active") and request.is_active != item.is_active:
        if not item.is_custom:
            raise InvalidArgument("standard objects cannot be deactivated", field="isActive")
        changed.is_active = request.is_active
    if request.HasField("label_identifier_field"):
        target = next(
            (f for f in item.fields if f.name == request.label_identifier_field and f.is_active),
            None,
        )
        if target is None or target.type in (T.FIELD_TYPE_RELATION, T.FIELD_TYPE_RAW_JSON):
            raise InvalidArgument(
                "labelIdentifierField must name an active, non-relation field of the object",
                field="labelIdentifierField",
            )
        changed.label_identifier_field = request.label_identifier_field
    return changed


def indexed_label(item: md.ObjectMetadata) -> md.FieldMetadata | None:
    """The object's label field with `is_indexed` set, when it was not (a label field always has
    its btree: lists are sorted and searched by it); None when nothing changes."""
    for entry in item.fields:
        if entry.name == item.label_identifier_field and not entry.is_indexed and indexable(entry):
            changed = md.FieldMetadata()
            changed.CopyFrom(entry)
            changed.is_indexed = True
            return changed
    return None


# -- fields ---------------------------------------------------------------------------------------
def _physical_names(item: md.FieldMetadata) -> set[str]:
    """Names a field takes as record JSON keys and columns."""
    if item.type == T.FIELD_TYPE_CURRENCY:
        return {item.name, item.name + "AmountMicros", item.name + "CurrencyCode"}
    if item.type == T.FIELD_TYPE_RELATION and item.relation.kind == T.RELATION_KIND_MANY_TO_ONE:
        return {item.name, item.name + "Id"}
    return {item.name}


def check_field_name(
    owner: md.ObjectMetadata, candidate: md.FieldMetadata, path: str, *, exclude: str = ""
) -> None:
    names.check_name(candidate.name, path, reserved=names.RESERVED_FIELD_NAMES, what="a field")
    wanted = _physical_names(candidate)
    for existing in owner.fields:
        if existing.id == exclude:
            continue
        clash = wanted & _physical_names(existing)
        if clash:
            if existing.name == candidate.name:
                message = f"{owner.name_singular} already has a field named {candidate.name!r}"
            else:
                message = f"{candidate.name!r} clashes with {existing.name!r} ({sorted(clash)[0]})"
            raise InvalidArgument(f"{path}: {message}", field=path)


def check_options(field_type: int, options: list[md.SelectOption]) -> list[md.SelectOption]:
    if field_type not in (T.FIELD_TYPE_SELECT, T.FIELD_TYPE_MULTI_SELECT):
        if options:
            raise InvalidArgument(
                "options apply to SELECT and MULTI_SELECT fields", field="options"
            )
        return []
    if not options:
        raise InvalidArgument("a SELECT field needs at least one option", field="options")
    if len(options) > MAX_OPTIONS:
        raise InvalidArgument(f"at most {MAX_OPTIONS} options", field="options")
    seen: set[str] = set()
    checked = []
    for i, option in enumerate(options):
        path = f"options[{i}].value"
        if not names.OPTION_VALUE.match(option.value) or len(option.value) > 63:
            raise InvalidArgument(
                f"{path}: option values are UPPER_SNAKE_CASE, got {option.value!r}", field=path
            )
        if option.value in seen:
            raise InvalidArgument(f"{path}: duplicate option {option.value!r}", field=path)
        seen.add(option.value)
        checked.append(
            md.SelectOption(
                value=option.value,
                label=option.label or names.humanize(option.value.lower()),
                color=option.color,
                position=option.position if option.position else i,
            )
        )
    return checked


def check_default(item: md.FieldMetadata, raw: bytes, path: str = "defaultValue") -> bytes:
    """The default value as canonical JSON bytes (empty: none), checked against the type."""
    if not raw:
        return b""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise InvalidArgument(f"{path} is not valid JSON", field=path) from None
    if value is None:
        return b""
    if not _default_ok(item, value):
        type_name = md.FieldType.Name(item.type).removeprefix("FIELD_TYPE_")
        raise InvalidArgument(f"{path} is not a valid {type_name} value", field=path)
    return orjson.dumps(value)


def _default_ok(item: md.FieldMetadata, value: Any) -> bool:
    kind = item.type
    options = {o.value for o in item.options}
    if kind in (T.FIELD_TYPE_TEXT, T.FIELD_TYPE_PHONE, T.FIELD_TYPE_LINK):
        return isinstance(value, str) and "\x00" not in value
    if kind == T.FIELD_TYPE_EMAIL:
        return isinstance(value, str) and bool(_EMAIL.match(value))
    if kind == T.FIELD_TYPE_NUMBER:
        return (
            isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        )
    if kind == T.FIELD_TYPE_BOOLEAN:
        return isinstance(value, bool)
    if kind == T.FIELD_TYPE_DATE:
        return isinstance(value, str) and _parses(date.fromisoformat, value)
    if kind == T.FIELD_TYPE_DATE_TIME:
        return isinstance(value, str) and _parses(datetime.fromisoformat, value)
    if kind == T.FIELD_TYPE_UUID:
        return isinstance(value, str) and _parses(uuid.UUID, value)
    if kind == T.FIELD_TYPE_SELECT:
        return value in options
    if kind == T.FIELD_TYPE_MULTI_SELECT:
        return isinstance(value, list) and all(v in options for v in value)
    if kind == T.FIELD_TYPE_CURRENCY:
        return (
            isinstance(value, dict)
            and set(value) <= {"amountMicros", "currencyCode"}
            and (value.get("amountMicros") is None or type(value["amountMicros"]) is int)
            and (
                value.get("currencyCode") is None
                or (isinstance(value["currencyCode"], str)
                    and bool(_CURRENCY_CODE.match(value["currencyCode"])))
            )
        )  # fmt: skip
    if kind == T.FIELD_TYPE_RAW_JSON:
        return "\\u0000" not in orjson.dumps(value).decode()
    return False


def _parses(parse: Any, value: str) -> bool:
    try:
        parse(value)
    except ValueError:
        return False
    return True


def check_searchable(field_type: int, requested: bool | None) -> bool:
    """Whether a field of `field_type` is searchable: as asked, else by its type."""
    if requested is None:
        return field_type in SEARCHABLE_TYPES
    if requested and field_type not in SEARCHABLE_TYPES:
        raise InvalidArgument(
            "only TEXT, EMAIL, PHONE and LINK fields can be searchable", field="isSearchable"
        )
    return requested


def _many_to_one(item: md.FieldMetadata) -> bool:
    return item.type == T.FIELD_TYPE_RELATION and (
        item.relation.kind in (T.RELATION_KIND_MANY_TO_ONE, T.RELATION_KIND_UNSPECIFIED)
    )


def indexable(item: md.FieldMetadata) -> bool:
    """A btree serves the field's filters and sorts (not BOOLEAN, MULTI_SELECT, RAW_JSON, nor a
    one-to-many relation, which has no column)."""
    if item.type == T.FIELD_TYPE_RELATION:
        return _many_to_one(item)
    return item.type in INDEXABLE_TYPES


def check_indexed(owner: md.ObjectMetadata, item: md.FieldMetadata, requested: bool | None) -> bool:
    """Whether `item` gets a btree (docs/data-model.md, "Indexes"): as asked, else when it is a
    many-to-one relation or unique. Many-to-one relations and the label field always are."""
    if requested is None:
        return _many_to_one(item) or item.is_unique
    if not requested:
        if _many_to_one(item):
            raise InvalidArgument(
                "many-to-one relations are always indexed (their foreign key)", field="isIndexed"
            )
        if item.name == owner.label_identifier_field and indexable(item):
            raise InvalidArgument(
                "the object's label identifier field is always indexed", field="isIndexed"
            )
    elif not indexable(item):
        raise InvalidArgument(
            "BOOLEAN, MULTI_SELECT, RAW_JSON and one-to-many relation fields cannot be indexed",
            field="isIndexed",
        )
    return requested


def new_fields(
    defs: Definitions, request: md.CreateFieldRequest
) -> tuple[md.FieldMetadata, list[md.FieldMetadata]]:
    """The field to create and every field row to insert (both sides of a relation)."""
    owner = defs.object(request.object_metadata_id)
    if not owner.is_active:
        raise InvalidArgument("the object is inactive", field="objectMetadataId")
    if len(owner.fields) >= MAX_FIELDS_PER_OBJECT:
        raise InvalidArgument(
            f"an object has at most {MAX_FIELDS_PER_OBJECT} fields", field="objectMetadataId"
        )
    if request.type == T.FIELD_TYPE_UNSPECIFIED or request.type not in md.FieldType.values():
        raise InvalidArgument(
            "type is required (TEXT, NUMBER, SELECT, RELATION, ...)", field="type"
        )
    if request.type == T.FIELD_TYPE_RELATION:
        return _new_relation(defs, owner, request)
    item = md.FieldMetadata(
        id=str(uuid.uuid4()),
        object_metadata_id=owner.id,
        name=request.name,
        label=names.check_label(request.label, "label", request.name),
        type=request.type,
        description=request.description,
        icon=request.icon,
        is_nullable=request.is_nullable if request.HasField("is_nullable") else True,
        is_custom=True,
        is_active=True,
        is_unique=request.is_unique,
        is_searchable=check_searchable(
            request.type,
            request.is_searchable if request.HasField("is_searchable") else None,
        ),
        options=check_options(request.type, list(request.options)),
    )
    check_field_name(owner, item, "name")
    if request.is_unique and request.type in (
        T.FIELD_TYPE_CURRENCY,
        T.FIELD_TYPE_RAW_JSON,
        T.FIELD_TYPE_MULTI_SELECT,
        T.FIELD_TYPE_BOOLEAN,
    ):
        raise InvalidArgument("this field type cannot be unique", field="isUnique")
    item.is_indexed = check_indexed(
        owner, item, request.is_indexed if request.HasField("is_indexed") else None
    )
    item.default_value_json = check_default(item, request.default_value_json)
    return item, [item]


def _new_relation(
    defs: Definitions, owner: md.ObjectMetadata, request: md.CreateFieldRequest
) -> tuple[md.FieldMetadata, list[md.FieldMetadata]]:
    settings = request.relation
    if request.options:
        raise InvalidArgument("options apply to SELECT and MULTI_SELECT fields", field="options")
    if request.default_value_json:
        raise InvalidArgument("relations have no default value", field="defaultValue")
    if request.is_unique:
        raise InvalidArgument("relations cannot be unique", field="isUnique")
    if settings.target_object_metadata_id:
        target = defs.by_id.get(settings.target_object_metadata_id)
    else:
        target = defs.object_named(settings.target_object_name)
    if target is None or not target.is_active:
        raise InvalidArgument(
            "relation.targetObjectMetadataId must name an active object of the workspace",
            field="relation.targetObjectMetadataId",
        )
    kind = settings.kind or T.RELATION_KIND_MANY_TO_ONE
    many_to_one = kind == T.RELATION_KIND_MANY_TO_ONE
    holder, other = (owner, target) if many_to_one else (target, owner)
    # Defaults: person.company ↔ company.people; company.staff (one-to-many) ↔ person.company.
    inverse = settings.inverse_field_name or (
        owner.name_plural if many_to_one else owner.name_singular
    )
    many_name, one_name = (request.name, inverse) if many_to_one else (inverse, request.name)
    label = names.check_label(request.label, "label", request.name)
    many, one = relation_pair(
        defs.workspace_id,
        holder,
        many_name,
        other,
        one_name,
        custom=True,
        label=label if many_to_one else "",
        inverse_label="" if many_to_one else label,
        on_delete=settings.on_delete or T.ON_DELETE_SET_NULL,
        ids=(str(uuid.uuid4()), str(uuid.uuid4())),
    )
    created, inverse_field = (many, one) if many_to_one else (one, many)
    created.description = request.description
    created.icon = request.icon
    if request.HasField("is_indexed"):
        check_indexed(owner, created, request.is_indexed)
    check_field_name(owner, created, "name")
    if holder.id == other.id and many_name == one_name:
        raise InvalidArgument(
            "relation.inverseFieldName must differ from name on a self relation",
            field="relation.inverseFieldName",
        )
    check_field_name(
        defs.by_id[inverse_field.object_metadata_id], inverse_field, "relation.inverseFieldName"
    )
    return created, [created, inverse_field]


def apply_field_update(defs: Definitions, request: md.UpdateFieldRequest) -> list[md.FieldMetadata]:
    """The changed field, and the other side of a relation when it changes too."""
    owner, item = defs.field(request.id)
    if item.is_system:
        raise InvalidArgument(f"{item.name} is a system field and cannot be changed", field="id")
    changed = md.FieldMetadata()
    changed.CopyFrom(item)
    extra: list[md.FieldMetadata] = []
    if request.HasField("name") and request.name != item.name:
        if not item.is_custom:
            raise InvalidArgument("standard fields cannot be renamed", field="name")
        changed.name = request.name
        check_field_name(owner, changed, "name", exclude=item.id)
        if owner.label_identifier_field == item.name:
            raise InvalidArgument(
                "rename the object's label identifier after pointing it elsewhere", field="name"
            )
        inverse = _inverse_of(defs, item)
        if inverse is not None:
            inverse.relation.inverse_field_name = changed.name
            extra.append(inverse)
    if request.HasField("label"):
        changed.label = names.check_label(request.label, "label", changed.name)
    if request.HasField("description"):
        changed.description = request.description
    if request.HasField("icon"):
        changed.icon = request.icon
    if request.HasField("is_nullable"):
        changed.is_nullable = request.is_nullable
    if request.HasField("is_searchable"):
        changed.is_searchable = check_searchable(item.type, request.is_searchable)
    if request.HasField("is_indexed"):
        changed.is_indexed = check_indexed(owner, item, request.is_indexed)
    if request.options or request.replace_options:
        merged = list(request.options)
        if not request.replace_options:
            given = {o.value for o in request.options}
            merged = [o for o in item.options if o.value not in given] + merged
        del changed.options[:]
        changed.options.extend(check_options(item.type, merged))
    if request.HasField("default_value_json"):
        changed.default_value_json = check_default(changed, request.default_value_json)
    elif changed.default_value_json:
        changed.default_value_json = check_default(changed, changed.default_value_json)
    if request.HasField("is_active") and request.is_active != item.is_active:
        if not request.is_active and owner.label_identifier_field == item.name:
            raise InvalidArgument(
                "the object's label identifier field cannot be deactivated", field="isActive"
            )
        changed.is_active = request.is_active
        inverse = _inverse_of(defs, item)
        if inverse is not None:
            inverse.is_active = request.is_active
            extra.append(inverse)
    return [changed, *extra]


def _inverse_of(defs: Definitions, item: md.FieldMetadata) -> md.FieldMetadata | None:
    if item.type != T.FIELD_TYPE_RELATION:
        return None
    target = defs.by_id.get(item.relation.target_object_metadata_id)
    if target is None:
        return None
    for entry in target.fields:
        if (
            entry.type == T.FIELD_TYPE_RELATION
            and entry.name == item.relation.inverse_field_name
            and entry.relation.target_object_metadata_id == item.object_metadata_id
        ):
            copy = md.FieldMetadata()
            copy.CopyFrom(entry)
            return copy
    return None
