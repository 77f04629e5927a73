"""The gateway's executor answers exactly as graphql-core's own path: values, nulls, enums,
aliases, fragments, `__typename`, nested plain objects and lists of them (a connection's edges
and nodes), lists of scalars, fields included or skipped by variables, a null in a non-null
field or list item and a value its scalar refuses (errors with their paths), resolved relations
beside plain fields."""

from __future__ import annotations

import asyncio
import dataclasses
import enum
from types import SimpleNamespace
from typing import Any

import orjson
import strawberry
from graphql import parse
from strawberry.schema.schema import StrawberryGraphQLCoreExecutionContext

from crm.common.v1 import common_pb2
from crm.records.v1 import records_pb2
from crmkit.errors import InvalidArgument, NotFound
from gateway.graphql.builder import StaticNames
from gateway.graphql.context import GraphQLContext
from gateway.graphql.direct import DirectOperation, compile_operation
from gateway.graphql.endpoint import WorkspaceSchemas, graphql_response
from gateway.graphql.scalars import schema_config
from gateway.graphql.schema import GatewaySchema, build_static_schema


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


# -- the direct path of record queries (gateway.graphql.direct) ------------------------------

PERSON = "aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa"
PEOPLE_ROWS: list[dict[str, Any]] = [
    {
        "id": f"{index:08d}-aaaa-aaaa-aaaa-aaaaaaaaaaaa",
        "firstName": f"F{index}",
        "lastName": None,
        "jobTitle": "Engineer",
        "tags": ["LEAD"] if index % 2 else [],
        "vip": index == 1,
        "createdAt": "2026-11-22T10:00:00.000Z",
        "updatedAt": "2026-11-22T10:00:00.000Z",
    }
    for index in range(3)
]
BROKEN_ROWS = [*PEOPLE_ROWS, {**PEOPLE_ROWS[0], "id": None}]  # a null in ID!
NODE = "id firstName lastName jobTitle tags vip createdAt __typename"

# Each answered by the direct path: the same answer, errors and records request as before.
DIRECT: tuple[tuple[str, dict[str, Any] | None], ...] = (
    (
        f'{{ people(first: 2, filter: {{jobTitle: {{eq: "Engineer"}}}}) {{ edges {{ node {{ {NODE} '
        "} } } }",
        None,
    ),
    (
        "{ people(orderBy: [{lastName: DESC}], limit: 5) { totalCount pageInfo "
        "{ hasNextPage endCursor } edges { cursor node { id } } } }",
        None,
    ),
    (
        "query($f: PersonFilter, $n: Int) { list: people(filter: $f, first: $n) { edges { node "
        "{ id firstName } } } }",
        {"f": {"or": [{"firstName": {"startsWith": "F"}}, {"vip": {"eq": True}}]}, "n": 3},
    ),
    (
        "query Q($after: String) { people(after: $after) { edges { node { ...P } } } } "
        "fragment P on Person { id n: firstName }",
        {"after": "c-1"},
    ),
    (
        "{ people { edges { node { ... on Person { id } firstName @include(if: false) "
        "jobTitle @skip(if: false) } } } }",
        None,
    ),
    ("{ people(first: 201) { edges { node { id } } } }", None),  # BAD_USER_INPUT, path
    ('{ people(last: 0, filter: {firstName: {eq: "x"}}) { edges { node { id } } } }', None),
    (f'{{ person(id: "{PERSON}") {{ id firstName tags }} }}', None),
    ("query($id: UUID!) { one: person(id: $id) { id vip } }", {"id": PERSON}),
    (
        "mutation($d: PersonCreateInput!) { createPerson(data: $d) { id firstName tags } }",
        # every kind of value the records request is built from: dates, enums in a list, JSON,
        # booleans, a relation's UUID, an explicit null
        {
            "d": {
                "firstName": "F1",
                "jobTitle": "Engineer",
                "birthday": "1990-02-03",
                "tags": ["PARTNER", "LEAD"],
                "profile": {"a": [1, {"b": None}], "c": "d"},
                "vip": True,
                "email": None,
                "companyId": "cccccccc-cccc-cccc-cccc-cccccccccccc",
            }
        },
    ),
    ('mutation { made: createPerson(data: {firstName: "F1"}) { id vip __typename } }', None),
    (
        "mutation($id: UUID!, $d: PersonUpdateInput!) { updatePerson(id: $id, data: $d) "
        "{ id firstName tags } }",
        {"id": PERSON, "d": {"jobTitle": "Sales", "tags": [], "birthday": None, "vip": False}},
    ),
    (f'mutation {{ gone: deletePerson(id: "{PERSON}") {{ id vip __typename }} }}', None),
    (f'mutation {{ restorePerson(id: "{PERSON}") {{ id firstName }} }}', None),
    (
        "mutation($d: OpportunityCreateInput!) { createOpportunity(data: $d) { id } }",
        {
            "d": {
                "name": "Deal",
                "stage": "QUALIFIED",
                "amount": {"amountMicros": 5_000_000, "currencyCode": "EUR"},
                "closeDate": "2026-12-31",
            }
        },
    ),
)
WRITES = DIRECT[9:]  # with the records method each one calls
WRITE_METHODS = (
    "CreateRecord",
    "CreateRecord",
    "UpdateRecord",
    "DeleteRecord",
    "RestoreRecord",
    "CreateRecord",
)
# Answered by the normal execution (each a reason the direct path does not apply).
NOT_DIRECT = (
    (
        "query($on: Boolean!) { people { edges { node { id firstName @include(if: $on) } } } }",
        {"on": True},
    ),
    (
        "{ people { edges { node { id company { name people { edges { node { id } } } } } } } }",
        None,
    ),
    ("{ people { edges { node { id } } } __typename }", None),
    ("{ a: people { edges { node { id } } } b: people(first: 1) { edges { node { id } } } }", None),
    ("{ peopleAggregate { count } }", None),
    ("{ nope }", None),
    ('mutation { deletePeople(filter: {jobTitle: {eq: "x"}}) { id } }', None),
    (
        'mutation { a: createPerson(data: {firstName: "A"}) { id } '
        'b: createPerson(data: {firstName: "B"}) { id } }',
        None,
    ),
)
ANSWERED = {query for query, _ in (*DIRECT[:5], *DIRECT[7:], *NOT_DIRECT[:5], *NOT_DIRECT[6:])}
VARIABLE_ERRORS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("query($n: Int) { people(first: $n) { edges { node { id } } } }", {"n": "many"}),
    ("query($id: UUID!) { person(id: $id) { id } }", {}),
)


