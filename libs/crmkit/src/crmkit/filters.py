"""The API filter language: JSON filters parsed into `crm.common.v1.Filter`, evaluated in memory.

One grammar for every surface (REST `filter=`, GraphQL filter inputs, subscription and workflow
trigger filters):

    {"stage": {"eq": "QUALIFIED"}}                      one condition
    {"employees": {"gte": 10, "lt": 50}}                several operators on a field: AND
    {"name": {...}, "stage": {...}}                     several fields: AND
    {"or": [{...}, {...}]}, {"and": [...]}, {"not": {...}}
    {"company": {"name": {"startsWith": "Ac"}}}         through a relation ("company.name")
    {"amount": {"amountMicros": {"gt": 0}}}             a composite's part ("amount.amountMicros")
    {"email": {"is": null}}, {"email": {"isNot": null}}

The parser checks the shape (operators and operand kinds), not field names: the records service
knows the data model and names the unknown field. `matches()` evaluates a parsed filter against a
record dict the way the records service's SQL does (docs/data-model.md, "Filters"), so an
in-memory check (subscriptions, workflow triggers) agrees with a query:

- a comparison with a null value is unknown, except `neq` (IS DISTINCT FROM: null matches
  `neq "x"`), `is`/`isNot`, and `in` whose array holds null;
- `eq`/`neq` with a null operand mean `is`/`isNot`;
- `and`/`or` are three-valued; `not` counts an unknown as false before negating, so
  `not (x eq 1)` matches records where x is null;
- arrays (MULTI_SELECT): `eq` compares the whole array, `in` any overlap, `contains` all given
  values; objects (RAW_JSON): `contains` is JSON containment;
- `contains` on text is case-insensitive, `startsWith`/`endsWith` are case-sensitive;
- operands are lenient like REST's: "42", "true" and ISO dates compare with numbers, booleans and
  dates; `company.id` reads the foreign key `companyId`.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from typing import Any

import orjson

from crm.common.v1 import common_pb2
from crmkit.errors import InvalidArgument
from crmkit.jsondepth import MAX_JSON_DEPTH, check_depth

Filter = common_pb2.Filter
FilterOperator = common_pb2.FilterOperator

AND, OR, NOT = "and", "or", "not"
LOGICAL_KEYS = frozenset({AND, OR, NOT})

OPERATORS: dict[str, common_pb2.FilterOperator] = {
    "eq": common_pb2.FILTER_OPERATOR_EQ,
    "neq": common_pb2.FILTER_OPERATOR_NEQ,
    "in": common_pb2.FILTER_OPERATOR_IN,
    "contains": common_pb2.FILTER_OPERATOR_CONTAINS,
    "startsWith": common_pb2.FILTER_OPERATOR_STARTS_WITH,
    "endsWith": common_pb2.FILTER_OPERATOR_ENDS_WITH,
    "gt": common_pb2.FILTER_OPERATOR_GT,
    "gte": common_pb2.FILTER_OPERATOR_GTE,
    "lt": common_pb2.FILTER_OPERATOR_LT,
    "lte": common_pb2.FILTER_OPERATOR_LTE,
    "is": common_pb2.FILTER_OPERATOR_IS,
    "isNot": common_pb2.FILTER_OPERATOR_IS_NOT,
}
OPERATOR_NAMES: dict[int, str] = {value: name for name, value in OPERATORS.items()}
STRING_OPERATORS = frozenset({"contains", "startsWith", "endsWith"})
ORDER_OPERATORS = frozenset({"gt", "gte", "lt", "lte"})
NULL_OPERATORS = frozenset({"is", "isNot"})

# Nesting deeper than this is refused: it guards the recursive parser and the SQL it becomes.
MAX_DEPTH = 16
MAX_CONDITIONS = 200


def parse_filter(value: Any, *, field: str = "filter") -> Filter | None:
    """The Filter a JSON filter describes; None for an empty filter (matches every record).

    Raises InvalidArgument naming the field (dotted path) or `field` for a malformed shape.
    """
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidArgument("a filter must be a JSON object", field=field)
    check_nesting(value, field=field)
    parser = _Parser(field)
    return parser.node(value, prefix="", depth=0)


def parse_filter_json(raw: bytes | str, *, field: str = "filter") -> Filter | None:
    """Like parse_filter, from JSON text."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise InvalidArgument("the filter is not valid JSON", field=field) from None
    return parse_filter(value, field=field)


def check_nesting(value: Any, *, field: str = "filter") -> None:
    """InvalidArgument naming `field` when a JSON filter nests deeper than any valid filter may,
    checked without recursion before anything recurses over it."""
    check_depth(value, MAX_JSON_DEPTH, field=field, what="the filter")


