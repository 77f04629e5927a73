"""REST filters checked against the data model: `filter[<field>][<op>]=<value>` parameters
(values typed from the field's type) and the JSON form `filter={...}` (the API filter language of
crmkit.filters, for `or`/`not`), both into one `crm.common.v1.Filter`.

An unknown field raises UnknownField, so the caller can re-check a possibly stale data model
before answering 400.
"""

from __future__ import annotations

import datetime as dt
import math
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from crm.common.v1 import common_pb2
from crmkit.errors import InvalidArgument
from crmkit.filters import LOGICAL_KEYS, OPERATORS, check_nesting, parse_filter
from gateway.datamodel.model import (
    CURRENCY_PARTS,
    OPERATORS_BY_TYPE,
    DataModel,
    FieldType,
    ObjectModel,
)

MAX_INT = 2**63 - 1


class UnknownField(InvalidArgument):
    """A field the (cached) data model does not know."""


@dataclass(frozen=True)
class FieldPath:
    path: str  # as the records service takes it: "name", "company.name", "amount.amountMicros"
    type: FieldType
    options: tuple[str, ...] = ()
    integer: bool = False  # amountMicros

    @property
    def operators(self) -> tuple[str, ...]:
        return OPERATORS_BY_TYPE[self.type]


def resolve_path(
    model: DataModel, obj: ObjectModel, segments: Sequence[str], *, prefix: str = ""
) -> FieldPath:
    """The filterable field `segments` names, through many-to-one relations and composites."""
    if not segments:
        raise InvalidArgument("a filter needs a field name", field="filter")
    name, rest = segments[0], list(segments[1:])
    shown = prefix + ".".join(segments)
    here = prefix + name
    field = obj.record_key(name)
    if field is None:
        raise UnknownField(f"unknown field `{name}` on {obj.singular}", field=here)
    if field.is_many_to_one:
        if name == field.foreign_key or not rest:
            if rest:
                raise UnknownField(f"`{here}` has no field `{rest[0]}`", field=shown)
            return FieldPath(f"{field.name}.id", FieldType.UUID)
        target = model.object(field.target)
        if target is None:
            raise UnknownField(f"unknown object `{field.target}`", field=shown)
        inner = resolve_path(model, target, rest, prefix=f"{here}.")
        return FieldPath(f"{field.name}.{inner.path}", inner.type, inner.options, inner.integer)
    if field.is_one_to_many:
        raise InvalidArgument(
            f"`{here}` is a one-to-many relation: filter its records through their own object",
            field=here,
        )
    if field.type is FieldType.CURRENCY:
        if not rest:  # a bare currency compares its amount
            return FieldPath(name, FieldType.NUMBER, integer=True)
        part = CURRENCY_PARTS.get(rest[0])
        if part is None or len(rest) > 1:
            raise UnknownField(
                f"`{here}` has parts amountMicros and currencyCode, not `{rest[0]}`", field=shown
            )
        return FieldPath(f"{name}.{rest[0]}", part, integer=rest[0] == "amountMicros")
    if rest:
        problem = (
            f"nothing may follow the operator `{rest[0]}`"
            if rest[0] in OPERATORS
            else f"unknown operator `{rest[0]}`; expected one of " + ", ".join(OPERATORS)
        )
        raise InvalidArgument(f"`{here}`: {problem}", field=here)
    return FieldPath(name, field.type, field.options)


def check_operator(target: FieldPath, operator: str) -> None:
    if operator not in OPERATORS:
        raise InvalidArgument(
            f"unknown operator `{operator}`; expected one of " + ", ".join(OPERATORS),
            field=target.path,
        )
    if operator not in target.operators:
        raise InvalidArgument(
            f"operator `{operator}` does not apply to {target.type.value} field "
            f"`{target.path}`; it takes " + ", ".join(target.operators),
            field=target.path,
        )


# -- values from query strings ----------------------------------------------------------------


