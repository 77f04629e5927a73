"""The GraphQL request limits (gateway.graphql.limits): depth, aliases, top-level fields,
tokens and the cost estimate, on a small schema shaped like a workspace's."""

from __future__ import annotations

import pytest
from graphql import build_schema

from gateway.graphql.limits import Analyses, QueryLimits, QueryTooLarge, check_request

SCHEMA = build_schema("""
type Query {
  people(first: Int, last: Int, limit: Int): PersonConnection
  person(id: ID!): Person
}
type Mutation { createPerson(name: String): Person }
type PersonConnection { edges: [PersonEdge] }
type PersonEdge { node: Person }
type Person {
  id: ID
  name: String
  company: Company
}
type Company { id: ID, people(first: Int): PersonConnection }
""")
LIMITS = QueryLimits(max_depth=8, max_aliases=3, max_root_fields=4, max_tokens=400, max_cost=500)


def check(query: str, variables: dict[str, object] | None = None) -> int:
    analysis = check_request(SCHEMA, query, variables, None, LIMITS)
    assert analysis is not None
    return analysis.cost


def test_connections_cost_their_page_times_the_pages_around_them() -> None:
    assert check("{ person(id: 1) { name company { id } } }") == 1
    assert check("{ people(first: 10) { edges { node { id } } } }") == 10
    assert check("{ people { edges { node { id } } } }") == 50  # the default page
    nested = (
        "{ people(first: 5) { edges { node { company {"
        " people(first: 7) { edges { node { id } } } } } } } }"
    )
    assert check(nested) == 5 + 5 * 7


def test_variables_and_their_defaults_set_the_page() -> None:
    query = "query Q($n: Int = 3) { people(first: $n) { edges { node { id } } } }"
    assert check(query) == 3
    assert check(query, {"n": 20}) == 20
    assert check("{ people(last: 9, first: 2) { edges { node { id } } } }") == 9


def test_pages_beyond_the_api_maximum_count_as_the_maximum() -> None:
    with pytest.raises(QueryTooLarge) as refused:
        check(
            "{ a: people(first: 100000) { edges { node { id } } }"
            " b: people(first: 400) { edges { node { id } } }"
            " c: people(first: 200) { edges { node { id } } } }"
        )
    assert refused.value.analysis is not None
    assert refused.value.analysis.cost == 600
    assert "maximum of 500" in refused.value.message


def test_fragments_count_where_they_are_spread() -> None:
    query = """
    { people(first: 4) { edges { node { ...P } } } }
    fragment P on Person { company { people(first: 2) { edges { node { id } } } } }
    """
    assert check(query) == 4 + 4 * 2
    cyclic = (
        "{ person(id: 1) { ...A } } fragment A on Person { ...B } fragment B on Person { ...A }"
    )
    assert check(cyclic) == 1  # validation refuses the cycle later


@pytest.mark.parametrize(
    ("query", "named"),
    [
        (
            "{ " + " ".join(f"a{i}: person(id: {i}) {{ id }}" for i in range(4)) + " }",
            "aliases",
        ),
        (
            "{ person(id: 1) { company { people { edges { node { company {"
            " people { edges { node { id } } } } } } } } } }",
            "deeper than 8",
        ),
        ("{ " + " ".join("person(id: 1) { id }" for _ in range(5)) + " }", "top-level fields"),
        ("{ person(id: 1) { " + "id " * 500 + "} }", "tokens"),
    ],
)
def test_requests_over_a_limit_are_refused_naming_it(query: str, named: str) -> None:
    with pytest.raises(QueryTooLarge) as refused:
        check_request(SCHEMA, query, None, None, LIMITS)
    assert named in refused.value.message


def test_each_top_level_mutation_field_is_one_call() -> None:
    mutation = 'mutation { a: createPerson(name: "a") { id } b: createPerson(name: "b") { id } }'
    analysis = check_request(SCHEMA, mutation, None, None, LIMITS)
    assert analysis is not None
    assert analysis.calls == 2
    query = check_request(
        SCHEMA, "{ a: person(id: 1) { id } b: person(id: 2) { id } }", None, None, LIMITS
    )
    assert query is not None
    assert (query.calls, query.cost) == (1, 2)


def test_documents_that_do_not_parse_are_left_to_execution() -> None:
    assert check_request(SCHEMA, "{ person(", None, None, LIMITS) is None
    assert (
        check_request(SCHEMA, "query A { __typename } query B { __typename }", None, None, LIMITS)
        is None
    )


def test_analyses_of_operations_without_variables_are_kept_per_schema() -> None:
    """Analyses answers as check_request; it keeps only what cannot change between requests."""
    analyses = Analyses(maxsize=2)
    plain = "{ people(first: 10) { edges { node { id } } } }"
    first = analyses.check(SCHEMA, plain, None, None, LIMITS)
    assert first == check_request(SCHEMA, plain, None, None, LIMITS)
    assert analyses.check(SCHEMA, plain, None, None, LIMITS) is first
    with_variables = "query Q($n: Int = 3) { people(first: $n) { edges { node { id } } } }"
    for n in (3, 20, 7):
        analysis = analyses.check(SCHEMA, with_variables, {"n": n}, None, LIMITS)
        assert analysis is not None
        assert analysis.cost == n
    over = "{ people(first: 100) { edges { node { company { people(first: 100) { edges "
    over += "{ node { id } } } } } } } }"
    for _ in range(2):
        with pytest.raises(QueryTooLarge, match="cost"):
            analyses.check(SCHEMA, over, None, None, LIMITS)
    assert analyses.check(SCHEMA, "{ people { edges", None, None, LIMITS) is None


def test_analyses_whose_variables_set_no_page_are_kept() -> None:
    """A mutation's `data: $d` changes nothing the analysis counts: kept like a plain one, while
    an operation whose variable sets a page (above) is analysed on every request."""
    analyses = Analyses(maxsize=2)
    create = "mutation C($name: String) { createPerson(name: $name) { id company { id } } }"
    first = analyses.check(SCHEMA, create, {"name": "a"}, None, LIMITS)
    assert first is not None
    assert first == check_request(SCHEMA, create, {"name": "a"}, None, LIMITS)
    assert analyses.check(SCHEMA, create, {"name": "b"}, None, LIMITS) is first
    paged = "query Q($n: Int, $id: ID!) { person(id: $id) { id } "
    paged += "people(first: $n) { edges { node { id } } } }"
    costs = [analyses.check(SCHEMA, paged, {"n": n, "id": 1}, None, LIMITS) for n in (5, 9)]
    assert [analysis.cost if analysis else None for analysis in costs] == [1 + 5, 1 + 9]
