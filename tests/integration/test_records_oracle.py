"""The records core against an oracle: what records answers equals a plain-Python evaluation.

One custom object with a field of every type is created once (metadata calls are slow). Each
example inserts its own rows through the batch endpoint (tagged with a run id that every query
is scoped to), soft-deletes some, then compares, through the public REST and GraphQL API:
the rows and order of a filtered, sorted list; a full cursor walk (no duplicates, no gaps,
stable under ties); the aggregate; groupBy. The oracle mirrors the documented semantics
(docs/api.md): SQL three-valued logic, `contains` case-insensitive, `startsWith`/`endsWith`
case-sensitive, nulls last ascending and first descending, `id` breaking ties in the direction
of the last key, soft-deleted rows hidden. Text order is the database's collation: the oracle
asks Postgres to rank the texts of each example instead of assuming one. TEXT and EMAIL values
sort by their first 256 characters only (docs/data-model.md, "Indexes"): long values sharing
them are ordered by `id`, as ties are.

FUZZ_EXAMPLES raises the examples per test (`make fuzz`); the default keeps `make test` short.
"""

from __future__ import annotations

import asyncio
import functools
import math
import os
import uuid
from datetime import date, datetime
from typing import Any

import asyncpg
import httpx
import orjson
import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from crmstack.stack import Stack
from tests.integration.api_helpers import Api

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "50"))
Row = dict[str, Any]
Filter = dict[str, Any]

# Cased letters are ASCII only: ILIKE folds them the same way under every collation.
TEXT = st.text(alphabet="aAbBz %_\\€😀中", max_size=4)
TEXT_KEY_CHARS = 256  # text sorts by this many leading characters (docs/data-model.md)
# Values that share their sort key and differ after it: ordered by id, filtered by full value.
LONG_TEXT = TEXT.map(lambda tail: "z" * TEXT_KEY_CHARS + tail)
NUMBERS = st.sampled_from([0.0, -0.0, 1.0, 1.5, -2.0, 1e300, -1e300, 5e-324, 3.0])
DAYS = st.sampled_from([date(1, 1, 1), date(2026, 1, 31), date(2026, 2, 1), date(9999, 12, 31)])
MOMENTS = st.sampled_from(
    ["2026-01-01T00:00:00.000Z", "2026-01-01T00:00:00.001Z", "1970-01-01T00:00:00.000Z"]
)
OPTIONS = ("A", "B", "C")
UUIDS = st.sampled_from([str(uuid.UUID(int=n)) for n in (1, 2, 2**127)])
MAILS = st.sampled_from(["a@x.test", "B@x.test", "b@x.test"])
MICROS = st.sampled_from([0, -1, 7, 2**62])
COMPANY_NAMES = ("Acme", "acme", "Bolt")
SORTABLE = ("txt", "num", "flag", "day", "at", "sel", "mail", "uid", "createdAt")


