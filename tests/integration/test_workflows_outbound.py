"""What a workflow's author cannot make its requests do: frame them (framing and hop-by-hop
headers are refused), share a connection with another workspace, or change the request's shape
through a record's values (path dot segments, form parameters). Webhook deliveries do not share
connections between workspaces either."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import parse_qs

import asyncpg
import httpx
import orjson
import pytest

from crmstack.stack import Stack
from tests.integration import workflows_client
from tests.integration.webhooks_client import CREATE as CREATE_WEBHOOK
from tests.integration.workflows_client import (
    ACTIVATE,
    CREATE,
    TEST,
    UPDATE,
    Flows,
    Receiver,
    make_flows,
)

CREATED = {"type": "RECORD_CREATED", "object": "opportunity"}


receiver = workflows_client.receiver
flows = workflows_client.flows


def _create(flows: Flows, url: str, **action: Any) -> dict[str, Any]:
    variables = {
        "input": {"name": "Outbound", "trigger": CREATED, "action": {"url": url, **action}}
    }
    workflow: dict[str, Any] = flows.gql(CREATE, variables)["createWorkflow"]
    return workflow


def _test(flows: Flows, workflow_id: str, record: dict[str, Any]) -> dict[str, Any]:
    run: dict[str, Any] = flows.gql(TEST, {"id": workflow_id, "record": record})["testWorkflow"]
    return run


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("Host", "{{name}}"),
        ("host", "chat.example.com"),
        ("Content-Length", "3"),
        ("Transfer-Encoding", "chunked"),
        ("Connection", "keep-alive"),
        ("Keep-Alive", "timeout=5"),
        ("TE", "trailers"),
        ("Trailer", "X-Sum"),
        ("Upgrade", "websocket"),
        ("Expect", "100-continue"),
        ("Proxy-Authorization", "Basic eDp5"),
    ],
)
def test_framing_and_hop_by_hop_headers_are_refused_when_saved(
    flows: Flows, name: str, value: str
) -> None:
    path = flows.path()
    action = {"url": flows.receiver.url(path), "body": '{"n": "{{name}}"}'}
    created = {"input": {"name": "Framed", "trigger": CREATED, "action": action}}
    bad = {**action, "headers": {"X-Ok": "1", name: value}}
    error = flows.gql_error(CREATE, {"input": {**created["input"], "action": bad}})
    assert error["extensions"]["code"] == "BAD_USER_INPUT"
    assert error["extensions"]["field"] == f"action.headers.{name}"
    assert name in error["message"]
    workflow = flows.gql(CREATE, created)["createWorkflow"]
    error = flows.gql_error(UPDATE, {"input": {"id": workflow["id"], "action": bad}})
    assert error["extensions"]["field"] == f"action.headers.{name}"
    run = _test(flows, workflow["id"], {"name": "x"})  # the saved action is unchanged
    assert run["status"] == "SUCCEEDED"
    assert name.lower() not in {key.lower() for key in run["request"]["headers"]}


def test_a_workflow_saved_before_the_rule_is_refused_when_tested_or_activated(
    flows: Flows, local_stack: Stack
) -> None:
    path = flows.path()
    workflow = _create(flows, flows.receiver.url(path), body='{"n": "{{name}}"}')
    framed = {"Transfer-Encoding": "chunked"}

    async def as_saved_before() -> None:
        connection = await asyncpg.connect(local_stack.infra.database_url)  # type: ignore[union-attr]
        try:
            await connection.execute(
                "UPDATE workflows.workflows SET headers = $2::jsonb, secrets = NULL "
                "WHERE id = $1::uuid",
                workflow["id"],
                orjson.dumps(framed).decode(),
            )
        finally:
            await connection.close()

    asyncio.run(as_saved_before())
    for query, variables in ((TEST, {"record": {"name": "x"}}), (ACTIVATE, {})):
        error = flows.gql_error(query, {"id": workflow["id"], **variables})
        assert error["extensions"]["code"] == "BAD_USER_INPUT"
        assert error["extensions"]["field"] == "action.headers.Transfer-Encoding"
    assert flows.receiver.requests(path) == []


def test_a_kept_alive_connection_never_carries_another_workspaces_request(
    local_stack: Stack, client: httpx.Client, receiver: Receiver
) -> None:
    first, second = (make_flows(local_stack, client, receiver) for _ in range(2))
    path = first.path()
    url = receiver.url(path)
    one = _create(first, url, body='{"n": "{{name}}"}')
    other = _create(second, url, body='{"n": "{{name}}"}')
    for flows, workflow, name in ((first, one, "a1"), (first, one, "a2"), (second, other, "b1")):
        assert _test(flows, workflow["id"], {"name": name})["status"] == "SUCCEEDED"
    a1, a2, b1 = receiver.wait(path, 3)
    assert [r.json()["n"] for r in (a1, a2, b1)] == ["a1", "a2", "b1"]
    assert a1.peer_port == a2.peer_port  # connections are kept alive within a workspace
    assert b1.peer_port != a1.peer_port  # but never lent to another one


def test_webhook_deliveries_of_two_workspaces_never_share_a_connection(
    local_stack: Stack, client: httpx.Client, receiver: Receiver
) -> None:
    first, second = (make_flows(local_stack, client, receiver) for _ in range(2))
    path = first.path()
    for flows in (first, second):
        hook = {"targetUrl": receiver.url(path), "operations": ["company.created"]}
        flows.gql(CREATE_WEBHOOK, {"input": hook})
    first.ws.create("company", {"name": "A1"})
    receiver.wait(path, 1)
    first.ws.create("company", {"name": "A2"})
    receiver.wait(path, 2)
    second.ws.create("company", {"name": "B1"})
    delivered = receiver.wait(path, 3)
    by_name = {r.json()["record"]["name"]: r.peer_port for r in delivered}
    assert by_name["A1"] == by_name["A2"]  # kept alive within a workspace
    assert by_name["B1"] != by_name["A1"]  # never lent to another one


@pytest.mark.parametrize("value", ["..", "."])
def test_a_path_value_cannot_be_a_dot_segment(flows: Flows, value: str) -> None:
    path = flows.path()
    workflow = _create(flows, flows.receiver.url(path + "/api/v1/{{name}}/notes"), method="GET")
    run = _test(flows, workflow["id"], {"name": value})
    assert run["status"] == "SUCCEEDED", run
    encoded = value.replace(".", "%2E")
    [received] = flows.receiver.wait(f"{path}/api/v1/{encoded}/notes", 1)
    assert run["request"]["url"] == flows.receiver.url(received.path)


def test_query_and_form_values_stay_one_value(flows: Flows) -> None:
    path = flows.path()
    workflow = _create(
        flows,
        flows.receiver.url(path + "?note={{name}}"),
        headers={"Content-Type": "application/x-www-form-urlencoded"},
        body="note={{name}}&source=crm",
    )
    run = _test(flows, workflow["id"], {"name": "x&role=admin"})
    assert run["status"] == "SUCCEEDED", run
    [received] = flows.receiver.wait(path, 1)
    assert parse_qs(received.path.split("?", 1)[1]) == {"note": ["x&role=admin"]}
    assert parse_qs(received.body.decode()) == {"note": ["x&role=admin"], "source": ["crm"]}
    assert run["request"]["body"] == received.body.decode()
    assert run["request"]["url"] == flows.receiver.url(received.path)
