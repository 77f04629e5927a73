"""`crm.common.v1.Filter` trees compiled to SQL predicates over a workspace table.

Every operand is a bound parameter with an explicit cast; paths through many-to-one relations
(`company.name`) become EXISTS subqueries on the related table (soft-deleted related records do
not match); `<relation>.id` compares the foreign key column directly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from crm.common.v1 import common_pb2
from crm.metadata.v1 import metadata_pb2 as md
from crmkit.authz import Access
from crmkit.filters import OPERATOR_NAMES
from records import search_ddl, values
from records.ddl import btree_indexed
from records.model import (
    SORTABLE_TYPES,
    TEXT_KEY_CHARS,
    TEXT_TYPES,
    UNBOUNDED_TEXT_TYPES,
    FieldModel,
    ObjectModel,
    WorkspaceModel,
    text_key,
)
from records.sql import Params, quote

Op = common_pb2.FilterOperator
BIGINT = -1  # pseudo type of CURRENCY.amountMicros

CASTS: dict[int, str] = {
    md.FIELD_TYPE_TEXT: "text",
    md.FIELD_TYPE_EMAIL: "text",
    md.FIELD_TYPE_PHONE: "text",
    md.FIELD_TYPE_LINK: "text",
    md.FIELD_TYPE_SELECT: "text",
    md.FIELD_TYPE_MULTI_SELECT: "text",
    md.FIELD_TYPE_NUMBER: "float8",
    md.FIELD_TYPE_BOOLEAN: "boolean",
    md.FIELD_TYPE_DATE: "text::date",
    md.FIELD_TYPE_DATE_TIME: "text::timestamptz",
    md.FIELD_TYPE_UUID: "uuid",
    md.FIELD_TYPE_RELATION: "uuid",
    md.FIELD_TYPE_RAW_JSON: "jsonb",
    BIGINT: "int8",
}
ARRAY_CASTS: dict[int, str] = {
    md.FIELD_TYPE_DATE: "text[]::date[]",
    md.FIELD_TYPE_DATE_TIME: "text[]::timestamptz[]",
}
_FRAGMENTS = frozenset({Op.FILTER_OPERATOR_CONTAINS, Op.FILTER_OPERATOR_STARTS_WITH,
                        Op.FILTER_OPERATOR_ENDS_WITH})  # fmt: skip
# A fragment of fewer characters has no trigram to look up (the GIN would read all of itself);
# a longer one is looked up by its first PREFILTER_CHARS (folded): fewer trigrams to intersect,
# and still a necessary condition (a part of the value is in the text if the value is).
PREFILTER_MIN_CHARS = 3
PREFILTER_CHARS = 256
# Characters whose upper and lower case unaccent folds apart (its rules map one form and not the
# other: U+0280 to R, U+01A6 unchanged): `contains` (ILIKE) matches a character against either form
# of the text's, so a value holding one gets no prefilter. tests/integration/test_records_indexes
# checks that the database's unaccent and lower fold no other character apart.
FOLD_CASE_EXCEPTIONS = frozenset(
    map(chr, (0x196, 0x269, 0x1A6, 0x280, 0x1F6, 0x195, 0x220, 0x19E, 0x3F9, 0x3F2, 0xA7AC,
              0x261, 0xA7AD, 0x26C, 0xA7AE, 0x26A, 0xA7B2, 0x29D, 0xA7C5, 0x282, 0xA7C6, 0x1D8E))
)  # fmt: skip
# LIKE's wildcards and escape character in the folded value, escaped in SQL after folding:
# unaccent turns the fullwidth forms U+FF05, U+FF3F and U+FF3C into %, _ and \.
_LIKE_ESCAPED = r"replace(replace(replace({}, '\', '\\'), '%', '\%'), '_', '\_')"
_COMPARISONS = {Op.FILTER_OPERATOR_GT: ">", Op.FILTER_OPERATOR_GTE: ">=",
                Op.FILTER_OPERATOR_LT: "<", Op.FILTER_OPERATOR_LTE: "<="}  # fmt: skip
MAX_DEPTH = 32

AccessOf = Callable[[ObjectModel], Access | None]


def array_cast(kind: int) -> str:
    return ARRAY_CASTS.get(kind) or CASTS[kind] + "[]"


def like_pattern(text: str, prefix: bool, suffix: bool) -> str:
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return ("%" if prefix else "") + escaped + ("%" if suffix else "")


def owner_predicate(alias: str, access: Access | None, params: Params) -> str:
    """`ownerId = <principal>` for own-records-only access; empty when every record is visible."""
    if access is None or not access.own_records_only:
        return ""
    if not access.owner_id:
        return "FALSE"
    return f'{alias}."ownerId" = {params.add(access.owner_id, "uuid")}'


@dataclass(frozen=True)
class Target:
    """The column a condition compares, with the type its operands take."""

    expression: str
    kind: int
    item: FieldModel | None
    path: str
    prefixed: bool = False  # indexed long text: its b-tree holds text_key(column), not the column
    search: str = ""  # the object's search column, when the field is in it (fragment filters)


def references_field(node: common_pb2.Filter, name: str) -> bool:
    which = node.WhichOneof("node")
    if which in ("all", "any"):
        group = node.all if which == "all" else node.any
        return any(references_field(child, name) for child in group.filters)
    if which == "negated":
        return references_field(node.negated, name)
    if which == "condition":
        return node.condition.field.split(".", 1)[0] == name
    return False


class PredicateCompiler:
    def __init__(
        self, model: WorkspaceModel, params: Params, access_of: AccessOf, *, prefix: str = "f"
    ) -> None:
        self.model = model
        self.params = params
        self.access_of = access_of
        self.prefix = prefix
        self._aliases = 0

    def compile(self, node: common_pb2.Filter, obj: ObjectModel, alias: str) -> str:
        return self._node(node, obj, alias, 0)

    def _node(self, node: common_pb2.Filter, obj: ObjectModel, alias: str, depth: int) -> str:
        if depth > MAX_DEPTH:
            raise values.fail("filter", f"filter nested deeper than {MAX_DEPTH} levels")
        which = node.WhichOneof("node")
        if which is None:
            return "TRUE"
        if which in ("all", "any"):
            group = node.all if which == "all" else node.any
            parts = [self._node(child, obj, alias, depth + 1) for child in group.filters]
            if not parts:
                return "TRUE"
            joiner = " AND " if which == "all" else " OR "
            return "(" + joiner.join(parts) + ")"
        if which == "negated":
            return f"(NOT COALESCE({self._node(node.negated, obj, alias, depth + 1)}, FALSE))"
        return self._condition(node.condition, obj, alias, node.condition.field)

    # -- conditions ------------------------------------------------------------------------------
    def _condition(
        self, condition: common_pb2.Condition, obj: ObjectModel, alias: str, path: str
    ) -> str:
        segments = condition.field.split(".")
        return self._path(condition, obj, alias, segments, path)

    def _path(
        self,
        condition: common_pb2.Condition,
        obj: ObjectModel,
        alias: str,
        segments: list[str],
        path: str,
    ) -> str:
        head, rest = segments[0], segments[1:]
        item = obj.field(head)
        if item is None:
            raise values.fail(path, f"unknown field {head!r} on {obj.name_singular}")
        if item.is_one_to_many:
            raise values.fail(path, f"cannot filter through the one-to-many relation {head}")
        if item.is_many_to_one and head == item.name and rest:
            if rest == ["id"]:
                column = f"{alias}.{quote(item.column)}"
                return self._compare(condition, Target(column, md.FIELD_TYPE_UUID, item, path))
            return self._nested(condition, item, alias, rest, path)
        if item.type == md.FIELD_TYPE_CURRENCY:
            part = rest[0] if rest else "amountMicros"
            if len(rest) > 1 or part not in ("amountMicros", "currencyCode"):
                raise values.fail(path, "currency fields filter on amountMicros or currencyCode")
            physical = next(c.name for c in item.columns if c.part == part)
            kind = BIGINT if part == "amountMicros" else md.FIELD_TYPE_TEXT
            return self._compare(condition, Target(f"{alias}.{quote(physical)}", kind, item, path))
        if rest:
            raise values.fail(path, f"{head} has no sub-fields")
        kind = md.FIELD_TYPE_UUID if item.is_many_to_one else item.type
        # The key condition helps only where the (key, id) btree exists; elsewhere it would only
        # hide the column's statistics from the planner (an expression it has none for).
        prefixed = kind in UNBOUNDED_TEXT_TYPES and btree_indexed(obj, item)
        column = f"{alias}.{quote(item.column)}"
        search = ""
        if condition.operator in _FRAGMENTS:
            search = search_column(obj, item, alias)
        return self._compare(condition, Target(column, kind, item, path, prefixed, search))

    def _nested(
        self,
        condition: common_pb2.Condition,
        item: FieldModel,
        alias: str,
        rest: list[str],
        path: str,
    ) -> str:
        target = self.model.by_id(item.target_object_id)
        if target is None:
            raise values.fail(path, f"unknown field {item.name!r}")
        access = self.access_of(target)
        self._aliases += 1
        inner = f"{self.prefix}{self._aliases}"
        scope = [f"{inner}.id = {alias}.{quote(item.column)}", f'{inner}."deletedAt" IS NULL']
        if access is None:
            scope.append("FALSE")
        else:
            owner = owner_predicate(inner, access, self.params)
            if owner:
                scope.append(owner)
        nested = self._path(condition, target, inner, rest, path)
        head = f"SELECT 1 FROM {target.table} {inner} WHERE " + " AND ".join(scope)
        if condition.operator == Op.FILTER_OPERATOR_IS:
            # "company.name is null": no related record, or one whose value is null.
            return f"(NOT EXISTS ({head} AND NOT ({nested})))"
        return f"(EXISTS ({head} AND {nested}))"

    def _compare(self, condition: common_pb2.Condition, target: Target) -> str:
        op = condition.operator
        name = OPERATOR_NAMES.get(op)
        if name is None:
            raise values.fail(target.path, "missing or unknown filter operator")
        raw = _load(condition.value_json, target.path)
        column = target.expression
        kind = target.kind
        if op in (Op.FILTER_OPERATOR_IS, Op.FILTER_OPERATOR_IS_NOT):
            if raw is not None and not (isinstance(raw, str) and raw.lower() == "null"):
                raise values.fail(target.path, f"{name} takes null (e.g. {name}: null)")
            return f"({column} IS {'NOT ' if op == Op.FILTER_OPERATOR_IS_NOT else ''}NULL)"
        if op == Op.FILTER_OPERATOR_IN:
            return self._in(target, raw, name)
        if op in (Op.FILTER_OPERATOR_EQ, Op.FILTER_OPERATOR_NEQ):
            negate = op == Op.FILTER_OPERATOR_NEQ
            if raw is None:
                return f"({column} IS {'NOT ' if negate else ''}NULL)"
            value = self._operand(target, raw, array_ok=kind == md.FIELD_TYPE_MULTI_SELECT)
            placeholder = self._bind(target, value)
            if target.prefixed and not negate:
                # The key first, so the (key, id) b-tree finds the rows; the value decides.
                key = f"{text_key(column)} = {text_key(placeholder)}"
                return f"({key} AND {column} = {placeholder})"
            return f"({column} {'IS DISTINCT FROM' if negate else '='} {placeholder})"
        if raw is None:
            raise values.fail(target.path, f"{name} needs a value")
        if op in _COMPARISONS:
            if (kind not in SORTABLE_TYPES and kind != BIGINT) or kind == md.FIELD_TYPE_BOOLEAN:
                raise values.fail(target.path, f"{name} does not apply to this field's type")
            placeholder = self._bind(target, self._operand(target, raw))
            return f"({column} {_COMPARISONS[op]} {placeholder})"
        return self._text_match(target, op, raw, name)

    def _text_match(self, target: Target, op: int, raw: Any, name: str) -> str:
        column = target.expression
        if target.kind == md.FIELD_TYPE_MULTI_SELECT and op == Op.FILTER_OPERATOR_CONTAINS:
            items = raw if isinstance(raw, list) else [raw]
            chosen = [self._operand(target, entry) for entry in items]
            return f"({column} @> {self.params.add(chosen, 'text[]')})"
        if target.kind == md.FIELD_TYPE_RAW_JSON and op == Op.FILTER_OPERATOR_CONTAINS:
            return f"({column} @> {self.params.add(values.check_json(raw, target.path), 'jsonb')})"
        if target.kind not in TEXT_TYPES:
            raise values.fail(target.path, f"{name} applies to text fields only")
        text = values.parse_string(raw, target.path, lenient=True)
        prefilter = self._prefilter(target, text, any_case=op == Op.FILTER_OPERATOR_CONTAINS)
        if op == Op.FILTER_OPERATOR_CONTAINS:
            pattern, operator = like_pattern(text, True, True), "ILIKE"
        else:
            prefix = op == Op.FILTER_OPERATOR_ENDS_WITH
            pattern, operator = like_pattern(text, prefix, not prefix), "LIKE"
        exact = f"{column} {operator} {self.params.add(pattern, 'text')}"
        return f"({prefilter} AND {exact})" if prefilter else f"({exact})"

    def _prefilter(self, target: Target, text: str, *, any_case: bool) -> str:
        """`<search column> LIKE '%<folded value>%'`, which the object's search GIN serves: true
        of every row the exact condition matches (the column is the folded text of the
        searchable fields joined by spaces; folding maps each character on its own and, but for
        FOLD_CASE_EXCEPTIONS, folds a character as it folds its lower case), so the exact
        condition beside it stays the recheck. Empty when the field is not in the search column,
        the value is too short to look up, or (`any_case`) holds an exception."""
        if not target.search or len(text) < PREFILTER_MIN_CHARS:
            return ""
        part = text[:PREFILTER_CHARS]
        if any_case and any(c in FOLD_CASE_EXCEPTIONS or c.lower() in FOLD_CASE_EXCEPTIONS
                            for c in part):  # fmt: skip
            return ""
        value = self.params.add(part, "text")
        folded = f"left({search_ddl.FOLD}({value}), {PREFILTER_CHARS})"
        return f"{target.search} LIKE '%' || {_LIKE_ESCAPED.format(folded)} || '%'"

    def _in(self, target: Target, raw: Any, name: str) -> str:
        if isinstance(raw, str) and target.kind != md.FIELD_TYPE_RAW_JSON:
            raw = raw.split(",")
        if not isinstance(raw, list):
            raise values.fail(target.path, f"{name} takes an array")
        include_null = any(entry is None for entry in raw)
        chosen = [self._operand(target, entry) for entry in raw if entry is not None]
        column = target.expression
        parts = []
        if chosen:
            if target.kind == md.FIELD_TYPE_MULTI_SELECT:
                parts.append(f"{column} && {self.params.add(chosen, 'text[]')}")
            elif target.kind == md.FIELD_TYPE_RAW_JSON:
                parts.append(f"{column} = ANY({self.params.add(chosen, 'jsonb[]')})")
            else:
                listed = self.params.add(chosen, array_cast(target.kind))
                if target.prefixed:
                    keys = self.params.add([value[:TEXT_KEY_CHARS] for value in chosen], "text[]")
                    parts.append(f"({text_key(column)} = ANY({keys}) AND {column} = ANY({listed}))")
                else:
                    parts.append(f"{column} = ANY({listed})")
        if include_null:
            parts.append(f"{column} IS NULL")
        return "(" + (" OR ".join(parts) if parts else "FALSE") + ")"

    def _operand(self, target: Target, raw: Any, *, array_ok: bool = False) -> Any:
        if array_ok and isinstance(raw, list):
            return [self._operand(target, entry) for entry in raw]
        if target.kind == BIGINT:
            return values.parse_bigint(raw, target.path, lenient=True)
        return values.operand(target.kind, target.item, raw, target.path)

    def _bind(self, target: Target, value: Any) -> str:
        if target.kind == md.FIELD_TYPE_MULTI_SELECT:
            return self.params.add(value if isinstance(value, list) else [value], "text[]")
        return self.params.add(value, CASTS[target.kind])


def search_column(obj: ObjectModel, item: FieldModel, alias: str) -> str:
    """`alias.<search column>` of `obj` when `item` is one of its searchable fields, else ""."""
    fields = search_ddl.searchable_fields(obj)
    if item not in fields:
        return ""
    return f"{alias}.{quote(search_ddl.column_name(fields))}"


def _load(value_json: bytes, path: str) -> Any:
    if not value_json:
        return None
    try:
        return orjson.loads(value_json)
    except orjson.JSONDecodeError:
        raise values.fail(path, "filter value is not valid JSON") from None
