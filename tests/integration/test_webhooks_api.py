"""The webhook API through GraphQL: the secret shown once, listing, update, delete, pagination,
validation naming the field (and changing nothing), the API_KEYS_AND_WEBHOOKS permission, and
isolation between workspaces."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from crm.metadata.v1 import metadata_pb2 as md
from crmstack.client import Session, graphql, graphql_data, login, signup, unique_email
from tests.integration import webhooks_client
from tests.integration.webhooks_client import (
    CREATE,
    DELETE,
    DELIVERIES,
    REDELIVER,
    ROTATE,
    UPDATE,
    WEBHOOK_FIELDS,
    Hooks,
)

LIST = f"""query($first: Int, $after: UUID) {{
  webhooks(first: $first, after: $after) {{ {WEBHOOK_FIELDS} }}
}}"""
GET = f"query($id: UUID!) {{ webhook(id: $id) {{ {WEBHOOK_FIELDS} }} }}"
ADD_MEMBER = (
    "mutation($input: AddWorkspaceMemberInput!) { addWorkspaceMember(input: $input) { id } }"
)
CREATE_ROLE = "mutation($input: CreateRoleInput!) { createRole(input: $input) { id } }"


receiver = webhooks_client.receiver
hooks = webhooks_client.hooks


def error_of(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert body.get("errors"), response.text
    assert body["data"] is None or not any(body["data"].values()), response.text
    error: dict[str, Any] = body["errors"][0]
    return error


def test_create_shows_the_secret_once_and_lists_without_it(hooks: Hooks) -> None:
    url = hooks.receiver.url("/crm")
    created = hooks.gql(
        CREATE,
        {"input": {"targetUrl": url, "operations": ["person.created", "company.*"],
                   "description": "CRM sync"}},
    )["createWebhook"]  # fmt: skip
    assert created["secret"].startswith("whsec_")
    assert len(created["secret"]) > 40
    assert created["targetUrl"] == url
    assert created["operations"] == ["person.created", "company.*"]
    assert created["operation"] == "person.created"  # the first operation
    assert created["isActive"] is True
    assert created["description"] == "CRM sync"
    assert created["createdAt"] == created["updatedAt"]
    listed = hooks.gql(LIST)["webhooks"]
    assert listed == [{**created, "secret": None}]
    assert hooks.gql(GET, {"id": created["id"]})["webhook"] == {**created, "secret": None}
    # The metadata endpoint serves the same operations.
    on_metadata = graphql(hooks.client, hooks.admin.access_token, LIST, path="/metadata")
    assert on_metadata.json()["data"]["webhooks"] == listed


def test_update_changes_only_what_is_given(hooks: Hooks) -> None:
    webhook = hooks.create(["person.created"])
    updated = hooks.gql(
        UPDATE, {"input": {"id": webhook["id"], "operations": ["*.*"], "description": "all"}}
    )["updateWebhook"]
    assert updated["operations"] == ["*.*"]
    assert updated["operation"] == "*.*"
    assert updated["description"] == "all"
    assert updated["targetUrl"] == webhook["targetUrl"]
    assert updated["secret"] is None
    assert updated["updatedAt"] > webhook["updatedAt"]
    paused = hooks.gql(UPDATE, {"input": {"id": webhook["id"], "isActive": False}})
    assert paused["updateWebhook"]["isActive"] is False
    assert paused["updateWebhook"]["operations"] == ["*.*"]
    moved = hooks.gql(
        UPDATE,
        {"input": {"id": webhook["id"], "targetUrl": hooks.receiver.url("/moved"),
                   "isActive": True}},
    )["updateWebhook"]  # fmt: skip
    assert moved["targetUrl"].endswith("/moved")
    assert moved["isActive"] is True
    # Duplicate operations are kept once, in order.
    twice = hooks.gql(
        UPDATE, {"input": {"id": webhook["id"], "operations": ["person.*", " person.* ", "*.*"]}}
    )["updateWebhook"]
    assert twice["operations"] == ["person.*", "*.*"]


def test_delete_returns_the_id_and_the_webhook_is_gone(hooks: Hooks) -> None:
    webhook = hooks.create(["person.created"])
    assert hooks.gql(DELETE, {"id": webhook["id"]}) == {"deleteWebhook": webhook["id"]}
    assert hooks.gql(LIST)["webhooks"] == []
    for query, variables in [
        (DELETE, {"id": webhook["id"]}),
        (GET, {"id": webhook["id"]}),
        (ROTATE, {"id": webhook["id"]}),
        (UPDATE, {"input": {"id": webhook["id"], "description": "x"}}),
        (DELIVERIES, {"webhookId": webhook["id"]}),
        (REDELIVER, {"id": webhook["id"]}),
    ]:
        error = hooks.gql_error(query, variables)
        assert error["extensions"]["code"] == "NOT_FOUND", (query, error)


def test_webhooks_page_with_first_and_after(hooks: Hooks) -> None:
    made = [hooks.create(["person.created"])["id"] for _ in range(3)]
    first = hooks.gql(LIST, {"first": 2})["webhooks"]
    assert [w["id"] for w in first] == made[:2]
    rest = hooks.gql(LIST, {"first": 2, "after": first[-1]["id"]})["webhooks"]
    assert [w["id"] for w in rest] == made[2:]
    error = hooks.gql_error(LIST, {"first": 500})
    assert error["extensions"] == {"code": "BAD_USER_INPUT", "field": "first"}


def test_delivery_log_pages_newest_first(hooks: Hooks) -> None:
    webhook = hooks.create(["person.created"])
    hooks.ws.create_many("person", [{"firstName": f"p{i}"} for i in range(5)])
    hooks.wait_events(webhook["path"], 5)
    hooks.wait_deliveries(webhook["id"], 5)
    every = hooks.deliveries(webhook["id"])
    assert len(every) == 5
    stamps = [d["createdAt"] for d in every]
    assert stamps == sorted(stamps, reverse=True)
    page = hooks.gql(DELIVERIES, {"webhookId": webhook["id"], "first": 2})["webhookDeliveries"]
    assert [e["node"]["id"] for e in page["edges"]] == [d["id"] for d in every[:2]]
    assert page["pageInfo"]["hasNextPage"] is True
    assert page["pageInfo"]["endCursor"] == page["edges"][-1]["cursor"]
    seen = [e["node"]["id"] for e in page["edges"]]
    while page["pageInfo"]["hasNextPage"]:
        page = hooks.gql(
            DELIVERIES,
            {"webhookId": webhook["id"], "first": 2, "after": page["pageInfo"]["endCursor"]},
        )["webhookDeliveries"]
        assert page["pageInfo"]["hasPreviousPage"] is True
        seen += [e["node"]["id"] for e in page["edges"]]
    assert seen == [d["id"] for d in every]
    assert hooks.deliveries(webhook["id"], status="FAILED") == []
    assert len(hooks.deliveries(webhook["id"], status="DELIVERED")) == 5


LONG_URL = "https://example.com/" + "a" * 2030
INVALID: list[tuple[dict[str, Any], str, str]] = [
    ({"targetUrl": "ftp://example.com/x"}, "targetUrl", "http or https"),
    ({"targetUrl": "example.com/hook"}, "targetUrl", "http or https"),
    ({"targetUrl": ""}, "targetUrl", "required"),
    ({"targetUrl": LONG_URL}, "targetUrl", "2048"),
    ({"targetUrl": "https://user:pass@example.com/"}, "targetUrl", "user name or password"),
    ({"targetUrl": "https:///nohost"}, "targetUrl", "host"),
    ({"targetUrl": "http://example.com:99999/"}, "targetUrl", "port"),
    ({"operations": []}, "operations", "at least one"),
    ({"operations": ["person.created", "person"]}, "operations", "operations[1]"),
    ({"operations": ["person.merged"]}, "operations", "{object|*}"),
    ({"operations": ["unicorn.created"]}, "operations", "unknown object 'unicorn'"),
    ({"operations": ["Person.created"]}, "operations", "operations[0]"),
    ({"operations": ["*.*", "*"]}, "operations", "operations[1]"),
    ({"description": "x" * 2001}, "description", "2000"),
]


@pytest.mark.parametrize(("change", "field", "message"), INVALID)
def test_invalid_input_is_400_naming_the_field_and_changes_nothing(
    hooks: Hooks, change: dict[str, Any], field: str, message: str
) -> None:
    good = {"targetUrl": hooks.receiver.url("/x"), "operations": ["person.created"]}
    error = hooks.gql_error(CREATE, {"input": {**good, **change}})
    assert error["extensions"] == {"code": "BAD_USER_INPUT", "field": field}, error
    assert message in error["message"], error
    assert error["path"] == ["createWebhook"]
    webhook = hooks.create(["person.created"])
    error = hooks.gql_error(UPDATE, {"input": {"id": webhook["id"], **change}})
    assert error["extensions"] == {"code": "BAD_USER_INPUT", "field": field}, error
    # Neither the refused create nor the refused update changed anything.
    unchanged = {key: value for key, value in webhook.items() if key != "path"}
    assert hooks.gql(LIST)["webhooks"] == [{**unchanged, "secret": None}]


def test_custom_objects_are_known_operations(hooks: Hooks) -> None:
    hooks.ws.metadata.CreateObject(
        md.CreateObjectRequest(name_singular="invoice", name_plural="invoices",
                               label_singular="Invoice", label_plural="Invoices"),
        metadata=hooks.ws.call, timeout=60,
    )  # fmt: skip
    webhook = hooks.create(["invoice.created", "invoice.*"])
    assert webhook["operations"] == ["invoice.created", "invoice.*"]


def test_a_role_without_the_permission_is_forbidden(hooks: Hooks) -> None:
    webhook = hooks.create(["person.created"])
    email = unique_email("member")
    graphql_data(
        hooks.client,
        hooks.admin.access_token,
        ADD_MEMBER,
        {"input": {"email": email, "password": "member password"}},
    )
    member = login(hooks.client, email, "member password", hooks.admin.workspace_id)
    calls: list[tuple[str, dict[str, Any]]] = [
        (LIST, {}),
        (GET, {"id": webhook["id"]}),
        (CREATE, {"input": {"targetUrl": hooks.receiver.url("/m"), "operations": ["*.*"]}}),
        (UPDATE, {"input": {"id": webhook["id"], "description": "mine"}}),
        (DELETE, {"id": webhook["id"]}),
        (ROTATE, {"id": webhook["id"]}),
        (DELIVERIES, {"webhookId": webhook["id"]}),
    ]
    for query, variables in calls:
        response = graphql(hooks.client, member.access_token, query, variables)
        error = error_of(response)
        assert error["extensions"]["code"] == "FORBIDDEN", (query, error)
        assert "API_KEYS_AND_WEBHOOKS" in error["message"]
    # A custom role with the flag may manage webhooks.
    role = graphql_data(
        hooks.client,
        hooks.admin.access_token,
        CREATE_ROLE,
        {"input": {"name": "Integrations", "flags": ["API_KEYS_AND_WEBHOOKS"]}},
    )["createRole"]
    email = unique_email("integrator")
    graphql_data(
        hooks.client,
        hooks.admin.access_token,
        ADD_MEMBER,
        {"input": {"email": email, "password": "member password", "roleId": role["id"]}},
    )
    integrator = login(hooks.client, email, "member password", hooks.admin.workspace_id)
    listed = graphql_data(hooks.client, integrator.access_token, LIST)["webhooks"]
    assert [w["id"] for w in listed] == [webhook["id"]]
    # Unchanged by the refused calls.
    assert hooks.gql(GET, {"id": webhook["id"]})["webhook"]["description"] == ""


def test_other_workspaces_cannot_see_or_touch_a_webhook(hooks: Hooks, client: httpx.Client) -> None:
    webhook = hooks.create(["person.created"])
    other: Session = signup(client)
    assert graphql_data(client, other.access_token, LIST)["webhooks"] == []
    for query, variables in [
        (GET, {"id": webhook["id"]}),
        (DELETE, {"id": webhook["id"]}),
        (ROTATE, {"id": webhook["id"]}),
        (DELIVERIES, {"webhookId": webhook["id"]}),
    ]:
        error = error_of(graphql(client, other.access_token, query, variables))
        assert error["extensions"]["code"] == "NOT_FOUND", (query, error)
    assert hooks.gql(GET, {"id": webhook["id"]})["webhook"]["id"] == webhook["id"]


def test_unauthenticated_calls_are_refused(client: httpx.Client) -> None:
    response = graphql(client, None, LIST)
    assert response.status_code == 401
    assert response.json()["errors"][0]["extensions"]["code"] == "UNAUTHENTICATED"
