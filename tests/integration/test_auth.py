"""Sign-up, login, JWT claims, refresh rotation and reuse detection, currentUser."""

from __future__ import annotations

import base64
import time

import httpx
import jwt
import orjson
import pytest

from crmstack.client import DEFAULT_PASSWORD, graphql, graphql_data, signup, unique_email
from crmstack.stack import Stack

CURRENT_USER = (
    "{ currentUser { id email firstName lastName role kind "
    "permissions { object actions ownRecordsOnly } flags workspace { id name } } }"
)


def _header(token: str) -> dict[str, object]:
    segment = token.split(".")[0]
    decoded: dict[str, object] = orjson.loads(base64.urlsafe_b64decode(segment + "=="))
    return decoded


def test_signup_creates_workspace_and_admin(client: httpx.Client) -> None:
    email = unique_email("Founder")
    response = client.post(
        "/auth/signup",
        json={
            "email": email,
            "password": DEFAULT_PASSWORD,
            "firstName": "Ada",
            "lastName": "Lovelace",
            "workspaceName": "Analytical Engines",
        },
    )
    assert response.status_code == 201, response.text
    body = response.json()
    assert set(body) == {"accessToken", "refreshToken", "user", "workspace"}
    assert body["user"]["email"] == email.lower()
    assert body["user"]["firstName"] == "Ada"
    assert body["user"]["lastName"] == "Lovelace"
    assert set(body["user"]) == {"id", "email", "firstName", "lastName"}
    assert body["workspace"]["name"] == "Analytical Engines"
    assert response.headers["cache-control"] == "no-store"

    data = graphql_data(client, body["accessToken"], CURRENT_USER)["currentUser"]
    assert data["id"] == body["user"]["id"]
    assert data["role"] == "Admin"
    assert data["kind"] == "USER"
    assert data["workspace"] == body["workspace"]
    assert data["permissions"] == [
        {"object": "*", "actions": ["READ", "WRITE", "DELETE"], "ownRecordsOnly": False}
    ]
    assert set(data["flags"]) == {
        "API_KEYS_AND_WEBHOOKS",
        "WORKFLOWS",
        "DATA_MODEL",
        "WORKSPACE_MEMBERS",
    }


def test_jwt_claims_are_exactly_the_spec_s_and_hs256(
    client: httpx.Client, stack: Stack | None
) -> None:
    session = signup(client)
    assert _header(session.access_token)["alg"] == "HS256"
    app_secret = stack.config.app_secret if stack else None
    if app_secret is None:
        pytest.skip("needs the local stack's APP_SECRET to check the signature")
    claims = jwt.decode(session.access_token, app_secret, algorithms=["HS256"])
    assert set(claims) == {"sub", "workspaceId", "email", "iat", "exp", "type", "jti"}
    assert claims["sub"] == session.user_id
    assert claims["workspaceId"] == session.workspace_id
    assert claims["email"] == session.email
    assert claims["type"] == "access"
    assert claims["exp"] - claims["iat"] == 30 * 60  # ACCESS_TOKEN_EXPIRES_IN default
    rotated = client.post("/auth/refresh", json={"refreshToken": session.refresh_token}).json()
    next_claims = jwt.decode(rotated["accessToken"], app_secret, algorithms=["HS256"])
    assert next_claims["jti"] != claims["jti"]  # unique per token ...
    assert next_claims["jti"].split(".")[0] == claims["jti"].split(".")[0]  # ... same session
    refresh = jwt.decode(session.refresh_token, app_secret, algorithms=["HS256"])
    assert refresh["type"] == "refresh"
    assert refresh["exp"] - refresh["iat"] == 90 * 86400  # REFRESH_TOKEN_EXPIRES_IN default


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"email": "not-an-email"}, "email"),
        ({"email": ""}, "email"),
        ({"password": "short"}, "password"),
        ({"workspaceName": "  "}, "workspaceName"),
        ({"firstName": 42}, "firstName"),
    ],
)
def test_signup_rejects_bad_input_naming_the_field(
    client: httpx.Client, change: dict[str, object], field: str
) -> None:
    body: dict[str, object] = {
        "email": unique_email(),
        "password": DEFAULT_PASSWORD,
        "firstName": "A",
        "lastName": "B",
        "workspaceName": "W",
    }
    body.update(change)
    response = client.post("/auth/signup", json=body)
    assert response.status_code == 400, response.text
    error = response.json()
    assert error["statusCode"] == 400
    assert error["details"]["field"] == field


