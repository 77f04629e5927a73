"""Request sizes and credential counts (docs/api.md and docs/auth.md, Limits): a body over its
route's limit is refused with 413 in the route's error shape, from its Content-Length before a
byte is read or while it streams; login refuses an over-long password before hashing; a user
holds at most MAX_CREDENTIALS_PER_USER (1,000) active API keys and as many personal access
tokens."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import httpx
import orjson
import pytest

from crmstack.client import Session, graphql, graphql_data, signup

AUTH_LIMIT = 64 * 1024  # MAX_AUTH_REQUEST_BODY_BYTES
DEFAULT_LIMIT = 4 * 1024 * 1024  # MAX_REQUEST_BODY_BYTES
CAP = 1000  # MAX_CREDENTIALS_PER_USER


@pytest.fixture(scope="module")
def admin(client: httpx.Client) -> Session:
    return signup(client)


def announced(base_url: str, path: str, length: int) -> tuple[int, dict[str, object]]:
    """Status and body of a POST announcing `length` bytes and sending none of them."""
    url = httpx.URL(base_url)
    assert url.port is not None
    with socket.create_connection((url.host, url.port), timeout=10) as connection:
        connection.sendall(
            f"POST {path} HTTP/1.1\r\nHost: {url.host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n\r\n".encode()
        )
        received = b""
        while b"\r\n\r\n" not in received or not received.rstrip().endswith(b"}"):
            chunk = connection.recv(65536)
            if not chunk:
                break
            received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    return int(head.split()[1]), orjson.loads(body)


def streamed(size: int, chunk: int = 64 * 1024) -> Iterator[bytes]:
    """A JSON object padded with whitespace to `size` bytes, sent without a Content-Length."""
    start = b'{"email": "a@example.com", "password": "x"}'
    yield start
    left = size - len(start)
    while left > 0:
        yield b" " * min(chunk, left)
        left -= chunk


def rest_413(response: httpx.Response) -> None:
    assert response.status_code == 413, response.text
    body = response.json()
    assert body["statusCode"] == 413
    assert body["error"] == "Payload Too Large"
    assert set(body) == {"statusCode", "message", "error", "details"}
    assert "maximum" in body["message"]


def test_a_thirty_megabyte_login_is_refused_from_its_content_length(base_url: str) -> None:
    status, body = announced(base_url, "/auth/login", 30 * 1024 * 1024)
    assert status == 413
    assert body["statusCode"] == 413
    assert str(AUTH_LIMIT) in str(body["message"])
    status, body = announced(base_url, "/graphql", 64 * 1024 * 1024)
    assert status == 413
    assert body["errors"][0]["extensions"] == {"code": "BAD_USER_INPUT"}  # type: ignore[index]


def test_streamed_bodies_are_cut_off_at_the_limit(client: httpx.Client, admin: Session) -> None:
    rest_413(client.post("/auth/login", content=streamed(AUTH_LIMIT + 1)))
    rest_413(client.post("/auth/signup", content=streamed(AUTH_LIMIT * 2)))
    rest_413(
        client.post(
            "/rest/people",
            content=streamed(DEFAULT_LIMIT + 1),
            headers={**admin.headers, "Content-Type": "application/json"},
        )
    )
    # Within its limit a body is read and handled as usual (here: a wrong password).
    response = client.post("/auth/login", content=streamed(AUTH_LIMIT))
    assert response.status_code == 401, response.text


def test_batch_routes_take_larger_bodies(client: httpx.Client, admin: Session) -> None:
    padded = orjson.dumps([{"firstName": "Padded"}]) + b" " * (DEFAULT_LIMIT + 1024)
    headers = {**admin.headers, "Content-Type": "application/json"}
    rest_413(client.post("/rest/people", content=padded, headers=headers))
    response = client.post("/rest/batch/people", content=padded, headers=headers)
    assert response.status_code == 201, response.text


def test_login_refuses_an_over_long_password_before_hashing(
    client: httpx.Client, admin: Session
) -> None:
    response = client.post(
        "/auth/login",
        json={"email": admin.email, "password": "p" * 10_000, "workspaceId": admin.workspace_id},
    )
    assert response.status_code == 400, response.text
    assert response.json()["details"]["field"] == "password"
    assert "at most 256" in response.json()["message"]


def mint(client: httpx.Client, token: str, mutation: str, count: int) -> list[str]:
    """`count` credentials, 50 per request (aliases); their ids."""
    ids: list[str] = []
    while len(ids) < count:
        batch = min(50, count - len(ids))
        fields = " ".join(
            f'k{i}: {mutation}(input: {{name: "cap {len(ids) + i}"}}) {{ id }}'
            for i in range(batch)
        )
        data = graphql_data(client, token, "mutation { " + fields + " }")
        ids.extend(created["id"] for created in data.values())
    return ids


@pytest.mark.parametrize(
    ("mutation", "delete"),
    [("createApiKey", "deleteApiKey"), ("createPersonalAccessToken", "deletePersonalAccessToken")],
)
def test_a_user_holds_at_most_a_thousand_keys_and_tokens(
    client: httpx.Client, mutation: str, delete: str
) -> None:
    owner = signup(client)
    ids = mint(client, owner.access_token, mutation, CAP)
    one_more = f'mutation {{ {mutation}(input: {{name: "over"}}) {{ id }} }}'
    response = graphql(client, owner.access_token, one_more)
    body = response.json()
    assert body["data"] is None, body
    (error,) = body["errors"]
    assert error["extensions"]["code"] == "BAD_USER_INPUT"
    assert f"at most {CAP} active" in error["message"]
    # Deleting one frees a slot.
    graphql_data(
        client, owner.access_token, f"mutation($id: UUID!) {{ {delete}(id: $id) }}", {"id": ids[0]}
    )
    assert graphql_data(client, owner.access_token, one_more)[mutation]["id"]