class _Parser:
    def __init__(self, root_field: str) -> None:
        self.root_field = root_field
        self.conditions = 0

    def node(self, value: Mapping[str, Any], *, prefix: str, depth: int) -> Filter | None:
        if depth > MAX_DEPTH:
            raise InvalidArgument(
                f"the filter is nested more than {MAX_DEPTH} levels", field=self.root_field
            )
        parts: list[Filter] = []
        for key, operand in value.items():
            if not isinstance(key, str) or not key:
                raise InvalidArgument(
                    "filter keys must be non-empty strings", field=self.root_field
                )
            if key in OPERATORS:
                # Reached inside `not`/`and`/`or` under a field: {"email": {"not": {"eq": ..}}}.
                if not prefix:
                    raise InvalidArgument(
                        f"operator `{key}` must follow a field name", field=self.root_field
                    )
                parts.append(self._condition(prefix, key, operand))
            elif key in (AND, OR):
                parts.extend(self._logical(key, operand, prefix=prefix, depth=depth))
            elif key == NOT:
                if not isinstance(operand, Mapping):
                    raise InvalidArgument("`not` takes a filter object", field=prefix or NOT)
                inner = self.node(operand, prefix=prefix, depth=depth + 1)
                if inner is not None:
                    parts.append(Filter(negated=inner))
            else:
                parts.extend(self._field(key, operand, prefix=prefix, depth=depth))
        return _all(parts)

    def _logical(self, key: str, operand: Any, *, prefix: str, depth: int) -> list[Filter]:
        where = f"{prefix}.{key}" if prefix else key
        if isinstance(operand, Mapping):
            operand = [operand]
        if not isinstance(operand, list) or not all(isinstance(x, Mapping) for x in operand):
            raise InvalidArgument(f"`{key}` takes a list of filter objects", field=where)
        children = [self.node(child, prefix=prefix, depth=depth + 1) for child in operand]
        if key == AND:
            present = [child for child in children if child is not None]
            combined = _all(present)
            return [combined] if combined is not None else []
        # OR: an empty member matches everything, so the whole OR does.
        if not children or any(child is None for child in children):
            return []
        if len(children) == 1:
            only = children[0]
            assert only is not None
            return [only]
        return [Filter(any=common_pb2.FilterGroup(filters=[c for c in children if c is not None]))]

    def _field(self, key: str, operand: Any, *, prefix: str, depth: int) -> list[Filter]:
        path = f"{prefix}.{key}" if prefix else key
        if prefix and not isinstance(operand, Mapping):
            # {"name": {"has": "x"}}: a misspelt operator rather than a path into `name`.
            raise InvalidArgument(
                f"unknown operator `{key}` for `{prefix}`; expected one of " + ", ".join(OPERATORS),
                field=prefix,
            )
        if not isinstance(operand, Mapping) or not operand:
            raise InvalidArgument(
                f'`{path}` takes an object of operators, e.g. {{"eq": ...}}', field=path
            )
        keys = list(operand)
        operators = [k for k in keys if k in OPERATORS]
        if operators and len(operators) != len(keys):
            unknown = next(k for k in keys if k not in OPERATORS)
            raise InvalidArgument(
                f"unknown operator `{unknown}` for `{path}`; expected one of "
                + ", ".join(OPERATORS),
                field=path,
            )
        if not operators:
            # A path into a relation or a composite field (company.name, amount.amountMicros).
            nested = self.node(operand, prefix=path, depth=depth + 1)
            return [nested] if nested is not None else []
        return [self._condition(path, name, operand[name]) for name in operators]

    def _condition(self, path: str, operator: str, operand: Any) -> Filter:
        self.conditions += 1
        if self.conditions > MAX_CONDITIONS:
            raise InvalidArgument(
                f"a filter may hold at most {MAX_CONDITIONS} conditions", field=self.root_field
            )
        check_operand(path, operator, operand)
        return Filter(
            condition=common_pb2.Condition(
                field=path, operator=OPERATORS[operator], value_json=_operand_json(path, operand)
            )
        )


def _operand_json(path: str, operand: Any) -> bytes:
    try:
        return orjson.dumps(operand)
    except orjson.JSONEncodeError:  # an integer beyond 64 bits (or nesting beyond orjson's)
        raise InvalidArgument(
            f"`{path}`: integers must fit in 64 bits (write larger numbers as decimals)",
            field=path,
        ) from None


