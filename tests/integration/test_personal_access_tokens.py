"""Personal access tokens: shown once, act as their user (with the user's current role), listed
and deleted only by that user."""

from __future__ import annotations

from typing import Any

import httpx

from crmstack.client import graphql, graphql_data, login, signup, unique_email

CREATE = """mutation($input: CreatePersonalAccessTokenInput!) {
  createPersonalAccessToken(input: $input) { id name expiresAt token createdAt }
}"""
LIST = "{ personalAccessTokens { id name token } }"
DELETE = "mutation($id: UUID!) { deletePersonalAccessToken(id: $id) }"
WHO = "{ currentUser { id email role kind } }"


def _error(response: httpx.Response) -> dict[str, Any]:
    error: dict[str, Any] = response.json()["errors"][0]
    return error


def test_token_acts_as_its_user(client: httpx.Client) -> None:
    user = signup(client)
    created = graphql_data(client, user.access_token, CREATE, {"input": {"name": "laptop script"}})[
        "createPersonalAccessToken"
    ]
    assert created["token"].startswith("crm_pat_")
    assert created["expiresAt"] is None
    who = graphql_data(client, created["token"], WHO)["currentUser"]
    assert who == {
        "id": user.user_id,
        "email": user.email,
        "role": "Admin",
        "kind": "PERSONAL_ACCESS_TOKEN",
    }
    listed = graphql_data(client, user.access_token, LIST)["personalAccessTokens"]
    assert listed == [{"id": created["id"], "name": "laptop script", "token": None}]
    # The token itself can manage the user's tokens.
    assert graphql_data(client, created["token"], LIST)["personalAccessTokens"] == listed


def test_deleted_token_gets_401_at_once(client: httpx.Client) -> None:
    user = signup(client)
    created = graphql_data(client, user.access_token, CREATE, {"input": {"name": "t"}})[
        "createPersonalAccessToken"
    ]
    graphql_data(client, created["token"], WHO)
    assert graphql_data(client, user.access_token, DELETE, {"id": created["id"]}) == {
        "deletePersonalAccessToken": created["id"]
    }
    response = graphql(client, created["token"], WHO)
    assert response.status_code == 401
    assert "revoked" in _error(response)["message"]


def test_tokens_are_private_to_their_user(client: httpx.Client) -> None:
    admin = signup(client)
    email = unique_email("colleague")
    graphql_data(
        client,
        admin.access_token,
        """mutation($email: String!) { addWorkspaceMember(input: {email: $email,
             password: "colleague password"}) { id } }""",
        {"email": email},
    )
    colleague = login(client, email, "colleague password", admin.workspace_id)
    mine = graphql_data(client, admin.access_token, CREATE, {"input": {"name": "mine"}})[
        "createPersonalAccessToken"
    ]
    assert graphql_data(client, colleague.access_token, LIST)["personalAccessTokens"] == []
    response = graphql(client, colleague.access_token, DELETE, {"id": mine["id"]})
    assert _error(response)["extensions"] == {"code": "NOT_FOUND", "field": "id"}
    graphql_data(client, mine["token"], WHO)
    # The colleague (a Member) has a token of their own, acting with the Member role.
    theirs = graphql_data(client, colleague.access_token, CREATE, {"input": {"name": "theirs"}})[
        "createPersonalAccessToken"
    ]
    assert graphql_data(client, theirs["token"], WHO)["currentUser"]["role"] == "Member"


def test_api_keys_cannot_create_personal_tokens(client: httpx.Client) -> None:
    admin = signup(client)
    key = graphql_data(
        client, admin.access_token, 'mutation { createApiKey(input: {name: "k"}) { token } }'
    )["createApiKey"]["token"]
    response = graphql(client, key, CREATE, {"input": {"name": "nope"}})
    assert _error(response)["extensions"]["code"] == "FORBIDDEN"