def test_signup_rejects_malformed_json(client: httpx.Client) -> None:
    response = client.post(
        "/auth/signup", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    assert response.json()["error"] == "Bad Request"


def test_login_returns_tokens_and_user(client: httpx.Client) -> None:
    session = signup(client, first_name="Grace", last_name="Hopper")
    response = client.post(
        "/auth/login", json={"email": session.email.upper(), "password": session.password}
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert set(body) == {"accessToken", "refreshToken", "user"}
    assert body["user"] == {
        "id": session.user_id,
        "email": session.email,
        "firstName": "Grace",
        "lastName": "Hopper",
    }
    data = graphql_data(client, body["accessToken"], "{ currentUser { id } }")
    assert data["currentUser"]["id"] == session.user_id


def test_wrong_password_and_unknown_email_get_the_same_401(client: httpx.Client) -> None:
    session = signup(client)
    ip = {"X-Forwarded-For": "192.0.2.10"}
    wrong = client.post(
        "/auth/login", json={"email": session.email, "password": "wrong-password"}, headers=ip
    )
    unknown = client.post(
        "/auth/login",
        json={"email": unique_email("nobody"), "password": "wrong-password"},
        headers=ip,
    )
    assert wrong.status_code == unknown.status_code == 401
    assert wrong.json() == unknown.json()
    assert wrong.json()["message"] == "invalid email or password"


def test_login_requires_email_and_password(client: httpx.Client) -> None:
    response = client.post("/auth/login", json={"email": unique_email()})
    assert response.status_code == 400
    assert response.json()["details"]["field"] == "password"


def test_email_in_two_workspaces_asks_for_the_workspace(client: httpx.Client) -> None:
    first = signup(client, workspace_name="One")
    second = signup(client, email=first.email, workspace_name="Two")
    assert first.workspace_id != second.workspace_id
    ambiguous = client.post("/auth/login", json={"email": first.email, "password": first.password})
    assert ambiguous.status_code == 400
    assert ambiguous.json()["details"]["field"] == "workspaceId"
    chosen = client.post(
        "/auth/login",
        json={
            "email": first.email,
            "password": first.password,
            "workspaceId": second.workspace_id,
        },
    )
    assert chosen.status_code == 200
    assert chosen.json()["user"]["id"] == second.user_id


def test_refresh_rotates_the_pair(client: httpx.Client) -> None:
    session = signup(client)
    response = client.post("/auth/refresh", json={"refreshToken": session.refresh_token})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["refreshToken"] != session.refresh_token
    assert body["user"]["id"] == session.user_id
    graphql_data(client, body["accessToken"], "{ currentUser { id } }")
    again = client.post("/auth/refresh", json={"refreshToken": body["refreshToken"]})
    assert again.status_code == 200, again.text


def test_reusing_a_rotated_refresh_token_revokes_the_family(client: httpx.Client) -> None:
    session = signup(client)
    rotated = client.post("/auth/refresh", json={"refreshToken": session.refresh_token}).json()
    reuse = client.post("/auth/refresh", json={"refreshToken": session.refresh_token})
    assert reuse.status_code == 401
    assert "revoked" in reuse.json()["message"]
    # Every token of the family is dead now: the newest refresh token and the access tokens.
    newest = client.post("/auth/refresh", json={"refreshToken": rotated["refreshToken"]})
    assert newest.status_code == 401
    for token in (session.access_token, rotated["accessToken"]):
        response = graphql(client, token, "{ currentUser { id } }")
        assert response.status_code == 401
        assert response.json()["errors"][0]["extensions"]["code"] == "UNAUTHENTICATED"
        assert "revoked" in response.json()["errors"][0]["message"]
    # Another session of the same user is untouched.
    other = client.post("/auth/login", json={"email": session.email, "password": session.password})
    graphql_data(client, other.json()["accessToken"], "{ currentUser { id } }")


def test_refresh_rejects_access_tokens_and_garbage(client: httpx.Client) -> None:
    session = signup(client)
    for token in (session.access_token, "garbage", ""):
        response = client.post("/auth/refresh", json={"refreshToken": token})
        assert response.status_code in (400, 401), response.text
        if token:
            assert response.status_code == 401


def test_logout_ends_the_session(client: httpx.Client) -> None:
    session = signup(client)
    response = client.post("/auth/logout", json={"refreshToken": session.refresh_token})
    assert response.status_code == 204
    denied = graphql(client, session.access_token, "{ currentUser { id } }")
    assert denied.status_code == 401
    refused = client.post("/auth/refresh", json={"refreshToken": session.refresh_token})
    assert refused.status_code == 401


def test_signup_fails_whole_when_the_workspace_cannot_be_provisioned(
    client: httpx.Client, local_stack: Stack
) -> None:
    email = unique_email("early")
    body = {"email": email, "password": DEFAULT_PASSWORD, "workspaceName": "Too early"}
    local_stack.kill("metadata")
    try:
        failed = client.post("/auth/signup", json=body)
    finally:
        local_stack.restart("metadata")
    assert failed.status_code == 503, failed.text
    # Nothing was kept: the account does not exist, and signing up again works.
    login = client.post(
        "/auth/login",
        json={"email": email, "password": DEFAULT_PASSWORD},
        headers={"X-Forwarded-For": "192.0.2.11"},
    )
    assert login.status_code == 401
    deadline = time.monotonic() + 60
    while True:
        again = client.post("/auth/signup", json=body)
        if again.status_code == 201 or time.monotonic() > deadline:
            break
        time.sleep(0.5)  # metadata is starting again
    assert again.status_code == 201, again.text
