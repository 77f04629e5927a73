from __future__ import annotations

import base64
import hashlib

import pytest

from crmkit.errors import InvalidArgument, ServiceError
from identity.oauth import (
    check_challenge,
    check_redirect_uri,
    covers,
    grant_scopes,
    parse_scope_list,
    verifier_matches,
)


def _oauth_code(error: pytest.ExceptionInfo[ServiceError]) -> tuple[str, str]:
    return error.value.metadata["oauthError"], error.value.metadata["redirect"]


def test_scopes_parse_and_deduplicate() -> None:
    assert parse_scope_list(["read:person write:person", "read:person *"], "scopes") == [
        "read:person",
        "write:person",
        "*",
    ]
    for bad in ("read", "delete:person", "read:two words", "read:", "write:per-son"):
        with pytest.raises(InvalidArgument) as error:
            parse_scope_list([bad], "scopes")
        assert error.value.field == "scopes"


@pytest.mark.parametrize(
    ("allowed", "scope", "expected"),
    [
        (["*"], "write:company", True),
        (["*"], "*", True),
        (["read:*"], "read:person", True),
        (["read:*"], "write:person", False),
        (["read:*"], "*", False),
        (["read:person"], "read:person", True),
        (["read:person"], "read:*", False),
        (["write:person"], "read:person", False),
    ],
)
def test_client_scopes_cover_requests(allowed: list[str], scope: str, expected: bool) -> None:
    assert covers(allowed, scope) is expected


def test_grant_defaults_to_the_client_s_scopes_and_refuses_more() -> None:
    assert grant_scopes("  ", ["read:*"]) == ["read:*"]
    assert grant_scopes("read:person", ["read:*"]) == ["read:person"]
    with pytest.raises(ServiceError) as error:
        grant_scopes("write:person", ["read:*"])
    assert _oauth_code(error) == ("invalid_scope", "true")


def test_pkce_rules() -> None:
    check_challenge("", "", public=False)  # optional for confidential clients
    with pytest.raises(ServiceError) as error:
        check_challenge("", "", public=True)
    assert _oauth_code(error) == ("invalid_request", "true")
    challenge = base64.urlsafe_b64encode(hashlib.sha256(b"v" * 43).digest()).decode().rstrip("=")
    check_challenge(challenge, "S256", public=True)
    for method in ("plain", ""):
        with pytest.raises(ServiceError):
            check_challenge(challenge, method, public=True)
    assert verifier_matches("v" * 43, challenge)
    assert not verifier_matches("w" * 43, challenge)
    assert not verifier_matches("short", challenge)


def test_rfc7636_example() -> None:
    verifier = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"
    assert verifier_matches(verifier, "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM")


@pytest.mark.parametrize(
    "uri",
    ["https://app.example.com/cb", "http://localhost:8080/cb", "http://127.0.0.1/cb?x=1"],
)
def test_redirect_uris_accepted(uri: str) -> None:
    assert check_redirect_uri(uri, "redirectUris[0]") == uri


@pytest.mark.parametrize(
    "uri",
    [
        "http://app.example.com/cb",
        "https://app.example.com/cb#fragment",
        "/relative",
        "javascript:alert(1)",
        "https://" + "a" * 2100 + ".com",
    ],
)
def test_redirect_uris_refused(uri: str) -> None:
    with pytest.raises(InvalidArgument) as error:
        check_redirect_uri(uri, "redirectUris[2]")
    assert error.value.field == "redirectUris[2]"
