"""The OpenAPI 3.1 document of a workspace's REST API, generated from its data model (custom
objects and fields included) and cached per model fingerprint as encoded bytes."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from gateway import idempotency
from gateway.auth import authenticate
from gateway.datamodel.model import (
    OPERATORS_BY_TYPE,
    DataModel,
    FieldModel,
    FieldType,
    ObjectModel,
)
from gateway.pagination import DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE
from gateway.rest.filters import MAX_INT
from gateway.rest.params import DEFAULT_GROUPS, MAX_GET_DEPTH, MAX_GROUPS, MAX_LIST_DEPTH
from gateway.rest.routes import MAX_BATCH
from gateway.state import gateway_state

OPENAPI_DOCUMENT = "openapi"
MAX_TEXT = 65_536  # characters of a text value (records refuses longer ones)
Schema = dict[str, Any]

_ERROR_STATUSES = {
    "400": "Invalid request: unknown field, wrong type, bad operator or cursor, malformed JSON.",
    "401": "Missing, invalid, expired or revoked credential.",
    "403": "The credential's role lacks the permission.",
    "404": "Unknown object or record.",
    "429": "Rate limit exceeded.",
    "503": "An upstream service is unavailable.",
}


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _nullable(schema: Schema) -> Schema:
    if not schema:
        return schema  # any JSON, null included
    if "$ref" in schema or "type" not in schema:
        return {"anyOf": [schema, {"type": "null"}]}
    kind = schema["type"]
    kinds = kind if isinstance(kind, list) else [kind]
    nullable = {**schema, "type": [*kinds, "null"]}
    if "enum" in schema:
        nullable["enum"] = [*schema["enum"], None]
    return nullable


def _component_name(obj: ObjectModel) -> str:
    return obj.singular[:1].upper() + obj.singular[1:]


def _value_schema(f: FieldModel, *, for_input: bool) -> Schema:
    """The JSON schema of a field's value (not null)."""
    t = f.type
    text: Schema = {"type": "string", "maxLength": MAX_TEXT} if for_input else {"type": "string"}
    if t in (FieldType.TEXT, FieldType.PHONE, FieldType.LINK):
        return text
    if t is FieldType.EMAIL:
        return {**text, "format": "email"} if for_input else text
    if t is FieldType.UUID:
        return {"type": "string", "format": "uuid"}
    if t is FieldType.NUMBER:
        return {"type": "number"}
    if t is FieldType.BOOLEAN:
        return {"type": "boolean"}
    if t is FieldType.DATE:
        return {"type": "string", "format": "date"}
    if t is FieldType.DATE_TIME:
        return {"type": "string", "format": "date-time"}
    if t is FieldType.SELECT:
        if for_input and f.options:
            return {"type": "string", "enum": list(f.options)}
        return {"type": "string"}
    if t is FieldType.MULTI_SELECT:
        items: Schema = {"type": "string"}
        if for_input and f.options:
            items = {"type": "string", "enum": list(f.options)}
        return {"type": "array", "items": items, **({"uniqueItems": True} if for_input else {})}
    if t is FieldType.CURRENCY:
        return _ref("CurrencyInput" if for_input else "Currency")
    return {}  # RAW_JSON: any JSON


def _describe(f: FieldModel) -> Schema:
    text = f.description or f.label
    return {"description": text} if text else {}


