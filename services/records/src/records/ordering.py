"""Sort orders and keyset cursors.

Order: the requested fields, then `id` as the tie breaker (in the direction of the last key).
Text (TEXT, EMAIL, PHONE, LINK) sorts by its first `TEXT_KEY_CHARS` characters, the expression its
b-tree index holds (records.ddl): values that share those characters are ordered by `id`.
Nulls sort as if larger than every value (Postgres' default: ASC NULLS LAST, DESC NULLS FIRST),
so reversing every direction reverses the order exactly, which backward paging relies on.

A cursor is opaque base64url of JSON `[signature, [key values...], id]`; the signature names the
order it was made for, so a cursor from another order (or a forged one) is InvalidArgument `after`.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from datetime import date, datetime
from functools import cached_property
from typing import Any
from uuid import UUID

import orjson

from crm.common.v1 import common_pb2
from crm.metadata.v1 import metadata_pb2 as md
from crmkit.errors import InvalidArgument
from records import values
from records.model import UNBOUNDED_TEXT_TYPES, FieldModel, ObjectModel, text_key
from records.predicates import BIGINT, CASTS
from records.sql import Params, quote

MAX_SORT_KEYS = 8


@dataclass(frozen=True)
class SortKey:
    name: str  # as requested ("createdAt", "amount", "company")
    column: str  # physical column
    kind: int  # value type for cursor parameters
    descending: bool
    nullable: bool
    prefixed: bool = False  # keyed on text_key(column): long text

    def expression(self, alias: str) -> str:
        column = f"{alias}.{quote(self.column)}"
        return text_key(column) if self.prefixed else column


@dataclass(frozen=True)
class Order:
    keys: tuple[SortKey, ...]  # always ends with id

    @cached_property  # read once per row of a page
    def signature(self) -> str:
        return ",".join(f"{k.name}:{'D' if k.descending else 'A'}" for k in self.keys)

    def reversed(self) -> Order:
        return Order(tuple(SortKey(k.name, k.column, k.kind, not k.descending, k.nullable,
                                   k.prefixed) for k in self.keys))  # fmt: skip

    def sql(self, alias: str) -> str:
        return ", ".join(
            f"{k.expression(alias)} {'DESC' if k.descending else 'ASC'}" for k in self.keys
        )

    def key_sql(self, alias: str) -> list[str]:
        """The sort key expressions, whose values a cursor carries."""
        return [k.expression(alias) for k in self.keys]


def build_order(obj: ObjectModel, order_by: list[common_pb2.OrderBy]) -> Order:
    if len(order_by) > MAX_SORT_KEYS:
        raise InvalidArgument(f"at most {MAX_SORT_KEYS} orderBy fields", field="orderBy")
    keys: list[SortKey] = []
    seen: set[str] = set()
    for entry in order_by:
        item = obj.field(entry.field)
        if item is None:
            raise InvalidArgument(
                f"orderBy: unknown field {entry.field!r} on {obj.name_singular}",
                field=entry.field or "orderBy",
            )
        key = _sort_key(item, entry)
        if key.column == "id":
            break  # id is unique: nothing after it matters
        if key.column in seen:
            continue
        seen.add(key.column)
        keys.append(key)
    last_desc = keys[-1].descending if keys else False
    for entry in order_by:
        if entry.field == "id":
            last_desc = entry.direction == common_pb2.SORT_DIRECTION_DESC
    keys.append(SortKey("id", "id", md.FIELD_TYPE_UUID, last_desc, False))
    return Order(tuple(keys))


def _sort_key(item: FieldModel, entry: common_pb2.OrderBy) -> SortKey:
    descending = entry.direction == common_pb2.SORT_DIRECTION_DESC
    if item.type == md.FIELD_TYPE_CURRENCY:
        column = next(c.name for c in item.columns if c.part == "amountMicros")
        return SortKey(entry.field, column, BIGINT, descending, True)
    if not item.sortable or not item.columns:
        raise InvalidArgument(
            f"orderBy: {entry.field} cannot be sorted on", field=entry.field or "orderBy"
        )
    kind = md.FIELD_TYPE_UUID if item.is_many_to_one else item.type
    nullable = not (item.is_system and item.name in ("id", "createdAt", "updatedAt"))
    prefixed = item.type in UNBOUNDED_TEXT_TYPES
    return SortKey(entry.field, item.column, kind, descending, nullable, prefixed)


# -- cursors ---------------------------------------------------------------------------------------
def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, (date, UUID)):
        return str(value)
    return value


def encode_cursor(order: Order, row_values: list[Any]) -> str:
    """row_values: the sort key values of a row, id last."""
    payload = orjson.dumps([order.signature, [_plain(v) for v in row_values]])
    return base64.urlsafe_b64encode(payload).decode().rstrip("=")


def decode_cursor(order: Order, cursor: str, field: str) -> list[Any]:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        signature, row_values = orjson.loads(base64.urlsafe_b64decode(padded.encode()))
    except (ValueError, TypeError, binascii.Error, orjson.JSONDecodeError):
        raise InvalidArgument(f"{field}: invalid cursor", field=field) from None
    if signature != order.signature or not isinstance(row_values, list):
        raise InvalidArgument(f"{field}: cursor belongs to another order or query", field=field)
    if len(row_values) != len(order.keys):
        raise InvalidArgument(f"{field}: invalid cursor", field=field)
    checked: list[Any] = []
    for key, value in zip(order.keys, row_values, strict=True):
        if value is None:
            if not key.nullable:
                raise InvalidArgument(f"{field}: invalid cursor", field=field)
            checked.append(None)
            continue
        try:
            checked.append(_cursor_value(key, value))
        except InvalidArgument:
            raise InvalidArgument(f"{field}: invalid cursor", field=field) from None
    return checked


def _cursor_value(key: SortKey, value: Any) -> Any:
    if key.kind == BIGINT:
        return values.parse_bigint(value, key.name)
    if key.kind == md.FIELD_TYPE_DATE_TIME:
        return values.parse_timestamp(value, key.name, truncate=False)
    if key.kind == md.FIELD_TYPE_DATE:
        return values.parse_date(value, key.name)
    if key.kind == md.FIELD_TYPE_NUMBER:
        return float(values.parse_number(value, key.name))
    if key.kind == md.FIELD_TYPE_BOOLEAN:
        return values.parse_boolean(value, key.name)
    if key.kind in (md.FIELD_TYPE_UUID, md.FIELD_TYPE_RELATION):
        return values.canonical_uuid(value, key.name)
    return values.parse_string(value, key.name)


def keyset_predicate(order: Order, alias: str, cursor_values: list[Any], params: Params) -> str:
    """Rows strictly after the cursor in `order`, as one predicate (see keyset_branches)."""
    branches = keyset_branches(order, alias, cursor_values, params)
    return "(" + (" OR ".join(f"({b})" for b in branches) or "FALSE") + ")"


def keyset_branches(
    order: Order, alias: str, cursor_values: list[Any], params: Params
) -> list[str]:
    """Rows strictly after the cursor in `order` (nulls count as the largest values).

    Disjoint predicates, each of which an index on the sort keys (`(key, id)`) can start a
    range scan from: an equality prefix (`=` or `IS NULL`) and then one bound, a row comparison
    where the rest of the keys allow it. A page query runs one ordered, limited scan per branch
    and merges them; an OR of them would not start an index scan and reads like OFFSET.
    """
    placeholders = [
        None if v is None else params.add(v, CASTS[k.kind])
        for k, v in zip(order.keys, cursor_values, strict=True)
    ]
    columns = order.key_sql(alias)
    branches: list[str] = []
    prefix: list[str] = []
    for i, key in enumerate(order.keys):
        rest = order.keys[i:]
        if (
            placeholders[i] is not None
            and all(k.descending == key.descending for k in rest)
            and all(
                not k.nullable and p is not None
                for k, p in zip(rest[1:], placeholders[i + 1 :], strict=True)
            )
        ):
            # Strictly after on this key, or equal and after on the rest: one row comparison.
            op = "<" if key.descending else ">"
            bounds = ", ".join(p for p in placeholders[i:] if p)
            row = f"(({', '.join(columns[i:])}) {op} ({bounds}))"
            if len(rest) == 1:
                row = f"{columns[i]} {op} {placeholders[i]}"
            branches.append(" AND ".join([*prefix, row]))
            if key.nullable and not key.descending:  # nulls come after every value
                branches.append(" AND ".join([*prefix, f"{columns[i]} IS NULL"]))
            return branches
        after = _after(columns[i], placeholders[i], key.descending, key.nullable)
        branches += [" AND ".join([*prefix, part]) for part in after]
        prefix.append(_equal(columns[i], placeholders[i]))
    return branches


def _equal(column: str, placeholder: str | None) -> str:
    return f"{column} IS NULL" if placeholder is None else f"{column} = {placeholder}"


def _after(column: str, placeholder: str | None, descending: bool, nullable: bool) -> list[str]:
    """Disjoint predicates for values strictly after the cursor's on one key."""
    if placeholder is None:  # null is the largest value
        return [f"{column} IS NOT NULL"] if descending else []
    if descending or not nullable:
        return [f"{column} {'<' if descending else '>'} {placeholder}"]
    return [f"{column} > {placeholder}", f"{column} IS NULL"]
