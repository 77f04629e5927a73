"""REST query parameters and filters, checked against a workspace's data model."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.requests import Request

from crm.common.v1 import common_pb2
from crmkit.errors import InvalidArgument
from crmkit.filters import to_json
from gateway.datamodel.model import DataModel
from gateway.rest.params import (
    GET_PARAMS,
    GROUP_PARAMS,
    LIST_PARAMS,
    MAX_GET_DEPTH,
    UnknownField,
    parse_params,
)
from gateway.rest.routes import Target

ID = "11111111-1111-1111-1111-111111111111"


def _list(model: DataModel, query: list[tuple[str, str]], obj: str = "person") -> Any:
    found = model.object(obj)
    assert found is not None
    return parse_params(query, model, found, allowed=LIST_PARAMS)


def _filter(model: DataModel, *query: tuple[str, str], obj: str = "person") -> Any:
    return to_json(_list(model, list(query), obj).filter)


def test_defaults(model: DataModel) -> None:
    params = _list(model, [])
    assert params.filter is None
    assert params.order_by == []
    assert params.limit == 50
    assert params.after == ""
    assert params.fields == []
    assert params.depth == 0


def test_typed_bracket_filters(model: DataModel) -> None:
    assert _filter(model, ("filter[firstName][eq]", "Ada")) == {"firstName": {"eq": "Ada"}}
    assert _filter(model, ("filter[firstName]", "Ada")) == {"firstName": {"eq": "Ada"}}
    assert _filter(model, ("filter[vip][eq]", "TRUE")) == {"vip": {"eq": True}}
    assert _filter(model, ("filter[employees][gt]", "10"), obj="company") == {
        "employees": {"gt": 10}
    }
    assert _filter(model, ("filter[employees][lte]", "2.5"), obj="company") == {
        "employees": {"lte": 2.5}
    }
    assert _filter(model, ("filter[email][is]", "null")) == {"email": {"is": None}}
    assert _filter(model, ("filter[email][isNot]", "NULL")) == {"email": {"isNot": None}}
    assert _filter(model, ("filter[firstName][in]", "Ada,Alan")) == {
        "firstName": {"in": ["Ada", "Alan"]}
    }
    assert _filter(model, ("filter[firstName][in]", '["a,b","c"]')) == {
        "firstName": {"in": ["a,b", "c"]}
    }
    assert _filter(model, ("filter[tags][contains]", "LEAD,PARTNER")) == {
        "tags": {"contains": ["LEAD", "PARTNER"]}
    }
    assert _filter(model, ("filter[profile][contains]", '{"plan": "pro"}')) == {
        "profile": {"contains": {"plan": "pro"}}
    }
    assert _filter(model, ("filter[birthday][gte]", "2026-01-01T10:00:00Z")) == {
        "birthday": {"gte": "2026-01-01T10:00:00Z"}
    }


def test_relation_and_composite_paths(model: DataModel) -> None:
    assert _filter(model, ("filter[company][id][eq]", ID)) == {"company": {"id": {"eq": ID}}}
    assert _filter(model, ("filter[companyId][eq]", ID)) == {"company": {"id": {"eq": ID}}}
    assert _filter(model, ("filter[company][eq]", ID)) == {"company": {"id": {"eq": ID}}}
    assert _filter(model, ("filter[company][name][startsWith]", "Ac")) == {
        "company": {"name": {"startsWith": "Ac"}}
    }
    assert _filter(model, ("filter[amount][amountMicros][gt]", "5000000"), obj="opportunity") == {
        "amount": {"amountMicros": {"gt": 5_000_000}}
    }
    assert _filter(model, ("filter[amount][currencyCode][eq]", "EUR"), obj="opportunity") == {
        "amount": {"currencyCode": {"eq": "EUR"}}
    }
    assert _filter(model, ("filter[amount][gte]", "1"), obj="opportunity") == {"amount": {"gte": 1}}


def test_several_filters_combine_with_and_json_included(model: DataModel) -> None:
    flt = _filter(
        model,
        ("filter[firstName][startsWith]", "A"),
        ("filter", '{"or": [{"vip": {"eq": true}}, {"companyId": {"eq": "' + ID + '"}}]}'),
    )
    assert flt == {
        "and": [
            {"firstName": {"startsWith": "A"}},
            {"or": [{"vip": {"eq": True}}, {"company": {"id": {"eq": ID}}}]},
        ]
    }


@pytest.mark.parametrize(
    ("query", "field", "unknown"),
    [
        (("filter[nope][eq]", "1"), "nope", True),
        (("filter[company][nope][eq]", "1"), "company.nope", True),
        (("filter[firstName][like]", "1"), "firstName", False),
        (("filter[firstName][eq][x]", "1"), "firstName", False),
        (("filter[vip][gt]", "1"), "vip", False),
        (("filter[vip][eq]", "perhaps"), "vip", False),
        (("filter[email][is]", "x"), "email", False),
        (("filter[company][id][eq]", "not-a-uuid"), "company.id", False),
        (("filter[birthday][gt]", "soon"), "birthday", False),
        (("filter[tags][in]", "LEAD,NOPE"), "tags", False),
        (("filter[opportunities][eq]", "1"), "opportunities", False),
        (("filter[and][x][eq]", "1"), "filter[and][x][eq]", False),
        (("filter", "{"), "filter", False),
        (("filter", '{"eq": 1}'), "filter", False),
        (("filter", '{"firstName": {"near": 1}}'), "firstName", False),
        (("filter", '{"firstName": "Ada"}'), "firstName", False),
        (("filters[x]", "1"), "filters[x]", False),
        (("orderBy", "firstName"), "orderBy", False),
        (("orderBy[firstName]", "UP"), "firstName", False),
        (("orderBy[nope]", "ASC"), "nope", True),
        (("orderBy[profile]", "ASC"), "profile", False),
        (("limit", "201"), "limit", False),
        (("limit", "0"), "limit", False),
        (("limit", "x"), "limit", False),
        (("fields", "firstName,nope"), "nope", True),
        (("fields", ","), "fields", False),
        (("depth", "2"), "depth", False),
        (("depth", "\u00b3"), "depth", False),  # a digit int() refuses (found by schemathesis)
        (("limit", "\u00b2"), "limit", False),
    ],
)
def test_bad_parameters_name_the_field(
    model: DataModel, query: tuple[str, str], field: str, unknown: bool
) -> None:
    with pytest.raises(InvalidArgument) as caught:
        _list(model, [query])
    assert caught.value.field == field, caught.value
    # Only an unknown name is worth re-checking the data model for.
    assert isinstance(caught.value, UnknownField) is unknown


def test_order_by_keeps_parameter_order(model: DataModel) -> None:
    params = _list(
        model,
        [("orderBy[lastName]", "desc"), ("orderBy[company]", "ASC"), ("orderBy[id]", "ASC")],
    )
    assert [(o.field, o.direction) for o in params.order_by] == [
        ("lastName", common_pb2.SORT_DIRECTION_DESC),
        ("company", common_pb2.SORT_DIRECTION_ASC),
        ("id", common_pb2.SORT_DIRECTION_ASC),
    ]
    with pytest.raises(InvalidArgument, match="more than once"):
        _list(model, [("orderBy[lastName]", "ASC"), ("orderBy[lastName]", "DESC")])


def test_get_and_group_parameters(model: DataModel) -> None:
    person = model.object("person")
    assert person is not None
    got = parse_params(
        [("fields", "firstName, company"), ("depth", "2")],
        model,
        person,
        allowed=GET_PARAMS,
        default_depth=1,
        max_depth=MAX_GET_DEPTH,
    )
    assert got.fields == ["firstName", "company"]
    assert got.depth == 2
    with pytest.raises(InvalidArgument) as caught:
        parse_params([("limit", "5")], model, person, allowed=GET_PARAMS)
    assert caught.value.field == "limit"
    grouped = parse_params(
        [("field", "company"), ("filter[vip][eq]", "true")], model, person, allowed=GROUP_PARAMS
    )
    assert grouped.group_field == "company"
    assert grouped.limit == 200
    assert to_json(grouped.filter) == {"vip": {"eq": True}}
    for bad, field in (([], "field"), ([("field", "profile")], "profile")):
        with pytest.raises(InvalidArgument) as caught:
            parse_params(bad, model, person, allowed=GROUP_PARAMS)
        assert caught.value.field == field
    with pytest.raises(InvalidArgument) as caught:
        parse_params(
            [("field", "jobTitle"), ("limit", "1001")], model, person, allowed=GROUP_PARAMS
        )
    assert caught.value.field == "limit"


def _target(model: DataModel) -> Any:
    found = model.object("person")
    assert found is not None
    return Target(None, common_pb2.Principal(workspace_id="w"), model, found)  # type: ignore[arg-type]


def _request(query: bytes) -> Any:
    return Request({"type": "http", "query_string": query, "headers": []})


async def test_a_query_string_is_checked_once_per_data_model(model: DataModel) -> None:
    query = b"limit=20&filter%5BjobTitle%5D%5Beq%5D=Engineer"
    first = await _target(model).params(_request(query), LIST_PARAMS)
    again = await _target(model).params(_request(query), LIST_PARAMS)
    assert again is first  # the answer kept on the model
    assert first.limit == 20
    assert to_json(first.filter) == {"jobTitle": {"eq": "Engineer"}}
    other = await _target(model).params(_request(b"limit=5"), LIST_PARAMS)
    assert other.limit == 5
    assert other.filter is None
    # the same query checked for what another route allows is checked again
    with pytest.raises(InvalidArgument):
        await _target(model).params(_request(query), GET_PARAMS)


async def test_a_bad_query_is_refused_every_time(model: DataModel) -> None:
    for _ in range(2):
        with pytest.raises(InvalidArgument):
            await _target(model).params(_request(b"limit=many"), LIST_PARAMS)