def record_schema(model: DataModel, obj: ObjectModel) -> Schema:
    properties: dict[str, Schema] = {}
    for f in obj.fields:
        if f.is_many_to_one:
            properties[f.foreign_key] = {
                **_nullable({"type": "string", "format": "uuid"}),
                "description": f"Id of the related {f.target}.",
            }
            target = model.object(f.target)
            if target is not None:
                properties[f.name] = {
                    **_nullable(_ref(_component_name(target))),
                    "description": f"The related {f.target} (with depth >= 1).",
                }
            continue
        if f.is_one_to_many:
            target = model.object(f.target)
            if target is not None:
                properties[f.name] = {
                    "type": "array",
                    "items": _ref(_component_name(target)),
                    "description": f"The first 60 related {target.plural} (with depth 2).",
                }
            continue
        value = _value_schema(f, for_input=False)
        schema = value if f.name in ("id", "createdAt", "updatedAt") else _nullable(value)
        properties[f.name] = schema if "$ref" in schema else {**schema, **_describe(f)}
    return {
        "type": "object",
        "description": obj.description or obj.label_singular or obj.singular,
        "properties": properties,
    }


def write_schema(obj: ObjectModel, *, create: bool) -> Schema:
    properties: dict[str, Schema] = {}
    required: list[str] = []
    for f in obj.fields:
        if (f.is_system and f.name != "ownerId") or f.is_one_to_many:
            continue
        if f.is_many_to_one:
            properties[f.name] = _ref("RelationInput")
            properties[f.foreign_key] = _nullable({"type": "string", "format": "uuid"})
            continue
        value = _value_schema(f, for_input=True)
        if create and f.required_on_create:
            required.append(f.name)
        typed = _nullable(value) if f.nullable else value
        properties[f.name] = typed if "$ref" in typed else {**typed, **_describe(f)}
    schema: Schema = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        schema["required"] = required
    return schema


def _filter_value_schema(f_type: FieldType, options: tuple[str, ...], integer: bool) -> Schema:
    if f_type is FieldType.NUMBER:
        if integer:
            return {"type": "integer", "minimum": -MAX_INT, "maximum": MAX_INT}
        return {"type": "number"}
    if f_type is FieldType.BOOLEAN:
        return {"type": "boolean"}
    if f_type is FieldType.UUID:
        return {"type": "string", "format": "uuid"}
    if f_type is FieldType.DATE:
        return {"type": "string", "format": "date"}
    if f_type is FieldType.DATE_TIME:
        return {"type": "string", "format": "date-time"}
    if f_type in (FieldType.SELECT, FieldType.MULTI_SELECT) and options:
        return {"type": "string", "enum": list(options)}
    return {"type": "string"}


_Target = tuple[str, FieldType, tuple[str, ...], bool]


def _own_targets(obj: ObjectModel, prefix: str = "") -> list[_Target]:
    """The filterable paths of `obj`'s own fields: scalars, currency parts, relation ids."""
    targets: list[_Target] = []
    for f in obj.fields:
        if f.is_one_to_many or f.type is FieldType.RAW_JSON:
            continue
        if f.is_many_to_one:
            if not prefix:  # one level: a related record's own relations are left out
                targets.append((f"{f.name}][id", FieldType.UUID, (), False))
        elif f.type is FieldType.CURRENCY:
            targets.append((f"{prefix}{f.name}][amountMicros", FieldType.NUMBER, (), True))
            targets.append((f"{prefix}{f.name}][currencyCode", FieldType.TEXT, (), False))
        else:
            targets.append((f"{prefix}{f.name}", f.type, f.options, False))
    return targets


def _filter_parameters(model: DataModel, obj: ObjectModel) -> list[Schema]:
    """One parameter per (field, operator), e.g. filter[name][startsWith], and per field of a
    many-to-one relation's target, e.g. filter[company][name][startsWith]."""
    targets = _own_targets(obj)
    for f in obj.fields:
        target = model.object(f.target) if f.is_many_to_one else None
        if target is not None:
            targets += [t for t in _own_targets(target, f"{f.name}][") if t[0] != f"{f.name}][id"]
    parameters: list[Schema] = []
    for path, f_type, options, integer in targets:
        multi = f_type is FieldType.MULTI_SELECT
        for operator in OPERATORS_BY_TYPE[f_type]:
            value = _filter_value_schema(f_type, options, integer)
            style: dict[str, Any] = {}
            if operator in ("is", "isNot"):
                schema: Schema = {"type": "string", "enum": ["null"]}
            elif operator == "in" or multi:
                schema = {"type": "array", "items": value, "minItems": 1}
                style = {"style": "form", "explode": False}
            elif operator in ("contains", "startsWith", "endsWith"):
                schema = {"type": "string", "minLength": 1}
            else:
                schema = value
            parameters.append(
                {
                    "name": f"filter[{path}][{operator}]",
                    "in": "query",
                    "required": False,
                    "schema": schema,
                    **style,
                }
            )
    return parameters


