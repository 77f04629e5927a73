from __future__ import annotations

from typing import Any

import orjson
import pytest

from crm.common.v1 import common_pb2
from crmkit.errors import InvalidArgument
from crmkit.filters import (
    all_of,
    condition,
    matches,
    parse_filter,
    parse_filter_json,
    referenced_fields,
    resolve_path,
    to_json,
)

ACME = {"id": "c1", "name": "Acme", "employees": 120}
ALICE: dict[str, Any] = {
    "id": "p1",
    "firstName": "Alice",
    "email": "alice@acme.test",
    "phone": None,
    "age": 31,
    "vip": True,
    "tags": ["LEAD", "PARTNER"],
    "birthday": "1994-03-02",
    "createdAt": "2026-11-22T10:00:00.000Z",
    "companyId": "c1",
    "company": ACME,
    "amount": {"amountMicros": 5_000_000, "currencyCode": "EUR"},
}


def _cond(flt: common_pb2.Filter) -> tuple[str, str, Any]:
    assert flt.WhichOneof("node") == "condition"
    name = common_pb2.FilterOperator.Name(flt.condition.operator)
    return flt.condition.field, name, orjson.loads(flt.condition.value_json)


def test_single_condition_is_a_bare_condition() -> None:
    parsed = parse_filter({"stage": {"eq": "QUALIFIED"}})
    assert parsed is not None
    assert _cond(parsed) == ("stage", "FILTER_OPERATOR_EQ", "QUALIFIED")


def test_empty_filter_is_none_and_matches_everything() -> None:
    assert parse_filter({}) is None
    assert parse_filter(None) is None
    assert matches(None, ALICE)


def test_several_fields_and_operators_combine_with_and() -> None:
    parsed = parse_filter({"age": {"gte": 30, "lt": 40}, "firstName": {"startsWith": "Al"}})
    assert parsed is not None
    assert parsed.WhichOneof("node") == "all"
    assert [_cond(child) for child in parsed.all.filters] == [
        ("age", "FILTER_OPERATOR_GTE", 30),
        ("age", "FILTER_OPERATOR_LT", 40),
        ("firstName", "FILTER_OPERATOR_STARTS_WITH", "Al"),
    ]


def test_nested_relation_and_composite_paths_become_dotted_fields() -> None:
    parsed = parse_filter(
        {"company": {"name": {"startsWith": "Ac"}}, "amount": {"amountMicros": {"gt": 0}}}
    )
    assert referenced_fields(parsed) == {"company.name", "amount.amountMicros"}


def test_logical_operators() -> None:
    parsed = parse_filter(
        {
            "or": [{"stage": {"eq": "QUALIFIED"}}, {"stage": {"eq": "PROSPECTING"}}],
            "not": {"name": {"contains": "test"}},
            "and": [{"amount": {"gt": 1}}],
        }
    )
    assert parsed is not None
    kinds = [child.WhichOneof("node") for child in parsed.all.filters]
    assert kinds == ["any", "negated", "condition"]


def test_logic_under_a_field_applies_to_that_field() -> None:
    parsed = parse_filter({"email": {"not": {"eq": "x@y.z"}}})
    assert parsed is not None
    assert parsed.WhichOneof("node") == "negated"
    assert _cond(parsed.negated) == ("email", "FILTER_OPERATOR_EQ", "x@y.z")
    either = parse_filter({"company": {"or": [{"name": {"eq": "A"}}, {"id": {"eq": "c1"}}]}})
    assert referenced_fields(either) == {"company.name", "company.id"}


def test_an_or_with_an_empty_member_matches_everything() -> None:
    assert parse_filter({"or": [{}, {"a": {"eq": 1}}]}) is None


@pytest.mark.parametrize(
    ("value", "field", "message"),
    [
        ([1], "filter", "JSON object"),
        ({"eq": 1}, "filter", "must follow a field name"),
        ({"name": "Acme"}, "name", "object of operators"),
        ({"name": {}}, "name", "object of operators"),
        ({"name": {"eq": "a", "like": "b"}}, "name", "unknown operator `like`"),
        ({"company": {"name": {"has": "x"}}}, "company.name", "unknown operator `has`"),
        ({"email": {"is": "x"}}, "email", "`is` takes null"),
        ({"email": {"isNot": False}}, "email", "`isNot` takes null"),
        ({"stage": {"in": "A,B"}}, "stage", "`in` takes an array"),
        ({"name": {"contains": None}}, "name", "needs a value"),
        ({"name": {"startsWith": 3}}, "name", "takes a string"),
        ({"age": {"gt": True}}, "age", "number or a date"),
        ({"age": {"gt": None}}, "age", "number or a date"),
        ({"or": {"a": 1}}, "a", "object of operators"),
        ({"or": [1]}, "or", "list of filter objects"),
        ({"not": [1]}, "not", "takes a filter object"),
    ],
)
def test_malformed_filters_name_the_field(value: Any, field: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message) as caught:
        parse_filter(value)
    assert caught.value.field == field