def check_operand(path: str, operator: str, operand: Any) -> None:
    """InvalidArgument naming `path` when `operand` cannot go with `operator`."""
    if operator in NULL_OPERATORS:
        if operand is not None and not (isinstance(operand, str) and operand.lower() == "null"):
            raise InvalidArgument(f"`{operator}` takes null (`{path}`)", field=path)
    elif operator == "in":
        if not isinstance(operand, list):
            raise InvalidArgument(f"`in` takes an array (`{path}`)", field=path)
    elif operator == "contains":
        # text: a substring; MULTI_SELECT: values it must all hold; RAW_JSON: contained JSON.
        if operand is None:
            raise InvalidArgument(f"`contains` needs a value (`{path}`)", field=path)
    elif operator in STRING_OPERATORS:
        if not isinstance(operand, str):
            raise InvalidArgument(f"`{operator}` takes a string (`{path}`)", field=path)
    elif operator in ORDER_OPERATORS and (
        isinstance(operand, bool) or not isinstance(operand, int | float | str)
    ):
        raise InvalidArgument(f"`{operator}` takes a number or a date (`{path}`)", field=path)


def _all(parts: list[Filter]) -> Filter | None:
    if not parts:
        return None
    if len(parts) == 1:
        return parts[0]
    return Filter(all=common_pb2.FilterGroup(filters=parts))


# -- building and printing --------------------------------------------------------------------


def condition(field: str, operator: str, value: Any) -> Filter:
    """One condition, e.g. condition("company.id", "eq", company_id)."""
    if operator not in OPERATORS:
        raise InvalidArgument(f"unknown operator `{operator}`", field=field)
    check_operand(field, operator, value)
    return Filter(
        condition=common_pb2.Condition(
            field=field, operator=OPERATORS[operator], value_json=_operand_json(field, value)
        )
    )


def all_of(*filters: Filter | None) -> Filter | None:
    """AND of the given filters (None members are ignored; None when nothing is left)."""
    return _all([f for f in filters if f is not None])


def to_json(flt: Filter | None) -> dict[str, Any]:
    """The JSON filter a Filter corresponds to (parse_filter(to_json(f)) is equivalent to f)."""
    if flt is None:
        return {}
    kind = flt.WhichOneof("node")
    if kind == "condition":
        cond = flt.condition
        out: dict[str, Any] = {OPERATOR_NAMES[cond.operator]: orjson.loads(cond.value_json)}
        for segment in reversed(cond.field.split(".")):
            out = {segment: out}
        return out
    if kind == "all":
        return {AND: [to_json(child) for child in flt.all.filters]}
    if kind == "any":
        return {OR: [to_json(child) for child in flt.any.filters]}
    if kind == "negated":
        return {NOT: to_json(flt.negated)}
    return {}


def referenced_fields(flt: Filter | None) -> set[str]:
    """Every dotted field path a filter compares."""
    found: set[str] = set()
    if flt is None:
        return found
    kind = flt.WhichOneof("node")
    if kind == "condition":
        found.add(flt.condition.field)
    elif kind in ("all", "any"):
        group = flt.all if kind == "all" else flt.any
        for child in group.filters:
            found |= referenced_fields(child)
    elif kind == "negated":
        found |= referenced_fields(flt.negated)
    return found


# -- in-memory evaluation ---------------------------------------------------------------------

_DATE_LIKE = re.compile(r"^\d{4}-\d{2}-\d{2}")


def matches(flt: Filter | None, record: Mapping[str, Any]) -> bool:
    """Whether `record` satisfies `flt` (None matches everything), with SQL's null semantics."""
    if flt is None:
        return True
    return _evaluate(flt, record) is True


def _evaluate(flt: Filter, record: Mapping[str, Any]) -> bool | None:
    """Three-valued: True, False or None (unknown, as SQL's NULL)."""
    kind = flt.WhichOneof("node")
    if kind == "condition":
        cond = flt.condition
        return _compare(
            OPERATOR_NAMES.get(cond.operator, ""),
            resolve_path(record, cond.field),
            orjson.loads(cond.value_json) if cond.value_json else None,
        )
    if kind == "all":
        result: bool | None = True
        for child in flt.all.filters:
            value = _evaluate(child, record)
            if value is False:
                return False
            if value is None:
                result = None
        return result
    if kind == "any":
        any_result: bool | None = False
        for child in flt.any.filters:
            value = _evaluate(child, record)
            if value is True:
                return True
            if value is None:
                any_result = None
        return any_result
    if kind == "negated":
        return _evaluate(flt.negated, record) is not True  # NOT COALESCE(inner, FALSE)
    return True


def resolve_path(record: Mapping[str, Any], path: str) -> Any:
    """The value at a dotted path; `company.id` falls back to the foreign key `companyId`."""
    current: Any = record
    segments = path.split(".")
    for index, segment in enumerate(segments):
        if not isinstance(current, Mapping):
            return None
        if segment in current and current[segment] is not None:
            current = current[segment]
            continue
        rest = segments[index + 1 :]
        if rest == ["id"] and f"{segment}Id" in current:
            return current[f"{segment}Id"]
        return None
    return current


