"""Webhooks and workflows never pass on what the person who saved them cannot read: their
operations, trigger object and the relations their templates follow need READ on every record
of those objects, checked when they are created, changed, activated or tested."""

from __future__ import annotations

from typing import Any

import httpx

from crmstack.client import Session, graphql, graphql_data, login, signup, unique_email

CREATE_ROLE = "mutation($input: CreateRoleInput!) { createRole(input: $input) { id } }"
ADD = "mutation($input: AddWorkspaceMemberInput!) { addWorkspaceMember(input: $input) { id } }"
CREATE_WEBHOOK = (
    "mutation($i: CreateWebhookInput!) { createWebhook(input: $i) { id targetUrl operations } }"
)
UPDATE_WEBHOOK = "mutation($i: UpdateWebhookInput!) { updateWebhook(input: $i) { id } }"
WEBHOOKS = "{ webhooks { id targetUrl operations } }"
CREATE_WORKFLOW = "mutation($i: CreateWorkflowInput!) { createWorkflow(input: $i) { id } }"
TEST_WORKFLOW = "mutation($id: UUID!) { testWorkflow(id: $id) { id status } }"
ACTIVATE = "mutation($id: UUID!) { activateWorkflow(id: $id) { id status } }"
TARGET = "http://127.0.0.1:9/hook"


def _user(
    client: httpx.Client, admin: Session, flag: str, permissions: list[dict[str, Any]]
) -> Session:
    role_id = graphql_data(
        client,
        admin.access_token,
        CREATE_ROLE,
        {"input": {"name": f"role {unique_email()}", "permissions": permissions, "flags": [flag]}},
    )["createRole"]["id"]
    email = unique_email("flagged")
    graphql_data(
        client,
        admin.access_token,
        ADD,
        {"input": {"email": email, "password": "flagged password", "roleId": role_id}},
    )
    return login(client, email, "flagged password", admin.workspace_id)


def _forbidden(
    client: httpx.Client, user: Session, query: str, variables: dict[str, Any]
) -> dict[str, Any]:
    body = graphql(client, user.access_token, query, variables).json()
    assert body.get("errors"), body
    error: dict[str, Any] = body["errors"][0]
    assert error["extensions"]["code"] == "FORBIDDEN", body
    return error


def _webhook(operations: list[str]) -> dict[str, Any]:
    return {"i": {"targetUrl": TARGET, "operations": operations}}


def test_a_webhook_subscribes_only_to_objects_its_creator_reads_in_full(
    client: httpx.Client,
) -> None:
    admin = signup(client)
    no_reads = _user(client, admin, "API_KEYS_AND_WEBHOOKS", [])
    for operations in (["*.*"], ["person.created"]):
        error = _forbidden(client, no_reads, CREATE_WEBHOOK, _webhook(operations))
        assert "READ on every record" in error["message"]
    people = _user(
        client, admin, "API_KEYS_AND_WEBHOOKS", [{"object": "person", "actions": ["READ"]}]
    )
    for operations in (["*.*"], ["company.created"], ["person.*", "*.deleted"]):
        _forbidden(client, people, CREATE_WEBHOOK, _webhook(operations))
    created = graphql_data(client, people.access_token, CREATE_WEBHOOK, _webhook(["person.*"]))
    assert created["createWebhook"]["operations"] == ["person.*"]
    # An admin's `*.*` webhook cannot be redirected by someone who cannot read everything.
    everything = graphql_data(client, admin.access_token, CREATE_WEBHOOK, _webhook(["*.*"]))
    webhook_id = everything["createWebhook"]["id"]
    _forbidden(
        client,
        people,
        UPDATE_WEBHOOK,
        {"i": {"id": webhook_id, "targetUrl": "http://127.0.0.1:9/mine"}},
    )
    _forbidden(client, people, UPDATE_WEBHOOK, {"i": {"id": webhook_id, "isActive": True}})
    hooks = {w["id"]: w for w in graphql_data(client, admin.access_token, WEBHOOKS)["webhooks"]}
    assert hooks[webhook_id]["targetUrl"] == TARGET
    assert len(hooks) == 2


def _workflow(trigger_object: str, body: str) -> dict[str, Any]:
    return {
        "i": {
            "name": f"flow {unique_email()}",
            "trigger": {"type": "RECORD_CREATED", "object": trigger_object},
            "action": {"url": TARGET, "body": body},
        }
    }


def test_a_workflow_reads_only_what_the_person_saving_or_testing_it_reads(
    client: httpx.Client,
) -> None:
    admin = signup(client)
    people = _user(client, admin, "WORKFLOWS", [{"object": "person", "actions": ["READ"]}])
    # The relation its template follows, or its trigger object, is not readable.
    error = _forbidden(
        client, people, CREATE_WORKFLOW, _workflow("person", '{"c": "{{company.name}}"}')
    )
    assert "company" in error["message"]
    _forbidden(client, people, CREATE_WORKFLOW, _workflow("company", '{"n": "{{name}}"}'))
    # What it may read, it may automate.
    graphql_data(client, people.access_token, CREATE_WORKFLOW, _workflow("person", "{{firstName}}"))
    # An admin's workflow reading companies: neither tested nor activated by that role.
    flow = graphql_data(
        client, admin.access_token, CREATE_WORKFLOW, _workflow("company", '{"n": "{{name}}"}')
    )["createWorkflow"]
    _forbidden(client, people, TEST_WORKFLOW, {"id": flow["id"]})
    _forbidden(client, people, ACTIVATE, {"id": flow["id"]})
    runs = graphql_data(
        client,
        admin.access_token,
        "query($id: UUID!) { workflowRuns(workflowId: $id) { edges { node { id } } } }",
        {"id": flow["id"]},
    )
    assert runs["workflowRuns"]["edges"] == []
