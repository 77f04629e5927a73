"""OAuthService: client registration, the authorization code flow with PKCE, token exchange.

Codes are single use, live OAUTH_CODE_EXPIRES_IN (10 minutes), and are bound to the client, the
redirect URI and the PKCE challenge; presenting a used code again revokes the grant it produced.
Refresh tokens rotate like login sessions and are bound to their client.
"""

from __future__ import annotations

import secrets
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import asyncpg
import grpc
from google.protobuf import empty_pb2

from crm.common.v1 import common_pb2
from crm.identity.v1 import identity_pb2, identity_pb2_grpc
from crmkit.errors import InvalidArgument, NotFound, Unauthenticated
from crmkit.tokens import hash_secret, secret_matches
from identity import validation
from identity.access import require_admin
from identity.cache import lock_workspace, workspace_change
from identity.deps import Deps
from identity.login import check_password
from identity.oauth import (
    check_challenge,
    check_redirect_uri,
    grant_scopes,
    oauth_error,
    parse_scope_list,
    verifier_matches,
)
from identity.pagination import after_clause, page_info, read_page
from identity.roles import timestamp
from identity.sessions import OAUTH, Holder, TokenPair

MAX_REDIRECT_URIS = 10


@dataclass(frozen=True)
class ClientRow:
    id: uuid.UUID
    workspace_id: uuid.UUID
    client_id: str
    secret_hash: bytes | None
    name: str
    redirect_uris: list[str]
    scopes: list[str]
    is_public: bool
    created_at: datetime

    @classmethod
    def from_record(cls, row: asyncpg.Record) -> ClientRow:
        return cls(
            id=row["id"],
            workspace_id=row["workspace_id"],
            client_id=row["client_id"],
            secret_hash=bytes(row["secret_hash"]) if row["secret_hash"] is not None else None,
            name=row["name"],
            redirect_uris=list(row["redirect_uris"]),
            scopes=list(row["scopes"]),
            is_public=row["is_public"],
            created_at=row["created_at"],
        )

    def to_proto(self, secret: str = "") -> identity_pb2.OAuthClient:
        return identity_pb2.OAuthClient(
            id=str(self.id),
            client_id=self.client_id,
            client_secret=secret,
            name=self.name,
            redirect_uris=self.redirect_uris,
            scopes=self.scopes,
            is_public=self.is_public,
            created_at=timestamp(self.created_at),
        )


@dataclass(frozen=True)
class ValidRequest:
    client: ClientRow
    redirect_uri: str
    scopes: list[str]
    code_challenge: str
    code_challenge_method: str


def _token_response(pair: TokenPair, scopes: list[str]) -> identity_pb2.TokenResponse:
    return identity_pb2.TokenResponse(
        access_token=pair.access_token,
        refresh_token=pair.refresh_token,
        token_type="Bearer",  # noqa: S106  # the token type name (RFC 6750)
        expires_in=pair.access_expires_in,
        scope=" ".join(scopes),
    )