def test_deep_nesting_and_huge_filters_are_refused() -> None:
    deep: dict[str, Any] = {"a": {"eq": 1}}
    for _ in range(40):
        deep = {"not": deep}
    with pytest.raises(InvalidArgument, match="nested"):
        parse_filter(deep)
    with pytest.raises(InvalidArgument, match="at most"):
        parse_filter({"or": [{"a": {"eq": i}} for i in range(500)]})


def test_parse_filter_json() -> None:
    assert parse_filter_json(b'{"a": {"eq": 1}}') is not None
    with pytest.raises(InvalidArgument, match="not valid JSON") as caught:
        parse_filter_json(b"{nope", field="filter")
    assert caught.value.field == "filter"


def test_to_json_round_trips() -> None:
    source = {
        "or": [
            {"company": {"name": {"startsWith": "Ac"}}},
            {"not": {"email": {"is": None}}},
        ]
    }
    parsed = parse_filter(source)
    assert parse_filter(to_json(parsed)) == parsed
    assert to_json(parsed) == source


def test_builders() -> None:
    assert all_of(None, None) is None
    built = all_of(condition("company.id", "eq", "c1"), None, condition("age", "gt", 3))
    assert built is not None
    assert len(built.all.filters) == 2
    with pytest.raises(InvalidArgument):
        condition("age", "almost", 3)


def test_resolve_path_reads_nested_records_and_foreign_keys() -> None:
    assert resolve_path(ALICE, "company.name") == "Acme"
    assert resolve_path({"companyId": "c9"}, "company.id") == "c9"
    assert resolve_path({"company": None, "companyId": "c9"}, "company.id") == "c9"
    assert resolve_path(ALICE, "amount.amountMicros") == 5_000_000
    assert resolve_path(ALICE, "nothing.here") is None
    assert resolve_path({"name": "x"}, "name.first") is None


def _m(flt: dict[str, Any], record: dict[str, Any] = ALICE) -> bool:
    return matches(parse_filter(flt), record)


@pytest.mark.parametrize(
    ("flt", "expected"),
    [
        ({"firstName": {"eq": "Alice"}}, True),
        ({"firstName": {"eq": "alice"}}, False),
        ({"firstName": {"neq": "Bob"}}, True),
        ({"firstName": {"in": ["Bob", "Alice"]}}, True),
        ({"firstName": {"in": []}}, False),
        ({"email": {"contains": "ACME"}}, True),
        ({"email": {"contains": "globex"}}, False),
        ({"firstName": {"startsWith": "Al"}}, True),
        ({"firstName": {"startsWith": "al"}}, False),
        ({"email": {"endsWith": ".test"}}, True),
        ({"age": {"gt": 30}}, True),
        ({"age": {"gt": 31}}, False),
        ({"age": {"gte": 31}}, True),
        ({"age": {"lt": 31}}, False),
        ({"age": {"lte": 31}}, True),
        ({"age": {"eq": 31.0}}, True),
        ({"age": {"gt": "30"}}, True),
        ({"vip": {"eq": True}}, True),
        ({"vip": {"eq": 1}}, False),
        ({"firstName": {"neq": "Alice"}}, False),
        ({"phone": {"is": None}}, True),
        ({"phone": {"isNot": None}}, False),
        ({"email": {"isNot": None}}, True),
        ({"missing": {"is": None}}, True),
        ({"birthday": {"gte": "1994-03-02"}}, True),
        ({"birthday": {"gt": "1994-03-01T23:59:59Z"}}, True),
        ({"createdAt": {"eq": "2026-11-22T10:00:00Z"}}, True),
        ({"createdAt": {"lt": "2026-11-22T11:00:00+01:00"}}, False),
        ({"createdAt": {"gte": "2026-11-22"}}, True),
        ({"company": {"name": {"startsWith": "Ac"}}}, True),
        ({"company": {"id": {"eq": "c1"}}}, True),
        ({"company": {"employees": {"gt": 500}}}, False),
        ({"amount": {"amountMicros": {"gte": 5_000_000}}}, True),
        ({"tags": {"in": ["LEAD"]}}, True),
        ({"tags": {"in": ["CUSTOMER"]}}, False),
        ({"tags": {"eq": ["LEAD", "PARTNER"]}}, True),
        ({"or": [{"age": {"lt": 10}}, {"vip": {"eq": True}}]}, True),
        ({"and": [{"age": {"lt": 10}}, {"vip": {"eq": True}}]}, False),
        ({"not": {"age": {"lt": 10}}}, True),
    ],
)
def test_matches(flt: dict[str, Any], expected: bool) -> None:
    assert _m(flt) is expected


