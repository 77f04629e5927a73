"""Credentials as identity issues them and the gateway verifies them.

JWTs (sessions, OAuth access tokens, refresh, login and file tokens): HS256 with APP_SECRET, the
algorithm pinned, claims exactly `sub, workspaceId, email, iat, exp, type, jti`. For access
tokens `jti` names the grant (the session or OAuth grant, i.e. the refresh-token family) whose
state identity keeps in Redis: `jti` is `<grant id>.<random>`, unique per token, and
`grant_of(jti)` names the cache entry `credential_cache_key(grant id)` that says whether the grant
is revoked and what principal it carries.

Opaque secrets (API keys, personal access tokens): `crm_ak_<id>_<secret>` / `crm_pat_<id>_<secret>`,
the id being the credential's UUID as 32 hex digits and the secret 32 random bytes (base64url);
only the secret's SHA-256 is stored.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
import uuid
from dataclasses import dataclass
from enum import StrEnum

import jwt

from crm.common.v1 import common_pb2
from crm.identity.v1 import identity_pb2
from crmkit.errors import Unauthenticated

ALGORITHM = "HS256"
LEEWAY_SECONDS = 5  # clock skew tolerated between the issuing and the verifying process
_REQUIRED_CLAIMS = ["sub", "workspaceId", "email", "iat", "exp", "type", "jti"]

CACHE_KEY_PREFIX = "crm:auth:cred:"


class TokenType(StrEnum):
    ACCESS = "access"  # session or OAuth access token; jti = access_token_id(grant id)
    REFRESH = "refresh"  # jti = the refresh token's own id
    LOGIN = "login"  # short-lived, signed state of the OAuth consent page
    FILE = "file"  # jti = file id


class SecretKind(StrEnum):
    API_KEY = "crm_ak_"
    PERSONAL_ACCESS_TOKEN = "crm_pat_"  # noqa: S105  # a prefix, not a secret


_SECRET_KINDS = tuple(SecretKind)  # iterating the enum itself costs a generator per request


@dataclass(frozen=True)
class Claims:
    sub: str
    workspace_id: str
    email: str
    iat: int
    exp: int
    type: str
    jti: str


@dataclass(frozen=True)
class SecretToken:
    kind: SecretKind
    credential_id: str  # canonical UUID string
    secret: str


def credential_cache_key(credential_id: str) -> str:
    return CACHE_KEY_PREFIX + credential_id


def access_token_id(grant_id: str) -> str:
    """A unique `jti` for an access token of this grant."""
    return f"{grant_id}.{secrets.token_hex(8)}"


def grant_of(token_id: str) -> str:
    """The grant an access token's `jti` belongs to, or Unauthenticated."""
    grant_id, separator, _ = token_id.partition(".")
    try:
        if not separator:
            raise ValueError(token_id)
        return str(uuid.UUID(grant_id))
    except ValueError:
        raise Unauthenticated(
            "invalid token", reason=common_pb2.ERROR_REASON_TOKEN_INVALID
        ) from None


def encode_jwt(
    app_secret: str,
    *,
    subject: str,
    workspace_id: str,
    email: str,
    token_type: TokenType,
    token_id: str,
    lifetime_seconds: int,
    now: int | None = None,
) -> tuple[str, int]:
    """A signed token and its `exp`."""
    issued = int(time.time()) if now is None else now
    expires = issued + lifetime_seconds
    payload = {
        "sub": subject,
        "workspaceId": workspace_id,
        "email": email,
        "iat": issued,
        "exp": expires,
        "type": str(token_type),
        "jti": token_id,
    }
    return jwt.encode(payload, app_secret, algorithm=ALGORITHM), expires


