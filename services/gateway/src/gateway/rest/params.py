"""Query parameters of the REST routes, checked against the object's data model.

    filter[<field>][<op>]=v   typed by the field (`null` for is/isNot, `in` comma-separated or
                              a JSON array, nested `filter[company][name][eq]=`)
    filter={"or": [...]}      the JSON filter language, ANDed with the bracket form
    orderBy[<field>]=ASC|DESC repeatable, in order
    limit, after, fields, depth
Unknown parameters are refused (a misspelt filter must not silently return everything).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from crm.common.v1 import common_pb2
from crmkit.errors import InvalidArgument
from gateway.datamodel.model import SORTABLE_TYPES, DataModel, ObjectModel
from gateway.pagination import page_size
from gateway.rest.filters import UnknownField, build_filter, parse_bracket_key

QueryItems = Sequence[tuple[str, str]]

LIST_PARAMS = frozenset({"filter", "orderBy", "limit", "after", "fields", "depth"})
GET_PARAMS = frozenset({"fields", "depth"})
GROUP_PARAMS = frozenset({"filter", "field", "limit"})
DUPLICATE_PARAMS = frozenset({"limit", "after", "fields"})
CREATE_PARAMS = frozenset({"upsert"})
MAX_LIST_DEPTH = 1
MAX_GET_DEPTH = 2
DEFAULT_GROUPS = 200
MAX_GROUPS = 1000


@dataclass
class Params:
    filter: common_pb2.Filter | None = None
    order_by: list[common_pb2.OrderBy] = field(default_factory=list)
    limit: int = 0
    after: str = ""
    fields: list[str] = field(default_factory=list)
    depth: int = 0
    group_field: str = ""
    upsert: str = ""  # create: match on this unique field (update the record holding the value)


def _integer(value: str, name: str) -> int:
    text = value.strip()
    if not text.lstrip("-").isdecimal() or len(text) > 12:
        raise InvalidArgument(f"`{name}` must be an integer", field=name)
    return int(text)


def _single(values: dict[str, list[str]], name: str) -> str | None:
    found = values.get(name)
    if not found:
        return None
    if len(found) > 1:
        raise InvalidArgument(f"`{name}` is given more than once", field=name)
    return found[0]


def parse_params(
    items: QueryItems,
    model: DataModel,
    obj: ObjectModel,
    *,
    allowed: Collection[str],
    default_depth: int = 0,
    max_depth: int = MAX_LIST_DEPTH,
) -> Params:
    """Every parameter of `items` (order kept), checked; UnknownField for a field the data
    model lacks (the caller may refresh the model and retry)."""
    plain: dict[str, list[str]] = {}
    brackets: dict[tuple[str, ...], list[str]] = {}
    order_by: list[common_pb2.OrderBy] = []
    ordered: set[str] = set()
    for key, value in items:
        segments = parse_bracket_key(key)
        name = segments[0] if segments else key
        if name not in allowed:
            raise InvalidArgument(f"unknown query parameter `{key}`", field=key)
        if segments is None:
            plain.setdefault(key, []).append(value)
        elif name == "filter":
            brackets.setdefault(tuple(segments[1:]), []).append(value)
        elif name == "orderBy" and len(segments) == 2:
            order_by.append(_order(obj, segments[1], value, ordered))
        else:
            raise InvalidArgument(f"unknown query parameter `{key}`", field=key)
    params = Params(order_by=order_by)
    json_filter = _single(plain, "filter")
    if brackets or json_filter is not None:
        params.filter = build_filter(
            model, obj, [(list(k), v) for k, v in brackets.items()], json_filter
        )
    if "orderBy" in plain:
        raise InvalidArgument("use orderBy[<field>]=ASC or DESC", field="orderBy")
    limit = _single(plain, "limit")
    if "field" not in allowed:
        params.limit = page_size(_integer(limit, "limit") if limit is not None else None)
    params.after = _single(plain, "after") or ""
    upsert = _single(plain, "upsert")
    if upsert is not None and not upsert:
        raise InvalidArgument("`upsert` names a unique field", field="upsert")
    params.upsert = upsert or ""
    fields = _single(plain, "fields")
    if fields is not None:
        params.fields = _fields(obj, fields)
    depth = _single(plain, "depth")
    params.depth = default_depth if depth is None else _integer(depth, "depth")
    if not 0 <= params.depth <= max_depth:
        raise InvalidArgument(f"`depth` must be between 0 and {max_depth}", field="depth")
    if "field" in allowed:
        params.group_field = _group_field(obj, _single(plain, "field"))
        params.limit = DEFAULT_GROUPS if limit is None else _integer(limit, "limit")
        if not 1 <= params.limit <= MAX_GROUPS:
            raise InvalidArgument(f"`limit` must be between 1 and {MAX_GROUPS}", field="limit")
    return params


def _order(obj: ObjectModel, name: str, value: str, seen: set[str]) -> common_pb2.OrderBy:
    where = f"orderBy[{name}]"
    found = obj.field(name)
    if found is None:
        raise UnknownField(f"unknown field `{name}` on {obj.singular}", field=name)
    if not found.sortable:
        raise InvalidArgument(f"`{name}` ({found.type.value}) cannot be sorted on", field=name)
    if name in seen:
        raise InvalidArgument(f"`{where}` is given more than once", field=name)
    seen.add(name)
    direction = value.strip().upper()
    if direction not in ("ASC", "DESC"):
        raise InvalidArgument(f"`{where}` must be ASC or DESC", field=name)
    return common_pb2.OrderBy(
        field=name,
        direction=common_pb2.SORT_DIRECTION_DESC
        if direction == "DESC"
        else common_pb2.SORT_DIRECTION_ASC,
    )


def _fields(obj: ObjectModel, value: str) -> list[str]:
    names = [name.strip() for name in value.split(",") if name.strip()]
    if not names:
        raise InvalidArgument("`fields` must name at least one field", field="fields")
    for name in names:
        if obj.record_key(name) is None:
            raise UnknownField(f"unknown field `{name}` on {obj.singular}", field=name)
    return list(dict.fromkeys(names))


def _group_field(obj: ObjectModel, value: str | None) -> str:
    if value is None or not value.strip():
        raise InvalidArgument("`field` names the field to group by", field="field")
    name = value.strip()
    found = obj.record_key(name)
    if found is None:
        raise UnknownField(f"unknown field `{name}` on {obj.singular}", field=name)
    if not (found.type in SORTABLE_TYPES or found.is_many_to_one):
        raise InvalidArgument(f"cannot group by `{name}` ({found.type.value})", field=name)
    return name


__all__ = [
    "DUPLICATE_PARAMS",
    "GET_PARAMS",
    "GROUP_PARAMS",
    "LIST_PARAMS",
    "MAX_GET_DEPTH",
    "Params",
    "UnknownField",
    "parse_params",
]