def _order_parameters(obj: ObjectModel) -> list[Schema]:
    return [
        {
            "name": f"orderBy[{f.name}]",
            "in": "query",
            "required": False,
            "description": "Repeatable; the order of the parameters is the sort order.",
            "schema": {"type": "string", "enum": ["ASC", "DESC"]},
        }
        for f in obj.fields
        if f.sortable
    ]


_JSON_FILTER = {
    "name": "filter",
    "in": "query",
    "required": False,
    "description": "A filter tree as JSON text (URL-encoded), ANDed with the filter[...] "
    'parameters. Grammar: FILTER = {FIELD: CONDITION, ..., "and": [FILTER, ...], "or": '
    '[FILTER, ...], "not": FILTER} (members combine with AND); CONDITION = {OPERATOR: VALUE, '
    "...} with the operators of the filter[<field>][<op>] parameters (eq, neq, in, contains, "
    "startsWith, endsWith, gt, gte, lt, lte, is, isNot; is/isNot take null); a many-to-one "
    'relation\'s CONDITION is a FILTER on its target ({"company": {"name": {"eq": '
    '"Acme"}}}); a currency\'s is {"amountMicros": CONDITION, "currencyCode": '
    "CONDITION}. The same tree as GraphQL's filter argument.",
    "schema": {"type": "string", "contentMediaType": "application/json"},
    "example": '{"or": [{"createdAt": {"lt": "2026-01-01"}}, '
    '{"createdAt": {"gte": "2026-06-01"}}]}',
}


def _limit(default: int = DEFAULT_PAGE_SIZE) -> Schema:
    return {
        "name": "limit",
        "in": "query",
        "required": False,
        "schema": {"type": "integer", "minimum": 1, "maximum": MAX_PAGE_SIZE, "default": default},
    }


_AFTER = {
    "name": "after",
    "in": "query",
    "required": False,
    "description": "The endCursor of the previous page.",
    "schema": {"type": "string"},
}


def _fields_parameter(obj: ObjectModel) -> Schema:
    names = [f.name for f in obj.fields if not f.is_one_to_many]
    return {
        "name": "fields",
        "in": "query",
        "required": False,
        "description": "Comma-separated field names to return, e.g. " + ",".join(names[:3]),
        "schema": {"type": "string"},
    }


def _depth(maximum: int, default: int) -> Schema:
    meanings = ["0: the record's own fields", "1: many-to-one relations nested"]
    if maximum >= 2:
        meanings.append("2: also the first 60 records of each one-to-many relation")
    return {
        "name": "depth",
        "in": "query",
        "required": False,
        "description": "; ".join(meanings[: maximum + 1]) + ".",
        "schema": {"type": "integer", "minimum": 0, "maximum": maximum, "default": default},
    }


_ID = {
    "name": "id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "format": "uuid"},
}


_IDEMPOTENCY_KEY: Schema = {"$ref": f"#/components/parameters/{idempotency.HEADER}"}
_IDEMPOTENCY_PARAMETER: Schema = {
    "name": idempotency.HEADER,
    "in": "header",
    "required": False,
    "description": "Makes the write safe to retry: a retry with the same key and the same "
    "request within the key's lifetime (24 h by default) answers the first response and writes "
    "nothing; the key with another request is a 422. Scoped to the workspace and credential.",
    "schema": {
        "type": "string",
        "minLength": 1,
        "maxLength": idempotency.MAX_KEY_LENGTH,
        "pattern": "^[\\x20-\\x7e]+$",
    },
}
_REUSED_KEY = {
    "description": f"The {idempotency.HEADER} was used with a different request.",
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
}