def coerce_text(target: FieldPath, operator: str, raw: Sequence[str]) -> Any:
    """The typed operand of `filter[...][operator]` given its (possibly repeated) values."""
    if operator in ("is", "isNot"):
        if len(raw) != 1 or raw[0].strip().lower() != "null":
            raise InvalidArgument(
                f"`{operator}` takes the literal null (`{target.path}`)", field=target.path
            )
        return None
    if target.type is FieldType.RAW_JSON:
        if len(raw) != 1:
            raise InvalidArgument(f"`{target.path}` `{operator}` is given twice", field=target.path)
        try:
            value = orjson.loads(raw[0])
        except orjson.JSONDecodeError:
            value = raw[0]
        return check_operand(target, operator, value)
    if operator == "in" or target.type is FieldType.MULTI_SELECT:
        items: list[str] = []
        for value in raw:
            if value.startswith("["):
                try:
                    parsed = orjson.loads(value)
                except orjson.JSONDecodeError:
                    raise InvalidArgument(
                        f"`{operator}` takes a JSON array or comma-separated values"
                        f" (`{target.path}`)",
                        field=target.path,
                    ) from None
                if not isinstance(parsed, list):
                    raise InvalidArgument(f"`{operator}` takes an array", field=target.path)
                return check_operand(target, operator, parsed)
            items.extend(part for part in value.split(",") if part != "")
        return [_scalar_from_text(target, item) for item in items]
    if len(raw) != 1:
        raise InvalidArgument(f"`{target.path}` `{operator}` is given twice", field=target.path)
    return _scalar_from_text(target, raw[0])


def _scalar_from_text(target: FieldPath, value: str) -> Any:
    field_type = target.type
    if field_type is FieldType.NUMBER:
        return _number(value, target)
    if field_type is FieldType.BOOLEAN:
        lowered = value.strip().lower()
        if lowered not in ("true", "false"):
            raise InvalidArgument(f"`{target.path}` takes true or false", field=target.path)
        return lowered == "true"
    return check_value(target, "eq", value)


def _number(value: str, target: FieldPath) -> int | float:
    text = value.strip()
    try:
        number: int | float = int(text) if text.lstrip("-").isdecimal() else float(text)
    except ValueError:
        raise InvalidArgument(f"`{target.path}` takes a number", field=target.path) from None
    checked: int | float = check_value(target, "eq", number)
    return checked


# -- values from JSON -------------------------------------------------------------------------


def check_value(target: FieldPath, operator: str, value: Any) -> Any:
    """`value` when it suits the field (for `in`, one member); InvalidArgument otherwise."""
    field_type = target.type
    where = target.path
    if operator in ("is", "isNot"):
        if value is not None and not (isinstance(value, str) and value.lower() == "null"):
            raise InvalidArgument(f"`{operator}` takes null (`{where}`)", field=where)
        return None
    if value is None:
        if operator in ("eq", "neq"):
            return None  # the same as is / isNot
        raise InvalidArgument(f"`{operator}` does not take null; use `is`", field=where)
    if field_type is FieldType.NUMBER:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidArgument(f"`{where}` takes a number", field=where)
        if isinstance(value, int) and abs(value) > MAX_INT:
            raise InvalidArgument(
                f"`{where}`: integers must fit in 64 bits (write larger numbers as decimals)",
                field=where,
            )
        if not math.isfinite(value):
            raise InvalidArgument(f"`{where}` takes a finite number", field=where)
        if target.integer:
            if not float(value).is_integer() or abs(value) > MAX_INT:
                raise InvalidArgument(f"`{where}` takes a 64-bit integer", field=where)
            return int(value)
        return value
    if field_type is FieldType.BOOLEAN:
        if not isinstance(value, bool):
            raise InvalidArgument(f"`{where}` takes true or false", field=where)
        return value
    if field_type is FieldType.RAW_JSON:
        return value
    if not isinstance(value, str):
        raise InvalidArgument(f"`{where}` takes a string", field=where)
    if "\x00" in value:
        raise InvalidArgument(f"`{where}` must not contain NUL characters", field=where)
    if field_type is FieldType.UUID:
        try:
            return str(uuid.UUID(value))
        except ValueError:
            raise InvalidArgument(f"`{where}` takes a UUID", field=where) from None
    if field_type in (FieldType.DATE, FieldType.DATE_TIME):
        if not _is_iso_date(value):
            raise InvalidArgument(f"`{where}` takes an ISO 8601 date or date-time", field=where)
        return value
    options = target.options
    if (
        field_type in (FieldType.SELECT, FieldType.MULTI_SELECT)
        and options
        and value not in options
    ):
        raise InvalidArgument(
            f"`{value}` is not an option of `{where}` ({', '.join(options)})", field=where
        )
    return value


def _is_iso_date(value: str) -> bool:
    try:
        if len(value) == 10:
            dt.date.fromisoformat(value)
        else:
            dt.datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return False
    return True


