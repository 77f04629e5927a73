"""OAuth 2.0 rules (RFC 6749, RFC 7636, the security BCP RFC 9700): scopes, PKCE, redirect URIs.

Errors carry the OAuth error code in their metadata (`oauthError`), and `redirect` says whether
the authorization endpoint may send the user back to the client with it (never when the client
or its redirect URI is in doubt).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import re
from collections.abc import Sequence
from urllib.parse import urlsplit

from crmkit.errors import InvalidArgument, NotFound, ServiceError, Unauthenticated

_SCOPE = re.compile(r"^(\*|(read|write):(\*|[a-zA-Z][a-zA-Z0-9]{0,62}))$")
_VERIFIER = re.compile(r"^[A-Za-z0-9\-._~]{43,128}$")
_CHALLENGE = re.compile(r"^[A-Za-z0-9\-_]{43}$")
MAX_REDIRECT_URIS = 10
MAX_URI_LENGTH = 2048


def oauth_error(
    code: str, description: str, *, redirect: bool = False, field: str | None = None
) -> ServiceError:
    metadata = {"oauthError": code, "redirect": "true" if redirect else "false"}
    if code == "invalid_client":
        return Unauthenticated(description, metadata=metadata)
    if code == "unknown_client":
        return NotFound(description, metadata=metadata | {"oauthError": "invalid_client"})
    return InvalidArgument(description, field=field, metadata=metadata)


def parse_scope_list(values: Sequence[str], field: str) -> list[str]:
    scopes: list[str] = []
    for value in values:
        for scope in value.split():
            if not _SCOPE.match(scope):
                raise InvalidArgument(
                    f"invalid scope {scope!r}: use read:<object>, write:<object>, read:*, "
                    "write:* or *",
                    field=field,
                )
            if scope not in scopes:
                scopes.append(scope)
    return scopes


def covers(allowed: Sequence[str], scope: str) -> bool:
    """Whether a client registered with `allowed` may be granted `scope`."""
    if "*" in allowed:
        return True
    if scope == "*":
        return False
    verb, _, target = scope.partition(":")
    return f"{verb}:*" in allowed or (target != "*" and scope in allowed)


def grant_scopes(requested: str, allowed: Sequence[str]) -> list[str]:
    """The requested scopes (all the client's when none), each within the client's."""
    if not requested.strip():
        return list(allowed)
    try:
        scopes = parse_scope_list([requested], "scope")
    except InvalidArgument as exc:
        raise oauth_error("invalid_scope", exc.message, redirect=True) from None
    for scope in scopes:
        if not covers(allowed, scope):
            raise oauth_error(
                "invalid_scope", f"scope {scope} is not allowed for this client", redirect=True
            )
    return scopes


def check_challenge(challenge: str, method: str, *, public: bool) -> None:
    """PKCE on the authorization request: S256 only; required for public clients."""
    if not challenge:
        if method:
            raise oauth_error(
                "invalid_request", "code_challenge_method without code_challenge", redirect=True
            )
        if public:
            raise oauth_error(
                "invalid_request",
                "code_challenge (PKCE, S256) is required for public clients",
                redirect=True,
            )
        return
    if method != "S256":
        raise oauth_error("invalid_request", "code_challenge_method must be S256", redirect=True)
    if not _CHALLENGE.match(challenge):
        raise oauth_error(
            "invalid_request", "code_challenge must be a base64url SHA-256 digest", redirect=True
        )


def verifier_matches(verifier: str, challenge: str) -> bool:
    if not _VERIFIER.match(verifier):
        return False
    digest = hashlib.sha256(verifier.encode("ascii")).digest()
    computed = base64.urlsafe_b64encode(digest).decode().rstrip("=")
    return hmac.compare_digest(computed, challenge)


def check_redirect_uri(uri: str, field: str) -> str:
    """A registrable redirect URI: absolute https, or http on a loopback host; no fragment."""
    if len(uri) > MAX_URI_LENGTH:
        raise InvalidArgument(f"redirect URI longer than {MAX_URI_LENGTH} characters", field=field)
    try:
        parts = urlsplit(uri)
    except ValueError:  # an unclosed IPv6 bracket, characters NFKC turns into delimiters
        raise InvalidArgument("redirect URI is not a valid URL", field=field) from None
    if parts.fragment or "#" in uri:
        raise InvalidArgument("redirect URI must not have a fragment", field=field)
    if not parts.hostname:
        raise InvalidArgument("redirect URI must be absolute", field=field)
    if parts.scheme == "https":
        return uri
    if parts.scheme == "http" and _is_loopback(parts.hostname):
        return uri
    raise InvalidArgument(
        "redirect URI must use https (http only for localhost/loopback)", field=field
    )


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
