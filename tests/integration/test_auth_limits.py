"""Brute-force limits (failed logins per (email, client IP), 10 a minute by default, and per
client IP, 50 a minute) and the CORS allow-list (no CORS headers unless CORS_ORIGINS names the
origin)."""

from __future__ import annotations

import secrets
from collections.abc import Callable

import httpx

from crmstack.client import graphql_data, signup, unique_email

LIMIT = 10  # AUTH_MAX_FAILED_ATTEMPTS default: failures per (email, client IP)
PER_IP_LIMIT = 50  # AUTH_MAX_FAILED_ATTEMPTS_PER_IP default: failures per client IP


def _ip() -> str:
    return f"198.18.{secrets.randbelow(250)}.{secrets.randbelow(250) + 1}"


def _login(client: httpx.Client, email: str, password: str, ip: str) -> httpx.Response:
    return client.post(
        "/auth/login",
        json={"email": email, "password": password},
        headers={"X-Forwarded-For": ip},
    )


def test_failures_per_account_and_ip_do_not_lock_the_owner_out(client: httpx.Client) -> None:
    """OWASP: failures count per (account, IP), so a guesser is stopped without locking the
    account's owner out from elsewhere."""
    user = signup(client)
    attacker = _ip()
    for _ in range(LIMIT):
        assert _login(client, user.email, "wrong password", attacker).status_code == 401
    blocked = _login(client, user.email, user.password, attacker)
    assert blocked.status_code == 429
    assert int(blocked.headers["retry-after"]) > 0
    body = blocked.json()
    assert body["statusCode"] == 429
    assert body["error"] == "Too Many Requests"
    # The right password from another IP logs in while the attacker's IP is locked out, and the
    # attacker's IP may still log in to other accounts (its per-IP limit is higher).
    assert _login(client, user.email, user.password, _ip()).status_code == 200
    other = signup(client)
    assert _login(client, other.email, other.password, attacker).status_code == 200
    # Guesses spread over many IPs each get their own allowance; the owner is never locked out.
    for _ in range(LIMIT):
        assert _login(client, user.email, "wrong password", _ip()).status_code == 401
    assert _login(client, user.email, user.password, _ip()).status_code == 200


def test_failures_per_ip_are_limited_across_emails(client: httpx.Client) -> None:
    user = signup(client)
    ip = _ip()
    for _ in range(PER_IP_LIMIT):
        assert _login(client, unique_email("guess"), "wrong password", ip).status_code == 401
    assert _login(client, user.email, user.password, ip).status_code == 429
    # The same account from elsewhere is fine: only that IP is blocked.
    assert _login(client, user.email, user.password, _ip()).status_code == 200


def test_successful_logins_do_not_count(client: httpx.Client) -> None:
    user = signup(client)
    ip = _ip()
    for _ in range(LIMIT + 3):
        assert _login(client, user.email, user.password, ip).status_code == 200


def test_token_endpoint_limits_failed_client_authentication(client: httpx.Client) -> None:
    admin = signup(client)
    created = graphql_data(
        client,
        admin.access_token,
        """mutation { createOAuthClient(input: {name: "Limited",
             redirectUris: ["https://example.com/cb"], scopes: ["*"]}) { clientId } }""",
    )["createOAuthClient"]
    ip = _ip()
    form = {
        "grant_type": "authorization_code",
        "code": "x",
        "redirect_uri": "https://example.com/cb",
        "client_id": created["clientId"],
        "client_secret": "wrong",
    }
    for _ in range(LIMIT):
        response = client.post("/auth/token", data=form, headers={"X-Forwarded-For": ip})
        assert response.status_code == 401
        assert response.json()["error"] == "invalid_client"
    blocked = client.post("/auth/token", data=form, headers={"X-Forwarded-For": ip})
    assert blocked.status_code == 429
    assert blocked.json()["error"] == "temporarily_unavailable"
    assert int(blocked.headers["retry-after"]) > 0


def test_no_cors_headers_by_default(client: httpx.Client) -> None:
    origin = {"Origin": "https://evil.example"}
    preflight = client.options(
        "/graphql",
        headers={**origin, "Access-Control-Request-Method": "POST"},
    )
    assert "access-control-allow-origin" not in preflight.headers
    response = client.post("/graphql", json={"query": "{ apiVersion }"}, headers=origin)
    assert "access-control-allow-origin" not in response.headers


def test_cors_allow_list(extra_gateway: Callable[[dict[str, str]], str]) -> None:
    url = extra_gateway({"CORS_ORIGINS": "https://app.example.com,http://localhost:5173"})
    with httpx.Client(base_url=url, timeout=30) as http:
        allowed = http.options(
            "/graphql",
            headers={
                "Origin": "https://app.example.com",
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization,content-type",
            },
        )
        assert allowed.status_code == 200
        assert allowed.headers["access-control-allow-origin"] == "https://app.example.com"
        assert "authorization" in allowed.headers["access-control-allow-headers"].lower()
        refused = http.options(
            "/graphql",
            headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"},
        )
        assert "access-control-allow-origin" not in refused.headers
        simple = http.post(
            "/graphql",
            json={"query": "{ apiVersion }"},
            headers={"Origin": "http://localhost:5173"},
        )
        assert simple.headers["access-control-allow-origin"] == "http://localhost:5173"
