"""The gateway's executor answers exactly as graphql-core's own path: values, nulls, enums,
aliases, fragments, `__typename`, nested plain objects and lists of them (a connection's edges
and nodes), lists of scalars, fields included or skipped by variables, a null in a non-null
field or list item and a value its scalar refuses (errors with their paths), resolved relations
beside plain fields."""

from __future__ import annotations

import asyncio
import enum
from typing import Any

import strawberry
from strawberry.schema.schema import StrawberryGraphQLCoreExecutionContext

from gateway.graphql.scalars import schema_config
from gateway.graphql.schema import GatewaySchema


@strawberry.enum
class Stage(enum.Enum):
    WON = "WON"
    LOST = "LOST"


@strawberry.type
class Company:
    name: str | None


@strawberry.type
class Person:
    id: strawberry.ID
    firstName: str | None  # noqa: N815
    score: int | None
    stage: Stage | None

    @strawberry.field
    def company(self) -> Company | None:
        return Company(name="Acme")


ROWS: list[dict[str, Any]] = [
    {"id": "1", "firstName": "Ada", "score": 3, "stage": Stage.WON},
    {"id": "2", "firstName": None, "score": None, "stage": None},
    {"id": None, "firstName": "Alan", "score": 1, "stage": Stage.LOST},  # null in ID!
    {"id": "4", "firstName": "Grace", "score": "many", "stage": None},  # refused by Int
]


@strawberry.type
class Edge:
    node: Person
    cursor: str


@strawberry.type
class Row:
    """Plain data only: a whole page of these is answered by the executor's plans."""

    id: strawberry.ID
    firstName: str | None  # noqa: N815
    score: int | None
    stage: Stage | None
    tags: list[str] | None
    employer: Company | None


@strawberry.type
class RowEdge:
    node: Row
    cursor: str


@strawberry.type
class Page:
    edges: list[RowEdge]
    total: int


CLEAN_ROWS: list[dict[str, Any]] = [
    {"id": "1", "firstName": "Ada", "score": 3, "stage": Stage.WON, "tags": ["a", "b"]},
    {"id": "2", "firstName": None, "score": None, "stage": None, "tags": None},
    {"id": "3", "firstName": "Alan", "score": 1, "stage": Stage.LOST, "tags": []},
]


def _page(rows: list[dict[str, Any]]) -> Page:
    edges = [
        {"node": {**row, "employer": {"name": "Acme"}}, "cursor": f"c{i}"}
        for i, row in enumerate(rows)
    ]
    return {"edges": edges, "total": len(rows)}  # type: ignore[return-value]


@strawberry.type
class Query:
    @strawberry.field
    def people(self) -> list[Person]:
        return ROWS  # type: ignore[return-value]

    @strawberry.field
    def page(self, broken: bool = False) -> Page:
        """A page; `broken` puts a null among a row's non-null tags."""
        rows = [*CLEAN_ROWS, {**CLEAN_ROWS[0], "tags": ["x", None]}] if broken else CLEAN_ROWS
        return _page(rows)

    @strawberry.field
    def edges(self) -> list[Edge]:
        return [{"node": row, "cursor": f"c{i}"} for i, row in enumerate(ROWS)]  # type: ignore[misc]


QUERIES = (
    "{ people { id firstName score stage } }",
    "{ people { name: firstName firstName __typename } }",
    "{ people { firstName company { name } } }",
    "{ people { firstName } }",
    "{ edges { cursor node { firstName score stage } } }",
    "{ edges { cursor node { id firstName } } }",
    "{ edges { node { firstName company { name } } } }",
    "{ edges { node { ... on Person { firstName } } } }",
    "{ edges { node { firstName } other: node { stage } } }",
    "{ page { total edges { cursor node { id firstName score stage tags employer { name } "
    "__typename } __typename } __typename } }",
    "{ page { edges { node { ...F } } } } fragment F on Row { id tags employer { n: name } }",
    "{ page { edges { node { ... on Row { id } stage } } } }",
    "{ page(broken: true) { total edges { node { id tags } } } }",
    "{ page { edges { node { id } } } broken: page(broken: true) { edges { node { tags } } } }",
)
WITH_VARIABLES = (
    "query($on: Boolean!) { page { edges { node { id firstName @include(if: $on) "
    "score @skip(if: $on) employer @include(if: $on) { name } } } } }"
)


def _answer(query: str, executor: type | None, variables: dict[str, Any] | None = None) -> Any:
    kwargs: dict[str, Any] = {} if executor is None else {"execution_context_class": executor}
    schema = GatewaySchema(query=Query, config=schema_config(), **kwargs)
    result = asyncio.run(schema.execute(query, variable_values=variables))
    errors = [(error.message, error.path) for error in result.errors or ()]
    return result.data, errors


def test_same_answers_and_errors_as_graphql_core() -> None:
    for query in QUERIES:
        ours = _answer(query, None)
        theirs = _answer(query, StrawberryGraphQLCoreExecutionContext)
        assert ours == theirs, query


def test_same_answers_with_fields_included_or_skipped_by_variables() -> None:
    for on in (True, False):
        ours = _answer(WITH_VARIABLES, None, {"on": on})
        theirs = _answer(WITH_VARIABLES, StrawberryGraphQLCoreExecutionContext, {"on": on})
        assert ours == theirs, on
        assert not ours[1]


def test_a_page_of_plain_rows_is_answered_whole() -> None:
    data, errors = _answer(
        "{ page { total edges { node { id stage tags employer { name } } } } }", None
    )
    assert errors == []
    assert data["page"]["total"] == 3
    assert data["page"]["edges"][0]["node"] == {
        "id": "1",
        "stage": "WON",
        "tags": ["a", "b"],
        "employer": {"name": "Acme"},
    }
    data, errors = _answer("{ page(broken: true) { edges { node { tags } } } }", None)
    # the null among non-null tags nulls the (nullable) list, with the error at the item
    assert [edge["node"]["tags"] for edge in data["page"]["edges"]] == [["a", "b"], None, [], None]
    assert [path for _, path in errors] == [["page", "edges", 3, "node", "tags", 1]]


def test_null_in_non_null_field_and_refused_value_are_errors_with_paths() -> None:
    data, errors = _answer("{ people { id } }", None)
    assert data is None  # the null ID nulls its non-null item, then the non-null list
    assert [path for _, path in errors] == [["people", 2, "id"]]
    data, errors = _answer("{ people { score } }", None)
    assert data == {"people": [{"score": 3}, {"score": None}, {"score": 1}, {"score": None}]}
    assert [path for _, path in errors] == [["people", 3, "score"]]


def test_repeated_documents_answer_as_the_first_time_errors_included() -> None:
    """Documents are parsed and validated once per schema and text (gateway.graphql.documents):
    asking again gives the same answer, the same validation error, the same syntax error."""
    schema = GatewaySchema(query=Query, config=schema_config())
    for query in ("{ page { total } }", "{ page { nope } }", "{ page { total }"):
        first, again = (asyncio.run(schema.execute(query)) for _ in range(2))
        assert first.data == again.data
        assert [e.message for e in first.errors or ()] == [e.message for e in again.errors or ()]
    invalid = asyncio.run(schema.execute("{ page { nope } }"))
    assert invalid.data is None
    assert invalid.errors is not None
    assert "Cannot query field 'nope' on type 'Page'." in invalid.errors[0].message
    broken = asyncio.run(schema.execute("{ page { total }"))
    assert broken.errors is not None
    assert "Syntax Error" in broken.errors[0].message
