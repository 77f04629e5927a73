"""The workflow API over GraphQL: saving, validation errors in the spec's shape, activation,
permissions, and testWorkflow sending one request to a receiver on loopback."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import orjson
import pytest

from crmstack.client import graphql, login, signup, unique_email
from tests.integration import workflows_client
from tests.integration.workflows_client import (
    ACTIVATE,
    CREATE,
    DEACTIVATE,
    DELETE,
    GET,
    LIST,
    RUNS,
    TEST,
    UPDATE,
    Flows,
)

ADD_MEMBER = (
    "mutation($input: AddWorkspaceMemberInput!) { addWorkspaceMember(input: $input) { id } }"
)
CHAT_BODY = '{"text": "New deal: {{name}} ({{amount}})"}'


receiver = workflows_client.receiver
flows = workflows_client.flows


def _input(flows: Flows, trigger: dict[str, Any], **action: Any) -> dict[str, Any]:
    return {
        "input": {
            "name": "Deal alert",
            "trigger": trigger,
            "action": {"url": flows.receiver.url("/chat"), "body": CHAT_BODY, **action},
        }
    }


CREATED = {"type": "RECORD_CREATED", "object": "opportunity"}


def test_a_workflow_is_saved_configured_then_activated_and_deactivated(flows: Flows) -> None:
    variables = _input(
        flows,
        {
            "type": "RECORD_UPDATED",
            "object": "opportunity",
            "filter": {"stage": {"eq": "QUALIFIED"}},
            "fields": ["stage"],
        },
        headers={"Authorization": "Bearer chat-token"},
    )
    workflow = flows.gql(CREATE, variables)["createWorkflow"]
    assert workflow["status"] == "CONFIGURED"
    assert workflow["trigger"] == {
        "type": "RECORD_UPDATED",
        "object": "opportunity",
        "filter": {"stage": {"eq": "QUALIFIED"}},
        "fields": ["stage"],
        "cron": None,
        "timezone": None,
    }
    assert workflow["action"] == {
        "type": "SEND_HTTP_REQUEST",
        "method": "POST",
        "url": flows.receiver.url("/chat"),
        "headers": {"Authorization": "***"},  # secrets are write-only
        "body": CHAT_BODY,
        "secretParams": [],
    }
    assert flows.gql(GET, {"id": workflow["id"]})["workflow"] == workflow
    active = flows.gql(ACTIVATE, {"id": workflow["id"]})["activateWorkflow"]
    assert active["status"] == "ACTIVE"
    assert [w["id"] for w in flows.gql(LIST, {"status": "ACTIVE"})["workflows"]] == [workflow["id"]]
    renamed = flows.gql(UPDATE, {"input": {"id": workflow["id"], "name": "Renamed"}})
    assert renamed["updateWorkflow"]["name"] == "Renamed"
    assert renamed["updateWorkflow"]["status"] == "ACTIVE"
    inactive = flows.gql(DEACTIVATE, {"id": workflow["id"]})["deactivateWorkflow"]
    assert inactive["status"] == "CONFIGURED"
    assert flows.gql(LIST, {"status": "ACTIVE"})["workflows"] == []
    assert flows.gql(DELETE, {"id": workflow["id"]})["deleteWorkflow"] == workflow["id"]
    error = flows.gql_error(GET, {"id": workflow["id"]})
    assert error["extensions"]["code"] == "NOT_FOUND"


def test_a_daily_schedule_runs_next_at_nine_in_its_time_zone(flows: Flows) -> None:
    variables = _input(
        flows, {"type": "SCHEDULED", "cron": "0 9 * * *", "timezone": "Europe/Paris"},
        body='{"text": "Daily digest {{scheduledAt}}"}',
    )  # fmt: skip
    workflow = flows.gql(CREATE, variables)["createWorkflow"]
    assert workflow["trigger"]["cron"] == "0 9 * * *"
    assert workflow["trigger"]["timezone"] == "Europe/Paris"
    assert workflow["trigger"]["object"] is None
    assert workflow["nextRunAt"] is None  # not active yet
    active = flows.gql(ACTIVATE, {"id": workflow["id"]})["activateWorkflow"]
    next_run = datetime.fromisoformat(active["nextRunAt"].replace("Z", "+00:00"))
    local = next_run.astimezone(ZoneInfo("Europe/Paris"))
    assert (local.hour, local.minute, local.second) == (9, 0, 0)
    assert timedelta(0) < next_run - datetime.now(UTC) <= timedelta(days=1)


@pytest.mark.parametrize(
    ("trigger", "action", "field"),
    [
        ({"type": "SCHEDULED", "cron": "61 * * * *"}, {}, "trigger.cron"),
        ({"type": "SCHEDULED", "cron": "0 9 * * *", "timezone": "Mars/Olympus"}, {},
         "trigger.timezone"),
        ({"type": "SCHEDULED", "cron": "0 9 * * *"}, {}, "action.body"),  # {{name}}: no record
        ({"type": "RECORD_CREATED", "object": "planet"}, {}, "trigger.object"),
        ({**CREATED, "filter": {"stage": {"like": "Q"}}}, {}, "trigger.filter"),
        ({**CREATED, "filter": {"nope": {"eq": 1}}}, {}, "trigger.filter"),
        ({"type": "RECORD_UPDATED", "object": "opportunity", "fields": ["nope"]}, {},
         "trigger.fields"),
        (CREATED, {"body": '{"text": "{{nope}}"}'}, "action.body"),
        (CREATED, {"body": '{"text": "{{company.nope}}"}'}, "action.body"),
        (CREATED, {"body": '{"text": "{{name}"}'}, "action.body"),
        (CREATED, {"url": "ftp://chat.example.com/in"}, "action.url"),
        (CREATED, {"url": "https://{{name}}.example.com/in"}, "action.url"),
        (CREATED, {"headers": {"X-Deal": "{{nope}}"}}, "action.headers.X-Deal"),
        (CREATED, {"method": "BREW"}, "action.method"),
    ],
)  # fmt: skip
def test_bad_input_is_a_bad_user_input_naming_the_field(
    flows: Flows, trigger: dict[str, Any], action: dict[str, Any], field: str
) -> None:
    error = flows.gql_error(CREATE, _input(flows, trigger, **action))
    assert error["extensions"]["code"] == "BAD_USER_INPUT", error
    assert error["extensions"]["field"] == field, error
    assert error["path"] == ["createWorkflow"]
    assert flows.gql(LIST)["workflows"] == []


def test_a_role_without_the_workflows_permission_is_forbidden(flows: Flows) -> None:
    workflow = flows.gql(CREATE, _input(flows, CREATED))["createWorkflow"]
    email = unique_email("member")
    flows.gql(ADD_MEMBER, {"input": {"email": email, "password": "member password"}})
    member = login(flows.client, email, "member password", flows.admin.workspace_id)
    for query, variables in [
        (LIST, {}),
        (GET, {"id": workflow["id"]}),
        (CREATE, _input(flows, CREATED)),
        (UPDATE, {"input": {"id": workflow["id"], "name": "mine"}}),
        (ACTIVATE, {"id": workflow["id"]}),
        (TEST, {"id": workflow["id"]}),
        (RUNS, {"workflowId": workflow["id"]}),
        (DELETE, {"id": workflow["id"]}),
    ]:
        body = graphql(flows.client, member.access_token, query, variables).json()
        assert body["errors"][0]["extensions"]["code"] == "FORBIDDEN", (query, body)
    # Another workspace's admin does not see it at all.
    other = signup(flows.client)
    body = graphql(flows.client, other.access_token, GET, {"id": workflow["id"]}).json()
    assert body["errors"][0]["extensions"]["code"] == "NOT_FOUND"


def test_test_workflow_sends_once_with_the_given_record_and_masks_secrets(flows: Flows) -> None:
    path = flows.path()
    workflow = flows.gql(
        CREATE,
        {
            "input": {
                "name": "Deal alert",
                "trigger": CREATED,
                "action": {
                    "url": flows.receiver.url(path) + "?deal={{name}}",
                    "headers": {"Authorization": "Bearer chat-token", "X-Stage": "{{stage}}"},
                    "body": CHAT_BODY,
                },
            }
        },
    )["createWorkflow"]
    record = {"name": 'Rénovation "Tour" 🚀', "amount": 1500, "stage": "QUALIFIED"}
    run = flows.gql(TEST, {"id": workflow["id"], "record": record})["testWorkflow"]
    assert run["status"] == "SUCCEEDED"
    assert run["isTest"] is True
    assert run["attempts"] == 1
    assert run["responseStatus"] == 200
    assert run["responseExcerpt"] == "ok"
    assert run["request"]["headers"]["Authorization"] == "***"
    assert run["request"]["headers"]["X-Stage"] == "QUALIFIED"
    (sent,) = flows.receiver.requests(path)
    assert sent.json() == {"text": 'New deal: Rénovation "Tour" 🚀 (1500)'}
    assert sent.headers["authorization"] == "Bearer chat-token"
    assert sent.headers["content-type"] == "application/json"
    assert sent.path == path + "?deal=R%C3%A9novation%20%22Tour%22%20%F0%9F%9A%80"
    assert run["request"]["body"] == sent.body.decode()
    assert "x-crm-workflow-run" in sent.headers
    assert sent.headers["traceparent"].startswith("00-")
    # Still not active: a test never activates.
    assert flows.gql(GET, {"id": workflow["id"]})["workflow"]["status"] == "CONFIGURED"
    assert [r["id"] for r in flows.runs(workflow["id"])] == [run["id"]]
    # Without a record: the object's latest record, or a sample when it has none.
    sample = flows.gql(TEST, {"id": workflow["id"]})["testWorkflow"]
    assert sample["status"] == "SUCCEEDED"
    flows.rest("POST", "opportunities", json={"name": "Latest deal", "amount": 7})
    latest = flows.gql(TEST, {"id": workflow["id"]})["testWorkflow"]
    assert orjson.loads(latest["request"]["body"]) == {"text": "New deal: Latest deal (7)"}


def test_test_workflow_names_a_missing_variable(flows: Flows) -> None:
    workflow = flows.gql(CREATE, _input(flows, CREATED))["createWorkflow"]
    error = flows.gql_error(TEST, {"id": workflow["id"], "record": {"name": "No amount"}})
    assert error["extensions"]["code"] == "BAD_USER_INPUT"
    assert error["extensions"]["field"] == "action.body"
    assert "{{amount}}" in error["message"]
    assert flows.runs(workflow["id"]) == []


def test_a_failing_test_is_reported_in_the_run(flows: Flows) -> None:
    path = flows.path()
    flows.receiver.handlers[path] = lambda request: 503
    workflow = flows.gql(
        CREATE,
        {"input": {"name": "x", "trigger": CREATED,
                   "action": {"url": flows.receiver.url(path), "body": CHAT_BODY}}},
    )["createWorkflow"]  # fmt: skip
    run = flows.gql(TEST, {"id": workflow["id"], "record": {"name": "a", "amount": 1}})
    run = run["testWorkflow"]
    assert run["status"] == "FAILED"
    assert run["responseStatus"] == 503
    assert run["error"] == "HTTP 503: not handled"
    assert run["attempts"] == 1
