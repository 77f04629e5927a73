"""Validation errors name their field and the operation they belong to."""

from __future__ import annotations

from typing import Any

import pytest
from graphql import build_schema, graphql_sync, parse

from gateway.graphql.errors import describe_request_error, format_graphql_error

SCHEMA = build_schema(
    """
    input Address { city: String!, zip: Int }
    input PersonInput { name: String!, age: Float, address: Address }
    input PersonFilter { name: String, and: [PersonFilter!] }
    type Person { id: ID!, name: String }
    type Query { people(filter: PersonFilter, first: Int): [Person!]!, person(id: ID!): Person }
    type Mutation {
      createPerson(data: PersonInput!): Person
      createPeople(data: [PersonInput!]!): [Person!]
    }
    """
)


def _error(query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
    result = graphql_sync(SCHEMA, query, variable_values=variables)
    assert result.errors
    return format_graphql_error(result.errors[0], parse(query))


@pytest.mark.parametrize(
    ("query", "variables", "field", "path"),
    [
        ("mutation { createPerson(data: {age: 3}) { id } }", None, "name", ["createPerson"]),
        (
            "mutation { made: createPerson(data: {name: 1}) { id } }",
            None,
            "name",
            ["made"],
        ),
        (
            'mutation { createPerson(data: {name: "a", address: {zip: 1}}) { id } }',
            None,
            "address.city",
            ["createPerson"],
        ),
        (
            'mutation { createPeople(data: [{name: "a"}, {name: "b", age: "x"}]) { id } }',
            None,
            "[1].age",
            ["createPeople"],
        ),
        ('mutation { createPerson(data: {name: "a", nope: 1}) { id } }', None, "nope", None),
        ("mutation { createPerson { id } }", None, "data", ["createPerson"]),
        ("{ people(last: 3) { id } }", None, "last", ["people"]),
        ('{ people(filter: {and: [{nme: "x"}]}) { id } }', None, "filter.and[0].nme", None),
        ('{ people(first: "x") { id } }', None, "first", ["people"]),
        ("{ people { id nope } }", None, "nope", ["people"]),
        ("{ ...F } fragment F on Query { person(id: 1) { nope } }", None, "nope", ["person"]),
        (
            "mutation($d: PersonInput!) { createPerson(data: $d) { id } }",
            {"d": {"age": 1}},
            "name",
            ["createPerson"],
        ),
        (
            "mutation($d: [PersonInput!]!) { createPeople(data: $d) { id } }",
            {"d": [{"name": "a"}, {"name": "b", "address": {"city": 5}}]},
            "[1].address.city",
            ["createPeople"],
        ),
        (
            "query($f: PersonFilter) { people(filter: $f) { id } }",
            {"f": {"name": 3}},
            "filter.name",
            ["people"],
        ),
    ],
)
def test_field_and_path(
    query: str, variables: dict[str, Any] | None, field: str, path: list[str] | None
) -> None:
    error = _error(query, variables)
    assert error["extensions"] == {"code": "BAD_USER_INPUT", "field": field}, error
    if path is not None:
        assert error["path"] == path, error
    assert "path" in error, error


def test_syntax_errors_have_no_field() -> None:
    result = graphql_sync(SCHEMA, "{ people { ")
    assert result.errors
    error = format_graphql_error(result.errors[0], None)
    assert error["extensions"] == {"code": "BAD_USER_INPUT"}
    info = describe_request_error(result.errors[0], None)
    assert info.path is None