def _page_of(rows: list[dict[str, Any]]) -> Any:

    cursors = [f"c-{index}" for index in range(len(rows))]
    return records_pb2.ListRecordsResponse(
        records_json=orjson.dumps(rows),
        cursors=cursors,
        page_info=common_pb2.PageInfo(has_next_page=True, end_cursor=cursors[-1]),
        total_count=42,
    )


async def _both(
    fakes: Any,
    schema_parts: Any,
    query: str,
    variables: dict[str, Any] | None,
    operation_name: str | None = None,
) -> tuple[bytes, bytes, list[Any], list[Any]]:
    """The response body through GatewaySchema.execute and through Strawberry's own (the
    normal execution), with the records requests each made."""
    schemas = WorkspaceSchemas(schema_parts, StaticNames.of(build_static_schema(schema_parts)))
    model = await fakes.state.models.get(fakes.principal)
    schema = schemas.for_model(fakes.state, model).schema
    assert isinstance(schema, GatewaySchema)
    bodies, requests = [], []
    for execute in (GatewaySchema.execute, strawberry.Schema.execute):
        fakes.records.calls.clear()
        context = GraphQLContext(None, fakes.state, fakes.principal, model=model)  # type: ignore[arg-type]
        result = await execute(
            schema,
            query,
            variable_values=variables,
            context_value=context,
            operation_name=operation_name,
        )
        assert result.extensions == {}
        bodies.append(bytes(graphql_response(result, query).body))
        requests.append(list(fakes.records.calls))
    return bodies[0], bodies[1], requests[0], requests[1]


def _direct(
    query: str, variables: dict[str, Any] | None, schema: Any, operation_name: str | None = None
) -> bool:
    document = parse(query)
    compiled = compile_operation(schema, document, operation_name, variables)
    return isinstance(compiled, DirectOperation)