def _nullable(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.none() | strategy


@pytest.fixture(scope="module")
def probe(client: httpx.Client) -> tuple[Api, list[str]]:
    """A workspace with `probe`: every field type, and a relation to three companies."""
    api = Api.signup(client)
    object_id = api.create_object("probe", "probes")
    for name, field_type in (
        ("run", "TEXT"), ("txt", "TEXT"), ("num", "NUMBER"), ("flag", "BOOLEAN"),
        ("day", "DATE"), ("at", "DATE_TIME"), ("mail", "EMAIL"), ("phone", "PHONE"),
        ("link", "LINK"), ("uid", "UUID"), ("cash", "CURRENCY"), ("blob", "RAW_JSON"),
    ):  # fmt: skip
        api.create_field(object_id, name, field_type)
    options = [{"value": value} for value in OPTIONS]
    api.create_field(object_id, "sel", "SELECT", options=options)
    api.create_field(object_id, "tags", "MULTI_SELECT", options=options)
    api.create_field(
        object_id, "ref", "RELATION",
        relation={"targetObjectName": "company", "inverseFieldName": "probes"},
    )  # fmt: skip
    companies = [api.create("companies", {"name": name})["id"] for name in COMPANY_NAMES]
    return api, companies


@st.composite
def rows(draw: st.DrawFn, companies: list[str]) -> list[Row]:
    count = draw(st.integers(0, 12))
    drawn = []
    for _ in range(count):
        cash = draw(_nullable(st.tuples(MICROS, st.sampled_from(["EUR", "USD"]))))
        drawn.append(
            {
                "txt": draw(_nullable(TEXT | LONG_TEXT)),
                "num": draw(_nullable(NUMBERS)),
                "flag": draw(_nullable(st.booleans())),
                "day": draw(_nullable(DAYS.map(date.isoformat))),
                "at": draw(_nullable(MOMENTS)),
                "sel": draw(_nullable(st.sampled_from(OPTIONS))),
                "tags": draw(_nullable(st.lists(st.sampled_from(OPTIONS), unique=True))),
                "mail": draw(_nullable(MAILS)),
                "uid": draw(_nullable(UUIDS)),
                "cash": None
                if cash is None
                else {"amountMicros": cash[0], "currencyCode": cash[1]},
                "blob": draw(_nullable(st.sampled_from([{"k": 1}, [1, "x"], "s"]))),
                "refId": draw(_nullable(st.sampled_from(companies))),
            }
        )
    return drawn


# -- filters -------------------------------------------------------------------------------------

_ORDERED = ("eq", "neq", "in", "gt", "gte", "lt", "lte", "is", "isNot")
_TEXTUAL = (*_ORDERED, "contains", "startsWith", "endsWith")
LEAVES: dict[str, tuple[tuple[str, ...], st.SearchStrategy[Any]]] = {
    "txt": (_TEXTUAL, TEXT | LONG_TEXT),
    "mail": (_TEXTUAL, MAILS),
    "num": (_ORDERED, NUMBERS),
    "flag": (("eq", "neq", "is", "isNot"), st.booleans()),
    "day": (_ORDERED, DAYS.map(date.isoformat)),
    "at": (_ORDERED, MOMENTS),
    # SELECT takes no ordering comparisons (documented: a 400 naming the operators it takes).
    "sel": (
        ("eq", "neq", "in", "contains", "startsWith", "endsWith", "is", "isNot"),
        st.sampled_from(OPTIONS),
    ),
    "uid": (("eq", "neq", "in", "is", "isNot"), UUIDS),
}


@st.composite
def leaf(draw: st.DrawFn, companies: list[str]) -> Filter:
    kind = draw(st.sampled_from([*LEAVES, "tags", "cash", "ref", "refId"]))
    if kind == "tags":
        if draw(st.booleans()):
            return {"tags": {draw(st.sampled_from(["is", "isNot"])): None}}
        return {"tags": {"contains": draw(st.lists(st.sampled_from(OPTIONS), max_size=2))}}
    if kind == "cash":
        op = draw(st.sampled_from(["eq", "gt", "lte", "is"]))
        return {"cash": {"amountMicros": {op: None if op == "is" else draw(MICROS)}}}
    if kind == "ref":
        op = draw(st.sampled_from(["eq", "startsWith", "contains", "is"]))
        operand = None if op == "is" else draw(st.sampled_from(["Acme", "ac", "A", "Bolt"]))
        return {"ref": {"name": {op: operand}}}
    if kind == "refId":
        return {"refId": {"eq": draw(st.sampled_from(companies))}}
    operators, values = LEAVES[kind]
    op = draw(st.sampled_from(operators))
    if op in ("is", "isNot"):
        return {kind: {op: None}}
    if op == "in":
        # No null member: GraphQL's list types refuse one (REST would read it as `is null`).
        return {kind: {"in": draw(st.lists(values, min_size=1, max_size=3))}}
    return {kind: {op: draw(values)}}


def filters(companies: list[str]) -> st.SearchStrategy[Filter]:
    return st.recursive(
        leaf(companies),
        lambda inner: st.one_of(
            st.lists(inner, min_size=1, max_size=3).map(lambda items: {"and": items}),
            st.lists(inner, min_size=1, max_size=3).map(lambda items: {"or": items}),
            inner.map(lambda item: {"not": item}),
        ),
        max_leaves=6,
    )


# -- the oracle ----------------------------------------------------------------------------------


class Oracle:
    """Evaluates filters (SQL three-valued logic: None is unknown; `not` complements what
    matches, as records and crmkit.filters do) and orders over rows."""

    def __init__(self, ranks: dict[str, int], companies: dict[str, str]) -> None:
        self.ranks = ranks
        self.companies = companies

    def key(self, name: str, value: Any) -> Any:
        if value is None:
            return None
        if name in ("txt", "mail", "sel"):
            return self.ranks[value]
        if name == "day":
            return date.fromisoformat(value)
        if name in ("at", "createdAt"):
            return datetime.fromisoformat(value.replace("Z", "+00:00"))
        if name == "uid":
            return uuid.UUID(value)
        return value

    def matches(self, node: Filter, row: Row) -> bool | None:
        results: list[bool | None] = []
        for name, body in node.items():
            if name == "and":
                results.append(_all([self.matches(item, row) for item in body]))
            elif name == "or":
                results.append(_any([self.matches(item, row) for item in body]))
            elif name == "not":  # NOT COALESCE(inner, FALSE): the complement of what matches
                results.append(self.matches(body, row) is not True)
            elif name == "ref":
                results.append(self._related(body["name"], row["refId"]))
            elif name == "cash":
                amount = None if row["cash"] is None else row["cash"]["amountMicros"]
                results.extend(
                    self._compare(op, amount, v, "num") for op, v in body["amountMicros"].items()
                )
            else:
                results.extend(self._compare(op, row[name], v, name) for op, v in body.items())
        return _all(results)

    def _related(self, condition: Filter, ref: str | None) -> bool:
        ((op, operand),) = condition.items()
        name = None if ref is None else self.companies[ref]
        if op == "is":  # no related record, or one whose value is null
            return name is None
        return name is not None and self._compare(op, name, operand, "company") is True

    def _compare(self, op: str, value: Any, operand: Any, name: str) -> bool | None:
        if op == "is" or (op == "eq" and operand is None):
            return value is None
        if op == "isNot" or (op == "neq" and operand is None):
            return value is not None
        if op == "neq":  # IS DISTINCT FROM
            return value is None or self.key(name, value) != self.key(name, operand)
        if op == "in":
            parts: list[bool | None] = []
            chosen = [self.key(name, item) for item in operand if item is not None]
            if chosen:
                parts.append(None if value is None else self.key(name, value) in chosen)
            if None in operand:
                parts.append(value is None)
            return _any(parts)
        if value is None:
            return None
        if name == "tags":
            return set(operand) <= set(value)
        if op == "contains":
            return _fold(operand) in _fold(value)
        if op == "startsWith":
            return bool(value.startswith(operand))
        if op == "endsWith":
            return bool(value.endswith(operand))
        if name == "company":
            return bool(value == operand)
        left, right = self.key(name, value), self.key(name, operand)
        return bool({
            "eq": left == right, "gt": left > right, "gte": left >= right,
            "lt": left < right, "lte": left <= right,
        }[op])  # fmt: skip

    def sort_key(self, name: str, value: Any) -> Any:
        if name in ("txt", "mail") and value is not None:
            return self.ranks[value[:TEXT_KEY_CHARS]]
        return self.key(name, value)

    def ordered(self, items: list[Row], order: list[tuple[str, bool]]) -> list[Row]:
        last_desc = order[-1][1] if order else False

        def compare(a: Row, b: Row) -> int:
            for name, descending in [*order, ("id", last_desc)]:
                left, right = self.sort_key(name, a[name]), self.sort_key(name, b[name])
                if left == right:
                    continue
                # nulls sort as larger than every value
                result = 1 if left is None else -1 if right is None else (1 if left > right else -1)
                return -result if descending else result
            return 0

        return sorted(items, key=functools.cmp_to_key(compare))


def _fold(text: str) -> str:
    return text.translate(str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz"))


def _all(results: list[bool | None]) -> bool | None:
    if any(result is False for result in results):
        return False
    return None if any(result is None for result in results) else True


def _any(results: list[bool | None]) -> bool | None:
    if any(result is True for result in results):
        return True
    return None if any(result is None for result in results) else False


def _texts(node: Any) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [text for value in node.values() for text in _texts(value)]
    if isinstance(node, list):
        return [text for value in node for text in _texts(value)]
    return []


def _collation_ranks(stack: Stack | None, texts: list[str]) -> dict[str, int]:
    """Each text's rank in the database's own collation (the one the workspace columns use)."""
    assert stack is not None

    async def rank() -> list[str]:
        connection = await asyncpg.connect(stack.env["DATABASE_URL"])
        try:
            ordered: list[str] = await connection.fetchval(
                "SELECT coalesce(array_agg(x ORDER BY x), '{}') FROM "
                "(SELECT DISTINCT x FROM unnest($1::text[]) x) d",
                texts,
            )
            return ordered
        finally:
            await connection.close()

    return {text: index for index, text in enumerate(asyncio.run(rank()))}


# -- the test ------------------------------------------------------------------------------------

_COMPARED = ("txt", "num", "flag", "day", "at", "sel", "tags", "mail", "uid", "cash", "refId")


def _row(**values: Any) -> Row:
    """A row of `rows()`'s shape: the given values, null elsewhere."""
    return {name: values.get(name) for name in (*_COMPARED, "blob")}


def _walk(api: Api, params: dict[str, Any], limit: int) -> list[Row]:
    found: list[Row] = []
    after = None
    for _ in range(100):
        page = api.ok(
            "GET",
            "/rest/probes",
            params={**params, "limit": limit, **({"after": after} if after else {})},
        )
        assert len(page["data"]) <= limit
        found += page["data"]
        if not page["pageInfo"]["hasNextPage"]:
            return found
        assert len(page["data"]) == limit, page
        after = page["pageInfo"]["endCursor"]
    raise AssertionError("the cursor walk did not end")


@pytest.mark.skipif(os.environ.get("CRM_BASE_URL") is not None, reason="asks the local database")
def test_lists_aggregates_and_groups_equal_the_oracle(
    stack: Stack | None, probe: tuple[Api, list[str]]
) -> None:
    api, companies = probe
    names = dict(zip(companies, COMPANY_NAMES, strict=True))

    @settings(
        # No shrinking: every step calls the stack, and shrinking one failure took over five
        # minutes; the failing example is printed as drawn.
        max_examples=EXAMPLES, deadline=None, database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )  # fmt: skip
    @given(
        data=rows(companies),
        deleted=st.lists(st.booleans(), max_size=12),
        where=filters(companies),
        order=st.lists(st.tuples(st.sampled_from(SORTABLE), st.booleans()), max_size=3,
                       unique_by=lambda entry: entry[0]),
        limit=st.integers(1, 5),
    )  # fmt: skip
    # Found by this test: avg over NUMBER values past ~1e154 failed ("a number is out of
    # range"): float8's avg accumulates squares. Records now averages them as numeric, rounded
    # so that a subnormal mean does not underflow the cast back (the second example).
    @example(
        data=[_row(num=5e-324), _row(num=0.0)],
        deleted=[],
        where={"num": {"isNot": None}},
        order=[],
        limit=2,
    )
    @example(
        data=[_row(num=1e300), _row(num=-1e300)],
        deleted=[],
        where={"num": {"isNot": None}},
        order=[("num", True)],
        limit=1,
    )
    def check(
        data: list[Row], deleted: list[bool], where: Filter,
        order: list[tuple[str, bool]], limit: int,
    ) -> None:  # fmt: skip
        run = uuid.uuid4().hex
        created = api.ok(
            "POST", "/rest/batch/probes", 201, json=[{"run": run, **row} for row in data]
        )["data"] if data else []  # fmt: skip
        live = []
        for row, record, gone in zip(data, created, deleted + [False] * len(data), strict=False):
            if gone:
                api.ok("DELETE", f"/rest/probes/{record['id']}")
            else:
                live.append({**row, "id": record["id"], "createdAt": record["createdAt"]})
        texts = _texts([live, where]) + list(COMPANY_NAMES)
        texts += [text[:TEXT_KEY_CHARS] for text in texts]
        oracle = Oracle(_collation_ranks(stack, texts), names)
        scoped = {"and": [{"run": {"eq": run}}, where]}
        expected = oracle.ordered([row for row in live if oracle.matches(where, row)], order)
        params: dict[str, Any] = {"filter": orjson.dumps(scoped).decode()}
        for name, descending in order:
            params[f"orderBy[{name}]"] = "DESC" if descending else "ASC"

        walked = _walk(api, params, limit)
        assert [r["id"] for r in walked] == [r["id"] for r in expected], (where, order)
        for got, want in zip(walked, expected, strict=True):
            assert {k: got[k] for k in _COMPARED} == {k: want[k] for k in _COMPARED}

        aggregate = api.data(
            """query($f: ProbeFilter) { probesAggregate(filter: $f) {
                 count sum { num } avg { num } min { num } max { num } } }""",
            {"f": _graphql_filter(scoped)},
        )["probesAggregate"]
        numbers = [row["num"] for row in expected if row["num"] is not None]
        assert aggregate["count"] == len(expected), where
        scale = math.fsum(abs(number) for number in numbers)
        _close(aggregate["sum"]["num"], math.fsum(numbers) if numbers else None, scale)
        mean = math.fsum(numbers) / len(numbers) if numbers else None
        _close(aggregate["avg"]["num"], mean, scale / max(len(numbers), 1))
        _close(aggregate["min"]["num"], min(numbers) if numbers else None)
        _close(aggregate["max"]["num"], max(numbers) if numbers else None)

        groups = api.ok(
            "GET", "/rest/probes/groupBy", params={"field": "sel", "filter": params["filter"]}
        )["data"]
        counts: dict[str | None, list[Row]] = {}
        for row in expected:
            counts.setdefault(row["sel"], []).append(row)
        wanted = sorted(
            counts.items(), key=lambda item: (-len(item[1]), item[0] is None, item[0] or "")
        )
        assert [(g["sel"], g["count"]) for g in groups] == [(k, len(v)) for k, v in wanted], where
        for group, (_, members) in zip(groups, wanted, strict=True):
            values = [row["num"] for row in members if row["num"] is not None]
            scale = math.fsum(abs(number) for number in values)
            _close(group["sum"]["num"], math.fsum(values) if values else None, scale)

    check()


def _graphql_filter(node: Any) -> Any:
    """The same tree as GraphQL variables: `is`/`isNot` take the enum NULL, not null."""
    if isinstance(node, list):
        return [_graphql_filter(item) for item in node]
    if isinstance(node, dict):
        return {
            key: "NULL" if key in ("is", "isNot") else _graphql_filter(value)
            for key, value in node.items()
        }
    return node


def _close(got: Any, want: float | None, scale: float = 0.0) -> None:
    """Equal up to rounding; `scale` (the sum of magnitudes) bounds what cancellation loses,
    1e-300 what subnormal rounding does."""
    if want is None or got is None:
        assert got == want
        return
    assert math.isclose(float(got), want, rel_tol=1e-9, abs_tol=max(1e-9 * scale, 1e-300)), (
        got,
        want,
    )