def _write(operation: Schema) -> Schema:
    """A write operation: it takes the Idempotency-Key header (and may answer its 422)."""
    parameters = [*operation.get("parameters", ()), _IDEMPOTENCY_KEY]
    responses = {**operation["responses"], "422": _REUSED_KEY}
    return {**operation, "parameters": parameters, "responses": responses}


def _upsert_parameters(obj: ObjectModel) -> list[Schema]:
    unique = [f.name for f in obj.fields if f.is_unique and f.type is not FieldType.CURRENCY]
    if not unique:
        return []
    return [
        {
            "name": "upsert",
            "in": "query",
            "required": False,
            "description": "A unique field: a record holding the value is updated (the fields "
            "given) instead of created. A value held only by a soft-deleted record is a 409.",
            "schema": {"type": "string", "enum": unique},
        }
    ]


def _upserted(description: str, schema: Schema) -> Schema:
    return {
        "200": {
            "description": description,
            "headers": _headers("200"),
            "content": {"application/json": {"schema": schema}},
        },
        "409": {
            "description": "A unique value is taken (with upsert: held by a soft-deleted record).",
            "headers": _headers("409"),
            "content": {"application/json": {"schema": _ref("Error")}},
        },
    }


def _json_body(schema: Schema, description: str = "") -> Schema:
    body: Schema = {"required": True, "content": {"application/json": {"schema": schema}}}
    if description:
        body["description"] = description
    return body


# Sent on every response to an authenticated call (docs/api.md, Rate limits); absent only when
# the limiter could not reach Redis, so none is `required`.
_RATE_LIMIT_HEADERS: Schema = {
    "X-RateLimit-Limit": {
        "description": "Calls allowed per credential within the sliding window.",
        "schema": {"type": "integer"},
    },
    "X-RateLimit-Remaining": {
        "description": "Calls left in the window after this one.",
        "schema": {"type": "integer"},
    },
    "X-RateLimit-Reset": {
        "description": "Unix time (seconds) when the next slot frees.",
        "schema": {"type": "integer"},
    },
}
_RETRY_AFTER: Schema = {
    "Retry-After": {
        "description": "Seconds until the next slot frees.",
        "schema": {"type": "integer"},
    }
}


def _headers(code: str) -> Schema:
    names = [*_RATE_LIMIT_HEADERS, *(_RETRY_AFTER if code == "429" else ())]
    return {name: {"$ref": f"#/components/headers/{name}"} for name in names}


def _responses(status: str, description: str, schema: Schema) -> Schema:
    responses: Schema = {
        status: {
            "description": description,
            "headers": _headers(status),
            "content": {"application/json": {"schema": schema}},
        }
    }
    for code, text in _ERROR_STATUSES.items():
        responses[code] = {
            "description": text,
            "content": {"application/json": {"schema": _ref("Error")}},
        }
        if code != "401":  # a refused credential is not counted
            responses[code]["headers"] = _headers(code)
    return responses


def _export_responses() -> Schema:
    responses = _responses("200", "", {})
    responses["200"] = {
        "description": "The file, chunked: a CSV header and rows, or one record JSON per line.",
        "headers": _headers("200"),
        "content": {
            "text/csv; charset=utf-8": {"schema": {"type": "string"}},
            "application/x-ndjson": {"schema": {"type": "string"}},
        },
    }
    return responses


def _data(schema: Schema, **extra: Schema) -> Schema:
    return {
        "type": "object",
        "required": ["data", *extra],
        "properties": {"data": schema, **extra},
    }


