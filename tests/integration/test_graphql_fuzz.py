"""Property-based queries against the workspace's generated GraphQL schema (hypothesis-graphql,
bounded): whatever filters, orders and pages a client sends, the answer is data or a client
error in the spec's shape, never INTERNAL_SERVER_ERROR."""

from __future__ import annotations

import datetime as dt
import os
from typing import Any

import httpx
import pytest
from graphql import GraphQLSchema, build_client_schema, get_introspection_query
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis_graphql import nodes, queries

from tests.integration.api_helpers import Api

CLIENT_CODES = {"BAD_USER_INPUT", "NOT_FOUND"}

# Examples per run: about 30 seconds; 500 found the last real bug, 250 keeps make test short
# (`make fuzz` sets FUZZ_EXAMPLES for a longer run).
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "250"))
# Read-only operations only: data written with extreme values would test the records service's
# arithmetic, not the gateway's translation of arbitrary GraphQL input.
ROOT_FIELDS = [
    f"{name}{suffix}"
    for name in ("people", "companies", "opportunities", "activities", "tasks")
    for suffix in ("", "Aggregate")
] + ["person", "company", "opportunity", "objects", "fields"]

SCALARS: dict[str, Any] = {
    "UUID": st.uuids().map(lambda value: nodes.String(str(value))),
    "DateTime": st.datetimes(timezones=st.just(dt.UTC)).map(
        lambda value: nodes.String(value.isoformat())
    ),
    "Date": st.dates().map(lambda value: nodes.String(value.isoformat())),
    "BigInt": st.integers(min_value=-(2**63) + 1, max_value=2**63 - 1).map(nodes.Int),
    "JSON": st.one_of(
        st.integers(-1000, 1000).map(nodes.Int), st.text(max_size=5).map(nodes.String)
    ),
}


@pytest.fixture(scope="module")
def api(client: httpx.Client) -> Api:
    api = Api.signup(client)
    company = api.create("companies", {"name": "Acme", "employees": 10})
    person = api.create("people", {"firstName": "Ada", "companyId": company["id"]})
    api.create(
        "opportunities",
        {"name": "Deal", "amount": 5, "stage": "WON", "pointOfContactId": person["id"]},
    )
    return api


@pytest.fixture(scope="module")
def schema(api: Api) -> GraphQLSchema:
    introspection = api.data(get_introspection_query())
    return build_client_schema(introspection)  # type: ignore[arg-type]


def test_generated_queries_never_fail_on_the_server(api: Api, schema: GraphQLSchema) -> None:
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(query=queries(schema, fields=ROOT_FIELDS, custom_scalars=SCALARS))
    def check(query: str) -> None:
        response = api.http.post("/graphql", json={"query": query}, headers=api.headers)
        body = response.json()
        if response.status_code == 400:
            # Refused before running (a request limit of docs/api.md, e.g. its cost): a client
            # error naming the limit, never a server one.
            (error,) = body["errors"]
            assert error["extensions"]["code"] == "BAD_USER_INPUT", (query, error)
            assert "the maximum" in error["message"], (query, error)
            return
        assert response.status_code == 200, (query, response.text)
        for error in body.get("errors") or []:
            code = error.get("extensions", {}).get("code")
            assert code in CLIENT_CODES, (query, error)
            assert error.get("path"), (query, error)

    check()