def _compare(operator: str, value: Any, operand: Any) -> bool | None:
    if operator == "is" or (operator == "eq" and operand is None):
        return value is None
    if operator == "isNot" or (operator == "neq" and operand is None):
        return value is not None
    if operator == "neq":
        if value is None:
            return True  # IS DISTINCT FROM
        equal = _compare("eq", value, operand)
        return equal is not True
    if operator == "in":
        if not isinstance(operand, list):
            return False
        if value is None:
            return True if any(item is None for item in operand) else None
        if isinstance(value, list):
            return any(item in value for item in operand if item is not None)
        return any(_equal(value, item) for item in operand if item is not None)
    if value is None:
        return None
    if operator == "eq":
        if isinstance(value, list):
            expected = operand if isinstance(operand, list) else [operand]
            return value == expected
        return _equal(value, operand)
    if operator == "contains":
        if isinstance(value, list):
            wanted = operand if isinstance(operand, list) else [operand]
            return all(item in value for item in wanted)
        if isinstance(value, dict):
            return _contains_json(value, operand)
        if isinstance(value, str) and isinstance(operand, str):
            return operand.casefold() in value.casefold()
        return False
    if operator in ("startsWith", "endsWith"):
        if not isinstance(value, str) or not isinstance(operand, str):
            return False
        return value.startswith(operand) if operator == "startsWith" else value.endswith(operand)
    if operator in ORDER_OPERATORS:
        ordered = _order(value, operand)
        if ordered is None:
            return False
        return {
            "gt": ordered > 0,
            "gte": ordered >= 0,
            "lt": ordered < 0,
            "lte": ordered <= 0,
        }[operator]
    return False


def _contains_json(value: Any, operand: Any) -> bool:
    """jsonb `@>`: every key/value of operand is in value (arrays: every element found)."""
    if isinstance(operand, dict):
        return isinstance(value, dict) and all(
            key in value and _contains_json(value[key], item) for key, item in operand.items()
        )
    if isinstance(operand, list):
        if not isinstance(value, list):
            return False
        return all(any(_contains_json(v, item) for v in value) for item in operand)
    if isinstance(value, list):
        return any(_contains_json(v, operand) for v in value)
    return bool(value == operand) and type(value) is type(operand)


def _equal(value: Any, operand: Any) -> bool:
    if isinstance(value, bool):
        if isinstance(operand, str):
            return operand.strip().lower() == ("true" if value else "false")
        return isinstance(operand, bool) and value == operand
    if isinstance(operand, bool):
        return False
    if isinstance(value, int | float) and isinstance(operand, int | float):
        return value == operand
    if isinstance(value, str) and isinstance(operand, str):
        if value == operand:
            return True
        if _DATE_LIKE.match(value) and _DATE_LIKE.match(operand):
            left, right = _instant(value), _instant(operand)
            return left is not None and left == right
        return False
    if isinstance(value, int | float) and isinstance(operand, str):
        number = _number(operand)
        return number is not None and number == value
    return bool(value == operand)


def _order(value: Any, operand: Any) -> int | None:
    """-1, 0 or 1 comparing value with operand; None when they cannot be compared."""
    if isinstance(value, bool) or isinstance(operand, bool):
        return None
    left: Any
    right: Any
    if isinstance(value, int | float):
        left = value
        right = operand if isinstance(operand, int | float) else _number(operand)
        if right is None:
            return None
    elif isinstance(value, str) and isinstance(operand, str):
        if _DATE_LIKE.match(value) and _DATE_LIKE.match(operand):
            left, right = _instant(value), _instant(operand)
            if left is None or right is None:
                left, right = value, operand
        else:
            left, right = value, operand
    else:
        return None
    return int(left > right) - int(left < right)


def _number(text: Any) -> float | None:
    if not isinstance(text, str):
        return None
    try:
        return float(text)
    except ValueError:
        return None


def _instant(text: str) -> dt.datetime | None:
    """An ISO 8601 date or date-time as an aware UTC datetime (dates at midnight UTC)."""
    try:
        if len(text) == 10:
            day = dt.date.fromisoformat(text)
            return dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC)
        parsed = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return parsed.astimezone(dt.UTC)


def describe(flt: Filter | None) -> str:
    """Compact JSON of a filter, for logs and error messages."""
    return orjson.dumps(to_json(flt)).decode()


__all__ = [
    "LOGICAL_KEYS",
    "OPERATORS",
    "OPERATOR_NAMES",
    "Filter",
    "all_of",
    "check_nesting",
    "check_operand",
    "condition",
    "describe",
    "matches",
    "parse_filter",
    "parse_filter_json",
    "referenced_fields",
    "resolve_path",
    "to_json",
]
