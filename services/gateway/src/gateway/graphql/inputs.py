"""From Strawberry input objects to the JSON the services take (records, filters, order)."""

from __future__ import annotations

import datetime as dt
import enum
import uuid
from collections.abc import Mapping
from typing import Any

from strawberry.types.base import has_object_definition
from strawberry.types.unset import UNSET

from crm.common.v1 import common_pb2
from crmkit.errors import InvalidArgument
from crmkit.filters import NULL_OPERATORS, OPERATORS, parse_filter
from gateway.datamodel.model import ObjectModel
from gateway.graphql.scalars import serialize_datetime


def to_json_value(value: Any) -> Any:
    """A JSON-ready value: input objects become dicts keyed by GraphQL name (unset fields left
    out, explicit nulls kept), enums their value, UUIDs and dates ISO strings."""
    if value is None or isinstance(value, str | bool | int | float):
        return value
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, list | tuple):
        return [to_json_value(item) for item in value]
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, dt.datetime):
        return serialize_datetime(value)
    if isinstance(value, dt.date):
        return value.isoformat()
    if has_object_definition(value):
        out: dict[str, Any] = {}
        for field in value.__strawberry_definition__.fields:
            item = getattr(value, field.python_name, UNSET)
            if item is UNSET:
                continue
            out[field.graphql_name or field.python_name] = to_json_value(item)
        return out
    if isinstance(value, Mapping):
        return {str(key): to_json_value(item) for key, item in value.items()}
    return value


def filter_json(value: Any, obj: ObjectModel) -> dict[str, Any]:
    """A GraphQL filter input as the API filter language. In GraphQL filters null means "not
    given" (clients and tools send nulls for unset fields), and a part left empty is dropped;
    `is: NULL` becomes `is: null`; a foreign key filter (`companyId: {eq: ...}`) becomes the
    relation path `company.id`."""
    plain = to_json_value(value)
    if not isinstance(plain, dict):
        return {}
    return _normalize_filter(plain, obj)


def _normalize_filter(node: dict[str, Any], obj: ObjectModel | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, operand in node.items():
        if operand is None:
            continue
        if key in ("and", "or"):
            members = [_normalize_filter(child, obj) for child in operand if child]
            members = [member for member in members if member]
            if members:
                out[key] = members
        elif key == "not":
            inner = _normalize_filter(operand, obj)
            if inner:
                out[key] = inner
        elif key in NULL_OPERATORS:
            out[key] = None
        elif key in OPERATORS:  # an operand, even a JSON object (RAW_JSON), is not a filter
            out[key] = operand
        elif isinstance(operand, dict):
            nested = _normalize_filter(operand, None)
            if not nested:
                continue
            field = obj.record_key(key) if obj is not None else None
            if field is not None and field.is_many_to_one and key == field.foreign_key:
                merged = out.get(field.name)
                if not isinstance(merged, dict):
                    merged = out[field.name] = {}
                ids = merged.get("id")
                if not isinstance(ids, dict):
                    ids = merged["id"] = {}
                ids.update(nested)
            else:
                current = out.get(key)
                if isinstance(current, dict):
                    current.update(nested)
                else:
                    out[key] = nested
        else:
            out[key] = operand
    return out


def parse_graphql_filter(value: Any, obj: ObjectModel) -> common_pb2.Filter | None:
    if value is None or value is UNSET:
        return None
    return parse_filter(filter_json(value, obj), field="filter")


def order_by(value: Any) -> list[common_pb2.OrderBy]:
    """`orderBy: [{name: ASC}, {createdAt: DESC}]` (or one object) → OrderBy list, in order."""
    if value is None or value is UNSET:
        return []
    items = value if isinstance(value, list) else [value]
    result: list[common_pb2.OrderBy] = []
    for item in items:
        plain = to_json_value(item)
        if not isinstance(plain, dict):
            continue
        for field, direction in plain.items():
            if direction is None:
                continue
            result.append(
                common_pb2.OrderBy(
                    field=field,
                    direction=common_pb2.SORT_DIRECTION_DESC
                    if direction == "DESC"
                    else common_pb2.SORT_DIRECTION_ASC,
                )
            )
    return result


def record_json(value: Any, *, field: str = "data") -> dict[str, Any]:
    plain = to_json_value(value)
    if not isinstance(plain, dict):
        raise InvalidArgument("expected an input object", field=field)
    return plain
