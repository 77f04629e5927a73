"""Values PostgreSQL cannot store or compute are the client's 400, never a 500."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest

from tests.integration.api_helpers import Api
from tests.integration.subscriptions_client import Socket


@pytest.fixture
def api(client: httpx.Client) -> Api:
    return Api.signup(client)


def test_nul_character_in_text_is_bad_request_and_stores_nothing(api: Api) -> None:
    body = api.bad("POST", "/rest/people", json={"firstName": "Ada\u0000", "lastName": "L"})
    assert "NUL" in body["message"]
    assert api.ok("GET", "/rest/people")["data"] == []


def test_nul_character_in_a_settings_name_is_bad_request(api: Api) -> None:
    error = api.error(
        "mutation($name: String!) { createPersonalAccessToken(input: {name: $name}) { id } }",
        {"name": "token\u0000"},
    )
    assert error["extensions"]["code"] == "BAD_USER_INPUT"


def test_a_sum_beyond_double_precision_is_bad_request(api: Api) -> None:
    for name in ("Huge", "Huger"):
        api.create("companies", {"name": name, "employees": 1e308})
    body = api.bad("GET", "/rest/companies/groupBy", params={"field": "idealCustomerProfile"})
    assert "out of range" in body["message"]


# -- depth, range, parser and name errors (issue 23.5) ----------------------------------------


def _nested(depth: int, leaf: Any, key: str | None = None) -> Any:
    value = leaf
    for _ in range(depth):
        value = {key: value} if key is not None else [value]
    return value


def _client_error(response: httpx.Response) -> None:
    """A client error, the connection kept open for the next request."""
    assert 400 <= response.status_code < 500, response.text
    assert "close" not in response.headers.get("connection", "").lower(), response.headers


def _graphql_bad_input(api: Api, query: str, variables: dict[str, Any]) -> dict[str, Any]:
    response = api.http.post(
        "/graphql", json={"query": query, "variables": variables}, headers=api.headers
    )
    assert response.status_code < 500, response.text
    assert "close" not in response.headers.get("connection", "").lower()
    errors = response.json()["errors"]
    assert errors[0]["extensions"]["code"] == "BAD_USER_INPUT", errors
    error: dict[str, Any] = errors[0]
    return error


@pytest.mark.parametrize("depth", [20, 500, 1000])
def test_a_deeply_nested_rest_filter_is_bad_request(api: Api, depth: int) -> None:
    flt = '{"not": ' * depth + '{"name": {"eq": "x"}}' + "}" * depth  # beyond orjson.dumps
    response = api.rest("GET", "/rest/companies", params={"filter": flt})
    _client_error(response)
    assert response.json()["details"]["field"] == "filter"
    assert "nested" in response.json()["message"]


def test_an_integer_beyond_64_bits_in_a_filter_is_bad_request(api: Api) -> None:
    huge = "99999999999999999999999999"
    response = api.rest("GET", "/rest/companies", params={"filter[employees][gt]": huge})
    _client_error(response)
    assert response.json()["details"]["field"] == "employees"
    response = api.rest(
        "GET", "/rest/companies", params={"filter": '{"employees": {"in": [1, ' + huge + "]}}"}
    )
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("depth", [150, 600, 1000])
def test_a_deeply_nested_raw_json_value_is_bad_request_naming_the_field(
    api: Api, depth: int
) -> None:
    api.create_field(api.object_id("company"), "profile", "RAW_JSON")
    deep = "[" * depth + "1" + "]" * depth  # beyond what json.dumps encodes
    body = api.bad("POST", "/rest/companies", content='{"name": "Deep", "profile": ' + deep + "}")
    assert body["details"]["field"] == "profile"
    assert "nested" in body["message"]
    assert api.ok("GET", "/rest/companies")["data"] == []
    api.create("companies", {"name": "Shallow", "profile": _nested(50, {"a": 1})})


def test_a_deeply_nested_graphql_json_variable_is_bad_request(api: Api) -> None:
    error = _graphql_bad_input(
        api,
        "query($f: CompanyFilter) { companies(filter: $f) { totalCount } }",
        {"f": _nested(500, {"name": {"eq": "x"}}, key="not")},
    )
    assert "nested" in error["message"]
    error = _graphql_bad_input(
        api,
        CREATE_WORKFLOW,
        _workflow(filter=_nested(500, {"name": {"eq": "x"}}, key="not")),
    )
    assert "nested" in error["message"]


CREATE_WORKFLOW = "mutation($input: CreateWorkflowInput!) { createWorkflow(input: $input) { id } }"
CREATE_WEBHOOK = "mutation($input: CreateWebhookInput!) { createWebhook(input: $input) { id } }"


def _workflow(
    url: str = "http://127.0.0.1:9/x", filter: Any = None, **action: Any
) -> dict[str, Any]:
    return {
        "input": {
            "name": "Probe",
            "trigger": {"type": "RECORD_CREATED", "object": "company", "filter": filter},
            "action": {"url": url, "body": "{}", **action},
        }
    }


@pytest.mark.parametrize(
    "url",
    ["http://[::1/x", "http://exa\uff03mple.com/x", "http://a..b/x", f"http://{'a' * 64}.io/"],
)
def test_an_unparseable_url_is_bad_request_naming_it(api: Api, url: str) -> None:
    error = _graphql_bad_input(
        api, CREATE_WEBHOOK, {"input": {"targetUrl": url, "operations": ["*.*"]}}
    )
    assert error["extensions"]["field"] == "targetUrl", error
    error = _graphql_bad_input(api, CREATE_WORKFLOW, _workflow(url))
    assert error["extensions"]["field"] == "action.url", error


def test_nul_in_a_workflow_header_or_test_record_is_bad_request(api: Api) -> None:
    error = _graphql_bad_input(api, CREATE_WORKFLOW, _workflow(headers={"X-Note": "a\u0000b"}))
    assert error["extensions"]["field"] == "action.headers.X-Note", error
    flow = api.data(CREATE_WORKFLOW, _workflow())["createWorkflow"]
    error = _graphql_bad_input(
        api,
        "mutation($id: UUID!, $record: JSON) { testWorkflow(id: $id, record: $record) { id } }",
        {"id": flow["id"], "record": {"name": {"first": ["a\u0000b"]}}},
    )
    assert error["extensions"]["field"] == "record", error


def test_nul_in_settings_text_is_bad_request_without_driver_text(api: Api) -> None:
    attempts = [
        (CREATE_WEBHOOK, {"input": {"targetUrl": "http://127.0.0.1:9/x", "operations": ["*.*"],
                                    "description": "a\u0000b"}}),
        (CREATE_WORKFLOW, {"input": {**_workflow()["input"], "name": "a\u0000b"}}),
        ("mutation($input: CreateRoleInput!) { createRole(input: $input) { id } }",
         {"input": {"name": "a\u0000b"}}),
    ]  # fmt: skip
    for query, variables in attempts:
        error = _graphql_bad_input(api, query, variables)
        assert "0x00" not in error["message"], error
        assert "invalid byte" not in error["message"], error


def test_a_deeply_nested_graphql_literal_is_bad_request(api: Api) -> None:
    literal = "{not: " * 600 + '{name: {eq: "x"}}' + "}" * 600
    _graphql_bad_input(api, f"{{ companies(filter: {literal}) {{ totalCount }} }}", {})


@pytest.mark.parametrize("name", ["xmin", "ctid", "tableoid", "cmax", "xmax", "cmin"])
def test_a_field_named_like_a_system_column_is_bad_request(api: Api, name: str) -> None:
    error = api.error(
        """mutation($input: CreateFieldInput!) { createField(input: $input) { id } }""",
        {
            "input": {
                "objectMetadataId": api.object_id("company"),
                "name": name,
                "label": "System",
                "type": "TEXT",
            }
        },
        path="/metadata",
    )
    assert error["extensions"]["code"] == "BAD_USER_INPUT", error
    assert error["extensions"]["field"] == "name", error


async def test_deeply_nested_variables_over_a_websocket_are_an_operation_error(
    base_url: str, api: Api
) -> None:
    flt = '{"not": ' * 900 + '{"firstName": {"eq": "x"}}' + "}" * 900
    query = _encoded_json("subscription($f: PersonFilter) { personCreated(filter: $f) { id } }")
    async with await Socket.open(base_url) as socket:
        await socket.init(api.session.access_token)
        await socket.connection.send(
            '{"id": "deep", "type": "subscribe", "payload": {"query": '
            + query
            + ', "variables": {"f": '
            + flt
            + "}}}"
        )
        error = await socket.receive()
        assert (error["type"], error["id"]) == ("error", "deep"), error
        assert error["payload"][0]["extensions"]["code"] == "BAD_USER_INPUT", error
        await socket.send({"type": "ping"})
        assert (await socket.receive())["type"] == "pong"


def _encoded_json(text: str) -> str:
    return orjson.dumps(text).decode()