def decode_jwt(app_secret: str, token: str, expected: TokenType) -> Claims:
    """The verified claims of `token`, or Unauthenticated telling expired from invalid."""
    try:
        payload = jwt.decode(
            token,
            app_secret,
            algorithms=[ALGORITHM],
            leeway=LEEWAY_SECONDS,
            options={"require": _REQUIRED_CLAIMS},
        )
    except jwt.ExpiredSignatureError:
        raise Unauthenticated(
            "token expired", reason=common_pb2.ERROR_REASON_TOKEN_EXPIRED
        ) from None
    except jwt.PyJWTError:
        raise Unauthenticated(
            "invalid token", reason=common_pb2.ERROR_REASON_TOKEN_INVALID
        ) from None
    try:
        claims = Claims(
            sub=_text(payload["sub"]),
            workspace_id=_text(payload["workspaceId"]),
            email=_text(payload["email"], allow_empty=True),
            iat=_integer(payload["iat"]),
            exp=_integer(payload["exp"]),
            type=_text(payload["type"]),
            jti=_text(payload["jti"]),
        )
    except (TypeError, ValueError):
        raise Unauthenticated(
            "invalid token", reason=common_pb2.ERROR_REASON_TOKEN_INVALID
        ) from None
    if claims.type != expected:
        raise Unauthenticated(
            f"invalid token: not an {expected} token", reason=common_pb2.ERROR_REASON_TOKEN_INVALID
        )
    return claims


def _text(value: object, *, allow_empty: bool = False) -> str:
    if not isinstance(value, str) or (not value and not allow_empty):
        raise TypeError("claim must be a string")
    return value


def _integer(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError("claim must be an integer")
    return value


_HEX_ID = re.compile(r"[0-9a-fA-F]{32}")  # a credential id in a secret token


def hash_secret(secret: str) -> bytes:
    """SHA-256 of a random secret (high entropy: a slow hash adds nothing)."""
    return hashlib.sha256(secret.encode()).digest()


def secret_matches(secret: str, expected_hash: bytes) -> bool:
    return hmac.compare_digest(hash_secret(secret), expected_hash)


def new_secret_token(kind: SecretKind, credential_id: str) -> tuple[str, bytes]:
    """A token to show once and the hash to store."""
    secret = secrets.token_urlsafe(32)
    return f"{kind.value}{uuid.UUID(credential_id).hex}_{secret}", hash_secret(secret)


def parse_secret_token(token: str) -> SecretToken | None:
    """The parts of an API key or personal access token; None when `token` is not one."""
    for kind in _SECRET_KINDS:
        if token.startswith(kind.value):
            rest = token[len(kind.value) :]
            hex_id, separator, secret = rest[:32], rest[32:33], rest[33:]
            if separator != "_" or not secret or _HEX_ID.fullmatch(hex_id) is None:
                raise Unauthenticated(
                    "invalid token: malformed credential",
                    reason=common_pb2.ERROR_REASON_TOKEN_INVALID,
                )
            h = hex_id.lower()  # the id's canonical form, as str(uuid.UUID(hex=h)) writes it
            credential_id = f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
            return SecretToken(kind, credential_id, secret)
    return None


_REJECTIONS: dict[int, str] = {
    common_pb2.ERROR_REASON_TOKEN_REVOKED: "token revoked",
    common_pb2.ERROR_REASON_TOKEN_EXPIRED: "token expired",
}


def invalid_token(message: str = "invalid token") -> Unauthenticated:
    return Unauthenticated(message, reason=common_pb2.ERROR_REASON_TOKEN_INVALID)


def accept_credential(
    entry: identity_pb2.CachedCredential,
    *,
    now: float,
    secret: str | None = None,
    claims: Claims | None = None,
) -> common_pb2.Principal:
    """The principal of a credential whose stored state is `entry`, or Unauthenticated.

    `secret` is the presented secret of an API key or personal access token; `claims` those of
    a verified access token, which must name the grant's user and workspace.
    """
    if entry.reject_reason != common_pb2.ERROR_REASON_UNSPECIFIED:
        reason = int(entry.reject_reason)
        raise Unauthenticated(_REJECTIONS.get(reason, "invalid token"), reason=reason)
    if secret is not None and (
        not entry.secret_hash or not secret_matches(secret, entry.secret_hash)
    ):
        raise invalid_token()
    if entry.expires_at and now >= entry.expires_at:
        raise Unauthenticated("token expired", reason=common_pb2.ERROR_REASON_TOKEN_EXPIRED)
    principal = entry.principal
    if claims is not None and (
        claims.sub != principal.user_id or claims.workspace_id != principal.workspace_id
    ):
        raise invalid_token("invalid token: wrong workspace or user")
    return principal