async def test_direct_path_answers_as_the_normal_execution(fakes: Any, schema_parts: Any) -> None:
    fakes.records.responses["ListRecords"] = _page_of(PEOPLE_ROWS)
    fakes.records.responses["GetRecord"] = lambda request: _record_of(PEOPLE_ROWS[1])
    for method in (*WRITE_METHODS, "DeleteRecords"):
        fakes.records.responses[method] = lambda request: _record_of(PEOPLE_ROWS[1])
    fakes.records.responses["DeleteRecords"] = records_pb2.RecordsResponse(
        records_json=orjson.dumps(PEOPLE_ROWS[1:])
    )
    fakes.records.responses["AggregateRecords"] = _aggregate()
    schema = await _workspace_schema(fakes, schema_parts)
    for query, variables in (*DIRECT, *NOT_DIRECT, *VARIABLE_ERRORS):
        ours, theirs, our_calls, their_calls = await _both(fakes, schema_parts, query, variables)
        assert ours == theirs, query
        assert our_calls == their_calls, query
        answered = "errors" not in orjson.loads(ours)
        assert answered is (query in ANSWERED), query
    for query, variables in DIRECT:
        assert _direct(query, variables, schema), query
    for query, variables in NOT_DIRECT:
        assert not _direct(query, variables, schema), query
    body = orjson.loads((await _both(fakes, schema_parts, *DIRECT[5]))[0])
    assert body["errors"][0]["extensions"] == {"code": "BAD_USER_INPUT", "field": "first"}
    assert body["errors"][0]["path"] == ["people"]


async def test_direct_path_errors_of_the_records_service(fakes: Any, schema_parts: Any) -> None:
    """An error of the call is located at the field; a non-null list nulls the data."""
    fakes.records.responses["ListRecords"] = InvalidArgument("unknown field", field="nope")
    fakes.records.responses["GetRecord"] = NotFound("no person with that id")
    queries = (DIRECT[0], DIRECT[7], DIRECT[8])
    for query, variables in queries:
        ours, theirs, our_calls, their_calls = await _both(fakes, schema_parts, query, variables)
        assert ours == theirs, query
        assert len(our_calls) == len(their_calls) == 1
    body = orjson.loads((await _both(fakes, schema_parts, *DIRECT[0]))[0])
    assert body["data"] is None
    assert body["errors"][0]["extensions"] == {"code": "BAD_USER_INPUT", "field": "nope"}
    assert body["errors"][0]["path"] == ["people"]
    body = orjson.loads((await _both(fakes, schema_parts, *DIRECT[8]))[0])
    assert body["data"] == {"one": None}
    assert body["errors"][0]["extensions"]["code"] == "NOT_FOUND"


async def test_direct_path_falls_back_on_a_page_its_plan_cannot_answer(
    fakes: Any, schema_parts: Any
) -> None:
    """A null in a non-null field: graphql-core's path answers (and reports) it, asking again."""
    fakes.records.responses["ListRecords"] = _page_of(BROKEN_ROWS)
    fakes.records.responses["GetRecord"] = lambda request: _record_of({"id": None})
    for query, variables in (DIRECT[0], DIRECT[7]):
        ours, theirs, our_calls, their_calls = await _both(fakes, schema_parts, query, variables)
        assert ours == theirs, query
        assert our_calls == their_calls * 2
        assert orjson.loads(ours)["errors"]


COMPANY = "cccccccc-cccc-cccc-cccc-cccccccccccc"
RELATED = (
    "{ people { edges { node { id firstName company { id name __typename } } } } }",
    f'{{ person(id: "{PERSON}") {{ id employer: company {{ name }} }} }}',
)
NESTED_ROWS: list[dict[str, Any]] = [
    {**PEOPLE_ROWS[0], "companyId": COMPANY, "company": {"id": COMPANY, "name": "Acme"}},
    {**PEOPLE_ROWS[1], "companyId": None, "company": None},
    PEOPLE_ROWS[2],  # neither a foreign key nor a nested record
]


async def _graphql_core_answer(
    fakes: Any, schema_parts: Any, query: str
) -> tuple[bytes, list[Any]]:
    """The body and records calls of graphql-core's own execution (no plans, no direct path)."""
    schema = await _workspace_schema(fakes, schema_parts)
    model = await fakes.state.models.get(fakes.principal)
    fakes.records.calls.clear()
    context = GraphQLContext(None, fakes.state, fakes.principal, model=model)  # type: ignore[arg-type]
    ours = schema.execution_context_class
    schema.execution_context_class = StrawberryGraphQLCoreExecutionContext
    try:
        result = await strawberry.Schema.execute(schema, query, context_value=context)
    finally:
        schema.execution_context_class = ours
    return bytes(graphql_response(result, query).body), list(fakes.records.calls)


