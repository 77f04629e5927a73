"""What an imported row's columns (CSV) or keys (NDJSON) mean, and CSV cells as JSON values.

A column names a field by its name, its record JSON key (`companyId`) or its label (any case);
`<relation>.<field>` sets a many-to-one relation by a unique field of the related record
(`company.domainName`); `<currency>.amountMicros` / `.currencyCode` set a currency's parts. An
explicit mapping (`{"<column>": "<field path>" | null}`) replaces the header's own names; null
skips the column.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import orjson

from crm.metadata.v1 import metadata_pb2 as md
from crmkit.errors import InvalidArgument
from records import values
from records.ddl import has_unique_index
from records.model import CURRENCY_PARTS, FieldModel, ObjectModel, WorkspaceModel

_TRUE = frozenset({"true", "1", "yes"})
_FALSE = frozenset({"false", "0", "no"})


@dataclass(frozen=True)
class Target:
    """Where a column's value goes: `key` of the record JSON, or the related record found by
    `lookup` (a unique field of `relation`'s target), or a currency's `part`."""

    key: str
    item: FieldModel | None = None
    lookup: FieldModel | None = None
    part: str = ""

    @property
    def path(self) -> str:
        if self.lookup is not None:
            return f"{self.key}.{self.lookup.name}"
        return f"{self.key}.{self.part}" if self.part else self.key


def _field(obj: ObjectModel, name: str) -> FieldModel | None:
    item = obj.field(name)
    if item is None and name.endswith("Id"):
        found = obj.field(name[:-2])
        item = found if found is not None and found.is_many_to_one else None
    return item


def resolve(model: WorkspaceModel, obj: ObjectModel, path: str, column: str) -> Target:
    """The target of field path `path` (given for `column`); 400 naming the column otherwise."""
    head, _, rest = path.partition(".")
    item = _field(obj, head)
    if item is None:
        lowered = path.strip().lower()
        item = next((f for f in obj.active_fields if f.label.lower() == lowered), None)
        rest = ""
    writable = item is not None and (
        item.name in ("id", "ownerId") or not (item.is_one_to_many or item.is_system)
    )
    if item is None or not writable:
        raise InvalidArgument(
            f"column {column!r}: no writable field {path!r} on {obj.name_singular}",
            field=column,
        )
    if not rest:
        return Target(item.key if item.is_many_to_one else item.name, item)
    if item.type == md.FIELD_TYPE_CURRENCY and rest in (part for part, _, _ in CURRENCY_PARTS):
        return Target(item.name, item, part=rest)
    target = model.by_id(item.target_object_id) if item.is_many_to_one else None
    lookup = target.field(rest) if target is not None else None
    if target is None or lookup is None or not has_unique_index(lookup):
        raise InvalidArgument(
            f"column {column!r}: {path!r} must name a unique field of the related record",
            field=column,
        )
    return Target(item.name, item, lookup=lookup)


def header_targets(
    model: WorkspaceModel, obj: ObjectModel, header: list[str], mapping: dict[str, Any] | None
) -> list[Target | None]:
    """One target per CSV column (None: skipped by the mapping)."""
    targets: list[Target | None] = []
    seen: dict[str, str] = {}
    for column in header:
        path: Any = column
        if mapping is not None:
            if column not in mapping:
                raise InvalidArgument(f"column {column!r} is not in the mapping", field=column)
            path = mapping[column]
            if path is None:
                targets.append(None)
                continue
            if not isinstance(path, str):
                raise InvalidArgument(f"mapping of {column!r} must be a field path", field=column)
        target = resolve(model, obj, path, column)
        # A currency set whole and by part: `amount` and `amount.amountMicros`.
        other = seen.get(target.path) or seen.get(target.key if target.part else "")
        other = other or next(
            (seen[seen_path] for seen_path in seen if seen_path.startswith(f"{target.path}.")), None
        )
        if other is not None:
            raise InvalidArgument(
                f"columns {other!r} and {column!r} both set {target.key}", field=column
            )
        seen[target.path] = column
        targets.append(target)
    return targets


# A non-empty CSV cell as the JSON value its field takes; None: the text itself.
CellParser = Callable[[str], Any] | None


def cell_parser(target: Target) -> CellParser:
    """How `target`'s cells are read, chosen once (an import applies it per row)."""
    item = target.lookup or target.item
    if item is None:
        return None
    kind = item.type
    path = target.path
    if target.part == "amountMicros" or kind == md.FIELD_TYPE_NUMBER:
        return partial(_number, path=path, integer=bool(target.part))
    if kind == md.FIELD_TYPE_BOOLEAN:
        return partial(_boolean, path=path)
    if kind == md.FIELD_TYPE_MULTI_SELECT:
        return partial(_options, path=path)
    if kind == md.FIELD_TYPE_RAW_JSON or (kind == md.FIELD_TYPE_CURRENCY and not target.part):
        return partial(_json, path=path)
    return None


def written_as_parsed(parse: CellParser, write: values.Writer) -> bool:
    """Whether `write` returns every value `parse` gives unchanged, so a caller may skip it:
    `_number` gives finite floats and ints below 2**53 (what `values.parse_number` keeps),
    `_boolean` a bool."""
    if not isinstance(parse, partial) or parse.keywords.get("integer"):
        return False
    return (parse.func is _number and write is values.parse_number) or (
        parse.func is _boolean and write is values.parse_boolean
    )


def cell(target: Target, text: str) -> Any:
    """A CSV cell as the JSON value the field takes (empty: null)."""
    if text == "":
        return None
    parse = cell_parser(target)
    return text if parse is None else parse(text)


def _boolean(text: str, path: str) -> bool:
    lowered = text.strip().lower()
    if lowered in _TRUE or lowered in _FALSE:
        return lowered in _TRUE
    raise values.fail(path, "a boolean is true or false")


def _options(text: str, path: str) -> Any:
    if text.startswith("["):
        return _json(text, path)
    return [part.strip() for part in text.split(",") if part.strip()]


def _number(text: str, path: str, *, integer: bool) -> Any:
    try:
        number = int(text) if integer else float(text)
    except ValueError:
        raise values.fail(path, "not a number") from None
    if isinstance(number, float):
        if not math.isfinite(number):
            raise values.fail(path, "not a finite number")
        if number.is_integer() and abs(number) < 2**53:
            return int(number)
    return number


def _json(text: str, path: str) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        raise values.fail(path, "not valid JSON") from None


@dataclass
class Row:
    """One imported row: its record JSON and the relations to find by a unique value."""

    line: int
    data: dict[str, Any]
    lookups: dict[str, tuple[FieldModel, Any]]  # relation name -> (unique field, value)


def csv_row(line: int, targets: list[Target | None], cells: list[str]) -> Row:
    if len(cells) != len(targets):
        raise values.fail("row", f"{len(cells)} columns where the header has {len(targets)}")
    row = Row(line, {}, {})
    for target, text in zip(targets, cells, strict=True):
        if target is None:
            continue
        value = cell(target, text)
        if target.lookup is not None:
            if value is not None:
                row.lookups[target.key] = (target.lookup, value)
            else:
                row.data[target.key] = None
        elif target.part:
            row.data.setdefault(target.key, {})[target.part] = value
        else:
            row.data[target.key] = value
    return row


def ndjson_row(model: WorkspaceModel, obj: ObjectModel, line: int, text: bytes) -> Row:
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError:
        raise values.fail("row", "not valid JSON") from None
    if not isinstance(data, dict):
        raise values.fail("row", "each line is a JSON object")
    row = Row(line, {}, {})
    whole: set[str] = set()  # keys given whole, which no part may set too
    for key, value in data.items():
        if "." not in key:
            if key in row.data:  # its parts came first
                raise values.fail(key, f"{key} is given whole and by part")
            row.data[key] = value
            whole.add(key)
            continue
        target = resolve(model, obj, key, key)
        if target.lookup is None:
            parts = row.data.setdefault(target.key, {})
            if not isinstance(parts, dict) or target.key in whole:
                raise values.fail(key, f"{target.key} is given whole and by part")
            parts[target.part] = value
        elif value is None:
            row.data[target.key] = None
        else:
            row.lookups[target.key] = (target.lookup, value)
    return row