def _operations(model: DataModel, obj: ObjectModel) -> dict[str, Schema]:
    name = _component_name(obj)
    record = _ref(name)
    page = _data({"type": "array", "items": record}, pageInfo=_ref("PageInfo"))
    tag = [obj.plural]
    list_parameters = [
        *_filter_parameters(model, obj),
        _JSON_FILTER,
        *_order_parameters(obj),
        _limit(),
        _AFTER,
        _fields_parameter(obj),
        _depth(MAX_LIST_DEPTH, 0),
    ]
    plural = obj.plural
    return {
        f"/rest/{plural}": {
            "get": {
                "operationId": f"list_{plural}",
                "summary": f"List {plural}",
                "tags": tag,
                "parameters": list_parameters,
                "responses": _responses("200", "A page of records.", page),
            },
            "post": _write(
                {
                    "operationId": f"create_{obj.singular}",
                    "summary": f"Create a {obj.singular}",
                    "tags": tag,
                    "parameters": _upsert_parameters(obj),
                    "requestBody": _json_body(_ref(f"{name}Create")),
                    "responses": {
                        **_responses("201", "The created record.", _data(record)),
                        **_upserted(
                            "The record holding the upsert field's value, updated.", _data(record)
                        ),
                    },
                }
            ),
        },
        f"/rest/{plural}/{{id}}": {
            "parameters": [_ID],
            "get": {
                "operationId": f"get_{obj.singular}",
                "summary": f"Get a {obj.singular}",
                "tags": tag,
                "parameters": [_fields_parameter(obj), _depth(MAX_GET_DEPTH, 1)],
                "responses": _responses("200", "The record.", _data(record)),
            },
            "patch": _write(
                {
                    "operationId": f"update_{obj.singular}",
                    "summary": f"Update a {obj.singular}",
                    "tags": tag,
                    "requestBody": _json_body(_ref(f"{name}Update")),
                    "responses": _responses(
                        "200",
                        "The id, the fields whose value changed, and updatedAt.",
                        _data(
                            {
                                "type": "object",
                                "required": ["id", "updatedAt"],
                                "properties": {
                                    "id": {"type": "string", "format": "uuid"},
                                    "updatedAt": {"type": "string", "format": "date-time"},
                                },
                            }
                        ),
                    ),
                }
            ),
            "delete": _write(
                {
                    "operationId": f"delete_{obj.singular}",
                    "summary": f"Soft-delete a {obj.singular}",
                    "tags": tag,
                    "responses": _responses(
                        "200",
                        "The id and deletedAt of the soft-deleted record.",
                        _data(
                            {
                                "type": "object",
                                "required": ["id", "deletedAt"],
                                "properties": {
                                    "id": {"type": "string", "format": "uuid"},
                                    "deletedAt": {"type": "string", "format": "date-time"},
                                },
                            }
                        ),
                    ),
                }
            ),
        },
        f"/rest/batch/{plural}": {
            "post": _write(
                {
                    "operationId": f"create_{plural}_batch",
                    "summary": f"Create up to {MAX_BATCH} {plural}, all or nothing",
                    "tags": tag,
                    "requestBody": _json_body(
                        {
                            "type": "array",
                            "items": _ref(f"{name}Create"),
                            "minItems": 1,
                            "maxItems": MAX_BATCH,
                        },
                        "Errors name the record's index, e.g. [3].email.",
                    ),
                    "parameters": _upsert_parameters(obj),
                    "responses": {
                        **_responses(
                            "201",
                            "The created records.",
                            _data({"type": "array", "items": record}),
                        ),
                        **_upserted(
                            "With upsert: the records, created or updated, in input order.",
                            _data({"type": "array", "items": record}, meta=_ref("UpsertMeta")),
                        ),
                    },
                }
            )
        },
        f"/rest/{plural}/duplicates": {
            "post": {
                "operationId": f"find_{plural}_duplicates",
                "summary": f"{plural} matching the given fields (text case-insensitively)",
                "tags": tag,
                "parameters": [_limit(), _AFTER, _fields_parameter(obj)],
                "requestBody": _json_body({**_ref(f"{name}Update"), "minProperties": 1}),
                "responses": _responses("200", "Matching records.", page),
            }
        },
        f"/rest/{plural}/merge": {
            "patch": _write(
                {
                    "operationId": f"merge_{plural}",
                    "summary": f"Merge one {obj.singular} into another",
                    "description": "The target wins; the source fills the target's nulls; records "
                    "pointing at the source are repointed to the target; the source is "
                    "soft-deleted.",
                    "tags": tag,
                    "requestBody": _json_body(_ref("MergeInput")),
                    "responses": _responses(
                        "200", "The merged target.", _data(record, meta=_ref("MergeMeta"))
                    ),
                }
            )
        },
        f"/rest/{plural}/export": {
            "get": {
                "operationId": f"export_{plural}",
                "summary": f"Every matching {obj.singular} as CSV or NDJSON, streamed",
                "description": "The list's filters, orderBy and fields, no page size, read "
                "from one snapshot (docs/api.md, Export).",
                "tags": tag,
                "parameters": [
                    {
                        "name": "format",
                        "in": "query",
                        "required": True,
                        "schema": {"type": "string", "enum": ["csv", "ndjson"]},
                    },
                    {
                        "name": "relationField",
                        "in": "query",
                        "required": False,
                        "description": "Also export this field of each many-to-one relation's "
                        "target (e.g. name).",
                        "schema": {"type": "string"},
                    },
                    _fields_parameter(obj),
                    *_filter_parameters(model, obj),
                    _JSON_FILTER,
                    *_order_parameters(obj),
                ],
                "responses": _export_responses(),
            }
        },
        f"/rest/{plural}/groupBy": {
            "get": {
                "operationId": f"group_{plural}",
                "summary": f"Count (and sum numeric fields of) {plural} per value of a field",
                "tags": tag,
                "parameters": [
                    {
                        "name": "field",
                        "in": "query",
                        "required": True,
                        "schema": {
                            "type": "string",
                            "enum": [f.name for f in obj.fields if f.sortable or f.is_many_to_one],
                        },
                    },
                    *_filter_parameters(model, obj),
                    _JSON_FILTER,
                    {
                        "name": "limit",
                        "in": "query",
                        "required": False,
                        "description": "Groups returned, largest first.",
                        "schema": {
                            "type": "integer",
                            "minimum": 1,
                            "maximum": MAX_GROUPS,
                            "default": DEFAULT_GROUPS,
                        },
                    },
                ],
                "responses": _responses(
                    "200",
                    "One entry per value: the value, count and sums.",
                    _data({"type": "array", "items": _ref("Group")}),
                ),
            }
        },
        f"/rest/{plural}/{{id}}/history": {
            "parameters": [_ID],
            "get": {
                "operationId": f"history_of_{obj.singular}",
                "summary": f"Changes of a {obj.singular}, newest first",
                "tags": tag,
                "parameters": _HISTORY_PARAMETERS,
                "responses": _responses(
                    "200",
                    "A page of history entries.",
                    _data(
                        {"type": "array", "items": _ref("HistoryEntry")},
                        pageInfo=_ref("PageInfo"),
                    ),
                ),
            },
        },
        f"/rest/restore/{plural}/{{id}}": {
            "parameters": [_ID],
            "patch": _write(
                {
                    "operationId": f"restore_{obj.singular}",
                    "summary": f"Restore a soft-deleted {obj.singular}",
                    "tags": tag,
                    "responses": _responses("200", "The restored record.", _data(record)),
                }
            ),
        },
    }


