"""The gateway's executor answers exactly as graphql-core's own path: values, nulls, enums,
aliases, fragments, `__typename`, nested plain objects (a connection's edges), a null in a
non-null field and a value its scalar refuses (errors with their paths), resolved relations
beside plain fields."""

from __future__ import annotations

import asyncio
import enum
from typing import Any

import strawberry
from strawberry.schema.schema import StrawberryGraphQLCoreExecutionContext

from gateway.graphql.scalars import schema_config
from gateway.graphql.schema import GatewaySchema, schema_extensions


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
class Query:
    @strawberry.field
    def people(self) -> list[Person]:
        return ROWS  # type: ignore[return-value]

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
)


def _answer(query: str, executor: type | None) -> Any:
    kwargs = {} if executor is None else {"execution_context_class": executor}
    schema = GatewaySchema(
        query=Query, config=schema_config(), extensions=schema_extensions(), **kwargs
    )
    result = asyncio.run(schema.execute(query))
    errors = [(error.message, error.path) for error in result.errors or ()]
    return result.data, errors


def test_same_answers_and_errors_as_graphql_core() -> None:
    for query in QUERIES:
        ours = _answer(query, None)
        theirs = _answer(query, StrawberryGraphQLCoreExecutionContext)
        assert ours == theirs, query


def test_null_in_non_null_field_and_refused_value_are_errors_with_paths() -> None:
    data, errors = _answer("{ people { id } }", None)
    assert data is None  # the null ID nulls its non-null item, then the non-null list
    assert [path for _, path in errors] == [["people", 2, "id"]]
    data, errors = _answer("{ people { score } }", None)
    assert data == {"people": [{"score": 3}, {"score": None}, {"score": 1}, {"score": None}]}
    assert [path for _, path in errors] == [["people", 3, "score"]]
