"""OAuth 2.0 authorization code flow end to end: a real client library (authlib), the consent
page driven in headless Chromium (Playwright), PKCE, single-use codes, refresh rotation,
scopes narrowing what the token may do, and OAuth error bodies."""

from __future__ import annotations

import os
import re
import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx
import pytest
from authlib.common.security import generate_token
from authlib.integrations.requests_client import OAuth2Session
from authlib.oauth2.rfc7636 import create_s256_code_challenge

from crmstack.client import Session, graphql, graphql_data, signup

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"  # Debian's package
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
CREATE_CLIENT = """mutation($input: CreateOAuthClientInput!) {
  createOAuthClient(input: $input) { id clientId clientSecret name redirectUris scopes isPublic }
}"""
WHO = "{ currentUser { id role kind permissions { object actions ownRecordsOnly } } }"


class _Callback(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"<html><body>callback received</body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return


@pytest.fixture(scope="module")
def callback_url() -> Iterator[str]:
    """A real redirect target on loopback (what a native or local app would run)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Callback)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/callback"
    finally:
        server.shutdown()
        server.server_close()


@dataclass(frozen=True)
class Client:
    admin: Session
    client_id: str
    client_secret: str | None
    redirect_uri: str


def _register(
    http: httpx.Client,
    admin: Session,
    redirect_uris: list[str],
    scopes: list[str],
    *,
    public: bool = False,
) -> Client:
    created = graphql_data(
        http,
        admin.access_token,
        CREATE_CLIENT,
        {
            "input": {
                "name": "Reporting App",
                "redirectUris": redirect_uris,
                "scopes": scopes,
                "isPublic": public,
            }
        },
    )["createOAuthClient"]
    assert created["clientId"].startswith("crm_oc_")
    assert (created["clientSecret"] is None) == public
    return Client(admin, created["clientId"], created["clientSecret"], redirect_uris[0])


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not os.path.exists(CHROMIUM):
        pytest.skip(
            "Chromium is not installed and could not be installed here (make test installs "
            "Debian's chromium with apt-get when run as root)"
        )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True
        )
        try:
            yield launched
        finally:
            launched.close()


def _consent_in_browser(
    browser: Any, url: str, email: str, password: str, redirect_uri: str, *, allow: bool = True
) -> str:
    """Open the authorization URL, sign in and decide; the URL the browser lands on."""
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(url)
        assert "wants to access your CRM workspace" in page.content()
        page.fill("#email", email)
        page.fill("#password", password)
        with page.expect_navigation(url=re.compile("^" + re.escape(redirect_uri))):
            page.click("#allow" if allow else "#deny")
        return str(page.url)
    finally:
        context.close()


def _consent_over_http(
    http: httpx.Client, url: str, email: str, password: str, decision: str = "allow"
) -> httpx.Response:
    """The consent form posted by a plain HTTP client (its own cookie jar, like a browser)."""
    with httpx.Client(base_url=http.base_url, timeout=30) as agent:
        page = agent.get(url)
        assert page.status_code == 200, page.text
        assert agent.cookies.get("crm_oauth_csrf")
        fields = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">', page.text))
        fields = {k: v.replace("&amp;", "&").replace("&quot;", '"') for k, v in fields.items()}
        return agent.post(
            "/auth/authorize",
            data={**fields, "email": email, "password": password, "decision": decision},
        )


def _authorize_url(base_url: str, client: Client, **params: str) -> str:
    query = {
        "client_id": client.client_id,
        "redirect_uri": client.redirect_uri,
        "response_type": "code",
        **params,
    }
    return f"{base_url}/auth/authorize?{urlencode(query)}"


def _query(url: str) -> dict[str, str]:
    return {key: values[0] for key, values in parse_qs(urlsplit(url).query).items()}


def _code(http: httpx.Client, base_url: str, client: Client, verifier: str, scope: str) -> str:
    url = _authorize_url(
        base_url,
        client,
        scope=scope,
        state="s1",
        code_challenge=create_s256_code_challenge(verifier),
        code_challenge_method="S256",
    )
    response = _consent_over_http(http, url, client.admin.email, client.admin.password)
    assert response.status_code == 303, response.text
    params = _query(response.headers["location"])
    assert params["state"] == "s1"
    return params["code"]


def _exchange(
    http: httpx.Client, client: Client, code: str, verifier: str, **overrides: str
) -> httpx.Response:
    form = {
        "grant_type": "authorization_code",
        "code": code,
        "redirect_uri": client.redirect_uri,
        "client_id": client.client_id,
        "client_secret": client.client_secret or "",
        "code_verifier": verifier,
        **overrides,
    }
    return http.post("/auth/token", data={k: v for k, v in form.items() if v})


def test_full_flow_with_authlib_and_chromium(
    client: httpx.Client, base_url: str, browser: Any, callback_url: str
) -> None:
    admin = signup(client)
    registered = _register(client, admin, [callback_url], ["read:person", "write:company"])
    oauth = OAuth2Session(
        client_id=registered.client_id,
        client_secret=registered.client_secret,
        scope="read:person write:company",
        redirect_uri=callback_url,
        code_challenge_method="S256",
    )
    verifier = generate_token(64)
    url, state = oauth.create_authorization_url(
        f"{base_url}/auth/authorize", code_verifier=verifier
    )
    landed = _consent_in_browser(browser, url, admin.email, admin.password, callback_url)
    assert _query(landed)["state"] == state
    token = oauth.fetch_token(
        f"{base_url}/auth/token", authorization_response=landed, code_verifier=verifier
    )
    assert token["token_type"] == "Bearer"
    assert token["expires_in"] == 1800
    assert token["refresh_token"]
    assert token["scope"] == "read:person write:company"

    who = graphql_data(client, token["access_token"], WHO)["currentUser"]
    assert who["id"] == admin.user_id
    assert who["kind"] == "OAUTH"
    assert who["role"] == "Admin"
    # Scopes narrow the Admin's `*` permissions to what was granted.
    assert who["permissions"] == [
        {"object": "person", "actions": ["READ"], "ownRecordsOnly": False},
        {"object": "company", "actions": ["WRITE", "DELETE"], "ownRecordsOnly": False},
    ]
    # Settings need the `*` scope.
    denied = graphql(client, token["access_token"], "{ apiKeys { id } }")
    assert denied.json()["errors"][0]["extensions"]["code"] == "FORBIDDEN"

    refreshed = oauth.refresh_token(f"{base_url}/auth/token", refresh_token=token["refresh_token"])
    assert refreshed["access_token"] != token["access_token"]
    graphql_data(client, refreshed["access_token"], WHO)
    reuse = client.post(
        "/auth/token",
        data={"grant_type": "refresh_token", "refresh_token": token["refresh_token"]},
        auth=(registered.client_id, registered.client_secret or ""),
    )
    assert reuse.status_code == 400
    assert reuse.json()["error"] == "invalid_grant"
    # Reuse revoked the grant: the newest tokens are dead too.
    assert graphql(client, refreshed["access_token"], WHO).status_code == 401


def test_denying_consent_redirects_with_access_denied(
    client: httpx.Client, base_url: str, browser: Any, callback_url: str
) -> None:
    admin = signup(client)
    registered = _register(client, admin, [callback_url], ["*"])
    url = _authorize_url(base_url, registered, state="keep-me")
    landed = _consent_in_browser(
        browser, url, admin.email, admin.password, callback_url, allow=False
    )
    assert _query(landed) == {
        "error": "access_denied",
        "error_description": "the user denied the request",
        "state": "keep-me",
    }


def test_wrong_password_on_the_consent_page(
    client: httpx.Client, base_url: str, browser: Any, callback_url: str
) -> None:
    admin = signup(client)
    registered = _register(client, admin, [callback_url], ["*"])
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(_authorize_url(base_url, registered, state="x"))
        page.fill("#email", admin.email)
        page.fill("#password", "not the password")
        page.click("#allow")
        page.wait_for_selector("[role=alert]")
        assert "invalid email or password" in page.inner_text("[role=alert]")
        page.fill("#password", admin.password)
        with page.expect_navigation(url=re.compile("^" + re.escape(callback_url))):
            page.click("#allow")
        assert "code" in _query(page.url)
    finally:
        context.close()


def test_code_is_single_use_and_reuse_revokes_its_tokens(
    client: httpx.Client, base_url: str
) -> None:
    admin = signup(client)
    registered = _register(client, admin, ["https://app.example.com/cb"], ["*"])
    verifier = generate_token(64)
    code = _code(client, base_url, registered, verifier, "*")
    first = _exchange(client, registered, code, verifier)
    assert first.status_code == 200, first.text
    assert first.headers["cache-control"] == "no-store"
    access = first.json()["access_token"]
    graphql_data(client, access, WHO)
    second = _exchange(client, registered, code, verifier)
    assert second.status_code == 400
    assert second.json() == {
        "error": "invalid_grant",
        "error_description": "authorization code already used",
    }
    assert graphql(client, access, WHO).status_code == 401


def test_pkce_mismatch_is_rejected(client: httpx.Client, base_url: str) -> None:
    admin = signup(client)
    registered = _register(client, admin, ["https://app.example.com/cb"], ["*"])
    verifier = generate_token(64)
    code = _code(client, base_url, registered, verifier, "*")
    wrong = _exchange(client, registered, code, generate_token(64))
    assert wrong.status_code == 400
    assert wrong.json()["error"] == "invalid_grant"
    missing = _exchange(client, registered, code, verifier, code_verifier="")
    assert missing.json()["error"] == "invalid_grant"


def test_code_is_bound_to_client_and_redirect_uri(client: httpx.Client, base_url: str) -> None:
    admin = signup(client)
    uris = ["https://app.example.com/cb", "https://app.example.com/other"]
    registered = _register(client, admin, uris, ["*"])
    other_client = _register(client, admin, uris, ["*"])
    verifier = generate_token(64)
    code = _code(client, base_url, registered, verifier, "*")
    other_uri = _exchange(client, registered, code, verifier, redirect_uri=uris[1])
    assert other_uri.json()["error"] == "invalid_grant"
    stolen = _exchange(
        client,
        other_client,
        code,
        verifier,
    )
    assert stolen.json()["error"] == "invalid_grant"
    # Still usable by its own client with its own redirect URI.
    assert _exchange(client, registered, code, verifier).status_code == 200


def test_authorize_never_redirects_to_an_unregistered_uri(
    client: httpx.Client, base_url: str
) -> None:
    admin = signup(client)
    registered = _register(client, admin, ["https://app.example.com/cb"], ["*"])
    for uri in ("https://evil.example/cb", "https://app.example.com/cb/extra", ""):
        response = client.get(
            "/auth/authorize",
            params={
                "client_id": registered.client_id,
                "redirect_uri": uri,
                "response_type": "code",
            },
        )
        assert response.status_code == 400
        assert "location" not in response.headers
        assert response.headers["x-frame-options"] == "DENY"
    unknown = client.get(
        "/auth/authorize",
        params={
            "client_id": "crm_oc_unknown",
            "redirect_uri": "https://app.example.com/cb",
            "response_type": "code",
        },
    )
    assert unknown.status_code == 400
    assert "location" not in unknown.headers


def test_authorize_errors_go_back_to_the_client(client: httpx.Client, base_url: str) -> None:
    admin = signup(client)
    registered = _register(client, admin, ["https://app.example.com/cb"], ["read:person"])
    cases = [
        ({"response_type": "token"}, "unsupported_response_type"),
        ({"scope": "write:person"}, "invalid_scope"),
        ({"scope": "bogus"}, "invalid_scope"),
        ({"code_challenge": "abc", "code_challenge_method": "plain"}, "invalid_request"),
    ]
    for extra, error in cases:
        query = {
            "client_id": registered.client_id,
            "redirect_uri": registered.redirect_uri,
            "response_type": "code",
            "state": "st",
            **extra,
        }
        response = client.get("/auth/authorize", params=query)
        assert response.status_code == 303, (extra, response.text)
        location = response.headers["location"]
        assert location.startswith(registered.redirect_uri + "?")
        params = _query(location)
        assert params["error"] == error, params
        assert params["state"] == "st"


def test_public_clients_must_use_pkce(client: httpx.Client, base_url: str) -> None:
    admin = signup(client)
    public = _register(client, admin, ["http://localhost:8765/cb"], ["read:*"], public=True)
    without = client.get(
        "/auth/authorize",
        params={
            "client_id": public.client_id,
            "redirect_uri": public.redirect_uri,
            "response_type": "code",
            "state": "p",
        },
    )
    assert without.status_code == 303
    assert _query(without.headers["location"])["error"] == "invalid_request"
    verifier = generate_token(64)
    code = _code(client, base_url, public, verifier, "read:*")
    token = _exchange(client, public, code, verifier)
    assert token.status_code == 200, token.text
    who = graphql_data(client, token.json()["access_token"], WHO)["currentUser"]
    assert who["permissions"] == [{"object": "*", "actions": ["READ"], "ownRecordsOnly": False}]


def test_token_endpoint_errors(client: httpx.Client, base_url: str) -> None:
    admin = signup(client)
    registered = _register(client, admin, ["https://app.example.com/cb"], ["*"])
    assert registered.client_secret is not None
    ip = {"X-Forwarded-For": "198.19.0.77"}
    bad_secret = client.post(
        "/auth/token",
        data={
            "grant_type": "authorization_code",
            "code": "x",
            "redirect_uri": registered.redirect_uri,
        },
        auth=(registered.client_id, "wrong"),
        headers=ip,
    )
    assert bad_secret.status_code == 401
    assert bad_secret.json()["error"] == "invalid_client"
    assert bad_secret.headers["www-authenticate"].startswith("Basic")
    unsupported = client.post(
        "/auth/token",
        data={"grant_type": "password"},
        auth=(registered.client_id, registered.client_secret),
        headers=ip,
    )
    assert unsupported.status_code == 400
    assert unsupported.json()["error"] == "unsupported_grant_type"
    bad_code = client.post(
        "/auth/token",
        json={
            "grant_type": "authorization_code",
            "code": "made-up",
            "redirect_uri": registered.redirect_uri,
            "client_id": registered.client_id,
            "client_secret": registered.client_secret,
        },
        headers=ip,
    )
    assert bad_code.status_code == 400
    assert bad_code.json()["error"] == "invalid_grant"
    wrong_type = client.post(
        "/auth/token", content=b"grant_type=x", headers={"content-type": "text/plain"}
    )
    assert wrong_type.json()["error"] == "invalid_request"


def test_spec_json_exchange_and_refresh(client: httpx.Client, base_url: str) -> None:
    admin = signup(client)
    registered = _register(client, admin, ["https://app.example.com/cb"], ["*"])
    verifier = generate_token(64)
    code = _code(client, base_url, registered, verifier, "")
    exchanged = client.post(
        "/auth/token",
        json={
            "grant_type": "authorization_code",
            "code": code,
            "client_id": registered.client_id,
            "client_secret": registered.client_secret,
            "redirect_uri": registered.redirect_uri,
            "code_verifier": verifier,
        },
    )
    assert exchanged.status_code == 200, exchanged.text
    body = exchanged.json()
    assert set(body) >= {"access_token", "refresh_token", "token_type", "expires_in"}
    assert body["scope"] == "*"  # no scope asked: the client's
    refreshed = client.post(
        "/auth/token",
        json={
            "grant_type": "refresh_token",
            "refresh_token": body["refresh_token"],
            "client_id": registered.client_id,
            "client_secret": registered.client_secret,
        },
    )
    assert refreshed.status_code == 200, refreshed.text
    graphql_data(client, refreshed.json()["access_token"], "{ apiKeys { id } }")  # `*` scope


def test_deleting_a_client_revokes_its_tokens(client: httpx.Client, base_url: str) -> None:
    admin = signup(client)
    registered = _register(client, admin, ["https://app.example.com/cb"], ["*"])
    verifier = generate_token(64)
    token = _exchange(
        client, registered, _code(client, base_url, registered, verifier, "*"), verifier
    ).json()
    graphql_data(client, token["access_token"], WHO)
    clients = graphql_data(
        client, admin.access_token, "{ oauthClients { id clientId clientSecret } }"
    )
    [listed] = clients["oauthClients"]
    assert listed["clientSecret"] is None
    graphql_data(
        client,
        admin.access_token,
        "mutation($id: UUID!) { deleteOAuthClient(id: $id) }",
        {"id": listed["id"]},
    )
    assert graphql(client, token["access_token"], WHO).status_code == 401


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"redirectUris": []}, "redirectUris"),
        ({"redirectUris": ["http://example.com/cb"]}, "redirectUris[0]"),
        ({"redirectUris": ["https://example.com/cb#frag"]}, "redirectUris[0]"),
        ({"scopes": ["admin:everything"]}, "scopes"),
        ({"scopes": []}, "scopes"),
        ({"name": ""}, "name"),
    ],
)
def test_client_registration_is_validated(
    client: httpx.Client, data: dict[str, Any], field: str
) -> None:
    admin = signup(client)
    payload = {"name": "App", "redirectUris": ["https://example.com/cb"], "scopes": ["*"], **data}
    response = graphql(client, admin.access_token, CREATE_CLIENT, {"input": payload})
    error = response.json()["errors"][0]
    assert error["extensions"] == {"code": "BAD_USER_INPUT", "field": field}


def test_a_scoped_token_manages_no_webhooks_workflows_or_data_model(
    client: httpx.Client, base_url: str
) -> None:
    """Only the `*` scope reaches beyond records, whatever the user's role allows."""
    admin = signup(client)
    registered = _register(client, admin, ["https://app.example.com/cb"], ["read:person", "*"])
    verifier = generate_token(64)
    code = _code(client, base_url, registered, verifier, "read:person")
    exchanged = _exchange(client, registered, code, verifier)
    assert exchanged.status_code == 200, exchanged.text
    token = exchanged.json()["access_token"]
    graphql_data(client, token, "{ people(first: 1) { edges { node { id } } } }")
    webhook = (
        "mutation($i: CreateWebhookInput!) { createWebhook(input: $i) { id } }",
        {"i": {"targetUrl": "http://127.0.0.1:9/hook", "operations": ["*.*"]}},
        "/graphql",
    )
    attempts = [
        webhook,
        ("{ webhooks { id } }", None, "/graphql"),
        (
            "mutation($i: CreateWorkflowInput!) { createWorkflow(input: $i) { id } }",
            {
                "i": {
                    "name": "leak",
                    "trigger": {"type": "RECORD_CREATED", "object": "person"},
                    "action": {"url": "http://127.0.0.1:9/flow", "body": "{{id}}"},
                }
            },
            "/graphql",
        ),
        (
            "mutation($i: CreateObjectInput!) { createObject(input: $i) { id } }",
            {
                "i": {
                    "nameSingular": "gadget",
                    "namePlural": "gadgets",
                    "labelSingular": "Gadget",
                    "labelPlural": "Gadgets",
                }
            },
            "/metadata",
        ),
    ]
    for query, variables, path in attempts:
        body = graphql(client, token, query, variables, path=path).json()
        assert body["errors"][0]["extensions"]["code"] == "FORBIDDEN", (query, body)
        assert "* scope" in body["errors"][0]["message"]
    assert graphql_data(client, admin.access_token, "{ webhooks { id } }")["webhooks"] == []
    # The same user with `*` may: the refusals above are the scope's, not the role's.
    code = _code(client, base_url, registered, verifier, "*")
    full = _exchange(client, registered, code, verifier).json()["access_token"]
    graphql_data(client, full, webhook[0], webhook[1])