class OAuthServicer(identity_pb2_grpc.OAuthServiceServicer):
    def __init__(self, deps: Deps) -> None:
        self._deps = deps

    # -- client registration -----------------------------------------------------------------
    async def CreateOAuthClient(  # noqa: N802
        self, request: identity_pb2.CreateOAuthClientRequest, context: grpc.aio.ServicerContext
    ) -> identity_pb2.OAuthClient:
        principal = self._deps.codec.require(context)
        require_admin(principal)
        name = validation.name(request.name, "name", required=True)
        if not request.redirect_uris:
            raise InvalidArgument("at least one redirect URI is required", field="redirectUris")
        if len(request.redirect_uris) > MAX_REDIRECT_URIS:
            raise InvalidArgument(
                f"at most {MAX_REDIRECT_URIS} redirect URIs", field="redirectUris"
            )
        redirect_uris = [
            check_redirect_uri(uri, f"redirectUris[{index}]")
            for index, uri in enumerate(request.redirect_uris)
        ]
        scopes = parse_scope_list(request.scopes, "scopes")
        if not scopes:
            raise InvalidArgument("at least one scope is required", field="scopes")
        secret = "" if request.is_public else "crm_ocs_" + secrets.token_urlsafe(32)
        row = await self._deps.pool.fetchrow(
            "INSERT INTO identity.oauth_clients (id, workspace_id, client_id, secret_hash, name, "
            "redirect_uris, scopes, is_public, created_by) "
            "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING *",
            uuid.uuid4(),
            uuid.UUID(principal.workspace_id),
            "crm_oc_" + secrets.token_urlsafe(18),
            hash_secret(secret) if secret else None,
            name,
            list(dict.fromkeys(redirect_uris)),
            scopes,
            request.is_public,
            uuid.UUID(principal.user_id) if principal.user_id else None,
        )
        assert row is not None
        return ClientRow.from_record(row).to_proto(secret)

    async def ListOAuthClients(  # noqa: N802
        self, request: identity_pb2.ListOAuthClientsRequest, context: grpc.aio.ServicerContext
    ) -> identity_pb2.ListOAuthClientsResponse:
        principal = self._deps.codec.require(context)
        require_admin(principal)
        page = read_page(request.page)
        rows = await self._deps.pool.fetch(
            "SELECT x.* FROM identity.oauth_clients x WHERE x.workspace_id = $1 "
            "AND x.deleted_at IS NULL AND " + after_clause("x", "oauth_clients", "$2") + " "
            "ORDER BY x.created_at, x.id LIMIT $3",
            uuid.UUID(principal.workspace_id),
            page.after,
            page.size + 1,
        )
        items, info = page_info(rows, page)
        return identity_pb2.ListOAuthClientsResponse(
            clients=[ClientRow.from_record(row).to_proto() for row in items], page_info=info
        )

    async def DeleteOAuthClient(  # noqa: N802
        self, request: identity_pb2.IdRequest, context: grpc.aio.ServicerContext
    ) -> empty_pb2.Empty:
        deps = self._deps
        principal = deps.codec.require(context)
        require_admin(principal)
        client_uuid = uuid.UUID(validation.uuid_text(request.id, "id"))
        async with workspace_change(deps.pool, principal.workspace_id) as connection:
            deleted = await connection.fetchval(
                "UPDATE identity.oauth_clients SET deleted_at = now() "
                "WHERE id = $1 AND workspace_id = $2 AND deleted_at IS NULL RETURNING id",
                client_uuid,
                uuid.UUID(principal.workspace_id),
            )
            if deleted is None:
                raise NotFound("OAuth client not found", field="id")
            grants = await connection.fetch(
                "SELECT id FROM identity.grants WHERE oauth_client_id = $1 AND revoked_at IS NULL",
                client_uuid,
            )
            await deps.sessions.revoke(
                connection, [row["id"] for row in grants], "OAuth client deleted"
            )
        return empty_pb2.Empty()

    # -- authorization endpoint --------------------------------------------------------------
    async def _client(self, client_id: str) -> ClientRow | None:
        if not client_id:
            return None
        row = await self._deps.pool.fetchrow(
            "SELECT * FROM identity.oauth_clients WHERE client_id = $1 AND deleted_at IS NULL",
            client_id,
        )
        return ClientRow.from_record(row) if row is not None else None

    async def _validate(
        self,
        *,
        client_id: str,
        redirect_uri: str,
        response_type: str,
        scope: str,
        code_challenge: str,
        code_challenge_method: str,
    ) -> ValidRequest:
        client = await self._client(client_id)
        if client is None:
            raise oauth_error("unknown_client", "unknown client_id")
        if not redirect_uri:
            raise oauth_error("invalid_request", "redirect_uri is required")
        if redirect_uri not in client.redirect_uris:
            raise oauth_error("invalid_request", "redirect_uri is not registered for this client")
        if response_type != "code":
            raise oauth_error(
                "unsupported_response_type", "response_type must be code", redirect=True
            )
        scopes = grant_scopes(scope, client.scopes)
        check_challenge(code_challenge, code_challenge_method, public=client.is_public)
        return ValidRequest(client, redirect_uri, scopes, code_challenge, code_challenge_method)

    async def ValidateAuthorize(  # noqa: N802
        self, request: identity_pb2.ValidateAuthorizeRequest, context: grpc.aio.ServicerContext
    ) -> identity_pb2.ValidateAuthorizeResponse:
        valid = await self._validate(
            client_id=request.client_id,
            redirect_uri=request.redirect_uri,
            response_type=request.response_type,
            scope=request.scope,
            code_challenge=request.code_challenge,
            code_challenge_method=request.code_challenge_method,
        )
        return identity_pb2.ValidateAuthorizeResponse(
            client_name=valid.client.name,
            scopes=valid.scopes,
            workspace_id=str(valid.client.workspace_id),
        )

    async def _issue_code(
        self, valid: ValidRequest, user_id: uuid.UUID
    ) -> identity_pb2.AuthorizationCode:
        code = secrets.token_urlsafe(32)
        lifetime = self._deps.settings.OAUTH_CODE_EXPIRES_IN
        await self._deps.pool.execute(
            "INSERT INTO identity.authorization_codes (code_hash, oauth_client_id, workspace_id, "
            "user_id, redirect_uri, scopes, code_challenge, code_challenge_method, expires_at) "
            "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            hash_secret(code),
            valid.client.id,
            valid.client.workspace_id,
            user_id,
            valid.redirect_uri,
            valid.scopes,
            valid.code_challenge,
            valid.code_challenge_method,
            datetime.now(UTC) + timedelta(seconds=lifetime),
        )
        return identity_pb2.AuthorizationCode(code=code, expires_in=lifetime)

    async def Authorize(  # noqa: N802
        self, request: identity_pb2.AuthorizeRequest, context: grpc.aio.ServicerContext
    ) -> identity_pb2.AuthorizationCode:
        valid = await self._validate(
            client_id=request.client_id,
            redirect_uri=request.redirect_uri,
            response_type="code",
            scope=" ".join(request.scopes),
            code_challenge=request.code_challenge,
            code_challenge_method=request.code_challenge_method,
        )
        user, _ = await check_password(
            self._deps,
            email=request.email,
            password=request.password,
            client_ip=request.client_ip,
            workspace_id=valid.client.workspace_id,
        )
        return await self._issue_code(valid, user.id)

    async def CreateAuthorizationCode(  # noqa: N802
        self,
        request: identity_pb2.CreateAuthorizationCodeRequest,
        context: grpc.aio.ServicerContext,
    ) -> identity_pb2.AuthorizationCode:
        principal = self._deps.codec.require(context)
        if principal.kind != common_pb2.PRINCIPAL_KIND_USER:
            raise oauth_error("access_denied", "only a signed-in user can authorize a client")
        valid = await self._validate(
            client_id=request.client_id,
            redirect_uri=request.redirect_uri,
            response_type="code",
            scope=" ".join(request.scopes),
            code_challenge=request.code_challenge,
            code_challenge_method=request.code_challenge_method,
        )
        if str(valid.client.workspace_id) != principal.workspace_id:
            raise oauth_error("unknown_client", "unknown client_id")
        return await self._issue_code(valid, uuid.UUID(principal.user_id))

    # -- token endpoint ----------------------------------------------------------------------
    async def ExchangeToken(  # noqa: N802
        self, request: identity_pb2.ExchangeTokenRequest, context: grpc.aio.ServicerContext
    ) -> identity_pb2.TokenResponse:
        deps = self._deps
        attempt = await deps.limiter.begin(
            [("token-ip", request.client_ip), ("client", request.client_id)]
        )
        client = await self._authenticate_client(request.client_id, request.client_secret)
        if request.grant_type == "authorization_code":
            response = await self._exchange_code(request, client)
        elif request.grant_type == "refresh_token":
            response = await self._refresh(request, client)
        elif not request.grant_type:
            raise oauth_error("invalid_request", "grant_type is required", field="grant_type")
        else:
            raise oauth_error(
                "unsupported_grant_type", "grant_type must be authorization_code or refresh_token"
            )
        await deps.limiter.succeeded(attempt)
        return response

    async def _authenticate_client(self, client_id: str, client_secret: str) -> ClientRow:
        client = await self._client(client_id)
        if client is None:
            raise oauth_error("invalid_client", "unknown client or wrong client secret")
        if client.is_public:
            if client_secret:
                raise oauth_error("invalid_client", "public clients have no client secret")
            return client
        if client.secret_hash is None or not secret_matches(client_secret, client.secret_hash):
            raise oauth_error("invalid_client", "unknown client or wrong client secret")
        return client

    async def _exchange_code(
        self, request: identity_pb2.ExchangeTokenRequest, client: ClientRow
    ) -> identity_pb2.TokenResponse:
        deps = self._deps
        if not request.code:
            raise oauth_error("invalid_request", "code is required", field="code")
        if not request.redirect_uri:
            raise oauth_error("invalid_request", "redirect_uri is required", field="redirect_uri")
        reused_grant: uuid.UUID | None = None
        async with deps.pool.acquire() as connection, connection.transaction():
            await lock_workspace(connection, str(client.workspace_id), exclusive=True)
            row = await connection.fetchrow(
                "SELECT c.*, u.email FROM identity.authorization_codes c "
                "JOIN identity.users u ON u.id = c.user_id "
                "WHERE c.code_hash = $1 FOR UPDATE OF c",
                hash_secret(request.code),
            )
            if row is None or row["oauth_client_id"] != client.id:
                raise oauth_error("invalid_grant", "invalid authorization code")
            if row["used_at"] is not None:
                # A replayed code: revoke what it produced (RFC 6749 section 4.1.2).
                if row["grant_id"] is not None:
                    await deps.sessions.revoke(
                        connection, [row["grant_id"]], "authorization code reused"
                    )
                reused_grant = row["grant_id"]
            else:
                self._check_code(row, request)
                pair = await deps.sessions.open(
                    connection,
                    Holder(row["user_id"], row["workspace_id"], row["email"]),
                    kind=OAUTH,
                    oauth_client_id=client.id,
                    scopes=list(row["scopes"]),
                )
                await connection.execute(
                    "UPDATE identity.authorization_codes SET used_at = now(), grant_id = $2 "
                    "WHERE code_hash = $1",
                    row["code_hash"],
                    pair.grant_id,
                )
                return _token_response(pair, list(row["scopes"]))
        if reused_grant is not None:
            deps.metrics.revocations.labels("oauth_grant").inc()
        raise oauth_error("invalid_grant", "authorization code already used")

    @staticmethod
    def _check_code(row: asyncpg.Record, request: identity_pb2.ExchangeTokenRequest) -> None:
        if row["expires_at"] <= datetime.now(UTC):
            raise oauth_error("invalid_grant", "authorization code expired")
        if row["redirect_uri"] != request.redirect_uri:
            raise oauth_error("invalid_grant", "redirect_uri does not match the authorization")
        challenge = row["code_challenge"]
        if challenge:
            if not request.code_verifier:
                raise oauth_error("invalid_grant", "code_verifier is required (PKCE)")
            if not verifier_matches(request.code_verifier, challenge):
                raise oauth_error("invalid_grant", "code_verifier does not match the challenge")
        elif request.code_verifier:
            raise oauth_error("invalid_grant", "code_verifier sent but no code_challenge was")

    async def _refresh(
        self, request: identity_pb2.ExchangeTokenRequest, client: ClientRow
    ) -> identity_pb2.TokenResponse:
        deps = self._deps
        if not request.refresh_token:
            raise oauth_error("invalid_request", "refresh_token is required", field="refresh_token")
        try:
            claims = deps.sessions.decode_refresh(request.refresh_token)
            pair, scopes = await deps.sessions.rotate(
                deps.pool, claims, kind=OAUTH, oauth_client_id=client.id
            )
        except Unauthenticated as exc:
            raise oauth_error("invalid_grant", exc.message) from None
        return _token_response(pair, scopes)