_TIME_PARAMETER = {"type": "string", "format": "date-time"}
_HISTORY_PARAMETERS = [
    _limit(),
    _AFTER,
    {
        "name": "field",
        "in": "query",
        "required": False,
        "description": "Only updates that changed one of these fields (comma-separated).",
        "schema": {"type": "string"},
    },
    {
        "name": "since",
        "in": "query",
        "required": False,
        "description": "Entries at or after this time (RFC 3339 with an offset).",
        "schema": _TIME_PARAMETER,
    },
    {
        "name": "until",
        "in": "query",
        "required": False,
        "description": "Entries before this time (RFC 3339 with an offset).",
        "schema": _TIME_PARAMETER,
    },
]
_NULLABLE_ID = {"type": ["string", "null"], "format": "uuid"}

_COMMON_SCHEMAS: dict[str, Schema] = {
    "Error": {
        "type": "object",
        "required": ["statusCode", "message", "error", "details"],
        "properties": {
            "statusCode": {"type": "integer"},
            "message": {"type": "string"},
            "error": {"type": "string"},
            "details": {
                "type": "object",
                "required": ["field", "message"],
                "properties": {
                    "field": {"type": ["string", "null"]},
                    "message": {"type": "string"},
                },
            },
        },
    },
    "PageInfo": {
        "type": "object",
        "required": ["hasNextPage", "hasPreviousPage", "startCursor", "endCursor"],
        "properties": {
            "hasNextPage": {"type": "boolean"},
            "hasPreviousPage": {"type": "boolean"},
            "startCursor": {"type": ["string", "null"]},
            "endCursor": {"type": ["string", "null"]},
        },
    },
    "Currency": {
        "type": "object",
        "properties": {
            "amountMicros": {"type": ["integer", "null"]},
            "currencyCode": {"type": ["string", "null"]},
        },
    },
    "CurrencyInput": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "amountMicros": {"type": ["integer", "null"], "minimum": -MAX_INT, "maximum": MAX_INT},
            "currencyCode": {"type": ["string", "null"], "pattern": "^[A-Z]{3}$"},
        },
    },
    "RelationInput": {
        "description": 'Connects ({"connect": "<id>"}) or clears ({"disconnect": true}).',
        "type": "object",
        "additionalProperties": False,
        "minProperties": 1,
        "maxProperties": 1,
        "properties": {
            "connect": {"type": "string", "format": "uuid"},
            "disconnect": {"type": "boolean", "enum": [True]},
        },
    },
    "MergeInput": {
        "type": "object",
        "additionalProperties": False,
        "required": ["sourceId", "targetId"],
        "properties": {
            "sourceId": {"type": "string", "format": "uuid"},
            "targetId": {"type": "string", "format": "uuid"},
        },
    },
    "MergeMeta": {
        "type": "object",
        "required": ["sourceId", "sourceDeletedAt", "relationsRepointed"],
        "properties": {
            "sourceId": {"type": "string", "format": "uuid"},
            "sourceDeletedAt": {"type": ["string", "null"], "format": "date-time"},
            "relationsRepointed": {"type": "integer", "minimum": 0},
        },
    },
    "HistoryEntry": {
        "type": "object",
        "required": [
            "id",
            "object",
            "recordId",
            "action",
            "occurredAt",
            "actor",
            "changes",
            "mergedFrom",
            "mergedInto",
        ],
        "properties": {
            "id": {"type": "string", "description": "Also the entry's cursor."},
            "object": {"type": "string"},
            "recordId": {"type": "string", "format": "uuid"},
            "action": {
                "type": "string",
                "enum": ["created", "updated", "deleted", "restored", "merged"],
            },
            "occurredAt": {"type": "string", "format": "date-time"},
            "actor": {
                "type": "object",
                "required": ["kind", "userId", "credentialId", "workflowId"],
                "properties": {
                    "kind": {"type": "string"},
                    "userId": {"type": ["string", "null"]},
                    "credentialId": {"type": ["string", "null"]},
                    "workflowId": {"type": ["string", "null"]},
                },
            },
            "changes": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["field", "old", "new"],
                    "properties": {"field": {"type": "string"}, "old": {}, "new": {}},
                },
            },
            "mergedFrom": _NULLABLE_ID,
            "mergedInto": _NULLABLE_ID,
        },
    },
    "UpsertMeta": {
        "type": "object",
        "required": ["created", "updated"],
        "properties": {
            "created": {"type": "integer", "minimum": 0},
            "updated": {"type": "integer", "minimum": 0},
        },
    },
    "Group": {
        "type": "object",
        "required": ["count"],
        "properties": {
            "count": {"type": "integer", "minimum": 0},
            "sum": {"type": "object", "additionalProperties": {"type": ["number", "null"]}},
        },
    },
}