def test_null_values_follow_the_records_service() -> None:
    # eq/neq null mean is/isNot; "null" is accepted for is/isNot as REST sends it.
    assert _m({"phone": {"eq": None}})
    assert not _m({"phone": {"neq": None}})
    assert _m({"phone": {"is": "null"}})
    # A comparison with null is unknown...
    assert not _m({"phone": {"eq": "1"}})
    assert not _m({"phone": {"contains": "1"}})
    assert not _m({"phone": {"gt": 1}})
    assert not _m({"phone": {"in": ["1"]}})
    # ...except neq (IS DISTINCT FROM) and `in` holding null.
    assert _m({"phone": {"neq": "1"}})
    assert _m({"phone": {"in": ["1", None]}})
    # `not` counts unknown as false before negating (NOT COALESCE(x, FALSE)).
    assert _m({"not": {"phone": {"eq": "1"}}})
    assert _m({"not": {"and": [{"phone": {"eq": "1"}}, {"age": {"eq": 31}}]}})
    # OR with a true member and AND with a false member still decide.
    assert _m({"or": [{"phone": {"eq": "1"}}, {"age": {"eq": 31}}]})
    assert not _m({"and": [{"phone": {"eq": "1"}}, {"age": {"eq": 31}}]})
    # A missing related record: its fields are null.
    orphan: dict[str, Any] = {"companyId": None, "company": None}
    assert not _m({"company": {"name": {"eq": "Acme"}}}, orphan)
    assert _m({"company": {"name": {"is": None}}}, orphan)


def test_arrays_and_json() -> None:
    assert _m({"tags": {"eq": ["LEAD", "PARTNER"]}})
    assert not _m({"tags": {"eq": ["PARTNER", "LEAD"]}})  # whole array, in order (SQL =)
    assert _m({"tags": {"in": ["CUSTOMER", "LEAD"]}})  # any overlap
    assert _m({"tags": {"contains": ["PARTNER", "LEAD"]}})  # holds all
    assert _m({"tags": {"contains": "LEAD"}})
    assert not _m({"tags": {"contains": ["LEAD", "CUSTOMER"]}})
    profile = {"profile": {"plan": "pro", "seats": [1, 2], "meta": {"a": 1}}}
    assert _m({"profile": {"contains": {"plan": "pro"}}}, profile)
    assert _m({"profile": {"contains": {"seats": [2], "meta": {}}}}, profile)
    assert not _m({"profile": {"contains": {"plan": "free"}}}, profile)
    assert _m({"profile": {"eq": {"plan": "pro", "seats": [1, 2], "meta": {"a": 1}}}}, profile)


def test_lenient_operands() -> None:
    assert _m({"age": {"eq": "31"}})
    assert _m({"vip": {"eq": "true"}})
    assert not _m({"vip": {"eq": "false"}})
    assert _m({"age": {"lte": "31.0"}})


def test_incomparable_values_do_not_match() -> None:
    assert not _m({"firstName": {"gt": 3}})
    assert not _m({"age": {"gt": "abc"}})
    assert not _m({"vip": {"gt": 0}})
    assert not _m({"age": {"contains": "3"}})


def test_a_filter_nested_past_the_limit_is_refused_before_recursing() -> None:
    deep: dict[str, Any] = {"name": {"eq": "x"}}
    for _ in range(5_000):
        deep = {"not": deep}
    with pytest.raises(InvalidArgument) as caught:
        parse_filter(deep, field="trigger.filter")
    assert caught.value.field == "trigger.filter"
    assert "nested" in caught.value.message


def test_an_integer_beyond_64_bits_names_its_field() -> None:
    with pytest.raises(InvalidArgument) as caught:
        parse_filter({"employees": {"gt": 10**26}})
    assert caught.value.field == "employees"
    with pytest.raises(InvalidArgument):
        condition("employees", "in", [1, -(10**30)])
    assert parse_filter({"employees": {"gt": 2**63 - 1}}) is not None
