"""API keys: shown once, carry their role, and stop working at once on deletion or expiry, on
every gateway process, even when Redis loses its data."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
import redis

from crmstack.client import Session, graphql, graphql_data, signup
from crmstack.stack import Stack

CREATE = """
mutation($input: CreateApiKeyInput!) {
  createApiKey(input: $input) { id name expiresAt roleId roleName token createdAt }
}"""
LIST = "{ apiKeys { id name expiresAt roleName token } }"
DELETE = "mutation($id: UUID!) { deleteApiKey(id: $id) }"
WHO = "{ currentUser { id email role kind permissions { object actions ownRecordsOnly } } }"


def _create(client: httpx.Client, session: Session, **fields: Any) -> dict[str, Any]:
    data = graphql_data(client, session.access_token, CREATE, {"input": {"name": "k", **fields}})
    key: dict[str, Any] = data["createApiKey"]
    return key


def _status(client: httpx.Client, token: str) -> tuple[int, dict[str, Any]]:
    response = graphql(client, token, WHO)
    body: dict[str, Any] = response.json()
    return response.status_code, body


def test_create_shows_the_token_once_and_lists_without_it(client: httpx.Client) -> None:
    admin = signup(client)
    key = _create(client, admin, name="CI pipeline")
    assert key["token"].startswith("crm_ak_")
    assert key["roleName"] == "Admin"
    assert key["expiresAt"] is None
    listed = graphql_data(client, admin.access_token, LIST)["apiKeys"]
    assert listed == [
        {
            "id": key["id"],
            "name": "CI pipeline",
            "expiresAt": None,
            "roleName": "Admin",
            "token": None,
        }
    ]


def test_key_acts_with_its_role(client: httpx.Client) -> None:
    admin = signup(client)
    key = _create(client, admin)
    status, body = _status(client, key["token"])
    assert status == 200, body
    who = body["data"]["currentUser"]
    assert who["id"] == key["id"]
    assert who["kind"] == "API_KEY"
    assert who["role"] == "Admin"
    assert who["email"] is None
    assert who["permissions"] == [
        {"object": "*", "actions": ["READ", "WRITE", "DELETE"], "ownRecordsOnly": False}
    ]
    role = graphql_data(
        client,
        admin.access_token,
        """mutation { createRole(input: {name: "Reader",
             permissions: [{object: "person", actions: [READ]}]}) { id } }""",
    )["createRole"]
    reader = _create(client, admin, roleId=role["id"])
    assert reader["roleName"] == "Reader"
    _, body = _status(client, reader["token"])
    assert body["data"]["currentUser"]["permissions"] == [
        {"object": "person", "actions": ["READ"], "ownRecordsOnly": False}
    ]
    # A key cannot manage what needs API_KEYS_AND_WEBHOOKS unless its role has it.
    denied = graphql(client, reader["token"], LIST)
    assert denied.json()["errors"][0]["extensions"]["code"] == "FORBIDDEN"


def test_deleted_key_gets_401_at_once(client: httpx.Client) -> None:
    admin = signup(client)
    key = _create(client, admin)
    assert _status(client, key["token"])[0] == 200
    assert graphql_data(client, admin.access_token, DELETE, {"id": key["id"]}) == {
        "deleteApiKey": key["id"]
    }
    status, body = _status(client, key["token"])
    assert status == 401
    assert "revoked" in body["errors"][0]["message"]
    assert graphql_data(client, admin.access_token, LIST)["apiKeys"] == []
    again = graphql(client, admin.access_token, DELETE, {"id": key["id"]})
    assert again.json()["errors"][0]["extensions"]["code"] == "NOT_FOUND"


def test_expired_key_gets_401_saying_expired(client: httpx.Client) -> None:
    admin = signup(client)
    expires = datetime.now(UTC) + timedelta(seconds=3)
    key = _create(client, admin, expiresAt=expires.isoformat())
    assert key["expiresAt"] is not None
    assert _status(client, key["token"])[0] == 200
    deadline = time.monotonic() + 30
    while True:
        status, body = _status(client, key["token"])
        if status == 401:
            assert "expired" in body["errors"][0]["message"]
            break
        assert time.monotonic() < deadline, "the key never expired"
        time.sleep(0.5)


def test_expiry_must_be_in_the_future(client: httpx.Client) -> None:
    admin = signup(client)
    past = (datetime.now(UTC) - timedelta(days=1)).isoformat()
    response = graphql(
        client, admin.access_token, CREATE, {"input": {"name": "k", "expiresAt": past}}
    )
    error = response.json()["errors"][0]
    assert error["extensions"] == {"code": "BAD_USER_INPUT", "field": "expiresAt"}
    blank = graphql(client, admin.access_token, CREATE, {"input": {"name": " "}})
    assert blank.json()["errors"][0]["extensions"]["field"] == "name"


def test_tampered_secret_is_refused(client: httpx.Client) -> None:
    admin = signup(client)
    token = _create(client, admin)["token"]
    tampered = token[:-3] + ("xyz" if not token.endswith("xyz") else "abc")
    status, body = _status(client, tampered)
    assert status == 401
    assert "invalid" in body["errors"][0]["message"]


def test_members_cannot_manage_keys(client: httpx.Client) -> None:
    admin = signup(client)
    member = _member_session(client, admin)
    for query, variables in ((LIST, None), (CREATE, {"input": {"name": "mine"}})):
        response = graphql(client, member.access_token, query, variables)
        assert response.json()["errors"][0]["extensions"]["code"] == "FORBIDDEN"


def _member_session(client: httpx.Client, admin: Session) -> Session:
    email = f"member-{admin.user_id[:8]}@example.com"
    graphql_data(
        client,
        admin.access_token,
        """mutation($email: String!) { addWorkspaceMember(input: {email: $email,
             password: "member password", firstName: "M", lastName: "M"}) { id } }""",
        {"email": email},
    )
    response = client.post(
        "/auth/login",
        json={"email": email, "password": "member password", "workspaceId": admin.workspace_id},
    )
    assert response.status_code == 200, response.text
    body = response.json()
    return Session(
        body["accessToken"],
        body["refreshToken"],
        body["user"]["id"],
        admin.workspace_id,
        email,
        "member password",
    )


def test_revocation_is_seen_by_a_second_gateway_within_one_request(
    client: httpx.Client, extra_gateway: Callable[[dict[str, str]], str]
) -> None:
    second_url = extra_gateway({})
    admin = signup(client)
    key = _create(client, admin)
    with httpx.Client(base_url=second_url, timeout=30) as second:
        # Both gateways have verified (and so would have cached) the key.
        assert _status(client, key["token"])[0] == 200
        assert _status(second, key["token"])[0] == 200
        graphql_data(client, admin.access_token, DELETE, {"id": key["id"]})
        status, body = _status(second, key["token"])
        assert status == 401
        assert "revoked" in body["errors"][0]["message"]


def test_redis_losing_its_data_changes_no_answer(client: httpx.Client, local_stack: Stack) -> None:
    assert local_stack.infra is not None
    admin = signup(client)
    live = _create(client, admin)
    dead = _create(client, admin)
    graphql_data(client, admin.access_token, DELETE, {"id": dead["id"]})
    redis.Redis.from_url(local_stack.infra.redis_url).flushall()
    assert _status(client, live["token"])[0] == 200
    assert _status(client, admin.access_token)[0] == 200
    status, body = _status(client, dead["token"])
    assert status == 401
    assert "revoked" in body["errors"][0]["message"]
    # And revocation still works after the refill.
    graphql_data(client, admin.access_token, DELETE, {"id": live["id"]})
    assert _status(client, live["token"])[0] == 401


def test_another_workspace_s_key_cannot_be_deleted(client: httpx.Client) -> None:
    owner = signup(client)
    intruder = signup(client)
    key = _create(client, owner)
    response = graphql(client, intruder.access_token, DELETE, {"id": key["id"]})
    assert response.json()["errors"][0]["extensions"]["code"] == "NOT_FOUND"
    assert _status(client, key["token"])[0] == 200
    role = graphql_data(client, owner.access_token, "{ roles { id name } }")["roles"][0]
    foreign_role = graphql(
        client, intruder.access_token, CREATE, {"input": {"name": "x", "roleId": role["id"]}}
    )
    error = foreign_role.json()["errors"][0]
    assert error["extensions"] == {"code": "NOT_FOUND", "field": "roleId"}


@pytest.mark.parametrize("first", [-1, 201])
def test_list_page_size_is_bounded(client: httpx.Client, first: int) -> None:
    admin = signup(client)
    query = "query($f: Int) { apiKeys(first: $f) { id } }"
    response = graphql(client, admin.access_token, query, {"f": first})
    assert response.json()["errors"][0]["extensions"] == {
        "code": "BAD_USER_INPUT",
        "field": "first",
    }


def test_list_pages_with_after(client: httpx.Client) -> None:
    admin = signup(client)
    ids = [_create(client, admin, name=f"k{index}")["id"] for index in range(3)]
    query = "query($a: UUID) { apiKeys(first: 2, after: $a) { id } }"
    first = graphql_data(client, admin.access_token, query, {"a": None})["apiKeys"]
    assert [item["id"] for item in first] == ids[:2]
    rest = graphql_data(client, admin.access_token, query, {"a": ids[1]})["apiKeys"]
    assert [item["id"] for item in rest] == ids[2:]