async def test_a_nested_many_to_one_relation_is_answered_by_the_direct_path(
    fakes: Any, schema_parts: Any
) -> None:
    """`company { ... }` below a list or a get is read from the record the records service
    nested (depth 1): one call, the answer graphql-core's own execution gives, and null where
    the person has no company."""
    fakes.records.responses["ListRecords"] = _page_of(NESTED_ROWS)
    fakes.records.responses["GetRecord"] = lambda request: _record_of(NESTED_ROWS[0])
    schema = await _workspace_schema(fakes, schema_parts)
    for query in RELATED:
        assert _direct(query, None, schema), query
        ours, theirs, our_calls, their_calls = await _both(fakes, schema_parts, query, None)
        core, core_calls = await _graphql_core_answer(fakes, schema_parts, query)
        assert ours == theirs == core, query
        assert our_calls == their_calls == core_calls, query
        assert [request.depth for _, request in our_calls] == [1], query
    body = orjson.loads((await _both(fakes, schema_parts, RELATED[0], None))[0])
    assert "errors" not in body
    nodes = [edge["node"] for edge in body["data"]["people"]["edges"]]
    assert [node["company"] for node in nodes] == [
        {"id": COMPANY, "name": "Acme", "__typename": "Company"},
        None,
        None,
    ]


async def test_a_relation_records_did_not_nest_is_loaded_as_before(
    fakes: Any, schema_parts: Any
) -> None:
    """A person whose company was not nested (the company deleted, or not readable) is
    answered by the normal execution, which loads the company by id as always: the same body
    as graphql-core's own, after one more list call."""
    acme = {"id": COMPANY, "name": "Acme"}
    fakes.records.responses["GetRecordsByIds"] = records_pb2.RecordsResponse(
        records_json=orjson.dumps([acme])
    )
    for dangling in ({"companyId": COMPANY, "company": None}, {"companyId": COMPANY}):
        rows = [NESTED_ROWS[0], {**PEOPLE_ROWS[1], **dangling}]
        fakes.records.responses["ListRecords"] = _page_of(rows)
        ours, _, our_calls, _ = await _both(fakes, schema_parts, RELATED[0], None)
        core, core_calls = await _graphql_core_answer(fakes, schema_parts, RELATED[0])
        assert ours == core, dangling
        assert [name for name, _ in core_calls] == ["ListRecords", "GetRecordsByIds"]
        assert [name for name, _ in our_calls] == ["ListRecords", *[n for n, _ in core_calls]]
        edges = orjson.loads(ours)["data"]["people"]["edges"]
        assert edges[1]["node"]["company"]["name"] == "Acme"


async def test_a_direct_write_is_sent_once_and_completed_by_graphql_core_when_its_plan_cannot(
    fakes: Any, schema_parts: Any
) -> None:
    """A written record the plan cannot complete (a null in ID!) is not written again: the
    normal execution completes the record the direct path wrote, with graphql-core's error
    (a server error: the field is ID!)."""
    for method in WRITE_METHODS:
        fakes.records.responses[method] = lambda request: _record_of({"id": None})
    for (query, variables), method in zip(WRITES, WRITE_METHODS, strict=True):
        ours, theirs, our_calls, their_calls = await _both(fakes, schema_parts, query, variables)
        assert ours == theirs, query
        assert [call[0] for call in our_calls] == [method], query
        assert our_calls == their_calls, query
        assert orjson.loads(ours)["errors"][0]["extensions"] == {"code": "INTERNAL_SERVER_ERROR"}


async def test_a_write_with_an_idempotency_key_takes_the_guarded_path(
    fakes: Any, schema_parts: Any
) -> None:
    schema = await _workspace_schema(fakes, schema_parts)
    model = await fakes.state.models.get(fakes.principal)
    connection = SimpleNamespace(headers={"Idempotency-Key": "k-1"})
    for query, variables in WRITES:
        compiled = compile_operation(schema, parse(query), None, variables)
        assert isinstance(compiled, DirectOperation)
        fakes.records.calls.clear()
        context = GraphQLContext(connection, fakes.state, fakes.principal, model=model)  # type: ignore[arg-type]
        assert await compiled.run(schema._schema, context, variables) is None, query
        assert fakes.records.calls == [], query


