"""Every filter operator, groups, negation and nested relation paths, over real gRPC + SQL."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from crm.common.v1 import common_pb2
from crmstack.stack import Stack
from tests.integration.records_client import (
    Op,
    Workspace,
    all_of,
    any_of,
    cond,
    error_of,
    provision,
)


@pytest.fixture(scope="module")
def data(stack: Stack | None) -> tuple[Workspace, dict[str, Any]]:
    if stack is None:
        pytest.skip("calls services over gRPC: needs the local launcher")
    ws = provision(stack)
    acme = ws.create("company", {"name": "Acme Corp", "employees": 100})
    globex = ws.create("company", {"name": "Globex", "employees": 5})
    people = ws.create_many(
        "person",
        [
            {"firstName": "Ada", "lastName": "Lovelace", "email": "ada@acme.test",
             "company": {"connect": acme["id"]}},
            {"firstName": "Alan", "lastName": "Turing", "email": "alan@globex.test",
             "company": {"connect": globex["id"]}},
            {"firstName": "Grace", "lastName": None, "email": "grace@acme.test",
             "company": {"connect": acme["id"]}},
            {"firstName": "100%_real", "lastName": "Percent"},
        ],
    )  # fmt: skip
    ws.create_many(
        "opportunity",
        [
            {"name": "Big", "amount": 5000, "stage": "QUALIFIED", "closeDate": "2026-03-01",
             "company": {"connect": acme["id"]}},
            {"name": "Small", "amount": 10, "stage": "PROSPECTING", "closeDate": "2026-01-15",
             "company": {"connect": globex["id"]}},
            {"name": "None", "stage": "LOST"},
        ],
    )  # fmt: skip
    return ws, {"acme": acme, "globex": globex, "people": people}


def names(ws: Workspace, obj: str, node: common_pb2.Filter, key: str = "firstName") -> set[str]:
    rows, _ = ws.list(obj, filter=node, first=200)
    return {row[key] for row in rows}


def test_text_operators(data: tuple[Workspace, dict[str, Any]]) -> None:
    ws, _ = data
    assert names(ws, "person", cond("firstName", Op.FILTER_OPERATOR_EQ, "Ada")) == {"Ada"}
    assert names(ws, "person", cond("lastName", Op.FILTER_OPERATOR_NEQ, "Turing")) == {
        "Ada", "Grace", "100%_real"
    }  # fmt: skip
    assert names(ws, "person", cond("firstName", Op.FILTER_OPERATOR_IN, ["Ada", "Alan"])) == {
        "Ada", "Alan"
    }  # fmt: skip
    assert names(ws, "person", cond("email", Op.FILTER_OPERATOR_CONTAINS, "ACME")) == {
        "Ada", "Grace"
    }  # fmt: skip
    assert names(ws, "person", cond("firstName", Op.FILTER_OPERATOR_STARTS_WITH, "A")) == {
        "Ada", "Alan"
    }  # fmt: skip
    assert names(ws, "person", cond("firstName", Op.FILTER_OPERATOR_STARTS_WITH, "a")) == set()
    assert names(ws, "person", cond("email", Op.FILTER_OPERATOR_ENDS_WITH, "@globex.test")) == {
        "Alan"
    }  # fmt: skip
    # LIKE wildcards in the operand are literal.
    assert names(ws, "person", cond("firstName", Op.FILTER_OPERATOR_CONTAINS, "0%_")) == {
        "100%_real"
    }  # fmt: skip
    assert names(ws, "person", cond("firstName", Op.FILTER_OPERATOR_CONTAINS, "_")) == {
        "100%_real"
    }  # fmt: skip


def test_null_operators(data: tuple[Workspace, dict[str, Any]]) -> None:
    ws, _ = data
    assert names(ws, "person", cond("lastName", Op.FILTER_OPERATOR_IS, None)) == {"Grace"}
    assert names(ws, "person", cond("lastName", Op.FILTER_OPERATOR_IS, "null")) == {"Grace"}
    assert "Grace" not in names(ws, "person", cond("lastName", Op.FILTER_OPERATOR_IS_NOT, None))
    assert names(ws, "person", cond("companyId", Op.FILTER_OPERATOR_IS, None)) == {"100%_real"}
    assert names(ws, "person", cond("lastName", Op.FILTER_OPERATOR_EQ, None)) == {"Grace"}


def test_number_date_and_select_comparisons(data: tuple[Workspace, dict[str, Any]]) -> None:
    ws, _ = data

    def opps(node: common_pb2.Filter) -> set[str]:
        return names(ws, "opportunity", node, key="name")

    assert opps(cond("amount", Op.FILTER_OPERATOR_GT, 10)) == {"Big"}
    assert opps(cond("amount", Op.FILTER_OPERATOR_GTE, 10)) == {"Big", "Small"}
    assert opps(cond("amount", Op.FILTER_OPERATOR_LT, "5000")) == {"Small"}
    assert opps(cond("amount", Op.FILTER_OPERATOR_LTE, 5000.0)) == {"Big", "Small"}
    assert opps(cond("closeDate", Op.FILTER_OPERATOR_GT, "2026-02-01")) == {"Big"}
    assert opps(cond("closeDate", Op.FILTER_OPERATOR_LT, "2026-02-01T00:00:00Z")) == {"Small"}
    assert opps(cond("stage", Op.FILTER_OPERATOR_IN, ["LOST", "QUALIFIED"])) == {"Big", "None"}
    created = ws.list("opportunity", first=1)[0][0]["createdAt"]
    assert "Big" in opps(cond("createdAt", Op.FILTER_OPERATOR_GTE, created))
    assert opps(cond("createdAt", Op.FILTER_OPERATOR_LT, "2000-01-01")) == set()


def test_groups_and_negation(data: tuple[Workspace, dict[str, Any]]) -> None:
    ws, _ = data
    either = any_of(
        cond("firstName", Op.FILTER_OPERATOR_EQ, "Ada"),
        cond("firstName", Op.FILTER_OPERATOR_EQ, "Alan"),
    )
    assert names(ws, "person", either) == {"Ada", "Alan"}
    both = all_of(either, cond("email", Op.FILTER_OPERATOR_CONTAINS, "acme"))
    assert names(ws, "person", both) == {"Ada"}
    negated = common_pb2.Filter(negated=cond("lastName", Op.FILTER_OPERATOR_EQ, "Turing"))
    assert names(ws, "person", negated) == {"Ada", "Grace", "100%_real"}
    assert len(names(ws, "person", all_of())) == 4


def test_nested_relation_paths(data: tuple[Workspace, dict[str, Any]]) -> None:
    ws, seeded = data
    acme_id = seeded["acme"]["id"]
    assert names(ws, "person", cond("company.id", Op.FILTER_OPERATOR_EQ, acme_id)) == {
        "Ada", "Grace"
    }  # fmt: skip
    assert names(ws, "person", cond("company.name", Op.FILTER_OPERATOR_CONTAINS, "glob")) == {
        "Alan"
    }  # fmt: skip
    assert names(ws, "person", cond("company.employees", Op.FILTER_OPERATOR_GT, 50)) == {
        "Ada", "Grace"
    }  # fmt: skip
    assert names(ws, "person", cond("company.name", Op.FILTER_OPERATOR_IS, None)) == {
        "100%_real"
    }  # fmt: skip


@pytest.mark.parametrize(
    ("node", "field"),
    [
        (cond("nope", Op.FILTER_OPERATOR_EQ, "x"), "nope"),
        (cond("company.nope", Op.FILTER_OPERATOR_EQ, "x"), "company.nope"),
        (cond("employees", Op.FILTER_OPERATOR_EQ, "many"), "employees"),
        (cond("name", Op.FILTER_OPERATOR_UNSPECIFIED, "x"), "name"),
        (cond("idealCustomerProfile", Op.FILTER_OPERATOR_GT, True), "idealCustomerProfile"),
        (cond("employees", Op.FILTER_OPERATOR_CONTAINS, "1"), "employees"),
        (cond("name", Op.FILTER_OPERATOR_IN, "x"), None),
        (cond("name", Op.FILTER_OPERATOR_IS, "x"), "name"),
        (cond("id", Op.FILTER_OPERATOR_EQ, "not-a-uuid"), "id"),
        (cond("createdAt", Op.FILTER_OPERATOR_GT, "yesterday"), "createdAt"),
    ],
)
def test_bad_filters_are_invalid_argument_naming_the_field(
    data: tuple[Workspace, dict[str, Any]], node: common_pb2.Filter, field: str | None
) -> None:
    ws, _ = data
    if field is None:  # a comma-separated string is accepted for `in`
        ws.list("company", filter=node)
        return
    with pytest.raises(grpc.RpcError) as caught:
        ws.list("company", filter=node)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_of(caught.value).field == field


def test_select_filter_value_must_be_an_option(data: tuple[Workspace, dict[str, Any]]) -> None:
    ws, _ = data
    with pytest.raises(grpc.RpcError) as caught:
        ws.list("opportunity", filter=cond("stage", Op.FILTER_OPERATOR_EQ, "MAYBE"))
    assert error_of(caught.value).field == "stage"
