"""Deliveries and runs follow their author's current access: once whoever last saved a webhook
or workflow may no longer read an object (role changed, member removed, API key deleted), its
records are no longer sent, within the author cache's few seconds, and the delivery log or run
log says why (docs/auth.md)."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from crmkit.authors import AUTHOR_CACHE_SECONDS
from crmstack.client import Session, graphql_data, login, unique_email
from crmstack.stack import Stack
from examples.webhook_receiver import WebhookReceiver
from tests.integration import webhooks_client, workflows_client
from tests.integration.webhooks_client import CREATE as CREATE_WEBHOOK
from tests.integration.webhooks_client import Hooks, make_hooks
from tests.integration.workflows_client import ACTIVATE, Flows, Receiver, make_flows
from tests.integration.workflows_client import CREATE as CREATE_WORKFLOW

CREATE_ROLE = "mutation($input: CreateRoleInput!) { createRole(input: $input) { id } }"
UPDATE_ROLE = "mutation($input: UpdateRoleInput!) { updateRole(input: $input) { id } }"
ADD = "mutation($input: AddWorkspaceMemberInput!) { addWorkspaceMember(input: $input) { id } }"
CREATE_KEY = "mutation($input: CreateApiKeyInput!) { createApiKey(input: $input) { id token } }"
DELETE_KEY = "mutation($id: UUID!) { deleteApiKey(id: $id) }"
# Past the author cache (the access seen by the last delivery may be kept that long).
PAST_CACHE = AUTHOR_CACHE_SECONDS + 1.5


@pytest.fixture(scope="module")
def hook_receiver() -> Iterator[WebhookReceiver]:
    with webhooks_client.running_receiver() as running:
        yield running


@pytest.fixture(scope="module")
def flow_receiver() -> Iterator[Receiver]:
    with workflows_client.running_receiver() as running:
        yield running


def _member_with_role(
    client: httpx.Client, admin: Session, flag: str, readable: str
) -> tuple[Session, str]:
    """A member whose custom role reads every `readable` record and has `flag`."""
    role_id = graphql_data(
        client,
        admin.access_token,
        CREATE_ROLE,
        {
            "input": {
                "name": f"role {unique_email()}",
                "permissions": [{"object": readable, "actions": ["READ"]}],
                "flags": [flag],
            }
        },
    )["createRole"]["id"]
    email = unique_email("author")
    graphql_data(
        client,
        admin.access_token,
        ADD,
        {"input": {"email": email, "password": "author password", "roleId": role_id}},
    )
    return login(client, email, "author password", admin.workspace_id), role_id


def _drop_reads(client: httpx.Client, admin: Session, role_id: str, flag: str) -> None:
    graphql_data(
        client,
        admin.access_token,
        UPDATE_ROLE,
        {"input": {"id": role_id, "permissions": [], "flags": [flag]}},
    )


def _webhook_by(hooks: Hooks, token: str, operations: list[str]) -> dict[str, Any]:
    path = f"/authors/{secrets.token_hex(4)}"
    webhook: dict[str, Any] = graphql_data(
        hooks.client,
        token,
        CREATE_WEBHOOK,
        {"input": {"targetUrl": hooks.receiver.url(path), "operations": operations}},
    )["createWebhook"]
    hooks.receiver.set_secret(path, webhook["secret"])
    webhook["path"] = path
    return webhook


def _refused_after_first(hooks: Hooks, webhook: dict[str, Any], reason: str) -> None:
    """The person created now is not sent: its delivery fails with `reason`, and only the
    first person ever reached the receiver."""
    hooks.create_record("person", {"firstName": "Grace"})
    failed = hooks.wait_deliveries(webhook["id"], 1, status="FAILED")
    assert failed[0]["lastError"] == reason, failed
    assert failed[0]["attemptLog"][-1]["statusCode"] is None
    names = [d.payload["record"]["firstName"] for d in hooks.receiver.events(webhook["path"])]
    assert names == ["Ada"]


@pytest.fixture
def hooks(local_stack: Stack, client: httpx.Client, hook_receiver: WebhookReceiver) -> Hooks:
    return make_hooks(local_stack, client, hook_receiver)


def test_a_webhook_stops_sending_what_its_author_may_no_longer_read(hooks: Hooks) -> None:
    author, role_id = _member_with_role(
        hooks.client, hooks.admin, "API_KEYS_AND_WEBHOOKS", "person"
    )
    webhook = _webhook_by(hooks, author.access_token, ["person.created"])
    hooks.create_record("person", {"firstName": "Ada"})
    hooks.wait_events(webhook["path"], 1)

    _drop_reads(hooks.client, hooks.admin, role_id, "API_KEYS_AND_WEBHOOKS")
    time.sleep(PAST_CACHE)
    _refused_after_first(hooks, webhook, "author may no longer read person")


def test_a_deleted_api_keys_webhook_stops_sending(hooks: Hooks) -> None:
    key = graphql_data(
        hooks.client, hooks.admin.access_token, CREATE_KEY, {"input": {"name": "hooks"}}
    )["createApiKey"]
    webhook = _webhook_by(hooks, key["token"], ["person.created"])
    hooks.create_record("person", {"firstName": "Ada"})
    hooks.wait_events(webhook["path"], 1)

    graphql_data(hooks.client, hooks.admin.access_token, DELETE_KEY, {"id": key["id"]})
    time.sleep(PAST_CACHE)
    _refused_after_first(hooks, webhook, "author API key was deleted or has expired")


@pytest.fixture
def flows(local_stack: Stack, client: httpx.Client, flow_receiver: Receiver) -> Flows:
    return make_flows(local_stack, client, flow_receiver)


def test_a_workflow_stops_running_on_what_its_author_may_no_longer_read(flows: Flows) -> None:
    author, role_id = _member_with_role(flows.client, flows.admin, "WORKFLOWS", "company")
    path = flows.path()
    workflow = graphql_data(
        flows.client,
        author.access_token,
        CREATE_WORKFLOW,
        {
            "input": {
                "name": "companies",
                "trigger": {"type": "RECORD_CREATED", "object": "company"},
                "action": {"url": flows.receiver.url(path), "body": '{"n": "{{name}}"}'},
            }
        },
    )["createWorkflow"]
    graphql_data(flows.client, author.access_token, ACTIVATE, {"id": workflow["id"]})
    flows.ws.create("company", {"name": "Acme"})
    flows.wait_runs(workflow["id"], 1, "SUCCEEDED")

    _drop_reads(flows.client, flows.admin, role_id, "WORKFLOWS")
    time.sleep(PAST_CACHE)
    flows.ws.create("company", {"name": "Globex"})
    failed = flows.wait_runs(workflow["id"], 1, "FAILED")
    assert failed[0]["error"] == "author may no longer read company", failed
    assert failed[0]["request"] is None
    # The run log does not show the record either.
    assert failed[0]["triggerEvent"]["record"] is None
    assert [r.json() for r in flows.receiver.requests(path)] == [{"n": "Acme"}]
