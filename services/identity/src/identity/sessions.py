"""Grants (login sessions and OAuth authorizations) and their rotating token pairs."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import asyncpg

from crm.common.v1 import common_pb2
from crmkit.errors import Unauthenticated
from crmkit.tokens import Claims, TokenType, access_token_id, decode_jwt, encode_jwt
from identity.cache import CredentialCache, lock_workspace
from identity.credentials import load_grants
from identity.db_types import Connection

SESSION = "session"
OAUTH = "oauth"


@dataclass(frozen=True)
class TokenPair:
    access_token: str
    refresh_token: str
    access_expires_in: int
    grant_id: uuid.UUID


@dataclass(frozen=True)
class Lifetimes:
    access: int
    refresh: int


@dataclass(frozen=True)
class Holder:
    """Who a grant acts for."""

    user_id: uuid.UUID
    workspace_id: uuid.UUID
    email: str


def _revoked(message: str) -> Unauthenticated:
    return Unauthenticated(message, reason=common_pb2.ERROR_REASON_TOKEN_REVOKED)


def _invalid(message: str = "invalid refresh token") -> Unauthenticated:
    return Unauthenticated(message, reason=common_pb2.ERROR_REASON_TOKEN_INVALID)


class Sessions:
    def __init__(self, app_secret: str, lifetimes: Lifetimes, cache: CredentialCache) -> None:
        self._secret = app_secret
        self._lifetimes = lifetimes
        self._cache = cache

    def decode_refresh(self, token: str) -> Claims:
        return decode_jwt(self._secret, token, TokenType.REFRESH)

    async def open(
        self,
        connection: Connection,
        holder: Holder,
        *,
        kind: str = SESSION,
        oauth_client_id: uuid.UUID | None = None,
        scopes: Sequence[str] = (),
    ) -> TokenPair:
        """A new grant and its first token pair; the caller's transaction holds the lock."""
        grant_id = uuid.uuid4()
        await connection.execute(
            "INSERT INTO identity.grants (id, workspace_id, user_id, kind, oauth_client_id, "
            "scopes, expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7)",
            grant_id,
            holder.workspace_id,
            holder.user_id,
            kind,
            oauth_client_id,
            list(scopes),
            datetime.now(UTC) + timedelta(seconds=self._lifetimes.refresh),
        )
        pair = await self._issue(connection, grant_id, holder)
        await self._cache.fill(await load_grants(connection, [grant_id]))
        return pair

    async def _issue(
        self, connection: Connection, grant_id: uuid.UUID, holder: Holder
    ) -> TokenPair:
        now = int(datetime.now(UTC).timestamp())
        refresh_id = uuid.uuid4()
        access, _ = encode_jwt(
            self._secret,
            subject=str(holder.user_id),
            workspace_id=str(holder.workspace_id),
            email=holder.email,
            token_type=TokenType.ACCESS,
            token_id=access_token_id(str(grant_id)),
            lifetime_seconds=self._lifetimes.access,
            now=now,
        )
        refresh, refresh_expires = encode_jwt(
            self._secret,
            subject=str(holder.user_id),
            workspace_id=str(holder.workspace_id),
            email=holder.email,
            token_type=TokenType.REFRESH,
            token_id=str(refresh_id),
            lifetime_seconds=self._lifetimes.refresh,
            now=now,
        )
        expires_at = datetime.fromtimestamp(refresh_expires, UTC)
        await connection.execute(
            "INSERT INTO identity.refresh_tokens (id, grant_id, expires_at) VALUES ($1, $2, $3)",
            refresh_id,
            grant_id,
            expires_at,
        )
        await connection.execute(
            "UPDATE identity.grants SET expires_at = $2 WHERE id = $1", grant_id, expires_at
        )
        return TokenPair(access, refresh, self._lifetimes.access, grant_id)

    async def rotate(
        self,
        pool: asyncpg.Pool,
        claims: Claims,
        *,
        kind: str,
        oauth_client_id: uuid.UUID | None = None,
    ) -> tuple[TokenPair, list[str]]:
        """A new pair for a valid, unused refresh token, and the grant's scopes.

        A token used before means it leaked: the whole grant is revoked (committed) and the call
        fails with Unauthenticated (reason TOKEN_REVOKED).
        """
        refused: Unauthenticated | None = None
        async with pool.acquire() as connection, connection.transaction():
            await lock_workspace(connection, claims.workspace_id, exclusive=True)
            row = await connection.fetchrow(
                "SELECT t.used_at, g.id AS grant_id, g.workspace_id, g.user_id, g.kind, "
                "g.oauth_client_id, g.scopes, g.revoked_at, u.email "
                "FROM identity.refresh_tokens t "
                "JOIN identity.grants g ON g.id = t.grant_id "
                "JOIN identity.users u ON u.id = g.user_id "
                "WHERE t.id = $1 FOR UPDATE OF t",
                uuid.UUID(claims.jti),
            )
            if (
                row is None
                or str(row["workspace_id"]) != claims.workspace_id
                or str(row["user_id"]) != claims.sub
                or row["kind"] != kind
                or row["oauth_client_id"] != oauth_client_id
            ):
                raise _invalid()
            if row["revoked_at"] is not None:
                raise _revoked("refresh token revoked")
            if row["used_at"] is not None:
                await self.revoke(connection, [row["grant_id"]], "refresh token reused")
                refused = _revoked("refresh token already used: the session is revoked")
            else:
                await connection.execute(
                    "UPDATE identity.refresh_tokens SET used_at = now() WHERE id = $1",
                    uuid.UUID(claims.jti),
                )
                holder = Holder(row["user_id"], row["workspace_id"], row["email"])
                pair = await self._issue(connection, row["grant_id"], holder)
                await self._cache.fill(await load_grants(connection, [row["grant_id"]]))
                return pair, list(row["scopes"])
        assert refused is not None
        raise refused

    async def revoke(self, connection: Connection, grant_ids: list[uuid.UUID], reason: str) -> None:
        """Revoke grants; the caller's transaction holds the workspace lock exclusively."""
        if not grant_ids:
            return
        await connection.execute(
            "UPDATE identity.grants SET revoked_at = now(), revoked_reason = $2 "
            "WHERE id = ANY($1::uuid[]) AND revoked_at IS NULL",
            grant_ids,
            reason,
        )
        await self._cache.revoke([str(grant_id) for grant_id in grant_ids])