def check_operand(target: FieldPath, operator: str, operand: Any) -> Any:
    """The operand of a condition, checked against the field and operator (docs/data-model.md:
    MULTI_SELECT eq/neq/contains take arrays, RAW_JSON any JSON, `in` null members)."""
    check_operator(target, operator)
    if operator in ("is", "isNot"):
        return check_value(target, operator, operand)
    if target.type is FieldType.RAW_JSON:
        if operator == "in" and not isinstance(operand, list):
            raise InvalidArgument(f"`in` takes an array (`{target.path}`)", field=target.path)
        return operand
    multi = target.type is FieldType.MULTI_SELECT
    if operator == "in" or (multi and isinstance(operand, list)):
        if not isinstance(operand, list):
            raise InvalidArgument(f"`in` takes an array (`{target.path}`)", field=target.path)
        return [
            None if item is None and operator == "in" else check_value(target, "eq", item)
            for item in operand
        ]
    if operator in ("contains", "startsWith", "endsWith") and not multi:
        if not isinstance(operand, str):
            raise InvalidArgument(f"`{operator}` takes a string", field=target.path)
        return check_value(FieldPath(target.path, FieldType.TEXT), operator, operand)
    return check_value(target, operator, operand)


def normalize_json_filter(
    model: DataModel, obj: ObjectModel, node: Any, *, prefix: Sequence[str] = ()
) -> dict[str, Any]:
    """A JSON filter with every field checked and every operand typed, relation ids as
    `company.id` paths (`companyId` and `company: {eq: id}` included)."""
    if not isinstance(node, Mapping):
        raise InvalidArgument("a filter must be a JSON object", field="filter")
    out: dict[str, Any] = {}
    conditions: list[dict[str, Any]] = []
    for key, operand in node.items():
        if key in ("and", "or"):
            members = operand if isinstance(operand, list) else [operand]
            out[key] = [normalize_json_filter(model, obj, m, prefix=prefix) for m in members]
        elif key == "not":
            out[key] = normalize_json_filter(model, obj, operand, prefix=prefix)
        elif key in OPERATORS:
            if not prefix:
                raise InvalidArgument(f"operator `{key}` must follow a field name", field="filter")
            target = resolve_path(model, obj, prefix)
            conditions.append(_nest(target.path, key, check_operand(target, key, operand)))
        else:
            conditions.append(
                normalize_json_filter(model, obj, operand, prefix=[*prefix, key])
                if isinstance(operand, Mapping)
                else _unknown_operator(prefix, key)
            )
    if conditions:
        out.setdefault("and", []).extend(conditions)
    return out


def _unknown_operator(prefix: Sequence[str], key: str) -> dict[str, Any]:
    where = ".".join(prefix) or key
    if not prefix:
        raise InvalidArgument(f"`{key}` takes an object of operators", field=key)
    raise InvalidArgument(
        f"unknown operator `{key}`; expected one of " + ", ".join(OPERATORS), field=where
    )


def _nest(path: str, operator: str, operand: Any) -> dict[str, Any]:
    node: dict[str, Any] = {operator: operand}
    for segment in reversed(path.split(".")):
        node = {segment: node}
    return node


def parse_bracket_key(key: str) -> list[str] | None:
    """`filter[company][name][eq]` → ["company", "name", "eq"]; None when not that shape."""
    head, _, rest = key.partition("[")
    if not rest or not rest.endswith("]"):
        return None
    segments = rest[:-1].split("][")
    if any(not s or "[" in s or "]" in s for s in segments):
        return None
    return [head, *segments]


def build_filter(
    model: DataModel,
    obj: ObjectModel,
    brackets: Sequence[tuple[list[str], list[str]]],
    json_filter: str | None,
) -> common_pb2.Filter | None:
    """One Filter from `filter[...]` parameters (segments after `filter`, their values) and an
    optional JSON `filter`, all combined with AND."""
    parts: list[dict[str, Any]] = []
    for segments, values in brackets:
        param = "filter[" + "][".join(segments) + "]"
        if segments[-1] in OPERATORS:
            field_segments, operator = segments[:-1], segments[-1]
        else:
            field_segments, operator = segments, "eq"  # filter[name]=Acme means eq
        if not field_segments:
            raise InvalidArgument(f"`{param}` needs a field name", field=param)
        if field_segments[0] in LOGICAL_KEYS:
            raise InvalidArgument(
                'use the JSON form filter={"or": [...]} for and/or/not', field=param
            )
        target = resolve_path(model, obj, field_segments)
        check_operator(target, operator)
        parts.append(_nest(target.path, operator, coerce_text(target, operator, values)))
    if json_filter is not None:
        try:
            raw = orjson.loads(json_filter)
        except orjson.JSONDecodeError:
            raise InvalidArgument("`filter` is not valid JSON", field="filter") from None
        check_nesting(raw)
        parts.append(normalize_json_filter(model, obj, raw))
    if not parts:
        return None
    return parse_filter({"and": parts})