async def test_direct_writes_answer_errors_of_the_records_service_as_graphql_core(
    fakes: Any, schema_parts: Any
) -> None:
    """A write refused by records is located at its field, sent once on either path."""
    for method in WRITE_METHODS:
        fakes.records.responses[method] = NotFound("no person with that id")
    for (query, variables), method in zip(WRITES, WRITE_METHODS, strict=True):
        ours, theirs, our_calls, their_calls = await _both(fakes, schema_parts, query, variables)
        assert ours == theirs, query
        assert [call[0] for call in our_calls] == [method], query
        assert our_calls == their_calls, query
        assert orjson.loads(ours)["errors"][0]["extensions"]["code"] == "NOT_FOUND", query


def _record_of(row: dict[str, Any]) -> Any:

    return records_pb2.RecordResponse(record_json=orjson.dumps(row))


def _aggregate() -> Any:

    return records_pb2.AggregateRecordsResponse(result_json=b'{"count": 3}')


async def _workspace_schema(fakes: Any, schema_parts: Any) -> Any:
    schemas = WorkspaceSchemas(schema_parts, StaticNames.of(build_static_schema(schema_parts)))
    model = await fakes.state.models.get(fakes.principal)
    return schemas.for_model(fakes.state, model).schema


async def test_direct_path_runs_the_named_operation(fakes: Any, schema_parts: Any) -> None:
    fakes.records.responses["ListRecords"] = _page_of(PEOPLE_ROWS)
    fakes.records.responses["AggregateRecords"] = _aggregate()
    schema = await _workspace_schema(fakes, schema_parts)
    query = (
        "query Count { peopleAggregate { count } } "
        "query Names { people(first: 2) { edges { node { firstName } } } }"
    )
    for name in ("Nope", None):  # Strawberry raises (CannotGetOperationTypeError) on both paths
        assert not _direct(query, None, schema, name)
    for name, direct in (("Names", True), ("Count", False)):
        ours, theirs, our_calls, their_calls = await _both(fakes, schema_parts, query, None, name)
        assert ours == theirs, name
        assert our_calls == their_calls, name
        assert _direct(query, None, schema, name) is direct, name
    names = orjson.loads((await _both(fakes, schema_parts, query, None, "Names"))[0])
    assert names["data"]["people"]["edges"][0] == {"node": {"firstName": "F0"}}


async def test_a_literal_list_is_asked_with_each_callers_data_model_version(
    fakes: Any, schema_parts: Any
) -> None:
    """The records request of a list with literal arguments is made once; each run asks it
    with the object ref of its own caller's data model."""
    fakes.records.responses["ListRecords"] = _page_of(PEOPLE_ROWS)
    schema = await _workspace_schema(fakes, schema_parts)
    model = await fakes.state.models.get(fakes.principal)
    query = DIRECT[0][0]
    compiled = compile_operation(schema, parse(query), None, None)
    assert isinstance(compiled, DirectOperation)
    fakes.records.calls.clear()
    for version in (model.version, model.version + 7):
        newer = dataclasses.replace(model, version=version)
        context = GraphQLContext(None, fakes.state, fakes.principal, model=newer)  # type: ignore[arg-type]
        result = await compiled.run(schema._schema, context, None)
        assert result is not None
        assert result.errors is None
    asked = fakes.records.named("ListRecords")
    assert [request.ref.metadata_version for request in asked] == [
        model.version,
        model.version + 7,
    ]
    assert asked[0].filter == asked[1].filter
    assert asked[0].filter.ByteSize() > 0
    assert [request.first for request in asked] == [2, 2]


async def test_values_of_other_types_in_string_fields_are_coerced_as_graphql_core_does(
    fakes: Any, schema_parts: Any
) -> None:
    """A str in a String, ID, UUID or DateTime field is answered as it is; any other value
    still goes through the field's scalar (a number in a String field reads "5")."""
    odd = {**PEOPLE_ROWS[0], "firstName": 5, "lastName": True, "createdAt": 12, "id": 7}
    fakes.records.responses["ListRecords"] = _page_of([odd, PEOPLE_ROWS[1]])
    query = "{ people { edges { node { id firstName lastName createdAt jobTitle } } } }"
    ours, theirs, _, _ = await _both(fakes, schema_parts, query, None)
    core, _ = await _graphql_core_answer(fakes, schema_parts, query)
    assert ours == theirs == core
    nodes = [edge["node"] for edge in orjson.loads(ours)["data"]["people"]["edges"]]
    assert nodes[0] == {
        "id": "7",
        "firstName": "5",
        "lastName": "true",
        "createdAt": "12",
        "jobTitle": "Engineer",
    }
    assert nodes[1]["createdAt"] == "2026-11-22T10:00:00.000Z"
