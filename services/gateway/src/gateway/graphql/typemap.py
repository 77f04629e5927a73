"""The table from field type to GraphQL types: output annotation, input annotation and filter
input. Scalar filter inputs are shared by every schema; enum-based ones are generated."""

from __future__ import annotations

import datetime as dt
import enum
import keyword
import uuid
from dataclasses import dataclass
from typing import Any

import strawberry
from strawberry.scalars import JSON
from strawberry.types.unset import UNSET

from gateway.datamodel.model import OPERATORS_BY_TYPE, FieldType
from gateway.graphql.scalars import BigInt

# Generated classes live in this module's namespace (Strawberry looks annotations up there).
GENERATED_MODULE = __name__


@strawberry.enum(name="SortDirection", description="Sort order of a field.")
class SortDirection(enum.Enum):
    ASC = "ASC"
    DESC = "DESC"


@strawberry.enum(
    name="FilterNull", description="Operand of `is` / `isNot`: `is: NULL` (or `is: null`)."
)
class FilterNull(enum.Enum):
    NULL = "NULL"


def python_name(name: str) -> str:
    """A Python identifier for a GraphQL name (`in` → `in_`)."""
    return f"{name}_" if keyword.iskeyword(name) or name in ("self", "root", "info") else name


def operands(operand: Any, operators: tuple[str, ...], **overrides: Any) -> dict[str, Any]:
    """Operand annotation per operator: `in` takes a list, `is`/`isNot` FilterNull, the rest
    `operand` (unless overridden, e.g. contains=str)."""
    result: dict[str, Any] = {}
    for operator in operators:
        if operator in overrides:
            result[operator] = overrides[operator]
        elif operator in ("is", "isNot"):
            result[operator] = FilterNull
        elif operator == "in":
            result[operator] = list[operand]
        else:
            result[operator] = operand
    return result


def operator_input(name: str, operators: dict[str, Any], description: str) -> type:
    """An input type with one optional field per operator, typed as given."""
    annotations: dict[str, Any] = {}
    namespace: dict[str, Any] = {"__module__": GENERATED_MODULE}
    for operator, annotation in operators.items():
        attribute = python_name(operator)
        annotations[attribute] = annotation | None
        namespace[attribute] = strawberry.field(name=operator, default=UNSET)
    namespace["__annotations__"] = annotations
    cls = type(name, (), namespace)
    return strawberry.input(cls, name=name, description=description)


def _scalar_filter(name: str, operand: Any, field_type: FieldType, description: str) -> type:
    return operator_input(name, operands(operand, OPERATORS_BY_TYPE[field_type]), description)


StringFilter = _scalar_filter("StringFilter", str, FieldType.TEXT, "Conditions on a text field.")
UUIDFilter = _scalar_filter("UUIDFilter", uuid.UUID, FieldType.UUID, "Conditions on an id.")
NumberFilter = _scalar_filter("NumberFilter", float, FieldType.NUMBER, "Conditions on a number.")
BigIntFilter = _scalar_filter("BigIntFilter", BigInt, FieldType.NUMBER, "Conditions on an integer.")
BooleanFilter = _scalar_filter("BooleanFilter", bool, FieldType.BOOLEAN, "Conditions on a boolean.")
DateFilter = _scalar_filter(
    "DateFilter", dt.date, FieldType.DATE, "Conditions on a date (date or date-time operands)."
)
DateTimeFilter = _scalar_filter(
    "DateTimeFilter", dt.datetime, FieldType.DATE_TIME, "Conditions on a date-time."
)
JSONFilter = _scalar_filter(
    "JSONFilter", JSON, FieldType.RAW_JSON, "Conditions on JSON; contains is JSON containment."
)


def select_filter(name: str, graphql_enum: Any, field_type: FieldType) -> type:
    """Filter input of a SELECT (values are options; text operators take strings) or a
    MULTI_SELECT (eq the whole array, in any overlap, contains every given value)."""
    operators = OPERATORS_BY_TYPE[field_type]
    if field_type is FieldType.MULTI_SELECT:
        values = list[graphql_enum]
        typed = operands(graphql_enum, operators, eq=values, neq=values, contains=values)
        return operator_input(name, typed, "Conditions on a multi-select field.")
    typed = operands(graphql_enum, operators, contains=str, startsWith=str, endsWith=str)
    return operator_input(name, typed, "Conditions on a select field.")


# For select fields whose options are not valid GraphQL enum values (served as strings).
StringSelectFilter = select_filter("StringSelectFilter", str, FieldType.SELECT)
StringMultiSelectFilter = select_filter("StringMultiSelectFilter", str, FieldType.MULTI_SELECT)


@strawberry.type(name="Currency", description="An amount in micros of a currency.")
class Currency:
    # Named as the record's keys: the default resolver reads dicts by attribute name.
    amountMicros: BigInt | None = None  # noqa: N815
    currencyCode: str | None = None  # noqa: N815


@strawberry.input(name="CurrencyInput", description="An amount in micros of a currency.")
class CurrencyInput:
    amountMicros: BigInt | None = UNSET  # noqa: N815
    currencyCode: str | None = UNSET  # noqa: N815


@strawberry.input(name="CurrencyFilter", description="Conditions on a currency amount.")
class CurrencyFilter:
    amountMicros: BigIntFilter | None = UNSET  # type: ignore[valid-type]  # noqa: N815
    currencyCode: StringFilter | None = UNSET  # type: ignore[valid-type]  # noqa: N815


@strawberry.input(
    name="RelationInput",
    description='Connects (`{connect: "<id>"}`) or clears (`{disconnect: true}`) a relation.',
)
class RelationInput:
    connect: uuid.UUID | None = UNSET
    disconnect: bool | None = UNSET


@dataclass(frozen=True)
class ScalarMapping:
    output: Any
    filter: type | None


SCALARS: dict[FieldType, ScalarMapping] = {
    FieldType.UUID: ScalarMapping(uuid.UUID, UUIDFilter),
    FieldType.TEXT: ScalarMapping(str, StringFilter),
    FieldType.EMAIL: ScalarMapping(str, StringFilter),
    FieldType.PHONE: ScalarMapping(str, StringFilter),
    FieldType.LINK: ScalarMapping(str, StringFilter),
    FieldType.NUMBER: ScalarMapping(float, NumberFilter),
    FieldType.BOOLEAN: ScalarMapping(bool, BooleanFilter),
    FieldType.DATE: ScalarMapping(dt.date, DateFilter),
    FieldType.DATE_TIME: ScalarMapping(dt.datetime, DateTimeFilter),
    FieldType.RAW_JSON: ScalarMapping(JSON, JSONFilter),
    FieldType.CURRENCY: ScalarMapping(Currency, CurrencyFilter),
}
"""Field types whose GraphQL types do not depend on the field (SELECT, MULTI_SELECT and
RELATION are generated per field)."""

INPUT_SCALARS: dict[FieldType, Any] = {
    **{field_type: mapping.output for field_type, mapping in SCALARS.items()},
    FieldType.CURRENCY: CurrencyInput,
}
