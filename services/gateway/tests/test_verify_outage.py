"""While Redis is unreachable, identity's answer for a credential is reused for a second, and
forgotten as soon as Redis answers again (gateway.auth.verify)."""

from __future__ import annotations

import uuid
from typing import Any, cast

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from crm.common.v1 import common_pb2
from crm.identity.v1 import identity_pb2
from crmkit.tokens import SecretKind, new_secret_token
from gateway.auth import verify
from gateway.auth.verify import CredentialVerifier


class Redis:
    def __init__(self) -> None:
        self.down = True

    async def get(self, key: str) -> bytes | None:
        if self.down:
            raise RedisConnectionError("Redis unreachable")
        return None  # a miss: identity answers


class Auth:
    def __init__(self) -> None:
        self.calls = 0

    async def ResolveCredential(  # noqa: N802
        self, request: identity_pb2.ResolveCredentialRequest
    ) -> common_pb2.Principal:
        self.calls += 1
        return common_pb2.Principal(workspace_id=str(uuid.uuid4()))


async def test_identity_answers_once_per_credential_while_redis_is_down(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    redis, auth = Redis(), Auth()
    verifier = CredentialVerifier("secret" * 8, cast(Any, redis), cast(Any, auth))
    key, _ = new_secret_token(SecretKind.API_KEY, str(uuid.uuid4()))
    other, _ = new_secret_token(SecretKind.API_KEY, str(uuid.uuid4()))
    first = await verifier.verify(key)
    for _ in range(5):
        assert await verifier.verify(key) == first
    assert auth.calls == 1
    monkeypatch.setattr(verify, "OUTAGE_ANSWER_SECONDS", 0.0)  # reused only for a while
    await verifier.verify(other)  # another credential is asked for
    await verifier.verify(other)
    assert auth.calls == 3

    redis.down = False  # Redis is back: misses go to identity every time, nothing is reused
    for _ in range(3):
        await verifier.verify(key)
    assert auth.calls == 6