_SEARCH: Schema = {
    "get": {
        "operationId": "search",
        "summary": "Search every readable object's searchable fields, best matches first",
        "tags": ["search"],
        "parameters": [
            {
                "name": "q",
                "in": "query",
                "required": True,
                "description": "Words to find (prefix, substring, accent- and case-insensitive, "
                "typo-tolerant); every word must match.",
                "schema": {"type": "string", "minLength": 1, "maxLength": 200},
            },
            {
                "name": "objects",
                "in": "query",
                "required": False,
                "description": "Comma-separated object names; default every object.",
                "schema": {"type": "string"},
            },
            {
                "name": "limit",
                "in": "query",
                "required": False,
                "schema": {"type": "integer", "minimum": 1, "maximum": 100, "default": 20},
            },
            _AFTER,
        ],
        "responses": _responses(
            "200",
            "Ranked results.",
            _data(
                {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["object", "score", "matchedFields", "record"],
                        "properties": {
                            "object": {"type": "string"},
                            "score": {"type": "number"},
                            "matchedFields": {"type": "array", "items": {"type": "string"}},
                            "record": {"type": "object"},
                        },
                    },
                },
                pageInfo=_ref("PageInfo"),
            ),
        ),
    }
}


def build_document(model: DataModel) -> dict[str, Any]:
    schemas: dict[str, Schema] = dict(_COMMON_SCHEMAS)
    paths: dict[str, Schema] = {
        "/rest/open-api": {
            "get": {
                "operationId": "open_api",
                "summary": "This document (the workspace's REST API)",
                "tags": ["meta"],
                "responses": _responses(
                    "200", "OpenAPI 3.1 document.", {"type": "object", "required": ["openapi"]}
                ),
            }
        },
        "/rest/search": _SEARCH,
    }
    for obj in model.objects:
        name = _component_name(obj)
        schemas[name] = record_schema(model, obj)
        schemas[f"{name}Create"] = write_schema(obj, create=True)
        schemas[f"{name}Update"] = write_schema(obj, create=False)
        paths.update(_operations(model, obj))
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "CRM data service: REST API",
            "version": "v1",
            "description": "Records of the workspace's objects (standard and custom). Every "
            "call sends Authorization: Bearer <token>.",
        },
        "servers": [{"url": "/"}],
        "security": [{"bearerAuth": []}],
        "tags": [{"name": obj.plural} for obj in model.objects],
        "paths": paths,
        "components": {
            "securitySchemes": {
                "bearerAuth": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "An access token (POST /auth/login), an API key (crm_ak_...), "
                    "a personal access token or an OAuth access token.",
                }
            },
            "schemas": schemas,
            "parameters": {idempotency.HEADER: _IDEMPOTENCY_PARAMETER},
            "headers": {**_RATE_LIMIT_HEADERS, **_RETRY_AFTER},
        },
    }


def encoded_document(model: DataModel) -> bytes:
    return orjson.dumps(build_document(model))


async def open_api(request: Request) -> Response:
    """GET /rest/open-api: the caller's workspace's document (no upstream call when cached)."""
    principal = await authenticate(request)
    state = gateway_state(request)
    model = await state.models.get(principal)
    body = state.models.derived(OPENAPI_DOCUMENT, model, encoded_document)
    return Response(content=body, media_type="application/json")
