"""Credentials and roles through the REST API and the records GraphQL operations: the REST 401
body for every bad credential, a Member's 404 on another member's record, OAuth scopes and
custom roles as 403 naming the action and object, other workspaces' ids not found."""

from __future__ import annotations

import re
import time
from typing import Any

import httpx
import jwt
import pytest

from crmstack.client import Session, graphql, graphql_data, login, signup, unique_email
from crmstack.stack import Stack


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _member(client: httpx.Client, admin: Session, role_id: str | None = None) -> Session:
    email = unique_email("member")
    graphql_data(
        client,
        admin.access_token,
        "mutation($input: AddWorkspaceMemberInput!) { addWorkspaceMember(input: $input) { id } }",
        {"input": {"email": email, "password": "member password", "roleId": role_id}},
    )
    return login(client, email, "member password", admin.workspace_id)


def _create(client: httpx.Client, token: str, path: str, data: dict[str, Any]) -> dict[str, Any]:
    response = client.post(path, json=data, headers=_bearer(token))
    assert response.status_code == 201, response.text
    record: dict[str, Any] = response.json()["data"]
    return record


def _refused(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()
    assert set(body) == {"statusCode", "message", "error", "details"}
    assert body["statusCode"] == status
    return body


def test_rest_401_for_every_bad_credential(client: httpx.Client, stack: Stack | None) -> None:
    session = signup(client)
    assert client.get("/rest/people", headers=session.headers).status_code == 200
    missing = _refused(client.get("/rest/people"), 401)
    assert missing["error"] == "Unauthorized"
    for header in ("Bearer nonsense", "Basic abc", "Bearer " + session.refresh_token):
        body = _refused(client.get("/rest/people", headers={"Authorization": header}), 401)
        assert "invalid" in body["message"]
    if stack is not None:
        claims = jwt.decode(session.access_token, stack.config.app_secret, algorithms=["HS256"])
        claims.update(iat=int(time.time()) - 7200, exp=int(time.time()) - 3600)
        expired = jwt.encode(claims, stack.config.app_secret, algorithm="HS256")
        body = _refused(client.get("/rest/people", headers=_bearer(expired)), 401)
        assert body["message"] == "token expired"


def test_deleted_api_key_is_refused_by_rest_at_once(client: httpx.Client) -> None:
    admin = signup(client)
    key = graphql_data(
        client, admin.access_token, 'mutation { createApiKey(input: {name: "rest"}) { id token } }'
    )["createApiKey"]
    created = _create(client, key["token"], "/rest/companies", {"name": "Via key"})
    assert created["name"] == "Via key"
    graphql_data(
        client,
        admin.access_token,
        "mutation($id: UUID!) { deleteApiKey(id: $id) }",
        {"id": key["id"]},
    )
    body = _refused(client.get("/rest/companies", headers=_bearer(key["token"])), 401)
    assert body["message"] == "token revoked"


def test_member_gets_404_on_another_member_s_record(client: httpx.Client) -> None:
    admin = signup(client)
    alice, bob = _member(client, admin), _member(client, admin)
    record = _create(client, alice.access_token, "/rest/people", {"firstName": "Alice's"})
    assert record["ownerId"] == alice.user_id
    path = f"/rest/people/{record['id']}"
    assert client.get(path, headers=alice.headers).status_code == 200
    _refused(client.get(path, headers=bob.headers), 404)
    _refused(client.patch(path, json={"firstName": "Bob's"}, headers=bob.headers), 404)
    _refused(client.delete(path, headers=bob.headers), 404)
    listed = client.get("/rest/people", headers=bob.headers).json()["data"]
    assert record["id"] not in [row["id"] for row in listed]
    by_graphql = graphql(
        client,
        bob.access_token,
        "query($id: UUID!) { person(id: $id) { id } }",
        {"id": record["id"]},
    )
    assert by_graphql.json()["errors"][0]["extensions"]["code"] == "NOT_FOUND"
    assert client.get(path, headers=admin.headers).json()["data"]["ownerId"] == alice.user_id


def test_custom_role_without_write_gets_403_naming_action_and_object(
    client: httpx.Client,
) -> None:
    admin = signup(client)
    role = graphql_data(
        client,
        admin.access_token,
        """mutation { createRole(input: {name: "People readers",
             permissions: [{object: "person", actions: [READ]}]}) { id } }""",
    )["createRole"]
    reader = _member(client, admin, role["id"])
    assert client.get("/rest/people", headers=reader.headers).status_code == 200
    body = _refused(
        client.post("/rest/people", json={"firstName": "X"}, headers=reader.headers), 403
    )
    assert body["error"] == "Forbidden"
    assert "WRITE" in body["message"]
    assert "person" in body["message"]
    companies = _refused(client.get("/rest/companies", headers=reader.headers), 403)
    assert "READ" in companies["message"]
    assert "company" in companies["message"]
    denied = graphql(
        client, reader.access_token, 'mutation { createPerson(data: {firstName: "X"}) { id } }'
    )
    assert denied.json()["errors"][0]["extensions"]["code"] == "FORBIDDEN"


def test_other_workspace_ids_are_not_found_through_rest(client: httpx.Client) -> None:
    owner, intruder = signup(client), signup(client)
    record = _create(client, owner.access_token, "/rest/companies", {"name": "Private"})
    path = f"/rest/companies/{record['id']}"
    _refused(client.get(path, headers=intruder.headers), 404)
    _refused(client.patch(path, json={"name": "Mine"}, headers=intruder.headers), 404)
    _refused(client.delete(path, headers=intruder.headers), 404)
    assert client.get(path, headers=owner.headers).json()["data"]["name"] == "Private"


@pytest.mark.parametrize("scope", ["read:person", "read:*"])
def test_oauth_scopes_narrow_rest_access(client: httpx.Client, scope: str) -> None:
    from authlib.common.security import generate_token
    from authlib.oauth2.rfc7636 import create_s256_code_challenge

    admin = signup(client)
    registered = graphql_data(
        client,
        admin.access_token,
        """mutation { createOAuthClient(input: {name: "Scoped",
             redirectUris: ["https://app.example.com/cb"], scopes: ["*"]}) {
             clientId clientSecret } }""",
    )["createOAuthClient"]
    verifier = generate_token(64)
    with httpx.Client(base_url=client.base_url, timeout=30) as browser:
        page = browser.get(
            "/auth/authorize",
            params={
                "client_id": registered["clientId"],
                "redirect_uri": "https://app.example.com/cb",
                "response_type": "code",
                "scope": scope,
                "code_challenge": create_s256_code_challenge(verifier),
                "code_challenge_method": "S256",
            },
        )
        fields = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">', page.text))
        consent = browser.post(
            "/auth/authorize",
            data={**fields, "email": admin.email, "password": admin.password, "decision": "allow"},
        )
    code = httpx.URL(consent.headers["location"]).params["code"]
    token = client.post(
        "/auth/token",
        data={
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": "https://app.example.com/cb",
            "code_verifier": verifier,
        },
        auth=(registered["clientId"], registered["clientSecret"]),
    ).json()["access_token"]
    assert client.get("/rest/people", headers=_bearer(token)).status_code == 200
    _refused(client.post("/rest/people", json={"firstName": "X"}, headers=_bearer(token)), 403)
    companies = client.get("/rest/companies", headers=_bearer(token))
    assert companies.status_code == (200 if scope == "read:*" else 403)
