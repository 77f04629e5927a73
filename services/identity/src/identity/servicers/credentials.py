"""CredentialService: API keys (workspace credentials with a role) and personal access tokens
(credentials acting as their user). Secrets are shown once and stored as SHA-256 hashes."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import asyncpg
import grpc
from google.protobuf import empty_pb2

from crm.common.v1 import common_pb2
from crm.identity.v1 import identity_pb2, identity_pb2_grpc
from crmkit.errors import FailedPrecondition, InvalidArgument, NotFound, PermissionDenied
from crmkit.tokens import SecretKind, new_secret_token
from identity import validation
from identity.access import require_api_keys_flag, require_user
from identity.cache import lock_workspace, workspace_change
from identity.credentials import load_api_keys, load_personal_access_tokens
from identity.db_types import Connection
from identity.deps import Deps
from identity.pagination import after_clause, page_info, read_page
from identity.roles import ADMIN, RoleRow, timestamp
from identity.servicers.workspace import builtin_role, find_role

_KEY_COLUMNS = "k.id, k.name, k.expires_at, k.created_at, k.role_id, r.name AS role_name"


def _expiry(request_has: bool, value: datetime) -> datetime | None:
    if not request_has:
        return None
    expires = value.replace(tzinfo=UTC)
    if expires <= datetime.now(UTC):
        raise InvalidArgument("expiresAt must be in the future", field="expiresAt")
    return expires


def _api_key(row: asyncpg.Record, token: str = "") -> identity_pb2.ApiKey:
    key = identity_pb2.ApiKey(
        id=str(row["id"]),
        name=row["name"],
        role_id=str(row["role_id"]),
        role_name=row["role_name"],
        token=token,
        created_at=timestamp(row["created_at"]),
    )
    if row["expires_at"] is not None:
        key.expires_at.CopyFrom(timestamp(row["expires_at"]))
    return key


async def _within_cap(
    connection: Connection,
    table: str,
    owner_column: str,
    owner: uuid.UUID | None,
    workspace_id: uuid.UUID,
    cap: int,
    what: str,
) -> None:
    """FailedPrecondition (400) when the owner already holds `cap` active credentials of this
    kind (docs/auth.md). The owner's user row is locked first, so concurrent creations by one
    user are counted one after the other."""
    if owner is not None:
        await connection.execute("SELECT 1 FROM identity.users WHERE id = $1 FOR UPDATE", owner)
    active = await connection.fetchval(
        f"SELECT count(*) FROM identity.{table} WHERE workspace_id = $1 "
        f"AND {owner_column} IS NOT DISTINCT FROM $2 AND revoked_at IS NULL "
        "AND (expires_at IS NULL OR expires_at > now())",
        workspace_id,
        owner,
    )
    if active >= cap:
        raise FailedPrecondition(
            f"at most {cap} active {what} per user: delete one before creating another"
        )


def _personal_token(row: asyncpg.Record, token: str = "") -> identity_pb2.PersonalAccessToken:
    result = identity_pb2.PersonalAccessToken(
        id=str(row["id"]), name=row["name"], token=token, created_at=timestamp(row["created_at"])
    )
    if row["expires_at"] is not None:
        result.expires_at.CopyFrom(timestamp(row["expires_at"]))
    return result


class CredentialServicer(identity_pb2_grpc.CredentialServiceServicer):
    def __init__(self, deps: Deps) -> None:
        self._deps = deps

    # -- API keys ----------------------------------------------------------------------------
    async def _key_role(self, principal: common_pb2.Principal, role_id: str) -> RoleRow:
        """The key's role: any for Admins (default Admin); others only their own role."""
        workspace_id = uuid.UUID(principal.workspace_id)
        if principal.role == common_pb2.ROLE_ADMIN:
            if role_id:
                return await find_role(self._deps.pool, workspace_id, role_id)
            return await builtin_role(self._deps.pool, workspace_id, ADMIN)
        own = await find_role(self._deps.pool, workspace_id, principal.role_id)
        if role_id and validation.uuid_text(role_id, "roleId") != str(own.id):
            raise PermissionDenied(
                "permission denied: only an Admin can give an API key another role than their own",
                metadata={"role": "Admin"},
            )
        return own

    async def CreateApiKey(  # noqa: N802
        self, request: identity_pb2.CreateApiKeyRequest, context: grpc.aio.ServicerContext
    ) -> identity_pb2.ApiKey:
        deps = self._deps
        principal = deps.codec.require(context)
        require_api_keys_flag(principal)
        name = validation.name(request.name, "name", required=True)
        expires_at = _expiry(request.HasField("expires_at"), request.expires_at.ToDatetime())
        role = await self._key_role(principal, request.role_id)
        key_id = uuid.uuid4()
        token, secret_hash = new_secret_token(SecretKind.API_KEY, str(key_id))
        async with deps.pool.acquire() as connection, connection.transaction():
            await lock_workspace(connection, principal.workspace_id, exclusive=False)
            creator = uuid.UUID(principal.user_id) if principal.user_id else None
            await _within_cap(
                connection,
                "api_keys",
                "created_by",
                creator,
                uuid.UUID(principal.workspace_id),
                deps.settings.MAX_CREDENTIALS_PER_USER,
                "API keys",
            )
            row = await connection.fetchrow(
                "INSERT INTO identity.api_keys (id, workspace_id, name, secret_hash, role_id, "
                "expires_at, created_by) VALUES ($1, $2, $3, $4, $5, $6, $7) "
                "RETURNING id, name, expires_at, created_at, role_id, $8::text AS role_name",
                key_id,
                uuid.UUID(principal.workspace_id),
                name,
                secret_hash,
                role.id,
                expires_at,
                creator,
                role.name,
            )
            assert row is not None
            await deps.cache.fill(await load_api_keys(connection, [key_id]))
        return _api_key(row, token)

    async def ListApiKeys(  # noqa: N802
        self, request: identity_pb2.ListApiKeysRequest, context: grpc.aio.ServicerContext
    ) -> identity_pb2.ListApiKeysResponse:
        principal = self._deps.codec.require(context)
        require_api_keys_flag(principal)
        page = read_page(request.page)
        rows = await self._deps.pool.fetch(
            f"SELECT {_KEY_COLUMNS} FROM identity.api_keys k "
            "JOIN identity.roles r ON r.id = k.role_id "
            "WHERE k.workspace_id = $1 AND k.revoked_at IS NULL "
            "AND " + after_clause("k", "api_keys", "$2") + " "
            "ORDER BY k.created_at, k.id LIMIT $3",
            uuid.UUID(principal.workspace_id),
            page.after,
            page.size + 1,
        )
        items, info = page_info(rows, page)
        return identity_pb2.ListApiKeysResponse(
            api_keys=[_api_key(row) for row in items], page_info=info
        )

    async def DeleteApiKey(  # noqa: N802
        self, request: identity_pb2.IdRequest, context: grpc.aio.ServicerContext
    ) -> empty_pb2.Empty:
        deps = self._deps
        principal = deps.codec.require(context)
        require_api_keys_flag(principal)
        key_id = uuid.UUID(validation.uuid_text(request.id, "id"))
        async with workspace_change(deps.pool, principal.workspace_id) as connection:
            revoked = await connection.fetchval(
                "UPDATE identity.api_keys SET revoked_at = now() "
                "WHERE id = $1 AND workspace_id = $2 AND revoked_at IS NULL RETURNING id",
                key_id,
                uuid.UUID(principal.workspace_id),
            )
            if revoked is None:
                raise NotFound("API key not found", field="id")
            await deps.cache.revoke([str(key_id)])
        deps.metrics.revocations.labels("api_key").inc()
        return empty_pb2.Empty()

    # -- personal access tokens --------------------------------------------------------------
    async def CreatePersonalAccessToken(  # noqa: N802
        self,
        request: identity_pb2.CreatePersonalAccessTokenRequest,
        context: grpc.aio.ServicerContext,
    ) -> identity_pb2.PersonalAccessToken:
        deps = self._deps
        principal = deps.codec.require(context)
        user_id = uuid.UUID(require_user(principal))
        name = validation.name(request.name, "name", required=True)
        expires_at = _expiry(request.HasField("expires_at"), request.expires_at.ToDatetime())
        token_id = uuid.uuid4()
        token, secret_hash = new_secret_token(SecretKind.PERSONAL_ACCESS_TOKEN, str(token_id))
        async with deps.pool.acquire() as connection, connection.transaction():
            await lock_workspace(connection, principal.workspace_id, exclusive=False)
            await _within_cap(
                connection,
                "personal_access_tokens",
                "user_id",
                user_id,
                uuid.UUID(principal.workspace_id),
                deps.settings.MAX_CREDENTIALS_PER_USER,
                "personal access tokens",
            )
            row = await connection.fetchrow(
                "INSERT INTO identity.personal_access_tokens (id, workspace_id, user_id, name, "
                "secret_hash, expires_at) VALUES ($1, $2, $3, $4, $5, $6) "
                "RETURNING id, name, expires_at, created_at",
                token_id,
                uuid.UUID(principal.workspace_id),
                user_id,
                name,
                secret_hash,
                expires_at,
            )
            assert row is not None
            await deps.cache.fill(await load_personal_access_tokens(connection, [token_id]))
        return _personal_token(row, token)

    async def ListPersonalAccessTokens(  # noqa: N802
        self,
        request: identity_pb2.ListPersonalAccessTokensRequest,
        context: grpc.aio.ServicerContext,
    ) -> identity_pb2.ListPersonalAccessTokensResponse:
        principal = self._deps.codec.require(context)
        user_id = uuid.UUID(require_user(principal))
        page = read_page(request.page)
        rows = await self._deps.pool.fetch(
            "SELECT x.id, x.name, x.expires_at, x.created_at "
            "FROM identity.personal_access_tokens x "
            "WHERE x.user_id = $1 AND x.revoked_at IS NULL "
            "AND " + after_clause("x", "personal_access_tokens", "$2") + " "
            "ORDER BY x.created_at, x.id LIMIT $3",
            user_id,
            page.after,
            page.size + 1,
        )
        items, info = page_info(rows, page)
        return identity_pb2.ListPersonalAccessTokensResponse(
            tokens=[_personal_token(row) for row in items], page_info=info
        )

    async def DeletePersonalAccessToken(  # noqa: N802
        self, request: identity_pb2.IdRequest, context: grpc.aio.ServicerContext
    ) -> empty_pb2.Empty:
        deps = self._deps
        principal = deps.codec.require(context)
        user_id = uuid.UUID(require_user(principal))
        token_id = uuid.UUID(validation.uuid_text(request.id, "id"))
        async with workspace_change(deps.pool, principal.workspace_id) as connection:
            revoked = await connection.fetchval(
                "UPDATE identity.personal_access_tokens SET revoked_at = now() "
                "WHERE id = $1 AND user_id = $2 AND revoked_at IS NULL RETURNING id",
                token_id,
                user_id,
            )
            if revoked is None:
                raise NotFound("personal access token not found", field="id")
            await deps.cache.revoke([str(token_id)])
        deps.metrics.revocations.labels("personal_access_token").inc()
        return empty_pb2.Empty()
