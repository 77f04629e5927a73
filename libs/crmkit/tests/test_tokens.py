from __future__ import annotations

import base64
import time
import uuid

import jwt
import orjson
import pytest

from crm.common.v1 import common_pb2
from crm.identity.v1 import identity_pb2
from crmkit.errors import Unauthenticated
from crmkit.tokens import (
    SecretKind,
    TokenType,
    accept_credential,
    access_token_id,
    decode_jwt,
    encode_jwt,
    grant_of,
    hash_secret,
    new_secret_token,
    parse_secret_token,
)

SECRET = "s" * 32


def _token(*, now: int | None = None, workspace_id: str = "ws-1") -> str:
    token, _ = encode_jwt(
        SECRET,
        subject="user-1",
        workspace_id=workspace_id,
        email="a@example.com",
        token_type=TokenType.ACCESS,
        token_id="grant-1",
        lifetime_seconds=1800,
        now=now,
    )
    return token


def _reason(error: pytest.ExceptionInfo[Unauthenticated]) -> int:
    return error.value.reason


def test_round_trip_has_exactly_the_claims() -> None:
    token = _token(now=1_000_000)
    payload = jwt.decode(token, SECRET, algorithms=["HS256"], options={"verify_exp": False})
    assert payload == {
        "sub": "user-1",
        "workspaceId": "ws-1",
        "email": "a@example.com",
        "iat": 1_000_000,
        "exp": 1_001_800,
        "type": "access",
        "jti": "grant-1",
    }


def test_expired_is_told_apart_from_invalid() -> None:
    expired = _token(now=int(time.time()) - 3600)
    with pytest.raises(Unauthenticated) as error:
        decode_jwt(SECRET, expired, TokenType.ACCESS)
    assert _reason(error) == common_pb2.ERROR_REASON_TOKEN_EXPIRED
    with pytest.raises(Unauthenticated) as error:
        decode_jwt("another-secret-of-32-bytes-at-least", _token(), TokenType.ACCESS)
    assert _reason(error) == common_pb2.ERROR_REASON_TOKEN_INVALID


@pytest.mark.filterwarnings("ignore::jwt.warnings.InsecureKeyLengthWarning")
def test_alg_none_and_other_algorithms_are_refused() -> None:
    payload = jwt.decode(_token(), SECRET, algorithms=["HS256"])

    def segment(data: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(orjson.dumps(data)).decode().rstrip("=")

    unsigned = f"{segment({'alg': 'none', 'typ': 'JWT'})}.{segment(payload)}."
    hs512 = jwt.encode(payload, SECRET, algorithm="HS512")
    for token in (unsigned, hs512):
        with pytest.raises(Unauthenticated) as error:
            decode_jwt(SECRET, token, TokenType.ACCESS)
        assert _reason(error) == common_pb2.ERROR_REASON_TOKEN_INVALID


def test_wrong_type_and_missing_claims_are_invalid() -> None:
    refresh, _ = encode_jwt(
        SECRET,
        subject="u",
        workspace_id="w",
        email="",
        token_type=TokenType.REFRESH,
        token_id="r",
        lifetime_seconds=60,
    )
    with pytest.raises(Unauthenticated):
        decode_jwt(SECRET, refresh, TokenType.ACCESS)
    missing = jwt.encode({"sub": "u", "exp": int(time.time()) + 60}, SECRET, algorithm="HS256")
    with pytest.raises(Unauthenticated):
        decode_jwt(SECRET, missing, TokenType.ACCESS)


def test_secret_tokens_parse_and_hash() -> None:
    credential_id = str(uuid.uuid4())
    token, stored = new_secret_token(SecretKind.API_KEY, credential_id)
    parsed = parse_secret_token(token)
    assert parsed is not None
    assert parsed.kind is SecretKind.API_KEY
    assert parsed.credential_id == credential_id
    assert hash_secret(parsed.secret) == stored
    assert parse_secret_token("eyJhbGciOi.not.a.secret.token") is None
    with pytest.raises(Unauthenticated):
        parse_secret_token("crm_pat_nothex_secret")
    upper = parse_secret_token(
        token.replace(uuid.UUID(credential_id).hex, uuid.UUID(credential_id).hex.upper())
    )
    assert upper is not None
    assert upper.credential_id == credential_id
    prefix = token[: len(token) - len(parsed.secret) - 33]
    for bad_id in ("0" * 31 + "g", "1234_678" + "0" * 24, "+" + "0" * 31, "0" * 31):
        with pytest.raises(Unauthenticated):
            parse_secret_token(f"{prefix}{bad_id}_{parsed.secret}")


def _entry(**fields: object) -> identity_pb2.CachedCredential:
    principal = common_pb2.Principal(workspace_id="ws-1", user_id="user-1")
    return identity_pb2.CachedCredential(principal=principal, **fields)  # type: ignore[arg-type]


def test_accept_credential_checks_revocation_secret_expiry_and_subject() -> None:
    now = time.time()
    assert accept_credential(_entry(), now=now).user_id == "user-1"
    revoked = _entry(reject_reason=common_pb2.ERROR_REASON_TOKEN_REVOKED)
    with pytest.raises(Unauthenticated) as error:
        accept_credential(revoked, now=now)
    assert _reason(error) == common_pb2.ERROR_REASON_TOKEN_REVOKED
    keyed = _entry(secret_hash=hash_secret("right"))
    assert accept_credential(keyed, now=now, secret="right")
    with pytest.raises(Unauthenticated):
        accept_credential(keyed, now=now, secret="wrong")
    with pytest.raises(Unauthenticated) as error:
        accept_credential(_entry(expires_at=int(now) - 1), now=now)
    assert _reason(error) == common_pb2.ERROR_REASON_TOKEN_EXPIRED
    claims = decode_jwt(SECRET, _token(workspace_id="ws-2"), TokenType.ACCESS)
    with pytest.raises(Unauthenticated):
        accept_credential(_entry(), now=now, claims=claims)


def test_access_token_ids_are_unique_and_name_their_grant() -> None:
    grant = str(uuid.uuid4())
    first, second = access_token_id(grant), access_token_id(grant)
    assert first != second
    assert grant_of(first) == grant_of(second) == grant
    for bad in ("", "grant-1", "not-a-uuid.abc", grant):
        with pytest.raises(Unauthenticated):
            grant_of(bad)
