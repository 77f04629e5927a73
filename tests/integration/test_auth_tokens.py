"""Gateway authentication: every kind of bad credential gets 401 / UNAUTHENTICATED, and the
message tells an expired token from an invalid one."""

from __future__ import annotations

import base64
import time
import uuid

import httpx
import jwt
import orjson
import pytest

from crmstack.client import Session, graphql, graphql_data, signup
from crmstack.stack import Stack
from tests.integration.subscriptions_client import gateway_metrics

QUERY = "{ currentUser { id } }"


def _secret(stack: Stack | None) -> str:
    if stack is None:
        pytest.skip("needs the local stack's APP_SECRET to mint tokens")
    return stack.config.app_secret


def _claims(session: Session, secret: str) -> dict[str, object]:
    decoded: dict[str, object] = jwt.decode(session.access_token, secret, algorithms=["HS256"])
    return decoded


def _refused(client: httpx.Client, headers: dict[str, str], path: str = "/graphql") -> str:
    response = client.post(path, json={"query": QUERY}, headers=headers)
    assert response.status_code == 401, response.text
    body = response.json()
    assert body["data"] is None
    error = body["errors"][0]
    assert error["extensions"]["code"] == "UNAUTHENTICATED"
    message: str = error["message"]
    return message


@pytest.fixture(scope="module")
def session(client: httpx.Client) -> Session:
    return signup(client)


@pytest.mark.parametrize("path", ["/graphql", "/metadata"])
def test_valid_token_is_accepted_on_both_endpoints(
    client: httpx.Client, session: Session, path: str
) -> None:
    response = graphql(client, session.access_token, QUERY, path=path)
    assert response.status_code == 200, response.text
    assert response.json()["data"]["currentUser"]["id"] == session.user_id


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": ""},
        {"Authorization": "Bearer"},
        {"Authorization": "Basic dXNlcjpwYXNz"},
        {"Authorization": "Bearer not-a-token"},
        {"Authorization": "Bearer a.b.c"},
        {"Authorization": "Bearer crm_ak_zzzz_secret"},
        {"Authorization": "Bearer crm_pat_" + uuid.uuid4().hex + "_secret"},
        {"Authorization": "Bearer crm_ak_" + uuid.uuid4().hex + "_secret"},
    ],
    ids=[
        "missing",
        "empty",
        "no-token",
        "basic",
        "garbage",
        "not-base64",
        "malformed-key",
        "unknown-pat",
        "unknown-key",
    ],
)
def test_missing_and_malformed_credentials(client: httpx.Client, headers: dict[str, str]) -> None:
    message = _refused(client, headers)
    assert "expired" not in message


def test_invalid_signature(client: httpx.Client, session: Session, stack: Stack | None) -> None:
    claims = _claims(session, _secret(stack))
    forged = jwt.encode(claims, "another-secret-of-enough-length-000", algorithm="HS256")
    assert "invalid" in _refused(client, {"Authorization": f"Bearer {forged}"})
    tampered = session.access_token[:-4] + (
        "AAAA" if session.access_token[-4:] != "AAAA" else "BBBB"
    )
    assert "invalid" in _refused(client, {"Authorization": f"Bearer {tampered}"})


def test_alg_none_is_refused(client: httpx.Client, session: Session, stack: Stack | None) -> None:
    claims = _claims(session, _secret(stack))

    def segment(data: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(orjson.dumps(data)).decode().rstrip("=")

    for alg in ("none", "None", "HS512"):
        token = f"{segment({'alg': alg, 'typ': 'JWT'})}.{segment(claims)}."
        assert "invalid" in _refused(client, {"Authorization": f"Bearer {token}"})


def test_expired_token_says_expired(
    client: httpx.Client, session: Session, stack: Stack | None
) -> None:
    claims = _claims(session, _secret(stack))
    now = int(time.time())
    claims.update(iat=now - 7200, exp=now - 3600)
    expired = jwt.encode(claims, _secret(stack), algorithm="HS256")
    for path in ("/graphql", "/metadata"):
        message = _refused(client, {"Authorization": f"Bearer {expired}"}, path)
        assert "expired" in message


def test_wrong_workspace_token_is_refused(
    client: httpx.Client, session: Session, stack: Stack | None
) -> None:
    other = signup(client)
    claims = _claims(session, _secret(stack))
    # A validly signed token naming this session but another workspace (or another user).
    for change in ({"workspaceId": other.workspace_id}, {"sub": other.user_id}):
        token = jwt.encode({**claims, **change}, _secret(stack), algorithm="HS256")
        assert "invalid" in _refused(client, {"Authorization": f"Bearer {token}"})


def test_refresh_token_is_not_an_access_token(client: httpx.Client, session: Session) -> None:
    message = _refused(client, {"Authorization": f"Bearer {session.refresh_token}"})
    assert "invalid" in message


def test_revoked_session_is_refused(client: httpx.Client) -> None:
    own = signup(client)
    graphql_data(client, own.access_token, QUERY)
    assert client.post("/auth/logout", json={"refreshToken": own.refresh_token}).status_code == 204
    assert "revoked" in _refused(client, own.headers)


def test_revocation_applies_to_the_very_next_rest_call(client: httpx.Client) -> None:
    """The gateway remembers tokens it verified, never whether they are revoked."""
    own = signup(client)
    for _ in range(3):  # verified once, then recognised
        assert client.get("/rest/people", headers=own.headers).status_code == 200
    assert client.post("/auth/logout", json={"refreshToken": own.refresh_token}).status_code == 204
    refused = client.get("/rest/people", headers=own.headers)
    assert refused.status_code == 401, refused.text
    assert "revoked" in refused.json()["message"]


def test_a_token_accepted_before_is_refused_once_expired(
    client: httpx.Client, session: Session, stack: Stack | None
) -> None:
    secret = _secret(stack)
    claims = _claims(session, secret)
    now = int(time.time())
    claims.update(iat=now, exp=now + 2)
    token = jwt.encode(claims, secret, algorithm="HS256")
    graphql_data(client, token, QUERY)  # verified and remembered by the gateway
    time.sleep(2 + 5 + 1.5)  # past exp and the 5 s clock-skew leeway
    assert "expired" in _refused(client, {"Authorization": f"Bearer {token}"})


def test_public_routes_need_no_credential(client: httpx.Client) -> None:
    assert client.get("/healthz").status_code == 200
    assert client.get("/metrics").status_code == 404  # on the metrics port only
    assert client.post("/auth/login", json={}).status_code == 400  # reached, not 401


def test_credential_checks_are_counted(client: httpx.Client, session: Session) -> None:
    graphql_data(client, session.access_token, QUERY)
    text = gateway_metrics(str(client.base_url))
    assert 'gateway_credential_checks_total{outcome="OK",source="cache"}' in text
