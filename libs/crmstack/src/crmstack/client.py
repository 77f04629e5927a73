"""Small HTTP helpers for tests and benchmarks: sign up a workspace, call GraphQL with a token."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

import httpx

DEFAULT_PASSWORD = "correct horse battery"  # noqa: S105  # test accounts only


@dataclass(frozen=True)
class Session:
    """A signed-up (or logged-in) user and their tokens."""

    access_token: str
    refresh_token: str
    user_id: str
    workspace_id: str
    email: str
    password: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.access_token}"}


def unique_email(prefix: str = "user") -> str:
    return f"{prefix}-{secrets.token_hex(6)}@example.com"


def signup(
    http: httpx.Client,
    *,
    email: str | None = None,
    password: str = DEFAULT_PASSWORD,
    workspace_name: str = "Test workspace",
    first_name: str = "Test",
    last_name: str = "User",
) -> Session:
    """A new workspace with a new Admin user (POST /auth/signup), or AssertionError."""
    email = email or unique_email()
    response = http.post(
        "/auth/signup",
        json={
            "email": email,
            "password": password,
            "firstName": first_name,
            "lastName": last_name,
            "workspaceName": workspace_name,
        },
    )
    assert response.status_code == 201, response.text
    body = response.json()
    return Session(
        body["accessToken"],
        body["refreshToken"],
        body["user"]["id"],
        body["workspace"]["id"],
        email,
        password,
    )


def login(http: httpx.Client, email: str, password: str, workspace_id: str) -> Session:
    response = http.post(
        "/auth/login", json={"email": email, "password": password, "workspaceId": workspace_id}
    )
    assert response.status_code == 200, response.text
    body = response.json()
    return Session(
        body["accessToken"], body["refreshToken"], body["user"]["id"], workspace_id, email, password
    )


def graphql(
    http: httpx.Client,
    token: str | None,
    query: str,
    variables: dict[str, Any] | None = None,
    *,
    path: str = "/graphql",
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return http.post(path, json={"query": query, "variables": variables or {}}, headers=headers)


def graphql_data(
    http: httpx.Client, token: str, query: str, variables: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The `data` of a GraphQL call that must succeed."""
    response = graphql(http, token, query, variables)
    body = response.json()
    assert response.status_code == 200, response.text
    assert not body.get("errors"), response.text
    data: dict[str, Any] = body["data"]
    return data
