"""Property-based REST bodies, filters and GraphQL variables (hypothesis, bounded): whatever
JSON a client sends — nested past any parser's stack, integers beyond 64 bits, NUL characters,
keys that are operators or nothing the model knows — the answer is data or a client error, never
a 5xx, and the connection stays open for the next request (issue 23.5).

JSON is generated as text, so values nest deeper than `json.dumps` or `orjson.dumps` encode.
FUZZ_EXAMPLES raises the examples per test (`make fuzz`); the default keeps `make test` short.
"""

from __future__ import annotations

import os
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.integration.api_helpers import Api

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "200"))

FIELDS = ["name", "employees", "city", "website", "idealCustomerProfile", "annualRecurringRevenue"]
FIELDS += ["profile", "id", "ownerId", "createdAt", "people", "company", "amountMicros"]
OPERATORS = ["eq", "neq", "in", "contains", "startsWith", "endsWith", "gt", "gte", "lt", "lte"]
OPERATORS += ["is", "isNot", "and", "or", "not"]
KEYS = st.one_of(st.sampled_from(FIELDS + OPERATORS), st.text(max_size=8))


def _encoded(value: Any) -> str:
    return orjson.dumps(value).decode()


SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
    st.sampled_from(
        ["\u0000", "a\u0000b", "null", "2026-01-31", "9" * 30, "\uff21\uff22\uff03", "x" * 3000]
    ),
).map(_encoded)
# Number literals beyond what 64 bits (or a double) hold.
HUGE_NUMBERS = st.sampled_from(["99999999999999999999999999", "-1" + "0" * 400, "1e400"])
OPENERS = {"[": "]", '{"a": ': "}", '{"not": ': "}", '{"name": ': "}", '{"and": [': "]}"}


def _deep(args: tuple[int, str, str]) -> str:
    depth, opener, leaf = args
    return opener * depth + leaf + OPENERS[opener] * depth


def _object(items: dict[str, str]) -> str:
    return "{" + ", ".join(f"{_encoded(key)}: {value}" for key, value in items.items()) + "}"


LEAVES = st.one_of(SCALARS, HUGE_NUMBERS)
DEEP = st.tuples(st.integers(1, 1100), st.sampled_from(sorted(OPENERS)), LEAVES).map(_deep)
JSON_TEXT = st.recursive(
    st.one_of(LEAVES, DEEP),
    lambda children: st.one_of(
        st.lists(children, max_size=4).map(lambda items: "[" + ", ".join(items) + "]"),
        st.dictionaries(KEYS, children, max_size=4).map(_object),
    ),
    max_leaves=12,
)
OBJECT_TEXT = st.dictionaries(KEYS, JSON_TEXT, max_size=4).map(_object)


@pytest.fixture(scope="module")
def api(client: httpx.Client) -> Api:
    api = Api.signup(client)
    api.create_field(api.object_id("company"), "profile", "RAW_JSON")
    return api


@pytest.fixture(scope="module")
def company(api: Api) -> str:
    record_id: str = api.create("companies", {"name": "Acme"})["id"]
    return record_id


def _answered(response: httpx.Response, sent: Any) -> None:
    """Not a server error, and the connection kept for the next request."""
    assert response.status_code < 500, (sent, response.status_code, response.text[:500])
    assert "close" not in response.headers.get("connection", "").lower(), sent


def _fuzz(function: Any) -> Any:
    return settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )(function)


def test_rest_bodies_never_fail_on_the_server(api: Api, company: str) -> None:
    @_fuzz
    @given(body=OBJECT_TEXT, raw=JSON_TEXT, shape=st.integers(0, 4))
    def check(body: str, raw: str, shape: int) -> None:
        method, path, content = [
            ("POST", "/rest/companies", body),
            ("PATCH", f"/rest/companies/{company}", body),
            ("POST", "/rest/batch/companies", f"[{body}, {raw}]"),
            ("POST", "/rest/companies/duplicates", body),
            ("POST", "/rest/companies", raw),
        ][shape]
        headers = {**api.headers, "Content-Type": "application/json"}
        response = api.http.request(method, path, content=content, headers=headers)
        _answered(response, (method, path, content[:300]))

    check()


PARAMETERS = ["limit", "after", "before", "orderBy", "orderBy[name]", "orderBy[employees]"]
PARAMETERS += ["fields", "depth", "filter", "filter[name]", "filter[company][name]", "x"]


def test_rest_filters_never_fail_on_the_server(api: Api) -> None:
    @_fuzz
    @given(
        flt=st.one_of(OBJECT_TEXT, JSON_TEXT),
        field=st.sampled_from(FIELDS),
        operator=st.sampled_from(OPERATORS),
        text=st.one_of(st.text(max_size=12), HUGE_NUMBERS, st.sampled_from(["null", "[1,2]"])),
        others=st.dictionaries(st.sampled_from(PARAMETERS), st.text(max_size=16), max_size=3),
    )
    def check(flt: str, field: str, operator: str, text: str, others: dict[str, str]) -> None:
        for params in ({"filter": flt}, {f"filter[{field}][{operator}]": text}, others):
            response = api.rest("GET", "/rest/companies", params=params)
            _answered(response, params)

    check()


QUERIES = [
    "query($v: CompanyFilter) { companies(filter: $v) { totalCount } }",
    "mutation($v: CompanyCreateInput!) { createCompany(data: $v) { id } }",
    "mutation($v: [CompanyCreateInput!]!) { createCompanies(data: $v) { id } }",
    "query($v: JSON) { companies(filter: {profile: {contains: $v}}) { totalCount } }",
    """mutation($v: JSON) { createWorkflow(input: {name: "F", trigger: {type: RECORD_CREATED,
      object: "company", filter: $v}, action: {url: "http://127.0.0.1:9/x", body: "{}"}}) { id }
    }""",
]


def test_graphql_variables_never_fail_on_the_server(api: Api) -> None:
    @_fuzz
    @given(value=st.one_of(OBJECT_TEXT, JSON_TEXT), which=st.integers(0, len(QUERIES) - 1))
    def check(value: str, which: int) -> None:
        content = '{"query": ' + _encoded(QUERIES[which]) + ', "variables": {"v": ' + value + "}}"
        headers = {**api.headers, "Content-Type": "application/json"}
        response = api.http.post("/graphql", content=content, headers=headers)
        _answered(response, (which, value[:300]))
        for error in response.json().get("errors") or []:
            code = error.get("extensions", {}).get("code")
            assert code != "INTERNAL_SERVER_ERROR", (which, value[:300], error)

    check()
